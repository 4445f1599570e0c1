//! The audit sweep, as Gatekeeper's audit does for admission: on an interval and whenever the
//! policy bundle changes, every existing resource of a kind is evaluated against
//! `stateward.admission` as operation `AUDIT` (no user: rules opt in by matching that
//! operation). Nothing is changed or blocked; the findings become the `PolicyCompliant`
//! condition (written by the next reconcile, so status has one writer) and the
//! `stateward_policy_violations{kind,rule}` gauge.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use kube::core::DynamicObject;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::ResourceExt;
use serde_json::Value;
use tokio::sync::mpsc;

use super::Context;
use crate::policy::{engine::rule_id, DecisionContext};
use crate::policy_input::AdmissionRequest;
use crate::runtime::{Condition, ConditionStatus};

/// The user name the sweep's decisions carry in the audit log.
pub const SWEEP_USER: &str = "system:stateward:audit-sweep";

/// What the latest sweep found for one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub denied: Vec<String>,
    pub warned: Vec<String>,
    pub bundle: String,
}

impl Finding {
    /// The condition this finding shows as.
    pub fn condition(&self) -> Condition {
        let (status, reason, message) = if self.denied.is_empty() {
            let mut message = format!("admission policy {} admits this resource", self.bundle);
            if !self.warned.is_empty() {
                message = format!("{message}; warnings: {}", self.warned.join("; "));
            }
            (ConditionStatus::True, "Compliant", message)
        } else {
            (ConditionStatus::False, "PolicyViolation", self.denied.join("; "))
        };
        Condition { type_: super::status::SWEEP_CONDITION.into(), status, reason: reason.into(), message }
    }
}

/// Findings of one kind, shared between its sweep and its reconciles.
#[derive(Debug, Clone, Default)]
pub struct Findings(Arc<RwLock<HashMap<(String, String), Finding>>>);

impl Findings {
    pub fn get(&self, namespace: &str, name: &str) -> Option<Finding> {
        let map = self.0.read().unwrap_or_else(PoisonError::into_inner);
        map.get(&(namespace.to_string(), name.to_string())).cloned()
    }

    /// Stores a finding; true when it differs from the previous one.
    fn set(&self, namespace: &str, name: &str, finding: Finding) -> bool {
        let mut map = self.0.write().unwrap_or_else(PoisonError::into_inner);
        map.insert((namespace.to_string(), name.to_string()), finding.clone()) != Some(finding)
    }

    fn retain(&self, keep: &std::collections::HashSet<(String, String)>) {
        let mut map = self.0.write().unwrap_or_else(PoisonError::into_inner);
        map.retain(|k, _| keep.contains(k));
    }
}

/// Runs the sweep for one kind until dropped (it never returns by itself): after `interval`, or when `poke` fires (a new
/// policy bundle). Resources whose finding changed are sent to `changed` for a reconcile.
pub async fn run(
    ctx: Arc<Context>,
    store: Store<DynamicObject>,
    interval: Duration,
    mut poke: impl futures::Stream<Item = ()> + Unpin,
    changed: mpsc::UnboundedSender<ObjectRef<DynamicObject>>,
) {
    use futures::StreamExt;
    if store.wait_until_ready().await.is_err() {
        return std::future::pending().await;
    }
    let mut poked = true;
    loop {
        sweep_once(&ctx, &store, &changed).await;
        if poked {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                next = poke.next() => poked = next.is_some(),
            }
        } else {
            tokio::time::sleep(interval).await;
        }
    }
}

async fn sweep_once(
    ctx: &Arc<Context>,
    store: &Store<DynamicObject>,
    changed: &mpsc::UnboundedSender<ObjectRef<DynamicObject>>,
) {
    let gate = ctx.gate.current();
    let bundle = gate.digest().to_string();
    let mut counts: BTreeMap<String, i64> = BTreeMap::new();
    let mut present = std::collections::HashSet::new();
    let objects = store.state();
    for obj in &objects {
        if obj.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let (namespace, name) = (obj.namespace().unwrap_or_default(), obj.name_any());
        let object = serde_json::to_value(obj.as_ref()).unwrap_or(Value::Null);
        let request = AdmissionRequest::audit(object, SWEEP_USER);
        let decision = DecisionContext::in_current_span(SWEEP_USER);
        let verdict = gate.admit(&decision, &request);
        let mut denied = verdict.denied.clone();
        denied.extend(verdict.dryrun.iter().map(|m| format!("{m} (dryrun)")));
        for message in verdict.denied.iter().chain(&verdict.dryrun) {
            *counts.entry(rule_id(message).unwrap_or("unnamed").to_string()).or_default() += 1;
        }
        let finding = Finding { denied, warned: verdict.warned.clone(), bundle: bundle.clone() };
        present.insert((namespace.clone(), name.clone()));
        if ctx.findings.set(&namespace, &name, finding) {
            let _ = changed.send(ObjectRef::from_obj_with(obj.as_ref(), ctx.kind.api_resource.clone()));
        }
        // Yield between decisions so a sweep of thousands never starves reconciles.
        tokio::task::yield_now().await;
    }
    ctx.findings.retain(&present);
    ctx.metrics.policy_violations(&ctx.kind.kind, &counts);
    tracing::debug!(kind = %ctx.kind.kind, resources = objects.len(), violations = counts.values().sum::<i64>(), "audit sweep done");
}
