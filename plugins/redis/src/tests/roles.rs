//! Who is labelled master and replica, from the servers' and the Sentinels' answers.

use crate::roles::{decide, Info, Member, SentinelView};
use stateward_sdk::ConditionStatus;

fn master(offset: u64) -> Option<Result<Info, String>> {
    Some(Ok(Info { role: "master".into(), offset, ..Info::default() }))
}

fn replica_of(host: &str, up: bool, offset: u64) -> Option<Result<Info, String>> {
    Some(Ok(Info { role: "slave".into(), master_host: host.into(), link_up: up, offset, ..Info::default() }))
}

fn names(host: &str) -> Option<Result<SentinelView, String>> {
    Some(Ok(SentinelView {
        master_host: host.into(),
        flags: "master".into(),
        other_sentinels: 2,
        quorum: 2,
        failover_state: String::new(),
    }))
}

fn member(
    pod: &str,
    server: Option<Result<Info, String>>,
    sentinel: Option<Result<SentinelView, String>>,
) -> Member {
    Member { pod: pod.into(), deleting: false, server, sentinel }
}

const H0: &str = "c-0.c-headless";
const H1: &str = "c-1.c-headless";

fn roles(d: &crate::roles::Decision) -> Vec<Option<&str>> {
    d.roles.iter().map(|(_, r)| *r).collect()
}

#[test]
fn a_pod_promoted_by_a_failover_the_plugin_asked_for_is_named_before_the_sentinels_move() {
    // The switchover asked c-1's Sentinel to fail over; it promoted c-1 and has not switched
    // the address yet, nor have the others.
    let members = [
        member("c-0", master(500), names(H0)),
        member("c-1", master(500), names(H0)),
        member("c-2", replica_of(H0, true, 500), names(H0)),
    ];
    let d = crate::roles::decide_promoted(&members, Some("c-0"), Some("c-1"));
    assert_eq!(d.master.as_deref(), Some("c-1"));
    assert!(!d.agreed, "every Sentinel still names c-0");
    assert_eq!(roles(&d), [None, Some("master"), None], "c-0 is not a replica of c-1 yet");
    // Not while the promoted pod does not answer as a master.
    let members =
        [member("c-0", master(500), names(H0)), member("c-1", replica_of(H0, true, 500), names(H0))];
    let d = crate::roles::decide_promoted(&members, Some("c-0"), Some("c-1"));
    assert_eq!(d.master.as_deref(), Some("c-0"));
    assert!(d.agreed);
}

#[test]
fn the_master_the_sentinels_name_and_replicas_linked_to_it() {
    let members = [
        member("c-0", master(1000), names(H0)),
        member("c-1", replica_of(H0, true, 900), names(H0)),
        member("c-2", replica_of(H0, false, 0), names(H0)),
    ];
    let d = decide(&members, Some("c-0"));
    assert_eq!(d.master.as_deref(), Some("c-0"));
    assert_eq!(
        roles(&d),
        [Some("master"), Some("replica"), None],
        "a replica whose link is down serves no reads"
    );
    assert_eq!(d.lag.get("c-1"), Some(&Some(100)));
    assert_eq!(d.condition.status, ConditionStatus::True);
    assert!(d.events.is_empty(), "no change, no event");
}

#[test]
fn after_a_failover_the_new_master_and_an_event() {
    // c-0 was deleted; c-1 promoted; c-2 already follows c-1.
    let members = [member("c-1", master(50), names(H1)), member("c-2", replica_of(H1, true, 50), names(H1))];
    let d = decide(&members, Some("c-0"));
    assert_eq!(d.master.as_deref(), Some("c-1"));
    assert_eq!(roles(&d), [Some("master"), Some("replica")]);
    assert_eq!(d.events[0].reason, "MasterChanged");
    assert!(d.events[0].message.contains("in place of c-0"));
}

#[test]
fn a_former_master_back_as_a_master_is_not_labelled_until_sentinel_says_so() {
    // c-0 came back believing it is the master; two of three Sentinels name c-1.
    let members = [
        member("c-0", master(10), names(H0)),
        member("c-1", master(5000), names(H1)),
        member("c-2", replica_of(H1, true, 5000), names(H1)),
    ];
    let d = decide(&members, Some("c-1"));
    assert_eq!(d.master.as_deref(), Some("c-1"));
    assert_eq!(roles(&d), [None, Some("master"), Some("replica")]);
}

#[test]
fn no_master_label_while_the_named_master_does_not_answer_as_one() {
    // Sentinels just switched to c-1; it still answers as a replica of the hung c-0.
    let members = [
        member("c-0", Some(Err("timed out".into())), names(H1)),
        member("c-1", replica_of(H0, false, 100), names(H1)),
        member("c-2", replica_of(H0, false, 100), names(H1)),
    ];
    let d = decide(&members, Some("c-0"));
    assert_eq!(d.master, None);
    assert_eq!(d.named.as_deref(), Some("c-1"));
    assert_eq!(roles(&d), [None, None, None]);
    assert_eq!(d.condition.reason, "MasterNotConfirmed");
}

#[test]
fn a_tie_among_sentinels_names_nobody() {
    let members = [member("c-0", master(1), names(H0)), member("c-1", master(1), names(H1))];
    let d = decide(&members, None);
    assert_eq!((d.master, d.votes), (None, (1, 2)));
    assert_eq!(d.condition.reason, "NoMaster");
}

#[test]
fn a_deleting_pod_is_never_labelled() {
    let mut m = member("c-0", master(1), names(H0));
    m.deleting = true;
    let d = decide(&[m, member("c-1", replica_of(H0, true, 1), names(H0))], None);
    assert_eq!(d.master, None);
    assert_eq!(roles(&d), [None, None]);
}

#[test]
fn standalone_without_sentinels_the_one_master() {
    let d = decide(&[member("c-0", master(7), None)], None);
    assert_eq!(d.master.as_deref(), Some("c-0"));
    assert_eq!(d.events[0].reason, "MasterConfirmed");
    // Two servers answering as masters and no Sentinel: nobody.
    let d = decide(&[member("c-0", master(7), None), member("c-1", master(7), None)], None);
    assert_eq!(d.master, None);
}

#[test]
fn a_host_outside_the_cluster_is_never_named() {
    let members = [
        member("c-0", master(1), names("evil-0.elsewhere")),
        member("c-1", replica_of(H0, true, 1), names(H0)),
    ];
    let d = decide(&members, None);
    assert_eq!(d.master.as_deref(), Some("c-0"));
    assert_eq!(d.votes, (1, 2));
}

#[test]
fn a_master_whose_poll_failed_once_keeps_its_label() {
    // The Sentinels still name c-0; its INFO timed out on a busy node (or its Sentinel too).
    for c0_sentinel in [names(H0), Some(Err("timed out".into()))] {
        let members = [
            member("c-0", Some(Err("no answer within the timeout of 5000 ms".into())), c0_sentinel),
            member("c-1", replica_of(H0, true, 100), names(H0)),
            member("c-2", replica_of(H0, true, 100), names(H0)),
        ];
        let d = decide(&members, Some("c-0"));
        assert_eq!(d.master.as_deref(), Some("c-0"));
        assert_eq!(roles(&d), [Some("master"), Some("replica"), Some("replica")]);
        assert!(d.events.is_empty());
    }
    // Standalone: the same.
    let d = decide(&[member("s-0", Some(Err("timed out".into())), None)], Some("s-0"));
    assert_eq!(d.master.as_deref(), Some("s-0"));
    // Not once it goes away, answers as a replica, or the Sentinels name another pod.
    let mut gone = member("s-0", Some(Err("timed out".into())), None);
    gone.deleting = true;
    assert_eq!(decide(&[gone], Some("s-0")).master, None);
    assert_eq!(decide(&[member("s-0", replica_of(H1, false, 0), None)], Some("s-0")).master, None);
    let named_other = [
        member("c-0", Some(Err("timed out".into())), names(H1)),
        member("c-1", replica_of(H0, false, 100), names(H1)),
    ];
    assert_eq!(decide(&named_other, Some("c-0")).master, None);
}

#[test]
fn a_pod_going_away_neither_votes_nor_is_voted_for() {
    // A roll deleted c-0, the old master, right after switching over to c-1: c-0's own Sentinel
    // and c-1's have not heard of it yet; c-2's has.
    let mut going = member("c-0", replica_of(H1, true, 500), names(H0));
    going.deleting = true;
    let members =
        [going, member("c-1", master(500), names(H0)), member("c-2", replica_of(H1, true, 500), names(H1))];
    let d = decide(&members, Some("c-1"));
    assert_eq!(d.master.as_deref(), Some("c-1"));
    assert_eq!(d.votes, (1, 2), "c-0's Sentinel does not count; c-1's names a pod going away");
    assert_eq!(roles(&d), [None, Some("master"), Some("replica")]);
}

#[test]
fn votes_left_after_dropping_a_deleting_pod_make_no_new_master_from_a_minority() {
    // c-0, the master, is being deleted; two Sentinels still name it, one stale one names c-3,
    // a former master not yet turned into a replica. c-3 is not made the master on 1 vote of 3.
    let mut going = member("c-0", master(500), names(H0));
    going.deleting = true;
    let members = [
        going,
        member("c-1", replica_of(H0, false, 500), names(H0)),
        member("c-2", replica_of(H0, false, 500), names(H0)),
        member("c-3", master(400), names("c-3.c-headless")),
    ];
    let d = decide(&members, Some("c-0"));
    assert_eq!((d.named.as_deref(), d.master.as_deref()), (None, None));
    assert_eq!(roles(&d), [None, None, None, None]);
}
