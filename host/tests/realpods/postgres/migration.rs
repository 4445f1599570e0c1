//! Upgrades: a PostgreSQL cluster made by the last release before the HA wave (commit a3d9881)
//! is converted in place, data-safely, to the primary-and-standbys topology. That release ran
//! three independent servers (each pod's own initdb), `-rw` selecting pod 0 by its name; this
//! build patches the same StatefulSet (same name, selector, serviceName and claim templates),
//! keeps pod 0's database as the cluster's, and re-clones every other member from it, keeping
//! each one's former data directory aside on its volume (`pgdata.foreign-<system id>`). No
//! claim is deleted and no former independent server is ever promoted.
//!
//! The old release's objects come from `host/tests/fixtures/last-release/postgres.yaml`, applied
//! here as its operator applied them, before this build's operator starts.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stateward_testkit::LoopbackCert;

use super::*;
use crate::e2e::last_release;

/// The local image has no `docker-entrypoint.sh`; what the official one did for these pods
/// (no init scripts, `POSTGRES_DB` unset): on an empty `$PGDATA`, initdb with the superuser's
/// password from the Secret (initdb's own `trust` for the socket and loopback), host
/// connections by SCRAM, then the container's arguments (`postgres -c config_file=…`).
const OLD_ENTRYPOINT: &str = r#"set -eu
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    initdb --username="$POSTGRES_USER" --pwfile="$pwfile" >/dev/null
    rm -f -- "$pwfile"
    printf 'host all all all scram-sha-256\n' >>"$PGDATA/pg_hba.conf"
fi
exec "$@"
"#;

/// Where this build keeps a former independent server's data (beside `pgdata`).
const DATA_MOUNT: &str = "/var/lib/postgresql/data";

/// `sql` answered by a copy of the data directory kept aside on `pod`'s volume, started on a
/// spare port and socket inside its container and removed afterwards: the kept directory
/// itself is only read.
fn read_kept_aside(env: &TestEnv, pod: &str, sql: &str) -> String {
    let script = format!(
        r#"set -eu
kept=$(ls -d {DATA_MOUNT}/pgdata.foreign-*)
scratch=$(mktemp -d)
trap 'pg_ctl -D "$scratch/pgdata" -m fast -w stop >/dev/null 2>&1 || true; rm -rf -- "$scratch"' EXIT
cp -a -- "$kept" "$scratch/pgdata"
rm -f -- "$scratch/pgdata/postmaster.pid"
pg_ctl -D "$scratch/pgdata" -l "$scratch/log" -w -t 60 \
    -o "-c port=5499 -c listen_addresses=localhost -c unix_socket_directories=$scratch -c shared_buffers=16MB -c ssl=off" \
    start >/dev/null || {{ cat "$scratch/log" >&2; exit 1; }}
psql -h "$scratch" -p 5499 -U postgres -XAtc "$1"
"#
    );
    kubectl_ok(env, &["exec", pod, "-c", "postgres", "--", "sh", "-c", &script, "read-kept-aside", sql])
        .trim()
        .to_string()
}

/// For a failure: each member's state and the last lines of its container's log (its previous
/// one's too when it restarted), through the API server only.
fn member_logs(env: &TestEnv, pods: &[String]) -> String {
    let text = |args: &[&str]| {
        let out = crate::kubectl_in(env, args);
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    };
    let mut all = text(&["get", "pods", "-o", "wide"]);
    for p in pods {
        for previous in ["--previous=false", "--previous=true"] {
            all += &format!(
                "--- {p} ({previous})\n{}",
                text(&["logs", p, "-c", "postgres", "--tail=20", previous])
            );
        }
    }
    all
}

/// The requirement: the last release's three-member cluster, with 100 rows written to pod 0
/// and a row of its own on pod 1's independent server, is taken over by this build: every pod
/// ends on the StatefulSet's new revision, pod 0 the primary with both others streaming from
/// it; the status named no other primary at any time; the rows are read through `-rw` and on
/// every member; no claim was deleted or made again; each former independent server's data
/// is kept aside on its volume (pod 1's row is read from it).
#[tokio::test]
async fn a_cluster_of_the_last_release_is_converted_in_place_and_never_promotes_a_former_replica() {
    let test_started = Instant::now();
    let Some(env) = RealPods::enter(Weight::Medium, "rp-pgmig").await.expect("real-pods cluster") else {
        return;
    };
    let name = "legacy";
    let pod_names: Vec<String> = (0..3).map(|i| format!("{name}-{i}")).collect();
    let primary = pod_names[0].clone();
    let api = POSTGRES.api(&env);

    // The resource as the old release left it, with its children: the local image, and for a
    // command what the official image's entrypoint did (see OLD_ENTRYPOINT).
    let text = last_release::fixture_text("postgres.yaml")
        .replace("main-pg", name)
        .replace("'17.2'", "'15'")
        .replace("image: postgres:17.2", &format!("image: {PG_IMAGE}"));
    let cert = LoopbackCert::generate().expect("a certificate");
    let old_command = |sts: &mut Value| {
        let container = &mut sts["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["image"], json!(PG_IMAGE), "the fixture's image substituted");
        container["command"] = json!(["sh", "-c", OLD_ENTRYPOINT, "docker-entrypoint.sh"]);
    };
    let extra = json!({ "currentPrimary": primary });
    last_release::make(
        &env,
        &api,
        sample("PostgresCluster", name, PG_IMAGE, 3),
        "postgres@0.1.0",
        extra,
        |cr| last_release::children(&text, cr, &cert, old_command),
    )
    .await;
    crate::apply_json(&env, &[client_pod(name)]);
    for p in &pod_names {
        pod_ready(&env, p, Duration::from_secs(180)).await;
    }
    pod_ready(&env, "client", Duration::from_secs(60)).await;

    // Three unrelated databases, as that release made them: 100 rows on pod 0 (behind -rw), a
    // row of its own on pod 1.
    psql_in(
        &env,
        &primary,
        "create table t(id int primary key); insert into t select generate_series(1, 100)",
    );
    psql_in(
        &env,
        &pod_names[1],
        "create table stray(note text); insert into stray values ('written to legacy-1 alone')",
    );
    let system_ids: BTreeMap<String, String> = pod_names
        .iter()
        .map(|p| (p.clone(), psql_in(&env, p, "select system_identifier from pg_control_system()")))
        .collect();
    assert_eq!(
        system_ids.values().collect::<BTreeSet<_>>().len(),
        3,
        "three independent servers: {system_ids:?}"
    );
    assert_eq!(client_sh(&env, &format!("psql -h {name}-rw -XAtc 'select sum(id) from t'")).trim(), "5050");
    let claims = e2e::pvc_uids(&env, name).await;
    assert_eq!(claims.len(), 3, "{claims:?}");
    let mut rollout = last_release::Rollout::default();
    rollout.poll(&env, name, &pod_names).await;
    eprintln!(
        "realpods-pg: the last release's cluster up {:.1?} into the test: system identifiers {system_ids:?}, claims {claims:?}",
        test_started.elapsed()
    );

    // This build takes over.
    let started = Instant::now();
    let mut op = start_operator(&env, "realpods-pgmig");
    op.wait_ready(Duration::from_secs(60)).await;

    // Polled every second until converged: every pod on the StatefulSet's current revision and
    // Ready, pod 0 the confirmed primary behind -rw, the two others streaming behind -ro. Every
    // primary the status names on the way is kept: a former independent server must never be
    // one. Pods made again are counted by their uids.
    let (mut named_current, mut named_target) = (BTreeSet::new(), BTreeSet::new());
    let (mut first_streaming, mut rw_empty, mut last_poll) = (None, Duration::ZERO, Instant::now());
    let mut last = String::new();
    let converged = loop {
        if started.elapsed() > Duration::from_secs(300) {
            panic!(
                "not converged 300 s after the operator started: {last}\nevents: {:#?}\n{}",
                cr_events(&env, name).await,
                member_logs(&env, &pod_names)
            );
        }
        let Some(cr) = get_cr(&api, name).await else {
            panic!("the resource is gone");
        };
        let current = current_primary(&cr);
        let target =
            cr.pointer("/status/targetPrimary").and_then(Value::as_str).unwrap_or_default().to_string();
        named_current.insert(current.clone());
        named_target.insert(target.clone());
        let inst = instances(&cr);
        let standbys: BTreeSet<String> =
            inst.iter().filter(|(_, r, s)| r == "replica" && *s).map(|(p, _, _)| p.clone()).collect();
        let primaries: Vec<&String> =
            inst.iter().filter(|(_, r, _)| r == "primary").map(|(p, _, _)| p).collect();
        if first_streaming.is_none() && !standbys.is_empty() {
            first_streaming = Some(started.elapsed());
        }
        let rw = endpoints(&env, &format!("{name}-rw")).await;
        let ro = endpoints(&env, &format!("{name}-ro")).await;
        if rw.is_empty() {
            rw_empty += last_poll.elapsed();
        }
        last_poll = Instant::now();
        let last_release::Seen { on_delete, revision, outdated, .. } =
            rollout.poll(&env, name, &pod_names).await;
        let ok = on_delete
            && outdated.is_empty()
            && current == primary
            && target == primary
            && primaries == [&primary]
            && standbys == pod_names[1..].iter().cloned().collect::<BTreeSet<String>>()
            && rw == BTreeSet::from([primary.clone()])
            && ro == standbys;
        if ok {
            break started.elapsed();
        }
        last = format!(
            "OnDelete {on_delete}, not Ready on revision {revision:?}: {outdated:?}; current {current:?} target {target:?}; \
             rw {rw:?} ro {ro:?}; instances {inst:?}; {}",
            summary(&cr)
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };

    // Never promoted: the status named pod 0 as the primary, and nothing else, all along (an
    // empty value is none named yet).
    let named: BTreeSet<&String> =
        named_current.iter().chain(&named_target).filter(|p| !p.is_empty()).collect();
    assert_eq!(
        named,
        BTreeSet::from([&primary]),
        "primaries named on the way: current {named_current:?}, target {named_target:?}"
    );
    // Pod 0 confirmed as the primary, and no failover or switchover (to another pod) on the
    // way. (Events follow the status writes: waited for.)
    let (events, _) = wait_for("PrimaryConfirmed for legacy-0", Duration::from_secs(30), || {
        let env = &env;
        async move {
            let events = cr_events(env, "legacy").await;
            if events.iter().any(|e| e.contains("PrimaryConfirmed: legacy-0 ")) {
                Ok(events)
            } else {
                Err(format!("{events:#?}"))
            }
        }
    })
    .await;
    eprintln!("realpods-pg: events: {events:#?}");
    // (Pod 0 itself promoted again after a restart would still be pod 0: not looked for here.)
    for reason in ["FailingOver", "SwitchoverDone"] {
        assert!(!events.iter().any(|e| e.contains(&format!(" {reason}:"))), "{reason}: {events:#?}");
    }

    // The rows, through -rw and on every member, all of them copies of pod 0's database now.
    assert_eq!(
        client_sh(&env, &format!("psql -h {name}-rw -XAtc 'select count(*), sum(id) from t'")).trim(),
        "100|5050"
    );
    for p in &pod_names {
        assert_eq!(psql_in(&env, p, "select count(*), sum(id) from t"), "100|5050", "{p}");
        assert_eq!(
            psql_in(&env, p, "select system_identifier from pg_control_system()"),
            system_ids[&primary],
            "{p} serves pod 0's database"
        );
        assert_eq!(
            psql_in(&env, p, "select pg_is_in_recovery()"),
            if *p == primary { "f" } else { "t" },
            "{p}"
        );
    }
    let cr = get_cr(&api, name).await.expect("CR");
    assert_eq!(
        cr.pointer("/status/systemIdentifier"),
        Some(&json!(system_ids[&primary])),
        "{}",
        cr["status"]
    );

    // No claim deleted or made again.
    assert_eq!(e2e::pvc_uids(&env, name).await, claims, "the claims");

    // Each former independent server's data kept aside on its own volume, under its own system
    // identifier; pod 1's row read back from it.
    for p in &pod_names[1..] {
        let kept = kubectl_ok(
            &env,
            &["exec", p, "-c", "postgres", "--", "sh", "-c", &format!("ls -d {DATA_MOUNT}/pgdata.foreign-*")],
        );
        let kept: Vec<&str> = kept.lines().collect();
        assert_eq!(kept, [format!("{DATA_MOUNT}/pgdata.foreign-{}", system_ids[p])], "{p}");
    }
    let on_pod_0 = kubectl_ok(
        &env,
        &[
            "exec",
            &primary,
            "-c",
            "postgres",
            "--",
            "sh",
            "-c",
            &format!("ls -d {DATA_MOUNT}/pgdata.* | wc -l"),
        ],
    );
    assert_eq!(on_pod_0.trim(), "0", "pod 0's data is the cluster's: nothing set aside beside it");
    let stray = read_kept_aside(&env, &pod_names[1], "select note from stray");
    assert_eq!(stray, "written to legacy-1 alone");
    let startlog = kubectl_ok(
        &env,
        &["exec", &pod_names[1], "-c", "postgres", "--", "cat", &format!("{DATA_MOUNT}/stateward.log")],
    );
    let kept_lines: Vec<&str> =
        startlog.lines().filter(|l| l.contains("kept as") || l.contains("cloning")).collect();

    let replaced = rollout.replaced();
    let replacing = events.iter().filter(|e| e.contains(" ReplacingPod:")).count();
    eprintln!(
        "realpods-pg: the last release's cluster converted {converged:.1?} after this build's operator started \
         (first standby streaming after {first_streaming:.1?}); {replaced} pod replacement(s) ({replacing} ReplacingPod event(s)); \
         {name}-rw without a ready endpoint for about {rw_empty:.0?} of it; primaries named: current {named_current:?}, \
         target {named_target:?}; {}'s start log:\n  {}",
        pod_names[1],
        kept_lines.join("\n  ")
    );
    eprintln!("realpods-pg: migration test took {:.1?}", test_started.elapsed());
    drop(op);
}
