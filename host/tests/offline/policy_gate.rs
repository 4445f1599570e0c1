//! The policy gate through its public API with the real regorus engine and real files:
//! plan verdicts, enforcement modes, fail-closed paths, the audit chain and its verifier.
#![allow(clippy::panic, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};
use stateward::policy::audit::{self, BreakKind};
use stateward::policy::{
    AdmissionRequest, AuditLog, AuditSink, Bundle, BundleFile, DecisionContext, FsyncPolicy, Gate, KindRef,
    PlanAuthor, PlannedAction, PluginLoad, PolicyEngine, UserInfo,
};

fn policies() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies")
}

fn tempdir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("stateward-gate-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    dir
}

fn shipped_files() -> Vec<BundleFile> {
    Bundle::from_dir(&policies()).expect("bundle").files().to_vec()
}

fn engine_with_data(patch: impl Fn(&mut Value)) -> Arc<PolicyEngine> {
    let files = shipped_files()
        .into_iter()
        .map(|mut f| {
            if f.name == "data.json" {
                let mut data: Value = serde_json::from_str(&f.contents).expect("data");
                patch(&mut data);
                f.contents = data.to_string();
            }
            f
        })
        .collect::<Vec<_>>();
    Arc::new(PolicyEngine::compile(&Bundle::from_files(files).expect("bundle")).expect("compile"))
}

fn gate_to(path: &Path, engine: Arc<PolicyEngine>) -> Gate {
    let log = AuditLog::open(&AuditSink::File(path.to_path_buf()), FsyncPolicy::PerRecord).expect("audit");
    Gate::new(engine, Arc::new(log))
}

fn plugin() -> PlanAuthor {
    PlanAuthor {
        name: "postgres".into(),
        version: "0.1.0".into(),
        digest: format!("sha256:{}", "0".repeat(64)),
        owns: vec![
            KindRef { api_version: "apps/v1".into(), kind: "StatefulSet".into() },
            KindRef { api_version: "v1".into(), kind: "Service".into() },
        ],
    }
}

fn cr() -> Value {
    json!({"apiVersion": "stateward.dev/v1alpha1", "kind": "PostgresCluster",
           "metadata": {"name": "main", "namespace": "db", "generation": 2}, "spec": {"replicas": 3}})
}

fn sts(privileged: bool, host_network: bool) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "main"},
      "spec": {"template": {"spec": {"hostNetwork": host_network, "automountServiceAccountToken": false, "containers": [{
        "name": "postgres", "image": "docker.io/library/postgres:16.4",
        "securityContext": {"runAsNonRoot": true, "allowPrivilegeEscalation": false, "privileged": privileged},
        "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}}}})
}

/// A Service's spec selecting the pods of [`cr`]'s instance (as the guardrails require).
fn own_selector() -> Value {
    json!({"selector": {"stateward.dev/instance": "main"}})
}

fn apply(o: Value) -> PlannedAction {
    PlannedAction { verb: "apply".into(), object: o }
}

fn ctx() -> DecisionContext {
    DecisionContext {
        trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
        span_id: "00f067aa0ba902b7".into(),
        requested_by: String::new(),
    }
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("read audit")
        .lines()
        .map(|l| serde_json::from_str(l).expect("audit line is JSON"))
        .collect()
}

fn shipped() -> Arc<PolicyEngine> {
    Arc::new(PolicyEngine::compile(&Bundle::from_dir(&policies()).expect("bundle")).expect("compile"))
}

#[test]
fn a_privileged_statefulset_blocks_the_whole_plan_and_every_action_is_audited() {
    let dir = tempdir("plan");
    let log = dir.join("audit.jsonl");
    let gate = gate_to(&log, shipped());
    let service =
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "main"}, "spec": own_selector()});
    let plan = [apply(service.clone()), apply(sts(true, false))];
    let v = gate.check_plan(&ctx(), &plugin(), &stateward::policy::resource_input(&cr()), &plan);
    assert!(!v.allowed());
    assert!(v.actions[0].verdict.allowed(), "the Service alone is fine");
    assert_eq!(v.actions[1].target, "apps/v1/StatefulSet/main");
    assert_eq!(v.denials().len(), 1);
    assert!(v.denials()[0].1.starts_with("privileged: "), "{:?}", v.denials());

    let ok = gate.check_plan(
        &ctx(),
        &plugin(),
        &stateward::policy::resource_input(&cr()),
        &[apply(service), apply(sts(false, false))],
    );
    assert!(ok.allowed(), "{:?}", ok.denials());

    let recs = lines(&log);
    // The Service's second decision repeats its first unchanged: counted, not written again.
    assert_eq!(recs.len(), 3, "one record per decision");
    let denied = &recs[1];
    assert_eq!(denied["path"], "stateward/guardrails");
    assert_eq!(denied["labels"]["point"], "guardrails");
    assert_eq!(denied["requested_by"], "plugin/postgres");
    assert_eq!(denied["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(denied["bundles"]["stateward"]["revision"], gate.engine().digest());
    assert_eq!(denied["result"]["enforced"]["allowed"], false);
    assert_eq!(denied["input"]["resource"]["namespace"], "db");
    assert!(denied["metrics"]["timer_rego_eval_ns"].as_u64().expect("timer") > 0);
    assert_eq!(denied["decision_id"], v.actions[1].verdict.decision_id.as_str());
    assert!(jiff::Timestamp::from_str_ok(denied["timestamp"].as_str().expect("ts")));
    assert!(stateward::policy::cli::verify_audit(&log).expect("verify"));
}

trait TsExt {
    fn from_str_ok(s: &str) -> bool;
}
impl TsExt for jiff::Timestamp {
    fn from_str_ok(s: &str) -> bool {
        s.parse::<jiff::Timestamp>().is_ok()
    }
}

#[test]
fn enforcement_modes_come_from_policy_data() {
    let engine = engine_with_data(|d| {
        d["stateward"]["config"]["enforcement"]["guardrails"] =
            json!({"privileged": "dryrun", "host-namespace": "warn"});
    });
    let dir = tempdir("modes");
    let log = dir.join("audit.jsonl");
    let gate = gate_to(&log, engine);
    let res = stateward::policy::resource_input(&cr());
    let v = gate.check_plan(&ctx(), &plugin(), &res, &[apply(sts(true, true))]);
    assert!(v.allowed(), "dryrun and warn rules do not block: {:?}", v.denials());
    let a = &v.actions[0].verdict;
    assert_eq!(a.dryrun.len(), 1);
    assert!(a.dryrun[0].starts_with("privileged: "));
    assert_eq!(a.warned.len(), 1);
    assert!(a.warned[0].starts_with("host-namespace: "));
    let rec = &lines(&log)[0];
    assert_eq!(rec["result"]["deny"].as_array().expect("deny").len(), 2, "raw deny set is audited");
    assert_eq!(rec["result"]["enforced"]["dryrun"][0], a.dryrun[0].as_str());

    // A rule left at the default still blocks.
    let blocked = gate.check_plan(
        &ctx(),
        &plugin(),
        &res,
        &[apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}))],
    );
    assert!(!blocked.allowed());

    let bad = Bundle::from_files(shipped_files().into_iter().map(|mut f| {
        if f.name == "data.json" {
            f.contents =
                f.contents.replace("\"guardrails\": {}", "\"guardrails\": {\"privileged\": \"maybe\"}");
        }
        f
    }))
    .expect("bundle");
    let err = PolicyEngine::compile(&bad).expect_err("an unknown mode is rejected");
    assert_eq!(err.label(), "compile_bundle", "{err}");
}

#[test]
fn a_missing_decision_point_fails_closed_and_is_audited() {
    let files = shipped_files().into_iter().filter(|f| !f.name.starts_with("guardrails"));
    let engine =
        Arc::new(PolicyEngine::compile(&Bundle::from_files(files).expect("bundle")).expect("compile"));
    let dir = tempdir("missing");
    let log = dir.join("audit.jsonl");
    let gate = gate_to(&log, engine);
    let v = gate.check_plan(
        &ctx(),
        &plugin(),
        &stateward::policy::resource_input(&cr()),
        &[apply(sts(false, false))],
    );
    assert!(!v.allowed(), "no guardrails package: deny");
    let verdict = &v.actions[0].verdict;
    assert!(verdict.error.as_deref().unwrap_or("").contains("stateward.guardrails"));
    assert!(verdict.denied[0].starts_with("policy-error: "));
    assert!(lines(&log)[0]["error"].as_str().expect("error recorded").contains("guardrails"));
}

#[test]
fn a_deny_rule_of_the_wrong_type_fails_closed() {
    let files = vec![BundleFile {
        name: "g.rego".into(),
        contents: "package stateward.guardrails\n\ndeny := \"everything is fine\"\n".into(),
    }];
    let engine =
        Arc::new(PolicyEngine::compile(&Bundle::from_files(files).expect("bundle")).expect("compile"));
    let ev = engine.evaluate(stateward::policy::DecisionPoint::Guardrails, &json!({}));
    assert!(ev.error.as_deref().unwrap_or("").contains("not a set of strings"), "{ev:?}");
}

#[test]
fn an_unwritable_audit_sink_fails_closed() {
    let log =
        AuditLog::open(&AuditSink::File(PathBuf::from("/dev/full")), FsyncPolicy::OsBuffered).expect("open");
    let gate = Gate::new(shipped(), Arc::new(log));
    let res = stateward::policy::resource_input(&cr());
    for _ in 0..2 {
        let v = gate.check_plan(&ctx(), &plugin(), &res, &[apply(sts(false, false))]);
        assert!(!v.allowed(), "a compliant plan is denied when it cannot be audited");
        let a = &v.actions[0].verdict;
        assert!(a.denied.iter().any(|m| m.starts_with("audit-error: ")), "{a:?}");
        assert!(a.error.is_some());
    }
    let missing_dir = tempdir("nodir").join("no/such/dir/audit.jsonl");
    let err = AuditLog::open(&AuditSink::File(missing_dir), FsyncPolicy::PerRecord).expect_err("cannot open");
    assert_eq!(err.label(), "open_audit");
}

#[test]
fn secret_values_are_masked_in_the_audit_log() {
    let dir = tempdir("mask");
    let log = dir.join("audit.jsonl");
    let gate = gate_to(&log, shipped());
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "main-credentials"},
                        "data": {"password": "aHVudGVyMg=="}, "stringData": {"user/name": "hunter2"}});
    let v = gate.check_plan(
        &ctx(),
        &plugin(),
        &stateward::policy::resource_input(&cr()),
        &[PlannedAction { verb: "ensure-secret".into(), object: secret }],
    );
    assert!(v.allowed(), "{:?}", v.denials());
    let text = std::fs::read_to_string(&log).expect("read");
    assert!(!text.contains("aHVudGVyMg==") && !text.contains("hunter2"), "secret values never reach the log");
    let rec = &lines(&log)[0];
    assert_eq!(rec["input"]["action"]["object"]["data"]["password"], audit::MASK);
    assert_eq!(
        rec["erased"],
        json!(["/input/action/object/data/password", "/input/action/object/stringData/user~1name"])
    );
}

#[test]
fn admission_and_plugin_load_decisions() {
    let dir = tempdir("admit");
    let log = dir.join("audit.jsonl");
    let gate = gate_to(&log, shipped());
    let old = json!({"spec": {"replicas": 5, "deletionProtection": true}});
    let new = json!({"spec": {"replicas": 2, "deletionProtection": true}});
    let req = |groups: Vec<String>| AdmissionRequest {
        operation: "UPDATE".into(),
        user_info: UserInfo { username: "bob".into(), groups },
        object: new.clone(),
        old_object: old.clone(),
        dry_run: false,
    };
    let dev = gate.admit(&ctx(), &req(vec!["developers".into()]));
    assert!(!dev.allowed());
    assert!(dev.denied[0].starts_with("scale-down: "));
    let admin = gate.admit(&ctx(), &req(vec!["stateward:admins".into()]));
    assert!(admin.allowed(), "{:?}", admin.denied);

    let load = |name: &str, size: u64| PluginLoad {
        name: name.into(),
        version: "0.1.0".into(),
        digest: format!("sha256:{}", "a".repeat(64)),
        size,
        kinds: vec![KindRef { api_version: "stateward.dev/v1alpha1".into(), kind: "PostgresCluster".into() }],
        ..PluginLoad::default()
    };
    let ok = gate.plugin_load(&ctx(), &load("postgres", 1000));
    assert!(ok.allowed(), "{ok:?}");
    assert_eq!(ok.warned.len(), 1, "unpinned plugin warns");
    assert!(!gate.plugin_load(&ctx(), &load("miner", 1000)).allowed());
    assert!(!gate.plugin_load(&ctx(), &load("postgres", 2 << 20)).allowed());

    let recs = lines(&log);
    assert_eq!(recs.len(), 5);
    assert_eq!(recs[0]["requested_by"], "bob");
    assert_eq!(recs[0]["path"], "stateward/admission");
    assert_eq!(recs[2]["requested_by"], "stateward");
    assert_eq!(recs[2]["path"], "stateward/plugins");
}

/// A decision asked for inside a span carries that span's trace and span ids into its audit
/// record (`DecisionContext::in_current_span`, as the controller, the webhooks, the sweep and
/// the reloader ask); outside any span the ids stay empty.
#[test]
fn a_decision_is_audited_with_the_ids_of_the_span_it_was_asked_from() {
    use stateward::telemetry::otel::{self, ExportStats};
    use tracing_subscriber::layer::SubscriberExt as _;

    let dir = tempdir("span-ids");
    let log = dir.join("audit.jsonl");
    let gate = gate_to(&log, shipped());
    let stats = ExportStats::default();
    let provider = otel::provider(None, &stats).expect("provider without export");
    let subscriber = tracing_subscriber::registry().with(otel::layer(&provider));
    let (ids, traced) = tracing::subscriber::with_default(subscriber, || {
        let span = tracing::info_span!("policy.eval");
        span.in_scope(|| (otel::current_ids(), DecisionContext::in_current_span("tester")))
    });
    let (trace_id, span_id) = ids.expect("the span has ids");
    assert_eq!((traced.trace_id.as_str(), traced.span_id.as_str()), (trace_id.as_str(), span_id.as_str()));
    let load = PluginLoad {
        name: "postgres".into(),
        version: "0.1.0".into(),
        digest: format!("sha256:{}", "a".repeat(64)),
        size: 1000,
        kinds: vec![KindRef { api_version: "stateward.dev/v1".into(), kind: "PostgresCluster".into() }],
        ..PluginLoad::default()
    };
    gate.plugin_load(&traced, &load);
    gate.plugin_load(&DecisionContext::in_current_span("tester"), &load);
    let recs = lines(&log);
    assert_eq!(recs[0]["trace_id"], trace_id.as_str());
    assert_eq!(recs[0]["span_id"], span_id.as_str());
    assert_eq!(recs[0]["requested_by"], "tester");
    assert_eq!((recs[1]["trace_id"].as_str(), recs[1]["span_id"].as_str()), (Some(""), Some("")));
    let _ = provider.shutdown();
}

/// Writes `n` audited decisions to a fresh file and returns its lines.
fn audit_file(tag: &str, n: usize) -> (PathBuf, Vec<String>) {
    let dir = tempdir(tag);
    let log = dir.join("audit.jsonl");
    let gate = gate_to(&log, shipped());
    let res = stateward::policy::resource_input(&cr());
    for i in 0..n {
        // Each its own input: an unchanged repetition would be counted, not written.
        let mut o = sts(i % 3 == 0, false);
        o["metadata"]["name"] = json!(format!("main-{i}"));
        gate.check_plan(&ctx(), &plugin(), &res, &[apply(o)]);
    }
    let text = std::fs::read_to_string(&log).expect("read");
    (log, text.lines().map(str::to_string).collect())
}

fn rewrite(path: &Path, lines: &[String]) {
    std::fs::write(path, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).expect("write");
}

#[test]
fn audit_verify_passes_untouched_and_resumes_the_chain_after_reopen() {
    let (log, lines) = audit_file("intact", 10);
    assert_eq!(lines.len(), 10);
    let report = audit::verify(&log).expect("verify");
    assert_eq!(report.records, 10);
    assert_eq!(report.first_break, None);
    // Reopening continues the same chain.
    let gate = gate_to(&log, shipped());
    gate.plugin_load(
        &ctx(),
        &PluginLoad {
            name: "redis".into(),
            version: "1".into(),
            digest: String::new(),
            size: 1,
            kinds: vec![],
            ..PluginLoad::default()
        },
    );
    let report = audit::verify(&log).expect("verify");
    assert_eq!((report.records, report.first_break), (11, None));
}

#[test]
fn audit_verify_finds_one_changed_byte() {
    let (log, mut lines) = audit_file("byte", 8);
    // Flip one digit of the eval timer on line 5: still valid JSON, but the hash no longer matches.
    let l = &mut lines[4];
    let pos = l.find("\"timer_rego_eval_ns\":").expect("timer") + "\"timer_rego_eval_ns\":".len();
    let digit = l.as_bytes()[pos];
    let replacement = if digit == b'9' { "8" } else { "9" };
    l.replace_range(pos..pos + 1, replacement);
    rewrite(&log, &lines);
    let b = audit::verify(&log).expect("verify").first_break.expect("break found");
    assert_eq!((b.line, b.kind), (5, BreakKind::Edited), "{b:?}");
    assert!(!stateward::policy::cli::verify_audit(&log).expect("verify"));
}

#[test]
fn audit_verify_finds_a_removed_line() {
    let (log, mut lines) = audit_file("gap", 8);
    lines.remove(5);
    rewrite(&log, &lines);
    let b = audit::verify(&log).expect("verify").first_break.expect("break found");
    assert_eq!((b.line, b.kind), (6, BreakKind::Gap), "{b:?}");
}

#[test]
fn audit_verify_finds_two_swapped_lines() {
    let (log, mut lines) = audit_file("swap", 8);
    lines.swap(2, 3);
    rewrite(&log, &lines);
    let b = audit::verify(&log).expect("verify").first_break.expect("break found");
    assert_eq!((b.line, b.kind), (3, BreakKind::Reorder), "{b:?}");
}

#[test]
fn audit_verify_finds_a_relinked_forgery() {
    // A line edited and re-hashed by someone without the previous hash still breaks the link:
    // replace line 4 by line 4 of another, independent chain.
    let (log, mut lines) = audit_file("relink", 6);
    let (_, other) = audit_file("relink-other", 6);
    lines[3] = other[3].clone();
    rewrite(&log, &lines);
    let b = audit::verify(&log).expect("verify").first_break.expect("break found");
    assert_eq!((b.line, b.kind), (4, BreakKind::BrokenLink), "{b:?}");
}

#[test]
fn a_bundle_with_a_failing_test_is_rejected_whole() {
    let mut files = shipped_files();
    files.push(BundleFile {
        name: "extra_test.rego".into(),
        contents: "package stateward.extra_test\n\nimport data.stateward.guardrails\n\n\
                   test_everything_denied if count(guardrails.deny) > 100\n"
            .into(),
    });
    let bundle = Bundle::from_files(files).expect("bundle");
    let err = PolicyEngine::compile_tested(&bundle).expect_err("rejected");
    assert_eq!(err.label(), "test_bundle");
    assert!(err.to_string().contains("test_everything_denied"), "{err}");
    assert!(PolicyEngine::compile_tested(&Bundle::from_dir(&policies()).expect("bundle")).is_ok());

    let mut broken = shipped_files();
    broken[0].contents.push_str("\ndeny contains msg if {\n");
    let err = PolicyEngine::compile(&Bundle::from_files(broken).expect("bundle")).expect_err("syntax error");
    assert_eq!(err.label(), "parse_policy");
}

#[test]
fn bundle_digest_depends_on_names_and_contents_only() {
    let a = Bundle::from_dir(&policies()).expect("bundle");
    let b = Bundle::from_files(shipped_files().into_iter().rev()).expect("bundle");
    assert_eq!(a.digest(), b.digest());
    let mut changed = shipped_files();
    changed[0].contents.push(' ');
    assert_ne!(a.digest(), Bundle::from_files(changed).expect("bundle").digest());
}

#[test]
fn cli_eval_answers_like_opa_eval() {
    let dir = tempdir("eval");
    let input = dir.join("input.json");
    let doc = json!({"plugin": {"name": "postgres", "owns": [{"apiVersion": "apps/v1", "kind": "StatefulSet"}]},
                     "resource": {"namespace": "db"}, "action": {"verb": "apply", "object": sts(true, false)}});
    std::fs::write(&input, doc.to_string()).expect("write");
    let v =
        stateward::policy::cli::eval(&policies(), &input, "data.stateward.guardrails.deny").expect("eval");
    assert_eq!(v, json!(["privileged: container postgres runs privileged"]));
    let whole = stateward::policy::cli::eval(&policies(), &input, "data.stateward.guardrails").expect("eval");
    assert!(whole["deny"].is_array() && whole["warn"].is_array(), "{whole}");
}

#[test]
fn one_engine_serves_many_threads() {
    let engine = shipped();
    let input = json!({"plugin": plugin(), "resource": {"namespace": "db"}, "action": {"verb": "apply", "object": sts(true, true)}});
    let expected = engine.evaluate(stateward::policy::DecisionPoint::Guardrails, &input).deny;
    assert_eq!(expected.len(), 2);
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (engine, input, expected) = (engine.clone(), input.clone(), expected.clone());
            std::thread::spawn(move || {
                for _ in 0..50 {
                    let ev = engine.evaluate(stateward::policy::DecisionPoint::Guardrails, &input);
                    assert_eq!(ev.deny, expected);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread");
    }
}

/// The policy floor: a hot-loaded bundle (policy ConfigMaps) that drops the guardrails
/// package and its tests and sets `privileged` to dryrun still has the floor deny a
/// privileged plan; the rule it adds applies too, and it may make a floor rule stricter.
#[test]
fn a_hot_loaded_bundle_cannot_drop_or_dryrun_a_floor_guardrail() {
    let dir = tempdir("floor");
    let floor = engine_with_data(|d| {
        d["stateward"]["config"]["enforcement"]["guardrails"]["resource-limits"] = json!("warn")
    });
    let gate = gate_to(&dir.join("audit.jsonl"), floor);
    let mut files: Vec<BundleFile> =
        shipped_files().into_iter().filter(|f| !f.name.starts_with("guardrails")).collect();
    for f in &mut files {
        if f.name == "data.json" {
            let mut data: Value = serde_json::from_str(&f.contents).expect("data");
            data["stateward"]["config"]["enforcement"]["guardrails"] =
                json!({"privileged": "dryrun", "host-namespace": "dryrun", "resource-limits": "deny"});
            f.contents = data.to_string();
        }
    }
    files.push(BundleFile {
        name: "extra.rego".into(),
        contents: "package stateward.guardrails\n\ndeny contains \"no-services: this cluster plans no Services\" if input.action.object.kind == \"Service\"\n".into(),
    });
    let layer = PolicyEngine::compile_tested(&Bundle::from_files(files).expect("bundle")).expect("the layer");
    let layered = gate.with_layer(Some(Arc::new(layer)));
    assert_ne!(layered.digest(), gate.digest());

    let res = stateward::policy::resource_input(&cr());
    let mut no_limits = sts(false, false);
    no_limits["spec"]["template"]["spec"]["containers"][0]["resources"] = json!({});
    let service =
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "main"}, "spec": own_selector()});
    let plan = [apply(sts(true, true)), apply(no_limits), apply(service)];
    let verdict = layered.check_plan(&ctx(), &plugin(), &res, &plan);
    let denied = |i: usize| verdict.actions[i].verdict.denied.join("; ");
    assert!(denied(0).contains("privileged: ") && denied(0).contains("host-namespace: "), "{}", denied(0));
    assert!(verdict.actions[0].verdict.dryrun.is_empty(), "{:?}", verdict.actions[0].verdict);
    // resource-limits is `warn` on the floor; the layer made it `deny`.
    assert!(denied(1).contains("resource-limits: "), "{:?}", verdict.actions[1].verdict);
    assert!(denied(2).starts_with("no-services: "), "{}", denied(2));
    // The floor alone: the same plan, without the layer's rule and with the floor's modes.
    let alone = gate.check_plan(&ctx(), &plugin(), &res, &plan);
    assert!(alone.actions[1].verdict.denied.is_empty() && !alone.actions[1].verdict.warned.is_empty());
    assert!(alone.actions[2].verdict.allowed());
    let records = std::fs::read_to_string(dir.join("audit.jsonl")).expect("audit");
    assert!(records.contains(layered.digest()), "decisions are recorded under both layers' digest");
}

/// A converged resource's plan decided again: each action is written in full once, then its
/// unchanged repetitions are counted and written at the flush as one record for the
/// requester, a row per decision naming the record repeated (its seq and the start of its
/// hash), the count and the first and last time. A different input is written in full, never counted; a
/// decision not repeated for two flushes is forgotten and written in full when it returns.
/// The chain verifies throughout.
#[test]
fn unchanged_repetitions_of_a_plan_are_counted_and_written_once_per_flush() {
    let dir = tempdir("repeats");
    let log = dir.join("audit.jsonl");
    let gate = gate_to(&log, shipped());
    let res = stateward::policy::resource_input(&cr());
    let service =
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "main"}, "spec": own_selector()});
    let plan = [apply(service.clone()), apply(sts(false, false))];
    let first = gate.check_plan(&ctx(), &plugin(), &res, &plan);
    for _ in 0..4 {
        let again = gate.check_plan(&ctx(), &plugin(), &res, &plan);
        assert!(again.allowed());
        let ids = |v: &stateward::policy::PlanVerdict| -> Vec<String> {
            v.actions.iter().map(|a| a.verdict.decision_id.clone()).collect()
        };
        assert_eq!(ids(&again), ids(&first), "a repetition names the decision it repeats");
    }
    assert_eq!(lines(&log).len(), 2, "each decision written once");
    // Another spec is another input: written in full.
    let mut other = cr();
    other["spec"]["replicas"] = json!(5);
    gate.check_plan(&ctx(), &plugin(), &stateward::policy::resource_input(&other), &plan);
    assert_eq!(lines(&log).len(), 4);

    assert_eq!(gate.flush_repetitions(), Ok(1), "one record for the requester's repetitions");
    let recs = lines(&log);
    assert_eq!(recs.len(), 5);
    let rep = &recs[4];
    assert_eq!(rep["input"]["repeated"]["fields"], json!(["seq", "hash", "count", "first", "last"]));
    let rows = rep["input"]["repeated"]["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2, "{rep}");
    for (row, original) in rows.iter().zip(&recs[..2]) {
        assert_eq!(row[0], original["seq"]);
        let hash = original["hash"].as_str().expect("hash");
        assert_eq!(row[1].as_str(), hash.get(..16));
        assert_eq!(row[2], 4);
        assert!(row[3].as_i64() <= row[4].as_i64() && row[3].as_i64() > Some(0), "{row}");
    }
    assert_eq!(rep["result"], json!({ "decisions": 2, "repetitions": 8 }));
    assert_eq!(rep["path"], "stateward/guardrails");
    assert_eq!(rep["requested_by"], "plugin/postgres");
    assert!(stateward::policy::cli::verify_audit(&log).expect("verify"));

    // Nothing repeated since: nothing to write. Still tracked one more period, then forgotten.
    assert_eq!(gate.flush_repetitions(), Ok(0));
    gate.check_plan(&ctx(), &plugin(), &res, &plan);
    assert_eq!(lines(&log).len(), 5, "still counted after one idle period");
    assert_eq!(gate.flush_repetitions(), Ok(1), "the first plan's two, once more");
    assert_eq!(gate.flush_repetitions(), Ok(0));
    assert_eq!(gate.flush_repetitions(), Ok(0));
    gate.check_plan(&ctx(), &plugin(), &res, &plan);
    assert_eq!(lines(&log).len(), 8, "forgotten after two idle periods: written in full again");
    assert!(stateward::policy::cli::verify_audit(&log).expect("verify"));
}

/// [agent]'s quiet audit: a poll's answers that end as the last written one did (its output,
/// timings and sizes changed, as an idle server's do) are counted as repetitions of it; an
/// answer that ends otherwise is written in full, and so is every answer of a one-shot
/// request. The chain verifies.
#[test]
fn a_polls_unchanged_answers_are_counted_and_a_changed_one_written() {
    use stateward::requests::Outcome;
    use stateward::runtime::Response;
    let dir = tempdir("poll-outcomes");
    let log = dir.join("audit.jsonl");
    let gate = gate_to(&log, shipped());
    let request = json!({ "verb": "exec", "pod": "pg-0", "container": "postgres", "command": ["psql"] });
    let record = |response: &Response, poll: bool| {
        let outcome =
            Outcome { requested_by: "plugin/postgres", audit: &request, response, sent: true, poll };
        gate.record_outcome(outcome.requested_by, &request, outcome.audited(), outcome.class())
            .expect("audited");
    };
    let answer = |i: u64, code: i32, stdout: &str| Response {
        id: "stats-pg-0".into(),
        code: Some(code),
        stdout: format!("{stdout}|0/30{i:05}"),
        started_at_ms: 1_700_000_000_000 + i * 2_000,
        duration_ms: 40 + i,
        ..Response::default()
    };
    for i in 0..5 {
        record(&answer(i, 0, "f"), true);
    }
    let recs = lines(&log);
    assert_eq!(recs.len(), 1, "one poll answer written in full: {recs:#?}");
    assert_eq!(recs[0]["result"]["outcome"]["durationMs"], 40, "the first one with its details");
    record(&answer(5, 2, "f"), true);
    assert_eq!(lines(&log).len(), 2, "an answer that ends otherwise is written");
    for i in 6..8 {
        record(&answer(i, 0, "f"), false);
    }
    assert_eq!(lines(&log).len(), 4, "every answer of a one-shot request is written");
    assert_eq!(gate.flush_repetitions(), Ok(1));
    let recs = lines(&log);
    assert_eq!(recs[4]["input"]["repeated"]["rows"][0][0], recs[0]["seq"]);
    assert_eq!(recs[4]["input"]["repeated"]["rows"][0][2], 4);
    assert!(stateward::policy::cli::verify_audit(&log).expect("verify"));
}

/// [hardening-2] 3: an admission record keeps what the rules read of the objects (metadata,
/// spec), not the objects: a large spec and a large annotation are kept as their digest and
/// size, status and managed fields not at all, and the whole object as its digest. The rules
/// still decide on the whole object (the large spec's `deletionProtection` denies).
#[test]
fn an_admission_record_keeps_digests_of_large_objects_not_the_objects() {
    let dir = tempdir("admit-record");
    let log = dir.join("audit.jsonl");
    let gate = gate_to(&log, shipped());
    let padding = "x".repeat(1 << 20);
    let object = |protected: bool| {
        json!({
            "apiVersion": "stateward.dev/v1alpha1", "kind": "PostgresCluster",
            "metadata": {
                "name": "pg", "namespace": "shop", "uid": "u-1",
                "labels": { "team": "a" },
                "annotations": { "kubectl.kubernetes.io/last-applied-configuration": padding, "note": "small" },
                "managedFields": [{ "manager": "kubectl", "fieldsV1": { "f:spec": padding } }],
            },
            "spec": { "replicas": 3, "deletionProtection": protected, "parameters": { "pad": padding } },
            "status": { "phase": "Running", "pad": padding },
        })
    };
    let req = AdmissionRequest {
        operation: "UPDATE".into(),
        user_info: UserInfo { username: "bob".into(), groups: vec!["developers".into()] },
        object: object(false),
        old_object: object(true),
        dry_run: false,
    };
    let verdict = gate.admit(&ctx(), &req);
    assert!(verdict.denied.iter().any(|d| d.contains("deletion")), "{:?}", verdict.denied);
    let text = std::fs::read_to_string(&log).expect("audit log");
    assert!(text.len() < 8 * 1024, "a record of {} bytes", text.len());
    let rec = &lines(&log)[0];
    let old = &rec["input"]["oldObject"];
    assert_eq!(old["metadata"]["name"], "pg");
    assert_eq!(old["metadata"]["labels"], json!({ "team": "a" }));
    assert_eq!(old["metadata"]["annotations"]["note"], "small");
    let applied = &old["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"];
    assert_eq!(applied["bytes"].as_u64(), Some(padding.len() as u64 + 2), "{applied}");
    assert_eq!(old["spec"]["sha256"].as_str().map(str::len), Some(64), "{}", old["spec"]);
    assert_eq!(old["whole"]["sha256"].as_str().map(str::len), Some(64));
    assert!(old.get("status").is_none() && old["metadata"].get("managedFields").is_none());
    assert_ne!(rec["input"]["object"]["whole"], old["whole"], "each object its own digest");
    assert!(stateward::policy::cli::verify_audit(&log).expect("verify"));
}
