//! One PostgreSQL cluster carried through the scenarios of its lifetime, as a chain: formation,
//! a 3 s stall of the primary, a switchover and its refusals, a failover and the old primary's
//! rejoin, a standby lost and back. Each step starts from the cluster the step before left, and the invariants are
//! checked between steps (one primary behind `-rw`, every standby streaming behind `-ro`, no
//! acknowledged write lost outside a failover of asynchronous replication); a failure names its
//! step. One cluster instead of four saves three formations on the 2-core machine.

use std::panic::AssertUnwindSafe;

use futures::FutureExt as _;

use super::*;

/// Runs the step `name` of the chain; a failure inside it panics naming the step.
async fn step<T>(number: usize, name: &str, body: impl std::future::Future<Output = T>) -> T {
    eprintln!("realpods-pg chain: step {number}, {name}");
    let started = Instant::now();
    match AssertUnwindSafe(body).catch_unwind().await {
        Ok(v) => {
            stateward_testkit::report::seconds(
                &format!("pg.chain.step_{number}.{name}"),
                started.elapsed(),
                None,
            );
            v
        }
        Err(cause) => {
            let why = cause
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| cause.downcast_ref::<&str>().map(|s| (*s).to_string()))
                .unwrap_or_default();
            panic!("chain step {number} ({name}) failed: {why}")
        }
    }
}

/// The invariants every step leaves: `n` instances, one primary behind `-rw`, the standbys
/// streaming behind `-ro`, and every write acknowledged so far (but `lost`) still there.
async fn invariants(
    env: &TestEnv,
    after: &str,
    acked: &[(u64, u64)],
    lost_before: &[u64],
) -> (String, Vec<String>) {
    let found = wait_replicated(env, "pg", 3, Duration::from_secs(180)).await;
    // The writer's table exists once a step has written.
    if !acked.is_empty() {
        let missing: Vec<u64> = lost(env, acked).into_iter().filter(|id| !lost_before.contains(id)).collect();
        assert!(missing.is_empty(), "after {after}: acknowledged writes gone: {missing:?}");
    }
    found
}

#[tokio::test]
async fn one_cluster_forms_rides_out_a_stall_switches_over_and_fails_over() {
    let Some((env, op)) = enter_with_operator("rp-pgchain", "realpods-pgchain").await else {
        return;
    };
    let env = &env;
    step(1, "formation", async {
        let created = Instant::now();
        available_only_when_streaming(env).await;
        let (primary, standbys, _) = make_cluster(env, "pg", 3, json!({})).await;
        formation(env, &primary, &standbys, created.elapsed()).await;
    })
    .await;
    let (primary, _) = invariants(env, "formation", &[], &[]).await;

    let mut acked = step(2, "stall", stall(env, &primary)).await;
    let (primary, standbys) = invariants(env, "the stall", &acked, &[]).await;

    acked.extend(step(3, "switchover", switchover(env, &primary, &standbys)).await);
    let (primary, _) = invariants(env, "the switchover", &acked, &[]).await;

    let lost_in_failover = step(4, "failover", failover(env, &primary)).await;
    let (_, standbys) = invariants(env, "the failover", &acked, &lost_in_failover).await;

    // [redundancy] must show 3 (see `copy_lost`): a standby's pod deleted.
    step(5, "standby lost", crate::copy_lost(env, POSTGRES, "pg", &standbys[0], "pg.standby_lost")).await;
    invariants(env, "the standby's loss", &acked, &lost_in_failover).await;

    step(6, "idle", idle(env, &op)).await;
    drop(op);
}

/// Step 6, [agent]'s steady state: see [`crate::idle`].
async fn idle(env: &TestEnv, op: &e2e::Operator) {
    crate::idle(env, POSTGRES, "pg", op, "pg").await;
}

/// How many standbys the primary behind `-rw` lists as streaming (for [`crate::ClientSampler`]).
const STREAMING: &str = "timeout 1 psql -h pg-rw -XAtc \"select count(*) from pg_stat_replication where state = '\\''streaming'\\''\" 2>/dev/null";

/// [redundancy] must show 1 for PostgreSQL (see [`crate::available_only_when`]): the client
/// counts the standbys streaming in the `pg_stat_replication` of the primary behind `-rw`.
async fn available_only_when_streaming(env: &TestEnv) {
    let created_ms = now_ms();
    e2e::apply(env, &env.namespace, &sample("PostgresCluster", "pg", PG_IMAGE, 3));
    super::super::apply_json(env, &[client_pod("pg")]);
    let promised = crate::Promised {
        count: STREAMING,
        want: 2,
        what: "both standbys streaming",
        figure: "pg.three_instances.available_after_create",
    };
    crate::available_only_when(env, POSTGRES, "pg", created_ms, Duration::from_secs(420), promised).await;
}

/// Must show 1: a three-instance cluster replicates. A row written through `-rw` is read
/// through `-ro` within a second; the primary's `pg_stat_replication` lists two streaming
/// standbys; each standby is in recovery; `-ro`'s endpoints are exactly the standbys and
/// `-rw`'s the primary.
async fn formation(env: &TestEnv, primary: &str, standbys: &[String], took: Duration) {
    eprintln!("realpods-pg: 3 instances replicating {took:.1?} after create: primary {primary}, standbys {standbys:?}");
    stateward_testkit::report::seconds("pg.three_instances.replicating_after_create", took, None);
    // Pod 0 made the cluster (initdb); the host's certificate, issued meanwhile, rolls the pods,
    // so another instance may be the primary by now (a clean failover: nothing lost).
    let events = cr_events(env, "pg").await;
    assert!(events.iter().any(|e| e.contains("PrimaryConfirmed: pg-0 is the first primary")), "{events:#?}");
    eprintln!("realpods-pg: events: {events:#?}");

    // Redundant once both standbys stream (a poll after), naming the two as streaming.
    let api = POSTGRES.api(env);
    let (cr, _) = wait_for("pg Redundant", Duration::from_secs(60), || {
        let api = api.clone();
        async move {
            let cr = get_cr(&api, "pg").await.ok_or("CR not found")?;
            match e2e::condition(&cr, "Redundant") {
                Some("True") => Ok(cr),
                _ => Err(summary(&cr)),
            }
        }
    })
    .await;
    assert_eq!(e2e::condition(&cr, "Available"), Some("True"), "{}", summary(&cr));
    assert_eq!(cr.pointer("/status/phase"), Some(&json!("Running")), "{}", summary(&cr));
    // The standbys say so themselves; the primary sees both streaming.
    for s in standbys {
        assert_eq!(psql_in(env, s, "select pg_is_in_recovery()"), "t", "{s}");
    }
    assert_eq!(psql_in(env, primary, "select pg_is_in_recovery()"), "f");
    let replication =
        psql_in(env, primary, "select application_name, state from pg_stat_replication order by 1");
    let streaming: Vec<&str> = replication
        .lines()
        .filter(|l| l.ends_with("|streaming"))
        .map(|l| l.split('|').next().unwrap_or(""))
        .collect();
    assert_eq!(streaming, standbys.iter().map(String::as_str).collect::<Vec<_>>(), "{replication}");
    let slots =
        psql_in(env, primary, "select slot_name || ':' || active from pg_replication_slots order by 1");
    eprintln!(
        "realpods-pg: pg_stat_replication on {primary}: {}; slots: {}",
        replication.replace('\n', ", "),
        slots.replace('\n', ", ")
    );
    assert_eq!(
        slots.lines().filter(|l| l.ends_with(":true")).count(),
        2,
        "a slot per standby, in use: {slots}"
    );

    // A row through -rw, read back through -ro. Both times are the servers' clocks (one machine):
    // a session on -ro already connected polls for the row inside the server, and the commit
    // time comes from the insert itself, so what is timed is replication, not psql start-ups.
    let out = client_sh(
        env,
        r#"wait_for() { i=0; until eval "$1"; do i=$((i + 1)); [ $i -lt 300 ] || { echo "timed out: $1" >&2; exit 1; }; sleep 0.05; done; }
        psql -h pg-rw -XAtqc 'create table if not exists probe(id int primary key)' &&
        wait_for 'psql -h pg-ro -XAtqc "select from probe limit 0" 2> /dev/null' &&
        rm -f /tmp/seen && (PGOPTIONS='-c statement_timeout=10s' psql -h pg-ro -XAtq -F ' ' \
            -c 'select 0' \
            -c 'do $$ begin while not exists (select 1 from probe where id = 42) loop perform pg_sleep(0.005); end loop; end $$' \
            -c 'select (extract(epoch from clock_timestamp()) * 1000)::bigint, pg_is_in_recovery()' > /tmp/seen &) &&
        wait_for '[ -s /tmp/seen ]' && sleep 0.2 &&
        committed=$(psql -h pg-rw -XAtqc 'insert into probe(id) values (42) returning (extract(epoch from clock_timestamp()) * 1000)::bigint') &&
        wait_for '[ "$(wc -l < /tmp/seen)" -ge 2 ]' &&
        tail -n 1 /tmp/seen | { read seen recovery; echo $((seen - committed)) $recovery; }"#,
    );
    let fields: Vec<&str> = out.split_whitespace().collect();
    let read_ms: i64 = fields[0].parse().expect("ms");
    eprintln!(
        "realpods-pg: a row committed through pg-rw was visible through pg-ro {read_ms} ms later (that reader in recovery: {})",
        fields[1]
    );
    // A figure, 1 s its target; the ceiling only says the row did reach the standby.
    stateward_testkit::report::millis("pg.read_through_ro_after_write", read_ms.max(0) as u64, 1_000);
    assert!(read_ms <= 10_000, "read through -ro {read_ms} ms after the write");
    assert_eq!(fields[1], "t", "-ro answered from a standby");
}

/// Must show 8: a 3 s stall of the primary under load (every postgres process of its
/// container stopped, then continued) does not fail over.
/// Returns the writes acknowledged meanwhile.
async fn stall(env: &TestEnv, primary: &str) -> Vec<(u64, u64)> {
    let api = POSTGRES.api(env);
    let before = get_cr(&api, "pg").await.expect("CR");
    let promotions = before.pointer("/status/promotions").cloned();
    // The certificate's roll may have failed over once already, before the stall.
    let failovers_before = cr_events(env, "pg").await.iter().filter(|e| e.contains("FailingOver")).count();
    start_writer(env);
    wait_acks(env, 200).await;
    let stalled_ms = now_ms();
    kubectl_ok(
        env,
        &[
            "exec", primary, "-c", "postgres", "--", "sh", "-c",
            "pids=$(for p in /proc/[0-9]*; do [ \"$(cat $p/comm 2>/dev/null)\" = postgres ] && echo ${p#/proc/}; done); \
             kill -STOP $pids; sleep 3; kill -CONT $pids",
        ],
    );
    // Well past failoverDelay (5 s) and a few polls.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let acked = client_sh(env, "cat /tmp/acks 2>/dev/null | wc -l").trim().parse::<usize>().unwrap_or(0);
    wait_acks(env, acked + 100).await;
    let acks = stop_writer(env);
    let (gap, gap_from) = write_gap(&acks);
    let cr = get_cr(&api, "pg").await.expect("CR");
    let events = cr_events(env, "pg").await;
    eprintln!(
        "realpods-pg: primary stalled 3 s under load: write gap {gap} ms (from {:.1} s after the stall began), \
         primary still {}, promotions {:?}",
        gap_from.saturating_sub(stalled_ms) as f64 / 1000.0,
        current_primary(&cr),
        cr.pointer("/status/promotions"),
    );
    assert_eq!(current_primary(&cr), primary, "no failover: {}", summary(&cr));
    assert_eq!(cr.pointer("/status/promotions").cloned(), promotions);
    assert_eq!(events.iter().filter(|e| e.contains("FailingOver")).count(), failovers_before, "{events:#?}");
    // No failover is asserted above (same primary, promotions, no FailingOver): the gap is the
    // stall's, a figure.
    stateward_testkit::report::millis("pg.stall_3s.write_gap", gap, 5_000);
    assert!(lost(env, &acks).is_empty());
    acks
}

/// Must show 3: a switchover (`stateward.dev/switchover-to`) under the same writer: the
/// primary stops cleanly, the standby is promoted, the write gap is short, no acknowledged write
/// is lost, and the old primary streams afterwards. Then one to a missing instance is refused
/// with the reason in status and a Warning Event, and one to a standby far behind the primary
/// (its WAL receiver stopped) is refused with the lag in status.
/// Returns the writes acknowledged meanwhile.
async fn switchover(env: &TestEnv, old: &str, standbys: &[String]) -> Vec<(u64, u64)> {
    let to = standbys[0].clone();
    let api = POSTGRES.api(env);
    start_writer(env);
    wait_acks(env, 200).await;
    let asked = Instant::now();
    kubectl_ok(
        env,
        &["annotate", "--overwrite", "postgrescluster", "pg", &format!("stateward.dev/switchover-to={to}")],
    );
    let (_, took) = wait_for("the switchover done", Duration::from_secs(90), || {
        let api = api.clone();
        let to = to.clone();
        async move {
            let cr = get_cr(&api, "pg").await.ok_or("CR not found")?;
            let (sto, phase, message) = switchover_status(&cr);
            if current_primary(&cr) == to && sto == to && phase == "Done" {
                Ok(())
            } else {
                Err(format!("{sto} {phase} {message}; {}", summary(&cr)))
            }
        }
    })
    .await;
    let acked = client_sh(env, "cat /tmp/acks 2>/dev/null | wc -l").trim().parse::<usize>().unwrap_or(0);
    wait_acks(env, acked + 200).await;
    let acks = stop_writer(env);
    let (gap, _) = write_gap(&acks);
    let lost = lost(env, &acks);
    let (primary, standbys) = wait_replicated(env, "pg", 3, Duration::from_secs(120)).await;
    eprintln!(
        "realpods-pg: switchover {old} -> {to} done {took:.1?} after the annotation; write gap {gap} ms; {} writes acknowledged, {} lost; \
         {old} streaming again {:.1?} after the annotation",
        acks.len(),
        lost.len(),
        asked.elapsed()
    );
    assert_eq!(primary, to);
    assert!(standbys.iter().any(|s| s == old), "{standbys:?}");
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    // The issue's target. `-rw` moves to the target in the plan that promotes it (1.3 s
    // measured beside other live tests, printed above; 3.6 to 7.3 s when it moved only after
    // the promotion's answer).
    stateward_testkit::report::millis_within_liveness("pg.switchover.write_gap", gap, 5_000);

    // A switchover to an instance that does not exist is refused, with the reason.
    kubectl_ok(
        env,
        &["annotate", "--overwrite", "postgrescluster", "pg", "stateward.dev/switchover-to=pg-7"],
    );
    let (message, _) = wait_for("the switchover to pg-7 refused", Duration::from_secs(60), || {
        let api = api.clone();
        async move {
            let cr = get_cr(&api, "pg").await.ok_or("CR not found")?;
            match switchover_status(&cr) {
                (to, phase, message) if to == "pg-7" && phase == "Refused" => Ok(message),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    // The Event follows the status write: wait for it rather than read once.
    let (events, _) = wait_for("the refusal's Event", Duration::from_secs(30), || async move {
        let events = cr_events(env, "pg").await;
        if events.iter().any(|e| e.starts_with("Warning SwitchoverRefused")) {
            Ok(events)
        } else {
            Err(format!("{events:?}"))
        }
    })
    .await;
    let refused: Vec<&String> =
        events.iter().filter(|e| e.starts_with("Warning SwitchoverRefused")).collect();
    eprintln!("realpods-pg: switchover to pg-7 refused: {message}; event: {refused:?}");
    assert!(message.contains("not an instance"), "{message}");
    assert_eq!(refused.len(), 1, "{events:#?}");
    assert_eq!(current_primary(&get_cr(&api, "pg").await.expect("CR")), to, "nothing moved");

    // Must show 7: one to a standby far behind is refused too. Its WAL receiver is stopped
    // (SIGSTOP) while the primary writes some 40 MB of WAL, more than the 16 MB allowed.
    let lagging = standbys.iter().find(|s| **s != to).expect("another standby").clone();
    let receiver = psql_in(env, &lagging, "select pid from pg_stat_wal_receiver");
    kubectl_ok(
        env,
        &["exec", &lagging, "-c", "postgres", "--", "sh", "-c", &format!("kill -STOP {receiver}")],
    );
    client_sh(env, "psql -h pg-rw -XAtqc 'create table ballast as select repeat(md5(i::text), 32) as x from generate_series(1, 40000) i'");
    // The polls (every 2 s) see the lag before the annotation is read.
    tokio::time::sleep(Duration::from_secs(5)).await;
    kubectl_ok(
        env,
        &[
            "annotate",
            "--overwrite",
            "postgrescluster",
            "pg",
            &format!("stateward.dev/switchover-to={lagging}"),
        ],
    );
    let refused = wait_for(&format!("the switchover to {lagging} refused"), Duration::from_secs(60), || {
        let api = api.clone();
        let lagging = lagging.clone();
        async move {
            let cr = get_cr(&api, "pg").await.ok_or("CR not found")?;
            match switchover_status(&cr) {
                (sto, phase, message) if sto == lagging && phase == "Refused" => Ok(message),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    kubectl_ok(
        env,
        &["exec", &lagging, "-c", "postgres", "--", "sh", "-c", &format!("kill -CONT {receiver}")],
    );
    eprintln!("realpods-pg: switchover to the lagging {lagging} refused: {}", refused.0);
    assert!(refused.0.contains("bytes behind the primary"), "{}", refused.0);
    // Its own Event, beside the first refusal's (one Event per distinct message).
    let (events, _) = wait_for("the lagging refusal's Event", Duration::from_secs(30), || async move {
        let events = cr_events(env, "pg").await;
        let refusals = events.iter().filter(|e| e.starts_with("Warning SwitchoverRefused")).count();
        if refusals >= 2 {
            Ok(events)
        } else {
            Err(format!("{events:?}"))
        }
    })
    .await;
    let refusals: Vec<&String> =
        events.iter().filter(|e| e.starts_with("Warning SwitchoverRefused")).collect();
    assert_eq!(refusals.len(), 2, "{events:#?}");
    assert!(refusals.iter().any(|e| e.contains("bytes behind the primary")), "{refusals:#?}");
    assert_eq!(current_primary(&get_cr(&api, "pg").await.expect("CR")), to, "nothing moved");
    // The refused request is withdrawn: the next steps start from a cluster nobody asked to move.
    kubectl_ok(env, &["annotate", "postgrescluster", "pg", "stateward.dev/switchover-to-"]);
    wait_replicated(env, "pg", 3, Duration::from_secs(120)).await;
    assert_eq!(current_primary(&get_cr(&api, "pg").await.expect("CR")), to, "nothing moved");
    acks
}

/// Must show 2: failover under write load. The primary's pod is deleted with
/// `--grace-period=0` while a writer commits through `-rw`; a standby is promoted after
/// `failoverDelay`, the write gap and the acknowledged writes lost (asynchronous replication)
/// are printed, and the former primary comes back as a streaming standby on the new timeline
/// after `pg_rewind` (its start log says so).
/// Returns the acknowledged writes lost (asynchronous replication may lose some).
async fn failover(env: &TestEnv, old: &str) -> Vec<u64> {
    let api = POSTGRES.api(env);
    let before = get_cr(&api, "pg").await.expect("CR");
    let timeline = before.pointer("/status/timeline").and_then(Value::as_u64).unwrap_or(0);
    let Failover { new, deleted, lost } = fail_over_under_writes(env, old, "asynchronous replication").await;

    // The former primary streams again, on the new timeline, after pg_rewind.
    let (primary, standbys) = wait_replicated(env, "pg", 3, Duration::from_secs(90)).await;
    let back = deleted.elapsed();
    assert_eq!(primary, new);
    assert!(standbys.iter().any(|s| s == old), "{standbys:?}");
    let cr = get_cr(&api, "pg").await.expect("CR");
    let new_timeline = cr.pointer("/status/timeline").and_then(Value::as_u64).unwrap_or(0);
    assert!(new_timeline > timeline, "timeline {timeline} -> {new_timeline}");
    assert_eq!(psql_in(env, old, "select pg_is_in_recovery()"), "t");
    let received_tli = psql_in(env, old, "select received_tli from pg_stat_wal_receiver");
    assert_eq!(received_tli, new_timeline.to_string(), "{old} streams on the new timeline");
    let startlog = kubectl_ok(
        env,
        &["exec", old, "-c", "postgres", "--", "cat", "/var/lib/postgresql/data/stateward.log"],
    );
    let rewind: Vec<&str> = startlog.lines().filter(|l| l.contains("pg_rewind")).collect();
    assert!(!rewind.is_empty(), "no pg_rewind in {old}'s start log:\n{startlog}");
    stateward_testkit::report::seconds("pg.failover.old_primary_back_as_standby", back, None);
    eprintln!(
        "realpods-pg: {old} back as a streaming standby on timeline {new_timeline} {back:.1?} after the delete; its start log:\n  {}",
        rewind.join("\n  ")
    );
    let events = cr_events(env, "pg").await;
    eprintln!(
        "realpods-pg: events: {:#?}",
        events.iter().filter(|e| !e.contains("SuccessfulCreate")).collect::<Vec<_>>()
    );
    lost
}
