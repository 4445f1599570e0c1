//! The policy gate: turns the three decision points into typed calls, applies each rule's
//! enforcement mode, and audits every decision. It never returns an error: every failure
//! (missing rule, evaluation error, unwritable audit sink) is a deny inside the verdict.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::audit::{AuditLog, DecisionRecord};
use super::engine::{rule_id, DecisionPoint, Evaluation, Mode, PolicyEngine};

/// Who and what a decision belongs to, for the audit log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DecisionContext {
    /// W3C trace id of the caller's span (empty when untraced).
    pub trace_id: String,
    /// Span id of the caller's span (empty when untraced).
    pub span_id: String,
    /// Who asked; when empty the gate fills in the plugin, the user or `stateward`.
    pub requested_by: String,
}

/// A Kubernetes kind, as plugins declare the kinds they own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KindRef {
    /// e.g. `apps/v1`.
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    /// e.g. `StatefulSet`.
    pub kind: String,
}

/// The plugin whose plan is checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginRef {
    /// Plugin name.
    pub name: String,
    /// Plugin version.
    pub version: String,
    /// `sha256:<hex>` of the component.
    pub digest: String,
    /// Kinds the plugin declares it owns (policy input `plugin.owns`).
    pub owns: Vec<KindRef>,
}

/// One action of a plan, independent of wasmtime types. `object` is Kubernetes-shaped: an
/// apply carries the object, a delete `{apiVersion, kind, metadata:{name}}`, an ensure-secret
/// `{apiVersion:"v1", kind:"Secret", metadata:{name, labels}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedAction {
    /// `apply`, `delete` or `ensure-secret`.
    pub verb: String,
    /// The object acted on.
    pub object: Value,
}

/// The admission request's essentials (policy input of `stateward.admission`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    /// `CREATE`, `UPDATE`, `DELETE`.
    pub operation: String,
    /// The requesting user.
    pub user_info: UserInfo,
    /// The new object (`null` on DELETE).
    #[serde(default)]
    pub object: Value,
    /// The old object (`null` on CREATE).
    #[serde(default)]
    pub old_object: Value,
    /// Whether the request is a dry run.
    #[serde(default)]
    pub dry_run: bool,
}

/// The requesting user of an admission request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserInfo {
    /// User name.
    pub username: String,
    /// Groups, e.g. `stateward:admins`.
    #[serde(default)]
    pub groups: Vec<String>,
}

/// A plugin build about to load (policy input of `stateward.plugins`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginLoad {
    /// Plugin name.
    pub name: String,
    /// Plugin version.
    pub version: String,
    /// `sha256:<hex>` of the component.
    pub digest: String,
    /// Component size in bytes.
    pub size: u64,
    /// Kinds it declares.
    pub kinds: Vec<KindRef>,
}

/// The enforced outcome of one decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The audit log's `decision_id`.
    pub decision_id: String,
    /// The decision point.
    pub point: DecisionPoint,
    /// Messages that block: rules in `deny` mode, plus `policy-error:`/`audit-error:` failures.
    pub denied: Vec<String>,
    /// Messages to surface as warnings: the `warn` set and rules in `warn` mode.
    pub warned: Vec<String>,
    /// Messages of rules in `dryrun` mode: would have been denied; audited only.
    pub dryrun: Vec<String>,
    /// Evaluation or audit error (the verdict is then a deny).
    pub error: Option<String>,
}

impl Verdict {
    /// True when nothing blocks.
    pub fn allowed(&self) -> bool {
        self.denied.is_empty() && self.error.is_none()
    }
}

/// The verdict on one planned action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionVerdict {
    /// Position in the plan.
    pub index: usize,
    /// The action's verb.
    pub verb: String,
    /// `apiVersion/kind/name` of the object, for status and Events.
    pub target: String,
    /// The decision.
    pub verdict: Verdict,
}

/// The verdict on a whole plan: it may be applied only if every action is allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanVerdict {
    /// One verdict per action, in plan order.
    pub actions: Vec<ActionVerdict>,
}

impl PlanVerdict {
    /// False on any enforced deny, evaluation error or audit failure.
    pub fn allowed(&self) -> bool {
        self.actions.iter().all(|a| a.verdict.allowed())
    }

    /// `(target, message)` of every enforced deny, for the Degraded condition and Events.
    pub fn denials(&self) -> Vec<(String, String)> {
        self.actions
            .iter()
            .flat_map(|a| {
                a.verdict
                    .denied
                    .iter()
                    .map(|m| (a.target.clone(), m.clone()))
            })
            .collect()
    }

    /// `(target, message)` of every warning.
    pub fn warnings(&self) -> Vec<(String, String)> {
        self.actions
            .iter()
            .flat_map(|a| {
                a.verdict
                    .warned
                    .iter()
                    .map(|m| (a.target.clone(), m.clone()))
            })
            .collect()
    }
}

/// Builds the guardrails `resource` block `{apiVersion, kind, namespace, name, generation,
/// spec}` from a full custom resource.
pub fn resource_input(cr: &Value) -> Value {
    let meta = |k: &str| {
        cr.pointer(&format!("/metadata/{k}"))
            .cloned()
            .unwrap_or(Value::Null)
    };
    json!({
        "apiVersion": cr.get("apiVersion").cloned().unwrap_or(Value::Null),
        "kind": cr.get("kind").cloned().unwrap_or(Value::Null),
        "namespace": meta("namespace"),
        "name": meta("name"),
        "generation": meta("generation"),
        "spec": cr.get("spec").cloned().unwrap_or(Value::Null),
    })
}

/// An immutable engine plus its audit log. Cheap to clone and share; replace the whole gate
/// (e.g. behind an `ArcSwap`) when a new bundle is accepted.
#[derive(Debug, Clone)]
pub struct Gate {
    engine: Arc<PolicyEngine>,
    audit: Arc<AuditLog>,
}

/// The gate in force, replaced whole when a new policy bundle is accepted (hot reload).
/// Decisions already running keep the gate they started with.
#[derive(Debug)]
pub struct LiveGate(std::sync::RwLock<Arc<Gate>>);

impl LiveGate {
    pub fn new(gate: Gate) -> Self {
        Self(std::sync::RwLock::new(Arc::new(gate)))
    }

    /// The gate to decide with now.
    pub fn current(&self) -> Arc<Gate> {
        Arc::clone(&self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Makes `gate` the one every later decision uses.
    pub fn replace(&self, gate: Gate) {
        *self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(gate);
    }
}

impl Gate {
    /// A gate deciding with `engine` and recording to `audit`.
    pub fn new(engine: Arc<PolicyEngine>, audit: Arc<AuditLog>) -> Self {
        Self { engine, audit }
    }

    /// A gate deciding with another engine into the same audit log (a reloaded bundle).
    pub fn with_engine(&self, engine: Arc<PolicyEngine>) -> Self {
        Self { engine, audit: Arc::clone(&self.audit) }
    }

    /// The engine (for its digest, e.g. on `/debug/healthz`).
    pub fn engine(&self) -> &Arc<PolicyEngine> {
        &self.engine
    }

    /// Checks every action of a plugin's plan against `stateward.guardrails`, one audited
    /// decision per action. `resource` is the block built by [`resource_input`].
    pub fn check_plan(
        &self,
        ctx: &DecisionContext,
        plugin: &PluginRef,
        resource: &Value,
        actions: &[PlannedAction],
    ) -> PlanVerdict {
        let requested_by = if ctx.requested_by.is_empty() {
            format!("plugin/{}", plugin.name)
        } else {
            ctx.requested_by.clone()
        };
        let plugin_json = json!({
            "name": plugin.name, "version": plugin.version, "digest": plugin.digest, "owns": plugin.owns,
        });
        let mut actions: Vec<ActionVerdict> = actions
            .iter()
            .enumerate()
            .map(|(index, a)| {
                let input = json!({
                    "plugin": plugin_json,
                    "resource": resource,
                    "action": {"verb": a.verb, "object": a.object},
                });
                let s = |p: &str| a.object.pointer(p).and_then(Value::as_str).unwrap_or("");
                ActionVerdict {
                    index,
                    verb: a.verb.clone(),
                    target: format!(
                        "{}/{}/{}",
                        s("/apiVersion"),
                        s("/kind"),
                        s("/metadata/name")
                    ),
                    verdict: {
                        let ev = self.engine.evaluate(DecisionPoint::Guardrails, &input);
                        self.enforce_and_audit(ctx, &requested_by, DecisionPoint::Guardrails, &input, ev, false)
                    },
                }
            })
            .collect();
        // One sync for the whole plan (group commit); if it fails, no action is allowed.
        if let Err(e) = self.audit.sync() {
            for a in &mut actions {
                a.verdict.denied.push(format!("audit-error: {e}"));
                a.verdict.error = Some(e.to_string());
            }
        }
        PlanVerdict { actions }
    }

    /// Decides an admission request with `stateward.admission`.
    pub fn admit(&self, ctx: &DecisionContext, req: &AdmissionRequest) -> Verdict {
        let requested_by = if ctx.requested_by.is_empty() {
            req.user_info.username.clone()
        } else {
            ctx.requested_by.clone()
        };
        self.decide_serialized(ctx, &requested_by, DecisionPoint::Admission, req)
    }

    /// Decides whether a plugin build may load with `stateward.plugins`.
    pub fn plugin_load(&self, ctx: &DecisionContext, load: &PluginLoad) -> Verdict {
        let requested_by = if ctx.requested_by.is_empty() {
            "stateward".to_string()
        } else {
            ctx.requested_by.clone()
        };
        self.decide_serialized(ctx, &requested_by, DecisionPoint::Plugins, load)
    }

    fn decide_serialized<T: Serialize>(
        &self,
        ctx: &DecisionContext,
        requested_by: &str,
        point: DecisionPoint,
        input: &T,
    ) -> Verdict {
        match serde_json::to_value(input) {
            Ok(input) => self.decide(ctx, requested_by, point, &input),
            Err(e) => {
                let ev = Evaluation {
                    error: Some(format!("encoding input: {e}")),
                    ..Evaluation::default()
                };
                self.enforce_and_audit(ctx, requested_by, point, &Value::Null, ev, true)
            }
        }
    }

    /// Evaluates `point` for `input`, applies enforcement modes and audits the decision.
    pub fn decide(
        &self,
        ctx: &DecisionContext,
        requested_by: &str,
        point: DecisionPoint,
        input: &Value,
    ) -> Verdict {
        let ev = self.engine.evaluate(point, input);
        self.enforce_and_audit(ctx, requested_by, point, input, ev, true)
    }

    fn enforce_and_audit(
        &self,
        ctx: &DecisionContext,
        requested_by: &str,
        point: DecisionPoint,
        input: &Value,
        ev: Evaluation,
        sync: bool,
    ) -> Verdict {
        let mut v = Verdict {
            decision_id: uuid::Uuid::new_v4().to_string(),
            point,
            denied: Vec::new(),
            warned: Vec::new(),
            dryrun: Vec::new(),
            error: ev.error.clone(),
        };
        for msg in &ev.deny {
            match self.engine.mode(point, rule_id(msg)) {
                Mode::Deny => v.denied.push(msg.clone()),
                Mode::Warn => v.warned.push(msg.clone()),
                Mode::Dryrun => v.dryrun.push(msg.clone()),
            }
        }
        v.warned.extend(ev.warn.iter().cloned());
        if let Some(e) = &ev.error {
            v.denied.push(format!("policy-error: {e}"));
        }
        let result = json!({
            "deny": ev.deny,
            "warn": ev.warn,
            "enforced": {
                "allowed": v.allowed(),
                "denied": v.denied,
                "warned": v.warned,
                "dryrun": v.dryrun,
            },
        });
        let rec = DecisionRecord {
            decision_id: &v.decision_id,
            point,
            input,
            result,
            error: ev.error.as_deref(),
            bundle_digest: self.engine.digest(),
            trace_id: &ctx.trace_id,
            span_id: &ctx.span_id,
            requested_by,
            eval_ns: ev.eval_ns,
        };
        let appended = if sync { self.audit.append(&rec) } else { self.audit.append_unsynced(&rec) };
        if let Err(e) = appended {
            v.denied.push(format!("audit-error: {e}"));
            v.error = Some(e.to_string());
        }
        v
    }
}
