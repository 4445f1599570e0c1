//! What the running servers and Sentinels say (WIT 0.2 requests), and what the plugin does
//! about it: every pod's server is asked `INFO` and, in replication mode, its Sentinel
//! `SENTINEL MASTER`, every [`POLL_MS`], with `redis-cli` in the pod (the password comes from
//! the container's own `REDISCLI_AUTH`, never from the plugin). The answers go to
//! [`roles::decide`]; its decision becomes the role labels the `-master` and `-replicas`
//! Services select on, status (the master, each replica's link and lag, each Sentinel's view),
//! a condition and events.

use serde_json::{json, Value};
use stateward_sdk::builders::Ctx;
use stateward_sdk::live::{failure, poll_exec, response, Live, LiveInput, PodView, Reading, Threshold};
use stateward_sdk::{Action, Event, EventType, ExecRequest, ObjectRef, PodLabels, RequestMode};

use crate::roles::{self, Info, Member, SentinelView};
use crate::{roll, switchover};
use crate::{sentinel, spec, topology};

/// How often each pod is asked: the labels the Services select on follow these answers.
pub const POLL_MS: u64 = 2_000;
/// How often while a switchover holds writes back: each step of it waits for a fresh answer.
pub const SWITCHOVER_POLL_MS: u64 = 500;
const TIMEOUT_MS: u32 = 5_000;
/// The label the Services select on.
pub const ROLE_LABEL: &str = "stateward.dev/role";

/// Memory in use above 90 % of `maxmemory` on three answers in a row.
pub const MEMORY: Threshold = Threshold { key: "memory", reason: "MemoryNearLimit", times: 3 };
const MEMORY_LIMIT_PERCENT: f64 = 90.0;

/// The `INFO` fields this plugin reads (None: not an `INFO` answer).
pub fn parse(info: &str) -> Option<Info> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.trim_end_matches('\r').strip_prefix(name)?.strip_prefix(':').map(str::to_string))
    };
    let number = |name: &str| field(name).and_then(|v| v.parse::<u64>().ok());
    let role = field("role")?;
    let offset = if role == "master" { number("master_repl_offset") } else { number("slave_repl_offset") };
    Some(Info {
        master_host: field("master_host").unwrap_or_default(),
        link_up: field("master_link_status").as_deref() == Some("up"),
        offset: offset.unwrap_or(0),
        connected_replicas: number("connected_slaves").unwrap_or(0),
        used_memory: number("used_memory")?,
        maxmemory: number("maxmemory").unwrap_or(0),
        role,
    })
}

/// `SENTINEL MASTER`'s answer, one field name and its value per line (None: not such an answer).
pub fn parse_sentinel(answer: &str) -> Option<SentinelView> {
    let lines: Vec<&str> = answer.lines().map(|l| l.trim_end_matches('\r')).collect();
    let field =
        |name: &str| lines.chunks(2).find(|kv| kv.len() == 2 && kv[0] == name).map(|kv| kv[1].to_string());
    Some(SentinelView {
        master_host: field("ip").filter(|h| !h.is_empty())?,
        flags: field("flags").unwrap_or_default(),
        other_sentinels: field("num-other-sentinels").and_then(|n| n.parse().ok()).unwrap_or(0),
        quorum: field("quorum").and_then(|n| n.parse().ok()).unwrap_or(0),
    })
}

/// The poll of one incarnation of a pod (a pod made again, or a restarted container, is asked
/// anew: an answer of the one before says nothing of it).
pub fn request_id(kind: &str, pod: &PodView) -> String {
    format!("{kind}-{}-{}-r{}", pod.name, pod.uid.get(..8).unwrap_or(&pod.uid), pod.restarts)
}

fn answer_of<T>(
    responses: &[stateward_sdk::Response],
    id: &str,
    parse: impl Fn(&str) -> Option<T>,
) -> Option<Result<T, String>> {
    let r = response(responses, id)?;
    Some(match parse(&r.stdout).filter(|_| r.succeeded()) {
        Some(v) => Ok(v),
        None if r.error.is_none() && r.succeeded() => {
            Err(format!("unexpected answer: {:.200}", r.stdout.trim()))
        }
        None => Err(failure(r, "redis-cli")),
    })
}

pub fn live(ctx: &Ctx, input: &LiveInput, port: u16) -> Live {
    let mut live = Live::default();
    let replication = spec::mode(&ctx.cluster.spec.raw, ctx.cluster.spec.replicas) == spec::REPLICATION;
    let port = port.to_string();
    let sentinel_port = sentinel::PORT.to_string();
    if replication {
        // Before the StatefulSet: the pods it starts read it.
        live.before_pods.push(Action::Apply(topology::config_map(ctx)));
    }
    let quorum = sentinel::quorum(ctx);
    let mut wake = None;
    let mut members = Vec::new();
    let holding =
        matches!(switchover::State::from_status(input.status).phase.as_str(), "Pausing" | "FailingOver");
    let every_ms = if holding { SWITCHOVER_POLL_MS } else { POLL_MS };
    for pod in &input.pods {
        let (info_id, sentinel_id) = (request_id("info", pod), request_id("sentinel", pod));
        if pod.can_exec("redis") && !pod.deleting {
            live.actions.push(poll_exec(
                &info_id,
                &pod.name,
                "redis",
                &["redis-cli", "-h", "127.0.0.1", "-p", &port, "--no-auth-warning", "info"],
                every_ms,
                TIMEOUT_MS,
            ));
            if replication {
                live.actions.push(poll_exec(
                    &sentinel_id,
                    &pod.name,
                    "redis",
                    &[
                        "redis-cli",
                        "-h",
                        "127.0.0.1",
                        "-p",
                        &sentinel_port,
                        "--no-auth-warning",
                        "sentinel",
                        "master",
                        sentinel::MASTER_NAME,
                    ],
                    every_ms,
                    TIMEOUT_MS,
                ));
            }
        }
        let m = Member {
            pod: pod.name.clone(),
            deleting: pod.deleting,
            server: answer_of(input.responses, &info_id, parse),
            sentinel: if replication {
                answer_of(input.responses, &sentinel_id, parse_sentinel)
            } else {
                None
            },
        };
        // A Sentinel started with another quorum (the spec or the number of pods changed
        // since) is given the current one; once per incarnation and value.
        if let Some(Ok(s)) = &m.sentinel {
            if s.quorum != quorum as u64 && !pod.deleting {
                let q = quorum.to_string();
                let id = format!("{}-q{q}", request_id("quorum", pod));
                live.actions.push(Action::Exec(ExecRequest {
                    id,
                    mode: RequestMode::Once,
                    pod: pod.name.clone(),
                    container: "redis".into(),
                    command: [
                        "redis-cli",
                        "-h",
                        "127.0.0.1",
                        "-p",
                        &sentinel_port,
                        "--no-auth-warning",
                        "sentinel",
                        "set",
                        sentinel::MASTER_NAME,
                        "quorum",
                        &q,
                    ]
                    .iter()
                    .map(|s| (*s).to_string())
                    .collect(),
                    stdin: None,
                    timeout_ms: TIMEOUT_MS,
                }));
            }
        }
        members.push(m);
    }
    let previous = input.status.and_then(|s| s.get("master")).and_then(Value::as_str);
    let d = roles::decide(&members, previous);

    for (pod, role) in &d.roles {
        live.actions.push(Action::LabelPod(PodLabels {
            pod: pod.clone(),
            labels: vec![(ROLE_LABEL.to_string(), role.map(str::to_string))],
            annotations: Vec::new(),
        }));
    }
    let mut instances = Vec::new();
    let mut readings = Vec::new();
    for (pod, m) in input.pods.iter().zip(&members) {
        let role = d.roles.iter().find(|(p, _)| p == &m.pod).and_then(|(_, r)| *r);
        instances.push(instance(m, role, d.lag.get(&m.pod).copied().flatten()));
        if let Some(Ok(i)) = &m.server {
            if i.maxmemory > 0 {
                let percent = 100.0 * i.used_memory as f64 / i.maxmemory as f64;
                readings.push(Reading {
                    answered_at_ms: response(input.responses, &request_id("info", pod))
                        .map_or(0, |r| r.started_at_ms),
                    subject: pod.name.clone(),
                    value: percent,
                    limit: MEMORY_LIMIT_PERCENT,
                    describe: format!(
                        "{} of {} bytes of maxmemory in use ({percent:.0}%, over {MEMORY_LIMIT_PERCENT:.0}%)",
                        i.used_memory, i.maxmemory
                    ),
                });
            }
        }
    }
    // The master last confirmed stays named while none is.
    if let Some(master) = d.master.as_deref().or(previous) {
        live.status.insert("master".into(), json!(master));
    }
    if replication {
        live.status
            .insert("sentinels".into(), json!(members.iter().map(sentinel_status).collect::<Vec<_>>()));
    }
    if replication {
        let pods: Vec<String> = input.pods.iter().map(|p| p.name.clone()).collect();
        let replicas: Vec<String> =
            d.roles.iter().filter(|(_, r)| *r == Some("replica")).map(|(p, _)| p.clone()).collect();
        let answers = input
            .responses
            .iter()
            .filter(|r| r.id.starts_with("switchover-"))
            // No answer in time is no answer: Sentinel may still fail over (or the old master
            // follow), so it fails nothing; the switchover's own timeout bounds the wait.
            .filter(|r| r.code.is_some() || r.error.as_deref().is_some_and(|e| !e.contains("timeout")))
            .map(|r| {
                let answer = if !r.succeeded() {
                    Err(failure(r, "redis-cli"))
                } else if switchover::answered_ok(&r.stdout) {
                    Ok(())
                } else {
                    Err(r.stdout.trim().to_string())
                };
                (r.id.clone(), answer)
            })
            .collect();
        let servers = input
            .pods
            .iter()
            .zip(&members)
            .filter_map(|(pod, m)| {
                let i = m.server.as_ref()?.as_ref().ok()?;
                let asked_at_ms = response(input.responses, &request_id("info", pod))?.started_at_ms;
                Some((
                    m.pod.clone(),
                    switchover::Server { master: i.role == "master", offset: i.offset, asked_at_ms },
                ))
            })
            .collect();
        let view = switchover::View {
            master: d.master.as_deref(),
            replicas: &replicas,
            pods: &pods,
            servers: &servers,
        };
        let annotation = input.annotation(switchover::ANNOTATION);
        let mut prev = switchover::State::from_status(input.status);
        let newly_asked = annotation.map(str::trim).is_some_and(|a| !a.is_empty() && a != prev.asked);
        if !prev.active() && !newly_asked {
            match roll::next(
                &roll_pods(input, &d),
                ctx.cluster.spec.replicas,
                d.master.as_deref(),
                previous.is_some(),
            ) {
                Some(roll::Step::Replace { pod, why }) => {
                    live.events.push(Event {
                        type_: EventType::Normal,
                        reason: "ReplacingPod".into(),
                        message: format!("replacing {pod}: {why}"),
                    });
                    live.actions.push(Action::Delete(ObjectRef {
                        api_version: "v1".into(),
                        kind: "Pod".into(),
                        name: pod,
                    }));
                }
                Some(roll::Step::Switchover { to, why }) if switchover::may_begin(&prev, input.now_ms) => {
                    let (started, event) = switchover::begin(&prev, &to, &why, &view, input.now_ms);
                    prev = started;
                    live.events.push(event);
                }
                _ => {}
            }
        }
        let step = switchover::step(&prev, annotation, &view, &answers, input.now_ms);
        for r in &step.requests {
            live.actions.push(Action::Exec(switchover::exec(
                r,
                &ctx.headless(),
                switchover::REQUEST_TIMEOUT_MS,
            )));
        }
        if !step.state.to.is_empty() {
            live.status.insert("switchover".into(), step.state.to_status());
        }
        live.events.extend(step.events);
        if let Some(w) = step.wake_in_ms {
            wake = Some(w);
        }
        let sw = &step.state;
        let ends = sw.active().then_some([sw.from.as_str(), sw.to.as_str()]).into_iter().flatten();
        let masters = [d.master.as_deref(), previous].into_iter().flatten().chain(ends);
        live.hold_replicas = roll::hold_replicas(masters, ctx.cluster.spec.replicas);
        live.actions.extend(sentinel_reset(input, &members, ctx.cluster.spec.replicas));
    }
    live.conditions.push(d.condition.clone());
    live.events.extend(d.events.iter().cloned());
    if input.pods.is_empty() {
        return live;
    }
    let mut live = live.checked(input, MEMORY, &readings, instances, POLL_MS);
    if let Some(w) = wake {
        live.requeue_after_ms = Some(live.requeue_after_ms.map_or(w, |r| r.min(w)));
    }
    live
}

/// After a scale-in every Sentinel still counts the removed pods' Sentinels (Sentinel never
/// forgets one), and a failover needs a majority of all it knows: with 5 known and 3 running,
/// losing the master's pod would leave 2 of 5 and no failover. So once the StatefulSet has
/// shrunk, a Sentinel that knows more others than run is reset (`SENTINEL RESET`: it forgets
/// the other Sentinels and replicas and finds the live ones again within seconds). One at a
/// time: none is reset while another is still finding the others again (knows fewer than run)
/// or does not answer. Once per pod incarnation and count.
fn sentinel_reset(input: &LiveInput, members: &[Member], replicas: i64) -> Option<Action> {
    let settled = i64::try_from(input.pods.len()).is_ok_and(|n| n == replicas)
        && input.pods.iter().all(|p| !p.deleting);
    let expected = u64::try_from(replicas - 1).ok()?;
    let known: Vec<(&PodView, u64)> = input
        .pods
        .iter()
        .zip(members)
        .filter_map(|(p, m)| match &m.sentinel {
            Some(Ok(s)) => Some((p, s.other_sentinels)),
            _ => None,
        })
        .collect();
    if !settled || known.len() != input.pods.len() || known.iter().any(|(_, n)| *n < expected) {
        return None;
    }
    let (pod, n) = known.into_iter().find(|(_, n)| *n > expected)?;
    Some(Action::Exec(ExecRequest {
        id: format!("{}-n{n}", request_id("sentinel-reset", pod)),
        mode: RequestMode::Once,
        pod: pod.name.clone(),
        container: "redis".into(),
        command: ["redis-cli", "-h", "127.0.0.1", "-p", &sentinel::PORT.to_string(), "--no-auth-warning"]
            .into_iter()
            .map(str::to_string)
            .chain(["sentinel", "reset", sentinel::MASTER_NAME].map(str::to_string))
            .collect(),
        stdin: None,
        timeout_ms: TIMEOUT_MS,
    }))
}

/// The pods as the roll sees them: their readiness, revision and the role just decided.
fn roll_pods(input: &LiveInput, d: &roles::Decision) -> Vec<roll::Pod> {
    input
        .pods
        .iter()
        .map(|p| roll::Pod {
            name: p.name.clone(),
            ready: p.ready,
            deleting: p.deleting,
            outdated: input
                .update_revision
                .as_deref()
                .is_some_and(|r| !p.revision.is_empty() && p.revision != r),
            role: d.roles.iter().find(|(n, _)| *n == p.name).and_then(|(_, r)| *r),
            lag: d.lag.get(&p.name).copied().flatten(),
        })
        .collect()
}

/// One instance in status: what its server said, or why it said nothing.
fn instance(m: &Member, role: Option<&str>, lag: Option<u64>) -> Value {
    match &m.server {
        Some(Ok(i)) => {
            let mut v = json!({
                "pod": m.pod,
                "role": role.unwrap_or("none"),
                "serverRole": i.role,
                "offset": i.offset,
                "connectedReplicas": i.connected_replicas,
                "usedMemoryBytes": i.used_memory,
                "maxmemoryBytes": i.maxmemory,
            });
            if i.role == "slave" {
                v["masterHost"] = json!(i.master_host);
                v["linkStatus"] = json!(if i.link_up { "up" } else { "down" });
            }
            if let Some(lag) = lag {
                v["lagBytes"] = json!(lag);
            }
            v
        }
        Some(Err(e)) => json!({ "pod": m.pod, "error": e }),
        None => json!({ "pod": m.pod, "error": "no answer yet" }),
    }
}

fn sentinel_status(m: &Member) -> Value {
    match &m.sentinel {
        Some(Ok(s)) => json!({
            "pod": m.pod,
            "master": s.master_host,
            "flags": s.flags,
            "otherSentinels": s.other_sentinels,
            "quorum": s.quorum,
        }),
        Some(Err(e)) => json!({ "pod": m.pod, "error": e }),
        None => json!({ "pod": m.pod, "error": "no answer yet" }),
    }
}

/// The status fields above, for the CRD schema.
pub fn schema() -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    let int = json!({ "type": "integer", "format": "int64" });
    let string = json!({ "type": "string" });
    m.insert(
        "master".into(),
        json!({
            "type": "string",
            "description": "The pod last confirmed as the master: named by the Sentinels and answering as a master (behind the -master Service).",
        }),
    );
    m.insert(
        "instances".into(),
        json!({
            "type": "array",
            "description": "Each instance as its server answered (redis-cli info), not as assumed.",
            "items": {
                "type": "object",
                "properties": {
                    "pod": string,
                    "role": { "type": "string", "description": "master, replica (linked to the master) or none: its role label." },
                    "serverRole": { "type": "string", "description": "What the server says it is (master or slave)." },
                    "masterHost": string,
                    "linkStatus": { "type": "string", "enum": ["up", "down"] },
                    "offset": int,
                    "lagBytes": { "type": "integer", "format": "int64", "description": "Bytes of the master's replication stream a replica has not processed." },
                    "connectedReplicas": int,
                    "usedMemoryBytes": int,
                    "maxmemoryBytes": int,
                    "error": string,
                },
            },
        }),
    );
    m.insert(
        "sentinels".into(),
        json!({
            "type": "array",
            "description": "Each pod's Sentinel (replication mode): the master it names.",
            "items": {
                "type": "object",
                "properties": {
                    "pod": string,
                    "master": string,
                    "flags": string,
                    "otherSentinels": int,
                    "quorum": int,
                    "error": string,
                },
            },
        }),
    );
    m.insert(
        "switchover".into(),
        json!({
            "type": "object",
            "description": "The last switchover asked for with the stateward.dev/switchover-to annotation.",
            "properties": {
                "asked": { "type": "string", "description": "The annotation's value acted upon last." },
                "to": { "type": "string", "description": "The replica switched over to." },
                "from": { "type": "string", "description": "The master when it was asked." },
                "phase": { "type": "string", "enum": ["Preparing", "Pausing", "FailingOver", "Done", "Refused", "Failed"] },
                "message": string,
                "startedAtMs": int,
                "preparedAtMs": int,
                "pausedAtMs": int,
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
    fn parses_the_info_fields_it_needs() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\nmaster_repl_offset:5000\r\n# Memory\r\nused_memory:900000\r\nused_memory_human:878.91K\r\nmaxmemory:1000000\r\n";
        assert_eq!(
            parse(info),
            Some(Info {
                role: "master".into(),
                connected_replicas: 2,
                offset: 5000,
                used_memory: 900_000,
                maxmemory: 1_000_000,
                ..Info::default()
            })
        );
        let replica = "role:slave\r\nmaster_host:cache-0.cache-headless\r\nmaster_link_status:up\r\nslave_repl_offset:4900\r\nmaster_repl_offset:4900\r\nused_memory:1\r\n";
        let r = parse(replica).unwrap();
        assert_eq!((r.master_host.as_str(), r.link_up, r.offset), ("cache-0.cache-headless", true, 4900));
        assert_eq!(parse("ERR"), None);
    }

    #[test]
    fn parses_sentinel_master() {
        let answer = "name\nprimary\nip\ncache-1.cache-headless\nport\n6379\nflags\nmaster\nnum-other-sentinels\n2\nquorum\n2\n";
        assert_eq!(
            parse_sentinel(answer),
            Some(SentinelView {
                master_host: "cache-1.cache-headless".into(),
                flags: "master".into(),
                other_sentinels: 2,
                quorum: 2
            })
        );
        assert_eq!(parse_sentinel("ERR No such master with that name\n"), None);
        // A value that happens to be "ip" is not taken for the field name.
        assert_eq!(parse_sentinel("name\nip\nrunid\nx\n"), None);
    }
}
