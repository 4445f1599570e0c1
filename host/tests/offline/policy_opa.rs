//! Agreement with the real `opa` binary: the shipped policies' tests pass identically under
//! `opa test` and `stateward::policy`, and the corpus in policies/testdata gives the same deny
//! and warn sets under `opa eval` and regorus (and the rule ids the corpus expects).
//!
//! Needs the binary from tests/tools/build-opa (or `STATEWARD_OPA`); fails when it is missing.
#![allow(clippy::panic, clippy::expect_used)]

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;
use stateward::policy::{Bundle, DecisionPoint, PolicyEngine};

const OPA_VERSION: &str = "v1.22.4";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn policies() -> PathBuf {
    repo().join("policies")
}

/// The real opa binary: `$STATEWARD_OPA`, else the cache path tests/tools/build-opa uses.
fn opa() -> PathBuf {
    if let Ok(p) = std::env::var("STATEWARD_OPA") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "STATEWARD_OPA={} does not exist", p.display());
        return p;
    }
    let cache = std::env::var("STATEWARD_CACHE").map(PathBuf::from).unwrap_or_else(|_| {
        let base = std::env::var("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").expect("HOME is set")).join(".cache"));
        base.join("stateward")
    });
    let p = cache.join("bin").join(format!("opa-{OPA_VERSION}")).join("opa");
    assert!(
        p.is_file(),
        "the real opa binary is missing at {}: run tests/tools/build-opa first (or set STATEWARD_OPA)",
        p.display()
    );
    p
}

fn opa_test_passes(dir: &Path) -> (BTreeSet<String>, BTreeSet<String>) {
    let out = Command::new(opa()).args(["test", "--format", "json"]).arg(dir).output().expect("run opa test");
    let results: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("opa test output is not JSON ({e}): {}", String::from_utf8_lossy(&out.stderr))
    });
    let mut pass = BTreeSet::new();
    let mut fail = BTreeSet::new();
    for r in results {
        let name =
            format!("{}.{}", r["package"].as_str().expect("package"), r["name"].as_str().expect("name"));
        if r.get("fail").and_then(Value::as_bool) == Some(true) || r.get("error").is_some() {
            fail.insert(name);
        } else {
            pass.insert(name);
        }
    }
    (pass, fail)
}

fn ours(dir: &Path) -> (BTreeSet<String>, BTreeSet<String>) {
    let engine = PolicyEngine::compile(&Bundle::from_dir(dir).expect("bundle")).expect("compile");
    let mut pass = BTreeSet::new();
    let mut fail = BTreeSet::new();
    for t in engine.run_tests() {
        if t.passed {
            pass.insert(t.name)
        } else {
            fail.insert(t.name)
        };
    }
    (pass, fail)
}

#[test]
fn opa_test_and_stateward_policy_test_agree_on_shipped_policies() {
    let (opa_pass, opa_fail) = opa_test_passes(&policies());
    let (our_pass, our_fail) = ours(&policies());
    assert!(opa_pass.len() >= 50, "expected the shipped test suite, got {} tests", opa_pass.len());
    assert!(opa_fail.is_empty(), "opa test failures: {opa_fail:?}");
    assert!(our_fail.is_empty(), "regorus test failures: {our_fail:?}");
    assert_eq!(opa_pass, our_pass, "same tests pass under opa and regorus");
    assert!(stateward::policy::cli::test(&policies()).expect("cli test"), "cli::test reports success");
}

#[test]
fn opa_test_and_stateward_policy_test_agree_on_a_failing_test() {
    let dir = tempdir("failing");
    std::fs::write(dir.join("p.rego"), "package demo\n\nallow if input.user == \"admin\"\n").expect("write");
    std::fs::write(
        dir.join("p_test.rego"),
        "package demo_test\n\nimport data.demo\n\ntest_admin_allowed if demo.allow with input as {\"user\": \"admin\"}\n\n\
         test_guest_allowed_wrongly if demo.allow with input as {\"user\": \"guest\"}\n",
    )
    .expect("write");
    let (opa_pass, opa_fail) = opa_test_passes(&dir);
    let (our_pass, our_fail) = ours(&dir);
    assert_eq!(opa_pass, our_pass);
    assert_eq!(opa_fail, our_fail);
    assert_eq!(our_fail.len(), 1, "exactly the wrong test fails");
    assert!(!stateward::policy::cli::test(&dir).expect("cli test"), "cli::test reports failure");
}

fn tempdir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("stateward-policy-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    dir
}

fn corpus() -> Vec<Value> {
    let mut cases = Vec::new();
    for point in DecisionPoint::ALL {
        let file = policies().join("testdata").join(format!("{}.jsonl", point.name()));
        let text = std::fs::read_to_string(&file).expect("corpus file");
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let case: Value = serde_json::from_str(line).expect("corpus line is JSON");
            assert_eq!(case["point"], point.name());
            cases.push(case);
        }
    }
    cases
}

fn strings(v: &Value) -> Vec<String> {
    let mut out: Vec<String> = v
        .as_array()
        .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    out.sort();
    out
}

fn rule_ids(msgs: &[String]) -> Vec<String> {
    let ids: BTreeSet<String> = msgs
        .iter()
        .map(|m| stateward::policy::engine::rule_id(m).expect("message has a rule id").to_string())
        .collect();
    ids.into_iter().collect()
}

#[test]
fn corpus_gives_identical_decisions_under_opa_eval_and_regorus() {
    let cases = corpus();
    assert!(cases.len() >= 50, "corpus has {} inputs", cases.len());
    let engine = PolicyEngine::compile(&Bundle::from_dir(&policies()).expect("bundle")).expect("compile");
    assert!(
        engine.rvm_fallbacks().is_empty(),
        "all decision points run on the RVM: {:?}",
        engine.rvm_fallbacks()
    );
    let mut seen = BTreeSet::new();
    for case in &cases {
        let name = case["name"].as_str().expect("name");
        let point = DecisionPoint::ALL.into_iter().find(|p| p.name() == case["point"]).expect("known point");
        let mut child = Command::new(opa())
            .args(["eval", "--format", "json", "--stdin-input", "--data"])
            .arg(policies())
            .arg(point.package())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn opa eval");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(case["input"].to_string().as_bytes())
            .expect("write input");
        let out = child.wait_with_output().expect("opa eval");
        assert!(out.status.success(), "{name}: opa eval failed");
        let doc: Value = serde_json::from_slice(&out.stdout).expect("opa eval JSON");
        let value = &doc["result"][0]["expressions"][0]["value"];
        let (opa_deny, opa_warn) = (strings(&value["deny"]), strings(&value["warn"]));

        let ev = engine.evaluate(point, &case["input"]);
        assert_eq!(ev.error, None, "{name}: regorus error");
        assert_eq!(ev.deny, opa_deny, "{name}: deny sets differ");
        assert_eq!(ev.warn, opa_warn, "{name}: warn sets differ");
        // The interpreter path (used for queries and tests) agrees with the RVM path.
        let interp = engine.query(&format!("{}.deny", point.package()), &case["input"]).expect("query");
        assert_eq!(strings(&interp), ev.deny, "{name}: interpreter and RVM differ");
        assert_eq!(rule_ids(&ev.deny), strings(&case["expect"]["deny"]), "{name}: expected deny rules");
        assert_eq!(rule_ids(&ev.warn), strings(&case["expect"]["warn"]), "{name}: expected warn rules");
        seen.insert((point.name(), ev.deny.is_empty()));
    }
    for point in DecisionPoint::ALL {
        assert!(seen.contains(&(point.name(), true)), "{}: corpus has allowed cases", point.name());
        assert!(seen.contains(&(point.name(), false)), "{}: corpus has denied cases", point.name());
    }
}

#[test]
fn a_syntax_error_is_rejected_by_both_opa_and_regorus() {
    let dir = tempdir("syntax");
    for f in ["guardrails.rego", "data.json"] {
        std::fs::copy(policies().join(f), dir.join(f)).expect("copy");
    }
    std::fs::write(dir.join("broken.rego"), "package stateward.broken\n\ndeny contains msg if {\n")
        .expect("write");
    let opa_ok = Command::new(opa()).arg("check").arg(&dir).output().expect("opa check").status.success();
    assert!(!opa_ok, "opa rejects the syntax error");
    let err = PolicyEngine::compile(&Bundle::from_dir(&dir).expect("bundle")).expect_err("regorus rejects");
    assert_eq!(err.label(), "parse_policy", "{err}");
}
