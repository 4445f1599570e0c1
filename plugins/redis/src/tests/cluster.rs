//! Cluster mode: parsing the servers' answers, forming once, repairing addresses, roles.

use super::*;
use crate::cluster::{decide, parse, Member, View, SLOTS};

const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const C: &str = "cccccccccccccccccccccccccccccccccccccccc";
const D: &str = "dddddddddddddddddddddddddddddddddddddddd";

fn info(state: &str, assigned: u32, ok: u32, known: u32) -> String {
    format!(
        "cluster_enabled:1\r\ncluster_state:{state}\r\ncluster_slots_assigned:{assigned}\r\ncluster_slots_ok:{ok}\r\ncluster_slots_pfail:0\r\ncluster_known_nodes:{known}\r\ncluster_size:3\r\n"
    )
}

/// Three masters (a, b, c on pods 0-2, 10.0.0.1-3) and d (pod 3) following a; `me` is myself.
fn nodes(me: &str) -> String {
    let line = |id: &str, ip: &str, role: &str, master: &str, slots: &str| {
        let myself = if id == me { "myself," } else { "" };
        format!("{id} {ip}:6379@16379 {myself}{role} {master} 0 1700000000000 1 connected {slots}\n")
    };
    [
        line(A, "10.0.0.1", "master", "-", "0-5460"),
        line(B, "10.0.0.2", "master", "-", "5461-10922"),
        line(C, "10.0.0.3", "master", "-", "10923-16383"),
        line(D, "10.0.0.4", "slave", A, ""),
    ]
    .concat()
}

fn member(pod: &str, ip: &str, answer: Option<View>) -> Member {
    Member { pod: pod.into(), ip: ip.into(), ready: true, answer: answer.map(Ok), ..Member::default() }
}

/// Pods cache-0..3 answering as [`nodes`] has it (three masters, cache-3 following cache-0).
fn four() -> Vec<Member> {
    let view = |me: &str| parse(&(info("ok", SLOTS, SLOTS, 4) + &nodes(me))).unwrap();
    vec![
        member("cache-0", "10.0.0.1", Some(view(A))),
        member("cache-1", "10.0.0.2", Some(view(B))),
        member("cache-2", "10.0.0.3", Some(view(C))),
        member("cache-3", "10.0.0.4", Some(view(D))),
    ]
}

#[test]
fn parses_cluster_info_and_nodes() {
    let v = parse(&(info("ok", SLOTS, SLOTS, 4) + &nodes(D))).unwrap();
    assert_eq!((v.state.as_str(), v.slots_assigned, v.slots_ok, v.known_nodes), ("ok", SLOTS, SLOTS, 4));
    let me = v.myself().unwrap();
    assert_eq!(
        (me.id.as_str(), me.ip.as_str(), me.master, me.master_id.as_deref()),
        (D, "10.0.0.4", false, Some(A))
    );
    assert_eq!(v.nodes.iter().map(|n| n.slots).collect::<Vec<_>>(), [5461, 5462, 5461, 0]);
    // A hostname after the address, a migrating slot, a failing node.
    let odd = format!(
        "{}{A} 10.0.0.9:6379@16379,cache-0 myself,master - 0 0 1 connected 0-9 12 [13->-{B}]\n{B} :0@0 master,fail - 0 0 2 disconnected\n",
        info("fail", 11, 11, 2)
    );
    let v = parse(&odd).unwrap();
    assert_eq!((v.nodes[0].ip.as_str(), v.nodes[0].slots), ("10.0.0.9", 11));
    assert!(v.nodes[1].failing && !v.nodes[1].connected && v.nodes[1].ip.is_empty());
    // Not such an answer.
    assert_eq!(parse("ERR This instance has cluster support disabled"), None);
    assert_eq!(parse(&info("ok", 0, 0, 1)), None, "no line of its own");
}

#[test]
fn forms_once_every_pod_is_ready_current_and_fresh() {
    let fresh = |id: &str, ip: &str| {
        parse(&(info("fail", 0, 0, 1) + &format!("{id} {ip}:6379@16379 myself,master - 0 0 0 connected\n")))
            .unwrap()
    };
    let mut members = vec![
        member("cache-1", "10.0.0.2", Some(fresh(B, "10.0.0.2"))),
        member("cache-0", "10.0.0.1", Some(fresh(A, "10.0.0.1"))),
        member("cache-2", "10.0.0.3", Some(fresh(C, "10.0.0.3"))),
    ];
    let d = decide(&members, false, 3, 0);
    assert_eq!(
        d.form,
        Some(("cache-0".to_string(), vec!["10.0.0.1".into(), "10.0.0.2".into(), "10.0.0.3".into()]))
    );
    assert_eq!(d.condition.reason, "Forming");
    // Not while a pod is of an old revision, not Ready, missing, or its server knows others.
    members[2].outdated = true;
    assert_eq!(decide(&members, false, 3, 0).form, None);
    members[2].outdated = false;
    assert_eq!(decide(&members, false, 4, 0).form, None, "a pod missing");
    assert_eq!(decide(&members, true, 3, 0).form, None, "status says it was formed");
    members[1].answer = Some(Ok(parse(&(info("fail", 0, 0, 2) + &nodes(A))).unwrap()));
    assert_eq!(decide(&members, false, 3, 0).form, None, "a node knows others: formed already");
}

#[test]
fn roles_shards_and_the_condition_come_from_the_servers() {
    let members = four();
    let d = decide(&members, true, 4, 1);
    let roles: Vec<Option<&str>> = d.roles.iter().map(|r| r.1).collect();
    assert_eq!(roles, [Some("master"), Some("master"), Some("master"), Some("replica")]);
    assert_eq!(d.shards.len(), 3);
    assert_eq!(
        (d.shards[0].master.as_str(), d.shards[0].replicas.clone()),
        ("cache-0", vec!["cache-3".to_string()])
    );
    assert_eq!((d.condition.status, d.condition.reason.as_str()), (ConditionStatus::True, "ReplicasMissing"));
    assert!(d.condition.message.contains("cache-1 has 0 of 1 replicas"), "{}", d.condition.message);
    assert!(d.meets.is_empty(), "every node knows every pod at its address: {:?}", d.meets);
}

#[test]
fn a_node_that_lists_a_pod_at_another_address_is_told_to_meet_it() {
    let view = |me: &str| parse(&(info("ok", SLOTS, SLOTS, 4) + &nodes(me))).unwrap();
    // cache-3 (d) was made again: its pod has 10.0.0.14 now; the others list 10.0.0.4.
    let members = vec![
        member("cache-0", "10.0.0.1", Some(view(A))),
        member("cache-1", "10.0.0.2", Some(view(B))),
        member("cache-2", "10.0.0.3", Some(view(C))),
        member("cache-3", "10.0.0.14", Some(view(D))),
    ];
    let mut meets = decide(&members, true, 4, 1).meets;
    meets.sort();
    // Everybody lists cache-3 at the old address (cache-3 itself too, in its own line), and
    // cache-3 lists the others where they are.
    let new = |p: &str| (p.to_string(), "10.0.0.14".to_string());
    assert_eq!(meets, [new("cache-0"), new("cache-1"), new("cache-2")]);
    // Every pod made again at once: nobody lists anybody where they are; one meeting per node,
    // at most MAX_MEETS.
    let moved: Vec<Member> =
        members.iter().enumerate().map(|(i, m)| Member { ip: format!("10.0.1.{i}"), ..m.clone() }).collect();
    let meets = decide(&moved, true, 4, 1).meets;
    assert_eq!(meets.len(), crate::cluster::MAX_MEETS);
    assert!(meets.iter().all(|(p, ip)| moved.iter().any(|m| &m.ip == ip && &m.pod != p)), "{meets:?}");
    // A node shaking hands with another lists it at its address under another id: no meeting.
    let mut shaking = members.clone();
    shaking[3].ip = "10.0.0.4".into();
    assert!(decide(&shaking, true, 4, 1).meets.is_empty());
}

#[test]
fn cluster_mode_is_checked_and_rendered() {
    let mut cr = tk::cr("RedisCluster", "cache", spec());
    cr["spec"]["mode"] = json!("cluster");
    cr["spec"]["replicas"] = json!(6);
    cr["spec"]["cluster"] = json!({ "shards": 3 });
    assert!(Redis::validate(&cr.to_string(), None).is_empty());
    let p = plan(&cr);
    let conf = tk::find(&p, "ConfigMap")["data"]["redis.conf"].as_str().unwrap().to_string();
    for line in ["cluster-enabled yes", "cluster-config-file nodes.conf", "cluster-node-timeout 5000"] {
        assert!(conf.lines().any(|l| l == line), "missing {line:?} in\n{conf}");
    }
    let sts = tk::find(&p, "StatefulSet");
    assert_eq!(sts["spec"]["podManagementPolicy"], "Parallel");
    assert_eq!(tk::extra(&p)["mode"], "cluster");
    let script = tk::find(&p, "ConfigMap")["data"]["entrypoint.sh"].as_str().unwrap().to_string();
    assert!(!script.contains("--sentinel"), "no Sentinel in cluster mode");

    let paths = |cr: &Value| -> Vec<String> {
        Redis::validate(&cr.to_string(), None).iter().map(|e| format!("{}: {}", e.path, e.message)).collect()
    };
    let mut two = cr.clone();
    two["spec"]["cluster"]["shards"] = json!(2);
    two["spec"]["replicas"] = json!(4);
    let errs = paths(&two);
    assert!(
        errs.len() == 1 && errs[0].starts_with("spec.cluster.shards: 2 is not a whole number from 3"),
        "{errs:?}"
    );
    let mut wrong = cr.clone();
    wrong["spec"]["replicas"] = json!(5);
    assert_eq!(
        paths(&wrong),
        ["spec.replicas: is 5, but 3 shards × (1 master + 1 replicas) are 6 pods: set spec.replicas to 6"]
    );
    let mut none = cr.clone();
    none["spec"]["cluster"] = json!({ "replicasPerShard": 9, "slots": 1 });
    let errs = paths(&none);
    assert!(errs.iter().any(|e| e.starts_with("spec.cluster.shards: is required")), "{errs:?}");
    assert!(errs.iter().any(|e| e.starts_with("spec.cluster.replicasPerShard: 9 is not")), "{errs:?}");
    assert!(errs.iter().any(|e| e.starts_with("spec.cluster.slots: is not a field")), "{errs:?}");
    let mut elsewhere = tk::cr("RedisCluster", "cache", spec());
    elsewhere["spec"]["cluster"] = json!({ "shards": 3 });
    assert_eq!(paths(&elsewhere), ["spec.cluster: is for cluster mode only, not replication"]);
    // The shape is fixed once running (scaling is not yet reliable live).
    let mut bigger = cr.clone();
    bigger["spec"]["cluster"]["shards"] = json!(4);
    bigger["spec"]["replicas"] = json!(8);
    let errs = Redis::validate(&bigger.to_string(), Some(&cr.to_string()));
    assert!(
        errs.iter().any(|e| e.path == "spec.cluster" && e.message.contains("not supported yet")),
        "{errs:?}"
    );
}

#[test]
fn rolls_everything_at_once_before_formation_then_replicas_first_then_a_failover_per_master() {
    use crate::cluster::{roll, RollStep};
    let mut members = four();
    for m in &mut members {
        m.outdated = true;
    }
    // Not formed: nothing holds data, all at once.
    let fresh = decide(&[], false, 4, 1);
    match roll(&members, &fresh, false, 4) {
        Some(RollStep::Replace { pods, .. }) => assert_eq!(pods.len(), 4),
        other => panic!("{other:?}"),
    }
    // Formed: the replica first.
    let d = decide(&members, true, 4, 1);
    assert!(
        matches!(roll(&members, &d, true, 4), Some(RollStep::Replace { pods, .. }) if pods == ["cache-3"])
    );
    // cache-3 updated: cache-0's shard fails over to it; the masters without a replica here
    // (cache-1, cache-2) are replaced in place, highest ordinal first — but cache-0 is not the
    // highest outdated master, cache-2 is.
    members[3].outdated = false;
    let d = decide(&members, true, 4, 1);
    assert!(
        matches!(roll(&members, &d, true, 4), Some(RollStep::Replace { pods, .. }) if pods == ["cache-2"]),
        "a master without a replica is replaced in place"
    );
    members[1].outdated = false;
    members[2].outdated = false;
    let d = decide(&members, true, 4, 1);
    assert_eq!(
        roll(&members, &d, true, 4),
        Some(RollStep::Failover { replica: "cache-3".into(), master: "cache-0".into() })
    );
    // Nothing while a pod is not Ready or the cluster is not ok.
    members[1].ready = false;
    assert_eq!(roll(&members, &decide(&members, true, 4, 1), true, 4), None);
}

#[test]
fn cluster_mode_rolls_by_the_plugin() {
    let mut cr = tk::cr("RedisCluster", "cache", spec());
    cr["spec"]["mode"] = json!("cluster");
    cr["spec"]["replicas"] = json!(6);
    cr["spec"]["cluster"] = json!({ "shards": 3 });
    assert_eq!(tk::find(&plan(&cr), "StatefulSet")["spec"]["updateStrategy"]["type"], "OnDelete");
}

#[test]
fn a_master_starting_again_has_its_replica_take_over_first() {
    let mut cr = tk::cr("RedisCluster", "cache", spec());
    cr["spec"]["mode"] = json!("cluster");
    cr["spec"]["replicas"] = json!(6);
    cr["spec"]["cluster"] = json!({ "shards": 3 });
    let s = tk::find(&plan(&cr), "ConfigMap")["data"]["entrypoint.sh"].as_str().unwrap().to_string();
    for line in [
        "nodes=/data/nodes.conf",
        "    [ \"$answer\" = OK ] || continue",
        "    end=$(( $(date +%s) + 30 ))",
        "exec redis-server \"$here/redis.conf\" --include \"$auth\" \"$@\"",
    ] {
        assert!(s.lines().any(|l| l == line), "missing {line:?} in\n{s}");
    }
    assert!(s.contains("cluster failover force"), "{s}");
    // The takeover comes before the server starts, while the password is still at hand.
    assert!(s.find("cluster failover force") < s.find("unset REDIS_PASSWORD"));
}

#[test]
fn the_formation_answer_is_told_once() {
    let mut cr = tk::cr("RedisCluster", "cache", spec());
    cr["spec"]["mode"] = json!("cluster");
    cr["spec"]["replicas"] = json!(6);
    cr["spec"]["cluster"] = json!({ "shards": 3 });
    let run = |status: Value| {
        let mut cr = cr.clone();
        cr["status"] = status;
        let mut o = tk::observed(&cr, &[]);
        o.responses.push(stateward_sdk::Response {
            id: "cluster-create-abcdef12".into(),
            code: Some(0),
            stdout: ">>> Performing Cluster Check\n[OK] All 16384 slots covered.\n".into(),
            ..Default::default()
        });
        let p = Redis::reconcile(o).unwrap();
        let extra: Value = serde_json::from_str(&p.status.extra).unwrap();
        (p.events.iter().filter(|e| e.reason == "ClusterFormed").count(), extra["cluster"].clone())
    };
    // Seen formed from the servers before the answer came: the event still comes, once.
    let (told, cluster) = run(json!({ "cluster": { "formed": true } }));
    assert_eq!(
        (told, cluster["formation"].as_str(), cluster["formed"].as_bool()),
        (1, Some("Formed"), Some(true))
    );
    let (told, _) = run(json!({ "cluster": { "formed": true, "formation": "Formed" } }));
    assert_eq!(told, 0);
}

/// The annotation in cluster mode: refused for a pod that is not a replica (or not a pod, or
/// while the cluster is not ok), `CLUSTER FAILOVER` on the named replica until it serves the
/// shard's slots, Failed on an error answered or past the timeout, and asked once only.
#[test]
fn a_switchover_fails_over_to_the_named_replica_of_its_shard() {
    use crate::cluster::{switchover, SWITCHOVER_TIMEOUT_MS};
    use crate::switchover::State;
    let members = four();
    let d = decide(&members, true, 4, 1);
    let none = State::default();
    for (asked, why) in [("cache-1", "is a master already"), ("cache-9", "is not a pod of this cluster")] {
        let s = switchover(&none, Some(asked), &d, None, 1_000);
        assert!(s.state.message.contains(why) && s.failover.is_none(), "{asked}: {:?}", s.state);
    }
    let mut failing = d.clone();
    failing.state = "fail".into();
    let s = switchover(&none, Some("cache-3"), &failing, None, 1_000);
    assert_eq!((s.state.phase.as_str(), s.failover), ("Refused", None), "{:?}", s.state);

    let started = switchover(&none, Some("cache-3"), &d, None, 1_000);
    assert_eq!(
        (started.state.phase.as_str(), started.state.from.as_str(), started.failover.as_deref()),
        ("FailingOver", "cache-0", Some("cache-3"))
    );
    assert_eq!(started.events[0].reason, "SwitchoverFailingOver");
    // Asked again while under way: the same request (sent once by its id), no new event.
    let again = switchover(&started.state, Some("cache-3"), &d, Some(Ok(())), 2_000);
    assert_eq!((again.failover.as_deref(), again.events.len()), (Some("cache-3"), 0));

    // cache-3 serves a's slots now, and a follows it.
    let swapped = |me: &str| {
        let text = nodes(me)
            .lines()
            .map(|l| match l.split(' ').next() {
                Some(id) if id == A => l.replace("master - ", &format!("slave {D} ")).replace(" 0-5460", ""),
                Some(id) if id == D => l.replace(&format!("slave {A} "), "master - ") + "0-5460",
                _ => l.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        parse(&(info("ok", SLOTS, SLOTS, 4) + &text)).unwrap()
    };
    let after: Vec<Member> = ["cache-0", "cache-1", "cache-2", "cache-3"]
        .iter()
        .zip([A, B, C, D])
        .enumerate()
        .map(|(i, (pod, id))| member(pod, &format!("10.0.0.{}", i + 1), Some(swapped(id))))
        .collect();
    let d_after = decide(&after, true, 4, 1);
    assert_eq!(d_after.roles[3].1, Some("master"), "{:?}", d_after.roles);
    let done = switchover(&started.state, Some("cache-3"), &d_after, Some(Ok(())), 4_500);
    assert_eq!((done.state.phase.as_str(), done.failover), ("Done", None), "{:?}", done.state);
    assert!(done.state.message.contains("3500 ms"), "{}", done.state.message);

    let refused =
        switchover(&started.state, Some("cache-3"), &d, Some(Err("ERR not a replica".into())), 2_000);
    assert_eq!(refused.state.phase, "Failed");
    let late = switchover(&started.state, Some("cache-3"), &d, None, 1_001 + SWITCHOVER_TIMEOUT_MS);
    assert_eq!((late.state.phase.as_str(), late.failover), ("Failed", None));
}

/// `CLUSTER NODES` as node `me` answers it: `(id, ip, master id or "-", slots or "")` each.
fn nodes_of(me: &str, lines: &[(&str, &str, &str, &str)]) -> String {
    lines
        .iter()
        .map(|(id, ip, master, slots)| {
            let myself = if *id == me { "myself," } else { "" };
            let role = if *master == "-" { "master" } else { "slave" };
            format!("{id} {ip}:6379@16379 {myself}{role} {master} 0 1700000000000 1 connected {slots}\n")
        })
        .collect()
}

/// Every pod `cache-<i>` at 10.0.0.<i+1> answering with the same `lines` (its own marked).
fn cluster_of(lines: &[(&str, &str, &str, &str)]) -> Vec<Member> {
    lines
        .iter()
        .enumerate()
        .map(|(i, (id, ip, _, _))| {
            let v = parse(&(info("ok", SLOTS, SLOTS, lines.len() as u32) + &nodes_of(id, lines))).unwrap();
            member(&format!("cache-{i}"), ip, Some(v))
        })
        .collect()
}

/// Scale-out 3 → 4 shards of 1 replica: the new pods join as empty masters; the first becomes a
/// master, the second its replica, then a rebalance gives the new master its share. Scale-in
/// back to 3: the shard whose master goes is handed to its replica that stays when there is
/// one, else its slots are drained; the replicas that stay move to masters short of one; the
/// pods that go are forgotten, and the StatefulSet is held until then.
#[test]
fn scaling_adds_shards_and_moves_slots_then_drains_and_forgets_them() {
    use crate::cluster::{scale, ScaleStep};
    const E: &str = "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee";
    const F: &str = "ffffffffffffffffffffffffffffffffffffffff";
    const G: &str = "1111111111111111111111111111111111111111";
    const H: &str = "2222222222222222222222222222222222222222";
    let formed = [
        (A, "10.0.0.1", "-", "0-5460"),
        (B, "10.0.0.2", "-", "5461-10922"),
        (C, "10.0.0.3", "-", "10923-16383"),
        (D, "10.0.0.4", B, ""),
        (E, "10.0.0.5", C, ""),
        (F, "10.0.0.6", A, ""),
    ];
    let steady = cluster_of(&formed);
    let d = decide(&steady, true, 6, 1);
    assert_eq!(scale(&steady, &d, 6, 3, 1), Default::default(), "the shape is as asked");

    // 4 shards: pods 6 and 7 joined as empty masters.
    let mut grown = formed.to_vec();
    grown.extend([(G, "10.0.0.7", "-", ""), (H, "10.0.0.8", "-", "")]);
    let members = cluster_of(&grown);
    let d = decide(&members, true, 8, 1);
    let s = scale(&members, &d, 8, 4, 1);
    assert_eq!(
        s.step,
        Some(ScaleStep::Replicate { pod: "cache-7".into(), master: "cache-6".into(), master_id: G.into() })
    );
    assert_eq!(s.hold, None);
    grown[7].2 = G;
    let members = cluster_of(&grown);
    let d = decide(&members, true, 8, 1);
    assert_eq!(
        scale(&members, &d, 8, 4, 1).step,
        Some(ScaleStep::Rebalance { pod: "cache-0".into(), drain: vec![] })
    );
    // Not while a pod is missing or not Ready.
    let mut waiting = members.clone();
    waiting[6].ready = false;
    assert_eq!(scale(&waiting, &d, 8, 4, 1).step, None);
    let balanced = [
        (A, "10.0.0.1", "-", "1365-5460"),
        (B, "10.0.0.2", "-", "6827-10922"),
        (C, "10.0.0.3", "-", "12288-16383"),
        (D, "10.0.0.4", B, ""),
        (E, "10.0.0.5", C, ""),
        (F, "10.0.0.6", A, ""),
        (G, "10.0.0.7", "-", "0-1364 5461-6826 10923-12287"),
        (H, "10.0.0.8", G, ""),
    ];
    let members = cluster_of(&balanced);
    let d = decide(&members, true, 8, 1);
    assert_eq!(scale(&members, &d, 8, 4, 1), Default::default(), "4 shards of 1 replica");

    // Back to 3 shards: pods 6 and 7 go. G serves slots and its replica goes too: drained.
    let s = scale(&members, &d, 6, 3, 1);
    assert_eq!(s.step, Some(ScaleStep::Rebalance { pod: "cache-0".into(), drain: vec![G.into()] }));
    assert_eq!(s.hold, Some(8), "held while a pod that goes holds slots");
    // Drained: forgotten one at a time, still held.
    let mut drained = balanced.to_vec();
    drained[6].3 = "";
    drained[0].3 = "0-5460";
    let members = cluster_of(&drained);
    let d = decide(&members, true, 8, 1);
    let s = scale(&members, &d, 6, 3, 1);
    assert_eq!(
        s.step,
        Some(ScaleStep::Forget { pod: "cache-0".into(), gone: "cache-6".into(), node: G.into() })
    );
    assert_eq!(s.hold, Some(8));
    // Forgotten by every pod that stays: the StatefulSet may shrink.
    let mut members = cluster_of(&formed);
    members.extend(cluster_of(&drained).into_iter().skip(6));
    let d = decide(&members, true, 8, 1);
    assert_eq!(scale(&members, &d, 6, 3, 1).hold, None);
    assert!(!d.meets.is_empty(), "while 8 pods are asked for, the forgotten ones would be met");
    assert_eq!(decide(&members, true, 6, 1).meets, vec![], "pods that go are never introduced again");

    // A migration stopped midway (its source failed over): fixed before anything else.
    let mut open = drained.to_vec();
    open[2].3 = "12288-16383 [5-<-1111111111111111111111111111111111111111]";
    let members = cluster_of(&open);
    let d = decide(&members, true, 8, 1);
    assert_eq!(scale(&members, &d, 6, 3, 1).step, Some(ScaleStep::Fix { pod: "cache-2".into() }));

    // A shard whose master goes while its replica stays: the replica takes over.
    let swapped = [
        (A, "10.0.0.1", "-", "0-5460"),
        (B, "10.0.0.2", "-", "5461-10922"),
        (C, "10.0.0.3", G, ""),
        (D, "10.0.0.4", B, ""),
        (E, "10.0.0.5", A, ""),
        (F, "10.0.0.6", A, ""),
        (G, "10.0.0.7", "-", "10923-16383"),
        (H, "10.0.0.8", B, ""),
    ];
    let members = cluster_of(&swapped);
    let d = decide(&members, true, 8, 1);
    assert_eq!(
        scale(&members, &d, 6, 3, 1).step,
        Some(ScaleStep::Failover { replica: "cache-2".into(), master: "cache-6".into() })
    );
    // Taken over: F, a second replica of A, moves to C, short of one; then G is forgotten.
    let mut taken = swapped.to_vec();
    (taken[2].2, taken[2].3, taken[6].2, taken[6].3) = ("-", "10923-16383", C, "");
    let members = cluster_of(&taken);
    let d = decide(&members, true, 8, 1);
    assert_eq!(
        scale(&members, &d, 6, 3, 1).step,
        Some(ScaleStep::Replicate { pod: "cache-5".into(), master: "cache-2".into(), master_id: C.into() })
    );
}
