//! The guardrails gate over a plugin's plan, shared by the controller and `stateward render`:
//! every action becomes one `data.stateward.guardrails` decision with the plugin's identity.

use serde_json::{json, Value};

use crate::policy::gate::resource_input;
use crate::policy::{DecisionContext, Gate, KindRef, PlanVerdict, PlannedAction, PluginRef};
use crate::runtime::{Action, Plugin};

/// Evaluates (and audits) the guardrails for every action of a plan against `resource`.
pub fn check(gate: &Gate, plugin: &Plugin, resource: &Value, actions: &[Action]) -> PlanVerdict {
    let planned: Vec<PlannedAction> = actions.iter().map(|a| planned(a, resource)).collect();
    let plugin_ref = PluginRef {
        name: plugin.name().to_string(),
        version: plugin.version().to_string(),
        digest: plugin.digest().to_string(),
        owns: plugin
            .info()
            .owns
            .iter()
            .map(|c| KindRef {
                api_version: c.api_version.clone(),
                kind: c.kind.clone(),
            })
            .collect(),
    };
    let ctx = DecisionContext {
        requested_by: format!("plugin/{}", plugin.name()),
        ..DecisionContext::default()
    };
    gate.check_plan(&ctx, &plugin_ref, &resource_input(resource), &planned)
}

/// The object a policy sees for each verb: the applied object itself, or a skeleton naming
/// what is deleted or which Secret keys are ensured (never any value).
fn planned(action: &Action, resource: &Value) -> PlannedAction {
    let ns = resource
        .pointer("/metadata/namespace")
        .cloned()
        .unwrap_or(Value::Null);
    let object = match action {
        Action::Apply { object } => object.clone(),
        Action::Delete { target } => json!({
            "apiVersion": target.api_version, "kind": target.kind,
            "metadata": {"name": target.name, "namespace": ns},
        }),
        Action::EnsureSecret { secret } => json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": secret.name, "namespace": ns},
            "keys": secret.keys.iter().map(|(k, _)| k).collect::<Vec<_>>(),
        }),
    };
    PlannedAction {
        verb: action.verb().to_string(),
        object,
    }
}
