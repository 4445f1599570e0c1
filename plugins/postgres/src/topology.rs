//! The topology the pods start from: the ConfigMap `<name>-topology`, which the container reads
//! into its environment when it starts (a ConfigMap key is read again at every container
//! start, so a restarted member sees the topology of that moment), and which is not part of
//! the configuration hash (a new primary rolls no pod).
//!
//! - `primary`: the instance that is to be the primary (`status.targetPrimary`);
//! - `primaryUid`: the uid of the pod confirmed as that primary, empty while it is not
//!   confirmed: only that very pod starts as the primary, so a pod deleted and made again
//!   under its name starts fenced, as a standby;
//! - `bootstrap`: `initdb` until the first primary answered (it may make the cluster).

use serde_json::{json, Value};
use stateward_sdk::builders::Ctx;
use stateward_sdk::json::to_text;

use crate::ha::State;

/// `<name>-topology`.
pub fn name(ctx: &Ctx) -> String {
    format!("{}-topology", ctx.name())
}

/// The ConfigMap, as JSON text for an apply.
pub fn config_map(ctx: &Ctx, st: &State) -> String {
    let uid = if st.target == st.current { st.current_uid.as_str() } else { "" };
    to_text(&json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": ctx.metadata(&name(ctx)),
        "data": {
            "primary": st.target,
            "primaryUid": uid,
            "bootstrap": if st.bootstrapping() { "initdb" } else { "" },
        },
    }))
}

/// The container's environment from it, and the pod's own name and uid.
pub fn env_vars(ctx: &Ctx) -> Vec<Value> {
    let from_topology = |var: &str, key: &str| json!({ "name": var, "valueFrom": { "configMapKeyRef": { "name": name(ctx), "key": key, "optional": true } } });
    let field =
        |var: &str, path: &str| json!({ "name": var, "valueFrom": { "fieldRef": { "fieldPath": path } } });
    vec![
        field("POD_NAME", "metadata.name"),
        field("POD_UID", "metadata.uid"),
        from_topology("STATEWARD_PRIMARY", "primary"),
        from_topology("STATEWARD_PRIMARY_UID", "primaryUid"),
        from_topology("STATEWARD_BOOTSTRAP", "bootstrap"),
    ]
}
