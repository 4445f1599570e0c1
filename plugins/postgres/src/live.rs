//! What the running servers say (WIT 0.2 requests), and what the plugin does about it.
//!
//! Every instance is asked with `psql` over the pod's own socket every [`POLL_MS`]: whether it
//! is in recovery, its WAL positions and timeline, whether its WAL receiver streams, the
//! standbys a primary serves, and its connections against `max_connections`. The answers, the
//! pods and what the plugin wrote in status last time go to [`crate::ha::decide`]; its decision
//! becomes the topology ConfigMap the pods start from, the role labels the Services select on,
//! one-shot promotions and stops, status fields, conditions and events.

use serde_json::{json, Value};
use stateward_sdk::builders::Ctx;
use stateward_sdk::fence;
use stateward_sdk::json::fnv1a;
use stateward_sdk::live::{
    failure, poll_exec, response, Live, LiveInput, PodView, Reading, Threshold, NO_ANSWER_YET,
};
use stateward_sdk::{Action, ExecRequest, ObjectRef, PodLabels, RequestMode, Response};

use crate::bootstrap::slot_name;
use crate::ha::{self, Answers, Member, Request, Settings, Standby, State, Stats};
use crate::{app, spec, topology, PGDATA};

/// How often each instance is asked: failover decisions rest on these answers (and on the
/// pods, which the host watches), so it is short.
pub const POLL_MS: u64 = 2_000;
const TIMEOUT_MS: u32 = 5_000;
/// A promotion waits for the end of recovery (`pg_promote(true, 30)`).
const PROMOTE_TIMEOUT_MS: u32 = 45_000;
/// A fast shutdown waits for its checkpoint and for the standbys to receive it.
const STOP_TIMEOUT_MS: u32 = 90_000;
/// The label the Services select on.
pub const ROLE_LABEL: &str = "stateward.dev/role";
/// The annotation naming an instance to switch over to.
pub const SWITCHOVER_ANNOTATION: &str = "stateward.dev/switchover-to";
/// A switchover target further behind the primary than this is refused.
pub const MAX_SWITCHOVER_LAG_BYTES: u64 = 16 * 1024 * 1024;

/// One line, `|`-separated: in recovery (t/f), client connections, max_connections, WAL
/// received (standby) or written (primary), WAL replayed, timeline, the WAL receiver's status,
/// and on a primary its standbys as `name:state:sync_state:lag bytes`, comma-separated.
pub const STATS_SQL: &str = "select pg_is_in_recovery(), \
     (select count(*) from pg_stat_activity where backend_type = 'client backend'), \
     current_setting('max_connections')::int, \
     case when pg_is_in_recovery() \
       then coalesce(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn()) else pg_current_wal_lsn() end, \
     case when pg_is_in_recovery() then pg_last_wal_replay_lsn() else pg_current_wal_lsn() end, \
     case when pg_is_in_recovery() \
       then coalesce((select received_tli from pg_stat_wal_receiver), (select timeline_id from pg_control_checkpoint())) \
       else ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int end, \
     coalesce((select status from pg_stat_wal_receiver), ''), \
     case when pg_is_in_recovery() then '' else coalesce((select string_agg(application_name || ':' || \
       coalesce(state, '') || ':' || coalesce(sync_state, '') || ':' || \
       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)::bigint, -1), ',' order by application_name) \
       from pg_stat_replication), '') end, \
     current_setting('default_transaction_read_only'), \
     (select system_identifier from pg_control_system())";

/// On a primary (nothing on a standby): a physical slot for each of `standbys`, and none left
/// of ours that names no standby (a slot nobody uses keeps WAL forever).
pub fn slots_sql(standbys: &[String]) -> String {
    let want: Vec<String> = standbys.iter().map(|s| format!("'{}'", slot_name(s))).collect();
    format!(
        "DO $$ DECLARE want text[] := ARRAY[{}]::text[]; BEGIN \
         IF pg_is_in_recovery() THEN RETURN; END IF; \
         PERFORM pg_create_physical_replication_slot(w, true) FROM unnest(want) w \
           WHERE w NOT IN (SELECT slot_name FROM pg_replication_slots); \
         PERFORM pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
           WHERE slot_name LIKE '{}%' AND slot_type = 'physical' AND NOT active AND NOT (slot_name = ANY (want)); \
         END $$",
        want.join(", "),
        crate::bootstrap::SLOT_PREFIX.replace('_', "\\_"),
    )
}

/// Connections in use above 95 % of `max_connections` on three answers in a row.
pub const CONNECTIONS: Threshold = Threshold { key: "connections", reason: "ConnectionsNearLimit", times: 3 };
const CONNECTIONS_LIMIT_PERCENT: f64 = 95.0;

/// A WAL position (`0/3000148`) as a byte number.
pub fn parse_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.trim().split_once('/')?;
    Some((u64::from_str_radix(hi, 16).ok()? << 32) | u64::from_str_radix(lo, 16).ok()?)
}

/// A byte number as a WAL position.
pub fn lsn_text(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xFFFF_FFFF)
}

/// The stats line of an answer (the last line that parses).
pub fn parse(stdout: &str) -> Option<Stats> {
    stdout.lines().rev().find_map(parse_line)
}

fn parse_line(line: &str) -> Option<Stats> {
    let f: Vec<&str> = line.trim().split('|').collect();
    if f.len() < 8 {
        return None;
    }
    let in_recovery = match f[0] {
        "t" => true,
        "f" => false,
        _ => return None,
    };
    let number = |s: &str| s.trim().parse::<f64>().ok().map(|n| n.max(0.0) as u64);
    let standbys = f[7]
        .split(',')
        .filter(|s| !s.is_empty())
        .filter_map(|s| {
            let mut p = s.split(':');
            Some(Standby {
                name: p.next()?.to_string(),
                state: p.next()?.to_string(),
                sync_state: p.next()?.to_string(),
                lag_bytes: p.next()?.parse().ok()?,
            })
        })
        .collect();
    Some(Stats {
        in_recovery,
        connections: number(f[1])?,
        max_connections: number(f[2])?,
        received: if f[3].is_empty() { 0 } else { parse_lsn(f[3])? },
        replayed: if f[4].is_empty() { 0 } else { parse_lsn(f[4])? },
        timeline: f[5].trim().parse().ok()?,
        streaming: f[6].trim() == "streaming",
        // (Absent from an answer to an earlier build's poll.)
        read_only: f.get(8).is_some_and(|v| v.trim() == "on"),
        system_id: f.get(9).map(|v| v.trim().to_string()).unwrap_or_default(),
        standbys,
    })
}

/// The poll of one incarnation of a pod (a new pod, or a restarted container, is asked anew).
pub fn request_id(pod: &PodView) -> String {
    format!("stats-{}-{}-r{}", pod.name, ha::short_uid(&pod.uid), pod.restarts)
}

fn psql(commands: &[&str]) -> Vec<String> {
    let mut argv: Vec<String> =
        ["psql", "--username=postgres", "--no-psqlrc", "--quiet", "--tuples-only", "--no-align"]
            .iter()
            .map(|s| (*s).to_string())
            .collect();
    for c in commands {
        argv.push("--command".into());
        argv.push((*c).to_string());
    }
    argv
}

fn once(id: &str, pod: &str, command: Vec<String>, timeout_ms: u32) -> Action {
    Action::Exec(ExecRequest {
        id: id.to_string(),
        mode: RequestMode::Once,
        pod: pod.to_string(),
        container: "postgres".into(),
        command,
        stdin: None,
        timeout_ms,
    })
}

/// The promotion of `pod`: ends its recovery (waiting for it), checkpoints, makes the slots of
/// the others, and answers with its stats as a primary.
fn promote(ctx: &Ctx, pod: &str, id: &str) -> Action {
    let slots = slots_sql(&standbys_of(ctx, pod));
    // The checkpoint writes the new timeline to the control file, where pg_rewind of a former
    // primary reads it.
    once(
        id,
        pod,
        psql(&["select pg_promote(true, 30)", "CHECKPOINT", slots.as_str(), STATS_SQL]),
        PROMOTE_TIMEOUT_MS,
    )
}

/// `synchronous_standby_names` on the primary `m`, through `ALTER SYSTEM` and a reload, once per
/// incarnation of the primary and value (the id names both): every new primary gets it as soon
/// as it is confirmed, and a change of the spec or of the members reaches the running primary
/// without a restart. Not in the generated postgresql.conf: that file is part of the pods'
/// configuration hash, and the list of members changes with every scale, which would roll them.
/// The standbys' copies (cloned with the primary's `postgresql.auto.conf`) only matter once one
/// is promoted, and it is set again then.
fn synchronous_names(m: &Member, names: &str) -> Action {
    let set = if names.is_empty() {
        "ALTER SYSTEM RESET synchronous_standby_names".to_string()
    } else {
        format!("ALTER SYSTEM SET synchronous_standby_names = '{}'", names.replace('\'', "''"))
    };
    let id = format!("sync-{}-{}", m.incarnation().replace('@', "-"), fnv1a(names.as_bytes()));
    once(&id, &m.pod, psql(&[set.as_str(), "SELECT pg_reload_conf()"]), TIMEOUT_MS)
}

/// The pods of the cluster other than `pod` that should stream from it.
fn standbys_of(ctx: &Ctx, pod: &str) -> Vec<String> {
    (0..ctx.cluster.spec.replicas).map(|i| ctx.pod(i)).filter(|p| p != pod).collect()
}

/// The answer of `m`'s incarnation: the newer of its poll and of its promotion's stats.
fn member(
    pod: &PodView,
    update_revision: Option<&str>,
    responses: &[Response],
    promote: Option<&Response>,
) -> (Member, bool) {
    let poll = response(responses, &request_id(pod));
    let promoted = promote.filter(|p| p.succeeded() && parse(&p.stdout).is_some());
    let latest = match (poll, promoted) {
        (Some(p), Some(q)) if q.started_at_ms > p.started_at_ms => Some(q),
        (Some(p), _) => Some(p),
        (None, q) => q,
    };
    let answer = latest.map(|r| match parse(&r.stdout).filter(|_| r.succeeded()) {
        Some(s) => Ok(s),
        None => Err(failure(r, "psql")),
    });
    let m = Member {
        pod: pod.name.clone(),
        uid: pod.uid.clone(),
        ready: pod.ready,
        running: pod.can_exec("postgres"),
        deleting: pod.deleting,
        restarts: pod.restarts,
        outdated: update_revision.is_some_and(|r| !pod.revision.is_empty() && pod.revision != r),
        answer,
    };
    // Keep the promotion's answer while it is the newest word of this server.
    let keep_promote = promoted.filter(|q| poll.is_none_or(|p| p.started_at_ms <= q.started_at_ms)).is_some();
    (m, keep_promote)
}

pub fn live(ctx: &Ctx, input: &LiveInput) -> Live {
    let mut live = Live::default();
    let prev = State::from_status(input.status, &ctx.pod(0));
    let settings = Settings {
        failover_delay_ms: spec::failover_delay_s(input.resource) * 1000,
        replicas: ctx.cluster.spec.replicas,
        max_switchover_lag_bytes: MAX_SWITCHOVER_LAG_BYTES,
        revision_known: input.update_revision.is_some(),
    };
    let mut members = Vec::new();
    let mut keep = Vec::new();
    for pod in &input.pods {
        let revision = input.update_revision.as_deref();
        let (placeholder, _) = member(pod, revision, input.responses, None);
        let promote_id = ha::promote_id(&placeholder, prev.epoch);
        let (m, kept) = member(pod, revision, input.responses, response(input.responses, &promote_id));
        if kept {
            keep.push((pod.name.clone(), promote_id));
        }
        members.push(m);
    }
    let answers = Answers {
        answered: input
            .responses
            .iter()
            .filter(|r| r.id.starts_with("switchover-") || r.id.starts_with("promote-"))
            .map(|r| r.id.clone())
            .collect(),
    };
    let d = ha::decide(
        &prev,
        &members,
        &settings,
        input.annotation(SWITCHOVER_ANNOTATION),
        &answers,
        input.now_ms,
    );
    let st = &d.state;

    // The topology the pods start from, applied before the StatefulSet.
    live.before_pods.push(Action::Apply(topology::config_map(ctx, st)));

    // Polls; the target also keeps the slots of the others while it is the primary.
    let mut instances = Vec::new();
    let mut readings = Vec::new();
    for (pod, m) in input.pods.iter().zip(&members) {
        if pod.can_exec("postgres") && !pod.deleting {
            let slots = slots_sql(&standbys_of(ctx, &pod.name));
            let commands: Vec<&str> =
                if pod.name == st.target { vec![slots.as_str(), STATS_SQL] } else { vec![STATS_SQL] };
            live.actions.push(Action::Exec(ExecRequest {
                command: psql(&commands),
                ..exec_of(poll_exec(&request_id(pod), &pod.name, "postgres", &[], POLL_MS, TIMEOUT_MS))
            }));
        }
        instances.push(instance(m));
        if let Some(Ok(s)) = &m.answer {
            if s.max_connections > 0 {
                let percent = 100.0 * s.connections as f64 / s.max_connections as f64;
                readings.push(Reading {
                    subject: pod.name.clone(),
                    answered_at_ms: response(input.responses, &request_id(pod))
                        .map_or(0, |r| r.started_at_ms),
                    value: percent,
                    limit: CONNECTIONS_LIMIT_PERCENT,
                    describe: format!(
                        "{} of {} connections in use ({percent:.0}%, over {CONNECTIONS_LIMIT_PERCENT:.0}%)",
                        s.connections, s.max_connections
                    ),
                });
            }
        }
    }

    // One-shot requests.
    for r in &d.requests {
        match r {
            Request::Promote { pod, id } => {
                live.actions.push(promote(ctx, pod, id));
                keep.retain(|(p, k)| p != pod || k != id);
            }
            Request::Stop { pod, id, .. } => live.actions.push(once(
                id,
                pod,
                vec!["pg_ctl".into(), "stop".into(), format!("--pgdata={PGDATA}"), "--mode=fast".into()],
                STOP_TIMEOUT_MS,
            )),
        }
    }
    live.actions.extend(fence_writes(ctx, input));
    // The roll's next pod: deleted, the StatefulSet makes it again from its current revision.
    if let Some(pod) = &d.replace {
        live.actions.push(Action::Delete(ObjectRef {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: pod.clone(),
        }));
    }
    live.hold_replicas = d.hold_replicas;
    let confirmed = members.iter().find(|m| {
        st.target == st.current && m.pod == st.current && m.uid == st.current_uid && m.is_primary()
    });
    let bootstrap = spec::bootstrap(&ctx.cluster.spec.raw);
    if let Some(p) = confirmed {
        let pods: Vec<String> = (0..ctx.cluster.spec.replicas).map(|i| ctx.pod(i)).collect();
        let sync = spec::synchronous(input.resource);
        live.actions.push(synchronous_names(p, &spec::synchronous_standby_names(sync.as_ref(), &pods)));
        live.actions.push(app::poll(p, &bootstrap));
    }
    let app_answer = confirmed.and_then(|p| app::answer(input.responses, p));
    live.status.insert("application".into(), app::status(ctx, &bootstrap, app_answer));
    // A promotion already answered stays named while its answer is the newest word of that
    // server (it is never sent again: one-shot).
    for (pod, id) in keep {
        live.actions.push(promote(ctx, &pod, &id));
    }

    // Role labels.
    for (pod, role) in &d.roles {
        live.actions.push(Action::LabelPod(PodLabels {
            pod: pod.clone(),
            labels: vec![(ROLE_LABEL.to_string(), role.map(str::to_string))],
            annotations: Vec::new(),
        }));
    }

    let promised = stateward_sdk::redundancy::promised(ctx.name(), ctx.cluster.spec.replicas);
    let sync = spec::synchronous(input.resource);
    let was = stateward_sdk::redundancy::was_redundant(input.status);
    live.redundancy = Some(crate::redundancy::verdict(&members, &promised, confirmed, sync.as_ref(), was));
    live.events.extend(d.events.iter().cloned());
    live.status.extend(st.to_status());
    if let Some(c) = &d.condition {
        live.conditions.push(c.clone());
    }
    if input.pods.is_empty() {
        return live;
    }
    let mut live = live.checked(input, CONNECTIONS, &readings, instances, POLL_MS);
    if let Some(wake) = d.wake_in_ms {
        live.requeue_after_ms = Some(live.requeue_after_ms.map_or(wake, |r| r.min(wake)));
    }
    live
}

/// Fencing stops a server from taking writes: `default_transaction_read_only` on (through
/// `ALTER SYSTEM`, so a restart keeps it) and its client sessions ended; a server not fenced
/// that answers read-only gets the setting back (`ALTER SYSTEM RESET`), which also covers a
/// standby cloned from a fenced primary. Nothing in the spec may set it (not a parameter).
/// Each request is asked once per answer that shows the difference, so a failed one is asked
/// again after the next poll.
fn fence_writes(ctx: &Ctx, input: &LiveInput) -> Vec<Action> {
    const STOP: [&str; 3] = [
        "ALTER SYSTEM SET default_transaction_read_only = on",
        "SELECT pg_reload_conf()",
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
    ];
    const RESUME: [&str; 2] = ["ALTER SYSTEM RESET default_transaction_read_only", "SELECT pg_reload_conf()"];
    let mut actions = Vec::new();
    for pod in input.pods.iter().filter(|p| p.can_exec("postgres") && !p.deleting) {
        let Some(r) = response(input.responses, &request_id(pod)) else { continue };
        let Some(s) = parse(&r.stdout).filter(|_| r.succeeded()) else { continue };
        let Some(change) = fence::writes(&ctx.cluster.fenced, &pod.name, s.read_only) else { continue };
        let commands: &[&str] = match change {
            fence::Writes::Stop => &STOP,
            fence::Writes::Resume => &RESUME,
        };
        let id = format!(
            "{}-{}-{}-r{}-{}",
            change.verb(),
            pod.name,
            ha::short_uid(&pod.uid),
            pod.restarts,
            r.started_at_ms
        );
        actions.push(once(&id, &pod.name, psql(commands), TIMEOUT_MS));
    }
    actions
}

fn exec_of(action: Action) -> ExecRequest {
    match action {
        Action::Exec(e) => e,
        _ => unreachable!("poll_exec makes an exec"),
    }
}

/// One instance in status: what its server said, or why it said nothing.
fn instance(m: &Member) -> Value {
    match &m.answer {
        Some(Ok(s)) => {
            // State, not readings: WAL positions, lag bytes and connection counts change on
            // every poll of an idle server, and a status that changes is a write (and a
            // reconcile) every poll. The verdicts they feed are state: Redundant (lag over
            // the threshold, with hysteresis) and ServiceHealthy (connections near the limit).
            let mut v = json!({
                "pod": m.pod,
                "role": if s.in_recovery { "replica" } else { "primary" },
                "timeline": s.timeline,
                "maxConnections": s.max_connections,
            });
            if s.in_recovery {
                v["streaming"] = json!(s.streaming);
            } else {
                v["standbys"] = json!(s
                    .standbys
                    .iter()
                    .map(|sb| json!({"name": sb.name, "state": sb.state, "syncState": sb.sync_state}))
                    .collect::<Vec<_>>());
            }
            v
        }
        Some(Err(e)) => json!({ "pod": m.pod, "error": e }),
        None if !m.running => json!({ "pod": m.pod, "error": "its postgres container is not running" }),
        None => json!({ "pod": m.pod, "error": NO_ANSWER_YET }),
    }
}

/// The status fields above, for the CRD schema.
pub fn schema() -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    let s = |d: &str| json!({ "type": "string", "description": d });
    let i = |d: &str| json!({ "type": "integer", "format": "int64", "description": d });
    m.insert(
        "currentPrimary".into(),
        s("The instance last seen answering as the primary (behind the -rw Service)."),
    );
    m.insert(
        "currentPrimaryUID".into(),
        s("The uid of its pod: a pod made again under that name starts fenced."),
    );
    m.insert("targetPrimary".into(), s("The instance that is to be the primary (differs from currentPrimary during a failover or switchover)."));
    m.insert("promotions".into(), i("Promotions decided since the cluster was made."));
    m.insert("timeline".into(), i("The primary's timeline."));
    m.insert(
        "systemIdentifier".into(),
        s("The database system identifier of the confirmed primary; a member answering with another is cloned again, never promoted."),
    );
    m.insert("primaryFailingSinceMs".into(), i("Since when the target primary has not been a healthy primary (ms since the epoch; 0 while it is)."));
    m.insert(
        "promoting".into(),
        json!({ "type": "boolean", "description": "A promotion of targetPrimary is under way." }),
    );
    m.insert(
        "fenced".into(),
        json!({ "type": "array", "items": { "type": "string" }, "description": "Former primaries (pod@uid@restarts) that restart and rewind before they may stream." }),
    );
    m.insert(
        "switchoverAsked".into(),
        json!({ "type": "string", "description": "The value of the stateward.dev/switchover-to annotation last acted upon (a switchover the operator starts itself, for a scale-down or a roll, is not one)." }),
    );
    m.insert(
        "switchover".into(),
        json!({
            "type": "object",
            "description": "The last switchover asked for with the stateward.dev/switchover-to annotation.",
            "properties": {
                "to": { "type": "string" },
                "phase": { "type": "string", "enum": ["", "Demoting", "Promoting", "Done", "Refused", "Failed"] },
                "message": { "type": "string" },
            },
        }),
    );
    m.insert("application".into(), app::schema());
    m.insert(
        "instances".into(),
        json!({
            "type": "array",
            "description": "Each instance as its server answered (psql), not as assumed.",
            "items": {
                "type": "object",
                "properties": {
                    "pod": { "type": "string" },
                    "role": { "type": "string", "enum": ["primary", "replica"] },
                    "timeline": { "type": "integer", "format": "int64" },
                    "streaming": { "type": "boolean" },
                    "standbys": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "name": { "type": "string" },
                                "state": { "type": "string" },
                                "syncState": { "type": "string" },
                            },
                        },
                    },
                    "maxConnections": { "type": "integer", "format": "int64" },
                    "error": { "type": "string" },
                },
            },
        }),
    );
    m.insert("health".into(), stateward_sdk::live::health_schema());
    m
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_psql_unaligned_output() {
        let s = parse("f|24|25|0/3000148|0/3000148|2||pg-1:streaming:async:0,pg-2:streaming:async:128\n")
            .unwrap();
        assert!(!s.in_recovery);
        assert_eq!((s.connections, s.max_connections, s.timeline), (24, 25, 2));
        assert_eq!(s.received, 0x3000148);
        assert_eq!(s.standbys.len(), 2);
        assert_eq!(s.standbys[1].lag_bytes, 128);
        let r = parse("t\n\nt|3|100|1/10|0/FF0|3|streaming|\n").unwrap();
        assert!(r.in_recovery && r.streaming);
        assert_eq!(r.replay_lag(), (1u64 << 32) + 0x10 - 0xFF0);
        assert_eq!(r.system_id, "", "an earlier build's poll names no system");
        let full = parse("t|3|100|1/10|0/FF0|3|streaming||on|7312345678901234567\n").unwrap();
        assert_eq!((full.read_only, full.system_id.as_str()), (true, "7312345678901234567"));
        assert_eq!(parse("ERROR"), None);
        assert_eq!(parse(""), None);
        assert_eq!(lsn_text(parse_lsn("1A/2B").unwrap()), "1A/2B");
    }
}
