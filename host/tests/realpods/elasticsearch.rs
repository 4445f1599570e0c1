//! Elasticsearch on real pods, with OpenSearch (the Elasticsearch-compatible image built from
//! Maven Central): node sets with their own roles form one cluster, the bootstrap list goes
//! once it has formed, and its health is read over http into status, a condition and a Warning.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stateward_testkit::real::{RealPods, Weight};
use stateward_testkit::TestEnv;

use super::e2e::{self, get_cr, summary, wait_for};
use super::{kubectl_in, kubectl_ok, OPENSEARCH_IMAGE};

/// Masters (cluster-manager only) and data nodes (data and ingest), 512 MB heaps.
fn node_sets_cluster(name: &str) -> Value {
    let resources =
        json!({ "requests": { "cpu": "50m", "memory": "600Mi" }, "limits": { "cpu": "1", "memory": "1Gi" } });
    json!({
        "apiVersion": "stateward.dev/v1", "kind": "ElasticsearchCluster",
        "metadata": { "name": name },
        "spec": {
            "distribution": "opensearch",
            "version": "2.19.6", "image": OPENSEARCH_IMAGE,
            "storage": { "size": "1Gi" },
            "retentionPolicy": "Delete", "deletionProtection": false,
            "resources": resources,
            // The test node's disk may be fuller than a production one's.
            "parameters": { "cluster.routing.allocation.disk.threshold_enabled": "false" },
            "nodeSets": [
                { "name": "masters", "count": 3, "roles": ["master"] },
                { "name": "data", "count": 3, "roles": ["data", "ingest"] },
            ],
        },
    })
}

/// `curl` inside `pod` against its own node.
fn curl(env: &TestEnv, pod: &str, args: &[&str]) -> String {
    let mut full = vec!["exec", pod, "--", "curl", "-sS", "-f", "--max-time", "20"];
    full.extend_from_slice(args);
    kubectl_ok(env, &full)
}

/// 1 while the cluster behind `logs-http` says green with all 6 nodes joined, else 0 (for
/// [`super::ClientSampler`]).
const GREEN_WITH_SIX: &str =
    "curl -s -m 1 http://logs-http:9200/_cluster/health?filter_path=status,number_of_nodes \
    | tr -d \\\" | grep -c status:green,number_of_nodes:6";

/// [redundancy] must show 1 for OpenSearch: from before the new cluster could be Available, the
/// test's own client asks `_cluster/health` every 200 ms while the test reads the resource every
/// 200 ms. The first time it is Available or Running, the cluster is green with every node
/// joined (the first sample at or after that moment) and `Redundant` is True.
async fn available_only_when_green(env: &TestEnv) {
    let created_ms = super::now_ms();
    e2e::apply(env, &env.namespace, &node_sets_cluster("logs"));
    super::apply_json(
        env,
        &[stateward_testkit::real::client_pod("client", OPENSEARCH_IMAGE, 1000, json!([]))],
    );
    let promised = super::Promised {
        count: GREEN_WITH_SIX,
        want: 1,
        what: "green with every node joined",
        figure: "opensearch.six_nodes.available_after_create",
    };
    super::available_only_when(
        env,
        e2e::ELASTICSEARCH,
        "logs",
        created_ms,
        Duration::from_secs(420),
        promised,
    )
    .await;
}

/// Must-show 1 of the issue, and health read over http: `masters` (3, master only) and `data`
/// (3, data and ingest) form one green cluster; every node has the roles of its set; the
/// formation is recorded and the bootstrap list is emptied; an index whose replicas cannot all
/// be placed turns the cluster yellow, which becomes a Warning and ServiceHealthy=False, and
/// clears once it is green again.
#[tokio::test]
async fn opensearch_node_sets_form_one_green_cluster_with_their_roles() {
    let Some(env) = RealPods::enter(Weight::Heavy, "rp-es").await.expect("real-pods cluster") else {
        return;
    };
    let mut op = super::start_operator(&env, "es-sets");
    op.wait_ready(Duration::from_secs(60)).await;
    let api = e2e::ELASTICSEARCH.api(&env);
    let created = Instant::now();
    available_only_when_green(&env).await;
    let health = |want: &'static str| {
        let api = api.clone();
        move || {
            let api = api.clone();
            async move {
                let cr = get_cr(&api, "logs").await.ok_or("CR not found")?;
                let h = cr.pointer("/status/clusterHealth").cloned().unwrap_or(Value::Null);
                if h["status"] == want && (want != "green" || h["nodes"] == 6) {
                    Ok(cr)
                } else {
                    Err(format!("clusterHealth {h}; {}", summary(&cr)))
                }
            }
        }
    };
    let (cr, took) = wait_for("6 nodes green", Duration::from_secs(420), health("green")).await;
    eprintln!(
        "realpods[es]: 6 OpenSearch nodes green {took:.1?} after create: {}",
        cr["status"]["clusterHealth"]
    );
    stateward_testkit::report::seconds("opensearch.six_nodes.green_after_create", took, None);
    // Green with every node joined is redundant: every shard has its copies.
    // `Redundant` with this status, reason (any if empty) and a message containing `names`.
    let redundant = |want: &'static str, reason: &'static str, names: &'static str| {
        let api = api.clone();
        move || {
            let api = api.clone();
            async move {
                let cr = get_cr(&api, "logs").await.ok_or("CR not found")?;
                let c = super::condition_object(&cr, "Redundant");
                let message = c["message"].as_str().unwrap_or_default();
                if c["status"] == want
                    && (reason.is_empty() || c["reason"] == reason)
                    && message.contains(names)
                {
                    Ok(message.to_string())
                } else {
                    Err(format!("Redundant {c}"))
                }
            }
        }
    };
    wait_for("Redundant True at formation", Duration::from_secs(60), redundant("True", "", "green")).await;
    let formed_at = cr.pointer("/status/formation/formedAt").and_then(Value::as_u64);
    assert!(formed_at.is_some(), "no formation recorded: {}", summary(&cr));
    assert_eq!(
        cr.pointer("/status/formation/masters"),
        Some(&json!(["logs-masters-0", "logs-masters-1", "logs-masters-2"]))
    );

    // One StatefulSet per node set; every node with its set's roles, as the cluster says.
    for (set, roles) in [("masters", "m"), ("data", "di")] {
        // A node's readiness probe may miss one answer on a busy machine: wait for it.
        let what = format!("logs-{set}: 3 ready");
        wait_for(&what, Duration::from_secs(60), || {
            let args =
                ["get", "statefulset", &format!("logs-{set}"), "-o", "jsonpath={.status.readyReplicas}"];
            let ready = kubectl_ok(&env, &args);
            async move {
                if ready.trim() == "3" {
                    Ok(())
                } else {
                    Err(ready)
                }
            }
        })
        .await;
        let cat = curl(&env, "logs-data-0", &["http://127.0.0.1:9200/_cat/nodes?h=name,node.role"]);
        for i in 0..3 {
            let node = format!("logs-{set}-{i}");
            let line = cat.lines().find(|l| l.split_whitespace().next() == Some(&node));
            assert_eq!(line.and_then(|l| l.split_whitespace().nth(1)), Some(roles), "{node} in\n{cat}");
        }
    }
    let (nodes, _) = wait_for("status.nodes lists 6 nodes", Duration::from_secs(60), || {
        let api = api.clone();
        async move {
            let cr = get_cr(&api, "logs").await.ok_or("CR not found")?;
            match cr.pointer("/status/nodes").and_then(Value::as_array) {
                Some(n) if n.len() == 6 => Ok(n.clone()),
                _ => Err(summary(&cr)),
            }
        }
    })
    .await;
    for n in &nodes {
        let want = if n["name"].as_str().unwrap_or("").starts_with("logs-masters-") {
            json!(["cluster_manager"])
        } else {
            json!(["data", "ingest"])
        };
        assert_eq!(n["roles"], want, "{n}");
    }
    eprintln!("realpods[es]: roles from status.nodes: {}", Value::Array(nodes));

    // After formation no node is given the bootstrap list: the ConfigMap is empty at once,
    // no configuration file ever carried it, and each pod's mounted copy empties.
    let listed =
        kubectl_ok(&env, &["get", "configmap", "logs-bootstrap", "-o", "jsonpath={.data.initial-masters}"]);
    assert_eq!(listed, "", "the bootstrap list outlived the formation");
    let pods: Vec<String> =
        ["masters", "data"].iter().flat_map(|set| (0..3).map(move |i| format!("logs-{set}-{i}"))).collect();
    let emptied = Instant::now();
    for pod in &pods {
        let conf =
            kubectl_ok(&env, &["exec", pod, "--", "cat", "/usr/share/opensearch/config/opensearch.yml"]);
        assert!(!conf.contains("initial_cluster_manager_nodes"), "{pod}:\n{conf}");
        wait_for(&format!("{pod}'s bootstrap list emptied"), Duration::from_secs(150), || async {
            let out =
                kubectl_in(&env, &["exec", pod, "--", "cat", "/etc/stateward-bootstrap/initial-masters"]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            if out.status.success() && text.is_empty() {
                Ok(())
            } else {
                Err(format!("{text:?} {}", String::from_utf8_lossy(&out.stderr)))
            }
        })
        .await;
    }
    eprintln!(
        "realpods[es]: every pod's bootstrap list empty {:.1?} after the check began",
        emptied.elapsed()
    );

    // Three replicas on three data nodes: one copy cannot be placed, the cluster is yellow.
    let index = r#"{"settings":{"number_of_shards":1,"number_of_replicas":3}}"#;
    let url = "http://127.0.0.1:9200/notes";
    curl(&env, "logs-data-0", &["-X", "PUT", "-H", "Content-Type: application/json", url, "-d", index]);
    let yellowed = Instant::now();
    // Yellow at once, with all three replicas unassigned until two of them are placed: the
    // settled state is one unassigned copy.
    let (cr, took) = wait_for("clusterHealth yellow, one copy unassigned", Duration::from_secs(90), || {
        let api = api.clone();
        async move {
            let cr = get_cr(&api, "logs").await.ok_or("CR not found")?;
            let h = &cr["status"]["clusterHealth"];
            if h["status"] == "yellow" && h["unassignedShards"] == 1 {
                Ok(cr)
            } else {
                Err(format!("clusterHealth {h}"))
            }
        }
    })
    .await;
    assert_eq!(cr["status"]["clusterHealth"]["unassignedShards"], 1, "{}", cr["status"]["clusterHealth"]);
    eprintln!("realpods[es]: yellow {took:.1?} after the index");
    let condition = |want: &'static str| {
        let api = api.clone();
        move || {
            let api = api.clone();
            async move {
                let h = super::service_health(&api, "logs").await?;
                if h.starts_with(want) {
                    Ok(h)
                } else {
                    Err(h)
                }
            }
        }
    };
    let (h, _) = wait_for(
        "ServiceHealthy False/ClusterNotGreen",
        Duration::from_secs(90),
        condition("False/ClusterNotGreen"),
    )
    .await;
    // [redundancy] must show 3: a copy that cannot be placed is redundancy lacking, said so
    // with the count of unassigned copies and the copy named (the cluster's allocation
    // explanation, asked once the health is not green); True again once green.
    let (message, lacked) = wait_for(
        "Redundant False/ShardCopiesUnassigned naming index notes",
        Duration::from_secs(90),
        redundant("False", "ShardCopiesUnassigned", "index notes shard 0 (a replica"),
    )
    .await;
    assert!(message.contains("1 shard copies unassigned"), "{message}");
    stateward_testkit::report::seconds(
        "opensearch.copy_unplaced.redundant_false_after",
        yellowed.elapsed(),
        None,
    );
    eprintln!("realpods[es]: Redundant False {lacked:.1?} after the check began: {message}");
    let warning = super::warnings(&env, "logs", "ClusterNotGreen").await;
    assert!(!warning.is_empty(), "no ClusterNotGreen Warning");
    eprintln!("realpods[es]: {h} {:.1?} after the index; Warning: {}", yellowed.elapsed(), warning[0]);
    let settings = r#"{"index":{"number_of_replicas":1}}"#;
    let url = "http://127.0.0.1:9200/notes/_settings";
    curl(&env, "logs-data-0", &["-X", "PUT", "-H", "Content-Type: application/json", url, "-d", settings]);
    let greened = Instant::now();
    wait_for("clusterHealth green again", Duration::from_secs(60), health("green")).await;
    let (h, _) = wait_for("ServiceHealthy True again", Duration::from_secs(60), condition("True/")).await;
    wait_for("Redundant True again", Duration::from_secs(60), redundant("True", "", "")).await;
    stateward_testkit::report::seconds(
        "opensearch.copy_placed.redundant_again_after",
        greened.elapsed(),
        None,
    );
    eprintln!("realpods[es]: {h} {:.1?} after the replicas were lowered", greened.elapsed());

    // Must-show 3: an index of 3 shards with a replica each, 5 documents; `data` 3 -> 2. The
    // leaving node's shards move first, then its pod goes; never red, 5/5 at every read.
    let index = r#"{"settings":{"number_of_shards":3,"number_of_replicas":1}}"#;
    let json_put = |url: &str, body: &str| {
        curl(&env, "logs-data-0", &["-X", "PUT", "-H", "Content-Type: application/json", url, "-d", body]);
    };
    json_put("http://127.0.0.1:9200/docs", index);
    for i in 1..=5 {
        json_put(&format!("http://127.0.0.1:9200/docs/_doc/{i}?refresh=true"), &format!(r#"{{"n":{i}}}"#));
    }
    wait_for("green with the docs index", Duration::from_secs(120), health("green")).await;
    let shards_on = |node: &str| -> usize {
        let cat = curl(&env, "logs-masters-0", &["http://127.0.0.1:9200/_cat/shards/docs?h=node"]);
        cat.lines().filter(|l| l.trim() == node).count()
    };
    let before = shards_on("logs-data-2");
    assert!(before > 0, "the leaving node holds shards of the index");
    let samples = std::cell::RefCell::new(Vec::<(String, String)>::new());
    // Health and the document count from a node that stays, as a client would see them.
    let sample = |from: &str| {
        let get = |path: &str, field: &str| {
            let url = format!("http://127.0.0.1:9200{path}");
            let out = kubectl_in(&env, &["exec", from, "--", "curl", "-sS", "--max-time", "5", &url]);
            serde_json::from_slice::<Value>(&out.stdout)
                .map(|v| v[field].as_str().map_or_else(|| v[field].to_string(), String::from))
                .unwrap_or_else(|_| "unanswered".into())
        };
        samples.borrow_mut().push((get("/_cluster/health", "status"), get("/docs/_count", "count")));
    };
    let scale = |set: usize, count: i64| {
        let api = api.clone();
        async move {
            let cr = get_cr(&api, "logs").await.expect("CR");
            let mut sets = cr["spec"]["nodeSets"].clone();
            sets[set]["count"] = json!(count);
            let patch = json!({ "spec": { "nodeSets": sets } });
            api.patch("logs", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
                .await
                .expect("patch");
        }
    };
    let pod_exists = |pod: &str| kubectl_in(&env, &["get", "pod", pod]).status.success();
    let drain_status =
        || kubectl_ok(&env, &["get", "esc", "logs", "-o", "jsonpath={.status.drain.allocationExcluded}"]);
    let green_with = |nodes: u64| {
        let api = api.clone();
        move || {
            let api = api.clone();
            async move {
                let cr = get_cr(&api, "logs").await.ok_or("CR")?;
                let h = &cr["status"]["clusterHealth"];
                if h["status"] == "green" && h["nodes"] == nodes {
                    Ok(())
                } else {
                    Err(h.to_string())
                }
            }
        }
    };
    let started = Instant::now();
    scale(1, 2).await;
    let mut excluded_while_present = None;
    let (_, took) = wait_for("logs-data-2 gone", Duration::from_secs(300), || {
        sample("logs-data-0");
        let present = pod_exists("logs-data-2");
        // What the cluster has in force, and what the status says of it.
        let settings =
            curl(&env, "logs-masters-0", &["http://127.0.0.1:9200/_cluster/settings?flat_settings=true"]);
        let in_force = settings.contains(r#""cluster.routing.allocation.exclude._name":"logs-data-2""#);
        if present && in_force && drain_status() == "logs-data-2" && excluded_while_present.is_none() {
            excluded_while_present = Some((started.elapsed(), shards_on("logs-data-2")));
        }
        async move {
            if present {
                Err("still there".to_string())
            } else {
                Ok(())
            }
        }
    })
    .await;
    let (seen_at, shards_then) =
        excluded_while_present.expect("the exclusion was in force while the pod was still there");
    let (_, cleared) = wait_for("the allocation exclusion cleared", Duration::from_secs(60), || {
        sample("logs-data-0");
        let excluded = drain_status();
        let settings =
            curl(&env, "logs-masters-0", &["http://127.0.0.1:9200/_cluster/settings?flat_settings=true"]);
        async move {
            if excluded.is_empty() && !settings.contains("exclude._name") {
                Ok(())
            } else {
                Err(format!("{excluded:?} {settings}"))
            }
        }
    })
    .await;
    let check = green_with(5);
    wait_for("5 nodes green", Duration::from_secs(120), || {
        sample("logs-data-0");
        check()
    })
    .await;
    let drained = samples.borrow().clone();
    let statuses =
        |s: &[(String, String)]| s.iter().map(|x| x.0.clone()).collect::<std::collections::BTreeSet<_>>();
    eprintln!(
        "realpods[es]: data 3 -> 2: excluded {seen_at:.1?} after the patch ({before} shards on logs-data-2 at first, {shards_then} when the exclusion was seen), pod gone {took:.1?} after the patch, exclusion cleared {cleared:.1?} later; {} samples, statuses {:?}",
        drained.len(),
        statuses(&drained)
    );
    assert_eq!(shards_on("logs-data-2"), 0);
    assert!(drained.iter().all(|(h, _)| h != "red"), "red while draining: {drained:?}");
    assert!(drained.iter().all(|(_, c)| c == "5"), "a read missed documents: {drained:?}");

    // Must-show 4: `masters` 3 -> 1 and back. The two leaving masters are voted out before
    // their pods go; the cluster answers throughout; the exclusions are removed after.
    samples.borrow_mut().clear();
    let started = Instant::now();
    scale(0, 1).await;
    let voting = || {
        let path =
            "_cluster/state/metadata?filter_path=metadata.cluster_coordination.voting_config_exclusions";
        curl(&env, "logs-data-0", &[&format!("http://127.0.0.1:9200/{path}")])
    };
    let mut voted_out_while_present = None;
    wait_for("logs-masters-1 and -2 gone", Duration::from_secs(300), || {
        sample("logs-data-0");
        let present = pod_exists("logs-masters-1") || pod_exists("logs-masters-2");
        let v = voting();
        let both = v.contains("logs-masters-1") && v.contains("logs-masters-2");
        if present && both && voted_out_while_present.is_none() {
            voted_out_while_present = Some((started.elapsed(), v));
        }
        async move {
            if present {
                Err("still there".to_string())
            } else {
                Ok(())
            }
        }
    })
    .await;
    let gone = started.elapsed();
    let (seen_at, exclusions) =
        voted_out_while_present.expect("both leaving masters were voted out while their pods were there");
    wait_for("the voting exclusions removed", Duration::from_secs(60), || {
        sample("logs-data-0");
        let v = voting();
        async move {
            if v.contains("logs-masters") {
                Err(v)
            } else {
                Ok(())
            }
        }
    })
    .await;
    let one_master = samples.borrow().clone();
    eprintln!(
        "realpods[es]: masters 3 -> 1: voted out {seen_at:.1?} after the patch ({exclusions}), pods gone {gone:.1?} after the patch; {} samples, statuses {:?}",
        one_master.len(),
        statuses(&one_master)
    );
    assert!(one_master.iter().all(|(h, c)| h != "unanswered" && h != "red" && c == "5"), "{one_master:?}");
    let started = Instant::now();
    scale(0, 3).await;
    wait_for("5 nodes again, 3 of them masters", Duration::from_secs(240), green_with(5)).await;
    eprintln!("realpods[es]: masters 1 -> 3: green with 5 nodes {:.1?} after the patch", started.elapsed());

    // Must-show 2: a change of a setting read only at start rolls the nodes one at a time,
    // data first and masters last, while a probe reads health and the 5 documents every 2 s
    // through the http Service from a node that is up.
    // (name, uid, Ready, terminating) of every pod of the instance.
    let pod_states = || -> Vec<(String, String, bool, bool)> {
        let out = kubectl_ok(
            &env,
            &[
                "get",
                "pods",
                "-l",
                "stateward.dev/instance=logs",
                "-o",
                r#"jsonpath={range .items[*]}{.metadata.name}|{.metadata.uid}|{.status.conditions[?(@.type=="Ready")].status}|{.metadata.deletionTimestamp}{"\n"}{end}"#,
            ],
        );
        out.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split('|').collect();
                Some((
                    f.first()?.to_string(),
                    f.get(1)?.to_string(),
                    f.get(2) == Some(&"True"),
                    f.get(3).is_some_and(|t| !t.is_empty()),
                ))
            })
            .collect()
    };
    // Probes that reached no answer on a first try, and why (printed below).
    let retried = std::cell::RefCell::new(Vec::<String>::new());
    let probe = |states: &[(String, String, bool, bool)]| {
        let get = |from: &str, path: &str, field: &str| -> Result<String, String> {
            let url = format!("http://logs-http:9200{path}");
            let out = kubectl_in(&env, &["exec", from, "--", "curl", "-sS", "--max-time", "5", &url]);
            serde_json::from_slice::<Value>(&out.stdout)
                .map(|v| v[field].as_str().map_or_else(|| v[field].to_string(), String::from))
                .map_err(|_| {
                    let why = format!(
                        "{}{}",
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    );
                    format!("{path} from {from}: {}", why.trim().chars().take(160).collect::<String>())
                })
        };
        // From a Ready pod, up to three tries a second apart over the Ready pods: one exec or
        // request lost on a loaded node is told apart from a cluster that does not answer
        // (every retried probe is printed; a sample is unanswered only after all three).
        let ready: Vec<&String> = states.iter().filter(|s| s.2).map(|s| &s.0).collect();
        let mut last = ("unanswered".to_string(), "unanswered".to_string());
        for attempt in 0..3 {
            let Some(from) = ready.get(attempt % ready.len().max(1)) else { break };
            match (get(from, "/_cluster/health", "status"), get(from, "/docs/_count", "count")) {
                (Ok(health), Ok(count)) => return (health, count),
                (health, count) => {
                    let why: Vec<String> =
                        [&health, &count].into_iter().filter_map(|r| r.clone().err()).collect();
                    retried.borrow_mut().push(why.join("; "));
                    last = (
                        health.unwrap_or_else(|_| "unanswered".into()),
                        count.unwrap_or_else(|_| "unanswered".into()),
                    );
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
        last
    };
    let first: std::collections::BTreeMap<String, String> =
        pod_states().into_iter().map(|(n, u, ..)| (n, u)).collect();
    let mut order: Vec<String> = Vec::new();
    let mut samples: Vec<(String, String)> = Vec::new();
    // Restarting: a node's pod going away, gone, or made again and not Ready yet. A pod that
    // stays and misses a readiness answer on a busy machine is not a restart (counted apart).
    let (mut most_restarting, mut most_unready) = (0, 0);
    let patch = json!({ "spec": { "parameters": {
        "cluster.routing.allocation.disk.threshold_enabled": "false",
        "indices.query.bool.max_clause_count": "2048",
    } } });
    api.patch("logs", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
        .await
        .expect("patch");
    let (_, took) = wait_for("every node restarted once, green", Duration::from_secs(600), || {
        let states = pod_states();
        let missing = first.len().saturating_sub(states.len());
        let restarting =
            missing + states.iter().filter(|s| s.3 || (first.get(&s.0) != Some(&s.1) && !s.2)).count();
        most_restarting = most_restarting.max(restarting);
        most_unready = most_unready.max(missing + states.iter().filter(|s| !s.2).count());
        for (name, uid, ..) in &states {
            if first.get(name).is_some_and(|u| u != uid) && !order.contains(name) {
                order.push(name.clone());
            }
        }
        samples.push(probe(&states));
        let done = order.len() == first.len();
        let roll = kubectl_ok(&env, &["get", "esc", "logs", "-o", "jsonpath={.status.roll}"]);
        let health = samples.last().map(|s| s.0.clone()).unwrap_or_default();
        let sleep = Duration::from_secs(2);
        async move {
            tokio::time::sleep(sleep).await;
            if done && roll.is_empty() && health == "green" {
                Ok(())
            } else {
                Err(format!("restarted so far: {roll}"))
            }
        }
    })
    .await;
    let statuses: std::collections::BTreeMap<&str, usize> =
        samples.iter().fold(Default::default(), |mut m, s| {
            *m.entry(s.0.as_str()).or_default() += 1;
            m
        });
    eprintln!(
        "realpods[es]: rolling change: {} nodes restarted in {took:.1?}, in the order {order:?}; at most {most_restarting} restarting at once ({most_unready} not Ready at once); {} samples {statuses:?}",
        order.len(),
        samples.len()
    );
    eprintln!(
        "realpods[es]: {} probe tries reached no answer and were tried again: {:?}",
        retried.borrow().len(),
        retried.borrow()
    );
    assert_eq!(order.len(), 5);
    let masters_from = order.iter().position(|p| p.starts_with("logs-masters-")).unwrap_or(order.len());
    assert!(order[..masters_from].iter().all(|p| p.starts_with("logs-data-")), "data first: {order:?}");
    assert!(order[masters_from..].iter().all(|p| p.starts_with("logs-masters-")), "masters last: {order:?}");
    assert!(most_restarting <= 1, "more than one node restarting at once");
    assert_eq!(statuses.get("red"), None, "red samples: {samples:?}");
    assert!(samples.iter().all(|(_, c)| c == "5"), "a read missed documents: {samples:?}");
    // Every node has started since the formation: none runs with the bootstrap list.
    let settings = curl(
        &env,
        "logs-data-0",
        &["http://127.0.0.1:9200/_nodes/settings?filter_path=nodes.*.settings.cluster.initial_cluster_manager_nodes"],
    );
    assert_eq!(settings.trim(), "{}", "a node still runs with the bootstrap list");
    eprintln!("realpods[es]: whole test {:.1?}", created.elapsed());
    drop(op);
}
