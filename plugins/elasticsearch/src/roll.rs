//! Rolling changes one node at a time. The StatefulSets roll `OnDelete`: a changed pod
//! template (version, configuration, resources) replaces no pod by itself; this module
//! replaces outdated nodes in order, data and other non-master sets first, master-eligible
//! sets last, the highest ordinal of a set first. For each node, as ECK does:
//!
//! 1. wait until the cluster is green with every node present and nothing leaving;
//! 2. `cluster.routing.allocation.enable: primaries` and a flush, so the node's replicas are
//!    not copied elsewhere while it restarts and it recovers from its own files;
//! 3. delete the pod; its StatefulSet makes it again from the new template;
//! 4. once it is back (a new pod, Ready, every node in the cluster), allocation is enabled
//!    again, and the next node waits for green.
//!
//! The step in progress is kept in `status.roll`; each request is one-shot, its id naming the
//! generation, the pod and its uid.

use serde_json::{json, Value};
use stateward_sdk::builders::Ctx;
use stateward_sdk::live::{response, Live, LiveInput};
use stateward_sdk::{Action, Event, EventType, RequestMode, Response};

use crate::drain::Ask;
use crate::node::member_set;
use crate::spec::node_sets;

/// What the latest health answer said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub status: String,
    pub nodes: u64,
    /// When the request that brought it was sent.
    pub at_ms: u64,
}

/// The outdated pods, in the order they are replaced: non-master sets first, master-eligible
/// sets last; within a set the highest ordinal first. Only pods the spec keeps count (a
/// leaving pod is the drain's), and only once every set's StatefulSet has its update revision:
/// a set whose new template is not seen yet may have pods to replace before the others.
pub fn outdated(ctx: &Ctx, input: &LiveInput) -> Vec<String> {
    let mut sets = node_sets(ctx.cluster);
    sets.sort_by_key(|s| s.master());
    let mut out = Vec::new();
    for ns in sets {
        let sts = member_set(&ns).statefulset(ctx);
        let Some(revision) = input.update_revisions.get(&sts) else { return Vec::new() };
        let mut pods: Vec<(i64, &str)> = input
            .pods
            .iter()
            .filter(|p| !p.revision.is_empty() && p.revision != *revision && !p.deleting)
            .filter_map(|p| {
                let ordinal = p.name.strip_prefix(&format!("{sts}-"))?.parse::<i64>().ok()?;
                (ordinal < ns.count).then_some((ordinal, p.name.as_str()))
            })
            .collect();
        pods.sort_unstable_by_key(|p| std::cmp::Reverse(p.0));
        out.extend(pods.into_iter().map(|(_, name)| name.to_string()));
    }
    out
}

/// Every pod the spec asks for exists, is Ready and is not going away (a pod just deleted may
/// be missing from what the host observed rather than shown unready).
pub fn all_members_ready(ctx: &Ctx, input: &LiveInput) -> bool {
    node_sets(ctx.cluster).iter().all(|ns| {
        let set = member_set(ns);
        (0..ns.count).all(|i| {
            let name = set.pod(ctx, i);
            input.pods.iter().any(|p| p.name == name && p.ready && !p.deleting)
        })
    })
}

fn answered(input: &LiveInput, id: &str) -> Option<Response> {
    response(input.responses, id).cloned()
}

/// One step of the roll (see the module's comment); `seen`: the latest health answer,
/// `nodes`: the nodes the spec asks for, `quiet`: nothing is leaving.
pub fn roll(
    ctx: &Ctx,
    input: &LiveInput,
    live: &mut Live,
    ask: Ask,
    seen: Option<&Seen>,
    nodes: u64,
    quiet: bool,
) {
    let state = input.status.and_then(|s| s.get("roll")).filter(|r| r.get("pod").is_some());
    let outdated = outdated(ctx, input);
    let (pod, uid, step) = match state {
        Some(r) => (
            r["pod"].as_str().unwrap_or_default().to_string(),
            r["uid"].as_str().unwrap_or_default().to_string(),
            r["step"].as_str().unwrap_or_default().to_string(),
        ),
        None => {
            let Some(next) = outdated.first() else { return };
            let all_ready =
                all_members_ready(ctx, input) && input.pods.iter().all(|p| p.ready && !p.deleting);
            let green = seen.is_some_and(|s| s.status == "green" && s.nodes == nodes);
            if !(quiet && all_ready && green) {
                live.status.insert(
                    "roll".into(),
                    json!({ "waiting": format!("{} node(s) to restart; the next once the cluster is green with all {nodes} nodes", outdated.len()) }),
                );
                return;
            }
            let Some(p) = input.pods.iter().find(|p| &p.name == next) else { return };
            (p.name.clone(), p.uid.clone(), "Preparing".to_string())
        }
    };
    let generation = ctx.cluster.generation;
    let tag = format!("roll-g{generation}-{pod}-{}", uid.get(..8).unwrap_or(&uid));
    let current = input.pods.iter().find(|p| p.name == pod);
    let mut step = step;
    let body = |value: Value| {
        Some(json!({ "persistent": { "cluster.routing.allocation.enable": value } }).to_string())
    };
    if step == "Preparing" {
        let primaries = format!("{tag}-primaries");
        let flush = format!("{tag}-flush");
        live.actions.push(Action::Http(ask(
            &primaries,
            RequestMode::Once,
            "PUT",
            "/_cluster/settings",
            body(json!("primaries")),
        )));
        live.actions.push(Action::Http(ask(&flush, RequestMode::Once, "POST", "/_flush", None)));
        let ready_to_go =
            answered(input, &primaries).is_some_and(|a| a.succeeded()) && answered(input, &flush).is_some();
        if ready_to_go && current.is_some_and(|p| p.uid == uid) {
            live.replace_pod(
                pod.clone(),
                "a rolling change, one node at a time (replica allocation held, flushed)",
            );
            step = "Restarting".into();
        } else if current.is_some_and(|p| p.uid != uid) {
            step = "Restarting".into();
        }
    } else if step == "Restarting" {
        let back = current.is_some_and(|p| p.uid != uid && p.ready && !p.deleting);
        let joined = seen.is_some_and(|s| s.nodes == nodes);
        if back && joined {
            step = "Enabling".into();
        }
    }
    if step == "Enabling" {
        let enable = format!("{tag}-enable");
        live.actions.push(Action::Http(ask(
            &enable,
            RequestMode::Once,
            "PUT",
            "/_cluster/settings",
            body(Value::Null),
        )));
        if let Some(a) = answered(input, &enable).filter(Response::succeeded) {
            let after = a.started_at_ms + a.duration_ms;
            if seen.is_some_and(|s| s.status == "green" && s.at_ms > after) {
                live.events.push(Event {
                    type_: EventType::Normal,
                    reason: "NodeRestarted".into(),
                    message: format!(
                        "{pod} is back and the cluster green; {} node(s) left to restart",
                        outdated.len()
                    ),
                });
                return;
            }
        }
    }
    live.status.insert("roll".into(), json!({ "pod": pod, "uid": uid, "step": step }));
}

/// The roll of a cluster that has not formed (or cannot be asked: no answer ever came): it
/// holds no data yet, so nodes are replaced one at a time by readiness alone, as a
/// StatefulSet's rolling update would, the same order.
pub fn by_readiness(ctx: &Ctx, input: &LiveInput, live: &mut Live) {
    let Some(next) = outdated(ctx, input).into_iter().next() else { return };
    if all_members_ready(ctx, input) && input.pods.iter().all(|p| p.ready && !p.deleting) {
        live.replace_pod(next, "a rolling change of a cluster that has not formed: one node at a time");
    }
}

/// The status field above, for the CRD schema.
pub fn schema() -> Value {
    json!({
        "type": "object",
        "description": "The rolling change in progress: the node being restarted (its pod and the uid it had) and its step (Preparing: replica allocation held and flushed; Restarting: its pod replaced; Enabling: allocation enabled again, waiting for green), or why the next node waits.",
        "properties": {
            "pod": { "type": "string" },
            "uid": { "type": "string" },
            "step": { "type": "string" },
            "waiting": { "type": "string" },
        },
    })
}
