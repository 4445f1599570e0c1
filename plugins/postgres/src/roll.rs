//! Rolling changes and scale-down, as pure decisions over the members ([`next`],
//! [`hold_replicas`]); [`crate::ha::decide`] carries them out.
//!
//! The StatefulSet's `updateStrategy` is `OnDelete`: its controller makes a deleted pod again
//! from the current revision but replaces none by itself, so the order is the plugin's. One
//! member at a time, and only while every member that stays is running, Ready and (for a
//! standby) streaming from a confirmed primary: first the outdated standbys, highest ordinal
//! first; then a switchover to the best updated streaming standby; the old primary, now a
//! standby, last. A cluster of one has nobody to switch over to: its primary is replaced in
//! place (it comes back fenced and is promoted again).
//!
//! Before the first primary answered (a new cluster, one whose servers cannot be asked, or one
//! taken over from the release before this one), pods are replaced by their readiness alone,
//! as the StatefulSet controller would, the target first.
//!
//! Scale-down never removes the primary: while it holds an ordinal at or past `spec.replicas`
//! the StatefulSet is held at its size, and the plugin switches over to the best streaming
//! standby that stays; only then does the StatefulSet shrink.

use crate::ha::{self, best_candidate, ordinal, Member, Settings, State};

/// What to do next for a roll or a scale-down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Switch over from the current primary to `to`.
    Switchover { to: String, why: String },
    /// Delete `pod`, which the StatefulSet then makes again from its current revision.
    Replace { pod: String, why: String },
}

/// Before any server answered as the primary there is nobody to ask: an outdated pod is
/// replaced the way the StatefulSet controller would, highest ordinal first, one at a time,
/// once every member that stays is Ready (the pods, not their servers, tell; so a roll also
/// ends where no server can be asked at all).
///
/// The target goes first in a cluster taken over from the release before this one (status
/// names a primary, none was confirmed; its pods on an old revision, each server its own
/// `initdb`): the target holds the data to keep, and only its pod made from the current
/// revision starts as a primary the others can be cloned from (the entry script makes the
/// replication role and admits it).
fn before_the_first_primary(st: &State, members: &[Member], settings: &Settings) -> Option<Step> {
    let staying: Vec<&Member> =
        members.iter().filter(|m| ordinal(&m.pod).is_none_or(|o| o < settings.replicas)).collect();
    let all_there = i64::try_from(staying.len()).is_ok_and(|n| n == settings.replicas);
    if !all_there || staying.iter().any(|m| m.deleting || !m.ready) {
        return None;
    }
    let outdated = || staying.iter().filter(|m| m.outdated);
    let m = outdated()
        .find(|m| st.taken_over() && m.pod == st.target)
        .or_else(|| outdated().max_by_key(|m| (ordinal(&m.pod), m.pod.clone())))?;
    Some(Step::Replace {
        pod: m.pod.clone(),
        why: "on an old revision, before the first primary answered".into(),
    })
}

/// The StatefulSet's size while the primary holds an ordinal `spec.replicas` drops: up to and
/// including the primary, so nothing shrinks past it before the switchover. `states` are the
/// state status holds and the one this reconcile writes: the StatefulSet shrinks only in a
/// reconcile after status names the new primary.
pub fn hold_replicas(states: &[&State], settings: &Settings) -> Option<i64> {
    states
        .iter()
        .flat_map(|st| [&st.current, &st.target])
        .filter_map(|p| ordinal(p))
        .filter(|o| *o >= settings.replicas)
        .max()
        .map(|o| o + 1)
}

/// The next step, if one may be taken now; see the module documentation.
pub fn next(st: &State, members: &[Member], settings: &Settings) -> Option<Step> {
    if st.bootstrapping() {
        return before_the_first_primary(st, members, settings);
    }
    if st.promoting || st.target != st.current {
        return None;
    }
    let primary = members.iter().find(|m| m.pod == st.current && m.uid == st.current_uid)?;
    if !primary.is_primary() || primary.deleting {
        return None;
    }
    let kept = |m: &&Member| ordinal(&m.pod).is_none_or(|o| o < settings.replicas);
    let switchover_to = |among: &[Member], why: String| {
        let c = best_candidate(among, st, &st.current, settings.replicas)?;
        let ok = c.is_streaming() && ha::refuse_switchover(st, members, settings, &c.pod).is_none();
        ok.then(|| Step::Switchover { to: c.pod.clone(), why })
    };

    // Scale-down past the primary: move it first.
    if !kept(&primary) {
        return switchover_to(
            members,
            format!("{} is being scaled away (spec.replicas is {})", st.current, settings.replicas),
        );
    }

    // A roll goes on only while every member that stays is there and well.
    let staying: Vec<&Member> = members.iter().filter(kept).collect();
    let all_there = i64::try_from(staying.len()).is_ok_and(|n| n == settings.replicas);
    let well = |m: &&Member| m.running && m.ready && !m.deleting && (m.pod == st.current || m.is_streaming());
    if !all_there || !staying.iter().all(well) || !staying.iter().any(|m| m.outdated) {
        return None;
    }
    let fenced = |m: &Member| st.fenced.iter().any(|f| *f == m.incarnation());
    if staying.iter().any(|m| fenced(m)) {
        return None;
    }
    if let Some(m) = staying
        .iter()
        .filter(|m| m.outdated && m.pod != st.current)
        .max_by_key(|m| (ordinal(&m.pod), m.pod.clone()))
    {
        return Some(Step::Replace {
            pod: m.pod.clone(),
            why: "a standby on an old revision (standbys first, one at a time)".into(),
        });
    }
    // Only the primary is left on the old revision.
    if staying.len() == 1 {
        return Some(Step::Replace {
            pod: primary.pod.clone(),
            why: "the only member, on an old revision (it comes back fenced and is promoted again)".into(),
        });
    }
    let updated: Vec<Member> = staying.iter().filter(|m| !m.outdated).map(|m| (*m).clone()).collect();
    switchover_to(&updated, format!("{} is the last member on an old revision", st.current))
}
