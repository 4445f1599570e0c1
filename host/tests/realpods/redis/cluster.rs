//! Cluster mode, 3 shards × 1 replica, `spec.replicas` left out. Created as a new user would
//! (wait for Available, write 1000 keys, lose a master at once): Available comes only once
//! every replica is linked, so every key stays; then a switchover, all masters and all pods
//! deleted, each with every key (see the test). Then a fourth shard added (an even share of the
//! slots and their keys moved to it) and removed again (its slots and keys moved off first),
//! under a writer that follows MOVED/ASK redirections: every acknowledged write readable after,
//! no other error.

use super::*;

/// The cluster's shards as status has them: (master, replicas), by master.
fn shards(cr: &Value) -> Vec<(String, Vec<String>)> {
    cr.pointer("/status/cluster/shards")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|s| {
            let replicas = s["replicas"].as_array().into_iter().flatten();
            (
                s["master"].as_str().unwrap_or_default().to_string(),
                replicas.filter_map(Value::as_str).map(str::to_string).collect(),
            )
        })
        .collect()
}

/// Waits until status says the cluster is formed and ok (every slot served), with 3 shards of 1
/// replica each, every pod Ready and of the current revision, and `shop` selecting exactly the
/// masters; the shards and how long it took.
async fn wait_cluster_ok(
    env: &TestEnv,
    what: &str,
    timeout: Duration,
) -> (Vec<(String, Vec<String>)>, Duration) {
    wait_shards_ok(env, what, 3, timeout).await
}

/// [`wait_cluster_ok`] with `n` shards (of 1 replica each, on 2 × `n` pods).
async fn wait_shards_ok(
    env: &TestEnv,
    what: &str,
    n: usize,
    timeout: Duration,
) -> (Vec<(String, Vec<String>)>, Duration) {
    let api = REDIS.api(env);
    wait_for(&format!("shop: {what}: cluster ok, {n} shards × 1 replica"), timeout, || {
        let api = api.clone();
        async move {
            let cr = get_cr(&api, "shop").await.ok_or("CR not found")?;
            let c = cr.pointer("/status/cluster").cloned().unwrap_or(Value::Null);
            let sh = shards(&cr);
            let pods = super::super::postgres::pods(env, "shop").await;
            let out = super::super::kubectl_in(env, &["get", "statefulset", "shop", "-o", "json"]);
            let sts: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
            let rolled = sts["status"]["updatedReplicas"] == json!(2 * n)
                && sts["status"]["readyReplicas"] == json!(2 * n)
                && sts["spec"]["replicas"] == json!(2 * n);
            let masters: BTreeSet<String> = sh.iter().map(|s| s.0.clone()).collect();
            let eps = endpoints(env, "shop").await;
            let ok = c["formed"] == json!(true)
                && c["state"] == "ok"
                && c["slotsOk"] == json!(16384)
                && sh.len() == n
                && sh.iter().all(|s| s.1.len() == 1)
                && pods.len() == 2 * n
                && pods.iter().all(|p| p.ready && !p.deleting)
                && rolled
                && eps == masters;
            if ok {
                Ok(sh)
            } else {
                Err(format!("cluster {c}; sts rolled {rolled}; shop endpoints {eps:?}; {}", summary(&cr)))
            }
        }
    })
    .await
}

/// Keys `key:1..=KEYS` of `values` read back with `-c` through `shop` (redirections followed).
/// Read again, 2 s apart, up to 5 times while some are not (each read bounded to 20 s): right
/// after the cluster is ok again a client may still be sent to an address a node has not caught
/// up with, and wait on it.
fn cluster_keys_readable(env: &TestEnv) -> usize {
    let mut readable = 0;
    for attempt in 0..5 {
        if attempt > 0 {
            std::thread::sleep(Duration::from_secs(2));
        }
        let out = client_sh(
            env,
            &format!(
                "seq 1 {KEYS} | sed 's/.*/GET key:&/' | timeout 20 redis-cli -c -h shop 2>&1 | grep '^val:' > /tmp/got; \
                 seq 1 {KEYS} | sed 's/.*/val:&/' > /tmp/want; sort /tmp/got > /tmp/got.s; sort /tmp/want > /tmp/want.s; \
                 comm -12 /tmp/want.s /tmp/got.s | wc -l"
            ),
        );
        readable = out.trim().parse().unwrap_or_else(|_| panic!("a count of keys: {out:?}"));
        if readable == KEYS {
            break;
        }
        eprintln!("realpods-redis: cluster: {readable}/{KEYS} keys readable (read {})", attempt + 1);
    }
    readable
}

/// Tries `SET <key> x` through `shop` every 100 ms (each bounded to 1 s) for at most `limit_s`;
/// when it was first acknowledged (ms since the epoch).
fn first_cluster_write(env: &TestEnv, key: &str, limit_s: u64) -> Option<u64> {
    let out = client_sh(
        env,
        &format!(
            "end=$(( $(date +%s) + {limit_s} )); while [ $(date +%s) -lt $end ]; do \
               if timeout 1 redis-cli -c -h shop SET {key} x 2>/dev/null | grep -qx OK; then date +%s%3N; exit 0; fi; \
               sleep 0.1; done; echo none"
        ),
    );
    out.trim().parse().ok()
}

/// How many of the six servers say their link to a master is up (for [`crate::ClientSampler`]).
const LINKS_UP: &str =
    "(for i in 0 1 2 3 4 5; do (timeout 1 redis-cli -h shop-$i.shop-headless INFO replication 2>/dev/null \
     | grep -c \"^master_link_status:up\") & done; wait) | awk \"{ s += \\$1 } END { print s + 0 }\"";

/// A new user's cluster: `spec.replicas` left out (3 shards × (1 + 1) = 6 pods), Available
/// waited for and nothing else, then 1000 keys and a master lost at once: every key stays,
/// because Available came only once every replica was linked (sampled every 200 ms by the
/// test's own client). Then the switchover annotation makes a replica its shard's master with
/// every key (and names no pod outside the cluster); all three masters deleted at once (no
/// master is left to vote a replica in: they come back from their volumes) → ok again with
/// every key; all six pods deleted at once (every address changes, so no node can find another
/// by itself) → ok again with every key, the plugin's `CLUSTER MEET` reconnecting them.
#[tokio::test]
async fn cluster_forms_and_survives_a_master_all_masters_and_all_pods_deleted() {
    let Some((env, op)) = enter_with_operator("rp-rclu", "realpods-rclu").await else {
        return;
    };
    let mut cr = sample("RedisCluster", "shop", REDIS_IMAGE, 6);
    cr["spec"].as_object_mut().expect("spec").remove("replicas");
    cr["spec"]["mode"] = json!("cluster");
    cr["spec"]["cluster"] = json!({ "shards": 3, "replicasPerShard": 1 });
    let created_ms = now_ms();
    e2e::apply(&env, &env.namespace, &cr);
    super::super::apply_json(&env, &[client_pod("shop", &[])]);
    let promised = crate::Promised {
        count: LINKS_UP,
        want: 3,
        what: "every replica linked",
        figure: "redis.cluster.available_after_create",
    };
    let (available_ms, linked_ms, at_available) =
        crate::available_only_when(&env, REDIS, "shop", created_ms, Duration::from_secs(300), promised).await;
    assert_eq!(at_available.pointer("/status/cluster/replicasLinked"), Some(&json!(true)));
    assert_eq!(at_available["spec"].get("replicas"), None, "no default was written into the spec");
    if let Some(l) = linked_ms {
        stateward_testkit::report::millis(
            "redis.cluster.available_after_replicas_linked",
            available_ms.saturating_sub(l),
            5_000,
        );
    }

    // At once: 1000 keys through the cluster's Service, then the first shard's master lost.
    let written = client_sh(
        &env,
        &format!(
            "seq 1 {KEYS} | sed 's/.*/SET key:& val:&/' | redis-cli -c -h shop >/tmp/set.out 2>&1; grep -c '^OK$' /tmp/set.out"
        ),
    );
    assert_eq!(written.trim(), KEYS.to_string(), "SETs acknowledged through shop with -c");
    let sh = shards(&at_available);
    assert_eq!(sh.len(), 3, "{}", summary(&at_available));
    assert!(
        sh.iter().all(|(m, r)| r.len() == 1 && !r.contains(m)),
        "replicas follow masters on other pods: {sh:?}"
    );
    let (victim, heir) = (sh[0].0.clone(), sh[0].1[0].clone());
    let key = client_sh(&env, &format!("redis-cli -h {victim}.shop-headless RANDOMKEY"));
    let key = key.trim().to_string();
    assert!(key.starts_with("key:"), "a key on {victim}: {key:?}");
    let verdicts = crate::RedundantWatch::start(&env, REDIS, "shop");
    let fault_ms = now_ms();
    kubectl_ok(&env, &["delete", "pod", &victim, "--grace-period=0", "--force", "--wait=false"]);
    // A key of the same slot (the hash tag), so that the data keys keep their values.
    let probe = format!("probe{{{key}}}");
    let acked =
        first_cluster_write(&env, &probe, 60).unwrap_or_else(|| panic!("{probe} not writable within 60 s"));
    let gap = Duration::from_millis(acked.saturating_sub(fault_ms));
    let readable = cluster_keys_readable(&env);
    let (sh, back) = wait_cluster_ok(&env, "a master deleted", Duration::from_secs(180)).await;
    eprintln!(
        "realpods-redis: cluster: master {victim} deleted right after Available and 1000 keys: {probe} (the slot of {key}) \
         written again {gap:.1?} after; {readable}/{KEYS} keys; ok again with {victim} back as a replica {back:.1?} later: shards {sh:?}"
    );
    assert_eq!(readable, KEYS, "a master lost right after Available loses no acknowledged key");
    assert!(
        sh.iter().any(|(m, r)| *m == heir && r.as_slice() == std::slice::from_ref(&victim)),
        "{heir} took over, {victim} follows it"
    );
    stateward_testkit::report::millis_within_liveness(
        "redis.cluster.master_lost.write_gap",
        gap.as_millis() as u64,
        20_000,
    );
    // Redundant went False while the shard had no linked replica, naming why, and is True again
    // once its new replica has linked.
    let ok_again = crate::redundant_again(&env, REDIS, "shop", Duration::from_secs(120)).await;
    let seen = verdicts.stop();
    let lacking: Vec<&(u64, String, String)> =
        seen.iter().filter(|(_, status, _)| status == "False").collect();
    eprintln!(
        "realpods-redis: cluster: Redundant {} verdicts while the master was lost, first False {:?}; True again {ok_again:.1?} after the shards were ok",
        seen.len(),
        lacking.first()
    );
    assert!(!lacking.is_empty(), "Redundant never said False after a master was lost: {seen:?}");
    assert!(
        lacking.iter().all(|(_, _, m)| !m.is_empty()),
        "a False verdict names what is missing: {lacking:?}"
    );
    // Seen at the next answers (a poll is every 2 s) after the server is gone.
    let first_false = lacking.first().map_or(fault_ms, |l| l.0);
    crate::redundant_false_after(
        "redis.cluster.master_lost.redundant_false_after",
        first_false.saturating_sub(fault_ms),
    );
    stateward_testkit::report::seconds("redis.cluster.master_lost.redundant_again_after_ok", ok_again, None);
    let per_master: Vec<(String, usize)> = sh
        .iter()
        .map(|(m, _)| {
            let n = client_sh(&env, &format!("redis-cli -h {m}.shop-headless DBSIZE"));
            (m.clone(), n.trim().parse().unwrap_or(0))
        })
        .collect();
    eprintln!("realpods-redis: cluster: keys per master {per_master:?}");
    assert!(per_master.iter().all(|(_, n)| *n > 0), "every shard holds keys: {per_master:?}");

    // The switchover annotation: the replica of a shard takes it over (`CLUSTER FAILOVER`, its
    // master holding its clients until it has every write); a pod that is not one of the
    // cluster's is refused.
    let (old, to) = (sh[0].0.clone(), sh[0].1[0].clone());
    let asked = Instant::now();
    let done = super::switch_over_to(&env, "shop", &to).await;
    let (sh, _) = wait_cluster_ok(&env, "switched over", Duration::from_secs(120)).await;
    let readable = cluster_keys_readable(&env);
    eprintln!(
        "realpods-redis: cluster: switchover to {to}: Done {done:.1?} after the annotation, ok again {:.1?} after it; {readable}/{KEYS} keys; shards {sh:?}",
        asked.elapsed()
    );
    assert!(
        sh.iter().any(|(m, r)| *m == to && r.as_slice() == std::slice::from_ref(&old)),
        "{to} took over, {old} follows it: {sh:?}"
    );
    assert_eq!(readable, KEYS);
    kubectl_ok(&env, &["annotate", "--overwrite", "rdc", "shop", "stateward.dev/switchover-to=shop-9"]);
    let api = REDIS.api(&env);
    let (refused, _) = wait_for("switchover to shop-9 Refused", Duration::from_secs(60), || {
        let api = api.clone();
        async move {
            let cr = get_cr(&api, "shop").await.ok_or("CR not found")?;
            let sw = cr.pointer("/status/switchover").cloned().unwrap_or(Value::Null);
            if sw["asked"] == "shop-9" && sw["phase"] == "Refused" {
                Ok(sw["message"].as_str().unwrap_or_default().to_string())
            } else {
                Err(sw.to_string())
            }
        }
    })
    .await;
    assert!(refused.contains("not a pod of this cluster"), "{refused}");
    let after = sh;

    // All three masters at once: every shard fails over to its replica.
    let masters: Vec<String> = after.iter().map(|s| s.0.clone()).collect();
    let started = Instant::now();
    let mut args = vec!["delete", "pod", "--grace-period=0", "--force", "--wait=false"];
    args.extend(masters.iter().map(String::as_str));
    kubectl_ok(&env, &args);
    let (now, took) = wait_cluster_ok(&env, "all masters deleted", Duration::from_secs(180)).await;
    let readable = cluster_keys_readable(&env);
    eprintln!(
        "realpods-redis: cluster: all masters {masters:?} deleted: ok again with every pod back {took:.1?} later \
         ({:.1?} in all); {readable}/{KEYS} keys; shards {now:?}",
        started.elapsed()
    );
    // No master is left to vote for a replica: the masters come back from their volumes.
    assert_eq!(readable, KEYS);

    // All six pods at once: every address changes; the plugin introduces them again.
    let started = Instant::now();
    kubectl_ok(
        &env,
        &[
            "delete",
            "pod",
            "-l",
            "stateward.dev/instance=shop",
            "--grace-period=0",
            "--force",
            "--wait=false",
        ],
    );
    let (end, took) = wait_cluster_ok(&env, "all pods deleted", Duration::from_secs(240)).await;
    let readable = cluster_keys_readable(&env);
    let events = super::super::postgres::cr_events(&env, "shop").await;
    eprintln!(
        "realpods-redis: cluster: all 6 pods deleted: ok again {took:.1?} later ({:.1?} in all); {readable}/{KEYS} keys; shards {end:?}",
        started.elapsed()
    );
    assert_eq!(readable, KEYS);
    assert!(events.iter().any(|e| e.contains("ClusterFormed")), "{events:#?}");
    // `ok` is each server's own verdict on its slots; one can still route a peer to the address
    // its pod had before (gossip corrects it), and a client sent there waits on a dead address.
    // Status names such routes until none is left: the writer below starts after that.
    let api = REDIS.api(&env);
    let routes_started = Instant::now();
    wait_for("shop: every server routes every pod to its current address", Duration::from_secs(60), || {
        let api = api.clone();
        async move {
            let cr = get_cr(&api, "shop").await.ok_or("CR not found")?;
            match cr.pointer("/status/cluster/staleRoutes") {
                None => Ok(()),
                Some(stale) => Err(format!("stale routes {stale}")),
            }
        }
    })
    .await;
    eprintln!(
        "realpods-redis: cluster: every route current {:.1?} after ok ({:.1?} after the pods' deletion)",
        routes_started.elapsed(),
        started.elapsed()
    );

    // Must show 3: a fourth shard (8 pods), which takes an even share of the slots and their
    // keys, then back to three, while a writer sets a new key every 50 ms.
    // The data keys only (the probe written when a master was deleted is one more).
    let keys_per_master = |sh: &[(String, Vec<String>)]| -> Vec<(String, usize)> {
        sh.iter()
            .map(|(m, _)| {
                let n = client_sh(
                    &env,
                    &format!("redis-cli -h {m}.shop-headless --scan --pattern 'key:*' | wc -l"),
                );
                (m.clone(), n.trim().parse().unwrap_or(0))
            })
            .collect()
    };
    let scale = |shards: usize| {
        let patch = json!({"spec": {"replicas": 2 * shards, "cluster": {"shards": shards}}}).to_string();
        kubectl_ok(&env, &["patch", "rdc", "shop", "--type=merge", "-p", &patch]);
    };
    // The writer: each SET through `redis-cli -c` (it follows MOVED and ASK), its answer kept.
    // As cluster clients do, a SET answered CLUSTERDOWN or TRYAGAIN is tried again (up to 5
    // times, 200 ms apart); each such answer is recorded in /tmp/w.retried and counted below.
    // A SET without an answer in 10 s is logged as `(no answer)` with when it was sent, so a
    // stall can be matched with the operator's log.
    client_sh(
        &env,
        "rm -f /tmp/w.log /tmp/w.retried; \
         (set_w() { r=$(timeout 10 redis-cli -c -h shop SET w:$1 v:$1 2>&1 | tr '\\n' ' '); \
         [ -n \"$r\" ] || r=\"(no answer) sent $2\"; echo \"$r\"; }; \
         i=0; while [ ! -e /tmp/w.stop ]; do i=$((i+1)); r=$(set_w $i \"$(date -u +%T.%N)\"); n=0; \
         while [ $n -lt 5 ] && case \"$r\" in CLUSTERDOWN*|TRYAGAIN*) true;; *) false;; esac; do \
         echo \"$i $r\" >> /tmp/w.retried; n=$((n+1)); sleep 0.2; r=$(set_w $i \"$(date -u +%T.%N)\"); done; \
         printf '%s %s\\n' \"$i\" \"$r\" >> /tmp/w.log; sleep 0.05; done) >/dev/null 2>&1 &",
    );
    let started = Instant::now();
    scale(4);
    let (four, took) = wait_shards_ok(&env, "scaled out to 4 shards", 4, Duration::from_secs(300)).await;
    // The rebalance moves a slot at a time: done once every master holds about a quarter.
    let api = REDIS.api(&env);
    wait_for("shop: 4 shards of about 4096 slots each", Duration::from_secs(120), || {
        let api = api.clone();
        async move {
            let cr = get_cr(&api, "shop").await.ok_or("CR not found")?;
            let slots: Vec<u64> = cr
                .pointer("/status/cluster/shards")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|s| s["slots"].as_u64())
                .collect();
            if slots.len() == 4 && slots.iter().all(|n| *n >= 4000) {
                Ok(())
            } else {
                Err(format!("slots per shard {slots:?}"))
            }
        }
    })
    .await;
    let per_master = keys_per_master(&four);
    let readable = cluster_keys_readable(&env);
    eprintln!(
        "realpods-redis: cluster: 3 -> 4 shards in {took:.1?} ({:.1?} in all); {readable}/{KEYS} keys; keys per master {per_master:?}; shards {four:?}",
        started.elapsed()
    );
    assert_eq!(readable, KEYS);
    assert!(
        per_master.iter().all(|(_, n)| *n > 0),
        "every shard, the new one too, holds keys: {per_master:?}"
    );
    // No key left behind on a master in a slot it gave away.
    assert_eq!(per_master.iter().map(|(_, n)| n).sum::<usize>(), KEYS, "{per_master:?}");

    // Back to three shards: the fourth master's slots and keys move to the others first.
    let started = Instant::now();
    scale(3);
    let (three, took) = wait_shards_ok(&env, "scaled in to 3 shards", 3, Duration::from_secs(300)).await;
    wait_for("shop: the StatefulSet down to 6 pods", Duration::from_secs(120), || {
        let n = kubectl_ok(&env, &["get", "statefulset", "shop", "-o", "jsonpath={.status.replicas}"]);
        async move {
            if n.trim() == "6" {
                Ok(())
            } else {
                Err(format!("{n} pods"))
            }
        }
    })
    .await;
    let per_master = keys_per_master(&three);
    let readable = cluster_keys_readable(&env);
    eprintln!(
        "realpods-redis: cluster: 4 -> 3 shards in {took:.1?} ({:.1?} in all); {readable}/{KEYS} keys; keys per master {per_master:?}; shards {three:?}",
        started.elapsed()
    );
    assert_eq!(readable, KEYS);
    assert_eq!(per_master.iter().map(|(_, n)| n).sum::<usize>(), KEYS, "{per_master:?}");

    // The writer's record: every SET acknowledged, or an error other than a redirection (which
    // `-c` follows), counted; every acknowledged key is read back.
    client_sh(&env, "touch /tmp/w.stop; sleep 1");
    let log = client_sh(&env, "cat /tmp/w.log");
    let acked: Vec<&str> = log
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some("OK"))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let errors: Vec<&str> = log.lines().filter(|l| l.split_whitespace().nth(1) != Some("OK")).collect();
    let lost = client_sh(
        &env,
        "grep ' OK' /tmp/w.log | cut -d' ' -f1 | sed 's/.*/GET w:&/' | timeout 60 redis-cli -c -h shop 2>&1 | grep -c '^v:' || true",
    );
    let read_back: usize = lost.trim().parse().unwrap_or(0);
    let retried = client_sh(&env, "cat /tmp/w.retried 2>/dev/null || true");
    eprintln!(
        "realpods-redis: cluster writer during 3 -> 4 -> 3: {} writes, {} acknowledged, {} errors {:?}, {read_back} read back; {} answers tried again {:?}",
        log.lines().count(),
        acked.len(),
        errors.len(),
        errors.iter().take(5).collect::<Vec<_>>(),
        retried.lines().count(),
        retried.lines().take(5).collect::<Vec<_>>()
    );
    assert!(acked.len() > 100, "the writer ran: {} acknowledged", acked.len());
    assert_eq!(read_back, acked.len(), "acknowledged writes lost");
    assert!(errors.is_empty(), "errors other than redirections: {errors:?}");
    let events = super::super::postgres::cr_events(&env, "shop").await;
    eprintln!("realpods-redis: cluster events: {events:#?}");
    assert!(events.iter().any(|e| e.contains("ScalingCluster")), "{events:#?}");
    drop(op);
}
