//! PostgreSQL high availability on real pods: one primary and streaming hot
//! standbys, failover, switchover. A test makes a `PostgresCluster` with the local image and a
//! client pod of the same image that reaches the cluster through its Services; the scenarios of
//! one cluster's lifetime run as one chain (`chain`), the others on clusters of their own
//! (another spec, or a release before this one). Figures go to the run's report.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kube::Api;
use serde_json::{json, Value};
use stateward_testkit::real::{RealPods, Weight};
use stateward_testkit::TestEnv;

use super::e2e::{self, get_cr, summary, wait_for, POSTGRES};
use crate::now_ms;

mod app;
mod chain;
mod migration;
mod rolling;
mod scale;
use super::{kubectl_ok, pod_ready, sample, start_operator, PG_IMAGE};

/// Enters the real-pods cluster for the calling test (see [`RealPods::enter`]: None in the
/// test's own process, which re-runs it inside the cluster's network namespace) and starts the
/// operator `operator` there.
pub(super) async fn enter_with_operator(prefix: &str, operator: &str) -> Option<(TestEnv, e2e::Operator)> {
    let env = RealPods::enter(Weight::Medium, prefix).await.expect("real-pods cluster")?;
    let mut op = start_operator(&env, operator);
    op.wait_ready(Duration::from_secs(60)).await;
    Some((env, op))
}

/// The Events (events.k8s.io) regarding the object `name` in the test's namespace.
pub(crate) async fn events_of(env: &TestEnv, name: &str) -> Vec<k8s_openapi::api::events::v1::Event> {
    let events: Api<k8s_openapi::api::events::v1::Event> = env.api();
    events
        .list(&kube::api::ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect()
}

/// The Events of the custom resource `name`, oldest first, as "Type Reason: message".
pub(super) async fn cr_events(env: &TestEnv, name: &str) -> Vec<String> {
    let mut list = events_of(env, name).await;
    list.sort_by_key(|e| {
        e.event_time.as_ref().map(|t| t.0).or(e.deprecated_first_timestamp.as_ref().map(|t| t.0))
    });
    list.into_iter()
        .map(|e| {
            format!(
                "{} {}: {}",
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default()
            )
        })
        .collect()
}

/// A client pod of the PostgreSQL image: `psql` reaches the cluster's Services as the
/// superuser (its password from the credentials Secret), without TLS (quicker connections).
fn client_pod(cluster: &str) -> Value {
    let env = json!([
        { "name": "PGUSER", "value": "postgres" },
        { "name": "PGDATABASE", "value": "postgres" },
        { "name": "PGSSLMODE", "value": "disable" },
        { "name": "PGCONNECT_TIMEOUT", "value": "2" },
        { "name": "PGPASSWORD", "valueFrom": { "secretKeyRef": { "name": format!("{cluster}-credentials"), "key": "password" } } },
    ]);
    stateward_testkit::real::client_pod("client", PG_IMAGE, 999, env)
}

/// `psql -XAt -c sql` in `pod` (over its socket, as the server's user).
fn psql_in(env: &TestEnv, pod: &str, sql: &str) -> String {
    kubectl_ok(env, &["exec", pod, "-c", "postgres", "--", "psql", "-U", "postgres", "-XAtc", sql])
        .trim()
        .to_string()
}

/// A shell script run by the client pod; its stdout.
fn client_sh(env: &TestEnv, script: &str) -> String {
    kubectl_ok(env, &["exec", "client", "--", "sh", "-c", script])
}

/// The pods behind a Service, from its EndpointSlices (ready endpoints only).
pub(super) async fn endpoints(env: &TestEnv, service: &str) -> BTreeSet<String> {
    endpoint_pods(env, service).await.into_iter().map(|(name, _)| name).collect()
}

/// [`endpoints`] as (pod name, pod uid): a pod made again under the same name is another.
async fn endpoint_pods(env: &TestEnv, service: &str) -> BTreeSet<(String, String)> {
    let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> = env.api();
    let list = slices
        .list(&kube::api::ListParams::default().labels(&format!("kubernetes.io/service-name={service}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    list.iter()
        .flat_map(|s| s.endpoints.iter())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false))
        .filter_map(|e| {
            let r = e.target_ref.as_ref()?;
            Some((r.name.clone()?, r.uid.clone().unwrap_or_default()))
        })
        .collect()
}

/// A pod of a cluster as the API server has it.
#[derive(Debug, Clone)]
pub(super) struct PodState {
    pub(super) name: String,
    pub(super) uid: String,
    pub(super) deleting: bool,
    pub(super) ready: bool,
}

/// The pods of the cluster `instance`.
pub(super) async fn pods(env: &TestEnv, instance: &str) -> Vec<PodState> {
    let api: Api<k8s_openapi::api::core::v1::Pod> = env.api();
    let list = api
        .list(&kube::api::ListParams::default().labels(&format!("stateward.dev/instance={instance}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    list.into_iter()
        .map(|p| PodState {
            ready: p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
            name: p.metadata.name.unwrap_or_default(),
            uid: p.metadata.uid.unwrap_or_default(),
            deleting: p.metadata.deletion_timestamp.is_some(),
        })
        .collect()
}

/// The instances of status, as (pod, role, streaming).
fn instances(cr: &Value) -> Vec<(String, String, bool)> {
    cr.pointer("/status/instances")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|i| {
            (
                i["pod"].as_str().unwrap_or_default().to_string(),
                i["role"].as_str().unwrap_or_default().to_string(),
                i["streaming"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

fn current_primary(cr: &Value) -> String {
    cr.pointer("/status/currentPrimary").and_then(Value::as_str).unwrap_or_default().to_string()
}

/// Waits until `n` instances answer: one confirmed primary (also the target), the others
/// streaming standbys, `-rw` has the primary and `-ro` exactly the standbys. Returns the
/// primary and the standbys.
async fn wait_replicated(env: &TestEnv, name: &str, n: usize, timeout: Duration) -> (String, Vec<String>) {
    let api = POSTGRES.api(env);
    let (found, _) =
        wait_for(&format!("{name}: one primary and {} streaming standbys", n - 1), timeout, || {
            let api = api.clone();
            async move {
                let cr = get_cr(&api, name).await.ok_or("CR not found")?;
                let primary = current_primary(&cr);
                let target = cr.pointer("/status/targetPrimary").and_then(Value::as_str).unwrap_or_default();
                let inst = instances(&cr);
                let standbys: Vec<String> =
                    inst.iter().filter(|(_, r, s)| r == "replica" && *s).map(|(p, _, _)| p.clone()).collect();
                let primaries: Vec<&String> =
                    inst.iter().filter(|(_, r, _)| r == "primary").map(|(p, _, _)| p).collect();
                let rw = endpoints(env, &format!("{name}-rw")).await;
                let ro = endpoints(env, &format!("{name}-ro")).await;
                let ok = !primary.is_empty()
                    && primary == target
                    && primaries == [&primary]
                    && standbys.len() == n - 1
                    && rw == BTreeSet::from([primary.clone()])
                    && ro == standbys.iter().cloned().collect();
                if ok {
                    Ok((primary, standbys))
                } else {
                    Err(format!("rw {rw:?} ro {ro:?} instances {inst:?}; {}", summary(&cr)))
                }
            }
        })
        .await;
    found
}

/// Makes the cluster `name` of `replicas` instances and the client pod, and waits until it
/// replicates.
async fn make_cluster(
    env: &TestEnv,
    name: &str,
    replicas: u32,
    extra: Value,
) -> (String, Vec<String>, Duration) {
    let mut cr = sample("PostgresCluster", name, PG_IMAGE, replicas);
    if let (Some(spec), Value::Object(more)) = (cr["spec"].as_object_mut(), extra) {
        spec.extend(more);
    }
    let started = Instant::now();
    e2e::apply(env, &env.namespace, &cr);
    super::apply_json(env, &[client_pod(name)]);
    wait_replicated(env, name, replicas as usize, Duration::from_secs(420)).await;
    // The server certificate the host issues after the first pods started rolls them once:
    // the measurements start on a cluster the StatefulSet has finished rolling.
    let api = POSTGRES.api(env);
    wait_for(&format!("{name} rolled and converged"), Duration::from_secs(300), || {
        let api = api.clone();
        async move {
            let cr = get_cr(&api, name).await.ok_or("CR not found")?;
            if super::e2e::condition(&cr, "Progressing") == Some("False")
                && super::e2e::phase(&cr) == "Running"
            {
                Ok(())
            } else {
                Err(summary(&cr))
            }
        }
    })
    .await;
    let (primary, standbys) = wait_replicated(env, name, replicas as usize, Duration::from_secs(300)).await;
    pod_ready(env, "client", Duration::from_secs(60)).await;
    (primary, standbys, started.elapsed())
}

/// The writer: in the client pod, one `psql` session at a time commits numbered rows through
/// `-rw` as fast as it can and prints each acknowledged id with its commit time (ms, the
/// server's clock); a lost connection ends the session and a new one starts at once.
const WRITER: &str = r#"
: > /tmp/acks
until psql -h pg-rw -XAtqc 'create table if not exists w(id bigserial primary key, at timestamptz not null default clock_timestamp())'; do sleep 0.5; done
while [ ! -e /tmp/stop ]; do
  yes "insert into w default values returning id, (extract(epoch from at) * 1000)::bigint;" |
    psql "host=pg-rw keepalives_idle=1 keepalives_interval=1 keepalives_count=2 tcp_user_timeout=3000" \
      -XAtq -F ' ' -v ON_ERROR_STOP=1 >> /tmp/acks 2>> /tmp/errs
  sleep 0.05
done
echo done > /tmp/stopped
"#;

fn start_writer(env: &TestEnv) {
    client_sh(env, &format!("rm -f /tmp/stop /tmp/stopped; cat > /tmp/writer.sh <<'EOF'\n{WRITER}\nEOF\nnohup sh /tmp/writer.sh >/dev/null 2>&1 &"));
}

/// Stops the writer; its acknowledgements as (id, commit ms), in commit order.
fn stop_writer(env: &TestEnv) -> Vec<(u64, u64)> {
    client_sh(env, "touch /tmp/stop; for i in $(seq 100); do [ -e /tmp/stopped ] && break; sleep 0.1; done");
    let acks = client_sh(env, "cat /tmp/acks");
    let mut out: Vec<(u64, u64)> = acks
        .lines()
        .filter_map(|l| {
            let (id, ms) = l.trim().split_once(' ')?;
            Some((id.parse().ok()?, ms.parse().ok()?))
        })
        .collect();
    out.sort_by_key(|(_, ms)| *ms);
    out
}

/// The longest time between two acknowledged commits, and when it began.
fn write_gap(acks: &[(u64, u64)]) -> (u64, u64) {
    acks.windows(2).map(|w| (w[1].1 - w[0].1, w[0].1)).max().unwrap_or((0, 0))
}

/// Acknowledged ids that the cluster no longer has.
fn lost(env: &TestEnv, acks: &[(u64, u64)]) -> Vec<u64> {
    let present: BTreeSet<u64> = client_sh(env, "psql -h pg-rw -XAtc 'select id from w'")
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    acks.iter().map(|(id, _)| *id).filter(|id| !present.contains(id)).collect()
}

/// Waits until the writer has `at_least` acknowledged writes (a warm-up before a fault). The
/// bound is generous: beside the heavier real-pods tests a CI run saw 147 writes in 60 s.
async fn wait_acks(env: &TestEnv, at_least: usize) {
    wait_for(&format!("{at_least} acknowledged writes"), Duration::from_secs(180), || {
        let n = client_sh(env, "cat /tmp/acks 2>/dev/null | wc -l").trim().parse::<usize>().unwrap_or(0);
        async move {
            if n >= at_least {
                Ok(())
            } else {
                Err(format!("{n} so far"))
            }
        }
    })
    .await;
}

/// What [`fail_over_under_writes`] saw.
struct Failover {
    new: String,
    deleted: Instant,
    lost: Vec<u64>,
}

/// Must show 2's common part: while the writer commits through `-rw`, the primary `old`'s pod
/// is deleted with `--grace-period=0`; a new primary is confirmed, the writes resume, the
/// write gap (asserted within 15 s) and the acknowledged writes lost are printed
/// (`replication` says which kind).
async fn fail_over_under_writes(env: &TestEnv, old: &str, replication: &str) -> Failover {
    let api = POSTGRES.api(env);
    start_writer(env);
    wait_acks(env, 200).await;

    let deleted_ms = now_ms();
    let deleted = Instant::now();
    kubectl_ok(env, &["delete", "pod", old, "--grace-period=0", "--force"]);
    let (new, took) = wait_for("a new primary", Duration::from_secs(60), || {
        let api = api.clone();
        let old = old.to_string();
        async move {
            let cr = get_cr(&api, "pg").await.ok_or("CR not found")?;
            let p = current_primary(&cr);
            let target = cr.pointer("/status/targetPrimary").and_then(Value::as_str).unwrap_or_default();
            if !p.is_empty() && p != old && p == target {
                Ok(p)
            } else {
                Err(summary(&cr))
            }
        }
    })
    .await;
    eprintln!(
        "realpods-pg: primary {old} deleted (--grace-period=0); {new} confirmed primary {took:.1?} later"
    );
    // Writes through -rw resume on the new primary.
    let acked = client_sh(env, "cat /tmp/acks 2>/dev/null | wc -l").trim().parse::<usize>().unwrap_or(0);
    wait_acks(env, acked + 200).await;
    let acks = stop_writer(env);
    let (gap, gap_from) = write_gap(&acks);
    let lost = lost(env, &acks);
    eprintln!(
        "realpods-pg: failover write gap {gap} ms (last ack before {:.1} s after the delete was sent, \
         first after at {:.1} s); {} writes acknowledged, {} of them lost ({replication}): {:?}",
        gap_from.saturating_sub(deleted_ms) as f64 / 1000.0,
        (gap_from + gap).saturating_sub(deleted_ms) as f64 / 1000.0,
        acks.len(),
        lost.len(),
        &lost[..lost.len().min(20)],
    );
    // Liveness: a failover that never comes fails; a slow one is in the report.
    stateward_testkit::report::millis_within_liveness("pg.failover.write_gap", gap, 15_000);
    Failover { new, deleted, lost }
}

fn switchover_status(cr: &Value) -> (String, String, String) {
    let s = |k: &str| {
        cr.pointer(&format!("/status/switchover/{k}")).and_then(Value::as_str).unwrap_or_default().to_string()
    };
    (s("to"), s("phase"), s("message"))
}

/// Must show 2, synchronous: with `postgresql.synchronous` ANY 1 the primary waits for one
/// standby's flush before it acknowledges a commit (`synchronous_standby_names` set by the
/// plugin, both standbys `quorum` in `pg_stat_replication`), so the failover under the writer
/// loses no acknowledged write; the new primary gets the same setting.
#[tokio::test]
async fn synchronous_failover_under_write_load_loses_no_acknowledged_write() {
    let started = Instant::now();
    let Some((env, op)) = enter_with_operator("rp-pgsync", "realpods-pgsync").await else {
        return;
    };
    let sync = json!({ "postgresql": { "synchronous": { "method": "any", "number": 1 } } });
    let (old, _, _) = make_cluster(&env, "pg", 3, sync).await;
    let want = r#"ANY 1 ("pg-0", "pg-1", "pg-2")"#;
    let on = |pod: String| {
        let env = &env;
        move || {
            let names = psql_in(env, &pod, "show synchronous_standby_names");
            let states = psql_in(
                env,
                &pod,
                "select coalesce(string_agg(sync_state, ',' order by application_name), '') from pg_stat_replication",
            );
            async move {
                if names == want && states == "quorum,quorum" {
                    Ok(())
                } else {
                    Err(format!("{names:?} {states:?}"))
                }
            }
        }
    };
    wait_for("synchronous replication on the primary", Duration::from_secs(60), on(old.clone())).await;
    let Failover { new, lost, .. } =
        fail_over_under_writes(&env, &old, "synchronous replication, ANY 1").await;
    assert!(lost.is_empty(), "acknowledged writes lost with synchronous replication: {lost:?}");
    // The new primary: the same setting, both standbys confirming once the old one rejoined.
    wait_for("synchronous replication on the new primary", Duration::from_secs(120), on(new.clone())).await;
    eprintln!(
        "realpods-pg: synchronous (ANY 1) failover {old} -> {new}: 0 acknowledged writes lost; test took {:.1?}",
        started.elapsed()
    );
    drop(op);
}
