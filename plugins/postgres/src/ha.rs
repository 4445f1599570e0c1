//! Who is the primary, and what to do about it: the decisions of high availability as a pure
//! function of what the plugin wrote in status last time ([`State`]), what the pods and their
//! servers say now ([`Member`]), the spec and the clock. [`decide`] never sends anything
//! itself; `live` turns its [`Decision`] into requests, labels and the topology ConfigMap.
//!
//! The rules, in the order [`decide`] applies them:
//!
//! 1. **Confirmation.** The target primary answering as a primary (its poll, or the stats its
//!    promotion answers with) is the current primary; its pod's uid is recorded, and published
//!    in the topology so that this pod, and no later one of the same name, starts as the
//!    primary after a restart.
//! 2. **Switchover** (`stateward.dev/switchover-to`): refused with a reason unless the instance
//!    is a streaming standby not far behind; otherwise the target moves to it at once (the old
//!    primary leaves `-rw`), the old primary is stopped cleanly (a fast shutdown sends every WAL
//!    record to the standbys before it ends), and only then is the target promoted.
//!    The plugin starts a switchover itself, the same way, when the primary holds an ordinal
//!    the StatefulSet is shrinking past, or when it is the last member left on an old revision
//!    (see [`crate::roll`], which also picks the outdated standby to replace next).
//! 3. **Failover.** The target is unhealthy when its pod is gone, going, replaced (another
//!    uid: a new pod starts fenced), its container is not running, or its server answers but
//!    not as a primary; a server whose requests fail while the pod stays Ready is *not*
//!    unhealthy (that is load, not loss). Unhealthy continuously for `failoverDelay`, the
//!    most advanced standby (received LSN, then lowest replay lag, then name) among those on
//!    the primary's timeline (others only when none is) becomes the target; with no standby,
//!    a fenced primary is promoted again.
//! 4. **Promotion** of the target, one-shot, in the reconcile after the decision was written
//!    to status (so a second decision from the same observation cannot promote another).
//! 5. **Fencing.** Any server other than the target that answers as a primary is stopped
//!    (it restarts, reads the new topology and rewinds); the old primary of a failover that was
//!    already running again as a fenced standby is restarted once the new primary is confirmed,
//!    so it too goes through `pg_rewind` before it streams. A server whose database system
//!    identifier is not the confirmed primary's (made by its own `initdb`, as the release before
//!    this one made every member) is never a candidate and is stopped to be cloned again; such a
//!    server on an old revision is replaced instead (that release's command would only start it
//!    again as it was). Any other stray primary is stopped at once, on an old revision or not.
//! 6. **Roles.** `primary` on the confirmed target only (and on a switchover's target from the
//!    plan that promotes it, the old primary being stopped), `replica` on standbys whose WAL
//!    receiver is streaming, none on the others; the Services select on these labels.

use serde_json::{json, Map, Value};
use stateward_sdk::{Condition, ConditionStatus, Event, EventType};

use crate::roll;

/// A standby as the primary sees it (`pg_stat_replication`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standby {
    pub name: String,
    pub state: String,
    pub sync_state: String,
    /// Bytes between the primary's WAL and the standby's replay; -1 when unknown.
    pub lag_bytes: i64,
}

/// What one server said (see `live::STATS_SQL`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stats {
    pub in_recovery: bool,
    pub connections: u64,
    pub max_connections: u64,
    /// WAL received (a standby) or written (a primary), as a byte position.
    pub received: u64,
    /// WAL replayed (a standby); the written position on a primary.
    pub replayed: u64,
    pub timeline: u32,
    /// The standby's WAL receiver is streaming.
    pub streaming: bool,
    /// `default_transaction_read_only` is on: what fencing sets (see `live::fence_writes`).
    pub read_only: bool,
    /// The database system identifier (`pg_control_system()`): the same on every server cloned
    /// from one `initdb`; empty when not known (an answer to an earlier build's poll).
    pub system_id: String,
    /// The standbys connected to a primary.
    pub standbys: Vec<Standby>,
}

impl Stats {
    /// Bytes received and not yet replayed.
    pub fn replay_lag(&self) -> u64 {
        self.received.saturating_sub(self.replayed)
    }
}

/// One pod of the instance as observed in this reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub pod: String,
    pub uid: String,
    pub ready: bool,
    /// The postgres container is running.
    pub running: bool,
    pub deleting: bool,
    pub restarts: i64,
    /// Made from an older revision of the StatefulSet than the one it makes pods from now.
    pub outdated: bool,
    /// The latest answer of this incarnation (this uid, this restart count): none yet, a
    /// failure, or the server's stats.
    pub answer: Option<Result<Stats, String>>,
}

impl Member {
    pub fn stats(&self) -> Option<&Stats> {
        match &self.answer {
            Some(Ok(s)) if self.running && !self.deleting => Some(s),
            _ => None,
        }
    }

    /// Answers, now, as a primary.
    pub fn is_primary(&self) -> bool {
        self.stats().is_some_and(|s| !s.in_recovery)
    }

    /// Answers, now, as a standby.
    pub fn is_standby(&self) -> bool {
        self.stats().is_some_and(|s| s.in_recovery)
    }

    /// Answers as a standby whose WAL receiver streams.
    pub fn is_streaming(&self) -> bool {
        self.stats().is_some_and(|s| s.in_recovery && s.streaming)
    }

    /// Answers with a database system other than `system_id` (the confirmed primary's): not a
    /// copy of the cluster's data, whatever its role (a server a release before this one made
    /// with its own `initdb`). Never a candidate; it is made again as a clone.
    pub fn is_foreign(&self, system_id: &str) -> bool {
        self.stats()
            .is_some_and(|s| !system_id.is_empty() && !s.system_id.is_empty() && s.system_id != system_id)
    }

    /// This incarnation: the pod's uid and how often its containers restarted.
    pub fn incarnation(&self) -> String {
        incarnation(&self.pod, &self.uid, self.restarts)
    }
}

/// `pod@<uid prefix>@<restarts>`: what a request id or a fence names when it must not apply to
/// a later process of the same pod.
pub fn incarnation(pod: &str, uid: &str, restarts: i64) -> String {
    format!("{pod}@{}@{restarts}", short_uid(uid))
}

/// The first 8 characters of a uid.
pub fn short_uid(uid: &str) -> &str {
    uid.get(..8).unwrap_or(uid)
}

/// A switchover as status records it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Switchover {
    /// The instance the annotation named.
    pub to: String,
    /// "" (none), Demoting, Promoting, Done, Refused, Failed.
    pub phase: String,
    pub message: String,
}

/// What the plugin keeps in status from one reconcile to the next.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// The primary last confirmed (empty until the first one answers).
    pub current: String,
    /// Its pod's uid when confirmed.
    pub current_uid: String,
    /// The instance that should be the primary.
    pub target: String,
    /// Promotions decided so far: part of every promotion's request id.
    pub epoch: u64,
    /// The current primary's timeline.
    pub timeline: u32,
    /// The database system identifier of the primary last confirmed: every member must be a
    /// copy of it (see [`Member::is_foreign`]).
    pub system_id: String,
    /// Since when (ms) the target has not been a healthy primary; 0 while it is.
    pub failing_since_ms: u64,
    /// A promotion of the target is wanted.
    pub promoting: bool,
    /// Incarnations of former primaries that must restart (and so rewind) before they may
    /// stream: `pod@uid@restarts`.
    pub fenced: Vec<String>,
    pub switchover: Switchover,
    /// The value of the switchover annotation last acted upon (refused or done): the same value
    /// is not acted upon again, and a switchover the plugin starts itself does not count.
    pub asked: String,
}

impl State {
    /// Never had a primary: the first one is still being made (initdb).
    pub fn bootstrapping(&self) -> bool {
        self.current_uid.is_empty() && self.epoch == 0
    }

    /// Status names a primary but none was confirmed: a cluster made by the release before this
    /// one, which wrote `currentPrimary` (pod 0) alone, every member its own `initdb`.
    pub fn taken_over(&self) -> bool {
        self.bootstrapping() && !self.current.is_empty()
    }

    /// Reads the fields [`State::to_status`] wrote; `first_pod` is the target when none is.
    pub fn from_status(status: Option<&Value>, first_pod: &str) -> State {
        let s =
            |k: &str| status.and_then(|st| st.get(k)).and_then(Value::as_str).unwrap_or_default().to_string();
        let n = |k: &str| status.and_then(|st| st.get(k)).and_then(Value::as_u64).unwrap_or(0);
        let sw = status.and_then(|st| st.get("switchover"));
        let sws = |k: &str| sw.and_then(|v| v.get(k)).and_then(Value::as_str).unwrap_or_default().to_string();
        let current = s("currentPrimary");
        let current_uid = s("currentPrimaryUID");
        let mut target = s("targetPrimary");
        if target.is_empty() {
            target = if current.is_empty() { first_pod.to_string() } else { current.clone() };
        }
        State {
            current,
            current_uid,
            target,
            epoch: n("promotions"),
            timeline: u32::try_from(n("timeline")).unwrap_or(0),
            system_id: s("systemIdentifier"),
            failing_since_ms: n("primaryFailingSinceMs"),
            promoting: status.and_then(|st| st.get("promoting")).and_then(Value::as_bool).unwrap_or(false),
            fenced: status
                .and_then(|st| st.get("fenced"))
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
                .unwrap_or_default(),
            asked: match status.and_then(|st| st.get("switchoverAsked")).and_then(Value::as_str) {
                Some(a) => a.to_string(),
                // Written before this field: the switchover was the annotation's.
                None => sws("to"),
            },
            switchover: Switchover { to: sws("to"), phase: sws("phase"), message: sws("message") },
        }
    }

    /// The status fields (every one always written: status is merged, not replaced).
    pub fn to_status(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("currentPrimary".into(), json!(self.current));
        m.insert("currentPrimaryUID".into(), json!(self.current_uid));
        m.insert("targetPrimary".into(), json!(self.target));
        m.insert("promotions".into(), json!(self.epoch));
        m.insert("timeline".into(), json!(self.timeline));
        m.insert("systemIdentifier".into(), json!(self.system_id));
        m.insert("primaryFailingSinceMs".into(), json!(self.failing_since_ms));
        m.insert("promoting".into(), json!(self.promoting));
        m.insert("fenced".into(), json!(self.fenced));
        m.insert(
            "switchover".into(),
            json!({ "to": self.switchover.to, "phase": self.switchover.phase, "message": self.switchover.message }),
        );
        m.insert("switchoverAsked".into(), json!(self.asked));
        m
    }
}

/// The spec's and the StatefulSet's part in the decisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub failover_delay_ms: u64,
    /// `spec.replicas`: pods with a higher ordinal are on their way out.
    pub replicas: i64,
    /// A switchover target further behind than this (received, against the primary) is refused.
    pub max_switchover_lag_bytes: u64,
    /// The StatefulSet's revision for the template rendered now is known, and so which members
    /// are [`Member::outdated`] (not while the cache lags an apply).
    pub revision_known: bool,
}

/// How long a switchover may take, from the decision to the new primary answering, before it
/// is given up for a failover to the best standby.
pub const SWITCHOVER_TIMEOUT_MS: u64 = 60_000;

/// A request the decision wants sent: one-shot, named by `id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Promote `pod`; its answer carries the server's stats after the promotion.
    Promote { pod: String, id: String },
    /// Stop the server of `pod` (fast shutdown); the container restarts through the entry
    /// script, which makes it a standby of the current topology (rewound first).
    Stop { pod: String, id: String, why: &'static str },
}

/// One-shot answers the decision reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answers {
    /// Ids of the one-shot requests that have an answer (of any kind).
    pub answered: Vec<String>,
}

impl Answers {
    fn has(&self, id: &str) -> bool {
        self.answered.iter().any(|a| a == id)
    }
}

/// What [`decide`] wants.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    pub state: State,
    pub requests: Vec<Request>,
    /// The role label of every observed pod (None: no role).
    pub roles: Vec<(String, Option<&'static str>)>,
    pub events: Vec<Event>,
    /// The `PrimaryAvailable` condition: what is happening to the primary.
    pub condition: Option<Condition>,
    /// Look again within this many ms (a failover delay running out).
    pub wake_in_ms: Option<u64>,
    /// A pod to delete so that the StatefulSet makes it again from its current revision.
    pub replace: Option<String>,
    /// Keep the StatefulSet at this many replicas for now (see [`crate::roll::hold_replicas`]).
    pub hold_replicas: Option<i64>,
}

/// The id of the promotion of this incarnation of a pod at `epoch`: a pod that restarts before
/// its promotion is confirmed is promoted again (its new process starts as a standby).
pub fn promote_id(m: &Member, epoch: u64) -> String {
    format!("promote-{}-{}-r{}-e{epoch}", m.pod, short_uid(&m.uid), m.restarts)
}

/// The id of a stop of this incarnation of a pod, for `why`, at `epoch`.
pub fn stop_id(why: &str, m: &Member, epoch: u64) -> String {
    format!("{why}-{}-{}-r{}-e{epoch}", m.pod, short_uid(&m.uid), m.restarts)
}

fn event(type_: EventType, reason: &str, message: String) -> Event {
    Event { type_, reason: reason.into(), message }
}

/// The type of the condition that says what is happening to the primary.
pub const PRIMARY_CONDITION: &str = "PrimaryAvailable";

fn unavailable(reason: &str, message: String) -> Condition {
    Condition {
        type_: PRIMARY_CONDITION.into(),
        status: ConditionStatus::False,
        reason: reason.into(),
        message,
    }
}

/// Why `m`, the confirmed primary whose pod had `confirmed_uid`, is not a healthy primary now,
/// or None when it is one. Requests that fail while the pod stays Ready are load, not loss.
fn unhealthy(m: Option<&Member>, confirmed_uid: &str) -> Option<String> {
    let Some(m) = m else { return Some("its pod is gone".into()) };
    if m.deleting {
        return Some("its pod is being deleted".into());
    }
    if !confirmed_uid.is_empty() && m.uid != confirmed_uid && !m.is_primary() {
        return Some("its pod was replaced (a new pod starts fenced)".into());
    }
    if !m.running {
        return Some("its container is not running".into());
    }
    match &m.answer {
        Some(Ok(s)) if !s.in_recovery => None,
        Some(Ok(_)) => Some("it answers as a standby".into()),
        Some(Err(_)) if m.ready => None,
        Some(Err(e)) => Some(format!("it is not Ready and its requests fail: {e}")),
        None => Some("its server has not answered since it started".into()),
    }
}

/// The ordinal of a StatefulSet pod's name.
pub fn ordinal(pod: &str) -> Option<i64> {
    pod.rsplit('-').next().and_then(|o| o.parse().ok())
}

/// The best standby to promote, other than `except`, pods being scaled away and servers of
/// another database system: on the primary's timeline first, then the most WAL received, the
/// least left to replay, the lowest name.
pub fn best_candidate<'a>(
    members: &'a [Member],
    st: &State,
    except: &str,
    replicas: i64,
) -> Option<&'a Member> {
    let timeline = st.timeline;
    let key = |m: &Member| {
        let s = m.stats();
        let consistent = s.is_some_and(|s| s.timeline >= timeline);
        let received = s.map_or(0, |s| s.received.max(s.replayed));
        let lag = s.map_or(u64::MAX, Stats::replay_lag);
        (consistent, received, std::cmp::Reverse(lag))
    };
    members
        .iter()
        .filter(|m| m.pod != except && m.is_standby() && !m.is_foreign(&st.system_id))
        .filter(|m| ordinal(&m.pod).is_none_or(|o| o < replicas))
        .max_by(|a, b| key(a).cmp(&key(b)).then_with(|| b.pod.cmp(&a.pod)))
}

/// The decisions for this reconcile; see the module documentation.
pub fn decide(
    prev: &State,
    members: &[Member],
    settings: &Settings,
    switchover_to: Option<&str>,
    answers: &Answers,
    now_ms: u64,
) -> Decision {
    let mut st = prev.clone();
    let mut d = Decision::default();
    let find = |pod: &str| members.iter().find(|m| m.pod == pod);
    // Requests wait for the reconcile after the one that decided them (rule 4).
    let mut decided_now = false;

    // 1. Confirmation. In a cluster taken over from the release before this one, the first
    // primary must run the current revision (its target is replaced first, see `roll`, so that
    // it starts through the entry script, which makes it a primary the others can be cloned
    // from); nothing is confirmed while which pods are outdated is not known.
    let first_but_outdated = |t: &Member| st.taken_over() && (t.outdated || !settings.revision_known);
    if let Some(t) = find(&st.target).filter(|t| t.is_primary() && !first_but_outdated(t)) {
        if st.current != t.pod || st.current_uid != t.uid {
            let how = if st.current.is_empty() { "the first primary" } else { "the primary" };
            d.events.push(event(EventType::Normal, "PrimaryConfirmed", format!("{} is {how}", t.pod)));
        }
        st.current = t.pod.clone();
        st.current_uid = t.uid.clone();
        if let Some(s) = t.stats() {
            st.timeline = s.timeline;
            if !s.system_id.is_empty() {
                st.system_id = s.system_id.clone();
            }
        }
        st.failing_since_ms = 0;
        st.promoting = false;
        if matches!(st.switchover.phase.as_str(), "Demoting" | "Promoting") && st.switchover.to == t.pod {
            st.switchover.phase = "Done".into();
            st.switchover.message = format!("{} is the primary", t.pod);
            d.events.push(event(EventType::Normal, "SwitchoverDone", st.switchover.message.clone()));
        }
    }

    // 2. Switchover.
    match switchover_to {
        None => {
            st.asked.clear();
            if matches!(st.switchover.phase.as_str(), "Done" | "Refused" | "Failed") {
                st.switchover = Switchover::default();
            }
        }
        Some(to) if to != st.asked => {
            st.asked = to.to_string();
            match refuse_switchover(&st, members, settings, to) {
                Some(reason) if reason.is_empty() => {
                    st.switchover = Switchover {
                        to: to.into(),
                        phase: "Done".into(),
                        message: format!("{to} is already the primary"),
                    };
                }
                Some(reason) => {
                    d.events.push(event(
                        EventType::Warning,
                        "SwitchoverRefused",
                        format!("switchover to {to} refused: {reason}"),
                    ));
                    st.switchover = Switchover { to: to.into(), phase: "Refused".into(), message: reason };
                }
                None => {
                    start_switchover(&mut st, &mut d, to, "asked by the annotation", now_ms);
                    decided_now = true;
                }
            }
        }
        Some(_) => {}
    }

    // 2b. A switchover the plugin starts itself (the primary is being scaled away or is the last
    // member left to roll), or an outdated standby replaced (see `roll`).
    let settled = !decided_now && !matches!(st.switchover.phase.as_str(), "Demoting" | "Promoting");
    match roll::next(&st, members, settings).filter(|_| settled) {
        Some(roll::Step::Switchover { to, why }) => {
            start_switchover(&mut st, &mut d, &to, &why, now_ms);
            decided_now = true;
        }
        Some(roll::Step::Replace { pod, why }) => {
            d.events.push(event(EventType::Normal, "ReplacingPod", format!("replacing {pod}: {why}")));
            d.replace = Some(pod);
        }
        None => {}
    }
    d.hold_replicas = roll::hold_replicas(&[prev, &st], settings);

    // 3. Failover.
    let switching = |st: &State| matches!(st.switchover.phase.as_str(), "Demoting" | "Promoting");
    if !st.bootstrapping() && !decided_now {
        let target = find(&st.target);
        let why = match target {
            Some(t) if t.is_primary() => None,
            _ if st.target != st.current => {
                Some(unhealthy(target, "").unwrap_or_else(|| "it has not been promoted yet".into()))
            }
            _ => unhealthy(target, &st.current_uid),
        };
        match why {
            None => st.failing_since_ms = 0,
            Some(why) => {
                if st.failing_since_ms == 0 {
                    st.failing_since_ms = now_ms;
                }
                let allowed = if switching(&st) { SWITCHOVER_TIMEOUT_MS } else { settings.failover_delay_ms };
                let waited = now_ms.saturating_sub(st.failing_since_ms);
                if waited >= allowed {
                    let failed = st.target.clone();
                    if let Some(c) = best_candidate(members, &st, &failed, settings.replicas) {
                        let s = c.stats().cloned().unwrap_or_else(|| Stats {
                            in_recovery: true,
                            connections: 0,
                            max_connections: 0,
                            received: 0,
                            replayed: 0,
                            timeline: 0,
                            streaming: false,
                            read_only: false,
                            system_id: String::new(),
                            standbys: Vec::new(),
                        });
                        if switching(&st) {
                            st.switchover.phase = "Failed".into();
                            st.switchover.message =
                                format!("{failed} did not become the primary within {} s", allowed / 1000);
                        }
                        // The old primary, already running again (fenced, as a standby), must
                        // restart to rewind once the new one answers.
                        if failed == st.current {
                            if let Some(m) = find(&failed).filter(|m| m.running && !m.deleting) {
                                let fence = m.incarnation();
                                if !st.fenced.contains(&fence) {
                                    st.fenced.push(fence);
                                }
                            }
                        }
                        d.events.push(event(
                            EventType::Warning,
                            "FailingOver",
                            format!(
                                "primary {failed} unavailable for {:.1} s ({why}): promoting {} (received {}, replay lag {} bytes, timeline {})",
                                waited as f64 / 1000.0,
                                c.pod,
                                crate::live::lsn_text(s.received.max(s.replayed)),
                                s.replay_lag(),
                                s.timeline,
                            ),
                        ));
                        st.target = c.pod.clone();
                        st.epoch += 1;
                        st.promoting = true;
                        st.failing_since_ms = now_ms;
                        decided_now = true;
                    } else if target.is_some_and(Member::is_standby) {
                        d.events.push(event(
                            EventType::Warning,
                            "PromotingAgain",
                            format!("{failed} answers as a standby ({why}) and no other standby can take over: promoting it again"),
                        ));
                        st.epoch += 1;
                        st.promoting = true;
                        st.failing_since_ms = now_ms;
                        decided_now = true;
                    } else {
                        d.condition = Some(unavailable(
                            "WaitingForPrimary",
                            format!(
                                "primary {failed} unavailable ({why}) and no standby answers to take over"
                            ),
                        ));
                        d.wake_in_ms = Some(settings.failover_delay_ms.max(1_000));
                    }
                } else {
                    d.wake_in_ms = Some(allowed - waited);
                    if st.target == st.current {
                        d.condition = Some(unavailable(
                            "PrimaryUnavailable",
                            format!(
                                "primary {} unavailable for {:.1} s ({why}); failover after {:.1} s",
                                st.target,
                                waited as f64 / 1000.0,
                                allowed as f64 / 1000.0
                            ),
                        ));
                    }
                }
            }
        }
    }

    // 4. Promotion of the target, in a later reconcile than its decision; in a switchover only
    // once the old primary has stopped.
    if st.promoting && !decided_now {
        let old_stopped = !switching(&st)
            || find(&st.current)
                .is_none_or(|o| !o.is_primary() || answers.has(&stop_id("switchover", o, st.epoch)));
        if let Some(t) = find(&st.target).filter(|t| t.is_standby()) {
            if old_stopped {
                if st.switchover.phase == "Demoting" {
                    st.switchover.phase = "Promoting".into();
                    st.switchover.message = format!("{} stopped; promoting {}", st.current, t.pod);
                }
                d.requests.push(Request::Promote { pod: t.pod.clone(), id: promote_id(t, st.epoch) });
            }
        }
    }

    // 5. Fencing: no other server answers as a primary; former primaries rewind; servers of
    // another database system are cloned again. Such a server on an old revision (the release
    // before this one's command, which knows no topology) would only start again as it was if
    // stopped: it is replaced instead, one at a time, and comes back from the current revision,
    // whose entry script clones it. It is in no Service and holds none of the cluster's data.
    let target_ok = find(&st.target).is_some_and(Member::is_primary) && st.target == st.current;
    // A cluster taken over has a primary of its own on every member until its target, made
    // again from the current revision, is confirmed: they are left as they are until then.
    if !decided_now && !st.taken_over() {
        let foreign = |m: &Member| target_ok && m.is_foreign(&st.system_id);
        for m in members.iter().filter(|m| m.pod != st.target && (m.is_primary() || foreign(m))) {
            if m.outdated && foreign(m) {
                let settled = members.iter().all(|x| !x.deleting && x.ready);
                if d.replace.is_none() && settled {
                    d.events.push(event(
                        EventType::Warning,
                        "ReplacingPod",
                        format!(
                            "replacing {}: on an old revision, it serves another database system (it comes back a clone of {})",
                            m.pod, st.target
                        ),
                    ));
                    d.replace = Some(m.pod.clone());
                }
                continue;
            }
            let why = if switching(&st) && m.pod == st.current {
                "switchover"
            } else if m.is_primary() {
                "demote"
            } else {
                "reclone"
            };
            d.requests.push(Request::Stop { pod: m.pod.clone(), id: stop_id(why, m, st.epoch), why });
        }
    }
    let target_name = st.target.clone();
    st.fenced.retain(|fence| {
        fence.split('@').next() != Some(target_name.as_str())
            && members.iter().any(|m| m.incarnation() == *fence)
    });
    if target_ok && !decided_now {
        for fence in &st.fenced {
            if let Some(m) = members.iter().find(|m| m.incarnation() == *fence && m.is_standby()) {
                d.requests.push(Request::Stop {
                    pod: m.pod.clone(),
                    id: stop_id("rejoin", m, st.epoch),
                    why: "rejoin",
                });
            }
        }
    }
    if d.condition.is_none() {
        if target_ok && !st.promoting && !switching(&st) {
            d.condition = Some(Condition {
                type_: PRIMARY_CONDITION.into(),
                status: ConditionStatus::True,
                reason: "Primary".into(),
                message: format!("{} is the primary (timeline {})", st.current, st.timeline),
            });
        } else if switching(&st) {
            d.condition = Some(unavailable("SwitchingOver", st.switchover.message.clone()));
        } else if st.promoting {
            d.condition =
                Some(unavailable("FailingOver", format!("promoting {} (promotion {})", st.target, st.epoch)));
        } else if st.bootstrapping() {
            d.condition = Some(unavailable(
                "Bootstrapping",
                format!("waiting for {} to become the first primary", st.target),
            ));
        } else {
            d.condition = Some(unavailable(
                "PrimaryUnavailable",
                format!("{} does not answer as the primary", st.target),
            ));
        }
    }

    // 6. Roles. A cluster taken over keeps its target (the release before this one sent writes
    // there) behind `-rw` until it is replaced. In a switchover the target is labelled `primary` in the plan that promotes
    // it: the old primary has stopped cleanly by then, so no other server takes writes, and
    // `-rw` moves while the promotion runs instead of a reconcile after its answer (the write
    // gap was the stop, the promotion with its checkpoint, then that reconcile and the move).
    // Until the promotion ends, writes through `-rw` fail as read-only and clients retry.
    let promoted_now = d.requests.iter().find_map(|r| match r {
        Request::Promote { pod, .. } if st.switchover.phase == "Promoting" => Some(pod.as_str()),
        _ => None,
    });
    for m in members {
        let fenced = st.fenced.iter().any(|f| *f == m.incarnation());
        let role = if m.deleting || !m.running {
            None
        } else if (m.pod == st.target && m.pod == st.current && m.uid == st.current_uid)
            || (promoted_now == Some(m.pod.as_str()) && m.is_standby())
            || (st.taken_over() && m.pod == st.target && m.is_primary())
        {
            Some("primary")
        } else if m.is_streaming() && !fenced {
            Some("replica")
        } else {
            None
        };
        d.roles.push((m.pod.clone(), role));
    }
    d.state = st;
    d
}

/// Starts a switchover from the current primary to `to`: the target moves at once (the old
/// primary leaves `-rw`), the old primary is stopped cleanly, then `to` is promoted (rule 4).
fn start_switchover(st: &mut State, d: &mut Decision, to: &str, why: &str, now_ms: u64) {
    let old = st.current.clone();
    st.switchover = Switchover {
        to: to.into(),
        phase: "Demoting".into(),
        message: format!("stopping {old} cleanly, then promoting {to}"),
    };
    st.target = to.into();
    st.epoch += 1;
    st.promoting = true;
    st.failing_since_ms = now_ms;
    d.events.push(event(
        EventType::Normal,
        "SwitchingOver",
        format!("switchover from {old} to {to} ({why}): {old} leaves -rw and stops cleanly first"),
    ));
}

/// Why a switchover to `to` cannot happen now; `Some("")` when `to` is already the primary,
/// None when it can.
pub fn refuse_switchover(st: &State, members: &[Member], settings: &Settings, to: &str) -> Option<String> {
    if to == st.current && st.target == st.current {
        return Some(String::new());
    }
    if st.bootstrapping() {
        return Some("the cluster has no primary yet".into());
    }
    if st.target != st.current || st.promoting {
        return Some(format!("a promotion of {} is in progress", st.target));
    }
    let Some(m) = members.iter().find(|m| m.pod == to) else {
        return Some(format!("{to} is not an instance of this cluster"));
    };
    if ordinal(to).is_some_and(|o| o >= settings.replicas) {
        return Some(format!("{to} is being removed (spec.replicas is {})", settings.replicas));
    }
    if !m.is_streaming() {
        let state = match &m.answer {
            _ if !m.running => "its container is not running".to_string(),
            None => "it has not answered since it started".to_string(),
            Some(Err(e)) => format!("it does not answer ({e})"),
            Some(Ok(s)) if !s.in_recovery => "it answers as a primary".to_string(),
            Some(Ok(_)) => "its WAL receiver is not streaming".to_string(),
        };
        return Some(format!("{to} is not a streaming standby: {state}"));
    }
    let primary = members.iter().find(|p| p.pod == st.current).and_then(Member::stats);
    if let (Some(p), Some(s)) = (primary, m.stats()) {
        let behind = p.received.saturating_sub(s.received);
        if behind > settings.max_switchover_lag_bytes {
            return Some(format!(
                "{to} is {behind} bytes behind the primary (more than {})",
                settings.max_switchover_lag_bytes
            ));
        }
    }
    None
}
