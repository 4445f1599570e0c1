//! The guardrails over a plugin's plan, shared by the controller and `stateward render`: every
//! action becomes one `data.stateward.guardrails` decision, asked of the policy [`Gate`] with
//! the plugin's identity. The inputs are built by [`crate::policy_input`].

use serde_json::Value;

use crate::policy::{DecisionContext, Gate, PlanVerdict};
use crate::policy_input::{self, PlanAuthor, PlannedAction};
use crate::runtime::{Action, Plugin, RuntimeError, StatusReport};

/// Evaluates (and audits) the guardrails for every action of a plan against `resource`, whose
/// observed `children` name the pods a request may go to, and for its status write if any
/// (a cleanup writes none).
pub fn check(
    gate: &Gate,
    plugin: &Plugin,
    resource: &Value,
    children: &[Value],
    actions: &[Action],
    status: Option<&StatusReport>,
) -> PlanVerdict {
    let planned: Vec<PlannedAction> = actions
        .iter()
        .map(|a| PlannedAction::of(a, resource, children))
        .chain(status.map(|s| PlannedAction::status(s, resource)))
        .collect();
    let ctx = DecisionContext::in_current_span(format!("plugin/{}", plugin.name()));
    gate.check_plan(&ctx, &PlanAuthor::of(plugin), &policy_input::resource(resource), &planned)
}

/// Audits a plan the host refused itself ([`RuntimeError::is_refusal`]), before policy was
/// asked: one record with the reason. Other failures (a trap, a timeout) are not decisions and
/// are not recorded. An audit that cannot be written is logged; the plan stays refused.
pub fn record_refusal(gate: &Gate, plugin: &Plugin, resource: &Value, err: &RuntimeError) {
    if !err.is_refusal() {
        return;
    }
    let ctx = DecisionContext::in_current_span(format!("plugin/{}", plugin.name()));
    let reason = err.to_string();
    if let Err(e) = gate.record_refusal(
        &ctx,
        &PlanAuthor::of(plugin),
        &policy_input::resource(resource),
        err.label(),
        &reason,
    ) {
        tracing::error!(error = %e, refusal = %reason, "cannot audit a refused plan");
    }
}
