//! Bad input refused by `validate`, with the field path and the reason.

use super::*;

fn errors(spec: Value) -> Vec<(String, String)> {
    let cr = tk::cr("RedisCluster", "cache", spec);
    Redis::validate(&cr.to_string(), None).into_iter().map(|e| (e.path, e.message)).collect()
}

fn with(more: Value) -> Value {
    let mut s = spec();
    s.as_object_mut().unwrap().extend(more.as_object().unwrap().clone());
    s
}

fn assert_refused(spec: Value, path: &str, reason: &str) {
    let errs = errors(spec);
    assert!(
        errs.iter().any(|(p, m)| p == path && m.contains(reason)),
        "{path} / {reason:?} not in {errs:#?}"
    );
}

#[test]
fn the_sample_spec_is_valid() {
    assert_eq!(errors(spec()), []);
    assert_eq!(errors(with(json!({ "mode": "replication", "sentinel": { "quorum": 3 } }))), []);
    assert_eq!(
        errors(with(json!({ "replicas": 1, "persistence": { "aof": "always", "rdb": "60 1000" } }))),
        []
    );
}

#[test]
fn modes() {
    assert_refused(with(json!({ "mode": "cluster" })), "spec.cluster.shards", "is required in cluster mode");
    assert_refused(
        with(json!({ "mode": "sharded" })),
        "spec.mode",
        "is not one of standalone, replication, cluster",
    );
    assert_refused(with(json!({ "mode": "standalone" })), "spec.mode", "standalone is one server");
    assert_refused(with(json!({ "mode": "replication", "replicas": 2 })), "spec.mode", "at least 3");
    assert_refused(with(json!({ "mode": 3 })), "spec.mode", "is not a string");
}

#[test]
fn quorum_impossible_for_the_sentinels() {
    assert_refused(
        with(json!({ "sentinel": { "quorum": 4 } })),
        "spec.sentinel.quorum",
        "impossible with 3 Sentinels",
    );
    assert_refused(with(json!({ "sentinel": { "quorum": 0 } })), "spec.sentinel.quorum", "from 1 to 3");
    assert_refused(
        with(json!({ "sentinel": { "downAfterMilliseconds": 10 } })),
        "spec.sentinel.downAfterMilliseconds",
        "from 1000",
    );
    assert_refused(
        with(json!({ "replicas": 1, "sentinel": { "quorum": 1 } })),
        "spec.sentinel",
        "replication mode only",
    );
}

#[test]
fn settings_the_operator_owns() {
    assert_refused(
        with(json!({ "sentinel": { "parallel-syncs": 2 } })),
        "spec.sentinel.parallel-syncs",
        "owns",
    );
    for key in [
        "replicaof",
        "masterauth",
        "replica-announce-ip",
        "cluster-enabled",
        "sentinel",
        "appendonly",
        "save",
    ] {
        let errs = errors(with(json!({ "parameters": { key: "x" } })));
        assert!(errs.iter().any(|(p, _)| *p == format!("spec.parameters.{key}")), "{key}: {errs:#?}");
    }
}

#[test]
fn persistence() {
    assert_refused(
        with(json!({ "persistence": { "aof": "sometimes" } })),
        "spec.persistence.aof",
        "is not one of",
    );
    assert_refused(with(json!({ "persistence": { "rdb": "3600" } })), "spec.persistence.rdb", "pairs");
    assert_refused(with(json!({ "persistence": { "rdb": "60 x" } })), "spec.persistence.rdb", "pairs");
}

#[test]
fn the_mode_is_fixed_at_creation() {
    let old = tk::cr("RedisCluster", "cache", spec());
    let mut new = old.clone();
    new["spec"]["mode"] = json!("standalone");
    new["spec"]["replicas"] = json!(1);
    let errs = Redis::validate(&new.to_string(), Some(&old.to_string()));
    assert!(
        errs.iter().any(|e| e.path == "spec.mode" && e.message.contains("fixed at creation")),
        "{errs:#?}"
    );
}
