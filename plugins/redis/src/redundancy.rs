//! Whether the replicas the spec promises exist and could take over now, as pure functions of
//! what the servers answered: in replication mode every replica of the master linked
//! (`master_link_status:up`, which a replica reaches only once its first full copy is loaded)
//! and caught up; in cluster mode every shard's master with its `replicasPerShard` replicas
//! linked and caught up. A replica the servers list but whose own server says its link is down holds no
//! copy a failover could use: a master lost then takes its writes with it.

use stateward_sdk::redundancy::{absent, caught_up, tally, CopyState, Redundancy};

use crate::cluster;
use crate::roles;

/// A pod as the verdict needs it: whether it can hold a copy now, and whether it was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    pub name: String,
    /// Ready, running its server and not being deleted.
    pub ready: bool,
    /// Its server was asked (a poll is out): no answer yet means not known yet.
    pub asked: bool,
}

/// Replication mode: a replica of the confirmed master for each of the `promised` servers
/// (spec.replicas; none but the master outside replication mode), each linked to it and caught up (its lag in `d.lag` within the hysteresis bounds, `was_redundant`
/// being the verdict written last).
pub fn replication(
    pods: &[Pod],
    members: &[roles::Member],
    d: &roles::Decision,
    promised: &[String],
    was_redundant: bool,
) -> Redundancy {
    let want = promised.len().saturating_sub(1);
    if want == 0 {
        return Redundancy::not_promised("one server and no replica: losing it loses its data");
    }
    let Some(master) = d.master.as_deref() else {
        return match pods.iter().any(|p| p.asked) && members.iter().all(|m| m.server.is_none()) {
            true => Redundancy::unknown("no server has answered yet"),
            false => Redundancy::lacking("NoMaster", "no master is confirmed"),
        };
    };
    let copies =
        pods.iter().zip(members).filter(|(p, _)| p.name != master).map(|(p, m)| match (&m.server, p.ready) {
            (_, false) => CopyState::Lacks(format!("{} is not ready", p.name)),
            (None, true) if p.asked => CopyState::NotAnswered,
            (None, true) => CopyState::Lacks(format!("{} was not asked", p.name)),
            (Some(Err(e)), true) => CopyState::Lacks(format!("{} did not answer: {e}", p.name)),
            (Some(Ok(i)), true) => {
                let follows = roles::pod_of(&i.master_host, members) == Some(master);
                let lag = d.lag.get(&p.name).copied().flatten();
                if i.role != "slave" || !follows {
                    CopyState::Lacks(format!("{} does not follow {master}", p.name))
                } else if !i.link_up {
                    CopyState::Lacks(format!("{}'s link to {master} is down", p.name))
                } else if !lag.is_some_and(|l| caught_up(l, was_redundant)) {
                    let behind = lag.map_or("an unknown number of".to_string(), |l| l.to_string());
                    CopyState::Lacks(format!("{} is {behind} bytes behind {master}", p.name))
                } else {
                    CopyState::InSync
                }
            }
        });
    let present: Vec<&str> = pods.iter().map(|p| p.name.as_str()).collect();
    let copies = copies.chain(absent(promised, &present, master));
    tally(copies, want, &format!("replica(s) of {master} linked and caught up"))
}

/// Cluster mode: `shards` masters serving every slot, each with `per_shard` replicas whose own
/// server says its link to that master is up and whose offset is within the hysteresis bounds
/// of the master's (`was_redundant`: the verdict written last). `pods` are in the order of
/// `members`.
pub fn cluster(
    pods: &[Pod],
    members: &[cluster::Member],
    d: &cluster::Decision,
    shards: usize,
    per_shard: usize,
    was_redundant: bool,
) -> Redundancy {
    if per_shard == 0 {
        return Redundancy::not_promised(
            "replicasPerShard is 0: losing a master loses the slots it serves and their keys",
        );
    }
    if !d.formed {
        return Redundancy::lacking("Forming", "the cluster is not formed yet");
    }
    if d.shards.len() < shards || d.slots_ok < cluster::SLOTS {
        return match d.shards.is_empty() && pods.iter().any(|p| p.asked) {
            true if members.iter().all(|m| m.answer.is_none()) => {
                Redundancy::unknown("no server has answered yet")
            }
            _ => Redundancy::lacking(
                "SlotsNotServed",
                format!(
                    "{} of {shards} shards serve slots, {} of {} slots ok",
                    d.shards.len(),
                    d.slots_ok,
                    cluster::SLOTS
                ),
            ),
        };
    }
    let mut unknown = false;
    let mut lacking = Vec::new();
    for shard in &d.shards {
        // A master no pod answers for is named by its node id.
        let master = match pods.iter().any(|p| p.name == shard.master) {
            true => shard.master.clone(),
            false => format!(
                "its master (node {}, no pod answers for it)",
                shard.master.get(..12).unwrap_or(&shard.master)
            ),
        };
        let offset_of = |pod: &str| match &members.iter().find(|m| m.pod == pod)?.answer {
            Some(Ok(v)) => v.offset,
            _ => None,
        };
        let master_offset = offset_of(&shard.master);
        for replica in &shard.replicas {
            let pod = pods.iter().zip(members).find(|(p, _)| &p.name == replica);
            match pod.map(|(p, m)| (p, &m.answer)) {
                Some((p, _)) if !p.ready => lacking.push(format!("{replica} is not ready")),
                Some((p, None)) if p.asked => unknown = true,
                Some((_, Some(Ok(v)))) if v.link_up => {
                    // Each server is polled on its own: a master read after its replica can
                    // be ahead by what was written in between, which the bounds allow for.
                    let lag = master_offset.zip(v.offset).map(|(m, r)| m.saturating_sub(r));
                    match lag {
                        Some(l) if caught_up(l, was_redundant) => {}
                        Some(l) => lacking.push(format!("{replica} is {l} bytes behind {master}")),
                        // The master not heard from yet: known on its first answer.
                        None if members.iter().any(|m| m.pod == shard.master && m.answer.is_none()) => {
                            unknown = true
                        }
                        None => lacking.push(format!("{replica}'s offset behind {master} is not known")),
                    }
                }
                Some((_, Some(Ok(_)))) => lacking.push(format!("{replica}'s link to {master} is down")),
                Some((_, Some(Err(e)))) => lacking.push(format!("{replica} did not answer: {e}")),
                _ => lacking.push(format!("{replica} is not a pod that answers")),
            }
        }
        if shard.replicas.len() < per_shard {
            lacking.push(format!("{master} has {} of {per_shard} replicas", shard.replicas.len()));
        }
    }
    if lacking.is_empty() && !unknown {
        return Redundancy::redundant(format!(
            "{} shards each with {per_shard} replica(s) linked to its master",
            d.shards.len()
        ));
    }
    if lacking.is_empty() {
        return Redundancy::unknown("a replica has not answered yet");
    }
    Redundancy::lacking("CopiesMissing", lacking.join("; "))
}
