//! Rolling changes in replication mode, as a pure decision over the pods ([`next`]); the
//! plugin carries it out in [`crate::live`].
//!
//! The StatefulSet's `updateStrategy` is `OnDelete` in replication mode: its controller makes
//! a deleted pod again from the current revision but replaces none by itself, so the order is
//! the plugin's. One pod at a time, and only while every pod that stays is there, Ready, and
//! the master or a replica linked to it: first the outdated replicas, highest ordinal first;
//! then a switchover (see [`crate::switchover`]) to the updated linked replica that lags
//! least; the old master, a replica by then, last. The master's server is never restarted
//! while it is the master, so no write is refused for longer than the switchover's pause.
//!
//! Scale-in never removes the master: while it holds an ordinal at or past `spec.replicas`
//! the StatefulSet is held at its size ([`hold_replicas`]) and the plugin switches over to the
//! best replica that stays; only then does the StatefulSet shrink.
//!
//! Before any master was confirmed (a new cluster) there is nothing to keep and nobody to ask:
//! outdated pods are replaced by their readiness alone, as the StatefulSet controller would.
//! While no master is confirmed later on (a failover under way), nothing is replaced.
//!
//! A pod on an old revision whose server cannot be asked (the release before this one started
//! its servers without the credentials this build's requests use) is no obstacle: the replicas
//! are replaced first, as any outdated replica; the master, which cannot be paused for a
//! switchover, is replaced once every other pod is an updated replica linked to it
//! ([`Step::ReplaceMaster`]): on SIGTERM a Redis 7 master holds writes and waits for its
//! replicas to catch up before it exits, and the Sentinels fail over to one of them.

/// A pod as the roll sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    pub name: String,
    pub ready: bool,
    pub deleting: bool,
    /// Made from an older revision of the StatefulSet than the one it makes pods from now.
    pub outdated: bool,
    /// The role label the plugin gives it: `master`, `replica` (linked to the master) or none.
    pub role: Option<&'static str>,
    /// A replica's bytes behind the master, if known.
    pub lag: Option<u64>,
    /// On an old revision, its server refuses this build's requests for want of credentials: a
    /// pod the release before this one made (its container lacks `REDISCLI_AUTH`).
    pub unaskable: bool,
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Delete `pod`: the StatefulSet makes it again from its current revision.
    Replace { pod: String, why: String },
    /// Switch over from the master to `to`.
    Switchover { to: String, why: String },
    /// Delete the master's pod `pod`, on an old revision and not answering: the Sentinels fail
    /// over to an updated replica (see the module documentation).
    ReplaceMaster { pod: String, why: String },
}

/// The pod's ordinal in the StatefulSet (`<name>-<n>`).
pub(crate) fn ordinal(pod: &str) -> Option<i64> {
    pod.rsplit_once('-')?.1.parse().ok()
}

/// The next step, if one may be taken now. `replicas` is `spec.replicas`; `master` the
/// confirmed master; `formed`: a master was ever confirmed (status names one).
pub fn next(pods: &[Pod], replicas: i64, master: Option<&str>, formed: bool) -> Option<Step> {
    let staying: Vec<&Pod> = pods.iter().filter(|p| kept(&p.name, replicas)).collect();
    let all_there = i64::try_from(staying.len()).is_ok_and(|n| n == replicas);
    if !all_there || staying.iter().any(|p| p.deleting || !p.ready) {
        return None;
    }
    let highest_outdated = |among: &mut dyn Iterator<Item = &&Pod>| {
        among
            .filter(|p| p.outdated)
            .max_by_key(|p| (ordinal(&p.name), p.name.clone()))
            .map(|p| p.name.clone())
    };
    let Some(master) = master else {
        let pod = highest_outdated(&mut staying.iter()).filter(|_| !formed)?;
        return Some(Step::Replace {
            pod,
            why: "on an old revision, before the first master answered".into(),
        });
    };
    if let Some(pod) =
        highest_outdated(&mut staying.iter().filter(|p| p.name != master && p.role.is_none() && p.unaskable))
    {
        return Some(Step::Replace {
            pod,
            why: "a replica on an old revision whose server cannot be asked (replicas first, one at a time)"
                .into(),
        });
    }
    if !staying.iter().all(|p| p.name == master || p.role == Some("replica")) {
        return None;
    }
    // Scale-in past the master: it moves to a pod that stays first (an updated one if any).
    if !kept(master, replicas) {
        let to = staying
            .iter()
            .min_by_key(|p| (p.outdated, p.lag.unwrap_or(u64::MAX), std::cmp::Reverse(ordinal(&p.name))))?;
        return Some(Step::Switchover {
            to: to.name.clone(),
            why: format!("{master} is being scaled away (spec.replicas is {replicas})"),
        });
    }
    if let Some(pod) = highest_outdated(&mut staying.iter().filter(|p| p.name != master)) {
        return Some(Step::Replace {
            pod,
            why: "a replica on an old revision (replicas first, one at a time)".into(),
        });
    }
    if !staying.iter().any(|p| p.outdated) {
        return None;
    }
    // Only the master is left on the old revision.
    if staying.iter().any(|p| p.name == master && p.unaskable) {
        return Some(Step::ReplaceMaster {
            pod: master.to_string(),
            why: format!("{master}, the last pod on an old revision, cannot be asked for a switchover: its shutdown waits for the replicas, the Sentinels fail over"),
        });
    }
    let to = staying
        .iter()
        .filter(|p| p.name != master && !p.outdated)
        .min_by_key(|p| (p.lag.unwrap_or(u64::MAX), std::cmp::Reverse(ordinal(&p.name))))?;
    Some(Step::Switchover {
        to: to.name.clone(),
        why: format!("{master} is the last pod on an old revision"),
    })
}

/// Whether `pod` keeps its place at `replicas` pods (its ordinal is below).
fn kept(pod: &str, replicas: i64) -> bool {
    ordinal(pod).is_none_or(|o| o < replicas)
}

/// The StatefulSet's size while any of `masters` (the confirmed master, the one status named
/// last, a switchover's two ends) holds an ordinal `spec.replicas` drops: up to and including
/// it, so the StatefulSet never removes a master; it shrinks once status names one that stays.
pub fn hold_replicas<'a>(masters: impl IntoIterator<Item = &'a str>, replicas: i64) -> Option<i64> {
    masters.into_iter().filter_map(ordinal).filter(|o| *o >= replicas).max().map(|o| o + 1)
}
