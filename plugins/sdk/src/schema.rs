//! CRD pieces shared by every kind: the v1 and v1alpha1 schemas, status, printer columns.

use serde_json::{json, Map, Value};

use crate::json::to_text;
use crate::spec::{MAX_REPLICAS, MIN_REPLICAS, VERSION_PATTERN};
use crate::types::{CrdVersion, KindInfo, Phase};

/// The API group of every stateward kind.
pub const GROUP: &str = "stateward.dev";
/// The storage version.
pub const V1: &str = "v1";
/// The older, still served version.
pub const V1ALPHA1: &str = "v1alpha1";

fn quantity() -> Value {
    json!({ "anyOf": [{ "type": "integer" }, { "type": "string" }], "x-kubernetes-int-or-string": true })
}

fn resources() -> Value {
    let list = json!({
        "type": "object",
        "properties": { "cpu": quantity(), "memory": quantity() },
    });
    json!({
        "type": "object",
        "description": "CPU and memory for each member; limits default from the plugin when omitted.",
        "properties": { "requests": list, "limits": list },
    })
}

fn common_spec_properties() -> Map<String, Value> {
    let mut p = Map::new();
    p.insert(
        "version".into(),
        json!({ "type": "string", "pattern": VERSION_PATTERN, "description": "Service version, e.g. 17 or 8.15.3." }),
    );
    p.insert(
        "replicas".into(),
        json!({
            "type": "integer", "format": "int32",
            "minimum": MIN_REPLICAS, "maximum": MAX_REPLICAS,
            "description": "Members (pods) of the cluster. Unset: 3, or the number the service's own fields make (e.g. shards × members per shard).",
        }),
    );
    p.insert(
        "image".into(),
        json!({ "type": "string", "minLength": 1, "description": "Overrides the image derived from version." }),
    );
    p.insert(
        "retentionPolicy".into(),
        json!({
            "type": "string", "enum": ["Retain", "Delete"], "default": "Retain",
            "description": "What happens to the volumes when the cluster is deleted.",
        }),
    );
    p.insert(
        "waitForRedundancy".into(),
        json!({
            "type": "boolean",
            "description": "Whether a new cluster becomes Running and Available only once the copies it promises exist \
                            (every replica linked, every standby streaming, every shard copy assigned). Default true; \
                            false: as soon as its members are ready.",
        }),
    );
    p.insert(
        "paused".into(),
        json!({
            "type": "boolean",
            "description": "While true the operator changes nothing of the cluster (status says \
                            Paused); a spec change waits until it is false again. Certificates \
                            are still renewed.",
        }),
    );
    p.insert(
        "hibernate".into(),
        json!({
            "type": "boolean",
            "description": "While true every pod of the cluster is stopped (its StatefulSets at zero \
                            replicas); the volumes, Secrets and Services stay, and false starts \
                            the same pods again on the same data. Status says Hibernated.",
        }),
    );
    p.insert("resources".into(), resources());
    p.insert(
        "priorityClassName".into(),
        json!({
            "type": "string",
            "description": "Deprecated: use scheduling.priorityClassName. Still honoured when that is \
                            absent; the two may not differ.",
        }),
    );
    p.insert("scheduling".into(), crate::scheduling::schema());
    p.insert(
        "parameters".into(),
        json!({
            "type": "object", "maxProperties": 64,
            "additionalProperties": { "type": "string", "maxLength": 256 },
            "description": "Server configuration; the plugin accepts only the keys it knows.",
        }),
    );
    p
}

fn immutable(message: &str) -> Value {
    json!([{ "rule": "self == oldSelf", "message": message }])
}

/// The v1 spec: nested `storage`, plus `deletionProtection`; `extra` adds the service's own
/// fields.
pub fn spec_v1(extra: &Map<String, Value>) -> Value {
    let mut p = common_spec_properties();
    p.extend(extra.clone());
    p.insert(
        "storage".into(),
        json!({
            "type": "object",
            "required": ["size"],
            "properties": {
                "size": { "type": "string", "description": "Volume size per member, e.g. 10Gi." },
                "className": {
                    "type": "string",
                    "x-kubernetes-validations": immutable("storage.className is immutable"),
                },
            },
            "x-kubernetes-validations": [{
                "rule": "has(self.className) == has(oldSelf.className)",
                "message": "storage.className cannot be added or removed",
            }],
        }),
    );
    p.insert(
        "deletionProtection".into(),
        json!({ "type": "boolean", "description": "Admission refuses to delete the cluster while true." }),
    );
    json!({ "type": "object", "required": ["version", "storage"], "properties": p })
}

/// The v1alpha1 spec: flat `storageSize`/`storageClassName`, no `deletionProtection`; `extra`
/// adds the service's own fields (the same in both versions).
pub fn spec_v1alpha1(extra: &Map<String, Value>) -> Value {
    let mut p = common_spec_properties();
    p.extend(extra.clone());
    p.insert("storageSize".into(), json!({ "type": "string" }));
    p.insert(
        "storageClassName".into(),
        json!({ "type": "string", "x-kubernetes-validations": immutable("storageClassName is immutable") }),
    );
    json!({ "type": "object", "required": ["version", "storageSize"], "properties": p })
}

/// The status schema; `extra` adds the service's own fields (e.g. currentPrimary).
pub fn status(extra: &Map<String, Value>) -> Value {
    let phases: Vec<&str> = Phase::ALL.iter().map(|p| p.as_str()).collect();
    // The fields every plugin's status has, kept as data (status_properties.json), not code:
    // every plugin carries them and must fit a ConfigMap. Among them `requests`, the host's
    // durable record of one-shot requests (WIT 0.2), which must survive pruning.
    let mut p: Map<String, Value> =
        serde_json::from_str(include_str!("status_properties.json")).unwrap_or_default();
    p.insert("phase".into(), json!({ "type": "string", "enum": phases }));
    for (k, v) in extra {
        p.insert(k.clone(), v.clone());
    }
    json!({ "type": "object", "properties": p })
}

fn object(spec: Value, status: Value) -> Value {
    json!({
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": { "type": "string" },
            "kind": { "type": "string" },
            "metadata": { "type": "object" },
            "spec": spec,
            "status": status,
        },
    })
}

/// `additionalPrinterColumns`: Phase, Ready, Version, Age; `-o wide` adds the conditions
/// (`Available`: the service answers; `Redundant`: losing a member loses nothing).
pub fn printer_columns() -> Value {
    let cond = |t: &str| {
        json!({
            "name": t, "type": "string", "priority": 1,
            "jsonPath": format!(".status.conditions[?(@.type==\"{t}\")].status"),
        })
    };
    json!([
        { "name": "Phase", "type": "string", "jsonPath": ".status.phase" },
        { "name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas" },
        { "name": "Version", "type": "string", "jsonPath": ".spec.version" },
        { "name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp" },
        cond("Available"),
        cond("Progressing"),
        cond("Degraded"),
        cond("Redundant"),
    ])
}

/// The kind with both versions: v1alpha1 (served, deprecated) and v1 (served, storage).
pub fn kind_info(
    kind: &str,
    plural: &str,
    short: &str,
    spec_extra: &Map<String, Value>,
    status_extra: &Map<String, Value>,
) -> KindInfo {
    let status = status(status_extra);
    let columns = to_text(&printer_columns());
    KindInfo {
        group: GROUP.into(),
        kind: kind.into(),
        plural: plural.into(),
        short_names: vec![short.into()],
        categories: vec!["stateward".into()],
        versions: vec![
            CrdVersion {
                name: V1ALPHA1.into(),
                served: true,
                storage: false,
                deprecated: true,
                schema: to_text(&object(spec_v1alpha1(spec_extra), status.clone())),
                printer_columns: columns.clone(),
            },
            CrdVersion {
                name: V1.into(),
                served: true,
                storage: true,
                deprecated: false,
                schema: to_text(&object(spec_v1(spec_extra), status)),
                printer_columns: columns,
            },
        ],
    }
}
