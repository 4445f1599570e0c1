//! Cluster mode: parsing the servers' answers, forming once, repairing addresses, roles.

use super::*;
use crate::cluster::{decide, parse, Member, View, SLOTS};

const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const C: &str = "cccccccccccccccccccccccccccccccccccccccc";
const D: &str = "dddddddddddddddddddddddddddddddddddddddd";
const E: &str = "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee";
const F: &str = "ffffffffffffffffffffffffffffffffffffffff";
const G: &str = "1111111111111111111111111111111111111111";
const H: &str = "2222222222222222222222222222222222222222";

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
    assert!(!v.writes_held);
    // The poll's third answer, `INFO replication`, tells a fenced node's writes are held back,
    // and does not disturb the rest.
    let replication = "# Replication\r\nrole:master\r\nconnected_slaves:1\r\nmin_slaves_good_slaves:1\r\nslave0:ip=10.0.0.4,port=6379,state=online,offset=42,lag=0\r\n";
    let held = parse(&(info("ok", SLOTS, SLOTS, 4) + &nodes(D) + replication)).unwrap();
    assert!(held.writes_held);
    assert_eq!(held.nodes, v.nodes);
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
    // Shards may be added and removed once running; the replicas of each may not change.
    let mut bigger = cr.clone();
    bigger["spec"]["cluster"]["shards"] = json!(4);
    bigger["spec"]["replicas"] = json!(8);
    assert_eq!(Redis::validate(&bigger.to_string(), Some(&cr.to_string())), vec![], "3 -> 4 shards");
    assert_eq!(Redis::validate(&cr.to_string(), Some(&bigger.to_string())), vec![], "4 -> 3 shards");
    let mut more_replicas = cr.clone();
    more_replicas["spec"]["cluster"]["replicasPerShard"] = json!(2);
    more_replicas["spec"]["replicas"] = json!(9);
    let errs = Redis::validate(&more_replicas.to_string(), Some(&cr.to_string()));
    assert!(
        errs.iter()
            .any(|e| e.path == "spec.cluster.replicasPerShard" && e.message.contains("fixed at creation")),
        "{errs:?}"
    );
    // The other checks still hold on an update: fewer than 3 shards, pods not matching.
    let mut two_shards = cr.clone();
    two_shards["spec"]["cluster"]["shards"] = json!(2);
    two_shards["spec"]["replicas"] = json!(4);
    let errs = Redis::validate(&two_shards.to_string(), Some(&cr.to_string()));
    assert!(errs.iter().any(|e| e.path == "spec.cluster.shards"), "{errs:?}");
    let mut short = bigger.clone();
    short["spec"]["replicas"] = json!(6);
    let errs = Redis::validate(&short.to_string(), Some(&cr.to_string()));
    assert!(errs.iter().any(|e| e.path == "spec.replicas"), "{errs:?}");
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
        Some(ScaleStep::Forget {
            from: (0..6).map(|i| format!("cache-{i}")).collect(),
            gone: "cache-6".into(),
            node: G.into()
        })
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

/// The entry node of `redis-cli --cluster`: the pod's IP, else the address in its server's own
/// line; none without either (IPv6 as it is: redis-cli splits at the last ':').
#[test]
fn the_entry_node_is_the_pods_own_address() {
    use crate::cluster::entry;
    let mut members = four();
    assert_eq!(entry(&members, "cache-2", "6379").as_deref(), Some("10.0.0.3:6379"));
    // A server learns its own address from a MEET: its own line may still name an old one.
    members[2].ip = "10.0.1.3".into();
    assert_eq!(entry(&members, "cache-2", "6379").as_deref(), Some("10.0.1.3:6379"));
    members[2].ip = String::new();
    assert_eq!(entry(&members, "cache-2", "6379").as_deref(), Some("10.0.0.3:6379"), "its own line");
    members[2].answer = None;
    assert_eq!(entry(&members, "cache-2", "6379"), None, "no address known");
    assert_eq!(entry(&members, "cache-9", "6379"), None, "no such pod");
    members[1].ip = "fd00::2".into();
    assert_eq!(entry(&members, "cache-1", "6379").as_deref(), Some("fd00::2:6379"));
}

/// A Ready pod `cache-<i>` at `ip`, its server running.
pub(super) fn cluster_pod(i: usize, ip: &str) -> Value {
    let name = format!("cache-{i}");
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "namespace": "db", "uid": format!("{name}-uid-0001"),
                      "labels": { "stateward.dev/instance": "cache" } },
        "status": {
            "podIP": ip,
            "conditions": [{ "type": "Ready", "status": "True" }],
            "containerStatuses": [{ "name": "redis", "state": { "running": {} }, "restartCount": 0 }],
        },
    })
}

/// The slot-moving requests (id, pod, command) of a reconcile of a formed cluster whose spec asks
/// for `shards` shards of 1 replica, with a pod `cache-<i>` at `ips[i]` for each of `lines`, each
/// server answering with `lines` (its own marked).
fn moves(
    shards: usize,
    lines: &[(&str, &str, &str, &str)],
    ips: &[&str],
) -> Vec<(String, String, Vec<String>)> {
    moves_after(shards, lines, ips, json!({ "cluster": { "formed": true, "formation": "Formed" } }))
}

/// [`moves`] with the status the plugin wrote last.
fn moves_after(
    shards: usize,
    lines: &[(&str, &str, &str, &str)],
    ips: &[&str],
    status: Value,
) -> Vec<(String, String, Vec<String>)> {
    let mut cr = tk::cr("RedisCluster", "cache", spec());
    cr["spec"]["mode"] = json!("cluster");
    cr["spec"]["replicas"] = json!(shards * 2);
    cr["spec"]["cluster"] = json!({ "shards": shards });
    cr["status"] = status;
    let pods: Vec<Value> = ips.iter().enumerate().map(|(i, ip)| cluster_pod(i, ip)).collect();
    let mut o = tk::observed(&cr, &pods);
    for (i, (id, ..)) in lines.iter().enumerate() {
        o.responses.push(stateward_sdk::Response {
            id: format!("cluster-cache-{i}-cache-{i}--r0"),
            code: Some(0),
            stdout: info("ok", SLOTS, SLOTS, lines.len() as u32) + &nodes_of(id, lines),
            ..Default::default()
        });
    }
    let p = Redis::reconcile(o).unwrap();
    p.actions
        .into_iter()
        .filter_map(|a| match a {
            stateward_sdk::Action::Exec(e)
                if ["cluster-rebalance-", "cluster-fix-", "cluster-forget-"]
                    .iter()
                    .any(|k| e.id.starts_with(k)) =>
            {
                Some((e.id, e.pod, e.command))
            }
            _ => None,
        })
        .collect()
}

/// What follows `flag` in `command`.
fn after<'a>(command: &'a [String], flag: &str) -> Option<&'a str> {
    command.iter().position(|a| a == flag).and_then(|i| command.get(i + 1)).map(String::as_str)
}

/// Every slot move names the entry node at its pod's address, never 127.0.0.1: redis-cli hands
/// the entry's address to the source servers as the MIGRATE target, and a source told
/// 127.0.0.1 migrates to itself and blocks (its replica takes over midway). The moves bound
/// MIGRATE below the node timeout.
#[test]
fn slot_moves_name_the_entry_node_at_its_pods_address() {
    use crate::cluster::{MIGRATE_TIMEOUT_MS, NODE_TIMEOUT_MS};
    let ips =
        ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6", "10.0.0.7", "10.0.0.8"];
    let check = |(id, pod, command): &(String, String, Vec<String>), sub: &str, entry: &str| {
        assert_eq!(after(command, "--cluster"), Some(sub), "{command:?}");
        assert_eq!(after(command, sub), Some(entry), "{id} in {pod}: {command:?}");
        assert!(!command.iter().any(|a| a.starts_with("127.0.0.1:")), "{command:?}");
        let t: u64 = after(command, "--cluster-timeout").unwrap().parse().unwrap();
        assert!(t == MIGRATE_TIMEOUT_MS && t < NODE_TIMEOUT_MS, "{command:?}");
        // redis-cli itself: the policies let the plugin run nothing else (no shell).
        assert_eq!(command[0], "redis-cli", "{command:?}");
    };

    // 3 -> 4 shards: cache-6 joined as an empty master, cache-7 follows it.
    let grown = [
        (A, "10.0.0.1", "-", "0-5460"),
        (B, "10.0.0.2", "-", "5461-10922"),
        (C, "10.0.0.3", "-", "10923-16383"),
        (D, "10.0.0.4", B, ""),
        (E, "10.0.0.5", C, ""),
        (F, "10.0.0.6", A, ""),
        (G, "10.0.0.7", "-", ""),
        (H, "10.0.0.8", G, ""),
    ];
    let m = moves(4, &grown, &ips);
    assert_eq!(m.len(), 1, "{m:?}");
    assert_eq!((m[0].0.as_str(), m[0].1.as_str()), ("cluster-rebalance-0", "cache-0"));
    check(&m[0], "rebalance", "10.0.0.1:6379");
    assert_eq!(after(&m[0].2, "--cluster-weight"), None);

    // 4 -> 3 shards: cache-6's slots are drained to the masters that stay, cache-0 among them.
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
    let m = moves(3, &balanced, &ips);
    assert_eq!(m.len(), 1, "{m:?}");
    check(&m[0], "rebalance", "10.0.0.1:6379");
    assert_eq!(after(&m[0].2, "--cluster-weight"), Some(format!("{G}=0").as_str()));

    // A migration stopped midway on cache-2: fixed from there.
    let mut open = balanced;
    open[6].3 = "";
    open[0].3 = "0-5460";
    open[2].3 = "12288-16383 [5-<-1111111111111111111111111111111111111111]";
    let m = moves(3, &open, &ips);
    assert_eq!(m.len(), 1, "{m:?}");
    assert_eq!((m[0].0.as_str(), m[0].1.as_str()), ("cluster-fix-0", "cache-2"));
    check(&m[0], "fix", "10.0.0.3:6379");

    // Drained: cache-6's node is forgotten by every server that stays, each told on its own
    // (CLUSTER FORGET); the server that goes is not reset, so a client still sent to it is
    // redirected (MOVED) rather than told CLUSTERDOWN.
    open[2].3 = "12288-16383";
    let m = moves(3, &open, &ips);
    let pods: Vec<&str> = m.iter().map(|(_, pod, _)| pod.as_str()).collect();
    assert_eq!(pods, ["cache-0", "cache-1", "cache-2", "cache-3", "cache-4", "cache-5"], "{m:?}");
    for (id, pod, command) in &m {
        assert_eq!(*id, format!("cluster-forget-{}-{pod}", &G[..12]));
        assert_eq!(command[command.len() - 3..], ["cluster", "forget", G], "{command:?}");
        assert_eq!(after(command, "-h"), Some("127.0.0.1"), "{command:?}");
    }

    // No address known for cache-0 (neither its pod nor its server's own line): no move at all.
    let mut unknown = grown;
    unknown[0].1 = "";
    let mut no_ip = ips;
    no_ip[0] = "";
    assert_eq!(moves(4, &unknown, &no_ip), vec![]);
}

/// A scaling request waits for its answer only once the host has recorded it (status.requests):
/// one whose record failed (a conflicting status write) was never sent, and is asked for again
/// instead of holding every later step back until its timeout.
#[test]
fn a_scaling_request_the_host_never_recorded_is_asked_for_again() {
    let ips =
        ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6", "10.0.0.7", "10.0.0.8"];
    let grown = [
        (A, "10.0.0.1", "-", "0-5460"),
        (B, "10.0.0.2", "-", "5461-10922"),
        (C, "10.0.0.3", "-", "10923-16383"),
        (D, "10.0.0.4", B, ""),
        (E, "10.0.0.5", C, ""),
        (F, "10.0.0.6", A, ""),
        (G, "10.0.0.7", "-", ""),
        (H, "10.0.0.8", G, ""),
    ];
    let asked = |requests: Value| {
        let status = json!({
            "cluster": {
                "formed": true, "formation": "Formed",
                "scalingRequest": "cluster-rebalance-0", "scalingSinceMs": 1_700_000_000_000u64 - 5_000,
            },
            "requests": requests,
        });
        moves_after(4, &grown, &ips, status)
    };
    let m = asked(json!({}));
    assert_eq!(m.len(), 1, "not recorded, so never sent: asked again");
    assert_eq!(m[0].0, "cluster-rebalance-0");
    let m = asked(json!({ "cluster-rebalance-0": { "state": "Sent", "sentAtMs": 1_699_999_995_000u64 } }));
    assert!(m.is_empty(), "sent and not answered: nothing else moves meanwhile: {m:?}");
}

#[test]
fn a_server_routing_a_peer_to_its_old_address_is_named_until_gossip_corrects_it() {
    let view = |me: &str| parse(&(info("ok", SLOTS, SLOTS, 4) + &nodes(me))).unwrap();
    assert!(decide(&four(), true, 4, 1).stale.is_empty(), "every server routes every pod where it is");
    // cache-3 (d) came back on 10.0.0.14. cache-0 lists a node shaking hands there (so no
    // meeting is asked), but still routes d's id to 10.0.0.4, as do the others: `ok`, yet a
    // client they redirect to d would wait on a dead address.
    let mut shaking = view(A);
    shaking.nodes.push(crate::cluster::Node { id: E.into(), ip: "10.0.0.14".into(), ..Default::default() });
    let members = vec![
        member("cache-0", "10.0.0.1", Some(shaking)),
        member("cache-1", "10.0.0.2", Some(view(B))),
        member("cache-2", "10.0.0.3", Some(view(C))),
        member("cache-3", "10.0.0.14", Some(view(D))),
    ];
    let d = decide(&members, true, 4, 1);
    assert_eq!(d.condition.status, ConditionStatus::True, "the servers say ok");
    assert_eq!(
        d.stale,
        [
            "cache-0 routes cache-3 to 10.0.0.4",
            "cache-1 routes cache-3 to 10.0.0.4",
            "cache-2 routes cache-3 to 10.0.0.4"
        ]
    );
    // A server that does not know a pod's node at all is named too; the list is bounded.
    let alone = parse(
        &(info("fail", 0, 0, 1) + &format!("{A} 10.0.0.1:6379@16379 myself,master - 0 0 1 connected\n")),
    )
    .unwrap();
    let mut lonely = members.clone();
    lonely[0].answer = Some(Ok(alone));
    let d = decide(&lonely, true, 4, 1);
    assert!(d.stale.contains(&"cache-0 does not know cache-1".to_string()), "{:?}", d.stale);
    let moved: Vec<Member> =
        four().iter().enumerate().map(|(i, m)| Member { ip: format!("10.0.1.{i}"), ..m.clone() }).collect();
    assert_eq!(decide(&moved, true, 4, 1).stale.len(), crate::cluster::MAX_STALE);
}
