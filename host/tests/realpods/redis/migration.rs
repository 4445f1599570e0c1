//! Upgrades: a Redis cluster made by the last release before the HA wave (commit a3d9881) is
//! converted in place, data-safely, to replication with Sentinel. That release ran pod 0 as
//! the master and every other pod `redis-server --replicaof` pod 0, with no Sentinel, the
//! Service `<name>` selecting pod 0 by its name; this build patches the same StatefulSet (same
//! name, selector, serviceName and claim templates; `OnDelete`, the plugin rolling replicas
//! first), labels the master it confirms, keeps the Service `<name>` (now selecting that master
//! by label) and adds `-master` and `-replicas`. No claim is deleted, no acknowledged write is
//! lost, and clients of the old Service name keep writing through it.
//!
//! The old release's objects come from `host/tests/fixtures/last-release/redis.yaml`, applied
//! here as its operator applied them, before this build's operator starts.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use stateward_testkit::real::{RealPods, Weight};
use stateward_testkit::LoopbackCert;

use super::*;
use crate::e2e::last_release;
use crate::postgres::cr_events;
use crate::start_operator;

/// For a failure: the pods, the StatefulSet's status, and each member's last log lines (its
/// previous container's too when it restarted), through the API server only.
fn member_logs(env: &TestEnv, name: &str, pods: &[String]) -> String {
    let text = |args: &[&str]| {
        let out = crate::kubectl_in(env, args);
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    };
    let mut all = text(&["get", "pods", "-o", "wide", "-L", "stateward.dev/role,controller-revision-hash"]);
    all += &text(&["get", "statefulset", name, "-o", "jsonpath={.status}"]);
    all += "\n";
    for p in pods {
        for previous in ["--previous=false", "--previous=true"] {
            all += &format!(
                "--- {p} ({previous})\n{}",
                text(&["logs", p, "-c", "redis", "--tail=40", previous])
            );
        }
    }
    all
}

/// The writer in the client pod: `SET w:<i> 1` through the Service `@SERVICE@` (the old
/// release's name), one connection each bounded to 1 s, ten a second at most; every
/// acknowledged `i` and when (ms) in /tmp/acks, every other answer and when in /tmp/errs, until
/// /tmp/stop appears.
const WRITER: &str = r#"
: > /tmp/acks
: > /tmp/errs
i=0
while [ ! -e /tmp/stop ]; do
  i=$((i + 1))
  out=$(timeout 1 redis-cli -h @SERVICE@ SET w:$i 1 2>&1 | head -n 1)
  if [ "$out" = OK ]; then echo "$i $(date +%s%3N)" >> /tmp/acks; else echo "$(date +%s%3N) ${out:-no answer within 1 s}" >> /tmp/errs; fi
  sleep 0.1
done
echo done > /tmp/stopped
"#;

/// The requirement: the last release's three-member cluster (pod 0 the master, two replicas of
/// it, the Service `legacy` selecting pod 0 by name), with 1000 keys written through `legacy`
/// and a writer going on through it, is taken over by this build: every pod ends on the
/// StatefulSet's new revision, one master confirmed in status and behind both `legacy-master`
/// and `legacy` (the old name), the two others replicas linked to it; every original key and
/// every acknowledged write is readable through `legacy` and `legacy-master`; no claim was
/// deleted or made again.
#[tokio::test]
async fn a_cluster_of_the_last_release_is_converted_in_place_and_its_service_name_keeps_working() {
    let test_started = Instant::now();
    let Some(env) = RealPods::enter(Weight::Medium, "rp-rmig").await.expect("real-pods cluster") else {
        return;
    };
    let name = "legacy";
    let pod_names: Vec<String> = (0..3).map(|i| format!("{name}-{i}")).collect();
    let api = REDIS.api(&env);

    // The resource as the old release left it, with its children: the local image; the
    // container's command is that release's own (`sh -c`, then `redis-server`). The sample's
    // name is also the component label's value, which stays.
    let text = last_release::fixture_text("redis.yaml")
        .replace("app.kubernetes.io/component: cache", "app.kubernetes.io/component: @COMPONENT@")
        .replace("cache", name)
        .replace("@COMPONENT@", "cache")
        .replace("'7.4'", "'7.0'")
        .replace("image: redis:7.4", &format!("image: {REDIS_IMAGE}"));
    let cert = LoopbackCert::generate().expect("a certificate");
    let substituted = |sts: &mut Value| {
        let container = &sts["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["image"], json!(REDIS_IMAGE), "the fixture's image substituted");
        assert_eq!(
            container["env"][1]["value"],
            json!(format!("{name}-0.{name}-headless")),
            "the fixture's name substituted"
        );
    };
    // (No `master`: that release named none.)
    let extra = json!({ "mode": "replication" });
    last_release::make(
        &env,
        &api,
        sample("RedisCluster", name, REDIS_IMAGE, 3),
        "redis@0.1.0",
        extra,
        |cr| last_release::children(&text, cr, &cert, substituted),
    )
    .await;
    crate::apply_json(&env, &[client_pod(name, &[])]);
    for p in &pod_names {
        pod_ready(&env, p, Duration::from_secs(180)).await;
    }
    pod_ready(&env, "client", Duration::from_secs(60)).await;

    // The old topology: 1000 keys through `legacy` (pod 0), acknowledged by both replicas.
    write_keys(&env, name, 2);
    assert_eq!(keys_readable(&env, name), KEYS);
    for p in &pod_names[1..] {
        let info = client_sh(&env, &format!("redis-cli -h {p}.{name}-headless INFO replication"));
        let field = |f: &str| {
            info.lines()
                .find_map(|l| l.trim_end_matches('\r').strip_prefix(f)?.strip_prefix(':').map(str::to_string))
                .unwrap_or_default()
        };
        assert_eq!(field("role"), "slave", "{p}: {info}");
        assert_eq!(field("master_host"), format!("{name}-0.{name}-headless"), "{p}: {info}");
        assert_eq!(field("master_link_status"), "up", "{p}: {info}");
        let size = client_sh(&env, &format!("redis-cli -h {p}.{name}-headless DBSIZE"));
        assert_eq!(size.trim(), KEYS.to_string(), "{p} holds the keys");
    }
    let claims = e2e::pvc_uids(&env, name).await;
    assert_eq!(claims.len(), 3, "{claims:?}");
    let mut rollout = last_release::Rollout::default();
    rollout.poll(&env, name, &pod_names).await;
    let legacy_before = endpoints(&env, name).await;
    assert_eq!(legacy_before, BTreeSet::from([pod_names[0].clone()]), "{name} selects pod 0");
    eprintln!(
        "realpods-redis-mig: the last release's cluster up {:.1?} into the test: {KEYS} keys through {name} on \
         {legacy_before:?}, both replicas linked and holding them; claims {claims:?}",
        test_started.elapsed()
    );

    // A writer through the old Service name, from before the takeover to after it.
    let writer = WRITER.replace("@SERVICE@", name);
    client_sh(
        &env,
        &format!(
            "rm -f /tmp/stop /tmp/stopped; cat > /tmp/writer.sh <<'EOF'\n{writer}\nEOF\nnohup sh /tmp/writer.sh >/dev/null 2>&1 &"
        ),
    );
    let acked = || client_sh(&env, "cat /tmp/acks 2>/dev/null | wc -l").trim().parse::<usize>().unwrap_or(0);
    let (_, _) = wait_for("the writer's first 20 acknowledgements", Duration::from_secs(60), || {
        let n = acked();
        async move {
            if n >= 20 {
                Ok(())
            } else {
                Err(format!("{n} acknowledged"))
            }
        }
    })
    .await;

    // This build takes over.
    let started = Instant::now();
    let mut op = start_operator(&env, "realpods-rmig");
    op.wait_ready(Duration::from_secs(60)).await;
    let operator_ready = started.elapsed();

    // Polled every second until converged: every pod on the StatefulSet's update revision and
    // Ready, the certificate the keeper issued stamped on the template, a master confirmed in
    // status and behind both `-master` and the old name, the two others linked replicas behind
    // `-replicas`. Pods made again are counted by their uids; every master status names is kept.
    let secrets: Api<Secret> = env.api();
    let mut masters_named = Vec::<(Duration, String)>::new();
    let (mut legacy_empty, mut legacy_first_moved, mut last_poll) = (Duration::ZERO, None, Instant::now());
    let mut last = String::new();
    let (converged, master) = loop {
        if started.elapsed() > Duration::from_secs(300) {
            client_sh(&env, "touch /tmp/stop");
            panic!(
                "not converged 300 s after the operator started: {last}\nmasters named {masters_named:?}\n\
                 writer errors (count, answer): {}\nevents: {:#?}\n{}",
                client_sh(&env, "cut -d' ' -f2- /tmp/errs | sort | uniq -c | sort -rn | head -n 8"),
                cr_events(&env, name).await,
                member_logs(&env, name, &pod_names)
            );
        }
        let Some(cr) = get_cr(&api, name).await else {
            panic!("the resource is gone");
        };
        let master = master_of(&cr);
        if masters_named.last().is_none_or(|(_, m)| *m != master) {
            masters_named.push((started.elapsed(), master.clone()));
        }
        let inst = instances(&cr);
        let linked: BTreeSet<String> = inst
            .iter()
            .filter(|(p, r, l)| r == "replica" && l == "up" && *p != master)
            .map(|i| i.0.clone())
            .collect();
        let legacy = endpoints(&env, name).await;
        let on_master = endpoints(&env, &format!("{name}-master")).await;
        let on_replicas = endpoints(&env, &format!("{name}-replicas")).await;
        if legacy.is_empty() {
            legacy_empty += last_poll.elapsed();
        }
        if legacy_first_moved.is_none() && legacy != legacy_before {
            legacy_first_moved = Some(started.elapsed());
        }
        last_poll = Instant::now();
        let last_release::Seen { statefulset: set, on_delete, observed, revision, outdated } =
            rollout.poll(&env, name, &pod_names).await;
        // The certificate this build's keeper issued (for the Services it makes: it names
        // them), and the template stamped with it.
        let tls = secrets.get_opt(&format!("{name}-tls")).await.ok().flatten();
        let issued = tls.as_ref().is_some_and(|s| {
            s.metadata.annotations.as_ref().is_some_and(|a| a.contains_key("stateward.dev/cert-sans"))
        });
        let want_stamp = tls.as_ref().and_then(|s| s.data.as_ref()).and_then(|d| {
            let (crt, ca) = (d.get("tls.crt")?, d.get("ca.crt")?);
            Some(last_release::current_certificate_stamp(&format!("{name}-tls"), &crt.0, &ca.0))
        });
        let stamp = set
            .as_ref()
            .and_then(|s| s.spec.as_ref())
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get("stateward.dev/certificates-sha256").cloned());
        let stamped = issued && want_stamp.is_some() && stamp == want_stamp;
        let others: BTreeSet<String> = pod_names.iter().filter(|p| **p != master).cloned().collect();
        let ok = on_delete
            && observed
            && stamped
            && outdated.is_empty()
            && !master.is_empty()
            && inst.iter().filter(|(_, r, _)| r == "master").map(|i| &i.0).collect::<Vec<_>>() == [&master]
            && linked == others
            && on_master == BTreeSet::from([master.clone()])
            && legacy == on_master
            && on_replicas == others;
        if ok {
            break (started.elapsed(), master);
        }
        last = format!(
            "OnDelete {on_delete}, observed {observed}, certificate issued {issued} stamped {stamped}; \
             not Ready on revision {revision:?}: {outdated:?}; master {master:?}; {name} {legacy:?} \
             -master {on_master:?} -replicas {on_replicas:?}; instances {inst:?}; sentinels {}; {}",
            cr.pointer("/status/sentinels").unwrap_or(&Value::Null),
            summary(&cr)
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };

    // Writes through the old name go on: 20 more acknowledged after the conversion.
    let at = acked();
    let (_, _) =
        wait_for("20 more writes acknowledged through the old name", Duration::from_secs(60), || {
            let n = acked();
            async move {
                if n >= at + 20 {
                    Ok(())
                } else {
                    Err(format!("{} acknowledged since the conversion", n - at))
                }
            }
        })
        .await;
    client_sh(&env, "touch /tmp/stop; for i in $(seq 50); do [ -e /tmp/stopped ] && break; sleep 0.1; done");
    let mut acks: Vec<(u64, u64)> = client_sh(&env, "cat /tmp/acks")
        .lines()
        .filter_map(|l| l.split_once(' ').and_then(|(i, t)| Some((i.parse().ok()?, t.parse().ok()?))))
        .collect();
    acks.sort_by_key(|a| a.1);
    // The longest gap between two acknowledged writes, and where it ended (ms after the
    // operator started: the writer's clock is the client pod's, the same machine's).
    let operator_ms = now_ms() - started.elapsed().as_millis() as u64;
    let mut gaps: Vec<(u64, u64)> =
        acks.windows(2).map(|w| (w[1].1 - w[0].1, w[1].1.saturating_sub(operator_ms))).collect();
    gaps.sort_unstable_by(|a, b| b.cmp(a));
    let errors = client_sh(&env, "cut -d' ' -f2- /tmp/errs | sort | uniq -c | sort -rn | head -n 8");
    let present: BTreeSet<u64> = client_sh(&env, &format!("redis-cli -h {name} --scan --pattern 'w:*'"))
        .lines()
        .filter_map(|k| k.trim().strip_prefix("w:")?.parse().ok())
        .collect();
    let lost: Vec<u64> = acks.iter().map(|a| a.0).filter(|i| !present.contains(i)).collect();

    // Every original key through the old name and through -master.
    let through_legacy = keys_readable(&env, name);
    let through_master = keys_readable(&env, &format!("{name}-master"));
    // Every member holds the same keys (the replicas caught up: WAIT first).
    let waited = client_sh(&env, &format!("redis-cli -h {name}-master WAIT 2 10000"));
    let sizes: BTreeMap<String, String> = pod_names
        .iter()
        .map(|p| {
            (
                p.clone(),
                client_sh(&env, &format!("redis-cli -h {p}.{name}-headless DBSIZE")).trim().to_string(),
            )
        })
        .collect();
    let replication = client_sh(&env, &format!("redis-cli -h {name}-master INFO replication"));
    let connected = replication
        .lines()
        .find_map(|l| l.trim_end_matches('\r').strip_prefix("connected_slaves:"))
        .unwrap_or_default()
        .to_string();

    let claims_after = e2e::pvc_uids(&env, name).await;
    let events = cr_events(&env, name).await;
    let replaced = rollout.replaced();
    let replacing = events.iter().filter(|e| e.contains(" ReplacingPod:")).count();
    eprintln!("realpods-redis-mig: events: {events:#?}");
    eprintln!(
        "realpods-redis-mig: the last release's cluster converted {converged:.1?} after this build's operator started \
         (ready after {operator_ready:.1?}); master {master}; masters named in status (since the start, name) {masters_named:?}; \
         {replaced} pod replacement(s) ({replacing} ReplacingPod event(s)); {name} first moved off pod 0 after {legacy_first_moved:?}, \
         without a ready endpoint for about {legacy_empty:.0?} in all; write gaps through {name} (longest first: ms, ended ms after \
         the operator started) {:?}; {} writes acknowledged, {} lost; writer's other answers (count, answer):\n{errors}",
        &gaps[..gaps.len().min(4)],
        acks.len(),
        lost.len()
    );
    eprintln!(
        "realpods-redis-mig: {through_legacy}/{KEYS} keys through {name}, {through_master}/{KEYS} through {name}-master; \
         WAIT 2 -> {}; DBSIZE {sizes:?}; connected replicas {connected}; claims {claims_after:?}",
        waited.trim()
    );
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    assert_eq!(through_legacy, KEYS, "keys through {name}");
    assert_eq!(through_master, KEYS, "keys through {name}-master");
    assert_eq!(waited.trim(), "2", "both replicas acknowledge");
    assert_eq!(connected, "2", "{replication}");
    assert!(
        sizes.values().collect::<BTreeSet<_>>().len() == 1,
        "every member holds the same keys: {sizes:?}"
    );
    assert_eq!(claims_after, claims, "the claims");
    // The one write gap is the failover from pod 0 (its shutdown, then the Sentinels'); the
    // Redis issue's bound for a deleted master is 20 s.
    let longest = gaps.first().map_or(0, |g| g.0);
    stateward_testkit::report::millis_within_liveness("redis.takeover.write_gap", longest, 20_000);
    eprintln!("realpods-redis-mig: migration test took {:.1?}", test_started.elapsed());
    drop(op);
}
