//! The shipped NetworkPolicy (deploy/operator/networkpolicy.yaml), which the local cluster
//! cannot enforce (it runs no network plugin): checked against the manifests it must match,
//! and accepted by the real API server.

use crate::e2e;

use anyhow::{ensure, Context as _};
use serde_json::{json, Value};
use stateward_testkit::TestEnv;

/// The shipped NetworkPolicy selects the operator's pods, opens the webhook Service's target
/// port to all (the API server's address is not portable) and the metrics port to scraping
/// namespaces only, and the API server accepts it.
#[tokio::test]
async fn the_shipped_network_policy_opens_the_webhook_port_and_metrics_to_scrapers_only() -> anyhow::Result<()>
{
    let root = e2e::workspace_root().join("deploy");
    let load = |rel: &str| -> anyhow::Result<Value> {
        let text = std::fs::read_to_string(root.join(rel))?;
        Ok(yaml_serde::from_str(&text)?)
    };
    let policy = load("operator/networkpolicy.yaml")?;
    let sts = load("operator/deployment.yaml")?;
    let service = load("webhook/service.yaml")?;
    let selected = &policy["spec"]["podSelector"]["matchLabels"];
    let labels = &sts["spec"]["template"]["metadata"]["labels"];
    for (k, v) in selected.as_object().context("podSelector")? {
        ensure!(labels[k] == *v, "podSelector {k}={v} does not match the operator's pods: {labels}");
    }
    let rules = policy["spec"]["ingress"].as_array().context("ingress")?;
    ensure!(rules.len() == 2, "{rules:?}");
    let webhook_port = &service["spec"]["ports"][0]["targetPort"];
    ensure!(
        rules[0]["ports"][0]["port"] == *webhook_port && rules[0].get("from").is_none(),
        "{:?}",
        rules[0]
    );
    let http = sts["spec"]["template"]["spec"]["containers"][0]["ports"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == "http"))
        .context("no http port")?;
    ensure!(rules[1]["ports"][0]["port"] == http["containerPort"], "{:?}", rules[1]);
    ensure!(
        rules[1]["from"][0]["namespaceSelector"]["matchLabels"]["stateward.dev/scrape-metrics"] == "true",
        "{:?}",
        rules[1]
    );
    // The API server's validation (server-side dry run, in this test's namespace).
    let env = TestEnv::new("netpol").await?;
    let mut policy = policy;
    policy["metadata"]["namespace"] = json!(env.namespace);
    let out = e2e::kubectl_stdin(&env, &["apply", "--dry-run=server", "-f", "-"], &policy.to_string());
    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}
