#![allow(clippy::unwrap_used, clippy::panic)]

use serde_json::{json, Value};
use stateward_sdk::testkit as tk;
use stateward_sdk::Service;

use super::Redis;

fn spec() -> Value {
    json!({ "version": "7.4", "replicas": 3, "storage": { "size": "1Gi" } })
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
    for line in ["bind * -::*", "port 6379", "dir /data", "maxmemory 256mb", "maxmemory-policy allkeys-lru", "appendonly yes"] {
        assert!(conf.lines().any(|l| l == line), "missing {line:?} in\n{conf}");
    }
    assert!(!conf.contains("requirepass"), "the password never lands in a ConfigMap");
    let mut old = tk::cr("RedisCluster", "cache", spec());
    old["spec"]["version"] = json!("6.2");
    let conf = tk::find(&plan(&old), "ConfigMap")["data"]["redis.conf"].as_str().unwrap().to_string();
    assert!(conf.lines().any(|l| l == "bind 0.0.0.0"));
}

#[test]
fn members_replicate_from_pod_zero_and_probes_ping() {
    let p = plan(&tk::cr("RedisCluster", "cache", spec()));
    let sts = tk::find(&p, "StatefulSet");
    let c = &sts["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "redis:7.4");
    let script = c["command"][2].as_str().unwrap();
    assert!(script.contains("--replicaof \"$PRIMARY_HOST\" 6379"));
    assert!(script.contains("--requirepass \"$REDIS_PASSWORD\""));
    let primary = c["env"].as_array().unwrap().iter().find(|e| e["name"] == "PRIMARY_HOST").unwrap();
    assert_eq!(primary["value"], "cache-0.cache-headless");
    assert!(c["readinessProbe"]["exec"]["command"][2].as_str().unwrap().contains("redis-cli -h 127.0.0.1 -p 6379 ping"));
    let services = tk::find_all(&p, "Service");
    let names: Vec<&str> = services.iter().map(|s| s["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["cache-headless", "cache"]);
    assert_eq!(services[1]["spec"]["selector"]["statefulset.kubernetes.io/pod-name"], "cache-0");
    assert_eq!(tk::extra(&p)["mode"], "replication");
    let mut single = tk::cr("RedisCluster", "cache", spec());
    single["spec"]["replicas"] = json!(1);
    assert_eq!(tk::extra(&plan(&single))["mode"], "standalone");
}

#[test]
fn managed_directives_cannot_be_overridden() {
    let mut cr = tk::cr("RedisCluster", "cache", spec());
    cr["spec"]["parameters"] = json!({ "requirepass": "x", "rename-command": "FLUSHALL", "appendonly": "maybe" });
    let errs = Redis::validate(&cr.to_string(), None);
    let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["spec.parameters.appendonly", "spec.parameters.rename-command", "spec.parameters.requirepass"]);
}
