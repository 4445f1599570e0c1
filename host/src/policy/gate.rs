//! The policy gate: turns the three decision points into typed calls, applies each rule's
//! enforcement mode, and audits every decision. It never returns an error: every failure
//! (missing rule, evaluation error, unwritable audit sink) is a deny inside the verdict.

use std::sync::Arc;

use serde_json::{json, Value};

use super::audit::{Appended, AuditLog, DecisionRecord};
use super::engine::{DecisionPoint, Mode, PolicyEngine};
use super::floor::{self, Layered};
use crate::policy_input::{self, AdmissionRequest, PlanAuthor, PlannedAction, PluginLoad};

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

impl DecisionContext {
    /// A decision asked for by `requested_by` (empty: the gate's default) from inside the
    /// caller's current span, whose trace and span ids the audit record will carry (none when
    /// untraced). Take it where the span is current: not inside a blocking task.
    pub fn in_current_span(requested_by: impl Into<String>) -> Self {
        let (trace_id, span_id) = crate::telemetry::otel::current_ids().unwrap_or_default();
        Self { trace_id, span_id, requested_by: requested_by.into() }
    }
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
            .flat_map(|a| a.verdict.denied.iter().map(|m| (a.target.clone(), m.clone())))
            .collect()
    }

    /// `(target, message)` of every warning.
    pub fn warnings(&self) -> Vec<(String, String)> {
        self.actions
            .iter()
            .flat_map(|a| a.verdict.warned.iter().map(|m| (a.target.clone(), m.clone())))
            .collect()
    }
}

/// The floor engine, the hot-loaded layer if any ([`floor`]), and the audit log. Cheap to
/// clone and share; replace the whole gate when a new bundle is accepted.
#[derive(Debug, Clone)]
pub struct Gate {
    engine: Arc<PolicyEngine>,
    layer: Option<Arc<PolicyEngine>>,
    digest: String,
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
        let digest = engine.digest().to_string();
        Self { engine, layer: None, digest, audit }
    }

    /// The same floor and audit log with `layer` (a hot-loaded bundle) added, or with none
    /// (the floor alone again).
    pub fn with_layer(&self, layer: Option<Arc<PolicyEngine>>) -> Self {
        let digest = floor::digest(&self.engine, layer.as_deref());
        Self { engine: Arc::clone(&self.engine), layer, digest, audit: Arc::clone(&self.audit) }
    }

    /// The floor engine: the bundle the operator started with.
    pub fn engine(&self) -> &Arc<PolicyEngine> {
        &self.engine
    }

    /// Writes the repetitions counted since the last flush ([`AuditLog::flush_repetitions`]).
    pub fn flush_repetitions(&self) -> Result<usize, String> {
        self.audit.flush_repetitions().map_err(|e| e.to_string())
    }

    /// The hot-loaded layer in force, if any.
    pub fn layer(&self) -> Option<&Arc<PolicyEngine>> {
        self.layer.as_ref()
    }

    /// The digest decisions are recorded under (the floor's, or both layers' together), e.g.
    /// on `/debug/healthz`.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Checks every action of a plugin's plan against `stateward.guardrails`, one audited
    /// decision per action. `resource` is the block built by [`policy_input::resource`].
    pub fn check_plan(
        &self,
        ctx: &DecisionContext,
        plugin: &PlanAuthor,
        resource: &Value,
        actions: &[PlannedAction],
    ) -> PlanVerdict {
        let requested_by = if ctx.requested_by.is_empty() {
            format!("plugin/{}", plugin.name)
        } else {
            ctx.requested_by.clone()
        };
        let plugin_json = plugin.document();
        let mut actions: Vec<ActionVerdict> = actions
            .iter()
            .enumerate()
            .map(|(index, a)| {
                let input = policy_input::guardrails(&plugin_json, resource, a);
                let s = |p: &str| a.object.pointer(p).and_then(Value::as_str).unwrap_or("");
                ActionVerdict {
                    index,
                    verb: a.verb.clone(),
                    target: format!("{}/{}/{}", s("/apiVersion"), s("/kind"), s("/metadata/name")),
                    verdict: {
                        let ev = self.evaluate(DecisionPoint::Guardrails, &input);
                        self.enforce_and_audit(
                            ctx,
                            &requested_by,
                            DecisionPoint::Guardrails,
                            &input,
                            ev,
                            false,
                        )
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

    /// Records what came of a request the guardrails allowed (a plan's `exec` or `http`):
    /// `request` names it as its decision's input did, `outcome` says how it ended (exit code
    /// or status, error, sizes and a digest of the output, never the output itself). It is a
    /// record of the guardrails decision point without an evaluation.
    ///
    /// With `class` (a poll's answer), answers whose class is unchanged (how the poll ended,
    /// not its timings or output) are counted as repetitions of the first one written in full:
    /// an idle resource's polls do not fill the log.
    pub fn record_outcome(
        &self,
        requested_by: &str,
        request: &Value,
        outcome: Value,
        class: Option<Value>,
    ) -> Result<(), String> {
        let decision_id = uuid::Uuid::new_v4().to_string();
        let rec = DecisionRecord {
            decision_id: &decision_id,
            point: DecisionPoint::Guardrails,
            input: request,
            result: json!({ "outcome": outcome }),
            error: None,
            bundle_digest: &self.digest,
            trace_id: "",
            span_id: "",
            requested_by,
            eval_ns: 0,
        };
        let Some(class) = class else {
            return self.audit.append(&rec).map(drop).map_err(|e| e.to_string());
        };
        match self.audit.append_or_count_as(&rec, &json!({ "outcome": class })) {
            Ok(Appended::Written(_)) => self.audit.sync().map_err(|e| e.to_string()),
            Ok(Appended::Repeated(_)) => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Records a plan the host refused before asking policy (too many requests, too much
    /// input, malformed, an undeclared kind…): a record of the guardrails decision point without
    /// an evaluation, denied by the host with `reason`. `label` is the refusal's short name.
    pub fn record_refusal(
        &self,
        ctx: &DecisionContext,
        plugin: &PlanAuthor,
        resource: &Value,
        label: &str,
        reason: &str,
    ) -> Result<(), String> {
        let requested_by = if ctx.requested_by.is_empty() {
            format!("plugin/{}", plugin.name)
        } else {
            ctx.requested_by.clone()
        };
        let decision_id = uuid::Uuid::new_v4().to_string();
        let input = json!({
            "plugin": plugin.document(),
            "resource": resource,
            "action": {"verb": "plan", "refused": label},
        });
        let rec = DecisionRecord {
            decision_id: &decision_id,
            point: DecisionPoint::Guardrails,
            input: &input,
            result: json!({
                "refusedBy": "host",
                "enforced": {"allowed": false, "denied": [format!("host-refused: {reason}")]},
            }),
            error: None,
            bundle_digest: &self.digest,
            trace_id: &ctx.trace_id,
            span_id: &ctx.span_id,
            requested_by: &requested_by,
            eval_ns: 0,
        };
        self.audit.append(&rec).map(drop).map_err(|e| e.to_string())
    }

    /// Decides an admission request with `stateward.admission`.
    pub fn admit(&self, ctx: &DecisionContext, req: &AdmissionRequest) -> Verdict {
        let requested_by = if ctx.requested_by.is_empty() {
            req.user_info.username.clone()
        } else {
            ctx.requested_by.clone()
        };
        self.decide(ctx, &requested_by, DecisionPoint::Admission, &req.document(None))
    }

    /// Decides whether a plugin build may load with `stateward.plugins`.
    pub fn plugin_load(&self, ctx: &DecisionContext, load: &PluginLoad) -> Verdict {
        let requested_by =
            if ctx.requested_by.is_empty() { "stateward".to_string() } else { ctx.requested_by.clone() };
        self.decide(ctx, &requested_by, DecisionPoint::Plugins, &load.document())
    }

    /// Evaluates `point` for `input`, applies enforcement modes and audits the decision.
    pub fn decide(
        &self,
        ctx: &DecisionContext,
        requested_by: &str,
        point: DecisionPoint,
        input: &Value,
    ) -> Verdict {
        let ev = self.evaluate(point, input);
        // An admission record keeps what the rules read of the objects, not the objects.
        let recorded = match point {
            DecisionPoint::Admission => std::borrow::Cow::Owned(crate::policy_input::admission_record(input)),
            _ => std::borrow::Cow::Borrowed(input),
        };
        self.enforce_and_audit(ctx, requested_by, point, &recorded, ev, true)
    }

    fn evaluate(&self, point: DecisionPoint, input: &Value) -> Layered {
        floor::evaluate(&self.engine, self.layer.as_deref(), point, input)
    }

    fn enforce_and_audit(
        &self,
        ctx: &DecisionContext,
        requested_by: &str,
        point: DecisionPoint,
        input: &Value,
        layered: Layered,
        sync: bool,
    ) -> Verdict {
        let Layered { evaluation: ev, modes } = layered;
        let mut v = Verdict {
            decision_id: uuid::Uuid::new_v4().to_string(),
            point,
            denied: Vec::new(),
            warned: Vec::new(),
            dryrun: Vec::new(),
            error: ev.error.clone(),
        };
        for (msg, mode) in modes {
            match mode {
                Mode::Deny => v.denied.push(msg),
                Mode::Warn => v.warned.push(msg),
                Mode::Dryrun => v.dryrun.push(msg),
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
            bundle_digest: &self.digest,
            trace_id: &ctx.trace_id,
            span_id: &ctx.span_id,
            requested_by,
            eval_ns: ev.eval_ns,
        };
        // A plan's actions (the only decisions batched) are decided again on every wake of a
        // converged resource: their unchanged repetitions are counted, not written again, and
        // the verdict names the decision it repeats.
        let appended = match sync {
            true => self.audit.append(&rec).map(|_| None),
            false => self.audit.append_or_count(&rec).map(|a| match a {
                Appended::Repeated(original) => Some(original.decision_id),
                Appended::Written(_) => None,
            }),
        };
        match appended {
            Ok(Some(repeated)) => v.decision_id = repeated,
            Ok(None) => {}
            Err(e) => {
                v.denied.push(format!("audit-error: {e}"));
                v.error = Some(e.to_string());
            }
        }
        v
    }
}
