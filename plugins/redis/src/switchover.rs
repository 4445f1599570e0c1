//! Switchover on the annotation `stateward.dev/switchover-to: <pod>` (replication mode), as a
//! pure function of what was asked, what the plugin wrote last, and the answers.
//!
//! `SENTINEL FAILOVER` takes no target: Sentinel promotes the replica with the lowest
//! `replica-priority` (then the largest offset). So the target is made the preferred replica
//! first (`CONFIG SET replica-priority 1` on it, 100 on the other replicas), then, once the
//! Sentinels can have read it (they ask each replica `INFO` every 10 s: [`PRIORITY_SEEN_MS`]),
//! the old master stops taking writes (`CLIENT PAUSE WRITE`: they wait, they are not refused),
//! and once the target has every byte the old master wrote (offsets read after the pause: both
//! servers are asked once as soon as the pause is answered, [`Request::Offset`], and the polls
//! go on meanwhile), its Sentinel is asked to fail over.
//!
//! Sentinel makes the old master a replica of the new one only some seconds after the
//! failover (it waits to hear of newer configurations first): until then the old master
//! would take writes again once its pause ends, from clients still connected to it or routed
//! there before the `-master` Service moves, and those writes would be lost. So as soon as
//! the target is the master the plugin names (it answers as one, and the Sentinel leading the
//! failover has promoted it, see [`crate::roles::decide_promoted`], or the Sentinels name it),
//! the plugin itself makes the old master its replica and disconnects its clients (what
//! Sentinel would do later), and the switchover is `Done` only once the old master answers as a
//! replica, from then on no write reaches it, and every Sentinel names the target.
//!
//! Phases: `Preparing` → `Pausing` → `FailingOver` → `Done`, or `Refused` (not a linked
//! replica, no master) and `Failed` (an error answered, or not done within [`TIMEOUT_MS`]).

use std::collections::BTreeMap;

use serde_json::{json, Value};
use stateward_sdk::{Event, EventType, ExecRequest, RequestMode};

use crate::sentinel;

/// The annotation naming the replica to switch over to.
pub const ANNOTATION: &str = "stateward.dev/switchover-to";
/// Sentinel refreshes what it knows of each replica (its `INFO`, with `slave_priority`) every
/// 10 s: the failover is asked a little later than that after the priorities are set.
pub const PRIORITY_SEEN_MS: u64 = 11_000;
/// How long the old master holds writes back: the target catching up, the failover and the
/// old master following the new one (a request or a poll each) fit well within it.
pub const PAUSE_MS: u64 = 20_000;
/// The target must have caught up this long before the pause ends, or the switchover fails
/// (the old master then takes writes again and stays the master).
pub const CATCH_UP_MS: u64 = 10_000;
/// How long each request may take to answer (a busy node answers slowly; a request that
/// does not answer in time counts as not answered, never as failed).
pub const REQUEST_TIMEOUT_MS: u32 = 15_000;
/// A switchover not done within this is Failed.
pub const TIMEOUT_MS: u64 = 90_000;
/// Sentinel's default priority, restored after a switchover.
pub const DEFAULT_PRIORITY: u32 = 100;

/// The last switchover asked for, as kept in `status.switchover`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct State {
    /// The annotation's value acted upon last.
    pub asked: String,
    /// The replica switched over to.
    pub to: String,
    /// The master when it was asked.
    pub from: String,
    pub phase: String,
    pub message: String,
    pub started_at_ms: u64,
    /// When every priority was set (0: not yet).
    pub prepared_at_ms: u64,
    /// When the old master was seen to hold writes back (0: not yet).
    pub paused_at_ms: u64,
}

impl State {
    pub fn from_status(status: Option<&Value>) -> State {
        let s = status.and_then(|s| s.get("switchover"));
        let text = |k: &str| s.and_then(|s| s.get(k)).and_then(Value::as_str).unwrap_or_default().to_string();
        let number = |k: &str| s.and_then(|s| s.get(k)).and_then(Value::as_u64).unwrap_or(0);
        State {
            // Written before `asked` existed: the annotation was `to`.
            asked: s
                .and_then(|s| s.get("asked"))
                .and_then(Value::as_str)
                .map_or_else(|| text("to"), str::to_string),
            to: text("to"),
            from: text("from"),
            phase: text("phase"),
            message: text("message"),
            started_at_ms: number("startedAtMs"),
            prepared_at_ms: number("preparedAtMs"),
            paused_at_ms: number("pausedAtMs"),
        }
    }

    pub fn to_status(&self) -> Value {
        json!({
            "asked": self.asked,
            "to": self.to,
            "from": self.from,
            "phase": self.phase,
            "message": self.message,
            "startedAtMs": self.started_at_ms,
            "preparedAtMs": self.prepared_at_ms,
            "pausedAtMs": self.paused_at_ms,
        })
    }

    /// A switchover is under way.
    pub fn active(&self) -> bool {
        matches!(self.phase.as_str(), "Preparing" | "Pausing" | "FailingOver")
    }
}

/// A one-shot request to a pod's server or Sentinel, named by `id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `CONFIG SET replica-priority`.
    Priority { pod: String, priority: u32, id: String },
    /// `CLIENT PAUSE <PAUSE_MS> WRITE` on the old master.
    Pause { pod: String, id: String },
    /// `INFO` of `pod`'s server, once, as soon as the pause is answered: writes
    /// wait on the target's catch-up, and the next poll may be half a second away.
    Offset { pod: String, id: String },
    /// `SENTINEL FAILOVER`, to the Sentinel of `pod`.
    Failover { pod: String, id: String },
    /// The old master `pod` becomes a replica of the pod `of`, its clients are disconnected
    /// and its pause lifted (they reconnect through the `-master` Service).
    Follow { pod: String, of: String, id: String },
    /// `CLIENT UNPAUSE` on the old master, when the switchover failed.
    Unpause { pod: String, id: String },
}

/// What the step decided.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Step {
    pub state: State,
    pub requests: Vec<Request>,
    pub events: Vec<Event>,
    /// Look again this soon.
    pub wake_in_ms: Option<u64>,
}

/// One pod's server as last polled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Server {
    /// It answers as a master.
    pub master: bool,
    /// Its replication offset.
    pub offset: u64,
    /// When the poll it answered was started (the host's clock).
    pub asked_at_ms: u64,
}

/// The cluster as the plugin sees it now.
pub struct View<'a> {
    /// The confirmed master.
    pub master: Option<&'a str>,
    /// Pods labelled replica (linked to the master).
    pub replicas: &'a [String],
    /// Every pod of the cluster.
    pub pods: &'a [String],
    /// What each pod's server answered last (absent: no answer).
    pub servers: &'a BTreeMap<String, Server>,
    /// Every Sentinel that answered names the master.
    pub agreed: bool,
}

fn priority_id(pod: &str, st: &State, priority: u32) -> String {
    format!("switchover-priority-{pod}-{}-{priority}", st.started_at_ms)
}

fn pause_id(st: &State) -> String {
    format!("switchover-pause-{}-{}", st.from, st.started_at_ms)
}

/// The ids of [`Request::Offset`] start with this, then the pod's name and `-`.
pub const OFFSET_PREFIX: &str = "switchover-offset-";

fn offset_id(pod: &str, st: &State) -> String {
    format!("{OFFSET_PREFIX}{pod}-{}-{}", st.started_at_ms, st.paused_at_ms)
}

fn failover_id(st: &State) -> String {
    format!("switchover-failover-{}-{}", st.to, st.started_at_ms)
}

fn follow_id(st: &State) -> String {
    format!("switchover-follow-{}-{}", st.from, st.started_at_ms)
}

fn unpause_id(st: &State) -> String {
    format!("switchover-unpause-{}-{}", st.from, st.started_at_ms)
}

fn event(type_: EventType, reason: &str, message: String) -> Event {
    Event { type_, reason: reason.into(), message }
}

/// A switchover to `to` starting now (`why`: who asked), or refused at once: its state and the
/// event saying so. `asked` stays what the annotation asked last: a switchover the plugin
/// starts itself (see [`crate::roll`]) leaves it as it was.
pub fn begin(prev: &State, to: &str, why: &str, view: &View, now_ms: u64) -> (State, Event) {
    let mut st = State {
        asked: prev.asked.clone(),
        to: to.to_string(),
        from: view.master.unwrap_or_default().to_string(),
        started_at_ms: now_ms,
        ..State::default()
    };
    let refuse = |why: String| ("Refused".to_string(), why);
    let (phase, message) = if !view.pods.iter().any(|p| p == to) {
        refuse(format!("{to} is not a pod of this cluster"))
    } else if view.master == Some(to) {
        ("Done".to_string(), format!("{to} is the master already"))
    } else if view.master.is_none() {
        refuse("no master is confirmed to switch over from".to_string())
    } else if !view.replicas.iter().any(|r| r == to) {
        refuse(format!("{to} is not a replica linked to the master"))
    } else {
        ("Preparing".to_string(), format!("making {to} the preferred replica ({why})"))
    };
    st.phase = phase;
    st.message = message;
    let kind = if st.phase == "Refused" { EventType::Warning } else { EventType::Normal };
    let e = event(kind, &format!("Switchover{}", st.phase), format!("switchover to {to}: {}", st.message));
    (st, e)
}

/// After a switchover the plugin started failed, it starts none for this long: each attempt
/// holds writes back for a while.
pub const RETRY_AFTER_FAILED_MS: u64 = 300_000;

/// Whether the plugin may start a switchover of its own now: none is under way, and the last
/// one did not fail recently.
pub fn may_begin(prev: &State, now_ms: u64) -> bool {
    !prev.active()
        && (prev.phase != "Failed" || now_ms >= prev.started_at_ms + TIMEOUT_MS + RETRY_AFTER_FAILED_MS)
}

/// One step; `answers` holds the answers to earlier requests by id (Err: why it failed).
pub fn step(
    prev: &State,
    annotation: Option<&str>,
    view: &View,
    answers: &BTreeMap<String, Result<(), String>>,
    now_ms: u64,
) -> Step {
    let mut st = prev.clone();
    let mut s = Step::default();
    let asked = annotation.map(str::trim).filter(|a| !a.is_empty());
    if let Some(to) = asked.filter(|a| *a != prev.asked) {
        let (started, event) = begin(prev, to, "asked by the annotation", view, now_ms);
        st = State { asked: to.to_string(), ..started };
        s.events.push(event);
    }
    if !st.active() {
        // The priorities go back to the default in the step that ends a switchover; asked again
        // after it (the same ids: sent once) in case that step's requests were not sent.
        let ended = matches!(st.phase.as_str(), "Done" | "Failed");
        if ended && !st.from.is_empty() && st.from != st.to {
            for p in view.pods {
                let id = priority_id(p, &st, DEFAULT_PRIORITY);
                s.requests.push(Request::Priority { pod: p.clone(), priority: DEFAULT_PRIORITY, id });
            }
        }
        s.state = st;
        return s;
    }
    let priorities: Vec<(String, u32)> =
        view.pods.iter().map(|p| (p.clone(), if *p == st.to { 1 } else { DEFAULT_PRIORITY })).collect();
    let finish = |st: &mut State, s: &mut Step, phase: &str, message: String| {
        // A pause not lifted by the old master following the new one is lifted now, unless
        // Sentinel may be failing over (asked, and no refusal answered): the old master would
        // then take writes beside the new one.
        let failover_refused = matches!(answers.get(&failover_id(st)), Some(Err(_)));
        let may_fail_over = st.phase == "FailingOver" && !failover_refused;
        if phase == "Failed" && st.paused_at_ms > 0 && !may_fail_over && view.master != Some(st.to.as_str()) {
            s.requests.push(Request::Unpause { pod: st.from.clone(), id: unpause_id(st) });
        }
        st.phase = phase.into();
        st.message = message;
        let kind = if phase == "Done" { EventType::Normal } else { EventType::Warning };
        s.events.push(event(
            kind,
            &format!("Switchover{phase}"),
            format!("switchover to {}: {}", st.to, st.message),
        ));
        // Every pod back to the default priority.
        for p in view.pods {
            s.requests.push(Request::Priority {
                pod: p.clone(),
                priority: DEFAULT_PRIORITY,
                id: priority_id(p, st, DEFAULT_PRIORITY),
            });
        }
    };
    let failed = |answers: &BTreeMap<String, Result<(), String>>, id: &str| match answers.get(id) {
        Some(Err(e)) => Some(e.clone()),
        _ => None,
    };
    if view.master == Some(st.to.as_str()) {
        // The target is the master the plugin names (promoted by the failover asked for, or
        // named by the Sentinels) and answers as one: the old master must follow it before
        // anyone is told it is done.
        // Done once the old master answers as a replica (or its pod is gone): no answer from
        // it is no proof that it refuses writes.
        let old_follows = st.from.is_empty()
            || !view.pods.contains(&st.from)
            || view.servers.get(&st.from).is_some_and(|o| !o.master);
        if old_follows && !view.agreed && now_ms.saturating_sub(st.started_at_ms) <= TIMEOUT_MS {
            // Writes flow to the target already; done once no Sentinel names another pod (the
            // plugin named the target as soon as its failover's leader saw it promoted).
            st.message =
                format!("{} is the master and {} its replica; the Sentinels move to it", st.to, st.from);
            s.wake_in_ms = Some(500);
            s.state = st;
            return s;
        }
        if old_follows {
            let took = now_ms.saturating_sub(st.started_at_ms);
            let mut message = if st.from.is_empty() {
                format!("{} is the master ({took} ms after it was asked)", st.to)
            } else {
                format!("{} is the master and {} its replica ({took} ms after it was asked)", st.to, st.from)
            };
            if !view.agreed {
                message.push_str("; some Sentinels still name another pod");
            }
            finish(&mut st, &mut s, "Done", message);
            s.state = st;
            return s;
        }
        let id = follow_id(&st);
        if now_ms.saturating_sub(st.started_at_ms) > TIMEOUT_MS {
            let message = format!("{} is the master, but {} did not answer as its replica", st.to, st.from);
            finish(&mut st, &mut s, "Failed", message);
            s.state = st;
            return s;
        }
        if let Some(e) = failed(answers, &id) {
            let why = format!("making {} a replica of {} failed: {e}", st.from, st.to);
            finish(&mut st, &mut s, "Failed", why);
            s.state = st;
            return s;
        }
        st.phase = "FailingOver".into();
        st.message = format!("{} is the master; {} is made its replica", st.to, st.from);
        s.requests.push(Request::Follow { pod: st.from.clone(), of: st.to.clone(), id });
        s.wake_in_ms = Some(1_000);
        s.state = st;
        return s;
    }
    if now_ms.saturating_sub(st.started_at_ms) > TIMEOUT_MS {
        let message = format!("not done within {} s ({})", TIMEOUT_MS / 1000, st.message);
        finish(&mut st, &mut s, "Failed", message);
        s.state = st;
        return s;
    }
    if st.phase == "Preparing" {
        let mut all = true;
        for (pod, priority) in &priorities {
            let id = priority_id(pod, &st, *priority);
            match answers.get(&id) {
                Some(Ok(())) => {}
                Some(Err(e)) => {
                    let why = format!("setting replica-priority on {pod} failed: {e}");
                    finish(&mut st, &mut s, "Failed", why);
                    s.state = st;
                    return s;
                }
                None => all = false,
            }
            s.requests.push(Request::Priority { pod: pod.clone(), priority: *priority, id });
        }
        if all && st.prepared_at_ms == 0 {
            st.prepared_at_ms = now_ms;
        }
        if st.prepared_at_ms > 0 && now_ms >= st.prepared_at_ms + PRIORITY_SEEN_MS {
            st.phase = "Pausing".into();
            st.message = format!("{} holds writes back until {} has caught up", st.from, st.to);
        } else {
            s.wake_in_ms = Some(1_000);
        }
    }
    if st.phase == "Pausing" {
        let id = pause_id(&st);
        match answers.get(&id) {
            Some(Err(e)) => {
                let why = format!("CLIENT PAUSE on {} answered: {e}", st.from);
                finish(&mut st, &mut s, "Failed", why);
                s.state = st;
                return s;
            }
            Some(Ok(())) if st.paused_at_ms == 0 => st.paused_at_ms = now_ms,
            _ => {}
        }
        s.requests.push(Request::Pause { pod: st.from.clone(), id });
        if st.paused_at_ms > 0 {
            for pod in [&st.from, &st.to] {
                s.requests.push(Request::Offset { pod: pod.clone(), id: offset_id(pod, &st) });
            }
            // Both offsets from polls started after the pause: nothing is written in between.
            let after = |p: &str| view.servers.get(p).filter(|v| v.asked_at_ms > st.paused_at_ms);
            match (after(&st.from), after(&st.to)) {
                (Some(old), Some(new)) if new.offset >= old.offset => {
                    st.phase = "FailingOver".into();
                    st.message = format!(
                        "{} has caught up (offset {}); a Sentinel fails over to it",
                        st.to, old.offset
                    );
                }
                _ if now_ms >= st.paused_at_ms + PAUSE_MS - CATCH_UP_MS => {
                    let message =
                        format!("{} did not catch up with {} while writes were held back", st.to, st.from);
                    finish(&mut st, &mut s, "Failed", message);
                    s.state = st;
                    return s;
                }
                _ => {}
            }
        }
        s.wake_in_ms = Some(500);
    }
    if st.phase == "FailingOver" {
        let id = failover_id(&st);
        if let Some(e) = failed(answers, &id) {
            finish(&mut st, &mut s, "Failed", format!("SENTINEL FAILOVER answered: {e}"));
            s.state = st;
            return s;
        }
        // The target's own Sentinel is asked: it runs beside the server that is to win.
        s.requests.push(Request::Failover { pod: st.to.clone(), id });
        s.wake_in_ms = Some(500);
    }
    s.state = st;
    s
}

/// Whether every line `redis-cli` printed for a request is a success (`OK`, or the number of
/// clients `CLIENT KILL` disconnected).
pub fn answered_ok(stdout: &str) -> bool {
    let lines: Vec<&str> = stdout.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    !lines.is_empty() && lines.iter().all(|l| *l == "OK" || l.parse::<u64>().is_ok())
}

/// The `redis-cli` run in the pod's `redis` container for `r`; `headless` names the pods'
/// Service. The password comes from the container's `REDISCLI_AUTH`, never from the plan.
pub fn exec(r: &Request, headless: &str, timeout_ms: u32) -> ExecRequest {
    let server = crate::PORT.to_string();
    let (pod, id, port, args, stdin): (&str, &str, String, Vec<String>, Option<String>) = match r {
        Request::Priority { pod, priority, id } => {
            let args = ["config", "set", "replica-priority", &priority.to_string()].map(String::from);
            (pod, id, server, args.to_vec(), None)
        }
        Request::Pause { pod, id } => (
            pod,
            id,
            server,
            ["client", "pause", &PAUSE_MS.to_string(), "write"].map(String::from).to_vec(),
            None,
        ),
        Request::Offset { pod, id } => {
            // All of INFO, as the polls ask: the same parse reads both.
            (pod, id, server, vec!["info".to_string()], None)
        }
        Request::Failover { pod, id } => {
            let args = ["sentinel", "failover", sentinel::MASTER_NAME].map(String::from);
            (pod, id, sentinel::PORT.to_string(), args.to_vec(), None)
        }
        // Several commands on one connection: read from stdin, one a line.
        Request::Follow { pod, of, id } => {
            let script = format!(
                "REPLICAOF {of}.{headless} {server}\nCLIENT KILL TYPE normal\nCLIENT UNPAUSE\n",
                server = crate::PORT
            );
            (pod, id, server, Vec::new(), Some(script))
        }
        Request::Unpause { pod, id } => {
            (pod, id, server, ["client", "unpause"].map(String::from).to_vec(), None)
        }
    };
    let mut command: Vec<String> =
        ["redis-cli", "-h", "127.0.0.1", "--no-auth-warning", "-p", &port].map(String::from).to_vec();
    command.extend(args);
    ExecRequest {
        id: id.to_string(),
        mode: RequestMode::Once,
        pod: pod.to_string(),
        container: "redis".into(),
        command,
        stdin,
        timeout_ms,
    }
}
