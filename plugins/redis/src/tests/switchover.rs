//! The switchover the annotation asks for, step by step.

use std::collections::BTreeMap;

use crate::switchover::{
    answered_ok, begin, exec, may_begin, step, Request, Server, State, View, PAUSE_MS, PRIORITY_SEEN_MS,
    RETRY_AFTER_FAILED_MS, TIMEOUT_MS,
};

fn pods() -> Vec<String> {
    ["c-0", "c-1", "c-2"].iter().map(|s| s.to_string()).collect()
}

fn replicas() -> Vec<String> {
    ["c-1", "c-2"].iter().map(|s| s.to_string()).collect()
}

fn ok(ids: &[String]) -> BTreeMap<String, Result<(), String>> {
    ids.iter().map(|i| (i.clone(), Ok(()))).collect()
}

fn id(r: &Request) -> String {
    match r {
        Request::Priority { id, .. }
        | Request::Pause { id, .. }
        | Request::Offset { id, .. }
        | Request::Failover { id, .. }
        | Request::Follow { id, .. }
        | Request::Unpause { id, .. } => id.clone(),
    }
}

fn ids(requests: &[Request]) -> Vec<String> {
    requests.iter().map(id).collect()
}

/// `(pod, answers as a master, offset, polled at)` for each pod.
fn servers(list: &[(&str, bool, u64, u64)]) -> BTreeMap<String, Server> {
    list.iter()
        .map(|(p, master, offset, at)| {
            (p.to_string(), Server { master: *master, offset: *offset, asked_at_ms: *at })
        })
        .collect()
}

/// Runs the phases up to the pause being answered at `paused_at`; the state then.
fn paused(
    pods: &[String],
    replicas: &[String],
    paused_at: u64,
) -> (State, BTreeMap<String, Result<(), String>>) {
    let none = BTreeMap::new();
    let view = View { master: Some("c-0"), replicas, pods, servers: &none, agreed: true };
    let s = step(&State::default(), Some("c-2"), &view, &BTreeMap::new(), 1_000);
    let mut answers = ok(&ids(&s.requests));
    let s = step(&s.state, Some("c-2"), &view, &answers, 2_000);
    let s = step(&s.state, Some("c-2"), &view, &answers, 2_000 + PRIORITY_SEEN_MS);
    assert_eq!(s.state.phase, "Pausing");
    assert!(s
        .requests
        .contains(&Request::Pause { pod: "c-0".into(), id: "switchover-pause-c-0-1000".into() }));
    answers.extend(ok(&ids(&s.requests)));
    let s = step(&s.state, Some("c-2"), &view, &answers, paused_at);
    assert_eq!((s.state.phase.as_str(), s.state.paused_at_ms), ("Pausing", paused_at));
    // Both servers are asked for their offsets at once, not at the next poll.
    for pod in ["c-0", "c-2"] {
        let id = format!("switchover-offset-{pod}-1000-{paused_at}");
        assert!(s.requests.contains(&Request::Offset { pod: pod.into(), id }), "{:?}", s.requests);
    }
    (s.state, answers)
}

#[test]
fn prefers_the_target_then_asks_a_sentinel_then_done_when_it_is_the_master() {
    let (pods, replicas) = (pods(), replicas());
    let none = BTreeMap::new();
    let view = View { master: Some("c-0"), replicas: &replicas, pods: &pods, servers: &none, agreed: true };
    let s = step(&State::default(), Some("c-2"), &view, &BTreeMap::new(), 1_000);
    assert_eq!((s.state.phase.as_str(), s.state.from.as_str()), ("Preparing", "c-0"));
    assert_eq!(s.events[0].reason, "SwitchoverPreparing");
    let priorities: Vec<(&str, u32)> = s
        .requests
        .iter()
        .filter_map(|r| match r {
            Request::Priority { pod, priority, .. } => Some((pod.as_str(), *priority)),
            _ => None,
        })
        .collect();
    assert_eq!(priorities, [("c-0", 100), ("c-1", 100), ("c-2", 1)]);
    // Answered: writes are held back only once Sentinel can have read the new priorities.
    let answers = ok(&ids(&s.requests));
    let s2 = step(&s.state, Some("c-2"), &view, &answers, 2_000);
    assert_eq!((s2.state.phase.as_str(), s2.state.prepared_at_ms), ("Preparing", 2_000));
    assert!(!s2.requests.iter().any(|r| matches!(r, Request::Pause { .. } | Request::Failover { .. })));

    let (st, answers) = paused(&pods, &replicas, 14_000);
    // No Sentinel is asked before the target has what the paused master wrote, read from
    // polls started after the pause.
    for (list, why) in [
        (vec![("c-0", true, 500, 13_000), ("c-2", false, 500, 13_500)], "polls from before the pause"),
        (vec![("c-0", true, 500, 14_100), ("c-2", false, 480, 14_200)], "the target is behind"),
        (vec![("c-0", true, 500, 14_100)], "no answer from the target"),
    ] {
        let sv = servers(&list);
        let v = View { master: Some("c-0"), replicas: &replicas, pods: &pods, servers: &sv, agreed: true };
        let s = step(&st, Some("c-2"), &v, &answers, 15_000);
        assert_eq!(s.state.phase, "Pausing", "{why}");
        assert!(!s.requests.iter().any(|r| matches!(r, Request::Failover { .. })), "{why}");
    }
    let sv = servers(&[("c-0", true, 500, 14_100), ("c-2", false, 500, 14_200)]);
    let v = View { master: Some("c-0"), replicas: &replicas, pods: &pods, servers: &sv, agreed: true };
    let s3 = step(&st, Some("c-2"), &v, &answers, 15_000);
    assert_eq!(s3.state.phase, "FailingOver");
    assert!(s3
        .requests
        .contains(&Request::Failover { pod: "c-2".into(), id: "switchover-failover-c-2-1000".into() }));

    // The Sentinels name c-2 and it answers as the master, but c-0 still answers as one: it
    // is made c-2's replica and the switchover is not done.
    let sv = servers(&[("c-0", true, 500, 16_000), ("c-2", true, 520, 16_000)]);
    let after =
        View { master: Some("c-2"), replicas: &replicas[..1], pods: &pods, servers: &sv, agreed: true };
    let s4 = step(&s3.state, Some("c-2"), &after, &answers, 16_500);
    assert_eq!(s4.state.phase, "FailingOver");
    let follow =
        Request::Follow { pod: "c-0".into(), of: "c-2".into(), id: "switchover-follow-c-0-1000".into() };
    assert_eq!(s4.requests, [follow]);
    assert!(s4.events.is_empty());
    // c-0 answers as a replica, but a Sentinel still names c-0 (the plugin named c-2 as
    // soon as the failover's leader saw it promoted): not done yet.
    let sv = servers(&[("c-0", false, 520, 18_000), ("c-2", true, 520, 18_000)]);
    let moving =
        View { master: Some("c-2"), replicas: &replicas[..1], pods: &pods, servers: &sv, agreed: false };
    let s = step(&s4.state, Some("c-2"), &moving, &answers, 19_000);
    assert_eq!(s.state.phase, "FailingOver");
    assert!(s.state.message.contains("the Sentinels move to it"), "{}", s.state.message);
    assert!(s.events.is_empty() && s.requests.is_empty());
    // Every Sentinel names c-2: done, and the priorities go back.
    let done =
        View { master: Some("c-2"), replicas: &replicas[..1], pods: &pods, servers: &sv, agreed: true };
    let s5 = step(&s4.state, Some("c-2"), &done, &answers, 20_000);
    assert_eq!(s5.state.phase, "Done");
    assert!(s5.state.message.contains("c-0 its replica (19000 ms"), "{}", s5.state.message);
    assert!(s5.requests.contains(&Request::Priority {
        pod: "c-2".into(),
        priority: 100,
        id: "switchover-priority-c-2-1000-100".into()
    }));
    assert!(!s5.requests.iter().any(|r| matches!(r, Request::Unpause { .. })));
    // Nothing more while the annotation stays, but the default priorities asked again (the
    // same ids, sent once by the host) in case the step that ended it was not sent.
    let s6 = step(&s5.state, Some("c-2"), &done, &answers, 30_000);
    assert_eq!((s6.state.phase.as_str(), s6.events.len()), ("Done", 0));
    let restore: Vec<&Request> =
        s5.requests.iter().filter(|r| matches!(r, Request::Priority { .. })).collect();
    assert_eq!(s6.requests.iter().collect::<Vec<_>>(), restore);
}

#[test]
fn an_old_master_that_does_not_answer_is_not_taken_for_a_replica() {
    let (pods, replicas) = (pods(), replicas());
    let st = State {
        asked: "c-2".into(),
        to: "c-2".into(),
        from: "c-0".into(),
        phase: "FailingOver".into(),
        started_at_ms: 1_000,
        paused_at_ms: 14_000,
        ..State::default()
    };
    let sv = servers(&[("c-2", true, 520, 18_000)]);
    let v = View { master: Some("c-2"), replicas: &replicas, pods: &pods, servers: &sv, agreed: true };
    assert_eq!(step(&st, Some("c-2"), &v, &BTreeMap::new(), 20_000).state.phase, "FailingOver");
    let late = step(&st, Some("c-2"), &v, &BTreeMap::new(), TIMEOUT_MS + 2_000);
    assert_eq!(late.state.phase, "Failed");
    assert!(late.state.message.contains("did not answer as its replica"), "{}", late.state.message);
    // The old master is not let write again: its pause is not lifted.
    assert!(!late.requests.iter().any(|r| matches!(r, Request::Unpause { .. })));
    // Its pod gone: it takes no write.
    let two = ["c-1".to_string(), "c-2".to_string()];
    let gone = View { master: Some("c-2"), replicas: &replicas, pods: &two, servers: &sv, agreed: true };
    assert_eq!(step(&st, Some("c-2"), &gone, &BTreeMap::new(), 20_000).state.phase, "Done");
}

#[test]
fn a_target_that_does_not_catch_up_fails_and_the_pause_is_lifted() {
    let (pods, replicas) = (pods(), replicas());
    let (st, answers) = paused(&pods, &replicas, 14_000);
    let sv = servers(&[("c-0", true, 500, 14_100), ("c-2", false, 10, 14_200)]);
    let v = View { master: Some("c-0"), replicas: &replicas, pods: &pods, servers: &sv, agreed: true };
    let s = step(&st, Some("c-2"), &v, &answers, 14_000 + PAUSE_MS - 1);
    assert_eq!(s.state.phase, "Failed");
    assert!(s.state.message.contains("did not catch up"), "{}", s.state.message);
    assert!(s
        .requests
        .contains(&Request::Unpause { pod: "c-0".into(), id: "switchover-unpause-c-0-1000".into() }));
}

#[test]
fn refused_with_the_reason() {
    let (pods, replicas) = (pods(), replicas());
    let none = BTreeMap::new();
    let view =
        View { master: Some("c-0"), replicas: &replicas[..1], pods: &pods, servers: &none, agreed: true };
    for (to, why) in [("other-0", "not a pod of this cluster"), ("c-2", "not a replica linked to the master")]
    {
        let s = step(&State::default(), Some(to), &view, &BTreeMap::new(), 0);
        assert_eq!(s.state.phase, "Refused", "{to}");
        assert!(s.state.message.contains(why), "{}", s.state.message);
        assert!(s.requests.is_empty());
    }
    let s = step(&State::default(), Some("c-0"), &view, &BTreeMap::new(), 0);
    assert_eq!(s.state.phase, "Done", "the master already");
    let nobody = View { master: None, replicas: &replicas, pods: &pods, servers: &none, agreed: true };
    assert_eq!(step(&State::default(), Some("c-1"), &nobody, &BTreeMap::new(), 0).state.phase, "Refused");
}

#[test]
fn fails_on_an_error_or_a_timeout_and_restores_priorities() {
    let (pods, replicas) = (pods(), replicas());
    let (st, mut answers) = paused(&pods, &replicas, 14_000);
    let sv = servers(&[("c-0", true, 500, 14_100), ("c-2", false, 500, 14_200)]);
    let view = View { master: Some("c-0"), replicas: &replicas, pods: &pods, servers: &sv, agreed: true };
    let s = step(&st, Some("c-2"), &view, &answers, 15_000);
    assert_eq!(s.state.phase, "FailingOver");
    answers.insert(
        "switchover-failover-c-2-1000".into(),
        Err("NOGOODSLAVE No suitable replica to promote".into()),
    );
    let f = step(&s.state, Some("c-2"), &view, &answers, 16_000);
    assert_eq!(f.state.phase, "Failed");
    assert!(f.state.message.contains("NOGOODSLAVE"));
    let priorities = f.requests.iter().filter(|r| matches!(r, Request::Priority { .. })).count();
    assert_eq!(priorities, 3, "every pod back to priority 100");
    assert!(f.requests.iter().any(|r| matches!(r, Request::Unpause { .. })), "writes go on on c-0");
    let t = step(&s.state, Some("c-2"), &view, &ok(&[]), TIMEOUT_MS + 2_000);
    assert_eq!(t.state.phase, "Failed");
    // Asked and never answered: Sentinel may be failing over, so c-0 is not let write again.
    assert!(!t.requests.iter().any(|r| matches!(r, Request::Unpause { .. })), "{:?}", t.requests);
}

#[test]
fn requests_run_redis_cli_in_the_pod_without_a_password() {
    let follow =
        exec(&Request::Follow { pod: "c-0".into(), of: "c-2".into(), id: "f".into() }, "c-headless", 5_000);
    assert_eq!(follow.command, ["redis-cli", "-h", "127.0.0.1", "--no-auth-warning", "-p", "6379"]);
    assert_eq!(
        follow.stdin.as_deref(),
        Some("REPLICAOF c-2.c-headless 6379\nCLIENT KILL TYPE normal\nCLIENT UNPAUSE\n")
    );
    let pause = exec(&Request::Pause { pod: "c-0".into(), id: "p".into() }, "c-headless", 5_000);
    assert_eq!(pause.command[6..], ["client", "pause", &PAUSE_MS.to_string(), "write"]);
    let offset = exec(&Request::Offset { pod: "c-2".into(), id: "o".into() }, "c-headless", 5_000);
    assert_eq!((offset.pod.as_str(), &offset.command[6..]), ("c-2", &["info".to_string()][..]));
    let failover = exec(&Request::Failover { pod: "c-2".into(), id: "x".into() }, "c-headless", 5_000);
    assert_eq!(failover.command[4..], ["-p", "26379", "sentinel", "failover", "primary"]);
    assert!(answered_ok("OK\n3\nOK\n"));
    assert!(!answered_ok("OK\nERR unknown command\n"));
    assert!(!answered_ok(""));
}

#[test]
fn a_switchover_the_roll_begins_keeps_what_the_annotation_asked_and_is_not_retried_at_once() {
    let (pods, replicas, none) = (pods(), replicas(), BTreeMap::new());
    let view = View { master: Some("c-0"), replicas: &replicas, pods: &pods, servers: &none, agreed: true };
    // The annotation asked for c-1 earlier and that is done; the roll now begins one to c-2.
    let earlier = State { asked: "c-1".into(), to: "c-1".into(), phase: "Done".into(), ..State::default() };
    assert!(may_begin(&earlier, 5_000));
    let (st, event) = begin(&earlier, "c-2", "c-0 is the last pod on an old revision", &view, 5_000);
    assert_eq!((st.asked.as_str(), st.to.as_str(), st.from.as_str()), ("c-1", "c-2", "c-0"));
    assert_eq!(st.phase, "Preparing");
    assert!(event.message.contains("(c-0 is the last pod on an old revision)"), "{}", event.message);
    // The annotation still saying c-1 starts nothing new: the roll's switchover goes on.
    let s = step(&st, Some("c-1"), &view, &BTreeMap::new(), 6_000);
    assert_eq!((s.state.to.as_str(), s.state.phase.as_str()), ("c-2", "Preparing"));
    assert!(!may_begin(&s.state, 6_000), "one at a time");
    // A failed one is not begun again until a while after it.
    let failed = State { phase: "Failed".into(), started_at_ms: 5_000, ..st };
    assert!(!may_begin(&failed, 5_000 + TIMEOUT_MS + 1_000));
    assert!(may_begin(&failed, 5_000 + TIMEOUT_MS + RETRY_AFTER_FAILED_MS));
}
