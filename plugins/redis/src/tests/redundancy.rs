//! Redundancy: `Redundant`, and creation held at `Pending` until the replicas are linked.

use super::*;
use crate::cluster::SLOTS;

const IDS: [&str; 6] = [
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
    "cccccccccccccccccccccccccccccccccccccccc",
    "dddddddddddddddddddddddddddddddddddddddd",
    "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee",
    "ffffffffffffffffffffffffffffffffffffffff",
];

/// Pod `cache-<i>` at 10.0.0.<i+1>, its server running, Ready or not.
fn pod(i: usize, ready: bool) -> Value {
    let mut pod = super::cluster::cluster_pod(i, &format!("10.0.0.{}", i + 1));
    pod["status"]["conditions"][0]["status"] = json!(if ready { "True" } else { "False" });
    pod
}

/// The offset every master of [`answer`] is at.
const MASTER_OFFSET: u64 = 50 * 1024 * 1024;

/// What pod `i` of a formed 3 × 1 cluster answers (cache-3..5 follow cache-0..2); `linked`:
/// whether replica `i`'s own server says its link is up; `behind`: how many bytes replica `i`
/// is behind its master.
fn answer(i: usize, linked: &[bool; 6], behind: &[u64; 6]) -> String {
    let slots = ["0-5460", "5461-10922", "10923-16383"];
    let nodes: String = (0..6)
        .map(|n| {
            let myself = if n == i { "myself," } else { "" };
            let (role, master, served) =
                if n < 3 { ("master", "-", slots[n]) } else { ("slave", IDS[n - 3], "") };
            format!(
                "{} 10.0.0.{}:6379@16379 {myself}{role} {master} 0 1 1 connected {served}\n",
                IDS[n],
                n + 1
            )
        })
        .collect();
    let link = if i >= 3 {
        format!(
            "role:slave\r\nmaster_link_status:{}\r\nslave_repl_offset:{}\r\nmaster_repl_offset:{MASTER_OFFSET}\r\n",
            if linked[i] { "up" } else { "down" },
            MASTER_OFFSET - behind[i]
        )
    } else {
        format!("role:master\r\nmaster_repl_offset:{MASTER_OFFSET}\r\n")
    };
    format!("cluster_state:ok\r\ncluster_slots_assigned:{SLOTS}\r\ncluster_slots_ok:{SLOTS}\r\ncluster_known_nodes:6\r\n{nodes}# Replication\r\n{link}")
}

/// A cluster-mode resource of 3 shards × 1 replica, `spec.replicas` unset, whose status says
/// `status`, every pod Ready unless in `not_ready`, answering with `linked`.
fn reconcile(status: Value, linked: [bool; 6], not_ready: &[usize]) -> stateward_sdk::Plan {
    reconcile_spec(json!({}), status, linked, not_ready, [0; 6])
}

/// [`reconcile`] with `extra` merged into the spec.
fn reconcile_spec(
    extra: Value,
    status: Value,
    linked: [bool; 6],
    not_ready: &[usize],
    behind: [u64; 6],
) -> stateward_sdk::Plan {
    let mut cr = tk::cr("RedisCluster", "cache", spec());
    for (k, v) in extra.as_object().unwrap() {
        cr["spec"][k] = v.clone();
    }
    cr["spec"].as_object_mut().unwrap().remove("replicas");
    cr["spec"]["mode"] = json!("cluster");
    cr["spec"]["cluster"] = json!({ "shards": 3, "replicasPerShard": 1 });
    cr["status"] = status;
    let applied = tk::applied(&Redis::reconcile(tk::observed(&cr, &[])).unwrap());
    let mut children = tk::with_sts_status(&applied, 6, 6, 6, ("r1", "r1"));
    children.extend((0..6).map(|i| pod(i, !not_ready.contains(&i))));
    let mut o = tk::observed(&cr, &children);
    for i in 0..6 {
        o.responses.push(stateward_sdk::Response {
            id: format!("cluster-cache-{i}-cache-{i}--r0"),
            code: Some(0),
            stdout: answer(i, &linked, &behind),
            ..Default::default()
        });
    }
    Redis::reconcile(o).unwrap()
}

fn redundant(p: &stateward_sdk::Plan) -> (String, String, String) {
    let c = p.status.conditions.iter().find(|c| c.type_ == "Redundant").unwrap();
    (format!("{:?}", c.status), c.reason.clone(), c.message.clone())
}

/// The replicas of a new cluster link seconds after its servers answer: until then it is
/// Pending and not Available, with the replicas not linked named; then Running, Available and
/// Redundant. Once Running, losing a replica's link changes Redundant only.
#[test]
fn a_new_cluster_is_available_only_once_every_replica_is_linked() {
    let forming = json!({ "phase": "Pending", "cluster": { "formed": true, "formation": "Formed" } });
    let p = reconcile(forming.clone(), [true, true, true, false, true, false], &[]);
    assert_eq!(p.status.phase, stateward_sdk::Phase::Pending);
    assert_eq!(tk::condition(&p, "Available"), ("False".into(), "AwaitingRedundancy".into()));
    let (status, reason, message) = redundant(&p);
    assert_eq!((status.as_str(), reason.as_str()), ("False", "CopiesMissing"));
    assert!(message.contains("cache-3's link to cache-0 is down"), "{message}");
    assert!(message.contains("cache-5's link to cache-2 is down"), "{message}");
    assert!(!message.contains("cache-4"), "{message}");
    assert_eq!(tk::extra(&p)["cluster"]["replicasLinked"], false);

    let p = reconcile(forming.clone(), [true; 6], &[4]);
    assert_eq!(
        p.status.phase,
        stateward_sdk::Phase::Pending,
        "a replica not Ready holds no copy to count on"
    );
    assert!(redundant(&p).2.contains("cache-4 is not ready"), "{:?}", redundant(&p));

    // A user who asks not to wait gets Running as soon as the pods are ready.
    let unwaited =
        reconcile_spec(json!({ "waitForRedundancy": false }), forming.clone(), [false; 6], &[], [0; 6]);
    assert_eq!(unwaited.status.phase, stateward_sdk::Phase::Running);
    assert_eq!(redundant(&unwaited).0, "False", "and still the truth about redundancy");

    let p = reconcile(forming, [true; 6], &[]);
    assert_eq!(p.status.phase, stateward_sdk::Phase::Running);
    assert_eq!(tk::condition(&p, "Available").0, "True");
    assert_eq!(redundant(&p).0, "True");
    assert_eq!(tk::extra(&p)["cluster"]["replicasLinked"], true);

    let running = json!({ "phase": "Running", "cluster": { "formed": true, "formation": "Formed" } });
    let p = reconcile(running, [true, true, true, true, false, true], &[]);
    assert_eq!(p.status.phase, stateward_sdk::Phase::Running);
    assert_eq!(tk::condition(&p, "Available").0, "True", "Available keeps meaning the service answers");
    assert_eq!(redundant(&p).0, "False");
    assert!(redundant(&p).2.contains("cache-4's link to cache-1 is down"), "{:?}", redundant(&p));
}

/// A linked replica counts only once it has caught up with its master's offset: 4 MiB behind
/// holds a new cluster at Pending; once Redundant, the same lag keeps it (hysteresis) and
/// 20 MiB turns it False, naming the replica and its master.
#[test]
fn a_cluster_replica_counts_once_caught_up_with_its_master() {
    const MIB: u64 = 1024 * 1024;
    let forming = json!({ "phase": "Pending", "cluster": { "formed": true, "formation": "Formed" } });
    let p = reconcile_spec(json!({}), forming.clone(), [true; 6], &[], [0, 0, 0, 0, 4 * MIB, 0]);
    assert_eq!(p.status.phase, stateward_sdk::Phase::Pending);
    let (status, reason, message) = redundant(&p);
    assert_eq!((status.as_str(), reason.as_str()), ("False", "CopiesMissing"));
    assert_eq!(message, format!("cache-4 is {} bytes behind cache-1", 4 * MIB));
    let p = reconcile_spec(json!({}), forming, [true; 6], &[], [0, 0, 0, 0, 512 * 1024, 0]);
    assert_eq!((p.status.phase, redundant(&p).0.as_str()), (stateward_sdk::Phase::Running, "True"));

    let redundant_status = json!({
        "phase": "Running",
        "cluster": { "formed": true, "formation": "Formed" },
        "conditions": [{ "type": "Redundant", "status": "True", "reason": "Redundant", "message": "" }],
    });
    let p = reconcile_spec(json!({}), redundant_status.clone(), [true; 6], &[], [0, 0, 0, 0, 4 * MIB, 0]);
    assert_eq!(redundant(&p).0, "True", "a lag under the fallen-behind bound does not flap it");
    let p = reconcile_spec(json!({}), redundant_status, [true; 6], &[], [0, 0, 0, 20 * MIB, 0, 0]);
    assert_eq!(redundant(&p).0, "False");
    assert_eq!(redundant(&p).2, format!("cache-3 is {} bytes behind cache-0", 20 * MIB));
}

/// Replication mode: the master's replicas linked and caught up; a standalone server promises
/// no copy, so it waits for none.
#[test]
fn replication_counts_linked_caught_up_replicas_and_standalone_promises_none() {
    use crate::redundancy::{replication, Pod};
    use crate::roles::{decide, Info, Member};
    let info = |role: &str, link: bool, offset: u64| Info {
        role: role.into(),
        master_host: if role == "slave" { "cache-0.cache-headless".into() } else { String::new() },
        link_up: link,
        offset,
        used_memory: 1,
        ..Info::default()
    };
    let member =
        |pod: &str, i: Option<Info>| Member { pod: pod.into(), server: i.map(Ok), ..Member::default() };
    let pods: Vec<Pod> =
        (0..3).map(|i| Pod { name: format!("cache-{i}"), ready: true, asked: true }).collect();
    let verdict = |members: &[Member]| {
        let d = decide(members, Some("cache-0"));
        replication(&pods, members, &d, &stateward_sdk::redundancy::promised("cache", 3), false)
    };
    let mb = 1024 * 1024;
    let all = [
        member("cache-0", Some(info("master", false, 10 * mb))),
        member("cache-1", Some(info("slave", true, 10 * mb))),
        member("cache-2", Some(info("slave", true, 10 * mb - 100))),
    ];
    assert_eq!(verdict(&all).verdict, stateward_sdk::redundancy::Verdict::Redundant);
    let mut down = all.clone();
    down[2] = member("cache-2", Some(info("slave", false, 0)));
    let r = verdict(&down);
    assert!(r.message.contains("cache-2's link to cache-0 is down"), "{r:?}");
    let mut behind = all.clone();
    behind[1] = member("cache-1", Some(info("slave", true, 5 * mb)));
    assert!(verdict(&behind).message.contains("cache-1 is 5242880 bytes behind"), "{:?}", verdict(&behind));
    let mut silent = all.clone();
    silent[2] = member("cache-2", None);
    assert_eq!(verdict(&silent).verdict, stateward_sdk::redundancy::Verdict::Unknown);
    // A replica whose pod is gone (deleted, not created again yet) is named.
    let d = decide(&all[..2], Some("cache-0"));
    let gone =
        replication(&pods[..2], &all[..2], &d, &stateward_sdk::redundancy::promised("cache", 3), false);
    assert!(gone.message.ends_with("cache-2 does not exist"), "{gone:?}");

    let mut cr = tk::cr("RedisCluster", "cache", spec());
    cr["spec"]["replicas"] = json!(1);
    cr["spec"]["mode"] = json!("standalone");
    cr["status"] = json!({ "phase": "Pending" });
    let applied = tk::applied(&Redis::reconcile(tk::observed(&cr, &[])).unwrap());
    let mut children = tk::with_sts_status(&applied, 1, 1, 1, ("r1", "r1"));
    children.push(pod(0, true));
    let p = Redis::reconcile(tk::observed(&cr, &children)).unwrap();
    assert_eq!(p.status.phase, stateward_sdk::Phase::Running, "one server waits for no replica");
    assert_eq!(redundant(&p).1, "SingleMember");
}

/// Cluster mode without `spec.replicas` forms shards × (1 + replicasPerShard) pods; a value
/// that does not match is refused with the field; other modes keep 3, as stored objects say.
#[test]
fn cluster_mode_derives_its_pod_count_and_other_modes_keep_three() {
    let mut cr = tk::cr("RedisCluster", "cache", spec());
    cr["spec"].as_object_mut().unwrap().remove("replicas");
    cr["spec"]["mode"] = json!("cluster");
    cr["spec"]["cluster"] = json!({ "shards": 4, "replicasPerShard": 2 });
    assert_eq!(Redis::validate(&cr.to_string(), None), vec![]);
    assert_eq!(tk::find(&plan(&cr), "StatefulSet")["spec"]["replicas"], 12);
    let mut big = cr.clone();
    big["spec"]["cluster"] = json!({ "shards": 20, "replicasPerShard": 2 });
    let errs = Redis::validate(&big.to_string(), None);
    assert!(errs.iter().any(|e| e.path == "spec.replicas" && e.message.contains("60 members")), "{errs:?}");
    let mut replication = tk::cr("RedisCluster", "cache", spec());
    replication["spec"].as_object_mut().unwrap().remove("replicas");
    assert_eq!(tk::find(&plan(&replication), "StatefulSet")["spec"]["replicas"], 3);
    assert_eq!(tk::extra(&plan(&replication))["mode"], "replication");
    // Removing the number may not scale behind the admission rules' back.
    let mut five = tk::cr("RedisCluster", "cache", spec());
    five["spec"]["replicas"] = json!(5);
    let errs = Redis::validate(&replication.to_string(), Some(&five.to_string()));
    assert!(errs.iter().any(|e| e.path == "spec.replicas" && e.message.contains("from 5 to 3")), "{errs:?}");
    let schema: Value = serde_json::from_str(&Redis::info().kinds[0].versions[1].schema).unwrap();
    assert!(
        schema.pointer("/properties/spec/properties/replicas/default").is_none(),
        "the CRD sets no default"
    );
}
