//! Whether the standbys the spec promises could take over now, from the confirmed primary's
//! own `pg_stat_replication`: every other instance streaming from it and within the lag
//! bounds (with hysteresis, see `stateward_sdk::redundancy`), and when `synchronous` is set,
//! at least `number` of them synchronous (`sync` or `quorum`): a commit then waits for them.

use stateward_sdk::redundancy::{absent, caught_up, tally, CopyState, Redundancy};

use crate::ha::Member;
use crate::spec::Synchronous;

/// A standby for each of the `promised` instances (spec.replicas) but `primary` (the confirmed
/// one, if any), among `members`; `was_redundant`: the verdict written last.
pub fn verdict(
    members: &[Member],
    promised: &[String],
    primary: Option<&Member>,
    sync: Option<&Synchronous>,
    was_redundant: bool,
) -> Redundancy {
    let want = promised.len().saturating_sub(1);
    if want == 0 {
        return Redundancy::not_promised("one instance and no standby: losing it loses its data");
    }
    let Some(primary) = primary.and_then(|p| Some((p, p.stats()?))) else {
        return match members.iter().all(|m| m.answer.is_none()) {
            true => Redundancy::unknown("no instance has answered yet"),
            false => Redundancy::lacking("NoPrimary", "no primary is confirmed"),
        };
    };
    let (p, stats) = primary;
    let copies = members.iter().filter(|m| m.pod != p.pod).map(|m| {
        let seen = stats.standbys.iter().find(|s| s.name == m.pod);
        match seen {
            _ if !m.running || m.deleting || !m.ready => CopyState::Lacks(format!("{} is not ready", m.pod)),
            None => CopyState::Lacks(format!("{} is not connected to {}", m.pod, p.pod)),
            Some(s) if s.state != "streaming" => {
                CopyState::Lacks(format!("{} is {} from {}, not streaming", m.pod, s.state, p.pod))
            }
            Some(s) if s.lag_bytes < 0 => {
                CopyState::Lacks(format!("{} has not reported what it replayed to {} yet", m.pod, p.pod))
            }
            Some(s) if !caught_up(s.lag_bytes as u64, was_redundant) => {
                CopyState::Lacks(format!("{} has not replayed {} bytes of {}", m.pod, s.lag_bytes, p.pod))
            }
            Some(_) => CopyState::InSync,
        }
    });
    let present: Vec<&str> = members.iter().map(|m| m.pod.as_str()).collect();
    let copies = copies.chain(absent(promised, &present, &p.pod));
    let r = tally(copies, want, &format!("standby(s) of {} streaming and caught up", p.pod));
    let Some(sync) = sync.filter(|_| r.verdict == stateward_sdk::redundancy::Verdict::Redundant) else {
        return r;
    };
    let synchronous =
        stats.standbys.iter().filter(|s| matches!(s.sync_state.as_str(), "sync" | "quorum")).count() as u64;
    if synchronous < sync.number {
        return Redundancy::lacking(
            "SynchronousQuorumNotMet",
            format!(
                "{synchronous} of the {} synchronous standby(s) spec.postgresql.synchronous asks for",
                sync.number
            ),
        );
    }
    r
}
