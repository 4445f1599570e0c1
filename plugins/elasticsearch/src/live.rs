//! What the running cluster says (WIT 0.2 requests), through the cluster's http Service:
//! `GET /_cluster/health` (status green/yellow/red, nodes, unassigned shards) and `GET /_nodes`
//! (each node's roles). Red, or yellow with unassigned shards, on three answers in a row is a
//! Warning and a condition. The first health answer records the formation (see [`crate::node`]).
//!
//! Elasticsearch is asked over TLS, verified against the operator's CA for the http Service's
//! name, as the `elastic` user; OpenSearch (the test image has no security plugin) over http.

use serde_json::{json, Map, Value};
use stateward_sdk::builders::Ctx;
use stateward_sdk::live::{response, Health, Live, LiveInput, Reading, Threshold};
use stateward_sdk::redundancy::Redundancy;
use stateward_sdk::{Action, HttpRequest, HttpTarget, HttpTls, RequestMode, SecretBasicAuth};

use crate::spec::{distribution, node_sets, Distribution};
use crate::{drain, node, roll};

pub const POLL_MS: u64 = 10_000;
/// Until the cluster has formed: its first answer ends the bootstrap.
pub const FORMING_POLL_MS: u64 = 2_000;
const TIMEOUT_MS: u32 = 5_000;
const HEALTH_ID: &str = "cluster-health";
const NODES_ID: &str = "nodes";
/// Asked while the health is not green: which copy is unassigned and why (the cluster picks one).
const UNASSIGNED_ID: &str = "unassigned-copy";
const UNASSIGNED_PATH: &str = "/_cluster/allocation/explain?filter_path=index,shard,primary,unassigned_info.reason,allocate_explanation";
/// The most of the cluster's own explanation a condition message carries.
const EXPLANATION_CHARS: usize = 200;

/// Not green (yellow counts 1, red 2) on three answers in a row.
pub const HEALTH: Threshold = Threshold { key: "clusterHealth", reason: "ClusterNotGreen", times: 3 };

/// The formation the status records, if the cluster has formed.
pub fn formation(status: Option<&Value>) -> Option<&Value> {
    status?.get("formation").filter(|f| f.get("formedAt").is_some())
}

/// A request through the http Service, as the distribution wants it asked.
#[allow(clippy::too_many_arguments)]
fn request(
    ctx: &Ctx,
    input: &LiveInput,
    port: u16,
    id: &str,
    mode: RequestMode,
    method: &str,
    path: &str,
    body: Option<String>,
) -> HttpRequest {
    let service = format!("{}-http", ctx.name());
    let secured = distribution(&ctx.cluster.spec.raw) == Distribution::Elasticsearch;
    let namespace =
        input.resource.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("default");
    let mut headers = vec![("Accept".to_string(), "application/json".to_string())];
    if body.is_some() {
        headers.push(("Content-Type".into(), "application/json".into()));
    }
    HttpRequest {
        id: id.into(),
        mode,
        target: HttpTarget::Service(service.clone()),
        port,
        tls: secured.then(|| HttpTls {
            ca_secret: ctx.tls_secret(),
            server_name: format!("{service}.{namespace}.svc.cluster.local"),
        }),
        method: method.into(),
        path: path.into(),
        headers,
        body,
        basic_auth: secured.then(|| SecretBasicAuth {
            secret: ctx.secret(),
            username_key: "username".into(),
            password_key: "password".into(),
        }),
        timeout_ms: TIMEOUT_MS,
    }
}

pub fn live(ctx: &Ctx, input: &LiveInput, port: u16) -> Live {
    let mut live = Live::default();
    let formed = formation(input.status).cloned();
    for child in node::shared_children(ctx, formed.is_some()) {
        live.before_pods.push(Action::Apply(child.to_string()));
    }
    if let Some(f) = &formed {
        live.status.insert("formation".into(), f.clone());
    }
    if formed.is_none() {
        roll::by_readiness(ctx, input, &mut live);
    }
    let service = format!("{}-http", ctx.name());
    // Through the Service once the host observes it (a plan asking through a Service it does
    // not see yet is refused whole, the Service's own apply with it).
    if !input.pods.iter().any(|p| p.ready) || !input.services.contains(&service) {
        return live;
    }
    // Quicker polls while forming and while a roll is under way (each step waits on health).
    let rolling = !roll::outdated(ctx, input).is_empty()
        || input.status.and_then(|s| s.get("roll")).is_some_and(|r| r.get("pod").is_some());
    let every = if formed.is_some() && !rolling { POLL_MS } else { FORMING_POLL_MS };
    let ask = |id: &str, mode: RequestMode, method: &str, path: &str, body: Option<String>| {
        request(ctx, input, port, id, mode, method, path, body)
    };
    let poll = |id: &str, path: &str, every: u64| {
        Action::Http(ask(id, RequestMode::EveryMs(every), "GET", path, None))
    };
    live.actions.push(poll(HEALTH_ID, "/_cluster/health", every));
    live.actions.push(poll(NODES_ID, "/_nodes?filter_path=nodes.*.name,nodes.*.roles", POLL_MS));
    live.requeue_after_ms = Some(every);
    let nodes: u64 = node_sets(ctx.cluster).iter().map(|s| s.count.max(0) as u64).sum();
    if formed.is_some() {
        drain::drain(ctx, input, &mut live, &ask);
        let seen = response(input.responses, HEALTH_ID).filter(|a| a.succeeded()).and_then(|a| {
            let v: Value = serde_json::from_str(&a.stdout).ok()?;
            Some(roll::Seen {
                status: v["status"].as_str()?.to_string(),
                nodes: v["number_of_nodes"].as_u64()?,
                at_ms: a.started_at_ms,
            })
        });
        let quiet = drain::leaving(ctx, input).is_empty();
        roll::roll(ctx, input, &mut live, &ask, seen.as_ref(), nodes, quiet);
    }
    if let Some(nodes) = response(input.responses, NODES_ID).filter(|a| a.succeeded()) {
        if let Ok(v) = serde_json::from_str::<Value>(&nodes.stdout) {
            live.status.insert("nodes".into(), Value::Array(node_roles(&v)));
        }
    }
    let answer = response(input.responses, HEALTH_ID);
    let health_answer =
        answer.map(|a| serde_json::from_str::<Value>(&a.stdout).ok().filter(|_| a.succeeded()));
    let not_green = health_answer.as_ref().and_then(Option::as_ref).is_some_and(|h| h["status"] != "green");
    let unassigned = match not_green {
        true => {
            live.actions.push(poll(UNASSIGNED_ID, UNASSIGNED_PATH, every));
            response(input.responses, UNASSIGNED_ID)
                .filter(|a| a.succeeded())
                .and_then(|a| serde_json::from_str::<Value>(&a.stdout).ok())
        }
        false => None,
    };
    live.redundancy = Some(redundancy(health_answer.as_ref(), nodes, unassigned.as_ref()));
    let Some(answer) = answer else {
        // Asked, no answer yet (a new leader): the last health read and its check's streaks
        // stay, over the base status's "unknown", until the answer (the SDK holds the
        // ServiceHealthy verdict).
        for key in ["clusterHealth", "health"] {
            if let Some(last) = input.status.and_then(|s| s.get(key)) {
                live.status.insert(key.into(), last.clone());
            }
        }
        return live;
    };
    let health = health_answer.flatten();
    let mut readings = Vec::new();
    match health {
        Some(h) => {
            let status = h["status"].as_str().unwrap_or("unknown").to_string();
            let unassigned = h["unassigned_shards"].as_u64().unwrap_or(0);
            let level = match status.as_str() {
                "green" => 0.0,
                "yellow" => 1.0,
                _ => 2.0,
            };
            readings.push(Reading {
                answered_at_ms: answer.started_at_ms,
                subject: ctx.name().to_string(),
                value: level,
                limit: 0.0,
                describe: format!("cluster health {status}, {unassigned} unassigned shard(s)"),
            });
            live.status.insert(
                "clusterHealth".into(),
                json!({
                    "status": status,
                    "nodes": h["number_of_nodes"].as_u64().unwrap_or(0),
                    "activeShards": h["active_shards"].as_u64().unwrap_or(0),
                    "unassignedShards": unassigned,
                }),
            );
            // A health answer comes from an elected master: the cluster has formed, and the
            // bootstrap list is emptied on this same pass.
            if formed.is_none() {
                live.status.insert(
                    "formation".into(),
                    json!({ "formedAt": answer.started_at_ms, "masters": node::master_pods(ctx) }),
                );
                live.before_pods.clear();
                for child in node::shared_children(ctx, true) {
                    live.before_pods.push(Action::Apply(child.to_string()));
                }
                live.events.push(stateward_sdk::Event {
                    type_: stateward_sdk::EventType::Normal,
                    reason: "ClusterFormed".into(),
                    message: "the cluster elected a master: new nodes are no longer given the bootstrap list"
                        .into(),
                });
            }
        }
        None => {
            let why = answer.error.clone().unwrap_or_else(|| format!("HTTP {:?}", answer.code));
            live.status.insert("clusterHealth".into(), json!({ "status": "unknown", "error": why }));
        }
    }
    let mut checks = Health::default();
    checks.check(input.status.and_then(|s| s.get("health")), HEALTH, &readings);
    live.events.extend(checks.events(input.health_reason()));
    live.conditions.push(checks.condition());
    live.status.insert("health".into(), Value::Object(checks.streaks));
    live
}

/// Redundancy from the last health answer (None: none yet; Some(None): no health in it) for a
/// cluster of `nodes` nodes: green (every replica shard assigned) with every node joined. A
/// single node never is: its shards' replicas have nowhere to go. `unassigned`: the cluster's
/// allocation explanation of one unassigned copy, named in the message when there is one.
pub fn redundancy(health: Option<&Option<Value>>, nodes: u64, unassigned: Option<&Value>) -> Redundancy {
    if nodes <= 1 {
        return Redundancy::not_promised("a single node holds the only copy of every shard");
    }
    let Some(answer) = health else { return Redundancy::unknown("the cluster has not answered yet") };
    let Some(h) = answer else { return Redundancy::lacking("NoHealth", "the cluster's health is not known") };
    let status = h["status"].as_str().unwrap_or("unknown");
    let joined = h["number_of_nodes"].as_u64().unwrap_or(0);
    if status != "green" {
        let count = h["unassigned_shards"].as_u64().unwrap_or(0);
        let mut message = format!("cluster health {status}: {count} shard copies unassigned");
        if let Some(copy) = unassigned.and_then(unassigned_copy) {
            message.push_str(&format!(", among them {copy}"));
        }
        return Redundancy::lacking("ShardCopiesUnassigned", message);
    }
    if joined < nodes {
        return Redundancy::lacking("NodesMissing", format!("{joined} of {nodes} nodes joined"));
    }
    Redundancy::redundant(format!("cluster health green: every shard copy assigned on {joined} nodes"))
}

/// One unassigned copy as an allocation explanation names it: "index logs shard 0 (a replica,
/// REPLICA_ADDED): cannot allocate because …" (the explanation cut to a bounded length).
fn unassigned_copy(explain: &Value) -> Option<String> {
    let index = explain["index"].as_str()?;
    let shard = explain["shard"].as_u64()?;
    let kind = if explain["primary"].as_bool()? { "the primary" } else { "a replica" };
    let mut out = format!("index {index} shard {shard} ({kind}");
    if let Some(reason) = explain.pointer("/unassigned_info/reason").and_then(Value::as_str) {
        out.push_str(&format!(", {reason}"));
    }
    out.push(')');
    if let Some(why) = explain["allocate_explanation"].as_str() {
        let why: String = why.chars().take(EXPLANATION_CHARS).collect();
        out.push_str(&format!(": {why}"));
    }
    Some(out)
}

/// `{name, roles}` of each node from a `GET /_nodes` answer, by name.
fn node_roles(answer: &Value) -> Vec<Value> {
    let mut out: Vec<Value> = answer
        .get("nodes")
        .and_then(Value::as_object)
        .into_iter()
        .flat_map(Map::values)
        .filter_map(|n| {
            let name = n.get("name")?.as_str()?;
            let roles: Vec<&str> = n.get("roles")?.as_array()?.iter().filter_map(Value::as_str).collect();
            Some(json!({ "name": name, "roles": roles }))
        })
        .collect();
    out.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    out
}

/// The status fields above, for the CRD schema.
pub fn schema() -> Map<String, Value> {
    let mut m = Map::new();
    m.insert(
        "clusterHealth".into(),
        json!({
            "type": "object",
            "description": "GET /_cluster/health as the cluster answered it.",
            "properties": {
                "status": { "type": "string" },
                "nodes": { "type": "integer", "format": "int64" },
                "activeShards": { "type": "integer", "format": "int64" },
                "unassignedShards": { "type": "integer", "format": "int64" },
                "error": { "type": "string" },
            },
        }),
    );
    m.insert(
        "formation".into(),
        json!({
            "type": "object",
            "description": "When the cluster first answered (its master elected), and the nodes that bootstrapped it. From then on no node is given the initial-master setting.",
            "properties": {
                "formedAt": { "type": "integer", "format": "int64" },
                "masters": { "type": "array", "items": { "type": "string" } },
            },
        }),
    );
    m.insert(
        "nodes".into(),
        json!({
            "type": "array",
            "description": "Each node's roles as GET /_nodes reports them.",
            "items": {
                "type": "object",
                "properties": {
                    "name": { "type": "string" },
                    "roles": { "type": "array", "items": { "type": "string" } },
                },
            },
        }),
    );
    m.insert("drain".into(), drain::schema());
    m.insert("roll".into(), roll::schema());
    m.insert("health".into(), stateward_sdk::live::health_schema());
    m
}
