//! What the running servers and Sentinels say (WIT 0.2 requests), and what the plugin does
//! about it: every pod's server is asked `INFO` and, in replication mode, its Sentinel
//! `SENTINEL MASTER`, every [`POLL_MS`], with `redis-cli` in the pod (the password comes from
//! the container's own `REDISCLI_AUTH`, never from the plugin). The answers go to
//! [`roles::decide`]; its decision becomes the role labels the `-master` and `-replicas`
//! Services select on, status (the master, each replica's link, each Sentinel's view),
//! a condition and events.

use serde_json::{json, Value};
use stateward_sdk::builders::Ctx;
use stateward_sdk::fence;
use stateward_sdk::live::{
    failure, poll_exec, response, Live, LiveInput, PodView, Reading, Threshold, NO_ANSWER_YET,
};
use stateward_sdk::redundancy::Verdict;
use stateward_sdk::{Action, Event, EventType, ExecRequest, PodLabels, RequestMode};

use crate::roles::{self, Info, Member, SentinelView};
use crate::{cluster, redundancy, roll, switchover};
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
        writes_held: field("min_slaves_good_slaves").is_some(),
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
        failover_state: field("failover-state").unwrap_or_default(),
    })
}

/// Some Sentinel that answers names `pod` the master. A roll does not replace such a pod: right
/// after a switchover the Sentinels not yet told of it still name the old master, and a pod
/// deleted then is one they would count as the master they know.
fn named_by_a_sentinel(members: &[Member], pod: &str) -> bool {
    members.iter().filter(|m| !m.deleting).any(|m| {
        m.sentinel
            .as_ref()
            .and_then(|s| s.as_ref().ok())
            .is_some_and(|s| roles::pod_of(&s.master_host, members) == Some(pod))
    })
}

/// The target of a switchover under way once its failover has promoted it: the target's
/// Sentinel, which the plugin asked to fail over and so leads it, has told it to be the master
/// or names it already (see [`roles::decide_promoted`], which also wants the target to answer
/// as a master).
fn switchover_promoted(input: &LiveInput, members: &[Member]) -> Option<String> {
    let st = switchover::State::from_status(input.status);
    if st.phase != "FailingOver" {
        return None;
    }
    let leader = members.iter().find(|m| m.pod == st.to)?.sentinel.as_ref()?.as_ref().ok()?;
    let names_it = roles::pod_of(&leader.master_host, members) == Some(st.to.as_str());
    (leader.promotion_sent() || names_it).then_some(st.to)
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
    if spec::mode(&ctx.cluster.spec.raw, ctx.cluster.spec.replicas) == spec::CLUSTER {
        return cluster_live(ctx, input, port);
    }
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
                let args = ["sentinel", "set", sentinel::MASTER_NAME, "quorum", &q];
                live.actions.push(ask_sentinel(id, &pod.name, &args));
            }
        }
        members.push(m);
    }
    let first = ctx.pod(0);
    let previous = input
        .status
        .and_then(|s| s.get("master"))
        .and_then(Value::as_str)
        .or_else(|| (replication && taken_over(input, &members, &first)).then_some(first.as_str()));
    let d = roles::decide_promoted(&members, previous, switchover_promoted(input, &members).as_deref());
    let held: Vec<Option<bool>> = members
        .iter()
        .map(|m| m.server.as_ref().and_then(|s| s.as_ref().ok()).map(|i| i.writes_held))
        .collect();
    live.actions.extend(fence_writes(ctx, input, &held, "info", port.as_str()));

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
        instances.push(instance(m, role));
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
            .filter(|r| r.id.starts_with("switchover-") && !r.id.starts_with(switchover::OFFSET_PREFIX))
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
        let server = |i: &Info, asked_at_ms: u64| switchover::Server {
            master: i.role == "master",
            offset: i.offset,
            asked_at_ms,
        };
        let servers = input
            .pods
            .iter()
            .zip(&members)
            .filter_map(|(pod, m)| {
                let polled = m.server.as_ref().and_then(|a| a.as_ref().ok()).and_then(|i| {
                    Some(server(i, response(input.responses, &request_id("info", pod))?.started_at_ms))
                });
                // The switchover's own one-shot reads count as polls; the latest one wins.
                let prefix = format!("{}{}-", switchover::OFFSET_PREFIX, pod.name);
                let asked = input
                    .responses
                    .iter()
                    .filter(|r| r.id.starts_with(&prefix) && r.succeeded())
                    .filter_map(|r| Some(server(&parse(&r.stdout)?, r.started_at_ms)));
                let latest = polled.into_iter().chain(asked).max_by_key(|s| s.asked_at_ms)?;
                Some((m.pod.clone(), latest))
            })
            .collect();
        let view = switchover::View {
            agreed: d.agreed,
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
                &roll_pods(input, &d, &members),
                ctx.cluster.spec.replicas,
                d.master.as_deref(),
                previous.is_some(),
            ) {
                Some(roll::Step::Replace { pod, why }) if !named_by_a_sentinel(&members, &pod) => {
                    live.replace_pod(pod, &why)
                }
                // Every Sentinel that answers names it, and enough answer to fail over; only a
                // Redis 7 master waits for its replicas as it shuts down.
                Some(roll::Step::ReplaceMaster { pod, why })
                    if crate::config::redis7(ctx)
                        && d.named.as_deref() == Some(pod.as_str())
                        && d.votes.0 == d.votes.1
                        && i64::try_from(d.votes.1).is_ok_and(|n| n >= quorum) =>
                {
                    live.replace_pod(pod, &why)
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
        let stall = failover_stall(input, &members, d.named.as_deref(), quorum);
        if let Some(since) = stall.since_ms {
            live.status.insert("masterDownSinceMs".into(), json!(since));
        }
        if let Some((action, event)) = stall.nudge {
            live.actions.push(action);
            live.events.push(event);
        }
    }
    // Outside replication mode one server is all the spec promises.
    let promised = stateward_sdk::redundancy::promised(
        ctx.name(),
        if replication { ctx.cluster.spec.replicas } else { 1 },
    );
    let was = stateward_sdk::redundancy::was_redundant(input.status);
    live.redundancy = Some(redundancy::replication(&redundancy_pods(input), &members, &d, &promised, was));
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
    let id = format!("{}-n{n}", request_id("sentinel-reset", pod));
    Some(ask_sentinel(id, &pod.name, &["sentinel", "reset", sentinel::MASTER_NAME]))
}

/// Every pod as the redundancy verdict sees it: asked when its server is polled.
fn redundancy_pods(input: &LiveInput) -> Vec<redundancy::Pod> {
    input
        .pods
        .iter()
        .map(|p| {
            let asked = p.can_exec("redis") && !p.deleting;
            redundancy::Pod { name: p.name.clone(), ready: asked && p.ready, asked }
        })
        .collect()
}

/// A one-shot `redis-cli` to the Sentinel beside the server in `pod`.
fn ask_sentinel(id: String, pod: &str, args: &[&str]) -> Action {
    let port = sentinel::PORT.to_string();
    let base = ["redis-cli", "-h", "127.0.0.1", "-p", &port, "--no-auth-warning"];
    Action::Exec(ExecRequest {
        id,
        mode: RequestMode::Once,
        pod: pod.to_string(),
        container: "redis".into(),
        command: base.iter().chain(args).map(|s| (*s).to_string()).collect(),
        stdin: None,
        timeout_ms: TIMEOUT_MS,
    })
}

/// How long forming the cluster may take (`--cluster create` waits for the nodes to agree).
const CREATE_TIMEOUT_MS: u32 = 60_000;
/// How long moving slots may take (`--cluster rebalance` migrates their keys, a batch at a time).
const REBALANCE_TIMEOUT_MS: u32 = 300_000;
/// Cluster mode (see [`cluster`]): every pod's `CLUSTER INFO` and `CLUSTER NODES`, the cluster
/// formed once, addresses repaired, role labels and status.
fn cluster_live(ctx: &Ctx, input: &LiveInput, port: u16) -> Live {
    let mut live = Live::default();
    let port = port.to_string();
    let cli = |args: &[&str]| -> Vec<String> {
        ["redis-cli", "-h", "127.0.0.1", "-p", &port, "--no-auth-warning"]
            .iter()
            .chain(args)
            .map(|s| (*s).to_string())
            .collect()
    };
    let once = |id: String, pod: &str, command: Vec<String>, timeout_ms: u32| {
        Action::Exec(ExecRequest {
            id,
            mode: RequestMode::Once,
            pod: pod.to_string(),
            container: "redis".into(),
            command,
            stdin: None,
            timeout_ms,
        })
    };
    let prev = switchover::State::from_status(input.status);
    let poll = if prev.active() { SWITCHOVER_POLL_MS } else { POLL_MS };
    let mut members = Vec::new();
    for pod in &input.pods {
        let id = request_id("cluster", pod);
        if pod.can_exec("redis") && !pod.deleting {
            live.actions.push(Action::Exec(ExecRequest {
                id: id.clone(),
                mode: RequestMode::EveryMs(poll),
                pod: pod.name.clone(),
                container: "redis".into(),
                command: cli(&[]),
                // Three commands on one connection: read from stdin, one a line (the last
                // tells whether writes are held back, see `fence_writes`).
                stdin: Some("CLUSTER INFO\nCLUSTER NODES\nINFO replication\n".into()),
                timeout_ms: TIMEOUT_MS,
            }));
        }
        members.push(cluster::Member {
            pod: pod.name.clone(),
            ip: pod.ip.clone(),
            ready: pod.ready,
            deleting: pod.deleting,
            outdated: input
                .update_revision
                .as_deref()
                .is_some_and(|r| !pod.revision.is_empty() && pod.revision != r),
            answer: answer_of(input.responses, &id, cluster::parse),
        });
    }
    let held: Vec<Option<bool>> = members
        .iter()
        .map(|m| m.answer.as_ref().and_then(|a| a.as_ref().ok()).map(|v| v.writes_held))
        .collect();
    live.actions.extend(fence_writes(ctx, input, &held, "cluster", &port));
    let recorded = input.status.and_then(|s| s.get("cluster"));
    let text =
        |k: &str| recorded.and_then(|c| c.get(k)).and_then(Value::as_str).unwrap_or_default().to_string();
    let mut formed = recorded.and_then(|c| c.get("formed")).and_then(Value::as_bool).unwrap_or(false);
    let mut formation_error = text("formationError");
    // The formation's answer, while the host remembers it: its event once (status `formation`
    // records the outcome told; `formed` may be seen from the servers before the answer).
    let mut formation = text("formation");
    if let Some(r) = input.responses.iter().find(|r| r.id.starts_with("cluster-create-")) {
        // Its exit code tells (its output may be cut to the host's bound).
        let ok = r.succeeded();
        let answer = if ok {
            Ok(r.stdout.clone())
        } else {
            let said: Vec<&str> = r.stdout.lines().rev().filter(|l| !l.trim().is_empty()).take(2).collect();
            Err(format!("{} ({})", failure(r, "redis-cli"), said.join(" / ")))
        };
        let outcome = if ok { "Formed" } else { "Failed" };
        if formation != outcome {
            live.events.push(cluster::formed_event(&answer));
            formation = outcome.to_string();
        }
        match answer {
            Ok(_) => formed = true,
            Err(why) => formation_error = why,
        }
    }
    let (shards, per_shard) = spec::cluster_shape(&ctx.cluster.spec.raw);
    let pods = usize::try_from(ctx.cluster.spec.replicas).unwrap_or(0);
    let d = cluster::decide(&members, formed, pods, u32::try_from(per_shard).unwrap_or(0));
    if let Some((pod, ips)) = &d.form {
        let uid = input.pods.iter().find(|p| &p.name == pod).map_or("", |p| p.uid.get(..8).unwrap_or(&p.uid));
        let addresses: Vec<String> = ips.iter().map(|ip| format!("{ip}:{port}")).collect();
        let replicas = per_shard.to_string();
        let mut args = vec!["--cluster", "create"];
        args.extend(addresses.iter().map(String::as_str));
        args.extend(["--cluster-replicas", &replicas, "--cluster-yes"]);
        live.actions.push(once(format!("cluster-create-{uid}"), pod, cli(&args), CREATE_TIMEOUT_MS));
    }
    // The switchover the annotation asks for; no roll while one is under way.
    let answer = response(input.responses, &cluster::switchover_id(&prev)).map(|r| {
        if r.succeeded() && switchover::answered_ok(&r.stdout) {
            Ok(())
        } else if r.succeeded() {
            Err(r.stdout.trim().to_string())
        } else {
            Err(failure(r, "redis-cli"))
        }
    });
    let sw = cluster::switchover(&prev, input.annotation(switchover::ANNOTATION), &d, answer, input.now_ms);
    if let Some(pod) = &sw.failover {
        live.actions.push(once(
            cluster::switchover_id(&sw.state),
            pod,
            cli(&["cluster", "failover"]),
            TIMEOUT_MS,
        ));
    }
    // Each step waits for a fresh answer: looked at again sooner while one is under way.
    let wake = sw.state.active().then_some(SWITCHOVER_POLL_MS);
    if !sw.state.to.is_empty() {
        live.status.insert("switchover".into(), sw.state.to_status());
    }
    live.events.extend(sw.events);
    // The shape the spec asks for: one step a plan, and no roll meanwhile.
    let shape = cluster::scale(
        &members,
        &d,
        pods,
        usize::try_from(shards).unwrap_or(0),
        usize::try_from(per_shard).unwrap_or(0),
    );
    live.hold_replicas = shape.hold;
    // Attempts so far, each its own one-shot request: asked again (the next id) when the last
    // one answered and the slots are still not where they belong.
    let count = |k: &str| recorded.and_then(|c| c.get(k)).and_then(Value::as_u64).unwrap_or(0);
    let (mut rebalances, mut fixes) = (count("rebalances"), count("fixes"));
    // One scaling request at a time: while the last one runs (no answer yet), nothing else
    // moves (a fix beside a rebalance would fight over the same slots).
    // Bounded by the longest request's timeout: an answer the host no longer remembers (the
    // ledger keeps the latest 32) holds nothing back for ever.
    let last = recorded.and_then(|c| c.get("scalingRequest")).and_then(Value::as_str).unwrap_or_default();
    let since = count("scalingSinceMs");
    let recent = input.now_ms < since + u64::from(REBALANCE_TIMEOUT_MS) + 60_000;
    // The host records a one-shot request in status.requests before it sends it: one it could
    // not record (its status write conflicted) was never sent, and is asked for again.
    let sent = input.status.and_then(|st| st.get("requests")).and_then(|r| r.get(last)).is_some();
    let running = (!last.is_empty() && recent && sent && response(input.responses, last).is_none())
        .then(|| last.to_string());
    let step = if running.is_some() { None } else { shape.step.as_ref() };
    let mut requested = running.clone();
    // The entry node of `redis-cli --cluster` is the pod's own address, never 127.0.0.1 (see
    // `cluster::entry`); no request while none is known.
    let migrate_timeout = cluster::MIGRATE_TIMEOUT_MS.to_string();
    let scaling = step.map(|step| {
        let pod_of = |name: &str| input.pods.iter().find(|p| p.name == name);
        let (id, pod, command, timeout, message) = match step {
            cluster::ScaleStep::Failover { replica, master } => (
                pod_of(replica).map(|p| format!("{}-{master}", request_id("cluster-scale-failover", p))),
                replica.clone(),
                cli(&["cluster", "failover"]),
                TIMEOUT_MS,
                format!("{replica} takes over the shard of {master}, whose pod goes (CLUSTER FAILOVER)"),
            ),
            cluster::ScaleStep::Replicate { pod, master, master_id } => (
                pod_of(pod).map(|p| {
                    format!(
                        "{}-{}",
                        request_id("cluster-replicate", p),
                        master_id.get(..8).unwrap_or(master_id)
                    )
                }),
                pod.clone(),
                cli(&["cluster", "replicate", master_id]),
                TIMEOUT_MS,
                format!("{pod} becomes a replica of {master} (CLUSTER REPLICATE)"),
            ),
            cluster::ScaleStep::Rebalance { pod, drain } => {
                if response(input.responses, &format!("cluster-rebalance-{rebalances}")).is_some() {
                    rebalances += 1;
                }
                let entry = cluster::entry(&members, pod, &port);
                let mut args = vec!["--cluster", "rebalance", entry.as_deref().unwrap_or_default()];
                args.extend(["--cluster-use-empty-masters", "--cluster-timeout", &migrate_timeout]);
                let weights: Vec<String> = drain.iter().map(|id| format!("{id}=0")).collect();
                if !weights.is_empty() {
                    args.push("--cluster-weight");
                    args.extend(weights.iter().map(String::as_str));
                }
                (
                    entry.is_some().then(|| format!("cluster-rebalance-{rebalances}")),
                    pod.clone(),
                    cli(&args),
                    REBALANCE_TIMEOUT_MS,
                    if drain.is_empty() {
                        "slots spread evenly over the masters, the new ones included (--cluster rebalance)"
                            .to_string()
                    } else {
                        format!(
                            "slots moved off {} node(s) that stop serving (--cluster rebalance)",
                            drain.len()
                        )
                    },
                )
            }
            cluster::ScaleStep::Fix { pod } => {
                if response(input.responses, &format!("cluster-fix-{fixes}")).is_some() {
                    fixes += 1;
                }
                let entry = cluster::entry(&members, pod, &port);
                let at = entry.as_deref().unwrap_or_default();
                (
                    entry.is_some().then(|| format!("cluster-fix-{fixes}")),
                    pod.clone(),
                    cli(&["--cluster", "fix", at, "--cluster-timeout", &migrate_timeout, "--cluster-yes"]),
                    REBALANCE_TIMEOUT_MS,
                    format!("a migration stopped midway on {pod} is finished (--cluster fix)"),
                )
            }
            cluster::ScaleStep::Forget { from, gone, node } => {
                // Every server that lists it forgets it at once (a server that still knew it
                // would tell the others again); the last request is the one waited for.
                let id = |pod: &str| format!("cluster-forget-{}-{pod}", node.get(..12).unwrap_or(node));
                let (last, others) = from.split_last().map_or((None, &[][..]), |(l, o)| (Some(l), o));
                for pod in others {
                    live.actions.push(once(id(pod), pod, cli(&["cluster", "forget", node]), TIMEOUT_MS));
                }
                (
                    last.map(|p| id(p)),
                    last.cloned().unwrap_or_default(),
                    cli(&["cluster", "forget", node]),
                    TIMEOUT_MS,
                    format!("every node forgets {gone}, which holds nothing now (CLUSTER FORGET)"),
                )
            }
        };
        if let Some(id) = id {
            if response(input.responses, &id).is_none() {
                live.events.push(Event {
                    type_: EventType::Normal,
                    reason: "ScalingCluster".into(),
                    message: message.clone(),
                });
            }
            live.actions.push(once(id.clone(), &pod, command, timeout));
            requested = Some(id);
        }
        message
    });
    let scaling = scaling.or_else(|| {
        running
            .as_ref()
            .and(recorded.and_then(|c| c.get("scaling")).and_then(Value::as_str).map(str::to_string))
    });
    let rolling = if sw.state.active() || shape.step.is_some() || shape.hold.is_some() || running.is_some() {
        None
    } else {
        cluster::roll(&members, &d, d.formed, pods)
    };
    match rolling {
        Some(cluster::RollStep::Replace { pods, why }) => {
            for pod in pods {
                live.replace_pod(pod, &why);
            }
        }
        Some(cluster::RollStep::Failover { replica, master }) => {
            if let Some(p) = input.pods.iter().find(|p| p.name == replica) {
                let id = format!("{}-{master}", request_id("cluster-failover", p));
                if response(input.responses, &id).is_none() {
                    live.events.push(Event {
                        type_: EventType::Normal,
                        reason: "FailingOverShard".into(),
                        message: format!("{replica} takes over from {master}, which is on an old revision (CLUSTER FAILOVER)"),
                    });
                }
                live.actions.push(once(id, &replica, cli(&["cluster", "failover"]), TIMEOUT_MS));
            }
        }
        None => {}
    }
    for (pod, ip) in &d.meets {
        let Some(p) = input.pods.iter().find(|p| &p.name == pod) else { continue };
        let id = format!("{}-{ip}", request_id("cluster-meet", p));
        live.actions.push(once(id, pod, cli(&["cluster", "meet", ip, &port]), TIMEOUT_MS));
    }
    for (pod, role) in &d.roles {
        live.actions.push(Action::LabelPod(PodLabels {
            pod: pod.clone(),
            labels: vec![(ROLE_LABEL.to_string(), role.map(str::to_string))],
            annotations: Vec::new(),
        }));
    }
    let mut status = json!({
        "formed": d.formed,
        "state": d.state,
        "slotsAssigned": d.slots_assigned,
        "slotsOk": d.slots_ok,
        "shards": d.shards.iter().map(|s| json!({ "master": s.master, "slots": s.slots, "replicas": s.replicas })).collect::<Vec<_>>(),
    });
    if !d.stale.is_empty() {
        status["staleRoutes"] = json!(d.stale);
    }
    if !formation.is_empty() {
        status["formation"] = json!(formation);
    }
    if rebalances > 0 {
        status["rebalances"] = json!(rebalances);
    }
    if fixes > 0 {
        status["fixes"] = json!(fixes);
    }
    if let Some(message) = scaling {
        status["scaling"] = json!(message);
    }
    if let Some(id) = requested {
        status["scalingSinceMs"] = json!(if id == last { since } else { input.now_ms });
        status["scalingRequest"] = json!(id);
    }
    if !formation_error.is_empty() && !formed {
        status["formationError"] = json!(formation_error);
    }
    let r = redundancy::cluster(
        &redundancy_pods(input),
        &members,
        &d,
        usize::try_from(shards).unwrap_or(0),
        usize::try_from(per_shard).unwrap_or(0),
        stateward_sdk::redundancy::was_redundant(input.status),
    );
    // Beside `formed`: every shard's promised replicas linked (kept while not known yet).
    let linked = match r.verdict {
        Verdict::Redundant => true,
        Verdict::Unknown => {
            recorded.and_then(|c| c.get("replicasLinked")).and_then(Value::as_bool).unwrap_or(false)
        }
        Verdict::Lacking | Verdict::NotPromised => false,
    };
    status["replicasLinked"] = json!(linked);
    live.redundancy = Some(r);
    live.status.insert("cluster".into(), status);
    let instances = members
        .iter()
        .zip(&d.roles)
        .map(|(m, (_, role))| match &m.answer {
            Some(Ok(v)) => {
                let me = v.myself().cloned().unwrap_or_default();
                json!({ "pod": m.pod, "role": role.unwrap_or("none"), "nodeId": me.id, "slots": me.slots,
                        "serverRole": if me.master { "master" } else { "slave" } })
            }
            Some(Err(e)) => json!({ "pod": m.pod, "error": e }),
            None => json!({ "pod": m.pod, "error": NO_ANSWER_YET }),
        })
        .collect();
    live.conditions.push(d.condition.clone());
    live.events.extend(d.events.iter().cloned());
    if input.pods.is_empty() {
        return live;
    }
    let mut live = live.checked(input, MEMORY, &[], instances, POLL_MS);
    if let Some(w) = wake {
        live.requeue_after_ms = Some(live.requeue_after_ms.map_or(w, |r| r.min(w)));
    }
    live
}

/// More replicas than any cluster has: a fenced server with `min-replicas-to-write` at this
/// refuses every write (`NOREPLICAS`).
const FENCED_MIN_REPLICAS: &str = "1000";

/// Fencing stops a server from taking writes: `min-replicas-to-write` beyond any count of
/// replicas (writes are refused, reads still answered, replication goes on) and its clients
/// disconnected; a server not fenced that holds writes back gets 0 again. Not kept across a
/// restart (`CONFIG SET`): the next incarnation's answer asks again. Asked once per answer
/// that shows the difference, so a failed request is asked again after the next poll.
/// `held` is what each pod's last answer to the poll `poll` said (None: no answer).
fn fence_writes(ctx: &Ctx, input: &LiveInput, held: &[Option<bool>], poll: &str, port: &str) -> Vec<Action> {
    let mut actions = Vec::new();
    for (pod, held) in input.pods.iter().zip(held) {
        let Some(held) = *held else { continue };
        if pod.deleting {
            continue;
        }
        let Some(change) = fence::writes(&ctx.cluster.fenced, &pod.name, held) else { continue };
        let script = match change {
            fence::Writes::Stop => {
                format!("CONFIG SET min-replicas-to-write {FENCED_MIN_REPLICAS}\nCLIENT KILL TYPE normal\n")
            }
            fence::Writes::Resume => "CONFIG SET min-replicas-to-write 0\n".to_string(),
        };
        let verb = change.verb();
        let answered = response(input.responses, &request_id(poll, pod)).map_or(0, |r| r.started_at_ms);
        actions.push(Action::Exec(ExecRequest {
            id: format!("{}-{answered}", request_id(verb, pod)),
            mode: RequestMode::Once,
            pod: pod.name.clone(),
            container: "redis".into(),
            command: ["redis-cli", "-h", "127.0.0.1", "--no-auth-warning", "-p", port]
                .map(String::from)
                .to_vec(),
            stdin: Some(script),
            timeout_ms: TIMEOUT_MS,
        }));
    }
    actions
}

/// How long a quorum of Sentinels may see the master objectively down with none of them
/// failing over before the plugin asks one to (see [`failover_stall`]).
pub const FAILOVER_STALL_MS: u64 = 3_000;

/// What [`failover_stall`] decided.
pub struct Stall {
    /// Since when the master has been seen down with no failover under way (for status).
    pub since_ms: Option<u64>,
    /// `SENTINEL FAILOVER` to one Sentinel, and the event saying why.
    pub nudge: Option<(Action, Event)>,
}

/// Sentinels elect one of them to fail over. When every one of them starts an election at
/// once, each votes for itself, nobody wins, and Sentinel's rule is to try again only after
/// twice the failover timeout: two minutes without a master (seen on this machine with a hung
/// master, whose own Sentinel also runs). So once a quorum of the Sentinels that answer sees
/// the master they name objectively down (`o_down`), none of them is failing over, and that
/// has lasted [`FAILOVER_STALL_MS`] (status `masterDownSinceMs`), the Sentinel of another pod
/// is asked `SENTINEL FAILOVER`: the failover the winner of the election would have made, on
/// the same agreement that the master is down. Once per episode.
pub fn failover_stall(input: &LiveInput, members: &[Member], named: Option<&str>, quorum: i64) -> Stall {
    let none = Stall { since_ms: None, nudge: None };
    let Some(named) = named else { return none };
    let views: Vec<(&PodView, &SentinelView)> = input
        .pods
        .iter()
        .zip(members)
        .filter_map(|(p, m)| Some((p, m.sentinel.as_ref()?.as_ref().ok()?)))
        .collect();
    let flag = |s: &SentinelView, f: &str| s.flags.split(',').any(|x| x == f);
    let down = views
        .iter()
        .filter(|(_, s)| roles::pod_of(&s.master_host, members) == Some(named) && flag(s, "o_down"))
        .count();
    let failing_over = views.iter().any(|(_, s)| flag(s, "failover_in_progress"));
    if failing_over || i64::try_from(down).map_or(true, |d| d < quorum) {
        return none;
    }
    let since =
        input.status.and_then(|s| s.get("masterDownSinceMs")).and_then(Value::as_u64).unwrap_or(input.now_ms);
    let mut stall = Stall { since_ms: Some(since), nudge: None };
    if input.now_ms < since + FAILOVER_STALL_MS {
        return stall;
    }
    let Some((pod, _)) = views.iter().find(|(p, _)| p.name != named && !p.deleting) else { return stall };
    let id = format!("sentinel-failover-{named}-{since}");
    let action = ask_sentinel(id, &pod.name, &["sentinel", "failover", sentinel::MASTER_NAME]);
    let event = Event {
        type_: EventType::Warning,
        reason: "FailoverStalled".into(),
        message: format!(
            "{down} Sentinels see {named} down for {} ms and none fails over (a split election waits minutes): \
             asking the Sentinel of {} to fail over",
            input.now_ms - since,
            pod.name
        ),
    };
    stall.nudge = Some((action, event));
    stall
}

/// The pods as the roll sees them: their readiness, revision and the role just decided.
fn roll_pods(input: &LiveInput, d: &roles::Decision, members: &[Member]) -> Vec<roll::Pod> {
    input
        .pods
        .iter()
        .zip(members)
        .map(|(p, m)| roll::Pod {
            name: p.name.clone(),
            ready: p.ready,
            deleting: p.deleting,
            outdated: outdated(input, p),
            role: d.roles.iter().find(|(n, _)| *n == p.name).and_then(|(_, r)| *r),
            lag: d.lag.get(&p.name).copied().flatten(),
            unaskable: unaskable(input, p, m),
        })
        .collect()
}

/// Made from an older revision of the StatefulSet than the one it makes pods from now (false
/// while that is not known).
fn outdated(input: &LiveInput, pod: &PodView) -> bool {
    input.update_revision.as_deref().is_some_and(|r| !pod.revision.is_empty() && pod.revision != r)
}

/// A cluster the release before this one made and this build takes over: no master was ever
/// recorded, and pod 0 (that release's master, always) is [`unaskable`]. Pod 0 is then the
/// master confirmed last: it stays behind the Services while the replicas are replaced, until
/// the Sentinels fail over from it (see [`roll`]).
fn taken_over(input: &LiveInput, members: &[Member], first: &str) -> bool {
    input.pods.iter().zip(members).any(|(p, m)| p.name == first && !p.deleting && unaskable(input, p, m))
}

/// On an old revision, and its server refuses this build's requests for want of credentials
/// (`NOAUTH`): a pod the release before this one made, whose container lacks `REDISCLI_AUTH`.
/// A server that merely gives no answer (a timeout, no container yet) is not one.
fn unaskable(input: &LiveInput, pod: &PodView, m: &Member) -> bool {
    outdated(input, pod) && matches!(&m.server, Some(Err(e)) if e.contains("NOAUTH"))
}

/// One instance in status: what its server said, or why it said nothing. State only (roles,
/// links, replicas, the memory bound): offsets, lag and memory in use change on every poll of
/// an idle server, and status holding them would be written on every poll. The Redundant
/// condition says how far behind a replica is, and memory pressure is a reading.
fn instance(m: &Member, role: Option<&str>) -> Value {
    match &m.server {
        Some(Ok(i)) => {
            let mut v = json!({
                "pod": m.pod,
                "role": role.unwrap_or("none"),
                "serverRole": i.role,
                "connectedReplicas": i.connected_replicas,
                "maxmemoryBytes": i.maxmemory,
            });
            if i.role == "slave" {
                v["masterHost"] = json!(i.master_host);
                v["linkStatus"] = json!(if i.link_up { "up" } else { "down" });
            }
            v
        }
        Some(Err(e)) => json!({ "pod": m.pod, "error": e }),
        None => json!({ "pod": m.pod, "error": NO_ANSWER_YET }),
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
        None => json!({ "pod": m.pod, "error": NO_ANSWER_YET }),
    }
}

/// The status fields above, for the CRD schema. Kept as data (status_schema.json), not code:
/// built with `json!` it was the largest function of the component, which must fit a ConfigMap.
pub fn schema() -> serde_json::Map<String, Value> {
    let mut m: serde_json::Map<String, Value> =
        serde_json::from_str(include_str!("status_schema.json")).unwrap_or_default();
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
                quorum: 2,
                failover_state: String::new(),
            })
        );
        let leading = answer.replace(
            "flags\nmaster\n",
            "flags\nmaster,failover_in_progress\nfailover-state\nreconf_slaves\n",
        );
        let view = parse_sentinel(&leading).unwrap();
        assert!(view.promotion_sent() && view.failover_state == "reconf_slaves");
        let choosing = leading.replace("reconf_slaves", "select_slave");
        assert!(!parse_sentinel(&choosing).unwrap().promotion_sent());
        assert_eq!(parse_sentinel("ERR No such master with that name\n"), None);
        // A value that happens to be "ip" is not taken for the field name.
        assert_eq!(parse_sentinel("name\nip\nrunid\nx\n"), None);
    }
}
