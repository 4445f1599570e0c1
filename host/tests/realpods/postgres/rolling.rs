//! Must show 4: a change that needs a restart (`shared_buffers`) rolls the members one at a
//! time, standbys first, then a switchover to an updated standby, the old primary last.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;

use super::*;

#[tokio::test]
async fn a_restart_requiring_change_rolls_standbys_first_then_switches_over_then_the_old_primary() {
    let test_started = Instant::now();
    let Some((env, op)) = enter_with_operator("rp-pgroll", "realpods-pgroll").await else {
        return;
    };
    let (old_primary, _, _) = make_cluster(&env, "pg", 3, json!({})).await;
    let api = POSTGRES.api(&env);
    let before: BTreeMap<String, String> =
        pods(&env, "pg").await.into_iter().map(|p| (p.name, p.uid)).collect();
    start_writer(&env);
    wait_acks(&env, 200).await;

    let started = Instant::now();
    kubectl_ok(
        &env,
        &[
            "patch",
            "postgrescluster",
            "pg",
            "--type=merge",
            "-p",
            r#"{"spec":{"parameters":{"shared_buffers":"96MB"}}}"#,
        ],
    );
    // Polled until every member is a new pod, Ready: the order pods went away in, how many
    // members were away at once, and how many pods -rw had.
    let (mut order, mut most_down, mut most_rw) = (Vec::<String>::new(), 0, 0);
    // The pods replaced when the primary moved (the status says when).
    let mut replaced_before_switchover = None;
    loop {
        assert!(started.elapsed() < Duration::from_secs(600), "the roll not done in 600 s: {order:?}");
        let now = pods(&env, "pg").await;
        let mut down = 0;
        for (name, uid) in &before {
            let p = now.iter().find(|p| p.name == *name);
            let replaced = p.is_none_or(|p| p.deleting || p.uid != *uid);
            if replaced && !order.contains(name) {
                order.push(name.clone());
            }
            if p.is_none_or(|p| p.deleting || !p.ready) {
                down += 1;
            }
        }
        most_down = most_down.max(down);
        most_rw = most_rw.max(endpoints(&env, "pg-rw").await.len());
        let cr = get_cr(&api, "pg").await.expect("CR");
        let primary = current_primary(&cr);
        if replaced_before_switchover.is_none() && !primary.is_empty() && primary != old_primary {
            replaced_before_switchover = Some(order.clone());
        }
        let all_new = before.iter().all(|(n, u)| now.iter().any(|p| p.name == *n && p.uid != *u && p.ready));
        if all_new && order.len() == before.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let rolled = started.elapsed();
    let (primary, _) = wait_replicated(&env, "pg", 3, Duration::from_secs(180)).await;
    let acked = client_sh(&env, "cat /tmp/acks 2>/dev/null | wc -l").trim().parse::<usize>().unwrap_or(0);
    wait_acks(&env, acked + 100).await;
    let acks = stop_writer(&env);
    let mut gaps: Vec<u64> = acks.windows(2).map(|w| w[1].1 - w[0].1).collect();
    gaps.sort_unstable_by(|a, b| b.cmp(a));
    let lost = lost(&env, &acks);
    eprintln!(
        "realpods-pg: shared_buffers rolled in {rolled:.1?}: pods replaced in the order {order:?} (primary was {old_primary}, \
         now {primary}; replaced before the switchover: {replaced_before_switchover:?}); at most {most_down} member(s) away at once; pg-rw at most {most_rw} pod(s); write gaps \
         (longest first) {:?} ms; {} writes acknowledged, {} lost",
        &gaps[..gaps.len().min(4)],
        acks.len(),
        lost.len()
    );
    for p in before.keys() {
        assert_eq!(psql_in(&env, p, "show shared_buffers"), "96MB", "{p} runs the new setting");
    }
    assert_eq!(order.last(), Some(&old_primary), "the old primary last: {order:?}");
    assert_eq!(most_down, 1, "one member away at a time");
    assert!(most_rw <= 1, "two writers behind pg-rw");
    assert!(primary != old_primary, "a switchover to an updated standby");
    let standbys: Vec<String> = order.iter().filter(|p| **p != old_primary).cloned().collect();
    assert_eq!(
        replaced_before_switchover,
        Some(standbys),
        "every standby replaced before the switchover, the primary after"
    );
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    // The one gap is the switchover's, within the issue's 5 s (as in the switchover test); no
    // other restart stops the writer for long.
    stateward_testkit::report::millis_within_liveness("pg.roll.write_gap", gaps[0], 5_000);
    stateward_testkit::report::millis_within_liveness(
        "pg.roll.second_write_gap",
        gaps.get(1).copied().unwrap_or(0),
        3_000,
    );
    eprintln!("realpods-pg: rolling test took {:.1?}", test_started.elapsed());
    drop(op);
}
