//! Nodes leave only once the cluster can do without them. A node set scaled down keeps its
//! StatefulSet at the old size (a hold) until every leaving node is ready to go:
//! - a data node holds no shard: it is excluded from allocation
//!   (`cluster.routing.allocation.exclude._name`), and the cluster moves its shards away;
//! - a master-eligible node is out of the voting configuration (`POST
//!   /_cluster/voting_config_exclusions`), so the masters left still form a majority.
//!
//! Once the nodes are gone, the allocation exclusion is cleared and the voting exclusions
//! removed. A cluster that has never formed holds nothing to move, and is not held.
//!
//! Each change is a one-shot request whose id names the resource's generation and the value
//! asked for: the same change is never sent twice for one spec, and a later scale-down asks
//! again. What is in force is read back from the cluster on every poll.

use serde_json::{json, Value};
use stateward_sdk::builders::Ctx;
use stateward_sdk::json::fnv1a;
use stateward_sdk::live::{response, Live, LiveInput};
use stateward_sdk::{Action, Event, EventType, HttpRequest, RequestMode};

use crate::node::member_set;
use crate::spec::node_sets;

/// The persistent setting that keeps shards off the named nodes.
const EXCLUDE: &str = "cluster.routing.allocation.exclude._name";
const SETTINGS_ID: &str = "settings";
const ALLOCATION_ID: &str = "allocation";
const VOTING_ID: &str = "voting-exclusions";
/// Polls while nodes are leaving.
pub const DRAIN_POLL_MS: u64 = 2_000;

/// A pod that is to leave: its set scaled below its ordinal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leaving {
    pub pod: String,
    /// The node set's name ("" for the implicit one).
    pub set: String,
    pub ordinal: i64,
    pub data: bool,
    pub master: bool,
}

/// The pods of every node set whose ordinal is at or above the set's count.
pub fn leaving(ctx: &Ctx, input: &LiveInput) -> Vec<Leaving> {
    let mut out = Vec::new();
    for ns in node_sets(ctx.cluster) {
        let sts = member_set(&ns).statefulset(ctx);
        for pod in &input.pods {
            let Some(ordinal) = pod.name.strip_prefix(&format!("{sts}-")).and_then(|o| o.parse::<i64>().ok())
            else {
                continue;
            };
            if ordinal >= ns.count {
                out.push(Leaving {
                    pod: pod.name.clone(),
                    set: ns.name.clone(),
                    ordinal,
                    data: ns.data(),
                    master: ns.master(),
                });
            }
        }
    }
    out.sort_by(|a, b| a.pod.cmp(&b.pod));
    out
}

/// What the cluster says is in force, from the latest answers (None: not answered yet).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InForce {
    /// The allocation exclusion, "" when none.
    pub excluded: Option<String>,
    /// Shards on each node.
    pub shards: Option<Vec<(String, u64)>>,
    /// Node names in the voting exclusions.
    pub voting: Option<Vec<String>>,
}

/// Reads the three answers.
pub fn in_force(input: &LiveInput) -> InForce {
    let answer = |id: &str| -> Option<Value> {
        let a = response(input.responses, id).filter(|a| a.succeeded())?;
        serde_json::from_str(&a.stdout).ok()
    };
    InForce {
        excluded: answer(SETTINGS_ID).map(|v| {
            v.pointer("/persistent")
                .and_then(|p| p.get(EXCLUDE))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        }),
        shards: answer(ALLOCATION_ID).and_then(|v| {
            v.as_array().map(|rows| {
                rows.iter()
                    .filter_map(|r| {
                        let node = r.get("node")?.as_str()?.to_string();
                        let shards = match r.get("shards")? {
                            Value::String(s) => s.parse().ok()?,
                            n => n.as_u64()?,
                        };
                        Some((node, shards))
                    })
                    .collect()
            })
        }),
        voting: answer(VOTING_ID).map(|v| {
            v.pointer("/metadata/cluster_coordination/voting_config_exclusions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|e| e.get("node_name").and_then(Value::as_str).map(String::from))
                .collect()
        }),
    }
}

/// Whether a leaving node may go now.
pub fn may_go(node: &Leaving, force: &InForce) -> bool {
    let drained = !node.data
        || (force.excluded.as_deref().is_some_and(|e| e.split(',').any(|n| n == node.pod))
            && force
                .shards
                .as_ref()
                .is_some_and(|s| s.iter().all(|(n, count)| *n != node.pod || *count == 0)));
    let unvoted = !node.master || force.voting.as_ref().is_some_and(|v| v.contains(&node.pod));
    drained && unvoted
}

/// Builds a request through the http Service: (id, mode, method, path, body).
pub type Ask<'a> = &'a dyn Fn(&str, RequestMode, &str, &str, Option<String>) -> HttpRequest;

/// The drain of a formed cluster: polls, the changes the answers call for, and the holds.
/// `request` builds a request through the http Service as the distribution wants it.
pub fn drain(ctx: &Ctx, input: &LiveInput, live: &mut Live, request: Ask) {
    let leaving = leaving(ctx, input);
    let force = in_force(input);
    let fenced = &ctx.cluster.fenced;
    let busy = !leaving.is_empty()
        || !fenced.is_empty()
        || force.excluded.as_deref().is_some_and(|e| !e.is_empty())
        || force.voting.as_ref().is_some_and(|v| !v.is_empty());
    let every = if busy { DRAIN_POLL_MS } else { crate::live::POLL_MS };
    let poll = RequestMode::EveryMs(every);
    live.actions.push(Action::Http(request(
        SETTINGS_ID,
        poll,
        "GET",
        "/_cluster/settings?flat_settings=true",
        None,
    )));
    live.actions.push(Action::Http(request(
        VOTING_ID,
        poll,
        "GET",
        "/_cluster/state/metadata?filter_path=metadata.cluster_coordination.voting_config_exclusions",
        None,
    )));
    if leaving.iter().any(|l| l.data) {
        live.actions.push(Action::Http(request(
            ALLOCATION_ID,
            poll,
            "GET",
            "/_cat/allocation?format=json&h=node,shards",
            None,
        )));
    }
    if busy {
        live.requeue_after_ms = Some(live.requeue_after_ms.map_or(every, |r| r.min(every)));
    }
    let generation = ctx.cluster.generation;

    // Data nodes leaving, and fenced nodes (which must take no writes: they hold no shard),
    // exactly they are excluded from allocation (and nothing once gone or unfenced).
    let mut want: Vec<&str> = leaving.iter().filter(|l| l.data).map(|l| l.pod.as_str()).collect();
    want.extend(fenced.iter().map(String::as_str));
    want.sort_unstable();
    want.dedup();
    let want = want.join(",");
    if let Some(excluded) = &force.excluded {
        if *excluded != want {
            let value = if want.is_empty() { Value::Null } else { json!(want) };
            let body = json!({ "persistent": { EXCLUDE: value } }).to_string();
            let id = format!("exclude-g{generation}-{}", fnv1a(want.as_bytes()));
            live.actions.push(Action::Http(request(
                &id,
                RequestMode::Once,
                "PUT",
                "/_cluster/settings",
                Some(body),
            )));
            if response(input.responses, &id).is_none() {
                live.events.push(Event {
                    type_: EventType::Normal,
                    reason: if want.is_empty() { "AllocationRestored" } else { "DrainingNodes" }.into(),
                    message: if want.is_empty() {
                        "the nodes that left are no longer excluded from shard allocation".into()
                    } else {
                        format!("moving every shard off {want} (leaving, or fenced)")
                    },
                });
            }
        }
    }

    // Master-eligible nodes leaving: out of the voting configuration first; the exclusions
    // are removed once no leaving master is left.
    let masters: Vec<&str> = leaving.iter().filter(|l| l.master).map(|l| l.pod.as_str()).collect();
    if let Some(voting) = &force.voting {
        let missing: Vec<&str> = masters.iter().copied().filter(|m| !voting.iter().any(|v| v == m)).collect();
        if !missing.is_empty() {
            let names = missing.join(",");
            let id = format!("voting-exclude-g{generation}-{}", fnv1a(names.as_bytes()));
            let path = format!("/_cluster/voting_config_exclusions?node_names={names}&timeout=4s");
            live.actions.push(Action::Http(request(&id, RequestMode::Once, "POST", &path, None)));
            if response(input.responses, &id).is_none() {
                live.events.push(Event {
                    type_: EventType::Normal,
                    reason: "ExcludingVotes".into(),
                    message: format!("{names} leave the voting configuration before their pods go"),
                });
            }
        } else if masters.is_empty() && !voting.is_empty() {
            let id = format!("voting-clear-g{generation}-{}", fnv1a(voting.join(",").as_bytes()));
            let path = "/_cluster/voting_config_exclusions?wait_for_removal=false";
            live.actions.push(Action::Http(request(&id, RequestMode::Once, "DELETE", path, None)));
        }
    }

    // Holds: a set keeps its leaving pods until each may go (the StatefulSet removes the
    // highest ordinals first, so the hold is the highest that may not go, plus one).
    for l in leaving.iter().filter(|l| !may_go(l, &force)) {
        let hold = l.ordinal + 1;
        if l.set.is_empty() {
            live.hold_replicas = Some(live.hold_replicas.map_or(hold, |h| h.max(hold)));
        } else {
            let h = live.hold_sets.entry(l.set.clone()).or_insert(hold);
            *h = (*h).max(hold);
        }
    }
    live.status.insert(
        "drain".into(),
        json!({
            "leaving": leaving.iter().map(|l| l.pod.clone()).collect::<Vec<_>>(),
            "allocationExcluded": force.excluded.unwrap_or_default(),
            "votingExclusions": force.voting.unwrap_or_default(),
        }),
    );
}

/// The status field above, for the CRD schema.
pub fn schema() -> Value {
    json!({
        "type": "object",
        "description": "Nodes leaving (their set scaled down) and what keeps them until they may go: the allocation exclusion moving their shards away, and the voting exclusions of leaving master-eligible nodes, as the cluster reports them.",
        "properties": {
            "leaving": { "type": "array", "items": { "type": "string" } },
            "allocationExcluded": { "type": "string" },
            "votingExclusions": { "type": "array", "items": { "type": "string" } },
        },
    })
}
