//! Services, ConfigMap, PodDisruptionBudget and Secret requests.

use serde_json::{json, Map, Value};

use super::Ctx;
use crate::types::SecretRequest;

/// A named container port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Port {
    pub name: &'static str,
    pub port: u16,
}

fn service_ports(ports: &[Port]) -> Vec<Value> {
    ports
        .iter()
        .map(|p| json!({ "name": p.name, "port": p.port, "targetPort": p.name, "protocol": "TCP" }))
        .collect()
}

/// The governing headless Service: stable pod DNS names, published before readiness so
/// members can find each other while they form a cluster.
pub fn headless_service(ctx: &Ctx, ports: &[Port]) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": ctx.metadata(&ctx.headless()),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": true,
            "selector": ctx.service_selector(),
            "ports": service_ports(ports),
        }
    })
}

/// A ClusterIP Service for clients; `extra_selector` narrows it (e.g. to the primary pod).
pub fn client_service(ctx: &Ctx, name: &str, ports: &[Port], extra_selector: &[(&str, String)]) -> Value {
    let mut selector = ctx.service_selector();
    // A fenced pod is in no client Service (see `fence`).
    selector.insert(crate::fence::FENCED_LABEL.into(), json!("false"));
    for (k, v) in extra_selector {
        selector.insert((*k).to_string(), json!(v));
    }
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": ctx.metadata(name),
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": service_ports(ports),
        }
    })
}

/// Selector label naming one StatefulSet pod (set by the StatefulSet controller).
pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";

/// The ConfigMap holding the generated server configuration.
pub fn config_map(ctx: &Ctx, files: &[(&str, &str)]) -> Value {
    let mut data = Map::new();
    for (k, v) in files {
        data.insert((*k).to_string(), json!(v));
    }
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": ctx.metadata(&ctx.config_map()),
        "data": data,
    })
}

/// A PodDisruptionBudget letting at most one member go at a time.
pub fn pod_disruption_budget(ctx: &Ctx) -> Value {
    json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": ctx.metadata(ctx.name()),
        "spec": {
            "maxUnavailable": 1,
            "selector": { "matchLabels": ctx.selector() },
        }
    })
}

/// The members' certificate Secret: the host issues it from the instance's CA for the
/// instance's Services (until it does, the keys hold placeholders), with the usages of `role`,
/// and renews it before it expires.
pub fn server_certificate(ctx: &Ctx, role: super::CertificateRole) -> SecretRequest {
    let mut labels = ctx.label_pairs();
    labels.push((super::CERTIFICATE_LABEL.to_string(), role.label_value().to_string()));
    SecretRequest {
        name: ctx.tls_secret(),
        keys: ["tls.crt", "tls.key", "ca.crt"].iter().map(|k| ((*k).to_string(), 32)).collect(),
        labels,
        derived: Vec::new(),
    }
}

/// The credentials Secret, created by the host with random values if absent; `derived` keys
/// are filled from templates.
pub fn credentials(ctx: &Ctx, keys: &[(&str, u32)], derived: &[(&str, &str)]) -> SecretRequest {
    SecretRequest {
        name: ctx.secret(),
        keys: keys.iter().map(|(k, n)| ((*k).to_string(), *n)).collect(),
        labels: ctx.label_pairs(),
        derived: derived.iter().map(|(k, t)| ((*k).to_string(), (*t).to_string())).collect(),
    }
}
