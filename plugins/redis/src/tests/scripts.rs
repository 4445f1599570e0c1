//! The generated entry script, Services and pod of each mode.

use super::*;

fn script(p: &stateward_sdk::Plan) -> String {
    tk::find(p, "ConfigMap")["data"]["entrypoint.sh"].as_str().unwrap().to_string()
}

#[test]
fn replication_starts_a_sentinel_beside_each_server() {
    let p = plan(&tk::cr("RedisCluster", "cache", spec()));
    let sts = tk::find(&p, "StatefulSet");
    let pod = &sts["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(c["image"], "redis:7.0");
    // The image's entrypoint is bypassed: the same start on upstream and Debian-package images.
    assert_eq!(c["command"], json!(["sh", "/etc/stateward/entrypoint.sh"]));
    let env = c["env"].as_array().unwrap();
    let headless = env.iter().find(|e| e["name"] == "STATEWARD_HEADLESS").unwrap();
    assert_eq!(headless["value"], "cache-headless");
    let s = script(&p);
    for line in [
        "peers=$STATEWARD_PEERS",
        "  master=${peers%% *}",
        "if [ \"$master\" != \"$self\" ]; then set -- --replicaof \"$master\" 6379 \"$@\"; fi",
        "printf 'replica-announce-ip \"%s\"\\n' \"$self\" >>\"$auth\"",
        "  printf '%s\\n' 'port 26379'",
        "  printf '%s\\n' 'sentinel resolve-hostnames yes'",
        "  printf '%s\\n' 'sentinel announce-hostnames yes'",
        "  printf 'sentinel monitor primary %s 6379 %s\\n' \"$master\" \"$STATEWARD_QUORUM\"",
        "  printf '%s\\n' 'sentinel down-after-milliseconds primary 5000'",
        "  printf 'sentinel auth-pass primary \"%s\"\\n' \"$quoted\"",
        "  printf 'requirepass \"%s\"\\n' \"$quoted\"",
        "    redis-server \"$conf\" --sentinel &",
        "exec redis-server \"$here/redis.conf\" --include \"$auth\" \"$@\"",
    ] {
        assert!(s.lines().any(|l| l == line), "missing {line:?} in\n{s}");
    }
    // The monitor line comes before the settings that name the master, as Sentinel requires.
    let at = |needle: &str| s.find(needle).unwrap_or_else(|| panic!("{needle} missing"));
    assert!(at("sentinel monitor") < at("sentinel down-after-milliseconds"));
    assert!(at("resolve-hostnames") < at("sentinel monitor"));
    // A master starting again has a Sentinel promote a replica first, and waits for it, bounded.
    assert!(s.contains("answer=$(sentinel \"$asked\" failover primary) || answer="), "{s}");
    assert!(s.contains("end=$(( $(date +%s) + 30 ))"), "{s}");
    // Only a name of the cluster's own pods is taken from a Sentinel's answer.
    assert!(s.contains("case \" $peers \" in"));
    // No password on a command line or in the ConfigMap.
    assert!(!s.contains("--requirepass") && !s.contains("--masterauth") && !s.contains("-a "));
    let conf = tk::find(&p, "ConfigMap")["data"]["redis.conf"].as_str().unwrap().to_string();
    assert!(!conf.contains("requirepass") && !conf.contains("auth-pass"));

    let services = tk::find_all(&p, "Service");
    let names: Vec<&str> = services.iter().map(|s| s["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["cache-headless", "cache", "cache-master", "cache-replicas"]);
    assert_eq!(services[1]["spec"]["selector"]["stateward.dev/role"], "master");
    assert_eq!(services[2]["spec"]["selector"]["stateward.dev/role"], "master");
    assert_eq!(services[3]["spec"]["selector"]["stateward.dev/role"], "replica");
    assert_eq!(tk::extra(&p)["mode"], "replication");
}

fn topology(p: &stateward_sdk::Plan) -> Value {
    tk::find_all(p, "ConfigMap")
        .into_iter()
        .find(|c| c["metadata"]["name"] == "cache-topology")
        .unwrap_or_else(|| panic!("no topology ConfigMap"))["data"]
        .clone()
}

#[test]
fn quorum_and_down_after_come_from_the_spec() {
    let mut cr = tk::cr("RedisCluster", "cache", spec());
    let t = topology(&plan(&cr));
    assert_eq!(t["peers"], "cache-0.cache-headless cache-1.cache-headless cache-2.cache-headless");
    assert_eq!(t["quorum"], "2", "default: a majority of 3");
    cr["spec"]["replicas"] = json!(5);
    assert_eq!(topology(&plan(&cr))["quorum"], "3", "default: a majority of 5");
    cr["spec"]["sentinel"] = json!({ "quorum": 2, "downAfterMilliseconds": 3000 });
    let p = plan(&cr);
    assert_eq!(topology(&p)["quorum"], "2");
    assert!(script(&p).contains("'sentinel down-after-milliseconds primary 3000'"));
    let env = tk::find(&p, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]["env"].clone();
    let quorum = env.as_array().unwrap().iter().find(|e| e["name"] == "STATEWARD_QUORUM").unwrap().clone();
    assert_eq!(quorum["valueFrom"]["configMapKeyRef"]["name"], "cache-topology");
}

#[test]
fn standalone_runs_the_server_alone_with_aof() {
    let mut cr = tk::cr("RedisCluster", "cache", spec());
    cr["spec"]["replicas"] = json!(1);
    let p = plan(&cr);
    let s = script(&p);
    assert!(s.contains("exec redis-server \"$here/redis.conf\" --include \"$auth\" \"$@\""), "{s}");
    assert!(!s.contains("--sentinel") && !s.contains("replicaof"), "{s}");
    assert_eq!(tk::extra(&p)["mode"], "standalone");
    let conf = tk::find(&p, "ConfigMap")["data"]["redis.conf"].as_str().unwrap().to_string();
    assert!(conf.lines().any(|l| l == "appendonly yes") && conf.lines().any(|l| l == "appendfsync everysec"));
}

#[test]
fn persistence_from_the_spec() {
    let mut cr = tk::cr("RedisCluster", "cache", spec());
    cr["spec"]["persistence"] = json!({ "aof": "off", "rdb": " 3600 1   300 100 " });
    let conf = tk::find(&plan(&cr), "ConfigMap")["data"]["redis.conf"].as_str().unwrap().to_string();
    assert!(conf.lines().any(|l| l == "appendonly no"), "{conf}");
    assert!(!conf.contains("appendfsync"), "{conf}");
    assert!(conf.lines().any(|l| l == "save \"3600 1 300 100\""), "{conf}");
    cr["spec"]["persistence"] = json!({ "aof": "always" });
    let conf = tk::find(&plan(&cr), "ConfigMap")["data"]["redis.conf"].as_str().unwrap().to_string();
    assert!(conf.lines().any(|l| l == "appendfsync always"), "{conf}");
}
