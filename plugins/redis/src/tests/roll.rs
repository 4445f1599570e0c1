//! The order of a rolling change in replication mode.

use crate::roll::{hold_replicas, next, Pod, Step};

/// `(name, ready, outdated, role)`; lags: c-1 behind by 10 bytes, the others by 0.
fn pods(list: &[(&str, bool, bool, Option<&'static str>)]) -> Vec<Pod> {
    list.iter()
        .map(|(name, ready, outdated, role)| Pod {
            name: name.to_string(),
            ready: *ready,
            deleting: false,
            outdated: *outdated,
            role: *role,
            lag: (*role == Some("replica")).then_some(if *name == "c-1" { 10 } else { 0 }),
            unaskable: false,
        })
        .collect()
}

const M: Option<&str> = Some("master");
const R: Option<&str> = Some("replica");

fn replace(pod: &str) -> Option<String> {
    Some(pod.to_string())
}

fn replaced(step: Option<Step>) -> Option<String> {
    match step {
        Some(Step::Replace { pod, .. }) => Some(pod),
        _ => None,
    }
}

#[test]
fn replicas_go_first_highest_ordinal_first_then_a_switchover_then_the_old_master() {
    // c-1 is the master; all three outdated.
    let all = pods(&[("c-0", true, true, R), ("c-1", true, true, M), ("c-2", true, true, R)]);
    assert_eq!(replaced(next(&all, 3, Some("c-1"), true)), replace("c-2"));
    let after_c2 = pods(&[("c-0", true, true, R), ("c-1", true, true, M), ("c-2", true, false, R)]);
    assert_eq!(replaced(next(&after_c2, 3, Some("c-1"), true)), replace("c-0"));
    // Only the master is outdated: a switchover to the updated replica lagging least (c-2, 0
    // bytes; c-0 also 0 bytes: the higher ordinal wins the tie).
    let only_master = pods(&[("c-0", true, false, R), ("c-1", true, true, M), ("c-2", true, false, R)]);
    match next(&only_master, 3, Some("c-1"), true) {
        Some(Step::Switchover { to, why }) => {
            assert_eq!(to, "c-2");
            assert!(why.contains("c-1 is the last pod on an old revision"), "{why}");
        }
        other => panic!("wanted a switchover, got {other:?}"),
    }
    // After it the old master is a replica: replaced last.
    let switched = pods(&[("c-0", true, false, R), ("c-1", true, true, R), ("c-2", true, false, M)]);
    assert_eq!(replaced(next(&switched, 3, Some("c-2"), true)), replace("c-1"));
    let done = pods(&[("c-0", true, false, R), ("c-1", true, false, R), ("c-2", true, false, M)]);
    assert_eq!(next(&done, 3, Some("c-2"), true), None);
}

/// A cluster the release before this one made: every pod on an old revision, no server
/// answering this build's requests; c-0, its master, is kept as the master. The replicas are
/// replaced first, one at a time; the master, which cannot be paused for a switchover, last,
/// once both replicas are updated and linked to it (the Sentinels fail over as it shuts down).
#[test]
fn a_cluster_of_the_last_release_replaces_its_silent_replicas_then_its_master() {
    let silent = |mut p: Vec<Pod>| {
        for x in &mut p {
            x.unaskable = x.outdated;
        }
        p
    };
    let old = silent(pods(&[("c-0", true, true, M), ("c-1", true, true, None), ("c-2", true, true, None)]));
    assert_eq!(replaced(next(&old, 3, Some("c-0"), true)), replace("c-2"));
    let one = silent(pods(&[("c-0", true, true, M), ("c-1", true, true, None), ("c-2", true, false, R)]));
    assert_eq!(replaced(next(&one, 3, Some("c-0"), true)), replace("c-1"));
    // c-1 back but not linked yet: the master waits.
    let unlinked =
        silent(pods(&[("c-0", true, true, M), ("c-1", true, false, None), ("c-2", true, false, R)]));
    assert_eq!(next(&unlinked, 3, Some("c-0"), true), None);
    let linked = silent(pods(&[("c-0", true, true, M), ("c-1", true, false, R), ("c-2", true, false, R)]));
    assert!(
        matches!(next(&linked, 3, Some("c-0"), true), Some(Step::ReplaceMaster { pod, .. }) if pod == "c-0"),
        "{:?}",
        next(&linked, 3, Some("c-0"), true)
    );
    // A master that answers is switched over from as always, never replaced.
    let answering = pods(&[("c-0", true, true, M), ("c-1", true, false, R), ("c-2", true, false, R)]);
    assert!(matches!(next(&answering, 3, Some("c-0"), true), Some(Step::Switchover { .. })));
}

#[test]
fn the_least_lagging_updated_replica_is_switched_to() {
    // c-1 lags 10 bytes, c-0 none: c-0, although c-1 has the higher ordinal.
    let p = pods(&[("c-0", true, false, R), ("c-1", true, false, R), ("c-2", true, true, M)]);
    assert!(matches!(next(&p, 3, Some("c-2"), true), Some(Step::Switchover { to, .. }) if to == "c-0"));
}

#[test]
fn nothing_moves_unless_every_pod_is_there_ready_and_linked() {
    // A replica not Ready, one being deleted, one not linked, one missing: nothing.
    let not_ready = pods(&[("c-0", false, false, R), ("c-1", true, true, M), ("c-2", true, true, R)]);
    assert_eq!(next(&not_ready, 3, Some("c-1"), true), None);
    let mut deleting = pods(&[("c-0", true, false, R), ("c-1", true, true, M), ("c-2", true, true, R)]);
    deleting[0].deleting = true;
    assert_eq!(next(&deleting, 3, Some("c-1"), true), None);
    let unlinked = pods(&[("c-0", true, false, None), ("c-1", true, true, M), ("c-2", true, true, R)]);
    assert_eq!(next(&unlinked, 3, Some("c-1"), true), None);
    let missing = pods(&[("c-1", true, true, M), ("c-2", true, true, R)]);
    assert_eq!(next(&missing, 3, Some("c-1"), true), None);
    // No master confirmed after one was (a failover under way): nothing.
    let failing = pods(&[("c-0", true, true, R), ("c-1", true, true, None), ("c-2", true, true, R)]);
    assert_eq!(next(&failing, 3, None, true), None);
    // Nothing outdated: nothing.
    let current = pods(&[("c-0", true, false, R), ("c-1", true, false, M), ("c-2", true, false, R)]);
    assert_eq!(next(&current, 3, Some("c-1"), true), None);
}

#[test]
fn scale_in_moves_the_master_off_a_removed_ordinal_first_and_holds_the_statefulset() {
    // c-3 is the master of 4; spec.replicas now 3: a switchover to the best pod that stays.
    let p = pods(&[
        ("c-0", true, false, R),
        ("c-1", true, false, R),
        ("c-2", true, false, R),
        ("c-3", true, false, M),
    ]);
    match next(&p, 3, Some("c-3"), true) {
        Some(Step::Switchover { to, why }) => {
            assert_eq!(to, "c-2", "c-1 lags 10 bytes; c-0 and c-2 none: the higher ordinal");
            assert!(why.contains("c-3 is being scaled away (spec.replicas is 3)"), "{why}");
        }
        other => panic!("wanted a switchover, got {other:?}"),
    }
    // It comes before any roll, and prefers an updated replica.
    let mixed = pods(&[
        ("c-0", true, false, R),
        ("c-1", true, true, R),
        ("c-2", true, true, R),
        ("c-3", true, true, M),
    ]);
    assert!(matches!(next(&mixed, 3, Some("c-3"), true), Some(Step::Switchover { to, .. }) if to == "c-0"));
    // Held at 4 while the master, the one status named, or a switchover's end holds ordinal 3.
    assert_eq!(hold_replicas(["c-3"], 3), Some(4));
    assert_eq!(hold_replicas(["c-0", "c-3", "c-2"], 3), Some(4));
    assert_eq!(hold_replicas(["c-0", "c-2"], 3), None);
    assert_eq!(hold_replicas(["c-4"], 5), None);
}

#[test]
fn before_the_first_master_pods_are_replaced_by_readiness() {
    let forming = pods(&[("c-0", true, true, None), ("c-1", true, true, None), ("c-2", true, false, None)]);
    assert_eq!(replaced(next(&forming, 3, None, false)), replace("c-1"));
}

#[test]
fn replication_mode_rolls_by_the_plugin_and_standalone_by_the_statefulset() {
    use super::*;
    let cr = tk::cr("RedisCluster", "cache", spec());
    let sts = tk::find(&plan(&cr), "StatefulSet");
    assert_eq!(sts["spec"]["updateStrategy"]["type"], "OnDelete");
    let mut solo = cr.clone();
    solo["spec"]["replicas"] = json!(1);
    let sts = tk::find(&plan(&solo), "StatefulSet");
    assert_eq!(sts["spec"]["updateStrategy"]["type"], "RollingUpdate");
}

// --- through reconcile ----------------------------------------------------------------------

/// A Ready pod of revision `rev`.
fn pod(name: &str, rev: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": "db", "uid": format!("{name}-uid-0001"),
            "labels": { "stateward.dev/instance": "cache", "controller-revision-hash": rev },
        },
        "status": {
            "conditions": [{ "type": "Ready", "status": "True" }],
            "containerStatuses": [{ "name": "redis", "state": { "running": {} }, "restartCount": 0 }],
        },
    })
}

fn answer(id: String, stdout: &str) -> stateward_sdk::Response {
    stateward_sdk::Response { id, code: Some(0), stdout: stdout.into(), ..Default::default() }
}

/// cache-0 the master, cache-1 and cache-2 its replicas, every Sentinel naming cache-0; all
/// pods of revision `old` while the StatefulSet makes `new`; `status` as written last.
fn observed(status: serde_json::Value) -> stateward_sdk::Observed {
    observed_with(status, "old", &[2, 2, 2])
}

/// [`observed`] with the pods' revision and the number of other Sentinels each Sentinel knows.
fn observed_with(status: serde_json::Value, rev: &str, others: &[u64; 3]) -> stateward_sdk::Observed {
    observed_flags(status, rev, others, "master")
}

/// [`observed_with`] with the flags every Sentinel gives the master.
fn observed_flags(
    status: serde_json::Value,
    rev: &str,
    others: &[u64; 3],
    flags: &str,
) -> stateward_sdk::Observed {
    use super::*;
    let mut cr = tk::cr("RedisCluster", "cache", spec());
    cr["status"] = status;
    let sts = tk::find(&plan(&cr), "StatefulSet");
    let pods: Vec<serde_json::Value> = (0..3).map(|i| pod(&format!("cache-{i}"), rev)).collect();
    let children = tk::with_sts_status(&[vec![sts], pods].concat(), 3, 3, 0, ("old", "new"));
    let mut o = tk::observed(&cr, &children);
    let id = |kind: &str, i: usize| format!("{kind}-cache-{i}-cache-{i}--r0");
    let sentinel = |n: u64| {
        format!("name\nprimary\nip\ncache-0.cache-headless\nport\n6379\nflags\n{flags}\nnum-other-sentinels\n{n}\nquorum\n2\n")
    };
    o.responses.push(answer(
        id("info", 0),
        "role:master\r\nconnected_slaves:2\r\nmaster_repl_offset:100\r\nused_memory:1\r\n",
    ));
    for i in 1..3 {
        o.responses.push(answer(
            id("info", i),
            "role:slave\r\nmaster_host:cache-0.cache-headless\r\nmaster_link_status:up\r\nslave_repl_offset:100\r\nused_memory:1\r\n",
        ));
    }
    for (i, n) in others.iter().enumerate() {
        o.responses.push(answer(id("sentinel", i), &sentinel(*n)));
    }
    o
}

/// Status holds each instance's state, never its readings: an idle server's next answers
/// (the offsets moved on, more memory in use) give the same status, so nothing is written.
#[test]
fn instances_in_status_hold_state_and_stay_the_same_while_readings_move() {
    use stateward_sdk::Service as _;
    let status = serde_json::json!({ "master": "cache-0" });
    let instances = |o| super::tk::extra(&super::Redis::reconcile(o).unwrap())["instances"].clone();
    let first = instances(observed(status.clone()));
    assert_eq!(
        first[1],
        serde_json::json!({ "pod": "cache-1", "role": "replica", "serverRole": "slave", "connectedReplicas": 0,
                            "maxmemoryBytes": 0, "masterHost": "cache-0.cache-headless", "linkStatus": "up" })
    );
    assert_eq!(first[0]["connectedReplicas"], 2);
    let mut busier = observed(status);
    for r in busier.responses.iter_mut().filter(|r| r.id.starts_with("info-")) {
        r.stdout =
            r.stdout.replace("offset:100", "offset:73400320").replace("used_memory:1", "used_memory:524288");
    }
    assert_eq!(instances(busier), first, "readings changed the status");
}

#[test]
fn reconcile_replaces_the_highest_outdated_replica_and_polls_faster_while_writes_are_held() {
    use stateward_sdk::{Action, RequestMode, Service};
    let p = super::Redis::reconcile(observed(serde_json::json!({ "master": "cache-0" }))).unwrap();
    let deleted = deleted_pods(&p);
    assert_eq!(deleted, ["cache-2"]);
    assert!(p.events.iter().any(|e| e.reason == "ReplacingPod" && e.message.contains("replicas first")));
    let modes = |p: &stateward_sdk::Plan| -> Vec<RequestMode> {
        p.actions
            .iter()
            .filter_map(|a| match a {
                Action::Exec(e) if e.id.starts_with("info-") => Some(e.mode),
                _ => None,
            })
            .collect()
    };
    assert!(modes(&p).iter().all(|m| *m == RequestMode::EveryMs(crate::live::POLL_MS)));

    // A switchover holding writes back: nothing is replaced, and the pods are asked faster.
    let holding = serde_json::json!({
        "master": "cache-0",
        "switchover": { "asked": "cache-1", "to": "cache-1", "from": "cache-0", "phase": "Pausing",
                        "startedAtMs": 1_700_000_000_000u64 - 12_000, "preparedAtMs": 1_700_000_000_000u64 - 11_500,
                        "pausedAtMs": 0 },
    });
    let p = super::Redis::reconcile(observed(holding)).unwrap();
    assert!(!p.actions.iter().any(|a| matches!(a, Action::Delete(_))), "no pod replaced during a switchover");
    let m = modes(&p);
    assert_eq!(m.len(), 3);
    assert!(m.iter().all(|m| *m == RequestMode::EveryMs(crate::live::SWITCHOVER_POLL_MS)), "{m:?}");
}

/// The status of a switchover from cache-0 to cache-1 in `phase`, started at `started`: its
/// priorities set 0.5 s later, writes held from 12 s after it.
fn switching_to_cache_1(phase: &str, started: u64) -> serde_json::Value {
    serde_json::json!({
        "master": "cache-0",
        "switchover": { "asked": "cache-1", "to": "cache-1", "from": "cache-0", "phase": phase,
                        "startedAtMs": started, "preparedAtMs": started + 500, "pausedAtMs": started + 12_000 },
    })
}

/// While writes are held, the switchover's one-shot offset reads count as polls: the target's,
/// asked after the pause and caught up, has Sentinel asked to fail over without waiting for
/// the next poll.
#[test]
fn offsets_read_once_after_the_pause_let_the_failover_be_asked() {
    use stateward_sdk::{Action, Service};
    let paused_at = 1_700_000_000_000u64 - 1_000;
    let pausing = switching_to_cache_1("Pausing", paused_at - 12_000);
    let failover_asked = |o: stateward_sdk::Observed| {
        let p = super::Redis::reconcile(o).unwrap();
        p.actions.iter().any(|a| matches!(a, Action::Exec(e) if e.id.starts_with("switchover-failover-")))
    };
    // The polls were started before the pause (tk's responses start at 0): no proof.
    let mut o = observed(pausing.clone());
    o.responses.push(answer(format!("switchover-pause-cache-0-{}", paused_at - 12_000), "OK\n"));
    assert!(!failover_asked(o.clone()));
    for (pod, text) in [
        ("cache-0", "role:master\r\nmaster_repl_offset:100\r\nused_memory:1\r\n"),
        ("cache-1", "role:slave\r\nmaster_host:cache-0.cache-headless\r\nmaster_link_status:up\r\nslave_repl_offset:100\r\nused_memory:1\r\n"),
    ] {
        let mut a = answer(format!("switchover-offset-{pod}-{}-{paused_at}", paused_at - 12_000), text);
        a.started_at_ms = paused_at + 100;
        o.responses.push(a);
    }
    assert!(failover_asked(o));
}

/// A switchover's failover seen past the promotion by the Sentinel that leads it (the
/// target's): the target is labelled master and the old master made its replica at once, while
/// every Sentinel still names the old master.
#[test]
fn the_target_is_labelled_master_once_its_sentinel_saw_it_promoted() {
    use stateward_sdk::{Action, Service};
    let failing_over = switching_to_cache_1("FailingOver", 1_700_000_000_000u64 - 15_000);
    let plan = |promotion: &str| {
        let mut o = observed(failing_over.clone());
        let info = o.responses.iter_mut().find(|r| r.id.starts_with("info-cache-1")).unwrap();
        info.stdout =
            "role:master\r\nconnected_slaves:0\r\nmaster_repl_offset:100\r\nused_memory:1\r\n".into();
        let leader = o.responses.iter_mut().find(|r| r.id.starts_with("sentinel-cache-1")).unwrap();
        leader.stdout = leader.stdout.replace(
            "flags\nmaster\n",
            &format!("flags\nmaster,failover_in_progress\nfailover-state\n{promotion}\n"),
        );
        super::Redis::reconcile(o).unwrap()
    };
    let role_of = |p: &stateward_sdk::Plan, pod: &str| {
        p.actions.iter().find_map(|a| match a {
            Action::LabelPod(l) if l.pod == pod => {
                l.labels.iter().find(|(k, _)| k == "stateward.dev/role").map(|(_, v)| v.clone())
            }
            _ => None,
        })
    };
    let follows = |p: &stateward_sdk::Plan| {
        p.actions
            .iter()
            .any(|a| matches!(a, Action::Exec(e) if e.id.starts_with("switchover-follow-cache-0")))
    };
    let p = plan("reconf_slaves");
    assert_eq!(role_of(&p, "cache-1"), Some(Some("master".to_string())));
    assert_eq!(role_of(&p, "cache-0"), Some(None));
    assert!(follows(&p));
    // The promotion sent: the same once the target answers as the master (it does here).
    let p = plan("wait_promotion");
    assert_eq!(role_of(&p, "cache-1"), Some(Some("master".to_string())));
    // Before the leader chose and told it: nobody is the master the Sentinels name and answers.
    let p = plan("select_slave");
    assert_eq!(role_of(&p, "cache-1"), Some(None));
    assert!(!follows(&p));
}

#[test]
fn no_pod_a_sentinel_still_names_the_master_is_replaced() {
    use stateward_sdk::{Action, Service};
    // cache-2 is the next to go; one Sentinel, not yet told that cache-0 took over from it,
    // still names it.
    let mut o = observed(serde_json::json!({ "master": "cache-0" }));
    let stale = o.responses.iter_mut().find(|r| r.id.starts_with("sentinel-cache-1")).unwrap();
    stale.stdout = stale.stdout.replace("cache-0.cache-headless", "cache-2.cache-headless");
    let p = super::Redis::reconcile(o).unwrap();
    assert!(tk_status_master(&p) == "cache-0", "two of three name cache-0");
    assert!(!p.actions.iter().any(|a| matches!(a, Action::Delete(_))), "not while a Sentinel names it");
}

/// The pods a plan deletes.
fn deleted_pods(p: &stateward_sdk::Plan) -> Vec<&str> {
    p.actions
        .iter()
        .filter_map(|a| match a {
            stateward_sdk::Action::Delete(o) if o.kind == "Pod" => Some(o.name.as_str()),
            _ => None,
        })
        .collect()
}

fn tk_status_master(p: &stateward_sdk::Plan) -> String {
    serde_json::from_str::<serde_json::Value>(&p.status.extra).unwrap()["master"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn after_a_scale_in_each_sentinel_that_knows_removed_ones_is_reset_one_at_a_time() {
    use stateward_sdk::{Action, Service};
    let resets = |others: &[u64; 3]| -> Vec<(String, String)> {
        let p =
            super::Redis::reconcile(observed_with(serde_json::json!({ "master": "cache-0" }), "new", others))
                .unwrap();
        p.actions
            .iter()
            .filter_map(|a| match a {
                Action::Exec(e)
                    if e.command.ends_with(&["sentinel".into(), "reset".into(), "primary".into()]) =>
                {
                    Some((e.pod.clone(), e.id.clone()))
                }
                _ => None,
            })
            .collect()
    };
    // Two removed pods' Sentinels still known by all three: the first is reset.
    assert_eq!(
        resets(&[4, 4, 4]),
        [("cache-0".to_string(), "sentinel-reset-cache-0-cache-0--r0-n4".to_string())]
    );
    // cache-0 is finding the others again (knows 1 of 2): nobody else is reset meanwhile.
    assert_eq!(resets(&[1, 4, 4]), []);
    // It found them: the next.
    assert_eq!(resets(&[2, 4, 4]).first().map(|r| r.0.as_str()), Some("cache-1"));
    // Every Sentinel knows exactly the others that run: nothing.
    assert_eq!(resets(&[2, 2, 2]), []);
}

#[test]
fn a_failover_no_sentinel_starts_is_asked_of_one_after_the_stall() {
    use stateward_sdk::{Action, Service};
    const NOW: u64 = 1_700_000_000_000;
    let run = |status: serde_json::Value, flags: &str| {
        let p = super::Redis::reconcile(observed_flags(status, "new", &[2, 2, 2], flags)).unwrap();
        let asked: Vec<String> = p
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Exec(e)
                    if e.command.ends_with(&["sentinel".into(), "failover".into(), "primary".into()]) =>
                {
                    Some(e.pod.clone())
                }
                _ => None,
            })
            .collect();
        (asked, p.status.extra.clone(), p.events.clone())
    };
    use super::*;
    // Seen down just now: the time is recorded, nothing asked yet.
    let (asked, status, _) = run(json!({ "master": "cache-0" }), "s_down,o_down,master");
    assert!(asked.is_empty());
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["masterDownSinceMs"], json!(NOW));
    // Down for longer than the stall with nobody failing over: the Sentinel of another pod.
    let since = NOW - crate::live::FAILOVER_STALL_MS;
    let (asked, _, events) =
        run(json!({ "master": "cache-0", "masterDownSinceMs": since }), "s_down,o_down,master");
    assert_eq!(asked, ["cache-1"]);
    assert!(events.iter().any(|e| e.reason == "FailoverStalled"), "{events:?}");
    // A Sentinel failing over, or the master not objectively down: nothing, and no time kept.
    for flags in ["s_down,o_down,master,failover_in_progress", "s_down,master", "master"] {
        let (asked, status, _) = run(json!({ "master": "cache-0", "masterDownSinceMs": since }), flags);
        assert!(asked.is_empty(), "{flags}");
        let status: Value = serde_json::from_str(&status).unwrap();
        assert!(status.get("masterDownSinceMs").is_none(), "{flags}: {status}");
    }
}

/// Fencing the master refuses its writes (`min-replicas-to-write` past any count of replicas,
/// its clients disconnected), asked once per answer that still shows it writable; unfenced,
/// a server holding writes back gets 0 again.
#[test]
fn a_fenced_server_refuses_writes_and_an_unfenced_one_takes_them_again() {
    use stateward_sdk::{Action, Service};
    let writes = |o: stateward_sdk::Observed| -> Vec<(String, String)> {
        let p = super::Redis::reconcile(o).unwrap();
        p.actions
            .iter()
            .filter_map(|a| match a {
                Action::Exec(e) if e.id.starts_with("fence-") || e.id.starts_with("unfence-") => {
                    Some((e.id.clone(), e.stdin.clone().unwrap_or_default()))
                }
                _ => None,
            })
            .collect()
    };
    let fenced = |o: &mut stateward_sdk::Observed, list: &str| {
        let mut cr: serde_json::Value = serde_json::from_str(&o.resource).unwrap();
        cr["metadata"]["annotations"] = serde_json::json!({ "stateward.dev/fenced-instances": list });
        o.resource = cr.to_string();
    };
    let status = serde_json::json!({ "master": "cache-0" });
    assert_eq!(writes(observed_with(status.clone(), "new", &[2, 2, 2])), []);
    let mut o = observed_with(status.clone(), "new", &[2, 2, 2]);
    fenced(&mut o, "[\"cache-0\"]");
    let w = writes(o);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].0.starts_with("fence-cache-0-"), "{w:?}");
    assert_eq!(w[0].1, "CONFIG SET min-replicas-to-write 1000\nCLIENT KILL TYPE normal\n");
    // Held back now (INFO says min_slaves_good_slaves): nothing more; unfenced: back to 0.
    let mut o = observed_with(status, "new", &[2, 2, 2]);
    let held = "role:master\r\nconnected_slaves:2\r\nmin_slaves_good_slaves:2\r\nmaster_repl_offset:100\r\nused_memory:1\r\n";
    o.responses[0].stdout = held.into();
    let mut still = o.clone();
    fenced(&mut still, "[\"cache-0\"]");
    assert_eq!(writes(still), []);
    let w = writes(o);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].0.starts_with("unfence-cache-0-") && w[0].1 == "CONFIG SET min-replicas-to-write 0\n",
        "{w:?}"
    );
}

/// Taken over from the release before this one: no master in status, every pod on an old
/// revision, no Sentinel, and no server answering this build's requests (its containers lack
/// the credentials). Pod 0, that release's master, keeps the master label (so the Service of
/// the cluster's name keeps selecting it) and the highest replica is replaced first.
#[test]
fn a_cluster_of_the_last_release_keeps_pod_0_behind_its_services_while_its_replicas_go() {
    use stateward_sdk::{Action, Service};
    let mut o = observed(serde_json::json!({}));
    o.responses = (0..3)
        .map(|i| answer(format!("info-cache-{i}-cache-{i}--r0"), "NOAUTH Authentication required.\n"))
        .collect();
    let p = super::Redis::reconcile(o).unwrap();
    let label = |pod: &str| {
        p.actions.iter().find_map(|a| match a {
            Action::LabelPod(l) if l.pod == pod => {
                l.labels.iter().find(|(k, _)| k == "stateward.dev/role").map(|(_, v)| v.clone())
            }
            _ => None,
        })
    };
    assert_eq!(label("cache-0"), Some(Some("master".to_string())));
    assert_eq!((label("cache-1"), label("cache-2")), (Some(None), Some(None)), "no role");
    let deleted = deleted_pods(&p);
    assert_eq!(deleted, ["cache-2"]);
    assert_eq!(tk_status_master(&p), "cache-0", "recorded: the next reconcile knows it");
}

/// The last step of an ordinary roll: only the master on an old revision, and its poll timing
/// out (a loaded node). It is no pod of the release before this one (it did not refuse the
/// request for want of credentials): it is switched over from, never deleted.
#[test]
fn a_master_whose_poll_times_out_at_the_end_of_a_roll_is_not_replaced() {
    use stateward_sdk::Service;
    let mut o = observed(serde_json::json!({ "master": "cache-0" }));
    for c in o.children.iter_mut() {
        let mut v: serde_json::Value = serde_json::from_str(c).unwrap();
        if v["kind"] == "Pod" && v["metadata"]["name"] != "cache-0" {
            v["metadata"]["labels"]["controller-revision-hash"] = serde_json::json!("new");
            *c = v.to_string();
        }
    }
    for r in o.responses.iter_mut().filter(|r| r.id == "info-cache-0-cache-0--r0") {
        *r = stateward_sdk::Response {
            id: r.id.clone(),
            error: Some("no answer within 5000 ms (timeout)".into()),
            ..Default::default()
        };
    }
    let p = super::Redis::reconcile(o).unwrap();
    let deleted = deleted_pods(&p);
    assert!(deleted.is_empty(), "{deleted:?}");
}

/// A new cluster whose template changed before any master answered, with servers that give no
/// answer yet (or none at all, as on simulated nodes): not the release before this one's (no
/// `NOAUTH`), so no master is assumed and its pods roll by readiness as before.
#[test]
fn pods_that_merely_do_not_answer_are_no_takeover() {
    use stateward_sdk::{Action, Service};
    let mut o = observed(serde_json::json!({}));
    o.responses = (0..3)
        .map(|i| stateward_sdk::Response {
            id: format!("info-cache-{i}-cache-{i}--r0"),
            error: Some("exec failed: container not running".into()),
            ..Default::default()
        })
        .collect();
    let p = super::Redis::reconcile(o).unwrap();
    let master_label = p.actions.iter().any(|a| {
        matches!(a, Action::LabelPod(l) if l.labels.iter().any(|(k, v)| k == "stateward.dev/role" && v.is_some()))
    });
    assert!(!master_label, "no pod labelled");
    assert_eq!(tk_status_master(&p), "", "no master recorded");
}
