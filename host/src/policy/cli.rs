//! Library halves of `stateward policy test`, `stateward policy eval` and
//! `stateward audit verify`; `main` only parses arguments and maps the result to an exit code.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::audit::{self, AuditLog};
use super::bundle::Bundle;
use super::checkpoint::{self, SigningKey};
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
    let text = std::fs::read_to_string(input)
        .map_err(|e| PolicyError::ReadInput { path: input.to_path_buf(), message: e.to_string() })?;
    let doc: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| PolicyError::ReadInput { path: input.to_path_buf(), message: e.to_string() })?;
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

/// Verifies a set of audit segments against signed checkpoints ([`audit::verify_segments`]);
/// prints one line per chain and every problem. Returns true when all is intact.
pub fn verify_segments(
    files: &[PathBuf],
    checkpoint_files: &[PathBuf],
    public_key: Option<&Path>,
) -> Result<bool, PolicyError> {
    let mut checkpoints = Vec::new();
    for f in checkpoint_files {
        checkpoints.extend(checkpoint::read_checkpoints(f)?);
    }
    let key = public_key.map(checkpoint::read_public_key).transpose()?;
    let report = audit::verify_segments(files, &checkpoints, key.as_deref())?;
    for c in &report.chains {
        println!(
            "chain {}: seq {}..{} in {} segment(s), {} signed checkpoint(s) matched",
            c.chain, c.first_seq, c.last_seq, c.segments, c.checkpoints
        );
    }
    for p in &report.problems {
        println!("BROKEN: {p}");
    }
    if report.intact() {
        println!("OK: {} chain(s) intact", report.chains.len());
    }
    Ok(report.intact())
}

/// Writes a new signing key to `path` (mode 0600) and returns its public key (base64).
pub fn keygen(path: &Path) -> Result<String, PolicyError> {
    use std::io::Write as _;
    let err = |e: std::io::Error| PolicyError::OpenAudit { path: path.to_path_buf(), message: e.to_string() };
    let text = SigningKey::generate()?;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path).and_then(|mut f| f.write_all(text.as_bytes())).map_err(err)?;
    let key = SigningKey::from_text(&text)
        .map_err(|m| PolicyError::OpenAudit { path: path.to_path_buf(), message: m })?;
    Ok(key.public_key_text())
}

/// Where a file sink's checkpoints go: `<audit-log>.checkpoints` beside it.
pub fn checkpoint_file(audit_log: &Path) -> PathBuf {
    let mut name = audit_log.file_name().unwrap_or_default().to_os_string();
    name.push(".checkpoints");
    audit_log.with_file_name(name)
}

/// The operator's periodic checkpoints of its audit chain: a thread signs the head every
/// interval (when it moved), appends it to the checkpoint file and logs it (field
/// [`checkpoint::LOG_FIELD`]), so checkpoints also leave the pod with the operator's log.
pub struct Checkpoints {
    stop: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Checkpoints {
    /// Loads the key, announces its public key in the log, and starts the thread.
    pub fn start(
        audit: Arc<AuditLog>,
        key_file: &Path,
        out: Option<PathBuf>,
        every: Duration,
    ) -> Result<Checkpoints, PolicyError> {
        let key = SigningKey::from_file(key_file)?;
        tracing::info!(
            public_key = %key.public_key_text(),
            key_id = %checkpoint::key_id(key.public_key()),
            "audit checkpoints signed with this key"
        );
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || loop {
            let last = matches!(
                stopped.recv_timeout(every),
                Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected)
            );
            take_checkpoint(&audit, &key, out.as_deref());
            if last {
                break;
            }
        });
        Ok(Checkpoints { stop, thread })
    }

    /// Takes a last checkpoint and stops.
    pub fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}

fn take_checkpoint(audit: &AuditLog, key: &SigningKey, out: Option<&Path>) {
    match audit.checkpoint(key, out) {
        Ok(Some(c)) => tracing::info!(
            audit_checkpoint = %c.to_line(),
            chain = %c.chain,
            seq = c.seq,
            "audit checkpoint"
        ),
        Ok(None) => {}
        Err(e) => tracing::warn!(error = %e, "audit checkpoint not taken"),
    }
}
