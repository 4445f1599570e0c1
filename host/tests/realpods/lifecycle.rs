//! The lifecycle verbs every kind shares, on real servers, with one test body for the three
//! kinds: `kubectl stateward fence` takes a pod out of every client Service and stops it taking
//! writes, `unfence` brings it back; `kubectl stateward pause` holds a spec change and a
//! `restart` until `resume`, which rolls the pods in the service's safe order; `kubectl
//! stateward hibernate` stops every pod and keeps the volumes and Secrets, `kubectl stateward
//! wake` starts the same pods on them, and what was written before is read back.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde_json::{json, Value};
use stateward_testkit::real::{RealPods, Weight};
use stateward_testkit::TestEnv;

use super::e2e::{self, condition, get_cr, summary, wait_for, Kind, INSTANCE_LABEL};
use super::{kubectl_ok, OPENSEARCH_IMAGE, PG_IMAGE, REDIS_IMAGE};

/// One kind's resource, and how its data is written and read back inside its pods.
struct Case {
    kind: Kind,
    name: &'static str,
    cr: Value,
    /// The pod that takes writes now, from the status (the primary, the master).
    writer: fn(&Value) -> Option<String>,
    /// The container commands are run in.
    container: &'static str,
    write: Vec<&'static str>,
    read: Vec<&'static str>,
    /// What `read` prints once the data is all there.
    expected: &'static str,
    /// Run in the fenced pod: a write, refused while fenced (printing `refused`), taken after.
    probe: Vec<&'static str>,
    refused: &'static str,
    /// Run in the pod once unfenced: what it prints then contains `resumed_says`.
    resumed: Vec<&'static str>,
    resumed_says: &'static str,
    /// The pod a rolling restart replaces last, from the status before it (the service's safe
    /// order: the primary or master after a switchover, Elasticsearch's lowest ordinal).
    last: fn(&Value) -> Option<String>,
    /// Whether the writes move to another pod before the last one is replaced.
    switches_over: bool,
}

fn status_field(field: &'static str) -> impl Fn(&Value) -> Option<String> {
    move |cr| cr.pointer(field).and_then(Value::as_str).filter(|p| !p.is_empty()).map(str::to_string)
}

/// Documents for Elasticsearch's `_bulk`: five, into an index with no replica.
const BULK: &str = r#"curl -sSf -XPUT -H 'Content-Type: application/json' http://127.0.0.1:9200/kept -d '{"settings":{"number_of_replicas":0}}' >/dev/null &&
for i in 1 2 3 4 5; do printf '{"index":{"_id":"%s"}}\n{"n":%s}\n' $i $i; done |
curl -sSf -XPOST -H 'Content-Type: application/x-ndjson' 'http://127.0.0.1:9200/kept/_bulk?refresh=true' --data-binary @- >/dev/null"#;

fn cases() -> Vec<Case> {
    let pg = super::sample("PostgresCluster", "pg", PG_IMAGE, 2);
    let redis = super::sample("RedisCluster", "cache", REDIS_IMAGE, 3);
    let resources =
        json!({ "requests": { "cpu": "50m", "memory": "600Mi" }, "limits": { "cpu": "1", "memory": "1Gi" } });
    let es = json!({
        "apiVersion": "stateward.dev/v1", "kind": "ElasticsearchCluster",
        "metadata": { "name": "logs" },
        "spec": {
            "distribution": "opensearch", "version": "2.19.6", "image": OPENSEARCH_IMAGE,
            "replicas": 3, "storage": { "size": "1Gi" },
            "retentionPolicy": "Delete", "deletionProtection": false, "resources": resources,
            "parameters": { "cluster.routing.allocation.disk.threshold_enabled": "false" },
        },
    });
    vec![
        Case {
            kind: e2e::POSTGRES,
            name: "pg",
            cr: pg,
            writer: |cr| status_field("/status/currentPrimary")(cr),
            container: "postgres",
            write: vec![
                "psql",
                "-U",
                "postgres",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                "create table kept as select generate_series(1, 100) as id",
            ],
            read: vec!["psql", "-U", "postgres", "-tAc", "select count(*) || ' ' || sum(id) from kept"],
            expected: "100 5050",
            probe: vec!["psql", "-U", "postgres", "-c", "create temp table probe(i int)"],
            refused: "read-only transaction",
            resumed: vec!["psql", "-U", "postgres", "-c", "create temp table probe(i int)"],
            resumed_says: "CREATE TABLE",
            last: |cr| status_field("/status/currentPrimary")(cr),
            switches_over: true,
        },
        Case {
            kind: e2e::REDIS,
            name: "cache",
            cr: redis,
            writer: |cr| status_field("/status/master")(cr),
            container: "redis",
            write: vec![
                "sh",
                "-c",
                "seq 1 100 | sed 's/.*/SET kept:& &/' | redis-cli -h 127.0.0.1 --no-auth-warning >/dev/null && \
                 redis-cli -h 127.0.0.1 --no-auth-warning WAIT 2 10000",
            ],
            read: vec!["sh", "-c", "redis-cli -h 127.0.0.1 --no-auth-warning --scan --pattern 'kept:*' | wc -l"],
            expected: "100",
            probe: vec!["redis-cli", "-h", "127.0.0.1", "--no-auth-warning", "SET", "probe", "1"],
            refused: "NOREPLICAS",
            resumed: vec!["redis-cli", "-h", "127.0.0.1", "--no-auth-warning", "SET", "probe", "1"],
            resumed_says: "OK",
            last: |cr| status_field("/status/master")(cr),
            switches_over: true,
        },
        Case {
            kind: e2e::ELASTICSEARCH,
            name: "logs",
            cr: es,
            writer: |_| Some("logs-0".into()),
            container: "elasticsearch",
            write: vec!["sh", "-c", BULK],
            read: vec!["curl", "-sS", "--max-time", "10", "http://127.0.0.1:9200/kept/_count?filter_path=count"],
            expected: r#"{"count":5}"#,
            // A node takes writes through the shards it holds: the fenced one holds none.
            probe: vec!["sh", "-c", "curl -sSf 'http://127.0.0.1:9200/_cat/shards?h=node' | grep -qx \"$HOSTNAME\" && echo holds shards || echo no shard"],
            refused: "no shard",
            // Unfenced, it may hold shards again (none has to move back).
            resumed: vec![
                "sh",
                "-c",
                "curl -sSf 'http://127.0.0.1:9200/_cluster/settings?flat_settings=true' | grep -q \"$HOSTNAME\" && echo excluded || echo allocatable",
            ],
            resumed_says: "allocatable",
            // One node set, highest ordinal first.
            last: |_| Some("logs-0".into()),
            switches_over: false,
        },
    ]
}

fn exec(env: &TestEnv, pod: &str, container: &str, command: &[&str]) -> Result<String, String> {
    let mut args = vec!["exec", pod, "-c", container, "--"];
    args.extend_from_slice(command);
    let out = super::kubectl_in(env, &args);
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("{text}{}", String::from_utf8_lossy(&out.stderr)))
    }
}

/// Waits until the case's writer pod reads back what was written; how long it took.
async fn reads_back(env: &TestEnv, case: &Case, timeout: Duration) -> Duration {
    let api = case.kind.api(env);
    let what = format!("{} {}: the data read back", case.kind.kind, case.name);
    let (_, took) = wait_for(&what, timeout, || {
        let api = api.clone();
        async move {
            let cr = get_cr(&api, case.name).await.ok_or("CR not found")?;
            let pod = (case.writer)(&cr).ok_or_else(|| format!("no writer yet: {}", summary(&cr)))?;
            match exec(env, &pod, case.container, &case.read) {
                Ok(text) if text == case.expected => Ok(()),
                Ok(text) => Err(format!("{pod} read {text:?}")),
                Err(e) => Err(format!("{pod}: {e}")),
            }
        }
    })
    .await;
    took
}

/// The pod `case` writes to now, or for Elasticsearch the node that holds the index's shard.
fn fence_target(env: &TestEnv, case: &Case, cr: &Value) -> Option<String> {
    if case.kind.kind != e2e::ELASTICSEARCH.kind {
        return (case.writer)(cr);
    }
    let cat = exec(
        env,
        "logs-0",
        case.container,
        &["curl", "-sSf", "http://127.0.0.1:9200/_cat/shards/kept?h=node"],
    );
    cat.ok()?.lines().next().map(|l| l.trim().to_string()).filter(|n| !n.is_empty())
}

/// Waits until the pods in the case's client Services' endpoints are `want`; how long it took.
async fn endpoints_become(env: &TestEnv, case: &Case, want: &BTreeSet<String>, what: &str) -> Duration {
    let (_, took) = wait_for(&format!("{}: {what}", case.name), Duration::from_secs(60), || async {
        let now = e2e::client_endpoints(env, case.name).await;
        if now == *want {
            Ok(())
        } else {
            Err(format!("{now:?}"))
        }
    })
    .await;
    took
}

/// Fences the pod that takes the writes and unfences it, through `kubectl stateward`.
async fn fence_and_unfence(env: &TestEnv, case: &Case) {
    let api = case.kind.api(env);
    let cr = get_cr(&api, case.name).await.expect("CR");
    let pod = fence_target(env, case, &cr)
        .unwrap_or_else(|| panic!("{}: no pod to fence: {}", case.name, summary(&cr)));
    let pods: Api<Pod> = env.api();
    let uid = pods.get(&pod).await.expect("the pod").uid();
    // (Settled: the same two seconds apart.)
    let (served, _) = wait_for(
        &format!("{}: the client Services' endpoints", case.name),
        Duration::from_secs(60),
        || async {
            let first = e2e::client_endpoints(env, case.name).await;
            tokio::time::sleep(Duration::from_secs(2)).await;
            let then = e2e::client_endpoints(env, case.name).await;
            if first == then && then.contains(&pod) {
                Ok(then)
            } else {
                Err(format!("{first:?} then {then:?}"))
            }
        },
    )
    .await;
    let asked = Instant::now();
    e2e::kubectl_stateward(env, &["fence", case.name, &pod, "-n", &env.namespace]);
    let out_of: BTreeSet<String> = served.iter().filter(|p| **p != pod).cloned().collect();
    let left = endpoints_become(env, case, &out_of, &format!("{pod} out of every client Service")).await;
    let (said, refused) =
        wait_for(&format!("{}: {pod} takes no write", case.name), Duration::from_secs(180), || async {
            let said = match exec(env, &pod, case.container, &case.probe) {
                Ok(text) | Err(text) => text,
            };
            if said.contains(case.refused) {
                Ok(said)
            } else {
                Err(said)
            }
        })
        .await;
    let cr = get_cr(&api, case.name).await.expect("CR");
    assert_eq!(condition(&cr, "Fenced"), Some("True"), "{}", summary(&cr));
    assert_eq!(pods.get(&pod).await.expect("the fenced pod is kept").uid(), uid, "{pod} kept as it was");
    e2e::kubectl_stateward(env, &["unfence", case.name, "-n", &env.namespace]);
    let back = Instant::now();
    endpoints_become(env, case, &served, &format!("{pod} back in the client Services")).await;
    let (_, writable) =
        wait_for(&format!("{}: {pod} takes writes again", case.name), Duration::from_secs(120), || async {
            match exec(env, &pod, case.container, &case.resumed) {
                Ok(text) if text.contains(case.resumed_says) => Ok(()),
                Ok(text) | Err(text) => Err(text),
            }
        })
        .await;
    eprintln!(
        "realpods-lifecycle: {} {} fenced {pod}: out of the Services {left:.1?} and refusing writes {refused:.1?} after asked ({:?}), \
         {:.1?} in all; unfenced: back in the Services and writable {writable:.1?} later ({:.1?} in all)",
        case.kind.kind, case.name, said.trim(), asked.elapsed() - back.elapsed(), back.elapsed()
    );
}

/// A member pod as a roll sees it.
#[derive(Debug, Clone, PartialEq)]
struct Member {
    uid: String,
    ready: bool,
    /// The `stateward.dev/restarted-at` its template carried.
    restarted_at: Option<String>,
    /// The first container's CPU request.
    cpu: Option<String>,
}

async fn members(env: &TestEnv, instance: &str) -> BTreeMap<String, Member> {
    let pods: Api<Pod> = env.api();
    let list = pods
        .list(&ListParams::default().labels(&format!("{INSTANCE_LABEL}={instance}")))
        .await
        .expect("list pods");
    list.items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let status = p.status.clone().unwrap_or_default();
            let ready = status
                .conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let cpu = p
                .spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .and_then(|c| c.resources.as_ref()?.requests.as_ref()?.get("cpu").map(|q| q.0.clone()));
            let restarted_at = p.annotations().get("stateward.dev/restarted-at").cloned();
            (p.name_any(), Member { uid: p.uid().unwrap_or_default(), ready, restarted_at, cpu })
        })
        .collect()
}

/// `spec.paused` and `stateward.dev/restarted-at` for one kind. Paused, a spec change (a CPU
/// request) and a restart (`kubectl stateward restart`) are seen and not applied: no
/// StatefulSet written, no pod replaced, the status says Paused, for 10 s. Resumed, both are
/// applied by one rolling restart in the service's safe order: every pod replaced once, never
/// two members down at once, `case.last` last (after a switchover where the service has a
/// writer), and the data read back.
async fn paused_then_restarted(env: &TestEnv, case: &Case) {
    let api = case.kind.api(env);
    let sets: Api<StatefulSet> = env.api();
    let instance = ListParams::default().labels(&format!("{INSTANCE_LABEL}={}", case.name));
    let sets_now = || async {
        let list = sets.list(&instance).await.expect("StatefulSets");
        list.items.into_iter().map(|s| (s.name_any(), s.resource_version())).collect::<BTreeMap<_, _>>()
    };
    let cr = get_cr(&api, case.name).await.expect("CR");
    let last =
        (case.last)(&cr).unwrap_or_else(|| panic!("{}: no pod to replace last: {}", case.name, summary(&cr)));
    let ns = env.namespace.clone();
    let (sets_before, before) = (sets_now().await, members(env, case.name).await);

    e2e::kubectl_stateward(env, &["pause", case.name, "-n", &ns]);
    let target = format!("{}/{}", case.kind.plural, case.name);
    e2e::patch_ok(env, &ns, &target, &json!({"spec": {"resources": {"requests": {"cpu": "60m"}}}}));
    e2e::kubectl_stateward(env, &["restart", case.name, "-n", &ns]);
    let seen = e2e::wait_paused_seen(&api, case.name, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(sets_now().await, sets_before, "{}: a paused resource's StatefulSets were written", case.name);
    assert_eq!(members(env, case.name).await, before, "{}: a paused resource's pods changed", case.name);

    e2e::kubectl_stateward(env, &["resume", case.name, "-n", &ns]);
    let resumed = Instant::now();
    // Polled until every member is a new, Ready pod: when each was replaced, and how many
    // members were down (absent or not Ready) at once.
    let mut replaced: Vec<(String, Duration)> = Vec::new();
    let mut most_down = 0;
    let deadline = resumed + Duration::from_secs(600);
    loop {
        let now = members(env, case.name).await;
        for (name, old) in &before {
            let new_uid = now.get(name).is_some_and(|m| m.uid != old.uid);
            if new_uid && !replaced.iter().any(|(n, _)| n == name) {
                replaced.push((name.clone(), resumed.elapsed()));
            }
        }
        let down = before.keys().filter(|n| !now.get(*n).is_some_and(|m| m.ready)).count();
        most_down = most_down.max(down);
        if replaced.len() == before.len() && down == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{}: the rolling restart did not finish in 600 s: replaced {replaced:?}; now {now:#?}",
            case.name
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let rolled = resumed.elapsed();
    super::wait_converged(env, case.kind, case.name, Duration::from_secs(300)).await;
    let after = members(env, case.name).await;
    let cr = get_cr(&api, case.name).await.expect("CR");
    let stamp = cr
        .pointer("/metadata/annotations/stateward.dev~1restarted-at")
        .and_then(Value::as_str)
        .map(str::to_string);
    assert!(stamp.is_some(), "{}: kubectl stateward restart set no annotation", case.name);
    for (name, m) in &after {
        assert_ne!(before.get(name).map(|b| &b.uid), Some(&m.uid), "{}: {name} was not replaced", case.name);
        assert_eq!(
            (m.restarted_at.as_ref(), m.cpu.as_deref()),
            (stamp.as_ref(), Some("60m")),
            "{}: {name}",
            case.name
        );
    }
    let order: Vec<&str> = replaced.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(order.last(), Some(&last.as_str()), "{}: {last} goes last: {replaced:?}", case.name);
    assert!(most_down <= 1, "{}: {most_down} members down at once: {replaced:?}", case.name);
    let writer = (case.writer)(&cr);
    if case.switches_over {
        assert!(
            writer.as_ref().is_some_and(|w| *w != last),
            "{}: the writes moved off {last}: now {writer:?}",
            case.name
        );
    }
    let read = reads_back(env, case, Duration::from_secs(120)).await;
    eprintln!(
        "realpods-lifecycle: {} {} paused: the CPU request and the restart seen {seen:.1?} after asked, nothing \
         written for 10 s; resumed: rolled in {rolled:.1?}, in order {replaced:.1?}, one member down at a time, \
         writer {writer:?} after, {} read back {read:.1?} later",
        case.kind.kind, case.name, case.expected
    );
}

/// What must outlive a hibernation: each claim's uid, each Secret's uid and data.
async fn kept(env: &TestEnv, instance: &str) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let secrets: Api<Secret> = env.api();
    let list = secrets
        .list(&ListParams::default().labels(&format!("{INSTANCE_LABEL}={instance}")))
        .await
        .expect("list Secrets");
    let secrets = list
        .into_iter()
        .map(|s| (s.name_any(), format!("{} {:?}", s.uid().unwrap_or_default(), s.data)))
        .collect();
    (e2e::pvc_uids(env, instance).await, secrets)
}

async fn pods_left(env: &TestEnv, instance: &str) -> Result<usize, String> {
    let pods: Api<Pod> = env.api();
    let list = pods
        .list(&ListParams::default().labels(&format!("{INSTANCE_LABEL}={instance}")))
        .await
        .map_err(|e| e.to_string())?;
    Ok(list.items.len())
}

/// Must-show 6 of [in-cluster], fence → unfence, pause → restart → resume and hibernate → wake,
/// for the three kinds at once (PostgreSQL with a primary and a standby, Redis with a master,
/// two replicas and Sentinels, three OpenSearch nodes). The data is written; the pod that takes
/// the writes is fenced: it leaves every client Service's endpoints, stays as it was, and takes
/// no write (PostgreSQL read-only, Redis refusing, OpenSearch holding no shard), until
/// unfenced. Paused, a spec change and a restart wait; resumed, one roll applies them in the
/// service's safe order. Then every pod stops with its claims and Secrets kept, and after the
/// wake the same claims serve the same rows, keys and documents.
#[tokio::test]
async fn every_lifecycle_verb_keeps_the_data_of_every_kind() {
    // Alone: seven servers, three of them OpenSearch JVMs, woken at once took the 2 cores
    // long enough, beside the PostgreSQL failover tests, that neither side met its bounds.
    let Some(env) = RealPods::enter(Weight::Exclusive, "rp-life").await.expect("real-pods cluster") else {
        return;
    };
    let mut op = super::start_operator(&env, "lifecycle");
    op.wait_ready(Duration::from_secs(60)).await;
    let cases = cases();
    let created = Instant::now();
    for case in &cases {
        e2e::apply(&env, &env.namespace, &case.cr);
    }
    for case in &cases {
        super::wait_converged(&env, case.kind, case.name, Duration::from_secs(420)).await;
        let api = case.kind.api(&env);
        let (pod, _) = wait_for(
            &format!("{} {}: a writer", case.kind.kind, case.name),
            Duration::from_secs(120),
            || {
                let api = api.clone();
                async move {
                    let cr = get_cr(&api, case.name).await.ok_or("CR not found")?;
                    (case.writer)(&cr).ok_or_else(|| summary(&cr))
                }
            },
        )
        .await;
        let wrote = exec(&env, &pod, case.container, &case.write);
        assert!(wrote.is_ok(), "{} {}: writing on {pod}: {wrote:?}", case.kind.kind, case.name);
        reads_back(&env, case, Duration::from_secs(60)).await;
    }
    eprintln!("realpods-lifecycle: 3 kinds running with their data {:.1?} after create", created.elapsed());
    for case in &cases {
        fence_and_unfence(&env, case).await;
    }
    // The three rolls at once: each kind's order is its own.
    futures::future::join_all(cases.iter().map(|case| paused_then_restarted(&env, case))).await;

    let mut before = Vec::new();
    for case in &cases {
        before.push(kept(&env, case.name).await);
        e2e::kubectl_stateward(&env, &["hibernate", case.name, "-n", &env.namespace]);
    }
    let asleep = Instant::now();
    for (case, (claims, secrets)) in cases.iter().zip(&before) {
        let api = case.kind.api(&env);
        let (_, took) = wait_for(
            &format!("{} {} Hibernated", case.kind.kind, case.name),
            Duration::from_secs(300),
            || {
                let api = api.clone();
                let env = &env;
                async move {
                    let cr = get_cr(&api, case.name).await.ok_or("CR not found")?;
                    let left = pods_left(env, case.name).await?;
                    if condition(&cr, "Hibernated") == Some("True") && left == 0 {
                        Ok(())
                    } else {
                        Err(format!("{left} pod(s) left; {}", summary(&cr)))
                    }
                }
            },
        )
        .await;
        let sets: Api<StatefulSet> = env.api();
        let list = sets
            .list(&ListParams::default().labels(&format!("{INSTANCE_LABEL}={}", case.name)))
            .await
            .expect("StatefulSets");
        assert!(
            !list.items.is_empty()
                && list.items.iter().all(|s| s.spec.as_ref().and_then(|sp| sp.replicas) == Some(0)),
            "{}: StatefulSets at zero",
            case.name
        );
        let (now_claims, now_secrets) = kept(&env, case.name).await;
        assert_eq!(&now_claims, claims, "{}: the claims hibernate with the data", case.name);
        assert_eq!(&now_secrets, secrets, "{}: the Secrets stay as they were", case.name);
        let cr = get_cr(&api, case.name).await.expect("CR");
        assert_eq!(condition(&cr, "Available"), Some("False"), "{}", summary(&cr));
        eprintln!(
            "realpods-lifecycle: {} {} hibernated {took:.1?} after asked ({:.1?} into the step): 0 pods, {} claim(s) and the Secrets kept",
            case.kind.kind,
            case.name,
            asleep.elapsed(),
            claims.len()
        );
    }
    let shown = e2e::kubectl_stateward(&env, &["status", "pg", "-n", &env.namespace]);
    assert!(shown.contains("Hibernated"), "kubectl stateward status:\n{shown}");

    for case in &cases {
        e2e::kubectl_stateward(&env, &["wake", case.name, "-n", &env.namespace]);
    }
    let woke = Instant::now();
    for (case, (claims, secrets)) in cases.iter().zip(&before) {
        super::wait_converged(&env, case.kind, case.name, Duration::from_secs(420)).await;
        let ready = woke.elapsed();
        let read = reads_back(&env, case, Duration::from_secs(300)).await;
        assert_eq!(
            &kept(&env, case.name).await,
            &(claims.clone(), secrets.clone()),
            "{}: the same claims and Secrets",
            case.name
        );
        let cr = get_cr(&case.kind.api(&env), case.name).await.expect("CR");
        assert_eq!(condition(&cr, "Hibernated"), None, "{}", summary(&cr));
        let events = super::postgres::cr_events(&env, case.name).await;
        for reason in ["Hibernating", "Hibernated", "Waking"] {
            assert!(
                events.iter().any(|e| e.contains(&format!(" {reason}: "))),
                "{}: no {reason} Event: {events:#?}",
                case.name
            );
        }
        eprintln!(
            "realpods-lifecycle: {} {} woken: converged {ready:.1?} after asked, {} read back {:.1?} later",
            case.kind.kind, case.name, case.expected, read
        );
    }
    // The same pods of the same StatefulSets are back: nothing else to clean but the namespace.
    let _ = kubectl_ok(&env, &["get", "pods", "-o", "wide"]);
    drop(op);
}
