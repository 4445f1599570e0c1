//! Redis on real pods (issue [redis]): replication with a Sentinel in every pod that fails over
//! a deleted or a hung master, switches over, rolls and scales in around its master; a
//! standalone server whose append-only file keeps its keys across a pod deletion; and cluster
//! mode (`cluster`). Each test makes its own `RedisCluster` with the local image, a
//! client pod of the same image that reaches it through its Services (`redis-cli`, the password
//! from the credentials Secret in `REDISCLI_AUTH`), and prints what it measured
//! (`-- --nocapture`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stateward_testkit::TestEnv;

use super::e2e::{self, get_cr, summary, wait_for, REDIS};
use super::postgres::{endpoints, enter_with_operator};
use super::{kubectl_ok, pod_ready, sample, REDIS_IMAGE};
use crate::now_ms;

mod cluster;
mod migration;

/// Keys each test writes and reads back.
const KEYS: usize = 1000;

/// A client pod of the Redis image: `redis-cli` authenticates from `REDISCLI_AUTH` (the
/// `default` user's password); each of `users` has its password in `<USER>_PASSWORD`.
fn client_pod(cluster: &str, users: &[&str]) -> Value {
    let mut env = vec![
        json!({ "name": "REDISCLI_AUTH", "valueFrom": { "secretKeyRef": { "name": format!("{cluster}-credentials"), "key": "password" } } }),
    ];
    for u in users {
        env.push(json!({
            "name": format!("{}_PASSWORD", u.to_uppercase()),
            "valueFrom": { "secretKeyRef": { "name": format!("{cluster}-user-{u}"), "key": "password" } },
        }));
    }
    stateward_testkit::real::client_pod("client", REDIS_IMAGE, 999, Value::Array(env))
}

/// A shell script run by the client pod; its stdout.
fn client_sh(env: &TestEnv, script: &str) -> String {
    kubectl_ok(env, &["exec", "client", "--", "sh", "-c", script])
}

/// One instance of status: (pod, role label, link status).
fn instances(cr: &Value) -> Vec<(String, String, String)> {
    cr.pointer("/status/instances")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|i| {
            let s = |k: &str| i[k].as_str().unwrap_or_default().to_string();
            (s("pod"), s("role"), s("linkStatus"))
        })
        .collect()
}

fn master_of(cr: &Value) -> String {
    cr.pointer("/status/master").and_then(Value::as_str).unwrap_or_default().to_string()
}

/// Waits until `n` pods answer: one master (status and `-master`), the others replicas whose
/// link is up (status and `-replicas`), and, with `sentinels`, every Sentinel naming that master
/// and knowing the `n - 1` others. Returns the master and the replicas.
async fn wait_replicated(env: &TestEnv, name: &str, n: usize, timeout: Duration) -> (String, Vec<String>) {
    let api = REDIS.api(env);
    let (found, _) = wait_for(&format!("{name}: a master and {} linked replicas", n - 1), timeout, || {
        let api = api.clone();
        async move {
            let cr = get_cr(&api, name).await.ok_or("CR not found")?;
            let master = master_of(&cr);
            let inst = instances(&cr);
            let replicas: Vec<String> =
                inst.iter().filter(|(_, r, l)| r == "replica" && l == "up").map(|i| i.0.clone()).collect();
            let masters: Vec<&String> = inst.iter().filter(|(_, r, _)| r == "master").map(|i| &i.0).collect();
            let sentinels_agree = n == 1
                || cr.pointer("/status/sentinels").and_then(Value::as_array).is_some_and(|s| {
                    s.len() == n
                        && s.iter().all(|s| {
                            s["master"].as_str().is_some_and(|m| m.split('.').next() == Some(master.as_str()))
                                && s["otherSentinels"].as_u64() == Some(n as u64 - 1)
                        })
                });
            let m = endpoints(env, &format!("{name}-master")).await;
            let r = endpoints(env, &format!("{name}-replicas")).await;
            let ok = !master.is_empty()
                && masters == [&master]
                && replicas.len() == n - 1
                && sentinels_agree
                && m == BTreeSet::from([master.clone()])
                && r == replicas.iter().cloned().collect();
            if ok {
                Ok((master, replicas))
            } else {
                Err(format!(
                    "master {master:?} -master {m:?} -replicas {r:?} instances {inst:?} sentinels {}; {}",
                    cr.pointer("/status/sentinels").unwrap_or(&Value::Null),
                    summary(&cr)
                ))
            }
        }
    })
    .await;
    found
}

/// Makes the cluster `name` of `replicas` pods and the client pod, and waits until it is
/// replicated and no longer rolling (the certificate the host issues after the first pods
/// started rolls them once).
async fn make_cluster(env: &TestEnv, name: &str, replicas: u32) -> (String, Vec<String>, Duration) {
    make_cluster_with(env, name, replicas, json!({})).await
}

/// Applies the resource (`more` merged into its spec) and the client pod, which holds the
/// passwords of the users `more` names.
fn create_with_client(env: &TestEnv, name: &str, replicas: u32, more: &Value) {
    let mut cr = sample("RedisCluster", name, REDIS_IMAGE, replicas);
    for (k, v) in more.as_object().into_iter().flatten() {
        cr["spec"][k] = v.clone();
    }
    let users: Vec<&str> =
        more["users"].as_array().into_iter().flatten().filter_map(|u| u["name"].as_str()).collect();
    e2e::apply(env, &env.namespace, &cr);
    super::apply_json(env, &[client_pod(name, &users)]);
}

/// [`make_cluster`] with `more` merged into the spec (e.g. `users`).
async fn make_cluster_with(
    env: &TestEnv,
    name: &str,
    replicas: u32,
    more: Value,
) -> (String, Vec<String>, Duration) {
    let started = Instant::now();
    create_with_client(env, name, replicas, &more);
    wait_replicated(env, name, replicas as usize, Duration::from_secs(300)).await;
    let api = REDIS.api(env);
    wait_for(&format!("{name} rolled and converged"), Duration::from_secs(300), || {
        let api = api.clone();
        async move {
            let cr = get_cr(&api, name).await.ok_or("CR not found")?;
            // The roll the certificate brings has happened: the pod template carries it and
            // every pod is of the StatefulSet's update revision (the plugin rolls: OnDelete,
            // whose currentRevision never moves).
            let out = super::kubectl_in(env, &["get", "statefulset", name, "-o", "json"]);
            let sts: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
            let certified = sts
                .pointer("/spec/template/metadata/annotations/stateward.dev~1certificates-sha256")
                .is_some();
            let st = &sts["status"];
            let rolled = st["updateRevision"].is_string()
                && st["observedGeneration"] == sts["metadata"]["generation"]
                && st["updatedReplicas"] == json!(replicas)
                && st["readyReplicas"] == json!(replicas);
            if certified
                && rolled
                && e2e::condition(&cr, "Progressing") == Some("False")
                && e2e::phase(&cr) == "Running"
            {
                Ok(())
            } else {
                Err(format!("certified {certified} sts status {st}; {}", summary(&cr)))
            }
        }
    })
    .await;
    let (master, others) = wait_replicated(env, name, replicas as usize, Duration::from_secs(300)).await;
    pod_ready(env, "client", Duration::from_secs(60)).await;
    (master, others, started.elapsed())
}

/// Waits until `service` answers `PING` from the client pod. Its EndpointSlice naming a pod
/// is not enough: kube-proxy programs the node's rules after it, seconds later on a loaded
/// machine, and until then a connection is refused (seen as 4 of 1000 SETs unanswered right
/// after formation, and 0 of 1000 keys read right after a pod came back, while the server
/// held all of them).
fn wait_service_answers(env: &TestEnv, service: &str) {
    let out = client_sh(
        env,
        &format!(
            "end=$(( $(date +%s) + 60 )); while [ $(date +%s) -lt $end ]; do \
               [ \"$(timeout 2 redis-cli -h {service} PING 2>/dev/null)\" = PONG ] && echo PONG && exit 0; sleep 0.2; done; \
             timeout 2 redis-cli -h {service} PING 2>&1"
        ),
    );
    assert_eq!(out.trim(), "PONG", "{service} does not answer from the client pod within 60 s");
}

/// Writes `key:1..=KEYS` (values `val:<n>`) through `service` in one pipeline; with `replicas`,
/// waits until that many replicas acknowledged them (`WAIT`).
fn write_keys(env: &TestEnv, service: &str, replicas: usize) {
    wait_service_answers(env, service);
    // What is not OK is printed: an error from the server, or redis-cli's own (a connection).
    let out = client_sh(
        env,
        &format!(
            "seq 1 {KEYS} | sed 's/.*/SET key:& val:&/' | redis-cli -h {service} >/tmp/set.out 2>&1; \
             grep -c '^OK$' /tmp/set.out; grep -v '^OK$' /tmp/set.out | sort | uniq -c | head -n 5"
        ),
    );
    let (count, others) = out.trim().split_once('\n').unwrap_or((out.trim(), ""));
    assert_eq!(count, KEYS.to_string(), "SETs acknowledged through {service}; other answers:\n{others}");
    if replicas > 0 {
        let acked = client_sh(env, &format!("redis-cli -h {service} WAIT {replicas} 10000"));
        assert_eq!(acked.trim(), replicas.to_string(), "replicas that acknowledged the writes");
    }
}

/// How many of `key:1..=KEYS` read back through `service` with their value.
fn keys_readable(env: &TestEnv, service: &str) -> usize {
    wait_service_answers(env, service);
    let out = client_sh(
        env,
        &format!(
            "seq 1 {KEYS} | sed 's/.*/GET key:&/' | redis-cli -h {service} > /tmp/got 2>&1; \
             seq 1 {KEYS} | sed 's/.*/val:&/' > /tmp/want; paste -d ' ' /tmp/want /tmp/got | awk '$1 == $2' | wc -l; \
             paste -d ' ' /tmp/want /tmp/got | awk '$1 != $2' | head -n 3"
        ),
    );
    let (count, others) = out.trim().split_once('\n').unwrap_or((out.trim(), ""));
    if !others.is_empty() {
        eprintln!("realpods-redis: keys read through {service} that did not match (wanted, got):\n{others}");
    }
    count.parse().unwrap_or_else(|_| panic!("a count of keys: {out:?}"))
}

/// In the client pod: tries `SET probe` through `service` every 100 ms (each try bounded to
/// 1 s) until one is acknowledged, for at most `limit_s`; the acknowledgement's time (ms since
/// the epoch) and the pod that answered (its announced name), or None.
fn first_write(env: &TestEnv, service: &str, limit_s: u64) -> Option<(u64, String)> {
    let out = client_sh(
        env,
        &format!(
            "end=$(( $(date +%s) + {limit_s} )); while [ $(date +%s) -lt $end ]; do \
               if [ \"$(timeout 1 redis-cli -h {service} SET probe x 2>/dev/null)\" = OK ]; then \
                 at=$(date +%s%3N); who=$(timeout 2 redis-cli -h {service} --raw CONFIG GET replica-announce-ip | tail -n 1); \
                 echo \"$at $who\"; exit 0; fi; sleep 0.1; done; echo none"
        ),
    );
    let (at, who) = out.trim().split_once(' ')?;
    Some((at.parse().ok()?, who.split('.').next().unwrap_or_default().to_string()))
}

/// Waits until `old` is back as a replica linked to `new` (status and `-replicas`), and
/// `-master` selects `new` only; the time since `since`.
async fn wait_rejoined(
    env: &TestEnv,
    name: &str,
    old: &str,
    new: &str,
    since: Instant,
    timeout: Duration,
) -> Duration {
    let api = REDIS.api(env);
    wait_for(&format!("{old} back as a replica of {new}"), timeout, || {
        let api = api.clone();
        async move {
            let cr = get_cr(&api, name).await.ok_or("CR not found")?;
            let inst = instances(&cr);
            let back = inst.iter().any(|(p, r, l)| p == old && r == "replica" && l == "up");
            let m = endpoints(env, &format!("{name}-master")).await;
            let r = endpoints(env, &format!("{name}-replicas")).await;
            if back && master_of(&cr) == new && m == BTreeSet::from([new.to_string()]) && r.contains(old) {
                Ok(())
            } else {
                Err(format!("-master {m:?} -replicas {r:?} instances {inst:?}; {}", summary(&cr)))
            }
        }
    })
    .await;
    since.elapsed()
}

/// Must show 1, the failover a Sentinel performs, after `fault` has been done to the master
/// `old` of the cluster `cache` (made already); `target` is the write gap's target (a figure in
/// the run's report; 3 times it is the liveness ceiling). Prints every figure; returns the old
/// master and the new one.
async fn fail_over_from(
    env: &TestEnv,
    old: &str,
    replicas: &[String],
    what: &str,
    target: Duration,
    fault: impl FnOnce(&TestEnv, &str),
) -> (String, String) {
    let old = old.to_string();
    write_keys(env, "cache-master", 2);
    assert_eq!(keys_readable(env, "cache-master"), KEYS);
    eprintln!("realpods-redis: {KEYS} keys written through cache-master, acknowledged by 2 replicas (WAIT)");

    let fault_ms = now_ms();
    let fault_at = Instant::now();
    fault(env, &old);
    let (acked_ms, new) = first_write(env, "cache-master", 90)
        .unwrap_or_else(|| panic!("no write through cache-master acknowledged within 90 s of the {what}"));
    let gap = Duration::from_millis(acked_ms.saturating_sub(fault_ms));
    eprintln!("realpods-redis: {what}: {new} acknowledged a write through cache-master {gap:.1?} after it");
    assert_ne!(new, old, "the write went to a new master");
    assert!(replicas.contains(&new), "{new} was a replica");
    stateward_testkit::report::millis_within_liveness(
        &format!("redis.failover.write_gap ({what})"),
        gap.as_millis() as u64,
        target.as_millis() as u64,
    );

    let readable = keys_readable(env, "cache-master");
    eprintln!("realpods-redis: {what}: {readable}/{KEYS} keys readable through cache-master on {new}");
    assert_eq!(readable, KEYS);
    let rejoined = wait_rejoined(env, "cache", &old, &new, fault_at, Duration::from_secs(240)).await;
    let master_eps = endpoints(env, "cache-master").await;
    eprintln!(
        "realpods-redis: {what}: cache-master endpoints {master_eps:?}; {old} rejoined as a replica of {new} {rejoined:.1?} after it"
    );
    assert_eq!(master_eps, BTreeSet::from([new.clone()]));
    let api = REDIS.api(env);
    let cr = get_cr(&api, "cache").await.unwrap_or_else(|| panic!("CR gone"));
    eprintln!("realpods-redis: {what}: status master {} instances {:?}", master_of(&cr), instances(&cr));
    let events = super::postgres::cr_events(env, "cache").await;
    eprintln!("realpods-redis: events: {events:#?}");
    assert!(events
        .iter()
        .any(|e| e.contains(&format!("MasterChanged: {new} is the master now, in place of {old}"))));
    (old, new)
}

/// Must show 5: a standalone server with the default persistence (AOF, fsync every second)
/// keeps 1000 keys across the deletion of its pod.
#[tokio::test]
async fn standalone_aof_keeps_keys_across_a_pod_deletion() {
    let Some((env, op)) = enter_with_operator("rp-raof", "realpods-raof").await else {
        return;
    };
    let (master, _, took) = make_cluster(&env, "solo", 1).await;
    assert_eq!(master, "solo-0");
    let api = REDIS.api(&env);
    let cr = get_cr(&api, "solo").await.unwrap_or_else(|| panic!("CR gone"));
    assert_eq!(cr.pointer("/status/mode"), Some(&json!("standalone")));
    eprintln!("realpods-redis: standalone solo-0 serving {took:.1?} after create");
    write_keys(&env, "solo", 0);
    let aof = kubectl_ok(
        &env,
        &[
            "exec",
            "solo-0",
            "-c",
            "redis",
            "--",
            "redis-cli",
            "-h",
            "127.0.0.1",
            "--raw",
            "CONFIG",
            "GET",
            "appendfsync",
        ],
    );
    assert!(aof.contains("everysec"), "{aof}");
    // The last write reaches the disk within a second (appendfsync everysec).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let old_uid = kubectl_ok(&env, &["get", "pod", "solo-0", "-o", "jsonpath={.metadata.uid}"]);
    let deleted = Instant::now();
    kubectl_ok(&env, &["delete", "pod", "solo-0", "--wait=false"]);
    let (_, _) = wait_for("solo-0 made again", Duration::from_secs(120), || {
        let env = &env;
        let old_uid = old_uid.clone();
        async move {
            let out = super::kubectl_in(env, &["get", "pod", "solo-0", "-o", "jsonpath={.metadata.uid}"]);
            let uid = String::from_utf8_lossy(&out.stdout).to_string();
            if out.status.success() && !uid.is_empty() && uid != old_uid {
                Ok(())
            } else {
                Err(format!("uid {uid:?}"))
            }
        }
    })
    .await;
    pod_ready(&env, "solo-0", Duration::from_secs(180)).await;
    wait_for("solo's Service on the new pod", Duration::from_secs(60), || {
        let env = &env;
        async move {
            let e = endpoints(env, "solo").await;
            if e.contains("solo-0") {
                Ok(())
            } else {
                Err(format!("{e:?}"))
            }
        }
    })
    .await;
    let back = deleted.elapsed();
    let readable = keys_readable(&env, "solo");
    eprintln!("realpods-redis: standalone: pod deleted, serving again {back:.1?} later; {readable}/{KEYS} keys read back (AOF everysec)");
    assert_eq!(readable, KEYS);
    drop(op);
}

/// The switchover annotation: `stateward.dev/switchover-to: <replica>` makes that replica the
/// master (Sentinel's `FAILOVER` after it was made the preferred replica and caught up with the
/// paused master); no key is lost, `-master` selects it only, and once `Done` the old master
/// refuses writes (it is a replica of the new one).
#[tokio::test]
async fn switchover_to_a_named_replica() {
    let Some((env, op)) = enter_with_operator("rp-rswitch", "realpods-rswitch").await else {
        return;
    };
    let (old, replicas, took) = make_cluster(&env, "cache", 3).await;
    eprintln!("realpods-redis: switchover: master {old}, replicas {replicas:?}, {took:.1?} after create");
    write_keys(&env, "cache-master", 2);
    let to = replicas.last().unwrap_or_else(|| panic!("no replica")).clone();
    let asked = Instant::now();
    let done = switch_over_to(&env, "cache", &to).await;
    let api = REDIS.api(&env);
    let cr = get_cr(&api, "cache").await.unwrap_or_else(|| panic!("CR gone"));
    eprintln!(
        "realpods-redis: switchover to {to}: Done {done:.1?} after the annotation: {}",
        cr.pointer("/status/switchover/message").and_then(Value::as_str).unwrap_or_default()
    );
    assert_eq!(master_of(&cr), to);
    // Done means the old master takes no write: asked directly, it refuses as a replica.
    let refused = client_sh(&env, &format!("redis-cli -h {old}.cache-headless SET fenced x 2>&1"));
    eprintln!(
        "realpods-redis: switchover to {to}: a write to the old master {old} right after Done: {}",
        refused.trim()
    );
    assert!(refused.contains("READONLY"), "{old} must refuse writes once the switchover is Done: {refused}");
    let (_, who) =
        first_write(&env, "cache-master", 30).unwrap_or_else(|| panic!("no write through cache-master"));
    assert_eq!(who, to, "cache-master writes on {to}");
    let readable = keys_readable(&env, "cache-master");
    let rejoined = wait_rejoined(&env, "cache", &old, &to, asked, Duration::from_secs(120)).await;
    eprintln!(
        "realpods-redis: switchover to {to}: {readable}/{KEYS} keys readable through cache-master; {old} a replica of it {rejoined:.1?} after the annotation"
    );
    assert_eq!(readable, KEYS);
    let priority = kubectl_ok(
        &env,
        &[
            "exec",
            &to,
            "-c",
            "redis",
            "--",
            "redis-cli",
            "-h",
            "127.0.0.1",
            "--raw",
            "CONFIG",
            "GET",
            "replica-priority",
        ],
    );
    assert_eq!(priority.lines().last(), Some("100"), "the priority is restored");
    let events = super::postgres::cr_events(&env, "cache").await;
    eprintln!("realpods-redis: events: {events:#?}");
    assert!(events.iter().any(|e| e.contains(&format!("SwitchoverDone: switchover to {to}"))), "{events:#?}");
    // On the same cluster (one formation less for the suite): a rolling change.
    let master = rolls_replicas_first_then_switches_over(&env, &to).await;
    scales_in_past_the_master(&env, &master).await;
    // Then nothing happens: [agent]'s steady state.
    crate::idle(&env, REDIS, "cache", &op, "redis").await;
    drop(op);
}

/// Annotates the cluster `cache` to switch over to `to` and waits until that switchover is
/// `Done` (panics if it is refused or fails); how long it took.
/// Annotates the RedisCluster `name` to switch over to `to`; how long until status says Done.
async fn switch_over_to(env: &TestEnv, name: &str, to: &str) -> Duration {
    kubectl_ok(env, &["annotate", "--overwrite", "rdc", name, &format!("stateward.dev/switchover-to={to}")]);
    let api = REDIS.api(env);
    let (_, done) = wait_for(&format!("switchover to {to} Done"), Duration::from_secs(120), || {
        let api = api.clone();
        async move {
            let cr = get_cr(&api, name).await.ok_or("CR not found")?;
            let sw = cr.pointer("/status/switchover").cloned().unwrap_or(Value::Null);
            // The one asked here (the roll at formation may have made another before).
            let ours = sw["asked"] == json!(to) && sw["to"] == json!(to);
            match sw["phase"].as_str() {
                Some("Done") if ours => Ok(()),
                Some("Refused" | "Failed") if ours => panic!("switchover {sw}"),
                _ => Err(format!("switchover {sw}; master {}", master_of(&cr))),
            }
        }
    })
    .await;
    done
}

/// The writer in the client pod: `SET w:<i> 1` through `cache-master`, one connection each
/// (bounded to 1 s, so a paused or moved master shows as a gap), every acknowledged `i` and
/// when, until /tmp/stop appears.
const WRITER: &str = r#"
: > /tmp/acks
i=0
while [ ! -e /tmp/stop ]; do
  i=$((i + 1))
  if [ "$(timeout 1 redis-cli -h cache-master SET w:$i 1 2>/dev/null)" = OK ]; then echo "$i $(date +%s%3N)" >> /tmp/acks; fi
done
echo done > /tmp/stopped
"#;

/// Must show the rolling change: a configuration change (`maxmemory-policy` to `allkeys-lfu`) replaces the
/// replicas one at a time, highest ordinal first, then switches over to an updated replica
/// and replaces the old master last; under a writer, no acknowledged write is lost and the
/// longest write gap is the switchover's pause.
async fn rolls_replicas_first_then_switches_over(env: &TestEnv, master: &str) -> String {
    use super::postgres::pods;
    let before: BTreeMap<String, String> =
        pods(env, "cache").await.into_iter().map(|p| (p.name, p.uid)).collect();
    client_sh(env, &format!("rm -f /tmp/stop /tmp/stopped; cat > /tmp/writer.sh <<'EOF'\n{WRITER}\nEOF\nnohup sh /tmp/writer.sh >/dev/null 2>&1 &"));
    let acked = || client_sh(env, "wc -l < /tmp/acks").trim().parse::<usize>().unwrap_or(0);
    while acked() < 100 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let api = REDIS.api(env);
    let generation =
        |cr: Option<Value>| cr.and_then(|c| c.pointer("/metadata/generation").and_then(Value::as_i64));
    let was = generation(get_cr(&api, "cache").await);
    let started = Instant::now();
    let policy = r#"{"spec":{"parameters":{"maxmemory-policy":"allkeys-lfu"}}}"#;
    kubectl_ok(env, &["patch", "rdc", "cache", "--type=merge", "-p", policy]);
    let now = generation(get_cr(&api, "cache").await);
    assert!(now > was, "the patch changed the spec (generation {was:?} -> {now:?})");
    // Polled until every pod is a new one, Ready: the order they went in, the most away at
    // once, and the master when each went.
    let (mut order, mut most_down) = (Vec::<(String, String)>::new(), 0);
    loop {
        assert!(started.elapsed() < Duration::from_secs(400), "the roll not done in 400 s: {order:?}");
        let now = pods(env, "cache").await;
        let cr = get_cr(&api, "cache").await.unwrap_or_else(|| panic!("CR gone"));
        let mut down = 0;
        for (name, uid) in &before {
            let p = now.iter().find(|p| p.name == *name);
            if p.is_none_or(|p| p.deleting || p.uid != *uid) && !order.iter().any(|(n, _)| n == name) {
                order.push((name.clone(), master_of(&cr)));
            }
            down += usize::from(p.is_none_or(|p| p.deleting || !p.ready));
        }
        most_down = most_down.max(down);
        if before.iter().all(|(n, u)| now.iter().any(|p| p.name == *n && p.uid != *u && p.ready)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let rolled = started.elapsed();
    let (new_master, _) = wait_replicated(env, "cache", before.len(), Duration::from_secs(180)).await;
    let at = acked();
    while acked() < at + 100 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    client_sh(env, "touch /tmp/stop; for i in $(seq 50); do [ -e /tmp/stopped ] && break; sleep 0.1; done");
    let mut acks: Vec<(u64, u64)> = client_sh(env, "cat /tmp/acks")
        .lines()
        .filter_map(|l| l.split_once(' ').and_then(|(i, t)| Some((i.parse().ok()?, t.parse().ok()?))))
        .collect();
    acks.sort_by_key(|a| a.1);
    let mut gaps: Vec<u64> = acks.windows(2).map(|w| w[1].1 - w[0].1).collect();
    gaps.sort_unstable_by(|a, b| b.cmp(a));
    let present: BTreeSet<u64> = client_sh(env, "redis-cli -h cache-master --scan --pattern 'w:*'")
        .lines()
        .filter_map(|k| k.trim().strip_prefix("w:")?.parse().ok())
        .collect();
    let lost: Vec<u64> = acks.iter().map(|a| a.0).filter(|i| !present.contains(i)).collect();
    eprintln!(
        "realpods-redis: maxmemory-policy rolled in {rolled:.1?}: pods replaced in the order (pod, master then) {order:?}; \
         master {master} then {new_master}; at most {most_down} pod(s) away at once; write gaps (longest first) {:?} ms; \
         {} writes acknowledged, {} lost",
        &gaps[..gaps.len().min(4)],
        acks.len(),
        lost.len()
    );
    for p in before.keys() {
        let policy = kubectl_ok(
            env,
            &["exec", p, "-c", "redis", "--", "redis-cli", "--raw", "CONFIG", "GET", "maxmemory-policy"],
        );
        assert_eq!(policy.lines().last(), Some("allkeys-lfu"), "{p} runs the new setting");
    }
    let pods_in_order: Vec<&str> = order.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(pods_in_order.last(), Some(&master), "the old master last: {order:?}");
    assert!(
        order[..order.len() - 1].iter().all(|(p, m)| p != m && m == master),
        "every replica replaced while {master} was the master: {order:?}"
    );
    assert_ne!(order[order.len() - 1].1, master, "the old master replaced after a switchover: {order:?}");
    assert_ne!(new_master, master);
    assert_eq!(most_down, 1, "one pod away at a time");
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    // The issue's target: write errors only during the failover, at most 5 s (2.0-3.3 s
    // measured over ten runs: the pause, Sentinel's promotion and kube-proxy moving `-master`).
    // Figures; 3 times the target is the liveness ceiling.
    stateward_testkit::report::millis_within_liveness("redis.roll.write_gap", gaps[0], 5_000);
    stateward_testkit::report::millis_within_liveness(
        "redis.roll.second_write_gap",
        gaps.get(1).copied().unwrap_or(0),
        3_000,
    );
    new_master
}

/// Scale-in past the master: 3 -> 4 pods, the master moved to `cache-3` (the annotation), then
/// back to 3: the plugin switches over to a pod that stays before the StatefulSet shrinks, no
/// key is lost, and every Sentinel forgets the removed one (each knows the 2 others that run:
/// a failover still has its majority).
async fn scales_in_past_the_master(env: &TestEnv, master: &str) {
    let started = Instant::now();
    kubectl_ok(env, &["patch", "rdc", "cache", "--type=merge", "-p", r#"{"spec":{"replicas":4}}"#]);
    wait_replicated(env, "cache", 4, Duration::from_secs(180)).await;
    let grown = started.elapsed();
    switch_over_to(env, "cache", "cache-3").await;
    write_keys(env, "cache-master", 3);
    let shrink = Instant::now();
    kubectl_ok(env, &["patch", "rdc", "cache", "--type=merge", "-p", r#"{"spec":{"replicas":3}}"#]);
    // The StatefulSet keeps 4 pods until the master has moved.
    let sts_replicas = || {
        kubectl_ok(env, &["get", "statefulset", "cache", "-o", "jsonpath={.spec.replicas}"])
            .trim()
            .to_string()
    };
    let api = REDIS.api(env);
    let mut held_while_master = true;
    loop {
        assert!(shrink.elapsed() < Duration::from_secs(120), "cache-3 still the master after 120 s");
        let cr = get_cr(&api, "cache").await.unwrap_or_else(|| panic!("CR gone"));
        let m = master_of(&cr);
        if m == "cache-3" || m.is_empty() {
            held_while_master &= sts_replicas() == "4";
        } else {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (new_master, _) = wait_replicated(env, "cache", 3, Duration::from_secs(180)).await;
    let shrunk = shrink.elapsed();
    let readable = keys_readable(env, "cache-master");
    let cr = get_cr(&api, "cache").await.unwrap_or_else(|| panic!("CR gone"));
    eprintln!(
        "realpods-redis: scale 3 -> 4 in {grown:.1?} (master {master}); 4 -> 3 with the master on cache-3: {new_master} the master, \
         3 pods with every Sentinel knowing the 2 others, {shrunk:.1?} after the patch; {readable}/{KEYS} keys; sentinels {}",
        cr.pointer("/status/sentinels").unwrap_or(&Value::Null)
    );
    assert!(held_while_master, "the StatefulSet shrank while cache-3 was the master");
    assert_ne!(new_master, "cache-3");
    assert_eq!(readable, KEYS);
}

/// How many of the three servers say their link to a master is up (for
/// [`crate::ClientSampler`]).
const LINKS_UP: &str =
    "(for i in 0 1 2; do (timeout 1 redis-cli -h cache-$i.cache-headless INFO replication 2>/dev/null \
     | grep -c \"^master_link_status:up\") & done; wait) | awk \"{ s += \\$1 } END { print s + 0 }\"";

/// [redundancy] must show 1 for replication mode: from before the new resource could be
/// Available, the test's own client reads every server's `INFO replication` every 200 ms while
/// the test reads the resource every 200 ms. The first time it is Available or Running, both
/// replicas' links are up (the first sample at or after that moment) and `Redundant` is True.
async fn available_only_when_linked(env: &TestEnv, more: &Value) {
    let created_ms = now_ms();
    create_with_client(env, "cache", 3, more);
    let promised = crate::Promised {
        count: LINKS_UP,
        want: 2,
        what: "both replicas linked",
        figure: "redis.replication.available_after_create",
    };
    crate::available_only_when(env, REDIS, "cache", created_ms, Duration::from_secs(300), promised).await;
}

/// Must show 4, then 1 on the same cluster (one formation less for the suite). 4: a user from `spec.users` with `keys: [app:*]` and `commands: [+get, +set]`
/// (its password generated into `<name>-user-app`) sets and reads `app:x`, on the master and,
/// replicated, on a replica; it is refused `FLUSHALL` and `other:x`; a wrong password and the
/// `default` user without a password are refused. 1: the master's pod deleted with
/// `--grace-period=0`: a new master accepts writes through `-master` within 20 s, 1000/1000 keys
/// readable, `-master` selects the new master only, and the old master rejoins as a replica,
/// never having served as the master again. Then 1, hung, on the same cluster. Before the
/// failovers, [redundancy] must show 3: a replica lost and back.
#[tokio::test]
async fn acl_user_limited_to_its_keys_and_commands_then_a_deleted_and_a_hung_master_fail_over() {
    let Some((env, op)) = enter_with_operator("rp-racl", "realpods-racl").await else {
        return;
    };
    let users = json!({ "users": [{ "name": "app", "keys": ["app:*"], "commands": ["+get", "+set"] }] });
    available_only_when_linked(&env, &users).await;
    let (master, replicas, took) = make_cluster_with(&env, "cache", 3, users).await;
    eprintln!("realpods-redis: acl: master {master}, user app, {took:.1?} after create");
    let secret = kubectl_ok(&env, &["get", "secret", "cache-user-app", "-o", "jsonpath={.data.username}"]);
    assert_eq!(secret.trim(), "YXBw", "the Secret names the user (base64 of app)");
    wait_service_answers(&env, "cache-master");
    wait_service_answers(&env, "cache-replicas");
    // As app: REDISCLI_AUTH holds its password, --user names it.
    let app = |service: &str, cmd: &str| {
        client_sh(
            &env,
            &format!("REDISCLI_AUTH=\"$APP_PASSWORD\" redis-cli --user app -h {service} {cmd} 2>&1"),
        )
        .trim()
        .to_string()
    };
    let set = app("cache-master", "SET app:x 1");
    let get = app("cache-master", "GET app:x");
    let flush = app("cache-master", "FLUSHALL");
    let other = app("cache-master", "SET other:x 1");
    let waited = client_sh(&env, "redis-cli -h cache-master WAIT 2 10000");
    let on_replica = app("cache-replicas", "GET app:x");
    let wrong =
        client_sh(&env, "REDISCLI_AUTH=not-the-password redis-cli --user app -h cache-master GET app:x 2>&1");
    let anonymous = client_sh(&env, "env -u REDISCLI_AUTH redis-cli -h cache-master SET app:y 1 2>&1");
    eprintln!(
        "realpods-redis: acl: app SET app:x -> {set:?}; GET app:x -> {get:?}; FLUSHALL -> {flush:?}; SET other:x -> {other:?}; \
         GET app:x on a replica (WAIT {}) -> {on_replica:?}; wrong password -> {:?}; default without password -> {:?}",
        waited.trim(),
        wrong.trim(),
        anonymous.trim()
    );
    assert_eq!(set, "OK");
    assert_eq!(get, "1");
    assert!(flush.contains("NOPERM"), "{flush}");
    assert!(other.contains("NOPERM"), "{other}");
    assert_eq!(on_replica, "1");
    assert!(wrong.contains("WRONGPASS"), "{wrong}");
    assert!(anonymous.contains("NOAUTH"), "{anonymous}");
    // The operator's own requests still authenticate (as default): the roles it reads are there.
    let cr = get_cr(&REDIS.api(&env), "cache").await.unwrap_or_else(|| panic!("CR gone"));
    assert_eq!(master_of(&cr), master);
    // [redundancy] must show 3 (see `copy_lost`): a replica's pod deleted.
    crate::copy_lost(&env, REDIS, "cache", &replicas[0], "redis.replication.replica_lost").await;

    let what = "master pod deleted (--grace-period=0)";
    let (old, new) = fail_over_from(&env, &master, &replicas, what, Duration::from_secs(20), |env, old| {
        // A forced delete removes the pod object at once, while its container runs until the
        // kubelet stops it, and serves whoever still reaches it (a CI run saw it acknowledge a
        // write 264 ms later). The fault is done once that server has not answered three times
        // in a row (one slow answer is no proof); the write gap is counted from before the
        // delete, these lookups included.
        let ip = kubectl_ok(env, &["get", "pod", old, "-o", "jsonpath={.status.podIP}"]);
        let run_id = || {
            let script = format!(
                "timeout 1 redis-cli -h {} --raw INFO server 2>/dev/null | sed -n 's/^run_id://p' | tr -d '\\r'",
                ip.trim()
            );
            client_sh(env, &script).trim().to_string()
        };
        let before = run_id();
        assert!(!before.is_empty(), "{old} answers at {ip} before the delete");
        let deleted = Instant::now();
        kubectl_ok(env, &["delete", "pod", old, "--grace-period=0", "--force", "--wait=false"]);
        let mut silent = 0;
        let stopped = (0..300).any(|_| {
            silent = if run_id() == before { 0 } else { silent + 1 };
            silent >= 3 || {
                std::thread::sleep(Duration::from_millis(100));
                false
            }
        });
        assert!(stopped, "{old}'s server still answers at {ip} after the delete");
        eprintln!("realpods-redis: {what}: {old}'s server stopped answering {:.1?} after the delete", deleted.elapsed());
    })
    .await;
    // The old master's pod came back either after the Sentinels had failed over, or before they
    // noticed: then it had them promote a replica first. Never as the master: its data may be
    // older than the replicas'.
    let log = kubectl_ok(&env, &["logs", &old, "-c", "redis"]);
    let start: Vec<&str> = log.lines().filter(|l| l.starts_with("stateward:")).collect();
    eprintln!("realpods-redis: {what}: {old} started again: {start:?}");
    let followed = format!("{new}.cache-headless");
    assert!(
        start
            .iter()
            .any(|l| l.contains(&followed) && (l.ends_with("as the master") || l.contains("took over"))),
        "{old} started as a replica of {new}: {start:?}"
    );
    // Then, on the same cluster (one formation less for the suite): a hung master.
    let (master, replicas) = wait_replicated(&env, "cache", 3, Duration::from_secs(240)).await;
    sentinel_fails_over_a_hung_master(&env, &master, &replicas).await;
    drop(op);
}

/// Must show 1, hung: `DEBUG SLEEP 60` on the master `master` of the cluster `cache` (its
/// replicas `replicas`): the same as a deleted master, within 30 s.
async fn sentinel_fails_over_a_hung_master(env: &TestEnv, master: &str, replicas: &[String]) {
    let mut sleeper = None;
    let what = "master hung (DEBUG SLEEP 60)";
    fail_over_from(env, master, replicas, what, Duration::from_secs(30), |env, old| {
        // In the background: the command returns when the sleep ends.
        let child = env
            .kubectl()
            .args(["-n", &env.namespace, "exec", old, "-c", "redis", "--"])
            .args(["redis-cli", "-h", "127.0.0.1", "DEBUG", "SLEEP", "60"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("kubectl exec: {e}"));
        sleeper = Some(child);
        // The exec takes a moment to reach the server: the fault is done once the master no
        // longer answers a PING within a second (the write gap is counted from before).
        let hung = (0..100).any(|_| {
            let out = client_sh(
                env,
                &format!("timeout 1 redis-cli -h {old}.cache-headless PING >/dev/null 2>&1 && echo up || echo hung"),
            );
            out.trim() == "hung" || {
                std::thread::sleep(Duration::from_millis(100));
                false
            }
        });
        assert!(hung, "{old} still answers after DEBUG SLEEP");
    })
    .await;
    if let Some(mut c) = sleeper {
        let _ = c.kill();
        let _ = c.wait();
    }
}
