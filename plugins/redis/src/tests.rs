#![allow(clippy::unwrap_used, clippy::panic)]

use serde_json::{json, Value};
use stateward_sdk::testkit as tk;
use stateward_sdk::ConditionStatus;
use stateward_sdk::Service;

use super::Redis;

mod acl;
mod cluster;
mod redundancy;
mod roles;
mod roll;
mod scripts;
mod switchover;
mod validation;

fn spec() -> Value {
    json!({ "version": "7.0", "replicas": 3, "storage": { "size": "1Gi" } })
}

stateward_sdk::plugin_suite!(Redis, "RedisCluster", spec());

fn plan(cr: &Value) -> stateward_sdk::Plan {
    Redis::reconcile(tk::observed(cr, &[])).unwrap()
}

#[test]
fn redis_conf_has_managed_directives_defaults_and_parameters() {
    let mut cr = tk::cr("RedisCluster", "cache", spec());
    cr["spec"]["parameters"] = json!({ "maxmemory": "256mb", "maxmemory-policy": "allkeys-lru" });
    let conf = tk::find(&plan(&cr), "ConfigMap")["data"]["redis.conf"].as_str().unwrap().to_string();
    for line in [
        "bind * -::*",
        "port 6379",
        "dir /data",
        "maxmemory 256mb",
        "maxmemory-policy allkeys-lru",
        "appendonly yes",
        "appendfsync everysec",
        "save \"\"",
        "enable-debug-command local",
    ] {
        assert!(conf.lines().any(|l| l == line), "missing {line:?} in\n{conf}");
    }
    assert!(!conf.contains("requirepass"), "the password never lands in a ConfigMap");
    let mut old = tk::cr("RedisCluster", "cache", spec());
    old["spec"]["version"] = json!("6.2");
    let conf = tk::find(&plan(&old), "ConfigMap")["data"]["redis.conf"].as_str().unwrap().to_string();
    assert!(conf.lines().any(|l| l == "bind 0.0.0.0"));
    assert!(!conf.contains("enable-debug-command"), "Redis 6 does not know it");
}

#[test]
fn managed_directives_cannot_be_overridden() {
    let mut cr = tk::cr("RedisCluster", "cache", spec());
    cr["spec"]["parameters"] =
        json!({ "requirepass": "x", "rename-command": "FLUSHALL", "appendonly": "maybe" });
    let errs = Redis::validate(&cr.to_string(), None);
    let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        ["spec.parameters.appendonly", "spec.parameters.rename-command", "spec.parameters.requirepass"]
    );
}

#[test]
fn the_schemas_kept_as_data_parse() {
    let status = crate::live::schema();
    for key in ["master", "instances", "sentinels", "switchover", "cluster", "health"] {
        assert!(status.contains_key(key), "status schema has {key}: {:?}", status.keys());
    }
    assert_eq!(crate::acl::schema()["users"]["type"], "array");
}

#[test]
fn the_spec_schema_states_the_limits_the_checks_apply() {
    use crate::spec::*;
    let s = Value::Object(schema());
    let text = |p: &str| s.pointer(p).and_then(Value::as_str).unwrap_or_default().to_string();
    let down = text("/sentinel/properties/downAfterMilliseconds/description");
    for n in [MIN_DOWN_AFTER_MS, MAX_DOWN_AFTER_MS, DEFAULT_DOWN_AFTER_MS] {
        assert!(down.contains(&n.to_string()), "{down}");
    }
    let shards = text("/cluster/properties/shards/description");
    assert!(shards.contains(&format!("{MIN_SHARDS} to {MAX_SHARDS}")), "{shards}");
    let per = text("/cluster/properties/replicasPerShard/description");
    assert!(
        per.contains(&format!("0 to {MAX_REPLICAS_PER_SHARD}; default {DEFAULT_REPLICAS_PER_SHARD}")),
        "{per}"
    );
    assert!(text("/mode/description").contains("cluster"));
}
