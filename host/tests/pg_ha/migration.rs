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
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use serde::Deserialize as _;
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};
use stateward_testkit::LoopbackCert;

use super::*;

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

/// A password like the ones the old host generated (24 characters of its alphabet).
fn random_password() -> String {
    use rand::RngExt as _;
    const ALPHABET: &[u8] = b"ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789";
    let mut rng = rand::rng();
    (0..24).map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())])).collect()
}

/// The status the last release left on a converged three-member cluster: its host's phase,
/// conditions, observedGeneration and plugin stamp, its plugin's `currentPrimary` (always pod
/// 0) and `readyReplicas`. (`pluginDigest`, the old build's, is left out: nothing reads it.)
fn last_release_status(name: &str, generation: i64) -> Value {
    let now = format!("{:.0}", k8s_openapi::jiff::Timestamp::now());
    let condition = |type_: &str, status: &str, reason: &str, message: &str| {
        json!({
            "type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": now,
        })
    };
    json!({
        "phase": "Running",
        "conditions": [
            condition("Available", "True", "AllReplicasReady", "3 of 3 replicas ready"),
            condition("Progressing", "False", "Converged", "3 of 3 replicas ready"),
            condition("Degraded", "False", "AsExpected", "nothing has failed"),
        ],
        "observedGeneration": generation,
        "plugin": "postgres@0.1.0",
        "readyReplicas": 3,
        "currentPrimary": format!("{name}-0"),
    })
}

/// The last release's children of the resource `name`, from the fixture (see its header), as
/// its operator left them: every object but the Secrets controlled by the resource
/// (`owner_reference`); the Secrets (no owner reference, as its host created them) hold
/// `password` and the certificate `cert` with the expiry annotation its certificate keeper
/// wrote, and the pod template carries the keeper's stamp of that certificate. The image is the
/// local one and the container's command does what the official image's entrypoint did.
fn last_release_objects(
    name: &str,
    owner_reference: &Value,
    password: &str,
    cert: &LoopbackCert,
) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/last-release/postgres.yaml");
    let text = std::fs::read_to_string(&path).expect("the last release's fixture");
    let text = text
        .replace("main-pg", name)
        .replace("'17.2'", "'15'")
        .replace("image: postgres:17.2", &format!("image: {PG_IMAGE}"));
    // What the old keeper stamped on the pod template (stamp_pod_template at a3d9881): over
    // each mounted certificate Secret's name and the digest of its tls.crt.
    let tls = format!("{name}-tls");
    let mut h = Sha256::new();
    h.update(tls.as_bytes());
    h.update([0]);
    h.update(Sha256::digest(cert.cert_pem.as_bytes()));
    let stamp = hex::encode(h.finalize());
    // The certificate lives longer than this (rcgen's default); the old keeper wrote the expiry.
    let not_after = k8s_openapi::jiff::Timestamp::now().as_second() + 365 * 24 * 3600;

    let mut objects = Vec::new();
    for doc in yaml_serde::Deserializer::from_str(&text) {
        let mut o = Value::deserialize(doc).expect("fixture yaml");
        if o.is_null() {
            continue;
        }
        if let Some(meta) = o["metadata"].as_object_mut() {
            meta.remove("namespace");
        }
        let object_name = o["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let kind = o["kind"].as_str().unwrap_or_default().to_string();
        match kind.as_str() {
            "Secret" if object_name == format!("{name}-credentials") => {
                o["stringData"] = json!({ "password": password });
            }
            "Secret" if object_name == tls => {
                o["stringData"] =
                    json!({ "tls.crt": cert.cert_pem, "tls.key": cert.key_pem, "ca.crt": cert.ca_pem });
                o["metadata"]["annotations"]["stateward.dev/cert-not-after"] = json!(not_after.to_string());
            }
            "Secret" => panic!("a Secret the fixture should not have: {object_name}"),
            _ => {
                o["metadata"]["ownerReferences"] = json!([owner_reference]);
                if kind == "StatefulSet" {
                    let container = &mut o["spec"]["template"]["spec"]["containers"][0];
                    assert_eq!(container["image"], json!(PG_IMAGE), "the fixture's image substituted");
                    container["command"] = json!(["sh", "-c", OLD_ENTRYPOINT, "docker-entrypoint.sh"]);
                    o["spec"]["template"]["metadata"]["annotations"]["stateward.dev/certificates-sha256"] =
                        json!(stamp);
                }
            }
        }
        objects.push(o);
    }
    objects
}

/// Applies `objects` as the last release's host did: server-side apply, field manager
/// `stateward`, forced. The manager matters: this build applies with the same one, so what the
/// old release set and this one no longer does (the container's args and `POSTGRES_USER`, the
/// rolling-update partition, `-rw`'s pod-name selector) goes with its first apply, as in a real
/// upgrade. (The old keeper's certificate stamp was a merge patch of its own; applying it here
/// with the rest changes nothing this build reads.)
fn apply_as_last_release(env: &TestEnv, objects: &[Value]) {
    let list = json!({ "apiVersion": "v1", "kind": "List", "items": objects });
    let out = e2e::kubectl_stdin(
        env,
        &[
            "apply",
            "-n",
            &env.namespace,
            "--server-side",
            "--field-manager=stateward",
            "--force-conflicts",
            "-f",
            "-",
        ],
        &list.to_string(),
    );
    assert!(
        out.status.success(),
        "applying the last release's objects: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

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

/// The pods of the cluster `instance` (none on an error: the caller polls).
async fn instance_pods(env: &TestEnv, instance: &str) -> Vec<Pod> {
    let pods: Api<Pod> = env.api();
    let by_instance = ListParams::default().labels(&format!("{}={instance}", e2e::INSTANCE_LABEL));
    pods.list(&by_instance).await.map(|l| l.items).unwrap_or_default()
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

/// Whether the pod is Ready.
fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
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
    let Some(env) = RealPods::enter(
        "pg_ha::migration::a_cluster_of_the_last_release_is_converted_in_place_and_never_promotes_a_former_replica",
        "rp-pgmig",
    )
    .await
    .expect("real-pods cluster")
    else {
        return;
    };
    let name = "legacy";
    let pod_names: Vec<String> = (0..3).map(|i| format!("{name}-{i}")).collect();
    let primary = pod_names[0].clone();
    let api = POSTGRES.api(&env);

    // The resource as the old release left it: made and reconciled by it (its finalizer, its
    // status), before this build's operator runs. The CRDs are this build's (the old status
    // fits them); the operator's start would install them, so that is done here first.
    e2e::prepare(&env);
    let mut cr = sample("PostgresCluster", name, PG_IMAGE, 3);
    cr["metadata"]["finalizers"] = json!([e2e::FINALIZER]);
    e2e::apply(&env, &env.namespace, &cr);
    let created = get_cr(&api, name).await.expect("CR");
    let generation = created.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(1);
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({ "status": last_release_status(name, generation) })),
    )
    .await
    .expect("the last release's status");
    let cert = LoopbackCert::generate().expect("a certificate");
    // The owner reference the old applier set (owner_reference at a3d9881).
    let owner = json!({
        "apiVersion": cr["apiVersion"], "kind": cr["kind"], "name": name,
        "uid": created["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true,
    });
    assert!(owner["uid"].is_string(), "{created}");
    apply_as_last_release(&env, &last_release_objects(name, &owner, &random_password(), &cert));
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
    let mut uids: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for p in instance_pods(&env, name).await {
        uids.entry(p.metadata.name.unwrap_or_default())
            .or_default()
            .insert(p.metadata.uid.unwrap_or_default());
    }
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
    let sets: Api<StatefulSet> = env.api();
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
        let now = instance_pods(&env, name).await;
        for p in &now {
            uids.entry(p.metadata.name.clone().unwrap_or_default())
                .or_default()
                .insert(p.metadata.uid.clone().unwrap_or_default());
        }
        let set = sets.get_opt(name).await.ok().flatten();
        let on_delete = set
            .as_ref()
            .and_then(|s| s.spec.as_ref())
            .and_then(|s| s.update_strategy.as_ref())
            .and_then(|u| u.type_.as_deref())
            == Some("OnDelete");
        let revision = set.as_ref().and_then(|s| s.status.as_ref()).and_then(|s| s.update_revision.clone());
        let outdated: Vec<String> = pod_names
            .iter()
            .filter(|n| {
                !now.iter().any(|p| {
                    p.metadata.name.as_ref() == Some(*n)
                        && p.metadata.deletion_timestamp.is_none()
                        && ready(p)
                        && revision.is_some()
                        && p.metadata.labels.as_ref().and_then(|l| l.get("controller-revision-hash"))
                            == revision.as_ref()
                })
            })
            .cloned()
            .collect();
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

    let replaced = uids.values().map(|u| u.len() - 1).sum::<usize>();
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
