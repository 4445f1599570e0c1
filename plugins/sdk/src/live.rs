//! The running service, seen through requests (WIT 0.2): which pods can be asked, polls to
//! ask them, and thresholds that turn the answers into conditions and Warning events — the
//! health checks no probe sees (connections in use, memory against its limit, cluster health).
//!
//! A threshold must be crossed on several answers in a row before it fires, so one spike does
//! not flap the condition; the count is carried from one reconcile to the next in the status
//! the plugin itself wrote.

use serde_json::{json, Map, Value};

use crate::builders::TEMPLATE_HASH_ANNOTATION;
use crate::json::str_at;
use crate::types::*;

/// A Pod of the instance as the host observed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub name: String,
    /// `metadata.uid`: a Pod deleted and made again under the same name has another.
    pub uid: String,
    /// The Ready condition is True.
    pub ready: bool,
    /// Names of the containers that are running.
    pub running: Vec<String>,
    /// Restarts of all its containers together: a container that exited and was started
    /// again is a new process in the same Pod.
    pub restarts: i64,
    /// The Pod has a deletionTimestamp: it is going away.
    pub deleting: bool,
    /// The StatefulSet revision the Pod was made from (`controller-revision-hash`).
    pub revision: String,
    /// `status.podIP` (empty before it has one).
    pub ip: String,
    /// `metadata.labels`.
    pub labels: std::collections::BTreeMap<String, String>,
}

impl PodView {
    /// Whether `container` can be asked something now.
    pub fn can_exec(&self, container: &str) -> bool {
        self.running.iter().any(|c| c == container)
    }
}

/// The pods among the observed children, by name.
pub fn pods(children: &[Value]) -> Vec<PodView> {
    let mut pods: Vec<PodView> = children
        .iter()
        .filter(|c| str_at(c, &["kind"]) == Some("Pod"))
        .filter_map(|p| {
            let name = str_at(p, &["metadata", "name"])?.to_string();
            let ready = p
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            let running = p
                .pointer("/status/containerStatuses")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter(|c| c.pointer("/state/running").is_some())
                .filter_map(|c| c["name"].as_str().map(str::to_string))
                .collect();
            let uid = str_at(p, &["metadata", "uid"]).unwrap_or_default().to_string();
            let restarts = p
                .pointer("/status/containerStatuses")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|c| c["restartCount"].as_i64())
                .sum();
            let deleting = p.pointer("/metadata/deletionTimestamp").is_some_and(|v| !v.is_null());
            let revision = str_at(p, &["metadata", "labels", "controller-revision-hash"])
                .unwrap_or_default()
                .to_string();
            let ip = str_at(p, &["status", "podIP"]).unwrap_or_default().to_string();
            let labels = p
                .pointer("/metadata/labels")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect();
            Some(PodView { name, uid, ready, running, restarts, deleting, revision, ip, labels })
        })
        .collect();
    pods.sort_by(|a, b| a.name.cmp(&b.name));
    pods
}

/// The revision the StatefulSet `name` among `children` makes new pods from, once its
/// controller has seen its latest spec and the cache holds the pod template the plugin renders
/// now, `template_hash` (None before: which pods are outdated is not known yet). The cache may
/// lag one StatefulSet behind another after an apply; a plugin rolling several sets in an
/// order would otherwise take a set not seen yet for one with nothing to roll. A StatefulSet
/// without the hash (made by an earlier version) is not known either until the apply that
/// stamps it: its revision is what the earlier version's template made, and a plugin taking
/// over would take those pods for current ones.
pub fn update_revision(children: &[Value], name: &str, template_hash: Option<&str>) -> Option<String> {
    let sts = children.iter().find(|c| {
        str_at(c, &["kind"]) == Some("StatefulSet") && str_at(c, &["metadata", "name"]) == Some(name)
    })?;
    let seen = str_at(sts, &["metadata", "annotations", TEMPLATE_HASH_ANNOTATION]);
    if let Some(want) = template_hash {
        if seen != Some(want) {
            return None;
        }
    }
    let generation = sts.pointer("/metadata/generation").and_then(Value::as_i64)?;
    let observed = sts.pointer("/status/observedGeneration").and_then(Value::as_i64)?;
    let revision = str_at(sts, &["status", "updateRevision"]).filter(|r| !r.is_empty())?;
    (observed >= generation).then(|| revision.to_string())
}

/// The names of the Services among `children`.
pub fn services(children: &[Value]) -> Vec<String> {
    children
        .iter()
        .filter(|c| str_at(c, &["apiVersion"]) == Some("v1") && str_at(c, &["kind"]) == Some("Service"))
        .filter_map(|c| str_at(c, &["metadata", "name"]).map(str::to_string))
        .collect()
}

/// A poll: `command` in `container` of `pod`, at most every `every_ms`, answered within
/// `timeout_ms` (or with an error saying it was not).
pub fn poll_exec(
    id: &str,
    pod: &str,
    container: &str,
    command: &[&str],
    every_ms: u64,
    timeout_ms: u32,
) -> Action {
    Action::Exec(ExecRequest {
        id: id.to_string(),
        mode: RequestMode::EveryMs(every_ms),
        pod: pod.to_string(),
        container: container.to_string(),
        command: command.iter().map(|s| (*s).to_string()).collect(),
        stdin: None,
        timeout_ms,
    })
}

/// The answer to request `id`, if there is one.
pub fn response<'a>(responses: &'a [Response], id: &str) -> Option<&'a Response> {
    responses.iter().find(|r| r.id == id)
}

/// One check of a threshold: whether `value` is past `limit` this time.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    /// What was measured, e.g. the pod name.
    pub subject: String,
    /// When the answer it was read from was asked (its `started-at-ms`): the same answer is
    /// handed to every reconcile until the next poll, and counts once.
    pub answered_at_ms: u64,
    pub value: f64,
    pub limit: f64,
    /// How the reading reads in a message, e.g. "97 of 100 connections in use".
    pub describe: String,
}

impl Reading {
    pub fn over(&self) -> bool {
        self.value > self.limit
    }
}

/// `status.health` (the streaks [`Health`] keeps) for a plugin's status schema.
pub fn health_schema() -> Value {
    json!({
        "type": "object",
        "description": "Health checks' consecutive readings over their threshold, per subject (an instance, or the cluster).",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// What an entry of a per-pod list (`status.instances`, …) says while its pod's poll has no
/// answer yet: `{"pod": …, "error": NO_ANSWER_YET}`.
pub const NO_ANSWER_YET: &str = "no answer yet";

/// In each per-pod list of `status` (entries with a `pod`), an entry still waiting for its
/// first answer takes the one `previous` (the stored status) held for that pod; the driver
/// does this while a new leader has no answer at all (see `held_health`).
pub fn hold_unanswered(status: &mut Map<String, Value>, previous: &Value) {
    for (key, list) in status.iter_mut() {
        let (Some(items), Some(before)) = (list.as_array_mut(), previous.get(key).and_then(Value::as_array))
        else {
            continue;
        };
        for item in items.iter_mut().filter(|i| i["error"] == NO_ANSWER_YET) {
            if let Some(held) = before.iter().find(|b| b["pod"] == item["pod"]) {
                *item = held.clone();
            }
        }
    }
}

/// The `ServiceHealthy` condition the status holds, when the live part reported none this
/// time; the driver asks for it while a poll has no answer yet (see `driver`). A plugin reports
/// the condition only with an answer in hand, and a new leader (an operator restarted or
/// upgraded) has none yet; dropping it would take two status writes, and a new transition
/// time, to come back to the same verdict.
pub fn held_health(reported: &[Condition], status: Option<&Value>) -> Option<Condition> {
    if reported.iter().any(|c| c.type_ == "ServiceHealthy") {
        return None;
    }
    let held = status?.get("conditions")?.as_array()?.iter().find(|c| c["type"] == "ServiceHealthy")?;
    let status = match held["status"].as_str()? {
        "True" => ConditionStatus::True,
        "False" => ConditionStatus::False,
        _ => ConditionStatus::Unknown,
    };
    Some(Condition {
        type_: "ServiceHealthy".into(),
        status,
        reason: str_at(held, &["reason"]).unwrap_or_default().to_string(),
        message: str_at(held, &["message"]).unwrap_or_default().to_string(),
    })
}

/// A health check over readings: the condition it drives and how many readings in a row
/// must be over before it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Threshold {
    /// Key under `status.health` where the streaks are kept, e.g. "connections".
    pub key: &'static str,
    /// Condition reason while it fires, e.g. "ConnectionsNearLimit".
    pub reason: &'static str,
    pub times: u32,
}

/// What the checks of one reconcile found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Health {
    /// Merged into `status.health`: the streak of each check per subject.
    pub streaks: Map<String, Value>,
    /// Messages of the checks that fire, each with its reason.
    pub firing: Vec<(&'static str, String)>,
}

impl Health {
    /// Applies `readings` of `threshold` against the streaks in `previous` (the resource's
    /// `status.health`, as this plugin last wrote it). A subject without a reading this time
    /// keeps its streak, and so does one whose reading comes from the answer already counted
    /// (kept under `<key>AnsweredAtMs`): a streak counts answers, not reconciles. Only a
    /// streak under way keeps its answer's time: a healthy subject's status stays the same
    /// from one answer to the next, so a quiet service's status is not written again.
    pub fn check(&mut self, previous: Option<&Value>, threshold: Threshold, readings: &[Reading]) {
        let seen_key = format!("{}AnsweredAtMs", threshold.key);
        let object = |key: &str| {
            previous.and_then(|h| h.get(key)).and_then(Value::as_object).cloned().unwrap_or_default()
        };
        let (mut streaks, mut seen) = (object(threshold.key), object(&seen_key));
        for r in readings {
            let last = streaks.get(&r.subject).and_then(Value::as_u64).unwrap_or(0);
            let counted = r.answered_at_ms != 0 && seen.get(&r.subject) == Some(&json!(r.answered_at_ms));
            let times = u64::from(threshold.times);
            let streak = match (counted, r.over()) {
                (true, _) => last,
                // Once it fires, a streak stays at `times`: a check that keeps firing leaves
                // status as it is (a count going on would be written on every answer).
                (false, true) => (last + 1).min(times),
                (false, false) => 0,
            };
            streaks.insert(r.subject.clone(), json!(streak));
            let still_firing = streak == times && last == times;
            // A reading under the limit is 0 however often it is counted; a check still firing
            // keeps the answer it fired on.
            if streak == 0 {
                seen.remove(&r.subject);
            } else if !still_firing {
                seen.insert(r.subject.clone(), json!(r.answered_at_ms));
            }
            if streak >= u64::from(threshold.times) {
                self.firing.push((
                    threshold.reason,
                    format!("{}: {} ({} checks in a row)", r.subject, r.describe, streak),
                ));
            }
        }
        self.streaks.insert(threshold.key.to_string(), Value::Object(streaks));
        self.streaks.insert(seen_key, Value::Object(seen));
    }

    /// The `ServiceHealthy` condition: False with the first firing check's reason, else True.
    pub fn condition(&self) -> Condition {
        match self.firing.first() {
            Some((reason, _)) => Condition {
                type_: "ServiceHealthy".into(),
                status: ConditionStatus::False,
                reason: (*reason).into(),
                message: self.firing.iter().map(|(_, m)| m.as_str()).collect::<Vec<_>>().join("; "),
            },
            None => Condition {
                type_: "ServiceHealthy".into(),
                status: ConditionStatus::True,
                reason: "ChecksPassing".into(),
                message: "every health check of the running service passes".into(),
            },
        }
    }

    /// A Warning event per firing check when the condition was not already False for it.
    pub fn events(&self, previous_reason: Option<&str>) -> Vec<Event> {
        self.firing
            .iter()
            .filter(|(reason, _)| previous_reason != Some(*reason))
            .map(|(reason, message)| Event {
                type_: EventType::Warning,
                reason: (*reason).into(),
                message: message.clone(),
            })
            .collect()
    }
}

/// What a plugin's look at its running service adds to the plan.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Live {
    /// Applied before the StatefulSet, so pods it starts see them (e.g. a ConfigMap their
    /// environment reads the current topology from).
    pub before_pods: Vec<Action>,
    pub actions: Vec<Action>,
    /// Merged into `.status`.
    pub status: Map<String, Value>,
    pub conditions: Vec<Condition>,
    pub events: Vec<Event>,
    /// When to look again (the next poll is due); the sooner of this and the plan's own wins.
    pub requeue_after_ms: Option<u64>,
    /// Keep the StatefulSet at this many replicas for now when `spec.replicas` is fewer: a
    /// member that must not go yet (a primary holding a high ordinal) is moved off first.
    pub hold_replicas: Option<i64>,
    /// The same for a named member set (see `MemberSet`), by its set name.
    pub hold_sets: std::collections::BTreeMap<String, i64>,
    /// Whether the copies the spec promises exist (None: the plugin does not judge it).
    pub redundancy: Option<crate::redundancy::Redundancy>,
}

impl Live {
    /// Deletes `pod` (its StatefulSet makes it again from the current revision: a roll step
    /// under `OnDelete`) and says why in a `ReplacingPod` event.
    pub fn replace_pod(&mut self, pod: String, why: &str) {
        self.events.push(Event {
            type_: EventType::Normal,
            reason: "ReplacingPod".into(),
            message: format!("replacing {pod}: {why}"),
        });
        self.actions.push(Action::Delete(ObjectRef {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: pod,
        }));
    }

    /// Ends a plugin's look at its instances: `instances` and the streaks of `threshold` over
    /// `readings` go to status, the check's condition and the Warning it starts to the plan,
    /// and the next poll is due in `poll_ms`.
    pub fn checked(
        mut self,
        input: &LiveInput,
        threshold: Threshold,
        readings: &[Reading],
        instances: Vec<Value>,
        poll_ms: u64,
    ) -> Live {
        let mut health = Health::default();
        health.check(input.status.and_then(|s| s.get("health")), threshold, readings);
        self.events.extend(health.events(input.health_reason()));
        self.conditions.push(health.condition());
        self.status.insert("instances".into(), Value::Array(instances));
        self.status.insert("health".into(), Value::Object(health.streaks));
        self.requeue_after_ms = Some(poll_ms);
        self
    }
}

/// Why an exec answer says nothing: its error, or the tool's exit code and stderr.
pub fn failure(answer: &Response, tool: &str) -> String {
    answer
        .error
        .clone()
        .unwrap_or_else(|| format!("{tool} exited {:?}: {}", answer.code, answer.stderr.trim()))
}

/// What a plugin reads its running service from.
pub struct LiveInput<'a> {
    pub pods: Vec<PodView>,
    /// The names of the instance's Services the host observed. A request goes only to a target
    /// the host observes (the guardrails refuse the whole plan otherwise): a Service the same
    /// plan creates is asked once it is seen.
    pub services: Vec<String>,
    /// The StatefulSet's update revision (see [`update_revision`]): pods of another revision
    /// are outdated.
    pub update_revision: Option<String>,
    /// The same for every member set's StatefulSet, by its name (services with several sets).
    pub update_revisions: std::collections::BTreeMap<String, String>,
    pub responses: &'a [Response],
    /// The resource's current `.status` (what this plugin wrote last).
    pub status: Option<&'a Value>,
    /// The whole resource as observed (annotations, service-specific spec fields).
    pub resource: &'a Value,
    /// The host's clock for this reconcile (`observed.now-ms`).
    pub now_ms: u64,
}

impl LiveInput<'_> {
    /// An annotation of the resource.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.resource.pointer("/metadata/annotations").and_then(|a| a.get(key)).and_then(Value::as_str)
    }
}

impl LiveInput<'_> {
    /// The reason of the `ServiceHealthy` condition the status holds now.
    pub fn health_reason(&self) -> Option<&str> {
        self.status
            .and_then(|s| s.get("conditions"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "ServiceHealthy" && c["status"] == "False")
            .and_then(|c| c["reason"].as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Threshold = Threshold { key: "connections", reason: "ConnectionsNearLimit", times: 3 };

    /// A StatefulSet's update revision counts once its controller has seen its spec and it
    /// carries the template hash rendered now; one without a hash (made by an earlier build)
    /// counts only when the caller has no hash to compare.
    #[test]
    fn an_update_revision_counts_only_for_the_template_rendered_now() {
        let sts = |annotations: Value, observed: i64| {
            vec![json!({
                "apiVersion": "apps/v1", "kind": "StatefulSet",
                "metadata": { "name": "db", "generation": 2, "annotations": annotations },
                "status": { "observedGeneration": observed, "updateRevision": "db-new" },
            })]
        };
        let hashed = json!({ TEMPLATE_HASH_ANNOTATION: "aaaa" });
        assert_eq!(update_revision(&sts(hashed.clone(), 2), "db", Some("aaaa")).as_deref(), Some("db-new"));
        assert_eq!(update_revision(&sts(hashed.clone(), 2), "db", Some("bbbb")), None, "an older template");
        assert_eq!(update_revision(&sts(hashed, 1), "db", Some("aaaa")), None, "spec not seen yet");
        assert_eq!(
            update_revision(&sts(json!({}), 2), "db", Some("bbbb")),
            None,
            "an earlier version's, not stamped yet"
        );
        assert_eq!(
            update_revision(&sts(json!({}), 2), "db", None).as_deref(),
            Some("db-new"),
            "no hash to compare"
        );
        assert_eq!(update_revision(&sts(json!({}), 2), "other", Some("bbbb")), None);
    }

    /// A new leader's first plan: an entry waiting for its first answer shows what the status
    /// held for its pod; a pod the status never saw still says it waits; answers win.
    #[test]
    fn entries_without_an_answer_keep_what_the_status_held() {
        let previous =
            json!({"instances": [{"pod": "db-0", "role": "primary"}, {"pod": "db-1", "role": "replica"}]});
        let mut status = Map::new();
        status.insert(
            "instances".into(),
            json!([{"pod": "db-0", "error": NO_ANSWER_YET}, {"pod": "db-1", "role": "primary"}, {"pod": "db-2", "error": NO_ANSWER_YET}]),
        );
        hold_unanswered(&mut status, &previous);
        assert_eq!(
            status["instances"],
            json!([{"pod": "db-0", "role": "primary"}, {"pod": "db-1", "role": "primary"}, {"pod": "db-2", "error": NO_ANSWER_YET}])
        );
    }

    fn reading(value: f64) -> Reading {
        answer(value, 0)
    }

    fn answer(value: f64, answered_at_ms: u64) -> Reading {
        Reading { subject: "db-0".into(), answered_at_ms, value, limit: 95.0, describe: format!("{value}%") }
    }

    #[test]
    fn a_threshold_fires_after_n_readings_in_a_row_and_clears_at_once() {
        let mut status = json!({});
        let mut fired = Vec::new();
        for (at, value) in [97.0, 98.0, 99.0, 99.0, 50.0].into_iter().enumerate() {
            let mut h = Health::default();
            h.check(status.get("health"), T, &[answer(value, at as u64 + 1)]);
            fired.push(h.condition().status == ConditionStatus::False);
            status = json!({ "health": Value::Object(h.streaks) });
        }
        assert_eq!(fired, [false, false, true, true, false]);
    }

    /// The answer of a poll is handed to every reconcile until the next one comes (a status
    /// write alone brings a reconcile): it counts once, so "three in a row" means three answers.
    /// Before, one answer over the limit fired the check within the reconciles its own status
    /// writes caused.
    #[test]
    fn one_answer_seen_by_many_reconciles_counts_once() {
        let mut status = json!({});
        let mut streaks = Vec::new();
        for at in [1, 1, 1, 1, 2, 2, 3] {
            let mut h = Health::default();
            h.check(status.get("health"), T, &[answer(99.0, at)]);
            streaks.push((h.streaks["connections"]["db-0"].as_u64(), h.condition().status));
            status = json!({ "health": Value::Object(h.streaks) });
        }
        let (f, t) = (ConditionStatus::False, ConditionStatus::True);
        assert_eq!(
            streaks,
            [
                (Some(1), t),
                (Some(1), t),
                (Some(1), t),
                (Some(1), t),
                (Some(2), t),
                (Some(2), t),
                (Some(3), f)
            ]
        );
    }

    /// [agent]'s quiet steady state: healthy answers leave `status.health` as it was, however
    /// many come; the answer's time is kept only while a streak is under way.
    #[test]
    fn healthy_answers_leave_the_health_status_unchanged() {
        let mut status = json!({});
        let mut written = Vec::new();
        for (at, value) in [(1, 50.0), (2, 51.0), (3, 49.0), (4, 99.0), (5, 50.0), (6, 50.0)] {
            let mut h = Health::default();
            h.check(status.get("health"), T, &[answer(value, at)]);
            status = json!({ "health": Value::Object(h.streaks) });
            written.push(status.clone());
        }
        let healthy = json!({"health": {"connections": {"db-0": 0}, "connectionsAnsweredAtMs": {}}});
        assert_eq!(written[0], healthy);
        assert_eq!((&written[1], &written[2]), (&healthy, &healthy), "nothing changed: nothing to write");
        assert_eq!(
            written[3]["health"]["connectionsAnsweredAtMs"]["db-0"], 4,
            "a streak under way keeps its answer"
        );
        assert_eq!((&written[4], &written[5]), (&healthy, &healthy));
    }

    /// [agent]'s quiet steady state: a check that keeps firing on the same reading leaves
    /// `status.health` and its condition as they were from one answer to the next.
    #[test]
    fn a_check_that_keeps_firing_leaves_the_health_status_unchanged() {
        let mut status = json!({});
        let mut written = Vec::new();
        for at in 1..=6 {
            let mut h = Health::default();
            h.check(status.get("health"), T, &[answer(99.0, at)]);
            status = json!({ "health": Value::Object(h.streaks.clone()) });
            written.push((status.clone(), h.condition().message));
        }
        assert_eq!(written[2].0["health"]["connections"]["db-0"], 3, "fired at three");
        assert_eq!(written[3], written[2], "firing on: nothing changed, nothing to write");
        assert_eq!(written[5], written[2]);
        let mut h = Health::default();
        h.check(status.get("health"), T, &[answer(50.0, 7)]);
        assert_eq!(h.streaks["connections"]["db-0"], 0, "clears at once");
    }

    #[test]
    fn an_event_is_emitted_when_a_check_starts_firing_not_on_every_reconcile() {
        let mut h = Health::default();
        h.check(Some(&json!({"connections": {"db-0": 2}})), T, &[reading(99.0)]);
        assert_eq!(h.events(None).len(), 1);
        assert!(h.events(Some("ConnectionsNearLimit")).is_empty());
    }
}
