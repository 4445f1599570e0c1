//! The decisions of high availability (`ha::decide`), fed the way the host would: each call
//! gets the state the previous one wrote, the pods and their servers' answers, and the clock.
#![allow(clippy::expect_used)]

use serde_json::{json, Value};
use stateward_sdk::testkit as tk;
use stateward_sdk::{Action, EventType, Service};

use crate::ha::{self, Answers, Member, Request, Settings, State, Stats, PRIMARY_CONDITION};
use crate::Postgres;

const T0: u64 = 1_700_000_000_000;

fn settings() -> Settings {
    Settings {
        failover_delay_ms: 5_000,
        replicas: 3,
        max_switchover_lag_bytes: 16 << 20,
        revision_known: true,
    }
}

fn stats(in_recovery: bool, received: u64, replayed: u64, timeline: u32, streaming: bool) -> Stats {
    Stats {
        in_recovery,
        connections: 1,
        max_connections: 100,
        received,
        replayed,
        timeline,
        streaming,
        read_only: false,
        system_id: SYSTEM.into(),
        standbys: Vec::new(),
    }
}

/// The database system identifier of the cluster's `initdb`.
const SYSTEM: &str = "7300000000000000001";

/// A cluster's state whose primary is on `timeline`.
fn on_timeline(timeline: u32) -> State {
    State { timeline, system_id: SYSTEM.into(), ..State::default() }
}

fn primary(pod: &str, lsn: u64) -> Member {
    member(pod, Some(Ok(stats(false, lsn, lsn, 1, false))))
}

fn standby(pod: &str, received: u64, replayed: u64) -> Member {
    member(pod, Some(Ok(stats(true, received, replayed, 1, true))))
}

fn member(pod: &str, answer: Option<Result<Stats, String>>) -> Member {
    Member {
        pod: pod.into(),
        uid: format!("uid-{pod}"),
        ready: true,
        running: true,
        deleting: false,
        restarts: 0,
        outdated: false,
        answer,
    }
}

/// A cluster whose first primary pg-0 was confirmed.
fn confirmed() -> State {
    let d = decide(&State { target: "pg-0".into(), ..State::default() }, &healthy(), None, T0);
    assert_eq!(d.state.current, "pg-0");
    d.state
}

fn healthy() -> Vec<Member> {
    vec![primary("pg-0", 1000), standby("pg-1", 1000, 900), standby("pg-2", 990, 990)]
}

fn decide(st: &State, members: &[Member], switchover: Option<&str>, now: u64) -> ha::Decision {
    ha::decide(st, members, &settings(), switchover, &Answers::default(), now)
}

fn promotions(d: &ha::Decision) -> Vec<String> {
    d.requests
        .iter()
        .filter_map(|r| match r {
            Request::Promote { pod, .. } => Some(pod.clone()),
            Request::Stop { .. } => None,
        })
        .collect()
}

fn stops(d: &ha::Decision) -> Vec<(String, &'static str)> {
    d.requests
        .iter()
        .filter_map(|r| match r {
            Request::Stop { pod, why, .. } => Some((pod.clone(), *why)),
            Request::Promote { .. } => None,
        })
        .collect()
}

fn role<'a>(d: &'a ha::Decision, pod: &str) -> Option<&'a str> {
    d.roles.iter().find(|(p, _)| p == pod).and_then(|(_, r)| *r)
}

fn reason(d: &ha::Decision) -> String {
    d.condition.as_ref().map(|c| c.reason.clone()).unwrap_or_default()
}

// --- who to promote -------------------------------------------------------------------------

#[test]
fn the_most_advanced_standby_by_received_lsn_is_promoted_then_lowest_lag_then_name() {
    let m = vec![standby("pg-1", 500, 400), standby("pg-2", 600, 100), standby("pg-3", 550, 550)];
    assert_eq!(
        ha::best_candidate(&m, &on_timeline(1), "pg-0", 5).map(|c| c.pod.as_str()),
        Some("pg-2"),
        "received first"
    );
    let tie = vec![standby("pg-1", 600, 400), standby("pg-2", 600, 500), standby("pg-3", 600, 500)];
    assert_eq!(
        ha::best_candidate(&tie, &on_timeline(1), "pg-0", 5).map(|c| c.pod.as_str()),
        Some("pg-2"),
        "then the least left to replay, then the lowest name"
    );
}

#[test]
fn a_standby_on_an_older_timeline_is_promoted_only_when_no_consistent_one_is_left() {
    // pg-1 holds more WAL, but of timeline 1 (a former primary's); the primary was on timeline 2.
    let mut old = standby("pg-1", 900, 900);
    if let Some(Ok(s)) = &mut old.answer {
        s.timeline = 1;
    }
    let mut current = standby("pg-2", 800, 800);
    if let Some(Ok(s)) = &mut current.answer {
        s.timeline = 2;
    }
    let m = vec![old.clone(), current];
    assert_eq!(ha::best_candidate(&m, &on_timeline(2), "pg-0", 3).map(|c| c.pod.as_str()), Some("pg-2"));
    assert_eq!(ha::best_candidate(&[old], &on_timeline(2), "pg-0", 3).map(|c| c.pod.as_str()), Some("pg-1"));
}

#[test]
fn never_the_failed_primary_a_primary_a_silent_pod_or_one_being_scaled_away() {
    let m = vec![
        standby("pg-0", 9999, 9999),
        primary("pg-1", 9999),
        member("pg-2", Some(Err("timeout".into()))),
        standby("pg-3", 9999, 9999),
        standby("pg-4", 10, 10),
    ];
    assert_eq!(ha::best_candidate(&m, &on_timeline(1), "pg-0", 3).map(|c| c.pod.as_str()), None);
    assert_eq!(ha::best_candidate(&m, &on_timeline(1), "pg-0", 4).map(|c| c.pod.as_str()), Some("pg-3"));
}

// --- when to fail over ----------------------------------------------------------------------

#[test]
fn a_healthy_primary_is_labelled_and_nothing_is_requested() {
    let st = confirmed();
    let d = decide(&st, &healthy(), None, T0 + 1000);
    assert!(d.requests.is_empty(), "{:?}", d.requests);
    assert_eq!(role(&d, "pg-0"), Some("primary"));
    assert_eq!(role(&d, "pg-1"), Some("replica"));
    assert_eq!(role(&d, "pg-2"), Some("replica"));
    assert_eq!(reason(&d), "Primary");
    assert_eq!(d.state.failing_since_ms, 0);
}

#[test]
fn a_deleted_primary_fails_over_after_the_delay_to_the_most_advanced_standby() {
    let st = confirmed();
    let gone = vec![standby("pg-1", 1000, 900), standby("pg-2", 990, 990)];
    let d = decide(&st, &gone, None, T0 + 1000);
    assert_eq!(d.state.target, "pg-0", "not before the delay");
    assert_eq!(d.state.failing_since_ms, T0 + 1000);
    assert_eq!(d.wake_in_ms, Some(5_000), "woken when the delay runs out");
    assert_eq!(reason(&d), "PrimaryUnavailable");
    let d = decide(&d.state, &gone, None, T0 + 5_999);
    assert_eq!(d.state.target, "pg-0");
    assert_eq!(d.wake_in_ms, Some(1));
    let d = decide(&d.state, &gone, None, T0 + 6_000);
    assert_eq!(d.state.target, "pg-1", "the most WAL received");
    assert_eq!(d.state.epoch, 1);
    assert!(d.state.promoting);
    assert_eq!(reason(&d), "FailingOver");
    let e = d.events.iter().find(|e| e.reason == "FailingOver").unwrap();
    assert_eq!(e.type_, EventType::Warning);
    assert!(e.message.contains("its pod is gone") && e.message.contains("promoting pg-1"), "{}", e.message);
    assert!(promotions(&d).is_empty(), "the decision is written to status before anything is sent");
    assert_eq!(role(&d, "pg-1"), Some("replica"), "not primary before it answers as one");
    // The next reconcile (the decision is in status now) promotes it, once per epoch.
    let next = decide(&d.state, &gone, None, T0 + 6_100);
    assert_eq!(promotions(&next), ["pg-1"]);
    let Request::Promote { id, .. } = &next.requests[0] else { unreachable!() };
    assert_eq!(id, "promote-pg-1-uid-pg-1-r0-e1");
    // It answers as a primary: confirmed, labelled; the promotion is no longer asked.
    let promoted = vec![primary("pg-1", 1100), standby("pg-2", 990, 990)];
    let done = decide(&next.state, &promoted, None, T0 + 7_000);
    assert_eq!((done.state.current.as_str(), done.state.current_uid.as_str()), ("pg-1", "uid-pg-1"));
    assert!(!done.state.promoting);
    assert!(done.requests.is_empty());
    assert_eq!(role(&done, "pg-1"), Some("primary"));
    assert_eq!(reason(&done), "Primary");
}

#[test]
fn a_primary_whose_requests_fail_while_its_pod_stays_ready_is_not_failed_over() {
    let st = confirmed();
    let mut busy = healthy();
    busy[0].answer = Some(Err("no answer within the timeout of 5000 ms".into()));
    let mut d = decide(&st, &busy, None, T0);
    for t in 1..30 {
        d = decide(&d.state, &busy, None, T0 + t * 1000);
    }
    assert_eq!(d.state.target, "pg-0");
    assert_eq!(d.state.failing_since_ms, 0);
    assert_eq!(role(&d, "pg-0"), Some("primary"), "readiness, not the plugin, takes it out of -rw");
    // Not Ready as well: now it is lost.
    busy[0].ready = false;
    let d = decide(&d.state, &busy, None, T0 + 40_000);
    assert_eq!(d.state.failing_since_ms, T0 + 40_000);
    let d = decide(&d.state, &busy, None, T0 + 45_000);
    assert_eq!(d.state.target, "pg-1");
}

#[test]
fn a_three_second_blip_does_not_fail_over() {
    let st = confirmed();
    let mut down = healthy();
    down[0].running = false; // the container restarts in place
    let mut d = decide(&st, &down, None, T0);
    for t in [1000, 2000, 3000] {
        d = decide(&d.state, &down, None, T0 + t);
        assert_eq!(d.state.target, "pg-0");
    }
    assert_eq!(role(&d, "pg-0"), None, "out of -rw while not running");
    let d = decide(&d.state, &healthy(), None, T0 + 3_500);
    assert_eq!(d.state.failing_since_ms, 0, "the clock starts again");
    assert_eq!(role(&d, "pg-0"), Some("primary"));
    // A later blip has the whole delay again.
    let d = decide(&d.state, &down, None, T0 + 10_000);
    let d = decide(&d.state, &down, None, T0 + 14_000);
    assert_eq!(d.state.target, "pg-0");
    assert!(d.events.iter().all(|e| e.reason != "FailingOver"));
}

#[test]
fn the_delay_comes_from_the_spec() {
    let mut cr = tk::cr(
        "PostgresCluster",
        "pg",
        json!({ "version": "15", "replicas": 3, "storage": { "size": "1Gi" } }),
    );
    assert_eq!(crate::spec::failover_delay_s(&cr), crate::spec::DEFAULT_FAILOVER_DELAY_S);
    cr["spec"]["failoverDelay"] = json!(30);
    assert_eq!(crate::spec::failover_delay_s(&cr), 30);
    cr["spec"]["failoverDelay"] = json!(-1);
    let errs = Postgres::validate(&cr.to_string(), None);
    assert_eq!(errs.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(), ["spec.failoverDelay"]);
}

#[test]
fn nothing_fails_over_before_the_first_primary_answered() {
    let st = State { target: "pg-0".into(), ..State::default() };
    let d = decide(&st, &[standby("pg-1", 1, 1)], None, T0);
    let d = decide(&d.state, &[standby("pg-1", 1, 1)], None, T0 + 60_000);
    assert_eq!(d.state.target, "pg-0");
    assert_eq!(reason(&d), "Bootstrapping");
    assert!(d.requests.is_empty());
}

// --- fencing --------------------------------------------------------------------------------

#[test]
fn a_replaced_primary_pod_starts_fenced_and_is_restarted_to_rewind_after_the_failover() {
    let st = confirmed();
    // pg-0 was deleted and made again: another uid, running as a standby of its own WAL.
    let mut again = standby("pg-0", 1200, 1200);
    again.uid = "uid-pg-0-new".into();
    if let Some(Ok(s)) = &mut again.answer {
        s.streaming = false;
    }
    let members = vec![again.clone(), standby("pg-1", 1000, 900), standby("pg-2", 990, 990)];
    let d = decide(&st, &members, None, T0 + 1000);
    assert_eq!(role(&d, "pg-0"), None, "a new pod is never labelled primary before it is confirmed");
    let d = decide(&d.state, &members, None, T0 + 6_000);
    assert_eq!(d.state.target, "pg-1", "the old primary is never the candidate, however much WAL it has");
    assert_eq!(d.state.fenced, [again.incarnation()]);
    let d = decide(&d.state, &members, None, T0 + 6_100);
    assert_eq!(promotions(&d), ["pg-1"]);
    assert!(stops(&d).is_empty(), "no rejoin before the new primary answers");
    // pg-1 answers as the primary; pg-0 (still that incarnation) is restarted once to rewind.
    let mut after = vec![again.clone(), primary("pg-1", 1300), standby("pg-2", 1300, 1300)];
    if let Some(Ok(s)) = &mut after[1].answer {
        s.timeline = 2;
    }
    let d = decide(&d.state, &after, None, T0 + 7_000);
    assert_eq!(stops(&d), [("pg-0".to_string(), "rejoin")]);
    assert_eq!(d.state.timeline, 2);
    // Even streaming, a fenced incarnation is not a replica behind -ro.
    after[0] = standby("pg-0", 1300, 1300);
    after[0].uid = "uid-pg-0-new".into();
    let d = decide(&d.state, &after, None, T0 + 7_500);
    assert_eq!(role(&d, "pg-0"), None);
    // Restarted (rewound): another incarnation, the fence is gone, it is a replica again.
    after[0].restarts = 1;
    let d = decide(&d.state, &after, None, T0 + 20_000);
    assert!(d.state.fenced.is_empty());
    assert!(stops(&d).is_empty());
    assert_eq!(role(&d, "pg-0"), Some("replica"));
}

#[test]
fn any_other_server_answering_as_a_primary_is_stopped_and_never_labelled() {
    let st = confirmed();
    let mut members = healthy();
    members[2] = primary("pg-2", 5);
    let d = decide(&st, &members, None, T0 + 1000);
    assert_eq!(stops(&d), [("pg-2".to_string(), "demote")]);
    assert_eq!(role(&d, "pg-2"), None);
    assert_eq!(role(&d, "pg-0"), Some("primary"), "one writer behind -rw");
    let Request::Stop { id, .. } = &d.requests[0] else { unreachable!() };
    assert_eq!(id, "demote-pg-2-uid-pg-2-r0-e0", "once per incarnation and promotion");
}

#[test]
fn the_old_primary_leaves_rw_at_the_decision_and_comes_back_only_as_a_standby() {
    let st = confirmed();
    let mut members = healthy();
    members[0].ready = false;
    members[0].answer = Some(Err("connection refused".into()));
    let d = decide(&st, &members, None, T0);
    let d = decide(&d.state, &members, None, T0 + 5_000);
    assert_eq!(d.state.target, "pg-1");
    assert_eq!(role(&d, "pg-0"), None, "out of -rw at once");
    // It wakes up, still a primary: it is stopped (and restarts as a standby of pg-1).
    members[0] = primary("pg-0", 1000);
    let d = decide(&d.state, &members, None, T0 + 5_100);
    assert_eq!(stops(&d), [("pg-0".to_string(), "demote")]);
    assert_eq!(promotions(&d), ["pg-1"]);
    assert_eq!(role(&d, "pg-0"), None);
}

#[test]
fn with_no_standby_a_primary_that_restarted_fenced_is_promoted_again() {
    let st = confirmed();
    let mut again = standby("pg-0", 1000, 1000);
    again.uid = "uid-pg-0-new".into();
    let d = decide(&st, std::slice::from_ref(&again), None, T0);
    let d = decide(&d.state, std::slice::from_ref(&again), None, T0 + 5_000);
    assert_eq!(d.state.target, "pg-0");
    assert!(d.events.iter().any(|e| e.reason == "PromotingAgain"));
    let d = decide(&d.state, std::slice::from_ref(&again), None, T0 + 5_100);
    assert_eq!(promotions(&d), ["pg-0"]);
}

// --- switchover -----------------------------------------------------------------------------

#[test]
fn a_switchover_stops_the_primary_cleanly_before_promoting_the_target() {
    let st = confirmed();
    let d = decide(&st, &healthy(), Some("pg-2"), T0);
    assert_eq!(d.state.switchover.phase, "Demoting");
    assert_eq!(d.state.target, "pg-2");
    assert_eq!(role(&d, "pg-0"), None, "no more writes through -rw");
    assert!(d.requests.is_empty(), "decided first");
    assert_eq!(reason(&d), "SwitchingOver");
    // Next: stop the old primary; the target waits.
    let d = decide(&d.state, &healthy(), Some("pg-2"), T0 + 100);
    assert_eq!(stops(&d), [("pg-0".to_string(), "switchover")]);
    assert!(promotions(&d).is_empty());
    // The stop answered (the server is down): promote.
    let Request::Stop { id, .. } = &d.requests[0] else { unreachable!() };
    let answers = Answers { answered: vec![id.clone()] };
    let d = ha::decide(&d.state, &healthy(), &settings(), Some("pg-2"), &answers, T0 + 1_000);
    assert_eq!(promotions(&d), ["pg-2"]);
    assert_eq!(d.state.switchover.phase, "Promoting");
    assert_eq!(role(&d, "pg-2"), Some("primary"), "-rw moves with the promotion, the old primary stopped");
    assert_eq!(role(&d, "pg-0"), None);
    let after = vec![standby("pg-1", 1000, 1000), primary("pg-2", 1100)];
    let d = decide(&d.state, &after, Some("pg-2"), T0 + 2_000);
    assert_eq!(d.state.switchover.phase, "Done");
    assert_eq!(d.state.current, "pg-2");
    assert_eq!(role(&d, "pg-2"), Some("primary"));
    assert!(d.events.iter().any(|e| e.reason == "SwitchoverDone"));
    // The annotation stays: nothing more happens. Removed: the record is cleared.
    let d = decide(&d.state, &after, Some("pg-2"), T0 + 3_000);
    assert!(d.requests.is_empty() && d.events.is_empty());
    let d = decide(&d.state, &after, None, T0 + 4_000);
    assert_eq!(d.state.switchover, ha::Switchover::default());
}

#[test]
fn a_switchover_to_a_missing_silent_or_lagging_instance_is_refused_with_the_reason() {
    let st = confirmed();
    let refused = |members: &[Member], to: &str| {
        let d = decide(&st, members, Some(to), T0);
        assert_eq!(d.state.target, "pg-0", "{to}: nothing moves");
        assert_eq!(d.state.switchover.phase, "Refused");
        let e = d.events.iter().find(|e| e.reason == "SwitchoverRefused").expect("a Warning");
        assert_eq!(e.type_, EventType::Warning);
        // Refused once: the same annotation does not repeat the Event.
        let again = decide(&d.state, members, Some(to), T0 + 1000);
        assert!(again.events.is_empty());
        d.state.switchover.message
    };
    assert!(refused(&healthy(), "pg-7").contains("not an instance"));
    let mut m = healthy();
    if let Some(Ok(s)) = &mut m[1].answer {
        s.streaming = false;
    }
    assert!(refused(&m, "pg-1").contains("not a streaming standby"));
    let mut m = healthy();
    m[1] = standby("pg-1", 10, 10);
    m[0] = primary("pg-0", 100 << 20);
    assert!(refused(&m, "pg-1").contains("bytes behind"));
    assert_eq!(
        decide(&st, &healthy(), Some("pg-0"), T0).state.switchover.phase,
        "Done",
        "already the primary"
    );
}

// --- through reconcile ----------------------------------------------------------------------

fn pod(name: &str, uid: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "namespace": "db", "uid": uid, "labels": { "stateward.dev/instance": "pg" } },
        "status": {
            "conditions": [{ "type": "Ready", "status": "True" }],
            "containerStatuses": [{ "name": "postgres", "state": { "running": {} }, "restartCount": 0 }],
        },
    })
}

#[test]
fn the_plan_publishes_the_topology_before_the_pods_and_labels_the_roles() {
    let cr = tk::cr(
        "PostgresCluster",
        "pg",
        json!({ "version": "15", "replicas": 2, "storage": { "size": "1Gi" } }),
    );
    let children = [pod("pg-0", "aaaaaaaa-1"), pod("pg-1", "bbbbbbbb-1")];
    let mut observed = tk::observed(&cr, &children);
    observed.responses = vec![
        stateward_sdk::Response {
            id: "stats-pg-0-aaaaaaaa-r0".into(),
            code: Some(0),
            stdout: "f|1|100|0/5|0/5|1||pg-1:streaming:async:0".into(),
            ..Default::default()
        },
        stateward_sdk::Response {
            id: "stats-pg-1-bbbbbbbb-r0".into(),
            code: Some(0),
            stdout: "t|1|100|0/5|0/5|1|streaming|".into(),
            ..Default::default()
        },
    ];
    let p = Postgres::reconcile(observed).unwrap();
    let kinds: Vec<String> =
        tk::applied(&p).iter().map(|o| format!("{}/{}", o["kind"], o["metadata"]["name"])).collect();
    let topo = kinds.iter().position(|k| k.contains("pg-topology")).expect("topology ConfigMap");
    let sts = kinds.iter().position(|k| k.contains("StatefulSet")).unwrap();
    assert!(topo < sts, "the topology exists before any pod reads it: {kinds:?}");
    let cm =
        tk::find_all(&p, "ConfigMap").into_iter().find(|c| c["metadata"]["name"] == "pg-topology").unwrap();
    assert_eq!(cm["data"], json!({ "primary": "pg-0", "primaryUid": "aaaaaaaa-1", "bootstrap": "" }));
    let labels: Vec<(String, Option<String>)> = p
        .actions
        .iter()
        .filter_map(|a| match a {
            // (The fence labels are the sdk's: see its suite.)
            Action::LabelPod(l) if l.labels[0].0 != stateward_sdk::fence::FENCED_LABEL => {
                Some((l.pod.clone(), l.labels[0].1.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(labels, [("pg-0".into(), Some("primary".into())), ("pg-1".into(), Some("replica".into()))]);
    assert_eq!(tk::condition(&p, PRIMARY_CONDITION), ("True".into(), "Primary".into()));
    // The pods read it: env from the topology, the pod's own name and uid.
    let sts = tk::find(&p, "StatefulSet");
    let env = sts["spec"]["template"]["spec"]["containers"][0]["env"].as_array().unwrap().clone();
    let from = |name: &str| env.iter().find(|e| e["name"] == name).cloned().unwrap_or(Value::Null);
    assert_eq!(from("STATEWARD_PRIMARY")["valueFrom"]["configMapKeyRef"]["name"], "pg-topology");
    assert_eq!(from("POD_UID")["valueFrom"]["fieldRef"]["fieldPath"], "metadata.uid");
    assert_eq!(
        from("STATEWARD_REPLICATION_PASSWORD")["valueFrom"]["secretKeyRef"]["key"],
        "replication-password"
    );
}

#[test]
fn a_new_cluster_may_initdb_and_a_confirmed_one_may_not() {
    let cr = tk::cr(
        "PostgresCluster",
        "pg",
        json!({ "version": "15", "replicas": 2, "storage": { "size": "1Gi" } }),
    );
    let p = Postgres::reconcile(tk::observed(&cr, &[])).unwrap();
    let cm =
        tk::find_all(&p, "ConfigMap").into_iter().find(|c| c["metadata"]["name"] == "pg-topology").unwrap();
    assert_eq!(cm["data"], json!({ "primary": "pg-0", "primaryUid": "", "bootstrap": "initdb" }));
    assert_eq!(tk::condition(&p, PRIMARY_CONDITION), ("False".into(), "Bootstrapping".into()));
    let mut cr = cr;
    cr["status"] = Value::Object(confirmed().to_status());
    let p = Postgres::reconcile(tk::observed(&cr, &[])).unwrap();
    let cm =
        tk::find_all(&p, "ConfigMap").into_iter().find(|c| c["metadata"]["name"] == "pg-topology").unwrap();
    assert_eq!(cm["data"]["bootstrap"], "");
    assert_eq!(cm["data"]["primaryUid"], "uid-pg-0");
}

#[test]
fn status_round_trips_the_state() {
    let mut st = confirmed();
    st.fenced = vec!["pg-0@uid-pg-0@1".into()];
    st.switchover = ha::Switchover { to: "pg-1".into(), phase: "Refused".into(), message: "no".into() };
    st.promoting = true;
    let back = State::from_status(Some(&Value::Object(st.to_status())), "pg-0");
    assert_eq!(back, st);
}

#[test]
fn the_replication_settings_the_operator_owns_are_refused_with_their_field_path() {
    let mut cr = tk::cr(
        "PostgresCluster",
        "pg",
        json!({ "version": "15", "replicas": 3, "storage": { "size": "1Gi" } }),
    );
    cr["spec"]["parameters"] = json!({
        "primary_conninfo": "host=elsewhere",
        "primary_slot_name": "mine",
        "synchronous_standby_names": "*",
        "hot_standby": "off",
        "wal_log_hints": "off",
        "recovery_target_timeline": "1",
    });
    let errs = Postgres::validate(&cr.to_string(), None);
    let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "spec.parameters.hot_standby",
            "spec.parameters.primary_conninfo",
            "spec.parameters.primary_slot_name",
            "spec.parameters.recovery_target_timeline",
            "spec.parameters.synchronous_standby_names",
            "spec.parameters.wal_log_hints",
        ]
    );
    assert!(errs.iter().all(|e| e.message.contains("managed by the operator")), "{errs:?}");
}

// --- scale-down and rolling changes (`roll`) -------------------------------------------------

fn with_replicas(replicas: i64) -> Settings {
    Settings { replicas, ..settings() }
}

fn outdated(mut m: Member) -> Member {
    m.outdated = true;
    m
}

fn replaced(d: &ha::Decision) -> Option<&str> {
    d.replace.as_deref()
}

#[test]
fn scale_down_past_the_primary_holds_the_statefulset_and_switches_over_to_a_member_that_stays() {
    // Five members, pg-4 the primary; spec.replicas drops to 2.
    let five = |p: &str| -> Vec<Member> {
        (0..5)
            .map(|i| format!("pg-{i}"))
            .map(|n| if n == p { primary(&n, 1000) } else { standby(&n, 1000 - 10 * n.len() as u64, 990) })
            .collect()
    };
    let first = ha::decide(
        &State { target: "pg-4".into(), ..State::default() },
        &five("pg-4"),
        &with_replicas(5),
        None,
        &Answers::default(),
        T0,
    );
    assert_eq!(first.hold_replicas, None, "nothing to hold at five");
    let st = first.state;
    let d = ha::decide(&st, &five("pg-4"), &with_replicas(2), None, &Answers::default(), T0 + 100);
    assert_eq!(d.hold_replicas, Some(5), "the StatefulSet keeps the primary's ordinal");
    assert_eq!(d.state.switchover.phase, "Demoting");
    assert!(["pg-0", "pg-1"].contains(&d.state.target.as_str()), "a member that stays: {}", d.state.target);
    let e = d.events.iter().find(|e| e.reason == "SwitchingOver").expect("an Event");
    assert!(e.message.contains("scaled away"), "{}", e.message);
    // Not while the switchover runs: the hold stays until the new primary is confirmed.
    let to = d.state.target.clone();
    let d = ha::decide(&d.state, &five("pg-4"), &with_replicas(2), None, &Answers::default(), T0 + 200);
    assert_eq!(d.hold_replicas, Some(5));
    assert_eq!(d.replace, None);
    let d = ha::decide(&d.state, &five(&to), &with_replicas(2), None, &Answers::default(), T0 + 300);
    assert_eq!(d.state.current, to);
    assert_eq!(d.hold_replicas, Some(5), "until status names the new primary");
    let d = ha::decide(&d.state, &five(&to), &with_replicas(2), None, &Answers::default(), T0 + 400);
    assert_eq!(d.hold_replicas, None, "then the StatefulSet may shrink");
    // No streaming standby that stays: no switchover (it waits), and the hold remains.
    let mut lone = five("pg-4");
    for m in &mut lone[..2] {
        if let Some(Ok(s)) = &mut m.answer {
            s.streaming = false;
        }
    }
    let d = ha::decide(&st, &lone, &with_replicas(2), None, &Answers::default(), T0 + 100);
    assert_eq!((d.state.target.as_str(), d.hold_replicas), ("pg-4", Some(5)));
}

#[test]
fn a_roll_replaces_standbys_one_at_a_time_highest_first_then_switches_over_then_the_old_primary() {
    let st = confirmed();
    let all_old: Vec<Member> = healthy().into_iter().map(outdated).collect();
    let d = decide(&st, &all_old, None, T0);
    assert_eq!(replaced(&d), Some("pg-2"), "the highest standby first");
    assert!(d.events.iter().any(|e| e.reason == "ReplacingPod"));
    // While pg-2 is away, being deleted, made again, not yet streaming: nothing more.
    let mut m = all_old.clone();
    m[2].deleting = true;
    assert_eq!(replaced(&decide(&st, &m, None, T0)), None, "one at a time");
    m.pop();
    assert_eq!(replaced(&decide(&st, &m, None, T0)), None, "every member must be there");
    let mut back = member("pg-2", Some(Ok(stats(true, 1000, 1000, 1, false))));
    back.uid = "uid-pg-2-new".into();
    m.push(back.clone());
    assert_eq!(replaced(&decide(&st, &m, None, T0)), None, "pg-2 not streaming yet");
    m[2].answer = Some(Ok(stats(true, 1000, 1000, 1, true)));
    m[2].ready = false;
    assert_eq!(replaced(&decide(&st, &m, None, T0)), None, "pg-2 not Ready yet");
    m[2].ready = true;
    assert_eq!(replaced(&decide(&st, &m, None, T0)), Some("pg-1"), "then the next standby");
    m[1] = standby("pg-1", 1000, 1000);
    // Only the primary is left on the old revision: a switchover to an updated standby.
    let d = decide(&st, &m, None, T0);
    assert_eq!(replaced(&d), None, "never the primary while it is the primary");
    assert_eq!(d.state.switchover.phase, "Demoting");
    assert!(["pg-1", "pg-2"].contains(&d.state.target.as_str()));
    let e = d.events.iter().find(|e| e.reason == "SwitchingOver").expect("an Event");
    assert!(e.message.contains("old revision"), "{}", e.message);
    // Once it is done, the old primary (a standby now, still outdated) is replaced last.
    let to = d.state.target.clone();
    let after: Vec<Member> = m
        .iter()
        .map(|x| if x.pod == to { primary(&x.pod, 1100) } else { x.clone() })
        .map(|mut x| {
            if x.pod == "pg-0" {
                x.answer = Some(Ok(stats(true, 1100, 1100, 2, true)));
            }
            x
        })
        .collect();
    let d = decide(&d.state, &after, None, T0 + 1_000);
    assert_eq!(d.state.current, to);
    let d = decide(&d.state, &after, None, T0 + 2_000);
    assert_eq!(replaced(&d), Some("pg-0"), "the old primary last");
}

#[test]
fn a_cluster_of_one_replaces_its_primary_in_place_and_nothing_rolls_without_a_confirmed_primary() {
    let st = confirmed();
    let one = vec![outdated(primary("pg-0", 1000))];
    assert_eq!(
        replaced(&ha::decide(&st, &one, &with_replicas(1), None, &Answers::default(), T0)),
        Some("pg-0")
    );
    // The primary does not answer: no roll step (the failover rules act first).
    let mut m: Vec<Member> = healthy().into_iter().map(outdated).collect();
    m[0].answer = Some(Err("timeout".into()));
    assert_eq!(replaced(&decide(&st, &m, None, T0)), None);
    // Nothing outdated: nothing to do.
    assert_eq!(replaced(&decide(&st, &healthy(), None, T0)), None);
}

#[test]
fn before_the_first_primary_answers_pods_roll_by_readiness_highest_first_one_at_a_time() {
    let new = State { target: "pg-0".into(), ..State::default() };
    let silent = |pod: &str| outdated(member(pod, None));
    let m = vec![silent("pg-0"), silent("pg-1"), silent("pg-2")];
    assert_eq!(replaced(&decide(&new, &m, None, T0)), Some("pg-2"));
    let mut away = m.clone();
    away[2].ready = false;
    assert_eq!(replaced(&decide(&new, &away, None, T0)), None, "one at a time, each Ready first");
    let mut next = m.clone();
    next[2] = member("pg-2", None);
    assert_eq!(replaced(&decide(&new, &next, None, T0)), Some("pg-1"));
}

/// A server of its own `initdb`, answering as `in_recovery` says.
fn foreign(pod: &str, in_recovery: bool) -> Member {
    let mut m = member(pod, Some(Ok(stats(in_recovery, 5000, 5000, 1, false))));
    if let Some(Ok(s)) = &mut m.answer {
        s.system_id = format!("730000000000000009{}", pod.chars().last().unwrap_or('x'));
    }
    m
}

#[test]
fn a_cluster_made_by_the_last_release_keeps_pod_0_and_clones_the_others_again_never_promoting_them() {
    // The release before this one made every member with its own initdb, each a primary, and
    // wrote only `currentPrimary` (pod 0) in status; its pods run an old revision.
    let old = State::from_status(Some(&json!({ "currentPrimary": "pg-0" })), "pg-0");
    assert_eq!(old.target, "pg-0");
    assert!(old.taken_over());
    // Until this build's apply is seen, the StatefulSet's revision is the old one: its pods look
    // current, and nothing is confirmed or replaced.
    let stale = vec![primary("pg-0", 1000), foreign("pg-1", false), foreign("pg-2", false)];
    let unknown = Settings { revision_known: false, ..settings() };
    let d = ha::decide(&old, &stale, &unknown, None, &Answers::default(), T0);
    assert_eq!((d.state.current_uid.as_str(), replaced(&d)), ("", None), "nothing known yet");
    assert!(d.requests.is_empty(), "{:?}", d.requests);
    let m = vec![
        outdated(primary("pg-0", 1000)),
        outdated(foreign("pg-1", false)),
        outdated(foreign("pg-2", false)),
    ];
    let d = decide(&old, &m, None, T0);
    assert_eq!(d.state.current_uid, "", "a server of an old revision is not confirmed as the first primary");
    assert_eq!(replaced(&d), Some("pg-0"), "pod 0 first: it starts again as the primary of its own data");
    assert!(promotions(&d).is_empty());
    assert!(stops(&d).is_empty(), "stopping an old revision's server only starts it again: {:?}", stops(&d));
    let labelled: Vec<_> = d.roles.iter().filter(|(_, r)| r.is_some()).collect();
    assert_eq!(
        labelled,
        [&("pg-0".to_string(), Some("primary"))],
        "pod 0 stays behind -rw until it is replaced"
    );
    let st = d.state;

    // pg-0 made again from the current revision answers as the primary: confirmed, with its
    // database system; the others, primaries of their own on the old revision, are replaced one
    // at a time to come back as clones of it.
    let mut m0 = primary("pg-0", 1000);
    m0.uid = "uid-pg-0-new".into();
    let m = vec![m0, outdated(foreign("pg-1", false)), outdated(foreign("pg-2", false))];
    let d = decide(&st, &m, None, T0 + 1_000);
    assert_eq!((d.state.current_uid.as_str(), d.state.system_id.as_str()), ("uid-pg-0-new", SYSTEM));
    assert_eq!(role(&d, "pg-0"), Some("primary"));
    assert!(stops(&d).is_empty(), "{:?}", stops(&d));
    let other = replaced(&d).expect("a former independent server replaced").to_string();
    assert_ne!(other, "pg-0");
    let e = d.events.iter().rev().find(|e| e.reason == "ReplacingPod").expect("an Event");
    assert!(e.message.contains("old revision") && e.message.contains("a clone of pg-0"), "{}", e.message);
    assert_eq!((role(&d, "pg-1"), role(&d, "pg-2")), (None, None), "in no Service");
    let st = d.state;
    let mut away = m.clone();
    for x in &mut away {
        x.deleting = x.pod == other;
    }
    assert_eq!(replaced(&decide(&st, &away, None, T0 + 1_500)), None, "one at a time");

    // It comes back from the current revision; with no primary answering in time its entry script
    // starts it as a standby of the data it has: another database system. It is stopped (to be
    // cloned when it starts again), is in no Service, and never a candidate.
    let mut back = m.clone();
    for x in &mut back {
        if x.pod == other {
            *x = foreign(&other, true);
            x.uid = format!("uid-{other}-new");
        }
    }
    let d = decide(&st, &back, None, T0 + 2_000);
    assert!(stops(&d).contains(&(other.clone(), "reclone")), "{:?}", stops(&d));
    assert_eq!(role(&d, &other), None);
    let mut gone = back.clone();
    gone[0].answer = Some(Err("connection refused".into()));
    gone[0].ready = false;
    let mut st2 = decide(&d.state, &gone, None, T0 + 3_000).state;
    for t in [T0 + 10_000, T0 + 20_000, T0 + 60_000] {
        let d = decide(&st2, &gone, None, t);
        assert!(promotions(&d).is_empty(), "never promoted: {:?}", d.requests);
        assert_eq!(d.state.target, "pg-0", "never the target");
        st2 = d.state;
    }
    assert_eq!(reason(&decide(&st2, &gone, None, T0 + 61_000)), "WaitingForPrimary");
}

/// What the takeover rules must not change in a cluster this build made: a new cluster whose
/// template changed before its first primary answered confirms that primary (on an old revision
/// or not; otherwise -rw would stay empty and the next member could never clone), and a former
/// primary of the same database system answering as a primary is stopped at once, on an old
/// revision or not, and whether or not every member is Ready (it would take writes).
#[test]
fn only_a_cluster_taken_over_waits_for_its_first_primary_and_replaces_its_stray_servers() {
    let new = State { target: "pg-0".into(), ..State::default() };
    assert!(!new.taken_over());
    let m = vec![outdated(primary("pg-0", 1000)), member("pg-1", None)];
    let d = decide(&new, &m, None, T0);
    assert_eq!((d.state.current.as_str(), d.state.current_uid.as_str()), ("pg-0", "uid-pg-0"));
    assert_eq!(role(&d, "pg-0"), Some("primary"));

    // pg-2 took over; pg-0 (old revision, the same system) answers as a primary again while
    // pg-1 is not Ready.
    let st = State {
        target: "pg-2".into(),
        current: "pg-2".into(),
        current_uid: "uid-pg-2".into(),
        epoch: 1,
        timeline: 2,
        system_id: SYSTEM.into(),
        ..State::default()
    };
    let mut m = vec![outdated(primary("pg-0", 900)), standby("pg-1", 1000, 1000), primary("pg-2", 1000)];
    m[1].ready = false;
    let d = decide(&st, &m, None, T0);
    assert_eq!(stops(&d), [("pg-0".to_string(), "demote")]);
    assert_eq!(replaced(&d), None);
}

#[test]
fn an_annotation_left_in_place_does_not_undo_a_switchover_the_plugin_made() {
    let st = confirmed();
    // The annotation asked for pg-0, which is the primary: done.
    let d = decide(&st, &healthy(), Some("pg-0"), T0);
    assert_eq!(d.state.asked, "pg-0");
    // A roll moves the primary to pg-2 while the annotation still says pg-0.
    let mut m: Vec<Member> = healthy();
    m[0].outdated = true;
    let d = decide(&d.state, &m, Some("pg-0"), T0 + 100);
    assert_eq!(d.state.switchover.phase, "Demoting");
    let to = d.state.target.clone();
    let after = vec![standby("pg-0", 1000, 1000), standby("pg-1", 1000, 1000), primary("pg-2", 1100)];
    let after: Vec<Member> =
        after.into_iter().map(|x| if x.pod == to { primary(&to, 1100) } else { x }).collect();
    let d = decide(&d.state, &after, Some("pg-0"), T0 + 200);
    assert_eq!((d.state.current.as_str(), d.state.switchover.phase.as_str()), (to.as_str(), "Done"));
    let d = decide(&d.state, &after, Some("pg-0"), T0 + 300);
    assert_eq!(d.state.target, to, "the old annotation is not acted upon again");
    // Written before `switchoverAsked` existed: the recorded switchover counts as asked.
    let old = json!({ "switchover": { "to": "pg-1", "phase": "Done", "message": "" } });
    assert_eq!(State::from_status(Some(&old), "pg-0").asked, "pg-1");
}

// --- synchronous replication ----------------------------------------------------------------

#[test]
fn synchronous_replication_is_checked_against_the_replicas_and_set_on_the_confirmed_primary() {
    let spec = |sync: Value, replicas: i64| json!({ "version": "15", "replicas": replicas, "storage": { "size": "1Gi" }, "postgresql": { "synchronous": sync } });
    let errs = |sync: Value, replicas: i64| -> Vec<(String, String)> {
        Postgres::validate(&tk::cr("PostgresCluster", "pg", spec(sync, replicas)).to_string(), None)
            .into_iter()
            .map(|e| (e.path, e.message))
            .collect()
    };
    assert!(errs(json!({ "method": "any", "number": 2 }), 3).is_empty());
    let e = errs(json!({ "number": 3 }), 3);
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0].0, "spec.postgresql.synchronous.number");
    assert!(e[0].1.contains("spec.replicas 3 has 2 standby(s)"), "{}", e[0].1);
    let e = errs(json!({ "method": "most", "number": 0 }), 3);
    let paths: Vec<&str> = e.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(paths, ["spec.postgresql.synchronous.method", "spec.postgresql.synchronous.number"]);
    assert_eq!(
        errs(json!({ "method": "any" }), 3)[0],
        ("spec.postgresql.synchronous.number".into(), "is required".into())
    );

    let names: Vec<String> = (0..3).map(|i| format!("pg-{i}")).collect();
    let any = crate::spec::Synchronous { first: false, number: 1 };
    assert_eq!(
        crate::spec::synchronous_standby_names(Some(&any), &names),
        r#"ANY 1 ("pg-0", "pg-1", "pg-2")"#
    );
    let first = crate::spec::Synchronous { first: true, number: 2 };
    assert_eq!(
        crate::spec::synchronous_standby_names(Some(&first), &names),
        r#"FIRST 2 ("pg-0", "pg-1", "pg-2")"#
    );
    assert_eq!(crate::spec::synchronous_standby_names(None, &names), "");

    // Through reconcile: a confirmed primary gets the setting (one-shot, named by its
    // incarnation and the value); nothing goes to a standby.
    let mut cr = tk::cr("PostgresCluster", "pg", spec(json!({ "number": 1 }), 3));
    cr["status"] = json!({ "currentPrimary": "pg-0", "currentPrimaryUID": "uid-pg-0", "targetPrimary": "pg-0", "promotions": 0, "timeline": 1 });
    let pods = [pod("pg-0", "uid-pg-0"), pod("pg-1", "uid-pg-1")];
    let mut observed = tk::observed(&cr, &pods);
    let poll = |p: &str| format!("stats-{p}-{}-r0", &format!("uid-{p}")[..8.min(format!("uid-{p}").len())]);
    observed.responses = vec![
        stateward_sdk::Response {
            id: poll("pg-0"),
            code: Some(0),
            stdout: "f|1|100|0/3000148|0/3000148|1||pg-1:streaming:sync:0\n".into(),
            ..Default::default()
        },
        stateward_sdk::Response {
            id: poll("pg-1"),
            code: Some(0),
            stdout: "t|1|100|0/3000148|0/3000148|1|streaming|\n".into(),
            ..Default::default()
        },
    ];
    let plan = Postgres::reconcile(observed).expect("plan");
    let sync: Vec<&stateward_sdk::ExecRequest> = plan
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Exec(e) if e.id.starts_with("sync-") => Some(e),
            _ => None,
        })
        .collect();
    assert_eq!(sync.len(), 1, "{:?}", plan.actions);
    assert_eq!(sync[0].pod, "pg-0");
    assert_eq!(sync[0].mode, stateward_sdk::RequestMode::Once);
    let command = sync[0].command.join(" ");
    assert!(
        command.contains(r#"ALTER SYSTEM SET synchronous_standby_names = 'ANY 1 ("pg-0", "pg-1", "pg-2")'"#)
            && command.contains("pg_reload_conf()"),
        "{command}"
    );
}

/// `Redundant`: every standby streaming from the confirmed primary within the lag bounds, and
/// the synchronous ones the spec asks for; the standbys' lag read from the primary.
#[test]
fn redundancy_needs_every_standby_streaming_caught_up_and_the_synchronous_quorum() {
    use crate::redundancy::verdict;
    use crate::spec::Synchronous;
    use stateward_sdk::redundancy::{promised, Verdict};
    let with = |standbys: &[(&str, &str, &str, i64)]| {
        let mut p = primary("pg-0", 1000);
        if let Some(Ok(s)) = &mut p.answer {
            s.standbys = standbys
                .iter()
                .map(|(n, st, sync, lag)| ha::Standby {
                    name: (*n).into(),
                    state: (*st).into(),
                    sync_state: (*sync).into(),
                    lag_bytes: *lag,
                })
                .collect();
        }
        vec![p, standby("pg-1", 1000, 1000), standby("pg-2", 1000, 1000)]
    };
    let both = with(&[("pg-1", "streaming", "async", 0), ("pg-2", "streaming", "async", 100)]);
    assert_eq!(verdict(&both, &promised("pg", 3), Some(&both[0]), None, false).verdict, Verdict::Redundant);
    let catching = with(&[("pg-1", "streaming", "async", 0), ("pg-2", "catchup", "async", 0)]);
    let r = verdict(&catching, &promised("pg", 3), Some(&catching[0]), None, false);
    assert_eq!(r.verdict, Verdict::Lacking);
    assert!(r.message.contains("pg-2 is catchup from pg-0, not streaming"), "{r:?}");
    let one = with(&[("pg-1", "streaming", "async", 0)]);
    assert!(verdict(&one, &promised("pg", 3), Some(&one[0]), None, false)
        .message
        .contains("pg-2 is not connected to pg-0"));
    // A standby whose pod is gone (deleted, not created again yet) is named, not counted.
    let gone: Vec<_> =
        with(&[("pg-1", "streaming", "async", 0)]).into_iter().filter(|m| m.pod != "pg-2").collect();
    let r = verdict(&gone, &promised("pg", 3), Some(&gone[0]), None, false);
    assert_eq!(r.verdict, Verdict::Lacking);
    assert!(r.message.ends_with("pg-2 does not exist"), "{r:?}");
    // Hysteresis: 8 MiB behind stays caught up once redundant, and is not caught up before.
    let lagging = with(&[("pg-1", "streaming", "async", 8 << 20), ("pg-2", "streaming", "async", 0)]);
    assert_eq!(
        verdict(&lagging, &promised("pg", 3), Some(&lagging[0]), None, true).verdict,
        Verdict::Redundant
    );
    assert_eq!(
        verdict(&lagging, &promised("pg", 3), Some(&lagging[0]), None, false).verdict,
        Verdict::Lacking
    );
    // The synchronous quorum.
    let sync = Synchronous { first: false, number: 2 };
    let quorum = with(&[("pg-1", "streaming", "quorum", 0), ("pg-2", "streaming", "async", 0)]);
    let r = verdict(&quorum, &promised("pg", 3), Some(&quorum[0]), Some(&sync), false);
    assert_eq!((r.verdict, r.reason.as_str()), (Verdict::Lacking, "SynchronousQuorumNotMet"));
    let met = with(&[("pg-1", "streaming", "quorum", 0), ("pg-2", "streaming", "quorum", 0)]);
    assert_eq!(
        verdict(&met, &promised("pg", 3), Some(&met[0]), Some(&sync), false).verdict,
        Verdict::Redundant
    );
    // No primary confirmed: unknown before any answer, lacking after.
    let silent = vec![member("pg-0", None), member("pg-1", None)];
    assert_eq!(verdict(&silent, &promised("pg", 3), None, None, false).verdict, Verdict::Unknown);
    assert_eq!(verdict(&both, &promised("pg", 3), None, None, false).verdict, Verdict::Lacking);
    assert_eq!(verdict(&both, &promised("pg", 1), Some(&both[0]), None, false).verdict, Verdict::NotPromised);
}
