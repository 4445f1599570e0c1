//! The Elasticsearch-specific part of the spec: `distribution` and `nodeSets` (their defaults,
//! schema and checks).
//!
//! Without `nodeSets` the cluster is one set of `spec.replicas` nodes holding every role, as
//! before the field existed. With them, each set is a StatefulSet `<name>-<set>` of `count`
//! nodes with its own roles, resources and volume size; `spec.replicas` is then not used (the
//! status counts the nodes of all sets).
//!
//! An even number of master-eligible nodes is refused: it tolerates no more lost nodes than
//! one fewer does (a majority of 4 is 3, as of 3 it is 2... of 5 it is 3), and it invites a
//! split into halves that cannot elect anyone.

use serde_json::{Map, Value};
use stateward_sdk::spec::{parse_quantity, resources_at, Cluster, Resources, MAX_REPLICAS};
use stateward_sdk::FieldError;

/// Which server the pods run: the same plugin speaks to both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Distribution {
    /// Elasticsearch 8 with security on (TLS, the `elastic` user's password).
    Elasticsearch,
    /// OpenSearch 2 (its own config file and setting names).
    OpenSearch,
}

impl Distribution {
    pub fn as_str(self) -> &'static str {
        match self {
            Distribution::Elasticsearch => "elasticsearch",
            Distribution::OpenSearch => "opensearch",
        }
    }

    /// The name a master-eligible role has in `node.roles`.
    pub fn master_role(self) -> &'static str {
        match self {
            Distribution::Elasticsearch => "master",
            Distribution::OpenSearch => "cluster_manager",
        }
    }

    /// The setting naming the nodes that bootstrap a new cluster.
    pub fn initial_masters_setting(self) -> &'static str {
        match self {
            Distribution::Elasticsearch => "cluster.initial_master_nodes",
            Distribution::OpenSearch => "cluster.initial_cluster_manager_nodes",
        }
    }
}

/// `spec.distribution`, elasticsearch when absent.
pub fn distribution(spec: &Value) -> Distribution {
    match spec.get("distribution").and_then(Value::as_str) {
        Some("opensearch") => Distribution::OpenSearch,
        _ => Distribution::Elasticsearch,
    }
}

/// Roles a node set may hold (as spelled in spec; `master` is `cluster_manager` on OpenSearch).
pub const ROLES: &[&str] = &["master", "data", "ingest", "remote_cluster_client"];
/// Roles only Elasticsearch has.
pub const ELASTICSEARCH_ROLES: &[&str] =
    &["ml", "transform", "data_content", "data_hot", "data_warm", "data_cold", "data_frozen"];
/// Longest node set name: `<cluster>-<set>-<ordinal>` and its revision label stay in 63.
pub const MAX_SET_NAME: usize = 11;
pub const MAX_SETS: usize = 8;

/// One node set, defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSet {
    /// "" for the implicit set of a spec without `nodeSets`.
    pub name: String,
    pub count: i64,
    pub roles: Vec<String>,
    pub resources: Resources,
    pub storage_size: String,
}

impl NodeSet {
    pub fn master(&self) -> bool {
        self.roles.iter().any(|r| r == "master")
    }

    pub fn data(&self) -> bool {
        self.roles.iter().any(|r| r == "data" || r.starts_with("data_"))
    }
}

/// The node sets of a valid spec (the implicit one when `nodeSets` is absent).
pub fn node_sets(cluster: &Cluster) -> Vec<NodeSet> {
    let Some(sets) = cluster.spec.raw.get("nodeSets").and_then(Value::as_array) else {
        return vec![NodeSet {
            name: String::new(),
            count: cluster.spec.replicas,
            roles: ["master", "data", "ingest"].map(String::from).to_vec(),
            resources: cluster.spec.resources.clone(),
            storage_size: cluster.spec.storage.size.clone(),
        }];
    };
    sets.iter()
        .enumerate()
        .map(|(i, s)| {
            let mut ignored = Vec::new();
            let resources = if s.get("resources").is_some() {
                resources_at(s, &format!("spec.nodeSets[{i}]"), &mut ignored)
            } else {
                cluster.spec.resources.clone()
            };
            NodeSet {
                name: s.get("name").and_then(Value::as_str).unwrap_or_default().to_string(),
                count: s.get("count").and_then(Value::as_i64).unwrap_or(0),
                roles: s
                    .get("roles")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect(),
                resources,
                storage_size: s
                    .pointer("/storage/size")
                    .and_then(Value::as_str)
                    .unwrap_or(&cluster.spec.storage.size)
                    .to_string(),
            }
        })
        .collect()
}

/// Master-eligible nodes the spec asks for.
pub fn masters(sets: &[NodeSet]) -> i64 {
    sets.iter().filter(|s| s.master()).map(|s| s.count).sum()
}

/// Checks `distribution` and `nodeSets`.
pub fn validate(spec: &Value, cluster: &Cluster) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let dist = match spec.get("distribution") {
        None => Distribution::Elasticsearch,
        Some(Value::String(d)) if d == "elasticsearch" => Distribution::Elasticsearch,
        Some(Value::String(d)) if d == "opensearch" => Distribution::OpenSearch,
        Some(d) => {
            errs.push(FieldError::new(
                "spec.distribution",
                format!("{d} is neither elasticsearch nor opensearch"),
            ));
            Distribution::Elasticsearch
        }
    };
    let Some(raw) = spec.get("nodeSets") else {
        if cluster.spec.replicas % 2 == 0 {
            errs.push(FieldError::new(
                "spec.replicas",
                format!("{} master-eligible nodes: use an odd number (an even one tolerates no more lost nodes than one fewer, and can split into halves that elect no master)", cluster.spec.replicas),
            ));
        }
        return errs;
    };
    let Some(list) = raw.as_array() else {
        errs.push(FieldError::new("spec.nodeSets", "must be a list of node sets"));
        return errs;
    };
    if list.is_empty() || list.len() > MAX_SETS {
        errs.push(FieldError::new("spec.nodeSets", format!("must hold 1 to {MAX_SETS} node sets")));
        return errs;
    }
    let mut names: Vec<&str> = Vec::new();
    for (i, s) in list.iter().enumerate() {
        let path = format!("spec.nodeSets[{i}]");
        if !s.is_object() {
            errs.push(FieldError::new(path, "must be an object"));
            continue;
        }
        match s.get("name").and_then(Value::as_str) {
            Some(n) if valid_set_name(n) => {
                if names.contains(&n) {
                    errs.push(FieldError::new(
                        format!("{path}.name"),
                        format!("{n:?} is used by another node set"),
                    ));
                }
                names.push(n);
            }
            _ => errs.push(FieldError::new(
                format!("{path}.name"),
                format!(
                    "must be 1 to {MAX_SET_NAME} lower-case letters, digits or '-', starting with a letter"
                ),
            )),
        }
        match s.get("count").and_then(Value::as_i64) {
            Some(c) if (1..=MAX_REPLICAS).contains(&c) => {}
            _ => errs.push(FieldError::new(
                format!("{path}.count"),
                format!("must be an integer from 1 to {MAX_REPLICAS}"),
            )),
        }
        match s.get("roles").and_then(Value::as_array) {
            Some(roles) if !roles.is_empty() => {
                for (j, r) in roles.iter().enumerate() {
                    let rpath = format!("{path}.roles[{j}]");
                    match r.as_str() {
                        Some(r) if ROLES.contains(&r) => {}
                        Some(r) if ELASTICSEARCH_ROLES.contains(&r) && dist == Distribution::OpenSearch => {
                            errs.push(FieldError::new(
                                rpath,
                                format!("{r} is an Elasticsearch role OpenSearch does not have"),
                            ))
                        }
                        Some(r) if ELASTICSEARCH_ROLES.contains(&r) => {}
                        _ => errs.push(FieldError::new(
                            rpath,
                            format!(
                                "{r} is not a node role; use {}",
                                [ROLES, ELASTICSEARCH_ROLES].concat().join(", ")
                            ),
                        )),
                    }
                }
            }
            _ => errs.push(FieldError::new(
                format!("{path}.roles"),
                "must list at least one role, e.g. [master] or [data, ingest]",
            )),
        }
        if s.get("resources").is_some() {
            resources_at(s, &path, &mut errs);
        }
        if let Some(st) = s.get("storage") {
            match st.get("size").and_then(Value::as_str) {
                Some(size) if parse_quantity(size).is_some_and(|q| q >= 1_000 * 1024 * 1024) => {}
                _ => errs.push(FieldError::new(
                    format!("{path}.storage.size"),
                    "must be a quantity of at least 1Mi, such as 10Gi",
                )),
            }
        }
    }
    if !errs.is_empty() {
        return errs;
    }
    let sets = node_sets(cluster);
    let masters = masters(&sets);
    if masters == 0 {
        errs.push(FieldError::new(
            "spec.nodeSets",
            "no node set has the master role: a cluster needs master-eligible nodes to elect its master",
        ));
    } else if masters % 2 == 0 {
        errs.push(FieldError::new(
            "spec.nodeSets",
            format!("{masters} master-eligible nodes: use an odd number (an even one tolerates no more lost nodes than one fewer, and can split into halves that elect no master)"),
        ));
    }
    if !sets.iter().any(NodeSet::data) {
        errs.push(FieldError::new(
            "spec.nodeSets",
            "no node set has a data role: the cluster could hold no index",
        ));
    }
    errs
}

fn valid_set_name(n: &str) -> bool {
    (1..=MAX_SET_NAME).contains(&n.len())
        && n.starts_with(|c: char| c.is_ascii_lowercase())
        && !n.ends_with('-')
        && n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Checks of a change: the distribution is fixed, and node sets are known by name (a set
/// renamed or removed in place would take its nodes' data with it).
pub fn validate_update(new: &Value, old: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if distribution(new) != distribution(old) {
        errs.push(FieldError::new(
            "spec.distribution",
            format!("is fixed at creation ({}); a cluster cannot change server", distribution(old).as_str()),
        ));
    }
    let names = |spec: &Value| -> Vec<String> {
        spec.get("nodeSets")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|s| s.get("name").and_then(Value::as_str).map(String::from))
            .collect()
    };
    let (new_names, old_names) = (names(new), names(old));
    if new.get("nodeSets").is_some() != old.get("nodeSets").is_some() {
        errs.push(FieldError::new(
            "spec.nodeSets",
            "cannot be added to or removed from a running cluster: its nodes would be replaced by others with none of their data",
        ));
    } else if let Some(gone) = old_names.iter().find(|n| !new_names.contains(n)) {
        errs.push(FieldError::new(
            "spec.nodeSets",
            format!("node set {gone:?} is gone: renaming or removing a node set in place would delete its nodes and their data; keep it (lower its count to move its shards away) and add new sets beside it"),
        ));
    }
    errs
}

/// The schema of `distribution` and `nodeSets`.
pub fn schema() -> Map<String, Value> {
    serde_json::from_str(include_str!("spec_schema.json")).unwrap_or_default()
}
