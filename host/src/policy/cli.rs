//! Library halves of `stateward policy test`, `stateward policy eval` and
//! `stateward audit verify`; `main` only parses arguments and maps the result to an exit code.

use std::path::Path;

use super::audit;
use super::bundle::Bundle;
use super::engine::PolicyEngine;
use super::error::PolicyError;

/// Runs the `test_*` rules of the bundle in `dir`, printing PASS/FAIL per test and a summary
/// like `opa test`. Returns true when every test passed (and there was at least one).
pub fn test(dir: &Path) -> Result<bool, PolicyError> {
    let engine = PolicyEngine::compile(&Bundle::from_dir(dir)?)?;
    let outcomes = engine.run_tests();
    let mut passed = 0usize;
    for t in &outcomes {
        if t.passed {
            passed += 1;
            println!("{}: PASS", t.name);
        } else if let Some(e) = &t.error {
            println!("{}: FAIL ({e})", t.name);
        } else {
            println!("{}: FAIL", t.name);
        }
    }
    let total = outcomes.len();
    println!("{}", "-".repeat(80));
    println!("PASS: {passed}/{total}");
    if passed < total {
        println!("FAIL: {}/{total}", total - passed);
    }
    Ok(total > 0 && passed == total)
}

/// Evaluates `path` (e.g. `data.stateward.guardrails` or `data.stateward.guardrails.deny`)
/// against the bundle in `dir` with the JSON document in `input` as input.
pub fn eval(dir: &Path, input: &Path, path: &str) -> Result<serde_json::Value, PolicyError> {
    let engine = PolicyEngine::compile(&Bundle::from_dir(dir)?)?;
    let text = std::fs::read_to_string(input).map_err(|e| PolicyError::ReadInput {
        path: input.to_path_buf(),
        message: e.to_string(),
    })?;
    let doc: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| PolicyError::ReadInput {
            path: input.to_path_buf(),
            message: e.to_string(),
        })?;
    engine.query(path, &doc)
}

/// Verifies an audit log's hash chain; prints `OK: N records` or the first break with its line
/// number. Returns true when the chain is intact.
pub fn verify_audit(file: &Path) -> Result<bool, PolicyError> {
    let report = audit::verify(file)?;
    match report.first_break {
        None => {
            println!("OK: {} records, chain intact", report.records);
            Ok(true)
        }
        Some(b) => {
            println!(
                "BROKEN at line {}: {:?}: {} ({} records verified before it)",
                b.line, b.kind, b.detail, report.records
            );
            Ok(false)
        }
    }
}
