//! Who is the master, as a pure function of what the servers and the Sentinels answered.
//!
//! Sentinel decides failovers; the plugin only follows. The master is the pod most answering
//! Sentinels name (a Sentinel cut off from the others may still name the old one), and it is
//! labelled `master` only once its own server answers as a master: during a failover, or while
//! a former master that came back has not yet been turned into a replica, `-master` selects no
//! pod rather than a wrong one. Replicas are labelled `replica` while their link to that master
//! is up. With no Sentinel answering (standalone mode, or all of them down), the only server
//! answering as a master is the master. A pod being deleted neither votes nor is voted for; and
//! during a switchover the plugin asked for, the target is named as soon as the Sentinel leading
//! its failover has promoted it ([`decide_promoted`]), before the others move.

use std::collections::BTreeMap;

use stateward_sdk::{Condition, ConditionStatus, Event, EventType};

/// The fields of `INFO` the plugin reads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Info {
    /// `master` or `slave`.
    pub role: String,
    /// A replica's master, as it was given (a pod's stable name).
    pub master_host: String,
    /// A replica's link to its master is up.
    pub link_up: bool,
    /// The replication offset: a master's own, a replica's processed one.
    pub offset: u64,
    pub connected_replicas: u64,
    pub used_memory: u64,
    /// 0: no limit.
    pub maxmemory: u64,
    /// `min-replicas-to-write` is set (INFO says `min_slaves_good_slaves` only then): what
    /// fencing sets, as no spec may (see `live::fence_writes`).
    pub writes_held: bool,
}

/// What one Sentinel says of the master.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SentinelView {
    /// The master's address (a pod's stable name).
    pub master_host: String,
    /// Its flags as this Sentinel sees them, e.g. `master` or `s_down,master`.
    pub flags: String,
    /// Other Sentinels it knows.
    pub other_sentinels: u64,
    /// The quorum it was given.
    pub quorum: u64,
    /// The step of a failover this Sentinel leads (`failover-state`; empty when none is).
    pub failover_state: String,
}

impl SentinelView {
    /// This Sentinel leads a failover that has told the chosen replica to become the master
    /// (`wait_promotion`: it reads the replica's role once a second) or seen it do so: once
    /// that replica answers as the master, what is left (the other replicas, then the new
    /// address) follows from it; the only way back is the failover timing out unseen.
    pub fn promotion_sent(&self) -> bool {
        matches!(self.failover_state.as_str(), "wait_promotion" | "reconf_slaves" | "update_config")
    }
}

/// A pod and what it answered.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Member {
    pub pod: String,
    pub deleting: bool,
    pub server: Option<Result<Info, String>>,
    pub sentinel: Option<Result<SentinelView, String>>,
}

impl Member {
    fn info(&self) -> Option<&Info> {
        self.server.as_ref().and_then(|a| a.as_ref().ok())
    }
}

/// The pod a host name names (`<pod>.<headless>` or the pod's name), if it is one of `pods`.
pub fn pod_of<'a>(host: &str, pods: &'a [Member]) -> Option<&'a str> {
    let name = host.split('.').next()?;
    pods.iter().map(|m| m.pod.as_str()).find(|p| *p == name)
}

/// The type of the condition saying whether a master serves writes.
pub const MASTER_CONDITION: &str = "MasterAvailable";

/// What the plugin does about the answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The confirmed master: named by the Sentinels and answering as a master.
    pub master: Option<String>,
    /// The pod the Sentinels name, confirmed or not.
    pub named: Option<String>,
    /// How many Sentinels name it, of how many answered.
    pub votes: (usize, usize),
    /// Every Sentinel that answered names the master (true when none answered).
    pub agreed: bool,
    /// The role label of every pod (None: no label).
    pub roles: Vec<(String, Option<&'static str>)>,
    /// Each replica's bytes behind the master (None: not known).
    pub lag: BTreeMap<String, Option<u64>>,
    pub condition: Condition,
    pub events: Vec<Event>,
}

/// Decides from `members`; `previous` is the master status named last time.
pub fn decide(members: &[Member], previous: Option<&str>) -> Decision {
    decide_promoted(members, previous, None)
}

/// [`decide`], where `promoted` is a pod a failover the plugin asked for is promoting (see
/// [`SentinelView::promotion_sent`]): it is named, if it answers as a master, before the
/// Sentinels have moved to it (that takes them a second or two more, the write gap of a
/// switchover).
pub fn decide_promoted(members: &[Member], previous: Option<&str>, promoted: Option<&str>) -> Decision {
    let mut d = Decision {
        master: None,
        named: None,
        votes: (0, 0),
        agreed: false,
        roles: Vec::new(),
        lag: BTreeMap::new(),
        condition: Condition {
            type_: MASTER_CONDITION.into(),
            status: ConditionStatus::Unknown,
            reason: String::new(),
            message: String::new(),
        },
        events: Vec::new(),
    };
    // A pod going away neither votes nor is voted for: its Sentinel stops with it, and a
    // Sentinel still naming it has not heard of the failover that made another the master
    // (a roll deletes the old master's pod right after its switchover; counting those stale
    // votes took the master label off the new master for two seconds).
    let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
    let (mut answered, mut dropped) = (0, 0);
    for m in members.iter().filter(|m| !m.deleting) {
        if let Some(Ok(s)) = &m.sentinel {
            answered += 1;
            let named = pod_of(&s.master_host, members);
            match named.filter(|p| members.iter().any(|m| m.pod == *p && !m.deleting)) {
                Some(p) => *votes.entry(p).or_default() += 1,
                None if named.is_some() => dropped += 1,
                None => {}
            }
        }
    }
    let best = votes.values().copied().max().unwrap_or(0);
    let leaders: Vec<&str> = votes.iter().filter(|(_, v)| **v == best).map(|(p, _)| *p).collect();
    // With votes dropped, what is left may be a minority: it names the master confirmed last,
    // or nobody (a stale Sentinel must not make a pod that answers as a master the master).
    let minority = dropped > 0 && best * 2 <= answered;
    d.named = match leaders.as_slice() {
        [one] if minority && previous != Some(*one) => None,
        [one] => Some((*one).to_string()),
        [] if answered == 0 => {
            let masters: Vec<&Member> =
                members.iter().filter(|m| m.info().is_some_and(|i| i.role == "master")).collect();
            match masters.as_slice() {
                [one] => Some(one.pod.clone()),
                _ => None,
            }
        }
        _ => None,
    };
    let answers_master = |p: &str| {
        members.iter().any(|m| m.pod == p && !m.deleting && m.info().is_some_and(|i| i.role == "master"))
    };
    if let Some(p) = promoted.filter(|p| answers_master(p)) {
        d.named = Some(p.to_string());
    }
    let named_votes = d.named.as_deref().map_or(best, |n| votes.get(n).copied().unwrap_or(0));
    d.votes = (named_votes, answered);
    d.master = d.named.clone().filter(|n| answers_master(n));
    d.agreed = answered == 0
        || (best == answered && leaders.len() == 1 && d.master.as_deref() == leaders.first().copied());
    // One slow or failed answer does not take the master out of its Services (seen on a loaded
    // node: a poll timing out emptied `-master` for a moment, and a client's next connection was
    // refused). The master confirmed last stays while its pod is not going away, it has not
    // answered as anything else, and the Sentinels name no other pod.
    if d.master.is_none() {
        if let Some(p) = previous.filter(|p| d.named.as_deref().is_none_or(|n| n == *p)) {
            if members.iter().any(|m| m.pod == p && !m.deleting && m.info().is_none()) {
                d.master = Some(p.to_string());
            }
        }
    }
    let master_offset = d
        .master
        .as_ref()
        .and_then(|n| members.iter().find(|m| &m.pod == n))
        .and_then(Member::info)
        .map(|i| i.offset);
    for m in members {
        let replica_of_master = m.info().is_some_and(|i| {
            i.role == "slave"
                && i.link_up
                && d.master.as_deref().is_some_and(|p| pod_of(&i.master_host, members) == Some(p))
        });
        let role = if m.deleting {
            None
        } else if d.master.as_deref() == Some(m.pod.as_str()) {
            Some("master")
        } else if replica_of_master {
            Some("replica")
        } else {
            None
        };
        if role == Some("replica") {
            let lag = master_offset.zip(m.info().map(|i| i.offset)).map(|(mo, ro)| mo.saturating_sub(ro));
            d.lag.insert(m.pod.clone(), lag);
        }
        d.roles.push((m.pod.clone(), role));
    }
    d.condition = match (&d.master, &d.named) {
        (Some(p), _) => Condition {
            type_: MASTER_CONDITION.into(),
            status: ConditionStatus::True,
            reason: "MasterConfirmed".into(),
            message: format!(
                "{p} answers as the master ({} of {} Sentinels name it); {} replica(s) linked",
                d.votes.0,
                d.votes.1,
                d.lag.len()
            ),
        },
        (None, Some(p)) => Condition {
            type_: MASTER_CONDITION.into(),
            status: ConditionStatus::False,
            reason: "MasterNotConfirmed".into(),
            message: format!("the Sentinels name {p}, which does not answer as a master (yet)"),
        },
        (None, None) => Condition {
            type_: MASTER_CONDITION.into(),
            status: ConditionStatus::False,
            reason: "NoMaster".into(),
            message: format!("no master is agreed on ({answered} Sentinel(s) answered)"),
        },
    };
    if let Some(p) = &d.master {
        match previous.filter(|x| !x.is_empty()) {
            Some(old) if old != p => d.events.push(Event {
                type_: EventType::Warning,
                reason: "MasterChanged".into(),
                message: format!("{p} is the master now, in place of {old}"),
            }),
            None => d.events.push(Event {
                type_: EventType::Normal,
                reason: "MasterConfirmed".into(),
                message: format!("{p} is the first master"),
            }),
            _ => {}
        }
    }
    d
}
