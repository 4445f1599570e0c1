//! Redis Cluster mode (`spec.mode: cluster`): `spec.cluster.shards` masters, each with
//! `replicasPerShard` replicas, one server per pod, as pure functions of what the servers
//! answered ([`parse`], [`decide`]).
//!
//! Redis Cluster fails over by itself: the replicas of a master that a majority of masters sees
//! failing for `cluster-node-timeout` elect one of them. The plugin does what the servers
//! cannot do alone:
//! - **Forms the cluster once.** When every pod runs the StatefulSet's current revision, is
//!   Ready, and its server is a fresh node (it knows only itself and holds no slot), pod 0 runs
//!   `redis-cli --cluster create` over the pods' addresses with `--cluster-replicas`: the slots
//!   spread evenly over `shards` masters, each replica following a master on another pod.
//!   Status records the formation, and it is never run again (a node that holds data or knows
//!   other nodes refuses it anyway).
//! - **Repairs addresses.** Each node keeps its identity and its peers' last addresses in
//!   nodes.conf, on the volume. A pod made again has a new IP, which its peers learn when it
//!   connects to them; but when every pod changed address at once, nobody can reach anybody.
//!   A node that does not list another running pod's node at that pod's current IP is told
//!   `CLUSTER MEET <ip>` (once per node incarnation and address).
//! - **Observes.** Each pod's `CLUSTER INFO` and `CLUSTER NODES` (one `redis-cli`, the two
//!   commands on stdin): the cluster's state, slots assigned and ok, each node's role → role
//!   labels (`master`: holds slots; `replica`: follows a master), status per shard, and the
//!   condition `ClusterOk`.

use stateward_sdk::{Condition, ConditionStatus, Event, EventType};

/// All the hash slots of a Redis Cluster.
pub const SLOTS: u32 = 16_384;
/// `cluster-node-timeout`: how long a master may not answer before its replica takes over.
pub const NODE_TIMEOUT_MS: u64 = 5_000;
/// `--cluster-timeout` of the slot moves (`rebalance`, `fix`): how long a source server's
/// `MIGRATE` may wait on one connect, write or read (redis-cli's default is 60 s). The server
/// answers nobody meanwhile, so it must stay well below [`NODE_TIMEOUT_MS`]: a stall is then a
/// quick `IOERR` (the slot stays open, and the next step fixes it) instead of the other masters
/// voting the source out and its replica taking over in the middle of the move. A key whose
/// `RESTORE` takes longer than this on the target cannot move.
pub const MIGRATE_TIMEOUT_MS: u64 = 3_000;
const _: () = assert!(MIGRATE_TIMEOUT_MS < NODE_TIMEOUT_MS);
/// At most this many `CLUSTER MEET` in one plan.
pub const MAX_MEETS: usize = 4;
/// At most this many stale routes named in status.
pub const MAX_STALE: usize = 8;
/// The type of the condition saying whether the cluster serves every slot.
pub const CONDITION: &str = "ClusterOk";

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Node {
    pub id: String,
    /// The address it is reached at (no port).
    pub ip: String,
    /// The answering server itself.
    pub myself: bool,
    pub master: bool,
    /// The master a replica follows.
    pub master_id: Option<String>,
    /// Flagged `fail` or `fail?`.
    pub failing: bool,
    /// The link to it is up.
    pub connected: bool,
    /// Slots it serves.
    pub slots: u32,
    /// A slot of it is half moved (`[slot->-id]` or `[slot-<-id]`): a migration stopped midway.
    pub open: bool,
}

/// What one server answered.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct View {
    /// `cluster_state`: ok or fail.
    pub state: String,
    pub slots_assigned: u32,
    pub slots_ok: u32,
    pub known_nodes: u32,
    pub nodes: Vec<Node>,
    /// `min-replicas-to-write` is set (`INFO replication` says `min_slaves_good_slaves`): what
    /// fencing sets.
    pub writes_held: bool,
    /// A replica whose link to its master is up (`master_link_status:up`): it holds a copy.
    pub link_up: bool,
    /// Its replication offset (`INFO replication`): a master's own, a replica's processed one.
    pub offset: Option<u64>,
}

impl View {
    /// The answering server's own line.
    pub fn myself(&self) -> Option<&Node> {
        self.nodes.iter().find(|n| n.myself)
    }

    /// A fresh node: it knows only itself and serves no slot.
    pub fn fresh(&self) -> bool {
        self.known_nodes <= 1 && self.slots_assigned == 0
    }
}

/// Slots in `CLUSTER NODES`' slot fields (`0-5460`, `5461`; `[..]` migrations are not served).
fn slot_count(fields: &[&str]) -> u32 {
    fields
        .iter()
        .filter(|f| !f.starts_with('['))
        .filter_map(|f| match f.split_once('-') {
            Some((a, b)) => Some(b.parse::<u32>().ok()?.checked_sub(a.parse::<u32>().ok()?)? + 1),
            None => f.parse::<u32>().ok().map(|_| 1),
        })
        .sum()
}

/// `CLUSTER INFO` then `CLUSTER NODES`, as `redis-cli` prints them (None: not such an answer).
pub fn parse(out: &str) -> Option<View> {
    let mut v = View::default();
    let mut info = false;
    for line in out.lines().map(|l| l.trim_end_matches('\r')) {
        if line.starts_with("min_slaves_good_slaves:") {
            v.writes_held = true;
            continue;
        }
        if line == "master_link_status:up" {
            v.link_up = true;
            continue;
        }
        // A replica prints both; its processed offset is the one to compare with its master's.
        if let Some(n) = line.strip_prefix("slave_repl_offset:") {
            v.offset = n.trim().parse().ok();
            continue;
        }
        if let Some(n) = line.strip_prefix("master_repl_offset:") {
            v.offset = v.offset.or(n.trim().parse().ok());
            continue;
        }
        if let Some((k, val)) = line.split_once(':').filter(|(k, _)| k.starts_with("cluster_")) {
            info = true;
            let n = || val.trim().parse().unwrap_or(0);
            match k {
                "cluster_state" => v.state = val.trim().to_string(),
                "cluster_slots_assigned" => v.slots_assigned = n(),
                "cluster_slots_ok" => v.slots_ok = n(),
                "cluster_known_nodes" => v.known_nodes = n(),
                _ => {}
            }
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let is_id = |s: &str| s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit());
        if f.len() < 8 || !is_id(f[0]) {
            continue;
        }
        let flags: Vec<&str> = f[2].split(',').collect();
        // `ip:port@cport[,hostname]`; an address not known yet is `:0@0`.
        let ip = f[1].split(',').next().and_then(|a| a.rsplit_once(':')).map_or("", |(ip, _)| ip);
        v.nodes.push(Node {
            id: f[0].to_string(),
            ip: ip.to_string(),
            myself: flags.contains(&"myself"),
            master: flags.contains(&"master"),
            master_id: (f[3] != "-").then(|| f[3].to_string()),
            failing: flags.iter().any(|x| *x == "fail" || *x == "fail?"),
            connected: f[7] == "connected",
            slots: slot_count(&f[8..]),
            open: f[8..].iter().any(|x| x.starts_with('[')),
        });
    }
    (info && !v.state.is_empty() && v.myself().is_some()).then_some(v)
}

/// A pod and what its server answered.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Member {
    pub pod: String,
    pub ip: String,
    pub ready: bool,
    pub deleting: bool,
    pub outdated: bool,
    pub answer: Option<Result<View, String>>,
}

impl Member {
    fn view(&self) -> Option<&View> {
        self.answer.as_ref().and_then(|a| a.as_ref().ok())
    }
}

/// The address `redis-cli --cluster` (rebalance, fix) is given for the server of
/// `pod`, as `ip:port` (an IPv6 address without brackets: redis-cli splits at the last ':');
/// None when no address is known. Never 127.0.0.1: redis-cli keeps the entry node at the
/// address it was given and hands that address to the other servers as the `MIGRATE` target,
/// so a source server told 127.0.0.1 migrates to itself and blocks until the timeout.
///
/// The pod's IP first: the scale steps run only once every server lists every pod that stays
/// at its pod's IP (no meeting pending, see [`scale`]), so that is the address the sources
/// reach. A server's own line in `CLUSTER NODES` is the fallback only: a server learns its own
/// address from an incoming `MEET`, so after its pod came back on another IP its own line can
/// name the old one for a while.
pub fn entry(members: &[Member], pod: &str, port: &str) -> Option<String> {
    let m = members.iter().find(|m| m.pod == pod)?;
    let own = m.view().and_then(View::myself).map(|n| n.ip.as_str());
    let ip = Some(m.ip.as_str()).filter(|ip| !ip.is_empty()).or(own).filter(|ip| !ip.is_empty())?;
    Some(format!("{ip}:{port}"))
}

/// One shard: a master serving slots and the pods following it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    pub master: String,
    pub slots: u32,
    pub replicas: Vec<String>,
}

/// What the plugin does about the answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The cluster was formed: status says so, or a server knows others or serves slots.
    pub formed: bool,
    /// Form the cluster now: run `--cluster create` in this pod over these addresses.
    pub form: Option<(String, Vec<String>)>,
    /// `CLUSTER MEET <ip>` to send from a pod: (pod, ip).
    pub meets: Vec<(String, String)>,
    /// Servers that route to a peer at an address its pod no longer has, or not at all
    /// (at most [`MAX_STALE`]): a client they redirect there waits on a dead address.
    pub stale: Vec<String>,
    /// The role label of every pod (None: no label).
    pub roles: Vec<(String, Option<&'static str>)>,
    pub shards: Vec<Shard>,
    /// The cluster as the best-informed server sees it.
    pub state: String,
    pub slots_assigned: u32,
    pub slots_ok: u32,
    pub condition: Condition,
    pub events: Vec<Event>,
}

/// Decides from `members` (every pod of the cluster); `formed`: status recorded the formation;
/// `pods` the number of pods the spec asks for; `replicas_per_shard` from the spec.
pub fn decide(members: &[Member], formed: bool, pods: usize, replicas_per_shard: u32) -> Decision {
    let views: Vec<(&Member, &View)> = members.iter().filter_map(|m| Some((m, m.view()?))).collect();
    let formed = formed || views.iter().any(|(_, v)| !v.fresh());
    let mut d = Decision {
        formed,
        form: None,
        meets: Vec::new(),
        stale: Vec::new(),
        roles: Vec::new(),
        shards: Vec::new(),
        state: String::new(),
        slots_assigned: 0,
        slots_ok: 0,
        condition: Condition {
            type_: CONDITION.into(),
            status: ConditionStatus::Unknown,
            reason: "NoAnswer".into(),
            message: "no server has answered yet".into(),
        },
        events: Vec::new(),
    };
    // The pod whose server has the node id `id`, else the id itself.
    let pod_of = |id: &str| {
        views
            .iter()
            .find(|(_, v)| v.myself().is_some_and(|n| n.id == id))
            .map_or_else(|| id.to_string(), |(m, _)| m.pod.clone())
    };

    if !formed {
        let all_fresh = members.len() == pods
            && views.len() == pods
            && members.iter().all(|m| m.ready && !m.deleting && !m.outdated && !m.ip.is_empty());
        d.condition = Condition {
            type_: CONDITION.into(),
            status: ConditionStatus::False,
            reason: "Forming".into(),
            message: if all_fresh {
                format!("forming the cluster over {pods} pods")
            } else {
                format!(
                    "waiting for {pods} Ready pods of the current revision whose servers answer as fresh nodes ({} answered)",
                    views.len()
                )
            },
        };
        if all_fresh {
            let ordered = by_ordinal(members);
            let first = ordered.first().map(|m| m.pod.clone()).unwrap_or_default();
            d.form = Some((first, ordered.iter().map(|m| m.ip.clone()).collect()));
        }
        d.roles = members.iter().map(|m| (m.pod.clone(), None)).collect();
        return d;
    }

    // Addresses: a node that lists no node at all at another answering pod's current IP (a
    // node still shaking hands is listed at it, under an id of its own). One meeting per node
    // and at most MAX_MEETS in all: gossip introduces the rest, and a plan's requests are
    // bounded.
    // Pods past the spec's number are on their way out (see [`scale`]): never introduced.
    let stays =
        |m: &Member| crate::roll::ordinal(&m.pod).is_some_and(|o| usize::try_from(o).is_ok_and(|o| o < pods));
    for (m, v) in views.iter().filter(|(m, _)| !m.deleting && stays(m)) {
        let missing = views.iter().find(|(other, _)| {
            other.pod != m.pod
                && !other.ip.is_empty()
                && !other.deleting
                && stays(other)
                && !v.nodes.iter().any(|n| n.ip == other.ip)
        });
        if let Some((other, _)) = missing.filter(|_| d.meets.len() < MAX_MEETS) {
            d.meets.push((m.pod.clone(), other.ip.clone()));
        }
    }

    // Routes: after pods came back on new IPs, a server can say `ok` while it still lists a
    // peer's node at the peer's old address (gossip corrects it within seconds); the slots of
    // that peer are redirected there until then. Each stale route is named, so status shows
    // when every server routes to every pod where it is.
    for (m, v) in views.iter().filter(|(m, _)| !m.deleting && stays(m)) {
        for (other, ov) in
            views.iter().filter(|(o, _)| o.pod != m.pod && !o.deleting && !o.ip.is_empty() && stays(o))
        {
            let Some(id) = ov.myself().map(|n| n.id.as_str()) else { continue };
            let listed = v.nodes.iter().find(|n| n.id == id);
            if listed.is_some_and(|n| n.ip == other.ip) || d.stale.len() >= MAX_STALE {
                continue;
            }
            d.stale.push(match listed {
                Some(n) => format!("{} routes {} to {}", m.pod, other.pod, n.ip),
                None => format!("{} does not know {}", m.pod, other.pod),
            });
        }
    }

    // The best-informed view: the one serving most slots ok, then knowing most nodes.
    let best =
        views.iter().max_by_key(|(m, v)| (v.slots_ok, v.known_nodes, std::cmp::Reverse(m.pod.clone())));
    if let Some((_, v)) = best {
        d.state = v.state.clone();
        d.slots_assigned = v.slots_assigned;
        d.slots_ok = v.slots_ok;
        for n in v.nodes.iter().filter(|n| n.master && n.slots > 0) {
            let replicas = v
                .nodes
                .iter()
                .filter(|r| r.master_id.as_deref() == Some(n.id.as_str()) && !r.failing)
                .map(|r| pod_of(&r.id))
                .collect();
            d.shards.push(Shard { master: pod_of(&n.id), slots: n.slots, replicas });
        }
        // In the pods' order (servers list their nodes in an order of their own); a master no
        // pod answers for goes last. No sort: each sort grows the component by kilobytes.
        let order: Vec<String> = by_ordinal(members).iter().map(|m| m.pod.clone()).collect();
        let place = |s: &Shard| order.iter().position(|p| *p == s.master).unwrap_or(order.len());
        let mut shards = std::mem::take(&mut d.shards);
        for i in 0..=order.len() {
            d.shards.extend(shards.iter().filter(|s| place(s) == i).cloned());
        }
        shards.clear();
    }
    // Roles, from each server's own line.
    for m in members {
        let me = m.view().and_then(View::myself);
        let role = match me {
            _ if m.deleting => None,
            Some(n) if n.master && n.slots > 0 => Some("master"),
            Some(n) if !n.master && n.master_id.is_some() => Some("replica"),
            _ => None,
        };
        d.roles.push((m.pod.clone(), role));
    }
    let short: Vec<String> = d
        .shards
        .iter()
        .filter(|s| s.replicas.len() < replicas_per_shard as usize)
        .map(|s| format!("{} has {} of {replicas_per_shard} replicas", s.master, s.replicas.len()))
        .collect();
    d.condition = match best {
        Some((_, v)) if v.state == "ok" && v.slots_ok == SLOTS => Condition {
            type_: CONDITION.into(),
            status: ConditionStatus::True,
            reason: if short.is_empty() { "AllSlotsServed" } else { "ReplicasMissing" }.into(),
            message: format!(
                "{} shards serve all {SLOTS} slots{}",
                d.shards.len(),
                if short.is_empty() { String::new() } else { format!(" ({})", short.join("; ")) }
            ),
        },
        Some((_, v)) => Condition {
            type_: CONDITION.into(),
            status: ConditionStatus::False,
            reason: "SlotsNotServed".into(),
            message: format!(
                "cluster_state {}: {} of {SLOTS} slots assigned, {} ok",
                v.state, v.slots_assigned, v.slots_ok
            ),
        },
        None => d.condition.clone(),
    };
    d
}

/// The event for the answer to the formation request: Ok(output) or Err(why).
pub fn formed_event(answer: &Result<String, String>) -> Event {
    match answer {
        Ok(_) => Event {
            type_: EventType::Normal,
            reason: "ClusterFormed".into(),
            message: format!("all {SLOTS} slots assigned (redis-cli --cluster create)"),
        },
        Err(why) => Event {
            type_: EventType::Warning,
            reason: "ClusterFormationFailed".into(),
            message: format!("redis-cli --cluster create: {why:.300}"),
        },
    }
}

/// A switchover not done within this is Failed: `CLUSTER FAILOVER` takes a few seconds (the
/// replica catches up while its master holds its clients, then the others vote).
pub const SWITCHOVER_TIMEOUT_MS: u64 = 60_000;

/// What a switchover step decided (cluster mode).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Switch {
    pub state: crate::switchover::State,
    /// `CLUSTER FAILOVER` to send to this pod, once (its request id from [`switchover_id`]).
    pub failover: Option<String>,
    pub events: Vec<Event>,
}

/// The one-shot request id of the `CLUSTER FAILOVER` of a switchover.
pub fn switchover_id(st: &crate::switchover::State) -> String {
    format!("cluster-switchover-{}-{}", st.to, st.started_at_ms)
}

/// The annotation `stateward.dev/switchover-to: <pod>` in cluster mode: the named pod, a
/// replica, takes over its shard with `CLUSTER FAILOVER` (its master holds its clients back
/// until the replica has every write, so none is lost), and the old master follows it. Done
/// once the named pod serves the shard's slots; Refused at once when it is not a replica or
/// the cluster is not ok; Failed on an error answered or after [`SWITCHOVER_TIMEOUT_MS`].
/// `answer`: the answer to the `CLUSTER FAILOVER` sent, if any (Err: why it failed).
pub fn switchover(
    prev: &crate::switchover::State,
    annotation: Option<&str>,
    d: &Decision,
    answer: Option<Result<(), String>>,
    now_ms: u64,
) -> Switch {
    let mut out = Switch { state: prev.clone(), ..Switch::default() };
    let st = &mut out.state;
    let role = |p: &str| d.roles.iter().find(|(n, _)| n == p).and_then(|(_, r)| *r);
    let event = |kind: EventType, st: &crate::switchover::State| Event {
        type_: kind,
        reason: format!("Switchover{}", st.phase),
        message: format!("switchover to {}: {}", st.to, st.message),
    };
    let asked = annotation.map(str::trim).filter(|a| !a.is_empty());
    if let Some(to) = asked.filter(|a| *a != prev.asked) {
        let master = d.shards.iter().find(|s| s.replicas.iter().any(|r| r == to)).map(|s| s.master.clone());
        *st = crate::switchover::State {
            asked: to.to_string(),
            to: to.to_string(),
            from: master.clone().unwrap_or_default(),
            started_at_ms: now_ms,
            ..Default::default()
        };
        let known = d.roles.iter().any(|(p, _)| p == to);
        (st.phase, st.message) = if !known {
            ("Refused".into(), format!("{to} is not a pod of this cluster"))
        } else if role(to) == Some("master") {
            ("Done".into(), format!("{to} is a master already"))
        } else if master.is_none() {
            ("Refused".into(), format!("{to} is not a replica following a master"))
        } else if d.state != "ok" {
            ("Refused".into(), format!("the cluster is not ok (cluster_state {})", d.state))
        } else {
            ("FailingOver".into(), format!("{to} takes over from {} (CLUSTER FAILOVER)", st.from))
        };
        let kind = if st.phase == "Refused" { EventType::Warning } else { EventType::Normal };
        out.events.push(event(kind, st));
    }
    if st.phase != "FailingOver" {
        return out;
    }
    let took = now_ms.saturating_sub(st.started_at_ms);
    if role(&st.to) == Some("master") {
        st.phase = "Done".into();
        st.message = format!(
            "{} serves the shard's slots, {} follows it ({took} ms after it was asked)",
            st.to, st.from
        );
        out.events.push(event(EventType::Normal, st));
    } else if let Some(Err(why)) = answer {
        st.phase = "Failed".into();
        st.message = format!("CLUSTER FAILOVER on {}: {why:.200}", st.to);
        out.events.push(event(EventType::Warning, st));
    } else if took > SWITCHOVER_TIMEOUT_MS {
        st.phase = "Failed".into();
        st.message = format!("{} did not take over within {} s", st.to, SWITCHOVER_TIMEOUT_MS / 1000);
        out.events.push(event(EventType::Warning, st));
    } else {
        out.failover = Some(st.to.clone());
    }
    out
}

/// One step of bringing the cluster to the shape the spec asks for (`spec.cluster.shards`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScaleStep {
    /// `CLUSTER FAILOVER` on `replica`, which stays, in place of `master`, whose pod goes: the
    /// shard moves without moving a key.
    Failover { replica: String, master: String },
    /// `CLUSTER REPLICATE <master_id>` on `pod` (an empty master or another node's replica).
    Replicate { pod: String, master: String, master_id: String },
    /// `redis-cli --cluster rebalance` from `pod` over the masters that stay (the empty ones
    /// included), the nodes in `drain` (their ids) giving all their slots away.
    Rebalance { pod: String, drain: Vec<String> },
    /// `CLUSTER FORGET <node>` on each of `from` (the pods that stay and still list it): the
    /// server of the pod `gone`, which holds nothing any more, is forgotten. Not `--cluster
    /// del-node`: that also resets the server that goes, which then answers every client still
    /// sent to it (its pod is in the Services until it stops) `CLUSTERDOWN Hash slot not
    /// served`; left as it is, it sends them on with MOVED until its pod is gone.
    Forget { from: Vec<String>, gone: String, node: String },
    /// `redis-cli --cluster fix` from `pod`: a migration stopped midway (its source failed
    /// over, say) is finished, its keys moved, before anything else moves.
    Fix { pod: String },
}

/// What scaling needs now: a step (None: nothing to do, or waiting), and the StatefulSet held
/// at its size while a pod that goes still holds slots or is known to the others.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Scale {
    pub step: Option<ScaleStep>,
    pub hold: Option<i64>,
}

/// A pod and its server's own line in `CLUSTER NODES`.
type Own<'a> = (&'a Member, &'a Node);

/// The next step towards `shards` masters with `per_shard` replicas each on the pods whose
/// ordinals are below `pods` (the spec's), one step a plan, only while the shape differs from
/// that and every pod is there, Ready and answering and the cluster is ok:
/// - scale-out: the new pods' servers join as empty masters (the meetings of [`decide`]); the
///   first of them become masters, the others replicas of the masters short of replicas
///   (`CLUSTER REPLICATE`), then `--cluster rebalance --cluster-use-empty-masters` moves an
///   even share of the slots, with their keys, to the new masters;
/// - scale-in: a master whose pod goes hands its shard to a replica that stays when one does
///   (`CLUSTER FAILOVER`); otherwise, and for masters beyond `shards`, a rebalance gives their
///   slots (and keys) to the masters that stay; the replicas that stay are moved to masters
///   short of them; the pods that go are forgotten (`CLUSTER FORGET` on every server that stays), and only then may
///   the StatefulSet shrink.
pub fn scale(members: &[Member], d: &Decision, pods: usize, shards: usize, per_shard: usize) -> Scale {
    let ordinal = |m: &Member| crate::roll::ordinal(&m.pod).and_then(|o| usize::try_from(o).ok());
    let goes = |m: &Member| ordinal(m).is_none_or(|o| o >= pods);
    let own: Vec<(&Member, &Node)> =
        by_ordinal(members).into_iter().filter_map(|m| Some((m, m.view()?.myself()?))).collect();
    let kept_ids: Vec<&str> = own.iter().filter(|(m, _)| !goes(m)).map(|(_, n)| n.id.as_str()).collect();
    // Held while a server that stays lists a node that is not one of theirs (a pod that goes,
    // until it is forgotten), or a pod that goes holds slots.
    let foreign = members
        .iter()
        .filter(|m| !goes(m))
        .filter_map(Member::view)
        .any(|v| v.nodes.iter().any(|n| !kept_ids.contains(&n.id.as_str()) && !n.failing && n.connected));
    let gone_slots = own.iter().any(|(m, n)| goes(m) && n.slots > 0);
    let highest = members.iter().filter_map(ordinal).max().map_or(0, |o| o + 1);
    let mut out = Scale {
        step: None,
        hold: (highest > pods && (foreign || gone_slots)).then(|| i64::try_from(highest).unwrap_or(i64::MAX)),
    };
    // Only while the shape differs from the spec's: more pods than asked for, or not as many
    // masters serving slots as shards. A cluster healing by itself (a failover, a pod back on
    // a new address) has its shape and is left to Redis.
    let serving_now = own.iter().filter(|(_, n)| n.master && n.slots > 0).count();
    if highest <= pods && serving_now == shards {
        return out;
    }
    let there = own.len() == members.len()
        && members.iter().all(|m| m.ready && !m.deleting)
        && d.formed
        && d.meets.is_empty()
        && own.iter().filter(|(m, _)| !goes(m)).count() == pods;
    if !there {
        return out;
    }
    if let Some((m, _)) = own.iter().find(|(_, n)| n.open) {
        out.step = Some(ScaleStep::Fix { pod: m.pod.clone() });
        return out;
    }
    if d.state != "ok" {
        return out;
    }
    let (kept, gone): (Vec<Own>, Vec<Own>) = own.iter().partition(|(m, _)| !goes(m));
    let serving: Vec<&(&Member, &Node)> = kept.iter().filter(|(_, n)| n.master && n.slots > 0).collect();
    // A shard whose master goes and whose replica stays: that replica takes over.
    if serving.len() < shards {
        for (g, gn) in gone.iter().filter(|(_, n)| n.master && n.slots > 0) {
            if let Some((k, _)) = kept.iter().find(|(_, n)| n.master_id.as_deref() == Some(gn.id.as_str())) {
                out.step = Some(ScaleStep::Failover { replica: k.pod.clone(), master: g.pod.clone() });
                return out;
            }
        }
    }
    // The masters that stay: those serving slots first, then empty ones, by ordinal.
    let mut masters: Vec<&(&Member, &Node)> = serving.into_iter().take(shards).collect();
    for empty in kept.iter().filter(|(_, n)| n.master && n.slots == 0) {
        if masters.len() < shards {
            masters.push(empty);
        }
    }
    if masters.len() < shards {
        return out;
    }
    let is_master = |id: &str| masters.iter().any(|(_, n)| n.id == id);
    // Every other pod that stays follows one of them, `per_shard` each.
    for (k, kn) in kept.iter().filter(|(_, n)| !is_master(&n.id)) {
        if kn.master_id.as_deref().is_some_and(is_master) || (kn.master && kn.slots > 0) {
            continue; // following one already, or serving slots until the rebalance drains it
        }
        let followers = |id: &str| kept.iter().filter(|(_, n)| n.master_id.as_deref() == Some(id)).count();
        let short = masters
            .iter()
            .filter(|(_, n)| followers(&n.id) < per_shard)
            .min_by_key(|(_, n)| followers(&n.id));
        if let Some((m, mn)) = short {
            out.step = Some(ScaleStep::Replicate {
                pod: k.pod.clone(),
                master: m.pod.clone(),
                master_id: mn.id.clone(),
            });
            return out;
        }
    }
    // A master with more replicas than its share gives one to a master short of them.
    let followers = |id: &str| kept.iter().filter(|(_, n)| n.master_id.as_deref() == Some(id)).count();
    let short =
        masters.iter().filter(|(_, n)| followers(&n.id) < per_shard).min_by_key(|(_, n)| followers(&n.id));
    let spare = masters
        .iter()
        .find(|(_, n)| followers(&n.id) > per_shard)
        .and_then(|(_, n)| kept.iter().rev().find(|(_, r)| r.master_id.as_deref() == Some(n.id.as_str())));
    if let (Some((m, mn)), Some((r, _))) = (short, spare) {
        out.step = Some(ScaleStep::Replicate {
            pod: r.pod.clone(),
            master: m.pod.clone(),
            master_id: mn.id.clone(),
        });
        return out;
    }
    // Slots on exactly the masters that stay.
    let drain: Vec<String> =
        own.iter().filter(|(_, n)| n.master && !is_master(&n.id)).map(|(_, n)| n.id.clone()).collect();
    let uneven = masters.iter().any(|(_, n)| n.slots == 0)
        || own.iter().any(|(_, n)| !is_master(&n.id) && n.slots > 0);
    let first = masters[0].0.pod.clone();
    if uneven {
        out.step = Some(ScaleStep::Rebalance { pod: first, drain });
        return out;
    }
    // The pods that go, forgotten.
    let listing = |id: &str| -> Vec<String> {
        kept.iter()
            .filter(|(m, _)| m.view().is_some_and(|v| v.nodes.iter().any(|n| n.id == id)))
            .map(|(m, _)| m.pod.clone())
            .collect()
    };
    if let Some((g, gn, from)) =
        gone.iter().map(|(g, gn)| (g, gn, listing(&gn.id))).find(|(.., from)| !from.is_empty())
    {
        out.step = Some(ScaleStep::Forget { from, gone: g.pod.clone(), node: gn.id.clone() });
    }
    out
}

/// `members` in the order of their pods' ordinals (without sorting: see [`decide`]).
fn by_ordinal(members: &[Member]) -> Vec<&Member> {
    let ordinal = |m: &Member| crate::roll::ordinal(&m.pod);
    let highest = members.iter().filter_map(ordinal).max().unwrap_or(-1);
    let mut out: Vec<&Member> =
        (0..=highest).filter_map(|i| members.iter().find(|m| ordinal(m) == Some(i))).collect();
    out.extend(members.iter().filter(|m| ordinal(m).is_none()));
    out
}

/// The next step of a rolling change in cluster mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RollStep {
    /// Delete these pods: the StatefulSet makes them again from its current revision.
    Replace { pods: Vec<String>, why: String },
    /// `CLUSTER FAILOVER` on `replica`: it takes over from its master `master`, in step with it
    /// (the master holds its clients until the replica has every write).
    Failover { replica: String, master: String },
}

/// The next step of a rolling change (`updateStrategy: OnDelete`, the order is the plugin's):
/// - before the cluster is formed no node holds data: every outdated pod is replaced at once;
/// - afterwards one pod at a time, only while the cluster is ok and every pod is there, Ready
///   and answering: the outdated replicas first, highest ordinal first; then, for an outdated
///   master, a `CLUSTER FAILOVER` to an updated replica of it, after which it is a replica and
///   replaced as one. A master without a replica (`replicasPerShard: 0`) is replaced in place:
///   its shard is down while it restarts, and it comes back with its data from the volume.
pub fn roll(members: &[Member], d: &Decision, formed: bool, pods: usize) -> Option<RollStep> {
    let ordinal = |p: &str| crate::roll::ordinal(p);
    if !formed {
        let outdated: Vec<String> =
            members.iter().filter(|m| m.outdated && !m.deleting).map(|m| m.pod.clone()).collect();
        return (!outdated.is_empty()).then(|| RollStep::Replace {
            pods: outdated,
            why: "on an old revision, before the cluster was formed".into(),
        });
    }
    let well = |m: &Member| m.ready && !m.deleting && m.view().is_some();
    if members.len() != pods
        || !members.iter().all(well)
        || d.state != "ok"
        || !members.iter().any(|m| m.outdated)
    {
        return None;
    }
    let role = |p: &str| d.roles.iter().find(|(n, _)| n == p).and_then(|(_, r)| *r);
    if let Some(m) = members
        .iter()
        .filter(|m| m.outdated && role(&m.pod) != Some("master"))
        .max_by_key(|m| (ordinal(&m.pod), m.pod.clone()))
    {
        return Some(RollStep::Replace {
            pods: vec![m.pod.clone()],
            why: "a replica on an old revision (replicas first, one at a time)".into(),
        });
    }
    let master = members.iter().filter(|m| m.outdated).max_by_key(|m| (ordinal(&m.pod), m.pod.clone()))?;
    let shard = d.shards.iter().find(|s| s.master == master.pod)?;
    let updated = |p: &String| members.iter().any(|m| &m.pod == p && !m.outdated);
    match shard.replicas.iter().filter(|p| updated(p)).min_by_key(|p| ordinal(p)) {
        Some(replica) => Some(RollStep::Failover { replica: replica.clone(), master: master.pod.clone() }),
        None if shard.replicas.is_empty() => Some(RollStep::Replace {
            pods: vec![master.pod.clone()],
            why: "a master on an old revision without a replica to take over (its shard is down while it restarts)".into(),
        }),
        None => None,
    }
}
