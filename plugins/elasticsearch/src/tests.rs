#![allow(clippy::unwrap_used, clippy::panic)]

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
fn elasticsearch_yml_discovers_through_the_headless_service() {
    let mut cr = tk::cr("ElasticsearchCluster", "logs", spec());
    cr["spec"]["parameters"] = json!({ "search.max_buckets": "20000" });
    let conf = tk::find(&plan(&cr), "ConfigMap")["data"]["elasticsearch.yml"].as_str().unwrap().to_string();
    for line in [
        "cluster.name: logs",
        "discovery.seed_hosts: [\"logs-headless\"]",
        "cluster.initial_master_nodes: [\"logs-0\", \"logs-1\", \"logs-2\"]",
        "node.store.allow_mmap: false",
        "search.max_buckets: \"20000\"",
        "action.destructive_requires_name: \"true\"",
    ] {
        assert!(conf.lines().any(|l| l == line), "missing {line:?} in\n{conf}");
    }
    let mut one = tk::cr("ElasticsearchCluster", "logs", spec());
    one["spec"]["replicas"] = json!(1);
    let conf = tk::find(&plan(&one), "ConfigMap")["data"]["elasticsearch.yml"].as_str().unwrap().to_string();
    assert!(conf.contains("cluster.initial_master_nodes: [\"logs-0\"]"));
}

#[test]
fn pods_check_cluster_health_and_mount_the_config_file() {
    let p = plan(&tk::cr("ElasticsearchCluster", "logs", spec()));
    let sts = tk::find(&p, "StatefulSet");
    assert_eq!(sts["spec"]["podManagementPolicy"], "Parallel");
    let c = &sts["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "docker.elastic.co/elasticsearch/elasticsearch:8.15.3");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/_cluster/health?local=true");
    assert_eq!(c["livenessProbe"]["httpGet"]["port"], "http");
    let mounts = c["volumeMounts"].as_array().unwrap();
    assert!(mounts.iter().any(|m| m["subPath"] == "elasticsearch.yml"
        && m["mountPath"] == "/usr/share/elasticsearch/config/elasticsearch.yml"));
    let services = tk::find_all(&p, "Service");
    let names: Vec<&str> = services.iter().map(|s| s["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["logs-headless", "logs-http"]);
    assert_eq!(services[0]["spec"]["publishNotReadyAddresses"], true);
    assert_eq!(services[0]["spec"]["ports"].as_array().unwrap().len(), 2);
    assert_eq!(tk::extra(&p)["clusterHealth"]["status"], "unknown");
    let r = &c["resources"];
    assert_eq!(r["limits"]["memory"], "2Gi");
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
    let mut two = five.clone();
    two["spec"]["replicas"] = json!(2);
    assert!(errs(&five, &two)[0].contains("master quorum"));
    let mut four = five.clone();
    four["spec"]["replicas"] = json!(4);
    assert!(errs(&five, &four).is_empty());
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
    assert_eq!(asks(&[pod, service]), [stateward_sdk::HttpTarget::Service("logs-http".into())]);
}

#[test]
fn a_switchover_is_refused_with_the_reason() {
    let mut cr = tk::cr("ElasticsearchCluster", "logs", spec());
    cr["metadata"]["annotations"] = json!({ "stateward.dev/switchover-to": "logs-1" });
    let errs = Elasticsearch::validate(&cr.to_string(), None);
    let refusal = errs.iter().find(|e| e.path == "metadata.annotations[stateward.dev/switchover-to]");
    assert!(refusal.is_some_and(|e| e.message.contains("no primary")), "{errs:?}");
}
