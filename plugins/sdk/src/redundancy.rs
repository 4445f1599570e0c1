//! Redundancy: whether every copy the spec promises beside the serving one exists now and
//! could take over (a standby streaming, a replica linked, every shard copy assigned).
//!
//! `Available` says the service answers; it says nothing of what a lost member takes with it.
//! A plugin judges redundancy from its running service ([`Redundancy`] in
//! [`crate::live::Live`]); the driver turns the verdict into the `Redundant` condition, and
//! while a resource is being created it holds `Available` False and the phase at `Pending`
//! until the promised copies exist: users and pipelines that wait for `Available` (`kubectl
//! wait`, health checks of deployment tools) then write into a cluster that keeps what they
//! wrote when a member is lost at once.

use serde_json::Value;

use crate::status::{cond, condition_message, condition_reason, condition_status};
use crate::types::{Condition, ConditionStatus, Phase};

/// The condition's type.
pub const CONDITION: &str = "Redundant";
/// The reason `Available` and `Progressing` give while creation waits for redundancy.
pub const AWAITING: &str = "AwaitingRedundancy";

/// A copy that was not counted caught up counts again once at most this far behind.
pub const CAUGHT_UP_BYTES: u64 = 1024 * 1024;
/// A copy that was counted caught up stops counting only past this far behind: between the
/// two bounds the verdict stays as it was, so a copy near one bound does not flap.
pub const FALLEN_BEHIND_BYTES: u64 = 16 * 1024 * 1024;
const _: () = assert!(CAUGHT_UP_BYTES < FALLEN_BEHIND_BYTES);

/// What a plugin concluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every promised copy is there and caught up.
    Redundant,
    /// A promised copy is missing, not linked or behind.
    Lacking,
    /// The spec promises no copy (one member): nothing to wait for, never redundant.
    NotPromised,
    /// Not known yet: a member whose answer the verdict needs has given none.
    Unknown,
}

/// A plugin's verdict with its reason and a message naming the member it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redundancy {
    pub verdict: Verdict,
    pub reason: String,
    pub message: String,
}

impl Redundancy {
    pub fn redundant(message: impl Into<String>) -> Self {
        Self { verdict: Verdict::Redundant, reason: "CopiesInSync".into(), message: message.into() }
    }

    pub fn lacking(reason: &str, message: impl Into<String>) -> Self {
        Self { verdict: Verdict::Lacking, reason: reason.into(), message: message.into() }
    }

    pub fn not_promised(message: impl Into<String>) -> Self {
        Self { verdict: Verdict::NotPromised, reason: "SingleMember".into(), message: message.into() }
    }

    pub fn unknown(message: impl Into<String>) -> Self {
        Self { verdict: Verdict::Unknown, reason: "NoAnswerYet".into(), message: message.into() }
    }

    /// The `Redundant` condition.
    pub fn condition(&self) -> Condition {
        let status = match self.verdict {
            Verdict::Redundant => ConditionStatus::True,
            Verdict::Lacking | Verdict::NotPromised => ConditionStatus::False,
            Verdict::Unknown => ConditionStatus::Unknown,
        };
        cond(CONDITION, status, &self.reason, self.message.clone())
    }

    /// With no verdict yet (a new leader, a pod made again that has not answered), the one the
    /// status holds stays until an answer: dropping it would take two writes, and a new
    /// transition time, to come back to the same verdict.
    pub fn held(self, status: Option<&Value>) -> Self {
        if self.verdict != Verdict::Unknown {
            return self;
        }
        let text = |s: Option<&str>| s.unwrap_or_default().to_string();
        let reason = condition_reason(status, CONDITION);
        let message = text(condition_message(status, CONDITION));
        match condition_status(status, CONDITION) {
            Some("True") => Self { verdict: Verdict::Redundant, reason: text(reason), message },
            Some("False") if reason == Some("SingleMember") => Self::not_promised(message),
            Some("False") => Self::lacking(reason.unwrap_or("NotRedundant"), message),
            _ => self,
        }
    }
}

/// What one promised copy adds to the verdict (see [`tally`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyState {
    /// It is there and caught up.
    InSync,
    /// Its member has not answered yet.
    NotAnswered,
    /// Why it does not count.
    Lacks(String),
}

/// A copy lacking for each name in `promised` but `source` (the member copied from) that no
/// member in `present` answers to: a pod deleted and not created again yet is named, not
/// counted as "does not exist".
pub fn absent(promised: &[String], present: &[&str], source: &str) -> Vec<CopyState> {
    promised
        .iter()
        .filter(|name| name.as_str() != source && !present.contains(&name.as_str()))
        .map(|name| CopyState::Lacks(format!("{name} does not exist")))
        .collect()
}

/// The instances `replicas` promises, by the StatefulSet's pod names `<name>-<ordinal>`.
pub fn promised(name: &str, replicas: i64) -> Vec<String> {
    (0..replicas.max(0)).map(|i| format!("{name}-{i}")).collect()
}

/// Counts the copies: redundant with `want` of them in sync, else lacking with every reason
/// (unknown when the only ones missing have not answered yet); `what` names them in the
/// message, e.g. "standby(s) of pg-0 streaming".
pub fn tally(copies: impl IntoIterator<Item = CopyState>, want: usize, what: &str) -> Redundancy {
    let (mut in_sync, mut unanswered, mut lacking) = (0, 0, Vec::new());
    for copy in copies {
        match copy {
            CopyState::InSync => in_sync += 1,
            CopyState::NotAnswered => unanswered += 1,
            CopyState::Lacks(why) => lacking.push(why),
        }
    }
    if in_sync >= want {
        return Redundancy::redundant(format!("{in_sync} {what}"));
    }
    if lacking.is_empty() && unanswered > 0 {
        return Redundancy::unknown(format!("{in_sync} of {want} {what}; the rest have not answered yet"));
    }
    let missing = want.saturating_sub(in_sync + unanswered + lacking.len());
    if missing > 0 {
        lacking.push(format!("{missing} member(s) do not exist yet"));
    }
    Redundancy::lacking("CopiesMissing", format!("{in_sync} of {want} {what}: {}", lacking.join("; ")))
}

/// Whether the status as last written says `Redundant=True`: the side of the lag hysteresis.
pub fn was_redundant(status: Option<&Value>) -> bool {
    condition_status(status, CONDITION) == Some("True")
}

/// Whether a copy `lag_bytes` behind counts as caught up; `was_redundant`: the verdict last
/// written (see [`FALLEN_BEHIND_BYTES`]).
pub fn caught_up(lag_bytes: u64, was_redundant: bool) -> bool {
    lag_bytes <= if was_redundant { FALLEN_BEHIND_BYTES } else { CAUGHT_UP_BYTES }
}

/// While the resource is being created (it never was `Running`), a promised redundancy not
/// there yet keeps the phase `Pending` and `Available` False, both saying why; afterwards
/// nothing changes here (`Available` means the service answers, `Redundant` the rest).
/// Returns whether creation is held.
pub fn hold_creation(
    phase: &mut Phase,
    conditions: &mut [Condition],
    last_phase: Option<&str>,
    r: &Redundancy,
) -> bool {
    let creating = matches!(last_phase, None | Some("Pending"));
    let waiting = matches!(r.verdict, Verdict::Lacking | Verdict::Unknown);
    if !creating || !waiting || !matches!(*phase, Phase::Pending | Phase::Running) {
        return false;
    }
    // Pods still being made keep saying so; once they are all there, the wait is for copies.
    let pods_ready = *phase == Phase::Running;
    *phase = Phase::Pending;
    let why = format!("waiting for the redundancy the spec promises: {}", r.message);
    for c in conditions.iter_mut() {
        match c.type_.as_str() {
            "Available" if c.status == ConditionStatus::True || pods_ready => {
                *c = cond("Available", ConditionStatus::False, AWAITING, why.clone())
            }
            "Progressing" if pods_ready => {
                *c = cond("Progressing", ConditionStatus::True, AWAITING, why.clone())
            }
            _ => {}
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conditions() -> Vec<Condition> {
        vec![
            cond("Available", ConditionStatus::True, "AllReplicasReady", "3 of 3".into()),
            cond("Progressing", ConditionStatus::False, "Converged", "3 of 3".into()),
        ]
    }

    #[test]
    fn creation_waits_for_the_promised_copies_and_only_creation() {
        let lacking = Redundancy::lacking("ReplicaNotLinked", "cache-1 is not linked to cache-0");
        let mut phase = Phase::Running;
        let mut cs = conditions();
        assert!(hold_creation(&mut phase, &mut cs, Some("Pending"), &lacking));
        assert_eq!(phase, Phase::Pending);
        assert_eq!((cs[0].status, cs[0].reason.as_str()), (ConditionStatus::False, AWAITING));
        assert!(cs[0].message.contains("cache-1 is not linked"), "{}", cs[0].message);
        assert_eq!((cs[1].status, cs[1].reason.as_str()), (ConditionStatus::True, AWAITING));
        // Pods still being made: Progressing says so, Available waits all the same.
        let (mut phase, mut cs) = (Phase::Pending, conditions());
        cs[1] = cond("Progressing", ConditionStatus::True, "Creating", "2 of 3".into());
        assert!(hold_creation(&mut phase, &mut cs, None, &lacking));
        assert_eq!((cs[0].status, cs[1].reason.as_str()), (ConditionStatus::False, "Creating"));
        let unknown = Redundancy::unknown("no answer");
        let (mut phase, mut cs) = (Phase::Running, conditions());
        assert!(hold_creation(&mut phase, &mut cs, None, &unknown), "no answer is no redundancy");
        for r in [Redundancy::redundant("all linked"), Redundancy::not_promised("one server")] {
            let (mut phase, mut cs) = (Phase::Running, conditions());
            assert!(!hold_creation(&mut phase, &mut cs, Some("Pending"), &r));
            assert_eq!((phase, cs), (Phase::Running, conditions()));
        }
        // Once Running, losing a copy changes Redundant only.
        let (mut phase, mut cs) = (Phase::Running, conditions());
        assert!(!hold_creation(&mut phase, &mut cs, Some("Running"), &lacking));
        assert_eq!((phase, cs), (Phase::Running, conditions()));
    }

    #[test]
    fn no_verdict_keeps_the_one_written_and_a_new_resource_says_unknown() {
        let status = json!({"conditions": [
            {"type": "Redundant", "status": "True", "reason": "CopiesInSync", "message": "2 replicas linked"}]});
        let held = Redundancy::unknown("no answer").held(Some(&status));
        assert_eq!(held, Redundancy::redundant("2 replicas linked"));
        let fresh = Redundancy::unknown("no answer").held(None);
        assert_eq!(fresh.condition().status, ConditionStatus::Unknown);
        let lacking = Redundancy::lacking("ReplicaNotLinked", "x");
        assert_eq!(lacking.clone().held(Some(&status)), lacking, "a verdict is never replaced");
    }

    #[test]
    fn a_tally_names_every_copy_that_does_not_count() {
        use CopyState::*;
        assert_eq!(tally([InSync, InSync], 2, "replicas linked").verdict, Verdict::Redundant);
        let r = tally([InSync, Lacks("b is not ready".into())], 2, "replicas linked");
        assert_eq!(
            (r.verdict, r.message.as_str()),
            (Verdict::Lacking, "1 of 2 replicas linked: b is not ready")
        );
        assert_eq!(tally([InSync, NotAnswered], 2, "x").verdict, Verdict::Unknown);
        let r = tally([InSync], 3, "replicas linked");
        assert!(r.message.ends_with("2 member(s) do not exist yet"), "{}", r.message);
    }

    #[test]
    fn the_lag_verdict_has_hysteresis() {
        let mb = 1024 * 1024;
        assert!(caught_up(mb, false) && !caught_up(mb + 1, false));
        assert!(caught_up(8 * mb, true), "between the bounds a caught-up copy stays caught up");
        assert!(!caught_up(8 * mb, false), "and one that was behind stays behind");
        assert!(!caught_up(16 * mb + 1, true));
    }
}
