//! Must show 6 and 5 on one cluster: a lost standby rejoins, and `-ro` sends nobody to it
//! before it streams; then 3 → 5 → 2 members, the primary moved off the highest ordinal before
//! the StatefulSet shrinks past it.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::json;
use stateward_testkit::TestEnv;

use super::*;

fn set_replicas(env: &TestEnv, n: u32) {
    kubectl_ok(
        env,
        &[
            "patch",
            "postgrescluster",
            "pg",
            "--type=merge",
            "-p",
            &format!(r#"{{"spec":{{"replicas":{n}}}}}"#),
        ],
    );
}

/// A standby deleted comes back as a new pod: it is behind `-ro` only while its server says it
/// streams (asked each time it is seen there), and it catches up with the primary.
async fn a_lost_standby_rejoins(env: &TestEnv, gone: &str) {
    start_writer(env);
    wait_acks(env, 200).await;
    let old_uid =
        pods(env, "pg").await.into_iter().find(|p| p.name == gone).map(|p| p.uid).expect("the standby's pod");
    let deleted = Instant::now();
    kubectl_ok(env, &["delete", "pod", gone, "--wait=false"]);
    // Polled until the new pod has been behind -ro three times, each checked streaming.
    let (mut seen_new, mut in_ro, mut left_ro) = (None, 0, None);
    while in_ro < 3 {
        assert!(deleted.elapsed() < Duration::from_secs(240), "{gone} not back behind pg-ro in 240 s");
        let ro = endpoint_pods(env, "pg-ro").await;
        if left_ro.is_none() && !ro.iter().any(|(n, _)| n == gone) {
            left_ro = Some(deleted.elapsed());
        }
        let now = pods(env, "pg").await;
        if seen_new.is_none() && now.iter().any(|p| p.name == gone && p.uid != old_uid) {
            seen_new = Some(deleted.elapsed());
        }
        if ro.iter().any(|(n, u)| n == gone && *u != old_uid) {
            let state = psql_in(
                env,
                gone,
                "select coalesce((select status from pg_stat_wal_receiver), 'none') || ' ' || pg_is_in_recovery()::text",
            );
            assert_eq!(state, "streaming true", "{gone} behind pg-ro while its server says {state:?}");
            if in_ro == 0 {
                eprintln!(
                    "realpods-pg: standby {gone} deleted: out of pg-ro after {:.1?}, its new pod seen after {:.1?}, \
                     behind pg-ro (streaming) after {:.1?}",
                    left_ro.unwrap_or_default(),
                    seen_new.unwrap_or_default(),
                    deleted.elapsed()
                );
            }
            in_ro += 1;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // It catches up: after the writer stops, it has every acknowledged row.
    let acks = stop_writer(env);
    let last = acks.iter().map(|(id, _)| *id).max().unwrap_or(0);
    let (_, took) = wait_for(&format!("{gone} has row {last}"), Duration::from_secs(60), || {
        let n = psql_in(env, gone, &format!("select count(*) from w where id = {last}"));
        async move {
            if n == "1" {
                Ok(())
            } else {
                Err(n)
            }
        }
    })
    .await;
    eprintln!(
        "realpods-pg: {gone} caught up: the last of {} acknowledged rows replayed {took:.1?} after the writer stopped",
        acks.len()
    );
    assert!(lost(env, &acks).is_empty());
}

#[tokio::test]
async fn a_lost_standby_rejoins_and_the_cluster_scales_three_five_two_around_its_primary() {
    let test_started = Instant::now();
    let Some((env, op)) = enter_with_operator("rp-pgscale", "realpods-pgscale").await else {
        return;
    };
    let (_, standbys, _) = make_cluster(&env, "pg", 3, json!({})).await;
    let api = POSTGRES.api(&env);

    // Must show 6.
    a_lost_standby_rejoins(&env, &standbys[0]).await;
    wait_replicated(&env, "pg", 3, Duration::from_secs(120)).await;

    // Must show 5: up to five, the new members cloned and streaming.
    let up = Instant::now();
    set_replicas(&env, 5);
    let (primary, standbys) = wait_replicated(&env, "pg", 5, Duration::from_secs(600)).await;
    eprintln!("realpods-pg: 3 -> 5 in {:.1?}: primary {primary}, standbys {standbys:?}", up.elapsed());
    for new in ["pg-3", "pg-4"] {
        let log = kubectl_ok(
            &env,
            &["exec", new, "-c", "postgres", "--", "cat", "/var/lib/postgresql/data/stateward.log"],
        );
        assert!(log.contains("cloned"), "{new} was not cloned with pg_basebackup:\n{log}");
    }

    // The primary onto the highest ordinal, then down to two under the writer.
    kubectl_ok(
        &env,
        &["annotate", "--overwrite", "postgrescluster", "pg", "stateward.dev/switchover-to=pg-4"],
    );
    wait_for("pg-4 the primary", Duration::from_secs(120), || {
        let api = api.clone();
        async move {
            let cr = get_cr(&api, "pg").await.ok_or("CR not found")?;
            if current_primary(&cr) == "pg-4" && switchover_status(&cr).1 == "Done" {
                Ok(())
            } else {
                Err(format!("{:?}; {}", switchover_status(&cr), summary(&cr)))
            }
        }
    })
    .await;
    wait_replicated(&env, "pg", 5, Duration::from_secs(120)).await;
    start_writer(&env);
    wait_acks(&env, 200).await;
    let down = Instant::now();
    set_replicas(&env, 2);
    let (mut most_rw, mut polls_without_rw, mut polls, mut held) = (0, 0, 0, 0);
    let statefulsets: Api<k8s_openapi::api::apps::v1::StatefulSet> = env.api();
    let kept: BTreeSet<String> = ["pg-0", "pg-1"].map(String::from).into();
    loop {
        assert!(down.elapsed() < Duration::from_secs(420), "5 -> 2 not done in 420 s");
        let rw = endpoints(&env, "pg-rw").await;
        most_rw = most_rw.max(rw.len());
        polls += 1;
        if rw.is_empty() {
            polls_without_rw += 1;
        }
        let cr = get_cr(&api, "pg").await.expect("CR");
        let primary = current_primary(&cr);
        let now = pods(&env, "pg").await;
        let sts_replicas = statefulsets.get("pg").await.ok().and_then(|s| s.spec).and_then(|s| s.replicas);
        if primary == "pg-4" && sts_replicas == Some(5) {
            held += 1;
        }
        for p in &now {
            assert!(
                !(p.deleting && p.name == primary && !kept.contains(&p.name)),
                "the primary {primary} is being removed: {}",
                summary(&cr)
            );
        }
        if !primary.is_empty() && !now.iter().any(|p| p.name == primary) {
            panic!("the primary {primary} has no pod: {}", summary(&cr));
        }
        let names: BTreeSet<String> = now.iter().map(|p| p.name.clone()).collect();
        if names == kept && kept.contains(&primary) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (primary, _) = wait_replicated(&env, "pg", 2, Duration::from_secs(180)).await;
    let took = down.elapsed();
    let acked = client_sh(&env, "cat /tmp/acks 2>/dev/null | wc -l").trim().parse::<usize>().unwrap_or(0);
    wait_acks(&env, acked + 100).await;
    let acks = stop_writer(&env);
    let (gap, _) = write_gap(&acks);
    let lost = lost(&env, &acks);
    let moved = switchover_status(&get_cr(&api, "pg").await.expect("CR"));
    eprintln!(
        "realpods-pg: 5 -> 2 with the primary on pg-4: {primary} primary, done in {took:.1?}; write gap {gap} ms; \
         {} writes acknowledged, {} lost; pg-rw had at most {most_rw} endpoint(s), none in {polls_without_rw} of {polls} polls; the StatefulSet held at 5 while pg-4 was the primary in {held} polls; \
         the switchover: {moved:?}",
        acks.len(),
        lost.len()
    );
    assert!(
        kept.contains(&moved.0) && moved.1 == "Done",
        "a switchover off pg-4 to a member that stays: {moved:?}"
    );
    assert!(held > 0, "the StatefulSet was never seen held while pg-4 was the primary");
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    assert!(most_rw <= 1, "two writers behind pg-rw");
    stateward_testkit::report::millis_within_liveness("pg.scale_and_standby_loss.write_gap", gap, 10_000);
    eprintln!("realpods-pg: scale and standby-loss test took {:.1?}", test_started.elapsed());
    drop(op);
}
