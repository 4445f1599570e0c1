//! Hot reload's checks through the public API with real components and the real policy
//! engine: which ConfigMaps may replace a running plugin or policy bundle, and why not.
//! The live swap on the local cluster is in hot_reload_live.rs.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::ByteString;
use serde_json::Value;
use stateward::policy::{AuditLog, AuditSink, Bundle, BundleFile, FsyncPolicy, Gate, PolicyEngine};
use stateward::reload::{plugins, policy};
use stateward::runtime::{LiveRegistry, Plugin, Registry};
use support::{sandbox, wasm, wasm_with_features};

fn shipped() -> Bundle {
    Bundle::from_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies")).unwrap()
}

fn gate_with(bundle: &Bundle) -> Gate {
    let audit = AuditLog::open(&AuditSink::File("/dev/null".into()), FsyncPolicy::OsBuffered).unwrap();
    Gate::new(Arc::new(PolicyEngine::compile(bundle).unwrap()), Arc::new(audit))
}

/// The three built-in plugins, as the operator serves them before any ConfigMap.
fn builtins() -> LiveRegistry {
    let sb = sandbox();
    let mut registry = Registry::default();
    for p in ["postgres", "redis", "elasticsearch"] {
        registry.insert(Arc::new(Plugin::load_file(&sb, &wasm(&format!("stateward-{p}"))).unwrap()));
    }
    LiveRegistry::new(registry)
}

fn packed(bytes: &[u8], name: &str) -> ConfigMap {
    plugins::pack(bytes, name, "stateward-system").unwrap()
}

fn variant(features: &[&str]) -> Vec<u8> {
    std::fs::read(wasm_with_features("fixture-redis-variant", features)).unwrap()
}

fn vet(cm: &ConfigMap, registry: &LiveRegistry) -> Result<Plugin, plugins::Rejection> {
    plugins::vet(cm, &sandbox(), &gate_with(&shipped()), registry)
}

#[test]
fn new_build_of_a_plugin_is_accepted_and_swaps_atomically() {
    let registry = builtins();
    let before = registry.get("stateward.dev", "RedisCluster").unwrap();
    let plugin = vet(&packed(&variant(&[]), "redis"), &registry).expect("the -next build is fine");
    assert_eq!(plugin.version(), format!("{}-next", before.version()));

    registry.set_override(Arc::new(plugin));
    let now = registry.get("stateward.dev", "RedisCluster").unwrap();
    assert!(now.version().ends_with("-next"));
    // A reconcile that took the old build keeps it; other kinds are untouched.
    assert!(!before.version().ends_with("-next"));
    assert_eq!(registry.get("stateward.dev", "PostgresCluster").unwrap().name(), "postgres");
    assert_eq!(registry.overridden(), vec!["redis".to_string()]);

    // Deleting the ConfigMap falls back to the built-in build.
    assert!(registry.remove_override("redis"));
    assert_eq!(registry.get("stateward.dev", "RedisCluster").unwrap().digest(), before.digest());
}

#[test]
fn each_bad_build_is_refused_with_its_own_reason() {
    let registry = builtins();
    let good = variant(&[]);

    let mut wrong_digest = packed(&good, "redis");
    wrong_digest
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(plugins::DIGEST_ANNOTATION.into(), format!("sha256:{}", "ab".repeat(32)));
    let mut not_a_component = packed(&good, "redis");
    let junk = b"\0asm\x01\0\0\0this is no component".to_vec();
    not_a_component.binary_data = Some([(plugins::WASM_KEY.to_string(), ByteString(junk.clone()))].into());
    not_a_component
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(plugins::DIGEST_ANNOTATION.into(), plugins::digest_of(&junk));
    let wrong_wit = std::fs::read(wasm("fixture-wrong-wit")).unwrap();
    let wrong_wit_name = {
        // The wrong-WIT fixture never gets as far as saying its name; label it "redis".
        packed(&wrong_wit, "redis")
    };
    let other_kind = packed(&variant(&["other-kind"]), "redis");
    // Labelled as another plugin on the allow-list (an unknown name is refused before compiling).
    let renamed = packed(&good, "postgres");

    let cases: [(&str, &ConfigMap, &str); 5] = [
        ("digest_mismatch", &wrong_digest, "says sha256:abab"),
        ("not_a_component", &not_a_component, ""),
        ("wit_version", &wrong_wit_name, ""),
        ("kind_changed", &other_kind, "RedisCluster.stateward.dev"),
        ("name_mismatch", &renamed, "\"postgres\""),
    ];
    for (reason, cm, says) in cases {
        let rejection = vet(cm, &registry).expect_err(reason);
        assert_eq!(rejection.reason, reason, "{rejection}");
        assert!(rejection.message.contains(says), "{reason}: {}", rejection.message);
    }
    // Nothing was swapped by any of them.
    assert!(registry.overridden().is_empty());
}

#[test]
fn plugins_policy_can_refuse_a_build() {
    let registry = builtins();
    // Pin redis to another digest: the new build is not on the allow-list.
    let files: Vec<BundleFile> = shipped()
        .files()
        .iter()
        .cloned()
        .map(|mut f| {
            if f.name == "data.json" {
                let mut data: Value = serde_json::from_str(&f.contents).unwrap();
                data["stateward"]["config"]["plugins"]["allowed"]["redis"]["digests"] =
                    serde_json::json!([format!("sha256:{}", "0".repeat(64))]);
                f.contents = data.to_string();
            }
            f
        })
        .collect();
    let gate = gate_with(&Bundle::from_files(files).unwrap());
    let rejection = plugins::vet(&packed(&variant(&[]), "redis"), &sandbox(), &gate, &registry).unwrap_err();
    assert_eq!(rejection.reason, "policy_denied");
    assert!(rejection.message.contains("digest-pin"), "{}", rejection.message);
}

#[test]
fn pack_refuses_what_cannot_ship_in_a_configmap() {
    // Compressed, still more than a ConfigMap holds: noise does not compress.
    let mut too_big = b"\0asm".to_vec();
    too_big.extend(noise(plugins::max_component_bytes() + 1));
    assert!(plugins::pack(&too_big, "redis", "ns")
        .unwrap_err()
        .contains("compressed; a ConfigMap holds at most"));
    let mut beyond = b"\0asm".to_vec();
    beyond.resize(plugins::MAX_COMPONENT_BYTES + 1, 0);
    assert!(plugins::pack(&beyond, "redis", "ns").unwrap_err().contains("loads at most"));
    assert!(plugins::pack(b"#!/bin/sh\n", "redis", "ns").unwrap_err().contains("not a WebAssembly"));
    let cm = packed(&variant(&[]), "redis");
    let ann = &cm.metadata.annotations.as_ref().unwrap()[plugins::DIGEST_ANNOTATION];
    assert_eq!(*ann, plugins::digest_of(&variant(&[])));
    assert_eq!(cm.metadata.labels.as_ref().unwrap()[plugins::PLUGIN_LABEL], "redis");
}

fn policy_configmap(name: &str, files: &[BundleFile]) -> (String, ConfigMap) {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.data = Some(files.iter().map(|f| (f.name.clone(), f.contents.clone())).collect());
    (name.to_string(), cm)
}

#[test]
fn policy_bundle_from_configmaps_is_vetted_whole() {
    let shipped = shipped();
    // The shipped files in a ConfigMap make the same bundle, digest and all.
    let same: BTreeMap<_, _> = [policy_configmap("policies", shipped.files())].into();
    let bundle = policy::bundle_of(&same).unwrap().unwrap();
    assert_eq!(bundle.digest(), shipped.digest());
    policy::vet(&bundle).expect("the shipped bundle passes its own tests");

    // A syntax error anywhere rejects the whole bundle.
    let mut broken = shipped.files().to_vec();
    broken.push(BundleFile {
        name: "extra.rego".into(),
        contents: "package stateward.extra\n\ndeny contains msg if {".into(),
    });
    let broken: BTreeMap<_, _> = [policy_configmap("policies", &broken)].into();
    let rejection = policy::vet(&policy::bundle_of(&broken).unwrap().unwrap()).unwrap_err();
    assert_eq!(rejection.reason, "compile_failed", "{}", rejection.message);

    // So does a failing test.
    let mut failing = shipped.files().to_vec();
    failing.push(BundleFile {
        name: "extra_test.rego".into(),
        contents: "package stateward.extra_test\n\ntest_always_fails if {\n\t1 == 2\n}\n".into(),
    });
    let failing: BTreeMap<_, _> = [policy_configmap("policies", &failing)].into();
    let rejection = policy::vet(&policy::bundle_of(&failing).unwrap().unwrap()).unwrap_err();
    assert_eq!(rejection.reason, "tests_failed");
    assert!(rejection.message.contains("test_always_fails"), "{}", rejection.message);

    // Two ConfigMaps may not both carry one file.
    let dup: BTreeMap<_, _> =
        [policy_configmap("a", &shipped.files()[..1]), policy_configmap("b", &shipped.files()[..1])].into();
    assert_eq!(policy::bundle_of(&dup).unwrap_err().reason, "duplicate_file");
    // No ConfigMap: the shipped bundle serves.
    assert!(policy::bundle_of(&BTreeMap::new()).unwrap().is_none());
}

/// A gate over `floor` recording into a fresh audit file; the file's path.
fn gate_audited(tag: &str, floor: &Bundle) -> (Gate, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("stateward-reload-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("audit.jsonl");
    let audit = AuditLog::open(&AuditSink::File(log.clone()), FsyncPolicy::OsBuffered).unwrap();
    (Gate::new(Arc::new(PolicyEngine::compile(floor).unwrap()), Arc::new(audit)), log)
}

fn plugins_records(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["path"] == "stateward/plugins")
        .collect()
}

/// A ConfigMap carrying `bytes` as plugin `name`, digest annotation included.
fn packed_raw(bytes: &[u8], name: &str) -> ConfigMap {
    let mut cm = packed(&variant(&[]), "redis");
    cm.binary_data = Some([(plugins::WASM_KEY.to_string(), ByteString(bytes.to_vec()))].into());
    let meta = &mut cm.metadata;
    meta.labels.as_mut().unwrap().insert(plugins::PLUGIN_LABEL.into(), name.into());
    meta.annotations.as_mut().unwrap().insert(plugins::DIGEST_ANNOTATION.into(), plugins::digest_of(bytes));
    cm
}

/// The plugins decision comes first, on what the ConfigMap tells: a build it refuses is
/// never compiled (these bytes are no component: compiling them would be refused as
/// `not_a_component`), and the audit log holds only the `before-compile` decision.
#[test]
fn a_build_the_policy_refuses_is_never_compiled() {
    let registry = builtins();
    let junk = b"\0asm\x01\0\0\0this is no component".to_vec();
    let (gate, log) = gate_audited("precompile", &shipped());
    let rejection =
        plugins::vet(&packed_raw(&junk, "cryptominer"), &sandbox(), &gate, &registry).unwrap_err();
    assert_eq!(rejection.reason, "policy_denied", "{rejection}");
    assert!(rejection.message.contains("unknown-plugin"), "{}", rejection.message);
    let records = plugins_records(&log);
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["input"]["stage"], "before-compile");
    assert_eq!(records[0]["input"]["configMap"]["labels"][plugins::PLUGIN_LABEL], "cryptominer");
    assert_eq!(records[0]["input"]["digest"], plugins::digest_of(&junk).as_str());
    assert_eq!(records[0]["requested_by"], "configmap/stateward-system/stateward-plugin-redis");

    // The hostile multi-memory component (8 memories of 64 MiB each, which info() would
    // grow) under the hardened profile without a pin: refused on its digest alone, never
    // loaded. Without the profile it gets as far as loading, whose checks refuse it.
    let hostile = support::multi_memory(8, 1024, 0);
    let (gate, log) = gate_audited("precompile-hostile", &floor_with(true, &[]));
    let rejection = plugins::vet(&packed_raw(&hostile, "redis"), &sandbox(), &gate, &registry).unwrap_err();
    assert_eq!(rejection.reason, "policy_denied", "{rejection}");
    assert!(rejection.message.contains(&plugins::digest_of(&hostile)), "{}", rejection.message);
    let stages: Vec<Value> = plugins_records(&log).iter().map(|r| r["input"]["stage"].clone()).collect();
    assert_eq!(stages, ["before-compile"]);
    let (gate, _) = gate_audited("precompile-hostile-open", &shipped());
    let rejection = plugins::vet(&packed_raw(&hostile, "redis"), &sandbox(), &gate, &registry).unwrap_err();
    assert_ne!(rejection.reason, "policy_denied", "{rejection}");

    // A build the policy allows is decided twice: before compiling and after info().
    let (gate, log) = gate_audited("twice", &shipped());
    plugins::vet(&packed(&variant(&[]), "redis"), &sandbox(), &gate, &registry).unwrap();
    let stages: Vec<Value> = plugins_records(&log).iter().map(|r| r["input"]["stage"].clone()).collect();
    assert_eq!(stages, ["before-compile", "loaded"]);
}

/// The shipped bundle with the `stateward run` flags' data document (the floor).
fn floor_with(require_pins: bool, pins: &[String]) -> Bundle {
    let profile = stateward::policy::floor::profile(require_pins, pins).unwrap();
    Bundle::from_files(shipped().files().iter().cloned().chain(profile)).unwrap()
}

/// The hardened profile: only pinned builds load from ConfigMaps; the refusal names the
/// digest, before anything is compiled. Built-in builds are not affected.
#[test]
fn hardened_profile_loads_only_pinned_builds() {
    let registry = builtins();
    let next = variant(&[]);
    let pinned = plugins::digest_of(&next);
    let (gate, log) = gate_audited("hardened", &floor_with(true, &[format!("redis={pinned}")]));
    let plugin =
        plugins::vet(&packed(&next, "redis"), &sandbox(), &gate, &registry).expect("the pinned build");
    assert_eq!(plugin.prefixed_digest(), pinned);

    let unpinned = variant(&["looping"]);
    let digest = plugins::digest_of(&unpinned);
    let rejection = plugins::vet(&packed(&unpinned, "redis"), &sandbox(), &gate, &registry).unwrap_err();
    assert_eq!(rejection.reason, "policy_denied");
    assert!(
        rejection.message.contains(&format!("digest-pin: plugin redis digest {digest} is not pinned")),
        "{}",
        rejection.message
    );
    assert_eq!(plugins_records(&log).last().unwrap()["input"]["stage"], "before-compile");

    // Without pins the profile refuses every ConfigMap build, and admits the built-in ones.
    let (gate, _) = gate_audited("hardened-none", &floor_with(true, &[]));
    let rejection = plugins::vet(&packed(&next, "redis"), &sandbox(), &gate, &registry).unwrap_err();
    assert!(rejection.message.contains(&pinned), "{}", rejection.message);
    for builtin in registry.snapshot().plugins() {
        let load =
            stateward::policy_input::PluginLoad::of(&builtin, stateward::policy_input::PluginLoad::BUILTIN);
        let verdict = gate.plugin_load(&stateward::policy::DecisionContext::default(), &load);
        assert!(verdict.allowed(), "{}: {:?}", builtin.name(), verdict.denied);
    }
}

/// A replacement may not change what the API server and the webhook configuration know of
/// its kinds: the plural, the storage version, a served version.
#[test]
fn a_replacement_may_not_change_what_the_api_server_depends_on() {
    let registry = builtins();
    let cases = [
        ("other-plural", "plural \"redisclusters\" would become \"redises\""),
        ("other-storage", "storage version \"v1\" would become \"v1alpha1\""),
        ("drop-served", "served version(s) v1alpha1 would no longer be served"),
    ];
    for (feature, says) in cases {
        let rejection = vet(&packed(&variant(&[feature]), "redis"), &registry).expect_err(feature);
        assert_eq!(rejection.reason, "api_changed", "{feature}: {rejection}");
        assert!(rejection.message.contains("RedisCluster.stateward.dev"), "{}", rejection.message);
        assert!(rejection.message.contains(says), "{feature}: {}", rejection.message);
    }
    assert!(registry.overridden().is_empty());
}

/// With Cranelift, a new build of a running plugin compiles only what changed: the `-next`
/// Redis build, loaded after the built-in one by the same engine, finds most of its functions
/// compiled already (Cranelift's incremental cache). Timed against the same build compiled by
/// a fresh engine in this run (no precompiled cache in either, so both compile).
#[test]
fn a_new_build_compiles_only_the_functions_that_changed() {
    use stateward::runtime::{AllocatorKind, Compiler, Limits, Sandbox};
    let fresh = || {
        Sandbox::with_compiler(Limits::default(), AllocatorKind::OnDemand, Compiler::Cranelift, None)
            .expect("sandbox")
    };
    let next = variant(&[]);
    let builtin = std::fs::read(wasm("stateward-redis")).unwrap();

    let cold_engine = fresh();
    let started = std::time::Instant::now();
    let cold = Plugin::load(&cold_engine, &next).unwrap();
    let cold_took = started.elapsed();

    let engine = fresh();
    let running = Plugin::load(&engine, &builtin).unwrap();
    let started = std::time::Instant::now();
    let reloaded = Plugin::load(&engine, &next).unwrap();
    let took = started.elapsed();
    let reuse = reloaded.compile_reuse();
    let alone = cold.compile_reuse();
    eprintln!(
        "hot_reload: the -next build compiled {} functions after the built-in build ({:?}), {} by a \
         fresh engine ({alone:?}: a build repeats some of its own functions); loaded in {took:.2?}, \
         {cold_took:.2?} by the fresh engine (ratio {:.2})",
        reuse.compiled,
        running.compile_reuse(),
        alone.compiled,
        took.as_secs_f64() / cold_took.as_secs_f64()
    );
    assert_eq!(reuse.reused + reuse.compiled, alone.reused + alone.compiled, "the same functions either way");
    // A build moves its static data, so every function addressing data past the change differs.
    assert!(reuse.compiled * 2 <= alone.compiled, "at most half compiled again: {reuse:?}, alone {alone:?}");
    let held = engine.compiled_function_bytes();
    eprintln!(
        "hot_reload: the two builds' compiled functions take {:.1} MiB",
        held as f64 / (1 << 20) as f64
    );
    assert!(held > 0 && held < 64 << 20, "held within the bound: {held}");
    assert_eq!(reloaded.version(), cold.version());
}

/// Winch, the default on x86-64, compiles a new build several times faster than Cranelift
/// (what a hot reload waits for), and the code either makes answers alike: the same plans for
/// the same PostgreSQL cluster. Both timed in this run, each on a fresh engine, no cache.
#[test]
fn winch_compiles_a_build_faster_and_plans_as_cranelift_does() {
    use stateward::runtime::{AllocatorKind, Compiler, Limits, Sandbox};
    let bytes = std::fs::read(wasm("stateward-postgres")).unwrap();
    let resource = r#"{"apiVersion":"stateward.dev/v1","kind":"PostgresCluster","metadata":{"name":"pg","namespace":"default","generation":2,"uid":"00000000-0000-0000-0000-000000000001"},"spec":{"version":"16.4","replicas":3,"storage":{"size":"10Gi"}}}"#;
    let mut loaded = Vec::new();
    for compiler in [Compiler::Cranelift, Compiler::Winch] {
        let sandbox = Sandbox::with_compiler(Limits::default(), AllocatorKind::OnDemand, compiler, None)
            .expect("sandbox");
        let started = std::time::Instant::now();
        let plugin = Plugin::load(&sandbox, &bytes).unwrap();
        let took = started.elapsed();
        let plan = plugin.reconcile(resource, &[], 0, "default").unwrap();
        let started = std::time::Instant::now();
        for _ in 0..50 {
            plugin.reconcile(resource, &[], 0, "default").unwrap();
        }
        let call = started.elapsed() / 50;
        loaded.push((compiler, took, call, format!("{:?}", plan.actions)));
    }
    let [(_, cranelift, cranelift_call, cranelift_plan), (_, winch, winch_call, winch_plan)] = &loaded[..]
    else {
        unreachable!()
    };
    eprintln!(
        "hot_reload: the PostgreSQL plugin compiled by Winch in {winch:.2?}, by Cranelift in {cranelift:.2?} \
         (ratio {:.2}); a reconcile call {winch_call:.2?} against {cranelift_call:.2?} (ratio {:.2})",
        winch.as_secs_f64() / cranelift.as_secs_f64(),
        winch_call.as_secs_f64() / cranelift_call.as_secs_f64()
    );
    assert_eq!(winch_plan, cranelift_plan, "the two compilers' code planned differently");
    assert!(winch < cranelift, "Winch compiled in {winch:?}, Cranelift in {cranelift:?}");
}

/// `stateward plugin pack` ships the component gzip-compressed, its digest that of the
/// component itself; the same build shipped as it is (`plugin.wasm`) loads the same.
#[test]
fn a_compressed_build_loads_like_one_shipped_as_it_is() {
    let good = variant(&[]);
    let compressed = packed(&good, "redis");
    let data = compressed.binary_data.as_ref().unwrap();
    assert!(
        data.contains_key(plugins::WASM_GZ_KEY) && !data.contains_key(plugins::WASM_KEY),
        "{:?}",
        data.keys()
    );
    assert_eq!(
        compressed.metadata.annotations.as_ref().unwrap()[plugins::DIGEST_ANNOTATION],
        plugins::digest_of(&good),
        "the digest is of the component, not of its compressed form"
    );
    assert!(
        data[plugins::WASM_GZ_KEY].0.len() * 2 < good.len(),
        "compressed: {} of {}",
        data[plugins::WASM_GZ_KEY].0.len(),
        good.len()
    );
    let from_gz = vet(&compressed, &builtins()).expect("the compressed build loads");
    let raw = packed_raw(&good, "redis");
    let from_raw = vet(&raw, &builtins()).expect("the same build shipped as it is loads");
    assert_eq!(from_gz.digest(), from_raw.digest());
}

/// Deterministic bytes that do not compress.
fn noise(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[0]
        })
        .collect()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

/// A ConfigMap whose `binaryData` is `data`, labelled redis, its digest annotation `digest`.
fn shipping(data: &[(&str, Vec<u8>)], digest: &str) -> ConfigMap {
    let mut cm = packed(&variant(&[]), "redis");
    cm.binary_data = Some(data.iter().map(|(k, v)| (k.to_string(), ByteString(v.clone()))).collect());
    cm.metadata.annotations.as_mut().unwrap().insert(plugins::DIGEST_ANNOTATION.into(), digest.into());
    cm
}

/// What a compressed ConfigMap may make the operator inflate is bounded by ratio and size,
/// before the digest or anything else reads it; junk, both forms at once or neither are
/// refused, each with its reason and the field named.
#[test]
fn a_compression_bomb_junk_or_an_ambiguous_build_is_refused_before_it_is_read() {
    let registry = builtins();
    let good = variant(&[]);
    let digest = plugins::digest_of(&good);
    // 8 MiB of zeros compress to about 8 KiB: refused at 20 times that, never inflated whole.
    let bomb = gzip(&vec![0u8; 8 * 1024 * 1024]);
    // Noise with zeros after it: under the ratio, over the absolute bound.
    let mut big = noise(900 * 1024);
    big.extend(std::iter::repeat_n(0u8, 17 * 1024 * 1024));
    let big = gzip(&big);
    let cases: [(&str, ConfigMap, &str); 5] = [
        ("too_large", shipping(&[(plugins::WASM_GZ_KEY, bomb)], &digest), "20 times its"),
        ("too_large", shipping(&[(plugins::WASM_GZ_KEY, big)], &digest), "16777216 bytes"),
        ("bad_compression", shipping(&[(plugins::WASM_GZ_KEY, good.clone())], &digest), "plugin.wasm.gz"),
        (
            "ambiguous_data",
            shipping(&[(plugins::WASM_KEY, good.clone()), (plugins::WASM_GZ_KEY, gzip(&good))], &digest),
            "both",
        ),
        ("missing_data", shipping(&[], &digest), "plugin.wasm.gz"),
    ];
    for (reason, cm, says) in cases {
        let rejection = vet(&cm, &registry).expect_err(reason);
        assert_eq!(rejection.reason, reason, "{rejection}");
        assert!(rejection.message.contains(says), "{reason}: {}", rejection.message);
    }
    // A compressed build whose component is not the one the digest names.
    let other = shipping(&[(plugins::WASM_GZ_KEY, gzip(&good))], &format!("sha256:{}", "ab".repeat(32)));
    assert_eq!(vet(&other, &registry).expect_err("digest").reason, "digest_mismatch");
    assert!(registry.overridden().is_empty());
}

/// Room to grow: each shipped plugin, packed, uses at most half of what a ConfigMap holds
/// (the Redis component alone was 95 % of it shipped as it is).
#[test]
fn each_shipped_plugin_packed_uses_at_most_half_a_configmap() {
    for name in ["postgres", "redis", "elasticsearch"] {
        let component = std::fs::read(wasm(&format!("stateward-{name}"))).unwrap();
        let cm = packed(&component, name);
        let stored = serde_json::to_vec(&cm).unwrap().len();
        let share = stored as f64 * 100.0 / plugins::MAX_CONFIGMAP_BYTES as f64;
        let raw = component.len().div_ceil(3) * 4 * 100 / plugins::MAX_CONFIGMAP_BYTES;
        eprintln!(
            "{name}: {} bytes, {stored} bytes as a ConfigMap: {share:.1} % of the bound (as it is: {raw} %)",
            component.len()
        );
        stateward_testkit::report::figure(
            &format!("plugin.configmap_share.{name}"),
            share,
            "%",
            stateward_testkit::report::Target::AtMost(50.0),
        );
        assert!(share <= 50.0, "{name}: {share:.1} % of a ConfigMap");
    }
}
