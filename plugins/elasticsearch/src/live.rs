//! What the running cluster says (WIT 0.2 requests): `GET /_cluster/health` through the
//! cluster's http Service — its status (green, yellow, red), nodes and unassigned shards. Red, or
//! yellow with unassigned shards, on three answers in a row is a Warning and a condition.

use serde_json::{json, Value};
use stateward_sdk::builders::Ctx;
use stateward_sdk::live::{response, Health, Live, LiveInput, Reading, Threshold};
use stateward_sdk::{Action, HttpRequest, HttpTarget, RequestMode};

pub const POLL_MS: u64 = 10_000;
const TIMEOUT_MS: u32 = 5_000;
const ID: &str = "cluster-health";

/// Not green (yellow counts 1, red 2) on three answers in a row.
pub const HEALTH: Threshold = Threshold { key: "clusterHealth", reason: "ClusterNotGreen", times: 3 };

pub fn live(ctx: &Ctx, input: &LiveInput, port: u16) -> Live {
    let mut live = Live::default();
    let service = format!("{}-http", ctx.name());
    // Through the Service once the host observes it (a plan asking through a Service it does
    // not see yet is refused whole, the Service's own apply with it).
    if !input.pods.iter().any(|p| p.ready) || !input.services.contains(&service) {
        return live;
    }
    live.actions.push(Action::Http(HttpRequest {
        id: ID.into(),
        mode: RequestMode::EveryMs(POLL_MS),
        target: HttpTarget::Service(service),
        port,
        tls: None,
        method: "GET".into(),
        path: "/_cluster/health".into(),
        headers: vec![("Accept".into(), "application/json".into())],
        body: None,
        basic_auth: None,
        timeout_ms: TIMEOUT_MS,
    }));
    live.requeue_after_ms = Some(POLL_MS);
    let Some(answer) = response(input.responses, ID) else { return live };
    let health: Option<Value> =
        serde_json::from_str(&answer.stdout).ok().filter(|_: &Value| answer.succeeded());
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
        }
        None => {
            let why = answer.error.clone().unwrap_or_else(|| format!("HTTP {:?}", answer.code));
            live.status.insert("clusterHealth".into(), json!({ "status": "unknown", "error": why }));
        }
    }
    let mut checks = Health::default();
    checks.check(input.status.and_then(|s| s.get("health")), HEALTH, &readings);
    live.events = checks.events(input.health_reason());
    live.conditions.push(checks.condition());
    live.status.insert("health".into(), Value::Object(checks.streaks));
    live
}

/// The status fields above, for the CRD schema.
pub fn schema() -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
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
    m.insert("health".into(), stateward_sdk::live::health_schema());
    m
}
