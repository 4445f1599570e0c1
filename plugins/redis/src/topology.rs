//! The topology the pods of replication mode start from: the ConfigMap `<name>-topology`
//! (`peers`: the pods' stable names; `quorum`: the Sentinels'), read into the container's
//! environment at every start. Not part of the configuration hash, so scaling rolls no pod;
//! a running Sentinel gets a new quorum through `SENTINEL SET` (see [`crate::live`]).

use serde_json::{json, Value};
use stateward_sdk::builders::Ctx;
use stateward_sdk::json::to_text;

use crate::sentinel;

/// `<name>-topology`.
pub fn name(ctx: &Ctx) -> String {
    format!("{}-topology", ctx.name())
}

/// The pods' stable names, space-separated.
pub fn peers(ctx: &Ctx) -> String {
    (0..ctx.cluster.spec.replicas).map(|i| ctx.pod_host(i)).collect::<Vec<_>>().join(" ")
}

/// The ConfigMap, as JSON text for an apply.
pub fn config_map(ctx: &Ctx) -> String {
    to_text(&json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": ctx.metadata(&name(ctx)),
        "data": { "peers": peers(ctx), "quorum": sentinel::quorum(ctx).to_string() },
    }))
}

/// The container's environment from it.
pub fn env_vars(ctx: &Ctx) -> Vec<Value> {
    let from = |var: &str, key: &str| json!({ "name": var, "valueFrom": { "configMapKeyRef": { "name": name(ctx), "key": key, "optional": true } } });
    vec![from("STATEWARD_PEERS", "peers"), from("STATEWARD_QUORUM", "quorum")]
}
