#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{json, Value};
use stateward_sdk::testkit as tk;
use stateward_sdk::Service;

use super::Elasticsearch;

fn spec() -> Value {
    json!({ "version": "8.15.3", "replicas": 3, "storage": { "size": "20Gi" } })
}

stateward_sdk::plugin_suite!(Elasticsearch, "ElasticsearchCluster", spec());

fn plan(cr: &Value) -> stateward_sdk::Plan {
    Elasticsearch::reconcile(tk::observed(cr, &[])).unwrap()
}

#[test]
fn the_configuration_discovers_the_masters_and_never_carries_the_bootstrap_list() {
    let mut cr = tk::cr("ElasticsearchCluster", "logs", spec());
    cr["spec"]["parameters"] = json!({ "search.max_buckets": "20000" });
    let conf = tk::find(&plan(&cr), "ConfigMap")["data"]["elasticsearch.yml"].as_str().unwrap().to_string();
    for line in [
        "cluster.name: logs",
        "discovery.seed_hosts: [\"logs-masters\"]",
        "node.store.allow_mmap: false",
        "search.max_buckets: \"20000\"",
        "action.destructive_requires_name: \"true\"",
        "ingest.geoip.downloader.enabled: \"false\"",
    ] {
        assert!(conf.lines().any(|l| l == line), "missing {line:?} in\n{conf}");
    }
    assert!(!conf.contains("initial_master"), "{conf}");
    // OpenSearch: the same file without Elasticsearch's security and its own settings.
    cr["spec"]["distribution"] = json!("opensearch");
    cr["spec"]["version"] = json!("2.19.6");
    let p = plan(&cr);
    let conf = tk::find(&p, "ConfigMap")["data"]["elasticsearch.yml"].as_str().unwrap().to_string();
    assert!(!conf.contains("xpack") && !conf.contains("geoip") && !conf.contains("initial_"), "{conf}");
    let c = &tk::find(&p, "StatefulSet")["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "opensearchproject/opensearch:2.19.6");
    let mounts = c["volumeMounts"].as_array().unwrap();
    assert!(mounts.iter().any(|m| m["subPath"] == "elasticsearch.yml"
        && m["mountPath"] == "/usr/share/opensearch/config/opensearch.yml"));
}

#[test]
fn unsafe_updates_are_refused() {
    let errs = |old: &Value, new: &Value| -> Vec<String> {
        Elasticsearch::validate(&new.to_string(), Some(&old.to_string()))
            .into_iter()
            .map(|e| e.message)
            .collect()
    };
    let mut five = tk::cr("ElasticsearchCluster", "logs", spec());
    five["spec"]["replicas"] = json!(5);
    // Master-eligible nodes leave through voting exclusions: 5 -> 1 at once is allowed.
    let mut one = five.clone();
    one["spec"]["replicas"] = json!(1);
    assert!(errs(&five, &one).is_empty());
    let mut three = five.clone();
    three["spec"]["replicas"] = json!(3);
    assert!(errs(&five, &three).is_empty());
    let mut down = five.clone();
    down["spec"]["version"] = json!("8.14.0");
    assert!(errs(&five, &down)[0].contains("cannot downgrade"));
    let mut jump = five.clone();
    jump["spec"]["version"] = json!("10.0.0");
    assert!(errs(&five, &jump)[0].contains("skips a major"));
    let mut next = five.clone();
    next["spec"]["version"] = json!("9.0.1");
    assert!(errs(&five, &next).is_empty());
    let mut sec = five.clone();
    sec["spec"]["parameters"] = json!({ "xpack.security.enabled": "true" });
    assert_eq!(
        Elasticsearch::validate(&sec.to_string(), None)[0].path,
        "spec.parameters.xpack.security.enabled"
    );
}

/// Health is asked through the http Service only once the host observes it: a plan that asked
/// through a Service not yet seen (a ready pod before the Service, or the Service deleted) would
/// be refused whole by the guardrails, the Service's own apply with it, and never recover.
#[test]
fn health_is_asked_through_the_http_service_only_once_it_is_observed() {
    let cr = tk::cr("ElasticsearchCluster", "logs", spec());
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "logs-0", "labels": {"stateward.dev/instance": "logs"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    });
    let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "logs-http"}});
    let asks = |children: &[Value]| {
        let plan = Elasticsearch::reconcile(tk::observed(&cr, children)).unwrap();
        plan.actions
            .iter()
            .filter_map(|a| match a {
                stateward_sdk::Action::Http(h) => Some(h.target.clone()),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    assert!(asks(std::slice::from_ref(&pod)).is_empty(), "no Service observed yet");
    let plan = Elasticsearch::reconcile(tk::observed(&cr, std::slice::from_ref(&pod))).unwrap();
    assert!(plan
        .actions
        .iter()
        .any(|a| matches!(a, stateward_sdk::Action::Apply(o) if o.contains("\"logs-http\""))));
    let targets = asks(&[pod, service]);
    assert_eq!(targets.len(), 2, "health and nodes");
    assert!(targets.iter().all(|t| *t == stateward_sdk::HttpTarget::Service("logs-http".into())));
}

/// An operator restarted (or upgraded) asks the cluster again and has no answer yet: the
/// health verdict and what the status observed stay as they are until the first answer, so
/// the status is not written twice (gone, then back with a new transition time). A plugin that
/// asks nothing (no pod ready) drops them as before.
#[test]
fn a_new_leader_without_answers_keeps_what_the_status_observed() {
    let mut cr = tk::cr("ElasticsearchCluster", "logs", spec());
    let held = json!({"type": "ServiceHealthy", "status": "False", "reason": "ClusterRed",
                      "message": "cluster health red", "lastTransitionTime": "2026-12-05T01:00:00Z"});
    let observed = json!({"status": "red", "nodes": 1});
    cr["status"] = json!({"conditions": [held], "clusterHealth": observed});
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "logs-0", "labels": {"stateward.dev/instance": "logs"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    });
    let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "logs-http"}});
    let plan = Elasticsearch::reconcile(tk::observed(&cr, &[pod, service])).unwrap();
    assert!(plan.actions.iter().any(|a| matches!(a, stateward_sdk::Action::Http(_))), "it asks again");
    assert_eq!(tk::condition(&plan, "ServiceHealthy"), ("False".to_string(), "ClusterRed".to_string()));
    let c = plan.status.conditions.iter().find(|c| c.type_ == "ServiceHealthy").unwrap();
    assert_eq!(c.message, "cluster health red");
    let extra: Value = serde_json::from_str(&plan.status.extra).unwrap();
    assert_eq!(extra["clusterHealth"], observed);
    // Asking nothing (no pod, so no poll): nothing held.
    let plan = Elasticsearch::reconcile(tk::observed(&cr, &[])).unwrap();
    assert!(plan.status.conditions.iter().all(|c| c.type_ != "ServiceHealthy"));
    let extra: Value = serde_json::from_str(&plan.status.extra).unwrap();
    assert_eq!(extra["clusterHealth"], json!({"status": "unknown"}), "{extra}");
}

#[test]
fn a_switchover_is_refused_with_the_reason() {
    let mut cr = tk::cr("ElasticsearchCluster", "logs", spec());
    cr["metadata"]["annotations"] = json!({ "stateward.dev/switchover-to": "logs-1" });
    let errs = Elasticsearch::validate(&cr.to_string(), None);
    let refusal = errs.iter().find(|e| e.path == "metadata.annotations[stateward.dev/switchover-to]");
    assert!(refusal.is_some_and(|e| e.message.contains("no primary")), "{errs:?}");
}

fn node_sets_cr(distribution: &str) -> Value {
    let mut cr = tk::cr("ElasticsearchCluster", "logs", spec());
    cr["spec"]["distribution"] = json!(distribution);
    cr["spec"]["nodeSets"] = json!([
        { "name": "masters", "count": 3, "roles": ["master"],
          "resources": { "limits": { "memory": "768Mi" } }, "storage": { "size": "1Gi" } },
        { "name": "data", "count": 3, "roles": ["data", "ingest"] },
    ]);
    cr
}

fn container(sts: &Value) -> &Value {
    &sts["spec"]["template"]["spec"]["containers"][0]
}

#[test]
fn each_node_set_is_a_statefulset_with_its_roles_size_and_heap() {
    let cr = node_sets_cr("opensearch");
    assert_eq!(Elasticsearch::validate(&cr.to_string(), None), vec![]);
    let p = plan(&cr);
    let sets = tk::find_all(&p, "StatefulSet");
    let names: Vec<&str> = sets.iter().map(|s| s["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["logs-masters", "logs-data"]);
    let (masters, data) = (&sets[0], &sets[1]);
    assert_eq!(masters["spec"]["selector"]["matchLabels"]["stateward.dev/member-set"], "masters");
    assert_eq!(masters["spec"]["template"]["metadata"]["labels"]["stateward.dev/master-eligible"], "true");
    assert_eq!(data["spec"]["template"]["metadata"]["labels"]["stateward.dev/master-eligible"], "false");
    let script = |s: &Value| container(s)["command"][2].as_str().unwrap().to_string();
    assert!(script(masters).contains("-Enode.roles=cluster_manager "), "{}", script(masters));
    assert!(script(data).contains("-Enode.roles=data,ingest "), "{}", script(data));
    assert_eq!(container(masters)["resources"]["limits"]["memory"], "768Mi");
    let heap = container(masters)["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "OPENSEARCH_JAVA_OPTS")
        .cloned();
    assert_eq!(heap.unwrap()["value"], "-Xms384m -Xmx384m");
    assert_eq!(masters["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"], "1Gi");
    assert_eq!(data["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"], "20Gi");
    // Every node set behind the one headless Service; discovery through the masters' own.
    assert!(sets.iter().all(|s| s["spec"]["serviceName"] == "logs-headless"));
    let services = tk::find_all(&p, "Service");
    let seeds = services.iter().find(|s| s["metadata"]["name"] == "logs-masters").unwrap();
    assert_eq!(seeds["spec"]["selector"]["stateward.dev/master-eligible"], "true");
    assert_eq!(seeds["spec"]["publishNotReadyAddresses"], true);
    // The status counts the nodes of every set.
    let children: Vec<Value> = sets.clone();
    let running = tk::with_sts_status(&children, 3, 3, 3, ("r1", "r1"));
    let p = Elasticsearch::reconcile(tk::observed(&cr, &running)).unwrap();
    assert_eq!(tk::extra(&p)["readyReplicas"], 6);
    let mut half = running.clone();
    half[1]["status"]["readyReplicas"] = json!(1);
    let p = Elasticsearch::reconcile(tk::observed(&cr, &half)).unwrap();
    assert_eq!(tk::extra(&p)["readyReplicas"], 4);
}

/// The bootstrap list is given only on a first start, and only until the cluster has formed:
/// the health answer that shows it formed empties it in the same plan, and the status keeps
/// the formation from then on.
#[test]
fn the_bootstrap_list_goes_once_the_cluster_has_formed() {
    let cr = node_sets_cr("opensearch");
    let bootstrap = |p: &stateward_sdk::Plan| {
        let maps = tk::find_all(p, "ConfigMap");
        let m = maps.iter().find(|m| m["metadata"]["name"] == "logs-bootstrap").cloned().unwrap();
        m["data"]["initial-masters"].as_str().unwrap().to_string()
    };
    let p = plan(&cr);
    assert_eq!(bootstrap(&p), "logs-masters-0,logs-masters-1,logs-masters-2");
    let script = container(&tk::find(&p, "StatefulSet"))["command"][2].as_str().unwrap().to_string();
    assert!(script.contains("[ ! -d /usr/share/opensearch/data/nodes ]"), "{script}");
    assert!(
        script.contains(
            "-Ecluster.initial_cluster_manager_nodes=$(cat /etc/stateward-bootstrap/initial-masters)"
        ),
        "{script}"
    );
    // The list is not hashed into the pod template: emptying it rolls nothing.
    let hash = |p: &stateward_sdk::Plan| {
        tk::find(p, "StatefulSet")["spec"]["template"]["metadata"]["annotations"].clone()
    };

    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "logs-masters-0", "labels": {"stateward.dev/instance": "logs"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    });
    let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "logs-http"}});
    let mut observed = tk::observed(&cr, &[pod, service]);
    observed.responses = vec![stateward_sdk::Response {
        id: "cluster-health".into(),
        code: Some(200),
        stdout: json!({"status": "green", "number_of_nodes": 6, "active_shards": 0, "unassigned_shards": 0})
            .to_string(),
        stderr: String::new(),
        truncated: false,
        error: None,
        started_at_ms: 1_000,
        duration_ms: 5,
    }];
    let formed = Elasticsearch::reconcile(observed).unwrap();
    assert_eq!(bootstrap(&formed), "", "emptied on the answer that shows the cluster formed");
    assert_eq!(tk::extra(&formed)["formation"]["formedAt"], 1_000);
    tk::assert_status_declared::<Elasticsearch>(&formed);
    assert!(formed.events.iter().any(|e| e.reason == "ClusterFormed"));
    assert_eq!(hash(&formed), hash(&p));
    // Later reconciles keep the formation and the empty list.
    let mut later = cr.clone();
    later["status"] = json!({ "formation": tk::extra(&formed)["formation"] });
    let p = plan(&later);
    assert_eq!(bootstrap(&p), "");
    assert_eq!(tk::extra(&p)["formation"]["formedAt"], 1_000);
}

/// Elasticsearch 8 runs with security on: TLS on both layers from the operator's CA, the
/// password from the Secret, probes and the plugin's requests authenticated and verified.
#[test]
fn elasticsearch_runs_with_tls_and_authenticated_probes_and_requests() {
    let cr = node_sets_cr("elasticsearch");
    let p = plan(&cr);
    let conf = tk::find(&p, "ConfigMap")["data"]["elasticsearch.yml"].as_str().unwrap().to_string();
    for line in [
        "xpack.security.enabled: true",
        "xpack.security.http.ssl.enabled: true",
        "xpack.security.http.ssl.certificate: stateward-tls/tls.crt",
        "xpack.security.http.ssl.key: stateward-tls/tls.key",
        "xpack.security.http.ssl.certificate_authorities: [\"stateward-tls/ca.crt\"]",
        "xpack.security.transport.ssl.enabled: true",
        "xpack.security.transport.ssl.verification_mode: certificate",
    ] {
        assert!(conf.lines().any(|l| l == line), "missing {line:?} in\n{conf}");
    }
    let sts = tk::find(&p, "StatefulSet");
    let c = container(&sts);
    let env = c["env"].as_array().unwrap();
    let password = env.iter().find(|e| e["name"] == "ELASTIC_PASSWORD").unwrap();
    assert_eq!(
        password["valueFrom"]["secretKeyRef"],
        json!({ "name": "logs-credentials", "key": "password" })
    );
    let mounts = c["volumeMounts"].as_array().unwrap();
    assert!(mounts
        .iter()
        .any(|m| m["name"] == "tls" && m["mountPath"] == "/usr/share/elasticsearch/config/stateward-tls"));
    for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
        let script = c[probe]["exec"]["command"][2].as_str().unwrap();
        assert!(
            script.contains("https://")
                && script.contains("--cacert /usr/share/elasticsearch/config/stateward-tls/ca.crt"),
            "{script}"
        );
        assert!(script.contains("-u \"elastic:$ELASTIC_PASSWORD\"") && !script.contains(" -k"), "{script}");
    }
    assert!(c["command"][2]
        .as_str()
        .unwrap()
        .contains("/usr/local/bin/docker-entrypoint.sh eswrapper -Enode.roles=master "));
    // The credentials carry the user the requests authenticate as.
    let secret = p.actions.iter().find_map(|a| match a {
        stateward_sdk::Action::EnsureSecret(s) if s.name == "logs-credentials" => Some(s.clone()),
        _ => None,
    });
    assert_eq!(secret.unwrap().derived, [("username".to_string(), "elastic".to_string())]);
    // The plugin's own requests: https verified for the http Service's name, with basic auth.
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "logs-masters-0", "labels": {"stateward.dev/instance": "logs"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    });
    let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "logs-http"}});
    let mut cr = cr;
    cr["metadata"]["namespace"] = json!("search");
    let p = Elasticsearch::reconcile(tk::observed(&cr, &[pod, service])).unwrap();
    let asks: Vec<&stateward_sdk::HttpRequest> = p
        .actions
        .iter()
        .filter_map(|a| match a {
            stateward_sdk::Action::Http(h) => Some(h),
            _ => None,
        })
        .collect();
    assert_eq!(asks.len(), 2);
    for h in asks {
        let tls = h.tls.as_ref().expect("TLS");
        assert_eq!(
            (tls.ca_secret.as_str(), tls.server_name.as_str()),
            ("logs-tls", "logs-http.search.svc.cluster.local")
        );
        let auth = h.basic_auth.as_ref().expect("basic auth");
        assert_eq!(
            (auth.secret.as_str(), auth.username_key.as_str(), auth.password_key.as_str()),
            ("logs-credentials", "username", "password")
        );
    }
}

#[test]
fn bad_node_sets_are_refused_with_the_field() {
    let paths = |cr: &Value, old: Option<&Value>| -> Vec<(String, String)> {
        Elasticsearch::validate(&cr.to_string(), old.map(|o| o.to_string()).as_deref())
            .into_iter()
            .map(|e| (e.path, e.message))
            .collect()
    };
    let first = |cr: &Value, old: Option<&Value>| paths(cr, old).into_iter().next().unwrap_or_default();
    let base = node_sets_cr("opensearch");
    let mut even = base.clone();
    even["spec"]["nodeSets"][0]["count"] = json!(2);
    assert_eq!(first(&even, None).0, "spec.nodeSets");
    assert!(first(&even, None).1.contains("odd"));
    let mut even_whole = tk::cr("ElasticsearchCluster", "logs", spec());
    even_whole["spec"]["replicas"] = json!(4);
    assert_eq!(first(&even_whole, None).0, "spec.replicas");
    let mut no_master = base.clone();
    no_master["spec"]["nodeSets"][0]["roles"] = json!(["ingest"]);
    assert!(first(&no_master, None).1.contains("no node set has the master role"));
    let mut no_data = base.clone();
    no_data["spec"]["nodeSets"][1]["roles"] = json!(["ingest"]);
    assert!(first(&no_data, None).1.contains("no node set has a data role"));
    let mut bad_role = base.clone();
    bad_role["spec"]["nodeSets"][1]["roles"] = json!(["data", "cook"]);
    assert_eq!(first(&bad_role, None).0, "spec.nodeSets[1].roles[1]");
    let mut es_role = base.clone();
    es_role["spec"]["nodeSets"][1]["roles"] = json!(["data", "ml"]);
    assert!(first(&es_role, None).1.contains("OpenSearch does not have"));
    let mut dup = base.clone();
    dup["spec"]["nodeSets"][1]["name"] = json!("masters");
    assert_eq!(first(&dup, None).0, "spec.nodeSets[1].name");
    let mut long = base.clone();
    long["spec"]["nodeSets"][1]["name"] = json!("data-nodes-hot");
    assert_eq!(first(&long, None).0, "spec.nodeSets[1].name");
    let mut geo = base.clone();
    geo["spec"]["parameters"] = json!({ "ingest.geoip.downloader.enabled": "true" });
    assert_eq!(first(&geo, None).0, "spec.parameters.ingest.geoip.downloader.enabled");
    let mut owned = base.clone();
    owned["spec"]["parameters"] = json!({ "cluster.initial_cluster_manager_nodes": "a" });
    assert_eq!(first(&owned, None).0, "spec.parameters.cluster.initial_cluster_manager_nodes");
    // Changes: a node set renamed in place, the distribution, a downgrade.
    let mut renamed = base.clone();
    renamed["spec"]["nodeSets"][1]["name"] = json!("hot");
    assert_eq!(paths(&renamed, None), vec![]);
    let (path, message) = first(&renamed, Some(&base));
    assert_eq!(path, "spec.nodeSets");
    assert!(message.contains("\"data\" is gone"), "{message}");
    let mut other = base.clone();
    other["spec"]["distribution"] = json!("elasticsearch");
    assert_eq!(first(&other, Some(&base)).0, "spec.distribution");
    let mut older = base.clone();
    older["spec"]["version"] = json!("8.14.0");
    assert!(first(&older, Some(&base)).1.contains("cannot downgrade"));
    let mut grown = base.clone();
    grown["spec"]["nodeSets"][1]["count"] = json!(4);
    assert_eq!(paths(&grown, Some(&base)), vec![]);
}

#[test]
fn the_spec_schema_is_json() {
    let schema = crate::spec::schema();
    assert!(schema.contains_key("nodeSets") && schema.contains_key("distribution"), "{schema:?}");
}

fn answer(id: &str, body: Value) -> stateward_sdk::Response {
    stateward_sdk::Response {
        id: id.into(),
        code: Some(200),
        stdout: body.to_string(),
        stderr: String::new(),
        truncated: false,
        error: None,
        started_at_ms: 1_000,
        duration_ms: 5,
    }
}

fn ready_pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"stateward.dev/instance": "logs"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    })
}

/// A formed cluster of `masters` + `data` pods, the spec asking for `spec_masters` and
/// `spec_data`; the plan for it with `responses`.
fn drain_plan(
    pods: (i64, i64),
    spec: (i64, i64),
    responses: Vec<stateward_sdk::Response>,
) -> stateward_sdk::Plan {
    drain_plan_fenced(pods, spec, responses, None)
}

/// [`drain_plan`] with the fence annotation `fenced`.
fn drain_plan_fenced(
    pods: (i64, i64),
    spec: (i64, i64),
    responses: Vec<stateward_sdk::Response>,
    fenced: Option<&str>,
) -> stateward_sdk::Plan {
    let mut cr = node_sets_cr("opensearch");
    if let Some(list) = fenced {
        cr["metadata"]["annotations"] = json!({ "stateward.dev/fenced-instances": list });
    }
    cr["metadata"]["generation"] = json!(7);
    cr["spec"]["nodeSets"][0]["count"] = json!(spec.0);
    cr["spec"]["nodeSets"][1]["count"] = json!(spec.1);
    cr["status"] = json!({ "formation": { "formedAt": 1, "masters": [] } });
    let mut children: Vec<Value> = (0..pods.0).map(|i| ready_pod(&format!("logs-masters-{i}"))).collect();
    children.extend((0..pods.1).map(|i| ready_pod(&format!("logs-data-{i}"))));
    children.push(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "logs-http"}}));
    let mut observed = tk::observed(&cr, &children);
    observed.responses = responses;
    Elasticsearch::reconcile(observed).unwrap()
}

/// The cluster settings answer with `excluded` as the allocation exclusion in force.
fn settings(excluded: Option<&str>) -> stateward_sdk::Response {
    answer(
        "settings",
        json!({ "persistent": excluded.map_or(json!({}), |e| json!({ "cluster.routing.allocation.exclude._name": e })), "transient": {} }),
    )
}

fn replicas(p: &stateward_sdk::Plan, sts: &str) -> Value {
    tk::find_all(p, "StatefulSet").into_iter().find(|s| s["metadata"]["name"] == sts).unwrap()["spec"]
        ["replicas"]
        .clone()
}

fn sent<'a>(p: &'a stateward_sdk::Plan, method: &str) -> Vec<&'a stateward_sdk::HttpRequest> {
    p.actions
        .iter()
        .filter_map(|a| match a {
            stateward_sdk::Action::Http(h) if h.method == method => Some(h),
            _ => None,
        })
        .collect()
}

/// Must-show 3's order: a data node leaves only once it holds no shard. Its set is held at
/// the old size while the exclusion is asked for and the shards move; then it may go; once
/// it is gone the exclusion is cleared.
#[test]
fn a_leaving_data_node_is_drained_before_its_pod_goes() {
    let voting = answer("voting-exclusions", json!({}));
    let allocation = |shards: u64| {
        answer(
            "allocation",
            json!([{ "node": "logs-data-0", "shards": "4" }, { "node": "logs-data-2", "shards": shards.to_string() }]),
        )
    };
    // Nothing answered yet: held, nothing changed.
    let p = drain_plan((3, 3), (3, 2), vec![]);
    assert_eq!(replicas(&p, "logs-data"), 3, "held before the cluster says anything");
    assert!(sent(&p, "PUT").is_empty());
    // No exclusion in force: asked for, once, by generation and value; still held.
    let p = drain_plan((3, 3), (3, 2), vec![settings(None), voting.clone(), allocation(3)]);
    let put = sent(&p, "PUT");
    assert_eq!(put.len(), 1);
    assert_eq!(put[0].mode, stateward_sdk::RequestMode::Once);
    assert!(put[0].id.starts_with("exclude-g7-"), "{}", put[0].id);
    assert_eq!(
        put[0].body.as_deref(),
        Some(r#"{"persistent":{"cluster.routing.allocation.exclude._name":"logs-data-2"}}"#)
    );
    assert_eq!(replicas(&p, "logs-data"), 3);
    assert!(p.events.iter().any(|e| e.reason == "DrainingNodes"));
    // Excluded, shards still moving: held; drained: released.
    let p = drain_plan((3, 3), (3, 2), vec![settings(Some("logs-data-2")), voting.clone(), allocation(2)]);
    assert_eq!(replicas(&p, "logs-data"), 3);
    assert!(sent(&p, "PUT").is_empty(), "the exclusion in force is not asked again");
    let p = drain_plan((3, 3), (3, 2), vec![settings(Some("logs-data-2")), voting.clone(), allocation(0)]);
    assert_eq!(replicas(&p, "logs-data"), 2);
    tk::assert_status_declared::<Elasticsearch>(&p);
    assert_eq!(tk::extra(&p)["drain"]["leaving"], json!(["logs-data-2"]));
    // Gone: the exclusion is cleared.
    let p = drain_plan((3, 2), (3, 2), vec![settings(Some("logs-data-2")), voting]);
    let put = sent(&p, "PUT");
    assert_eq!(put.len(), 1);
    assert_eq!(
        put[0].body.as_deref(),
        Some(r#"{"persistent":{"cluster.routing.allocation.exclude._name":null}}"#)
    );
    assert_eq!(replicas(&p, "logs-data"), 2);
}

/// A fenced node takes no writes: it is excluded from shard allocation (its shards move away)
/// while it stays in the cluster; unfenced, the exclusion goes.
#[test]
fn a_fenced_node_is_excluded_from_allocation_until_unfenced() {
    let voting = answer("voting-exclusions", json!({}));
    let fence = Some(r#"["logs-data-1"]"#);
    let p = drain_plan_fenced((3, 3), (3, 3), vec![settings(None), voting.clone()], fence);
    let put = sent(&p, "PUT");
    assert_eq!(put.len(), 1, "{put:?}");
    assert_eq!(
        put[0].body.as_deref(),
        Some(r#"{"persistent":{"cluster.routing.allocation.exclude._name":"logs-data-1"}}"#)
    );
    assert_eq!(replicas(&p, "logs-data"), 3, "the fenced node stays");
    let p = drain_plan_fenced((3, 3), (3, 3), vec![settings(Some("logs-data-1")), voting.clone()], fence);
    assert!(sent(&p, "PUT").is_empty(), "in force: not asked again");
    let p = drain_plan_fenced((3, 3), (3, 3), vec![settings(Some("logs-data-1")), voting], None);
    let put = sent(&p, "PUT");
    assert_eq!(
        put.first().and_then(|r| r.body.as_deref()),
        Some(r#"{"persistent":{"cluster.routing.allocation.exclude._name":null}}"#)
    );
}

/// Must-show 4's order: master-eligible nodes leave the voting configuration before their
/// pods go (3 → 1 at once is then safe), and the exclusions are removed once they are gone.
#[test]
fn leaving_masters_are_voted_out_first_and_the_exclusions_removed_after() {
    let settings = answer("settings", json!({ "persistent": {}, "transient": {} }));
    let voting = |names: &[&str]| {
        let list: Vec<Value> = names.iter().map(|n| json!({ "node_id": "x", "node_name": n })).collect();
        answer(
            "voting-exclusions",
            json!({ "metadata": { "cluster_coordination": { "voting_config_exclusions": list } } }),
        )
    };
    let p = drain_plan((3, 3), (1, 3), vec![settings.clone(), voting(&[])]);
    assert_eq!(replicas(&p, "logs-masters"), 3, "held until voted out");
    let post = sent(&p, "POST");
    assert_eq!(post.len(), 1);
    assert!(
        post[0]
            .path
            .starts_with("/_cluster/voting_config_exclusions?node_names=logs-masters-1,logs-masters-2"),
        "{}",
        post[0].path
    );
    assert!(p.events.iter().any(|e| e.reason == "ExcludingVotes"));
    let p = drain_plan((3, 3), (1, 3), vec![settings.clone(), voting(&["logs-masters-2"])]);
    assert_eq!(replicas(&p, "logs-masters"), 2, "the highest may go, the other waits");
    let p = drain_plan((3, 3), (1, 3), vec![settings.clone(), voting(&["logs-masters-1", "logs-masters-2"])]);
    assert_eq!(replicas(&p, "logs-masters"), 1);
    assert!(sent(&p, "POST").is_empty() && sent(&p, "DELETE").is_empty());
    let p = drain_plan((1, 3), (1, 3), vec![settings, voting(&["logs-masters-1", "logs-masters-2"])]);
    let delete = sent(&p, "DELETE");
    assert_eq!(delete.len(), 1);
    assert_eq!(delete[0].path, "/_cluster/voting_config_exclusions?wait_for_removal=false");
}

/// A cluster that never formed (or a spec without a scale-down) is not held, and nothing is
/// excluded.
#[test]
fn an_unformed_cluster_is_never_held() {
    let mut cr = node_sets_cr("opensearch");
    cr["spec"]["nodeSets"][1]["count"] = json!(2);
    let children: Vec<Value> = (0..3).map(|i| ready_pod(&format!("logs-data-{i}"))).collect();
    let p = Elasticsearch::reconcile(tk::observed(&cr, &children)).unwrap();
    assert_eq!(replicas(&p, "logs-data"), 2);
    assert!(sent(&p, "PUT").is_empty() && sent(&p, "POST").is_empty());
}

/// The template hash `cr` renders for the StatefulSet of node set `set`.
fn template_hash(cr: &Value, set: &str) -> Value {
    let rendered = Elasticsearch::reconcile(tk::observed(cr, &[])).unwrap();
    tk::find_all(&rendered, "StatefulSet")
        .into_iter()
        .find(|s| s["metadata"]["name"] == format!("logs-{set}"))
        .unwrap()["metadata"]["annotations"]["stateward.dev/template-hash"]
        .clone()
}

/// Both node sets' StatefulSets making revision `new` from the template `cr` renders now, and
/// their 3 + 3 Ready pods on `old`, but for those named in `replaced` (a new uid, on `new`).
fn outdated_children(cr: &Value, replaced: &[&str]) -> Vec<Value> {
    let mut children = Vec::new();
    for set in ["masters", "data"] {
        children.push(json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {
                "name": format!("logs-{set}"), "generation": 2,
                "annotations": { "stateward.dev/template-hash": template_hash(cr, set) },
            },
            "status": { "observedGeneration": 2, "updateRevision": format!("logs-{set}-new"), "currentRevision": format!("logs-{set}-old") },
        }));
        for i in 0..3 {
            let name = format!("logs-{set}-{i}");
            let fresh = replaced.contains(&name.as_str());
            let mut pod = ready_pod(&name);
            pod["metadata"]["uid"] =
                json!(if fresh { format!("{name}-uid-2") } else { format!("{name}-uid-1") });
            pod["metadata"]["labels"]["controller-revision-hash"] =
                json!(if fresh { format!("logs-{set}-new") } else { format!("logs-{set}-old") });
            children.push(pod);
        }
    }
    children
}

/// A formed cluster of 3 masters and 3 data nodes whose pods are on revision `old` while the
/// StatefulSets make `new`; `roll`: status.roll as last written; pods named in `replaced`
/// have a new uid and the new revision.
fn roll_plan(roll: Value, replaced: &[&str], responses: Vec<stateward_sdk::Response>) -> stateward_sdk::Plan {
    let mut cr = node_sets_cr("opensearch");
    cr["metadata"]["generation"] = json!(9);
    cr["status"] = json!({ "formation": { "formedAt": 1, "masters": [] } });
    if !roll.is_null() {
        cr["status"]["roll"] = roll;
    }
    let mut children = outdated_children(&cr, replaced);
    children.push(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "logs-http"}}));
    let mut observed = tk::observed(&cr, &children);
    observed.responses = responses;
    Elasticsearch::reconcile(observed).unwrap()
}

fn health(status: &str, nodes: u64, at_ms: u64) -> stateward_sdk::Response {
    let mut a = answer(
        "cluster-health",
        json!({ "status": status, "number_of_nodes": nodes, "unassigned_shards": 0, "active_shards": 4 }),
    );
    a.started_at_ms = at_ms;
    a
}

fn deleted(p: &stateward_sdk::Plan) -> Vec<String> {
    p.actions
        .iter()
        .filter_map(|a| match a {
            stateward_sdk::Action::Delete(o) if o.kind == "Pod" => Some(o.name.clone()),
            _ => None,
        })
        .collect()
}

/// Must-show 2's order: the StatefulSets roll OnDelete and the plugin replaces one node at a
/// time: data first, masters last, the highest ordinal of a set first; each only once the
/// cluster is green with every node, after replica allocation is held and the node flushed;
/// allocation enabled again once it is back, and the next waits for green after that.
#[test]
fn a_rolling_change_restarts_one_node_at_a_time_behind_green_masters_last() {
    let p = roll_plan(Value::Null, &[], vec![]);
    assert!(tk::find_all(&p, "StatefulSet")
        .iter()
        .all(|s| s["spec"]["updateStrategy"]["type"] == "OnDelete"));
    // Not green yet: nothing happens, the status says why.
    let p = roll_plan(Value::Null, &[], vec![health("yellow", 6, 1_000)]);
    assert!(sent(&p, "PUT").is_empty() && deleted(&p).is_empty());
    assert!(tk::extra(&p)["roll"]["waiting"].as_str().unwrap().contains("6 node(s) to restart"));
    // Green with every node: the first data node (highest ordinal) is prepared.
    let p = roll_plan(Value::Null, &[], vec![health("green", 6, 1_000)]);
    assert_eq!(
        tk::extra(&p)["roll"],
        json!({ "pod": "logs-data-2", "uid": "logs-data-2-uid-1", "step": "Preparing" })
    );
    let put = sent(&p, "PUT");
    assert_eq!(put.len(), 1);
    assert_eq!(
        put[0].body.as_deref(),
        Some(r#"{"persistent":{"cluster.routing.allocation.enable":"primaries"}}"#)
    );
    assert_eq!(sent(&p, "POST")[0].path, "/_flush");
    assert!(deleted(&p).is_empty(), "not before allocation is held and the node flushed");
    tk::assert_status_declared::<Elasticsearch>(&p);
    // Both answered: the pod goes.
    let preparing = json!({ "pod": "logs-data-2", "uid": "logs-data-2-uid-1", "step": "Preparing" });
    let tag = "roll-g9-logs-data-2-logs-dat";
    let done = |id: &str| answer(&format!("{tag}-{id}"), json!({ "acknowledged": true }));
    let p =
        roll_plan(preparing.clone(), &[], vec![health("green", 6, 1_000), done("primaries"), done("flush")]);
    assert_eq!(deleted(&p), ["logs-data-2"]);
    assert_eq!(tk::extra(&p)["roll"]["step"], "Restarting");
    // Back with a new uid and all 6 nodes: allocation enabled again.
    let restarting = json!({ "pod": "logs-data-2", "uid": "logs-data-2-uid-1", "step": "Restarting" });
    let p = roll_plan(restarting.clone(), &["logs-data-2"], vec![health("yellow", 5, 2_000)]);
    assert_eq!(tk::extra(&p)["roll"]["step"], "Restarting", "not before the node joined");
    let p = roll_plan(restarting, &["logs-data-2"], vec![health("yellow", 6, 2_000)]);
    assert_eq!(tk::extra(&p)["roll"]["step"], "Enabling");
    let put = sent(&p, "PUT");
    assert_eq!(put[0].body.as_deref(), Some(r#"{"persistent":{"cluster.routing.allocation.enable":null}}"#));
    // Enabled, then green on a later answer: done with this node; the next is data-1.
    let enabling = json!({ "pod": "logs-data-2", "uid": "logs-data-2-uid-1", "step": "Enabling" });
    let mut enabled = done("enable");
    enabled.started_at_ms = 3_000;
    let p = roll_plan(enabling.clone(), &["logs-data-2"], vec![health("green", 6, 2_500), enabled.clone()]);
    assert_eq!(tk::extra(&p)["roll"]["step"], "Enabling", "green from before the enable does not count");
    let p = roll_plan(enabling, &["logs-data-2"], vec![health("green", 6, 4_000), enabled]);
    assert!(tk::extra(&p)["roll"].is_null(), "{}", tk::extra(&p)["roll"]);
    assert!(p.events.iter().any(|e| e.reason == "NodeRestarted"));
    let p = roll_plan(Value::Null, &["logs-data-2"], vec![health("green", 6, 5_000)]);
    assert_eq!(tk::extra(&p)["roll"]["pod"], "logs-data-1");
    // Every data node done: the masters, highest first.
    let p = roll_plan(
        Value::Null,
        &["logs-data-0", "logs-data-1", "logs-data-2"],
        vec![health("green", 6, 5_000)],
    );
    assert_eq!(tk::extra(&p)["roll"]["pod"], "logs-masters-2");
}

/// Just after a change both StatefulSets are applied, but the host's cache may show one of
/// them as it was: the data set still making the old revision its pods run, as if nothing
/// were to roll there. No node is replaced until every set shows the template rendered now
/// (in CI, a master was restarted first this way, before the data nodes).
#[test]
fn no_node_is_replaced_while_a_statefulset_shows_an_older_template() {
    let mut cr = node_sets_cr("opensearch");
    cr["metadata"]["generation"] = json!(9);
    cr["status"] = json!({ "formation": { "formedAt": 1, "masters": [] } });
    let hash = |set: &str| template_hash(&cr, set);
    assert!(hash("data").is_string() && hash("data") != hash("masters"));
    let mut children = outdated_children(&cr, &[]);
    children.push(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "logs-http"}}));
    let mut observed = tk::observed(&cr, &children);
    observed.responses = vec![health("green", 6, 1_000)];
    let p = Elasticsearch::reconcile(observed.clone()).unwrap();
    assert_eq!(tk::extra(&p)["roll"]["pod"], "logs-data-2", "both sets seen: the data node first");
    // The data set as cached before the apply: an older template, its pods' revision.
    let data = children.iter_mut().find(|c| c["metadata"]["name"] == "logs-data").unwrap();
    data["metadata"]["annotations"]["stateward.dev/template-hash"] = json!("0123456789abcdef");
    data["status"]["updateRevision"] = json!("logs-data-old");
    let mut observed = tk::observed(&cr, &children);
    observed.responses = vec![health("green", 6, 1_000)];
    let p = Elasticsearch::reconcile(observed).unwrap();
    assert!(tk::extra(&p)["roll"].get("pod").is_none(), "{}", tk::extra(&p)["roll"]);
    assert!(deleted(&p).is_empty() && sent(&p, "PUT").is_empty());
}

/// A cluster that has not formed holds no data: its nodes roll one at a time by readiness
/// alone (the health gates need a cluster that answers), in the same order.
#[test]
fn an_unformed_cluster_rolls_by_readiness_one_node_at_a_time() {
    let mut cr = node_sets_cr("opensearch");
    cr["metadata"]["generation"] = json!(9);
    let mut children = outdated_children(&cr, &[]);
    let p = Elasticsearch::reconcile(tk::observed(&cr, &children)).unwrap();
    assert_eq!(deleted(&p), ["logs-data-2"]);
    // The one just replaced missing from what the host saw, or back and not Ready: the next
    // waits.
    let mut missing = children.clone();
    missing.remove(7);
    let p = Elasticsearch::reconcile(tk::observed(&cr, &missing)).unwrap();
    assert!(deleted(&p).is_empty(), "a member is missing");
    children[7]["status"]["conditions"][0]["status"] = json!("False");
    let p = Elasticsearch::reconcile(tk::observed(&cr, &children)).unwrap();
    assert!(deleted(&p).is_empty());
}

/// `Redundant`: green with every node joined; yellow counts its unassigned copies and names one
/// the cluster explained; a single node never is, and says why.
#[test]
fn redundancy_is_green_health_with_every_node_joined() {
    use crate::live::redundancy;
    use stateward_sdk::redundancy::Verdict;
    let h = |status: &str, nodes: u64, unassigned: u64| {
        Some(json!({ "status": status, "number_of_nodes": nodes, "unassigned_shards": unassigned }))
    };
    assert_eq!(redundancy(Some(&h("green", 3, 0)), 3, None).verdict, Verdict::Redundant);
    let yellow = redundancy(Some(&h("yellow", 3, 4)), 3, None);
    assert_eq!((yellow.verdict, yellow.reason.as_str()), (Verdict::Lacking, "ShardCopiesUnassigned"));
    assert!(yellow.message.contains("4 shard copies unassigned"), "{yellow:?}");
    let explain = json!({
        "index": "logs", "shard": 2, "primary": false,
        "unassigned_info": { "reason": "REPLICA_ADDED" },
        "allocate_explanation": format!("cannot allocate because {}", "x".repeat(500)),
    });
    let named = redundancy(Some(&h("yellow", 3, 1)), 3, Some(&explain));
    assert!(
        named.message.starts_with("cluster health yellow: 1 shard copies unassigned, among them index logs shard 2 (a replica, REPLICA_ADDED): cannot allocate because xxx"),
        "{named:?}"
    );
    assert!(named.message.len() < 400, "the cluster's explanation is cut: {}", named.message.len());
    assert_eq!(redundancy(Some(&h("green", 2, 0)), 3, None).reason, "NodesMissing");
    assert_eq!(redundancy(None, 3, None).verdict, Verdict::Unknown);
    assert_eq!(redundancy(Some(&None), 3, None).reason, "NoHealth");
    let single = redundancy(Some(&h("green", 1, 0)), 1, None);
    assert_eq!((single.verdict, single.reason.as_str()), (Verdict::NotPromised, "SingleMember"));
}

/// The unassigned copy is asked about only while the health is not green, and its answer names
/// the index in `Redundant`'s message.
#[test]
fn an_unassigned_copy_is_asked_about_while_not_green_and_named() {
    let explains = |p: &stateward_sdk::Plan| {
        sent(p, "GET").iter().filter(|h| h.path.starts_with("/_cluster/allocation/explain")).count()
    };
    let p = drain_plan((3, 3), (3, 3), vec![health("green", 6, 1_000)]);
    assert_eq!(explains(&p), 0, "nothing to explain while green");
    let p = drain_plan((3, 3), (3, 3), vec![health("yellow", 6, 1_000)]);
    assert_eq!(explains(&p), 1);
    let explained = answer(
        "unassigned-copy",
        json!({ "index": "orders", "shard": 0, "primary": false, "allocate_explanation": "cannot allocate" }),
    );
    let p = drain_plan((3, 3), (3, 3), vec![health("yellow", 6, 1_000), explained]);
    let c = p.status.conditions.iter().find(|c| c.type_ == "Redundant").unwrap();
    assert_eq!(c.reason, "ShardCopiesUnassigned");
    assert!(c.message.contains("index orders shard 0 (a replica): cannot allocate"), "{}", c.message);
}
