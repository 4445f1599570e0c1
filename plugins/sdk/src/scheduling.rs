//! `spec.scheduling`: where the members may run. The four pod fields it holds (`nodeSelector`,
//! `tolerations`, `affinity`, `priorityClassName`) go to the pod template unchanged, after the
//! checks here, which name the field and the reason the way the API server would.
//!
//! `spec.priorityClassName` (top level, the older place) is still read: it is a deprecated alias
//! of `spec.scheduling.priorityClassName`, used when the latter is absent. Setting both to
//! different values is refused, so no object written before `scheduling` existed changes
//! meaning, and none can say two things at once.
//!
//! Deep checks of `affinity` (label selectors, topology keys, weights) are left to the API
//! server: the plugin checks its shape down to the lists, and a refusal of the StatefulSet
//! shows as Degraded with reason ApiError and the server's message.
//!
//! Which tolerations and priority classes a cluster may use at all is policy, not validation:
//! see the `control-plane-toleration` and `system-priority-class` rules in guardrails.rego.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::types::FieldError;

/// Most entries of `nodeSelector`, and of `tolerations`, a spec may hold (also in the schema).
pub const MAX_ENTRIES: usize = 64;

/// `spec.scheduling`, checked; `priority_class_name` already resolves the deprecated alias.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scheduling {
    pub node_selector: BTreeMap<String, String>,
    /// Each toleration as written (checked, unknown fields refused).
    pub tolerations: Vec<Value>,
    /// `affinity` as written (shape checked).
    pub affinity: Option<Value>,
    pub priority_class_name: Option<String>,
}

impl Scheduling {
    /// Sets the fields on a pod spec; fields the spec leaves out are not written at all.
    pub fn apply_to(&self, pod_spec: &mut Map<String, Value>) {
        if !self.node_selector.is_empty() {
            pod_spec.insert("nodeSelector".into(), json!(self.node_selector));
        }
        if !self.tolerations.is_empty() {
            pod_spec.insert("tolerations".into(), json!(self.tolerations));
        }
        if let Some(a) = &self.affinity {
            pod_spec.insert("affinity".into(), a.clone());
        }
        if let Some(pc) = &self.priority_class_name {
            pod_spec.insert("priorityClassName".into(), json!(pc));
        }
    }
}

const PATH: &str = "spec.scheduling";

/// Parses `spec.scheduling` and the deprecated `spec.priorityClassName` of a spec object.
pub fn parse(spec: &Value, errs: &mut Vec<FieldError>) -> Scheduling {
    let mut out = Scheduling::default();
    let legacy = priority_class(spec.get("priorityClassName"), "spec.priorityClassName", errs);
    let section = match spec.get("scheduling") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => Some(m),
        Some(_) => {
            errs.push(FieldError::new(PATH, "must be an object"));
            None
        }
    };
    if let Some(m) = section {
        for key in m.keys() {
            if !["nodeSelector", "tolerations", "affinity", "priorityClassName"].contains(&key.as_str()) {
                errs.push(FieldError::new(
                    format!("{PATH}.{key}"),
                    "is not a field of scheduling (nodeSelector, tolerations, affinity, priorityClassName)",
                ));
            }
        }
        out.node_selector = node_selector(m.get("nodeSelector"), errs);
        out.tolerations = tolerations(m.get("tolerations"), errs);
        out.affinity = affinity(m.get("affinity"), errs);
        out.priority_class_name =
            priority_class(m.get("priorityClassName"), &format!("{PATH}.priorityClassName"), errs);
    }
    match (&out.priority_class_name, legacy) {
        (Some(new), Some(old)) if *new != old => errs.push(FieldError::new(
            "spec.priorityClassName",
            format!(
                "{old:?} conflicts with spec.scheduling.priorityClassName {new:?}: spec.priorityClassName is \
                 a deprecated alias, remove it"
            ),
        )),
        (None, Some(old)) => out.priority_class_name = Some(old),
        _ => {}
    }
    out
}

fn priority_class(v: Option<&Value>, path: &str, errs: &mut Vec<FieldError>) -> Option<String> {
    match v {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => match check_dns_subdomain(s) {
            Ok(()) => Some(s.clone()),
            Err(m) => {
                errs.push(FieldError::new(path, format!("{s:?} {m}")));
                None
            }
        },
        Some(_) => {
            errs.push(FieldError::new(path, "must be a string (the name of a PriorityClass)"));
            None
        }
    }
}

fn node_selector(v: Option<&Value>, errs: &mut Vec<FieldError>) -> BTreeMap<String, String> {
    let path = format!("{PATH}.nodeSelector");
    let mut out = BTreeMap::new();
    let m = match v {
        None | Some(Value::Null) => return out,
        Some(Value::Object(m)) => m,
        Some(_) => {
            errs.push(FieldError::new(path, "must be a map of node label keys to values"));
            return out;
        }
    };
    if m.len() > MAX_ENTRIES {
        errs.push(FieldError::new(&path, format!("has {} entries, more than {MAX_ENTRIES}", m.len())));
        return out;
    }
    for (k, v) in m {
        let here = format!("{path}[{k}]");
        if let Err(msg) = check_label_key(k) {
            errs.push(FieldError::new(&here, format!("key {k:?} {msg}")));
            continue;
        }
        match v {
            Value::String(s) => match check_label_value(s) {
                Ok(()) => {
                    out.insert(k.clone(), s.clone());
                }
                Err(msg) => errs.push(FieldError::new(here, format!("value {s:?} {msg}"))),
            },
            _ => errs.push(FieldError::new(here, "must be a string (a node label value)")),
        }
    }
    out
}

const EFFECTS: [&str; 4] = ["", "NoSchedule", "PreferNoSchedule", "NoExecute"];

fn tolerations(v: Option<&Value>, errs: &mut Vec<FieldError>) -> Vec<Value> {
    let path = format!("{PATH}.tolerations");
    let list = match v {
        None | Some(Value::Null) => return Vec::new(),
        Some(Value::Array(l)) => l,
        Some(_) => {
            errs.push(FieldError::new(path, "must be a list of tolerations"));
            return Vec::new();
        }
    };
    if list.len() > MAX_ENTRIES {
        errs.push(FieldError::new(&path, format!("has {} entries, more than {MAX_ENTRIES}", list.len())));
        return Vec::new();
    }
    let mut out = Vec::new();
    for (i, t) in list.iter().enumerate() {
        let here = format!("{path}[{i}]");
        let before = errs.len();
        let Some(m) = t.as_object() else {
            errs.push(FieldError::new(here, "must be an object"));
            continue;
        };
        let mut text = |field: &str| -> Option<String> {
            match m.get(field) {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(s.clone()),
                Some(_) => {
                    errs.push(FieldError::new(format!("{here}.{field}"), "must be a string"));
                    None
                }
            }
        };
        let key = text("key").unwrap_or_default();
        let operator = text("operator").unwrap_or_else(|| "Equal".into());
        let value = text("value").unwrap_or_default();
        let effect = text("effect").unwrap_or_default();
        for field in m.keys() {
            if !["key", "operator", "value", "effect", "tolerationSeconds"].contains(&field.as_str()) {
                errs.push(FieldError::new(
                    format!("{here}.{field}"),
                    "is not a field of a toleration (key, operator, value, effect, tolerationSeconds)",
                ));
            }
        }
        if !key.is_empty() {
            if let Err(msg) = check_label_key(&key) {
                errs.push(FieldError::new(format!("{here}.key"), format!("{key:?} {msg}")));
            }
        }
        match operator.as_str() {
            "Exists" if !value.is_empty() => {
                errs.push(FieldError::new(format!("{here}.value"), "must be empty when operator is Exists"))
            }
            "Exists" => {}
            "Equal" if key.is_empty() => errs.push(FieldError::new(
                format!("{here}.operator"),
                "must be Exists when key is empty (an empty key with Exists tolerates every taint)",
            )),
            "Equal" => {
                if let Err(msg) = check_label_value(&value) {
                    errs.push(FieldError::new(format!("{here}.value"), format!("{value:?} {msg}")));
                }
            }
            other => errs.push(FieldError::new(
                format!("{here}.operator"),
                format!("{other:?} is not Exists or Equal"),
            )),
        }
        if !EFFECTS.contains(&effect.as_str()) {
            errs.push(FieldError::new(
                format!("{here}.effect"),
                format!("{effect:?} is not NoSchedule, PreferNoSchedule or NoExecute"),
            ));
        }
        match m.get("tolerationSeconds") {
            None | Some(Value::Null) => {}
            Some(Value::Number(n)) if n.is_i64() => {
                if effect != "NoExecute" {
                    errs.push(FieldError::new(
                        format!("{here}.tolerationSeconds"),
                        "only applies with effect NoExecute",
                    ));
                }
            }
            Some(_) => errs
                .push(FieldError::new(format!("{here}.tolerationSeconds"), "must be an integer (seconds)")),
        }
        if errs.len() == before {
            out.push(t.clone());
        }
    }
    out
}

/// The fields of each affinity kind, and whether each is a list (else an object).
const AFFINITY_FIELDS: [(&str, [(&str, bool); 2]); 3] = [
    (
        "nodeAffinity",
        [
            ("requiredDuringSchedulingIgnoredDuringExecution", false),
            ("preferredDuringSchedulingIgnoredDuringExecution", true),
        ],
    ),
    (
        "podAffinity",
        [
            ("requiredDuringSchedulingIgnoredDuringExecution", true),
            ("preferredDuringSchedulingIgnoredDuringExecution", true),
        ],
    ),
    (
        "podAntiAffinity",
        [
            ("requiredDuringSchedulingIgnoredDuringExecution", true),
            ("preferredDuringSchedulingIgnoredDuringExecution", true),
        ],
    ),
];

fn affinity(v: Option<&Value>, errs: &mut Vec<FieldError>) -> Option<Value> {
    let path = format!("{PATH}.affinity");
    let m = match v {
        None | Some(Value::Null) => return None,
        Some(Value::Object(m)) => m,
        Some(_) => {
            errs.push(FieldError::new(
                path,
                "must be an object (nodeAffinity, podAffinity, podAntiAffinity)",
            ));
            return None;
        }
    };
    let before = errs.len();
    for (kind, body) in m {
        let here = format!("{path}.{kind}");
        let Some((_, fields)) = AFFINITY_FIELDS.iter().find(|(k, _)| k == kind) else {
            errs.push(FieldError::new(
                here,
                "is not a kind of affinity (nodeAffinity, podAffinity, podAntiAffinity)",
            ));
            continue;
        };
        let Some(body) = body.as_object() else {
            errs.push(FieldError::new(here, "must be an object"));
            continue;
        };
        for (field, v) in body {
            match fields.iter().find(|(f, _)| f == field) {
                None => errs.push(FieldError::new(
                    format!("{here}.{field}"),
                    format!("is not a field of {kind} (requiredDuringSchedulingIgnoredDuringExecution, preferredDuringSchedulingIgnoredDuringExecution)"),
                )),
                Some((_, true)) if !v.is_array() => {
                    errs.push(FieldError::new(format!("{here}.{field}"), "must be a list"))
                }
                Some((_, false)) if !v.is_object() => {
                    errs.push(FieldError::new(format!("{here}.{field}"), "must be an object"))
                }
                Some(_) => {}
            }
        }
    }
    (errs.len() == before && !m.is_empty()).then(|| Value::Object(m.clone()))
}

fn is_alnum(b: u8) -> bool {
    b.is_ascii_alphanumeric()
}

/// A label name or value: at most 63 of `[A-Za-z0-9._-]`, alphanumeric at both ends.
fn check_label_name(s: &str) -> Result<(), String> {
    let bytes = s.as_bytes();
    if s.len() > 63 {
        return Err("must be at most 63 characters".into());
    }
    let inner_ok = bytes.iter().all(|b| is_alnum(*b) || matches!(b, b'-' | b'_' | b'.'));
    let ends_ok = bytes.first().is_some_and(|b| is_alnum(*b)) && bytes.last().is_some_and(|b| is_alnum(*b));
    if !(inner_ok && ends_ok) {
        return Err(
            "must consist of letters, digits, '-', '_' or '.', and start and end with a letter or digit"
                .into(),
        );
    }
    Ok(())
}

/// A label key: `[prefix/]name`, the prefix a DNS subdomain.
pub fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if name.is_empty() {
        return Err("is not a label key: the name part is empty".into());
    }
    check_label_name(name).map_err(|m| format!("is not a label key: the name part {m}"))?;
    if let Some(p) = prefix {
        check_dns_subdomain(p).map_err(|m| format!("is not a label key: the prefix {m}"))?;
    }
    Ok(())
}

/// A label value: empty, or a label name.
pub fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    check_label_name(value).map_err(|m| format!("is not a label value: it {m}"))
}

/// A DNS-1123 subdomain (the names of PriorityClasses, label key prefixes): dot-separated
/// labels of lower-case letters, digits and '-', each starting and ending with a letter or digit.
pub fn check_dns_subdomain(s: &str) -> Result<(), String> {
    let label_ok = |l: &str| {
        let b = l.as_bytes();
        let end = |c: Option<&u8>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && end(b.first())
            && end(b.last())
    };
    if s.is_empty() || s.len() > 253 || !s.split('.').all(label_ok) {
        return Err("must be a DNS subdomain (at most 253 characters: lower-case letters, digits, '-' \
                    and '.', each part starting and ending with a letter or digit)"
            .into());
    }
    Ok(())
}

/// The CRD schema of `spec.scheduling` (the same in every version). Kept as data
/// (scheduling_schema.json), not code: every plugin carries it and must fit a ConfigMap. Its
/// limits are this module's constants (a unit test holds them together).
pub fn schema() -> Value {
    serde_json::from_str(include_str!("scheduling_schema.json")).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(spec: Value) -> (Scheduling, Vec<String>) {
        let mut errs = Vec::new();
        let s = parse(&spec, &mut errs);
        (s, errs.into_iter().map(|e| format!("{}: {}", e.path, e.message)).collect())
    }

    #[test]
    fn a_full_section_is_taken_as_written() {
        let (s, errs) = run(json!({ "scheduling": {
            "nodeSelector": { "kubernetes.io/os": "linux", "disk": "" },
            "tolerations": [
                { "key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule" },
                { "key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30 },
            ],
            "affinity": { "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": { "nodeSelectorTerms": [] } } },
            "priorityClassName": "databases",
        }}));
        assert_eq!(errs, Vec::<String>::new());
        assert_eq!(s.node_selector.len(), 2);
        assert_eq!(s.tolerations.len(), 2);
        assert!(s.affinity.is_some());
        assert_eq!(s.priority_class_name.as_deref(), Some("databases"));
        let mut pod = Map::new();
        s.apply_to(&mut pod);
        let keys: Vec<&str> = pod.keys().map(String::as_str).collect();
        assert_eq!(keys, ["affinity", "nodeSelector", "priorityClassName", "tolerations"]);
        let mut empty = Map::new();
        Scheduling::default().apply_to(&mut empty);
        assert!(empty.is_empty(), "nothing set, nothing written");
    }

    #[test]
    fn the_deprecated_priority_class_is_an_alias() {
        let (s, errs) = run(json!({ "priorityClassName": "old" }));
        assert!(errs.is_empty());
        assert_eq!(s.priority_class_name.as_deref(), Some("old"));
        let (s, errs) =
            run(json!({ "priorityClassName": "same", "scheduling": { "priorityClassName": "same" } }));
        assert!(errs.is_empty());
        assert_eq!(s.priority_class_name.as_deref(), Some("same"));
        let (_, errs) =
            run(json!({ "priorityClassName": "old", "scheduling": { "priorityClassName": "new" } }));
        assert_eq!(errs.len(), 1);
        assert!(errs[0].starts_with("spec.priorityClassName: \"old\" conflicts with"), "{errs:?}");
    }

    #[test]
    fn bad_input_names_the_field_and_the_reason() {
        let (_, errs) = run(json!({ "priorityClassName": "Bad_Class", "scheduling": {
            "nodeSelector": { "-bad": "x", "ok": "not ok!", "n": 3 },
            "tolerations": [
                { "operator": "Equal", "value": "x" },
                { "key": "k", "operator": "Exists", "value": "v" },
                { "key": "k", "operator": "Maybe" },
                { "key": "k", "effect": "NoWay", "tolerationSeconds": 5 },
                { "key": "k", "tolerationSeconds": "5", "extra": 1 },
                "string",
            ],
            "affinity": { "nodeAffinity": { "required": [] }, "podAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": {} }, "other": {} },
            "nodeName": "n1",
        }}));
        let expect = [
            "spec.scheduling.nodeName: is not a field of scheduling",
            "spec.scheduling.nodeSelector[-bad]: key \"-bad\" is not a label key",
            "spec.scheduling.nodeSelector[n]: must be a string",
            "spec.scheduling.nodeSelector[ok]: value \"not ok!\" is not a label value",
            "spec.scheduling.tolerations[0].operator: must be Exists when key is empty",
            "spec.scheduling.tolerations[1].value: must be empty when operator is Exists",
            "spec.scheduling.tolerations[2].operator: \"Maybe\" is not Exists or Equal",
            "spec.scheduling.tolerations[3].effect: \"NoWay\" is not NoSchedule",
            "spec.scheduling.tolerations[3].tolerationSeconds: only applies with effect NoExecute",
            "spec.scheduling.tolerations[4].extra: is not a field of a toleration",
            "spec.scheduling.tolerations[4].tolerationSeconds: must be an integer",
            "spec.scheduling.tolerations[5]: must be an object",
            "spec.scheduling.affinity.nodeAffinity.required: is not a field of nodeAffinity",
            "spec.scheduling.affinity.other: is not a kind of affinity",
            "spec.scheduling.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution: must be a list",
            "spec.priorityClassName: \"Bad_Class\" must be a DNS subdomain",
        ];
        for e in expect {
            assert!(errs.iter().any(|got| got.starts_with(e)), "missing {e:?} in {errs:#?}");
        }
        assert_eq!(errs.len(), expect.len(), "{errs:#?}");
        let (_, errs) = run(json!({ "scheduling": [] }));
        assert_eq!(errs, ["spec.scheduling: must be an object"]);
        let (_, errs) = run(json!({ "scheduling": { "priorityClassName": 1 } }));
        assert_eq!(
            errs,
            ["spec.scheduling.priorityClassName: must be a string (the name of a PriorityClass)"]
        );
    }

    #[test]
    fn label_keys_values_and_subdomains() {
        for ok in ["a", "kubernetes.io/os", "node-role.kubernetes.io/control-plane", "A_b.c-9"] {
            assert!(check_label_key(ok).is_ok(), "{ok}");
        }
        for bad in ["", "/x", "x/", "Bad.Prefix/x", "a/b/c", "-a", &"a".repeat(64)] {
            assert!(check_label_key(bad).is_err(), "{bad}");
        }
        assert!(check_label_value("").is_ok());
        assert!(check_label_value("x y").is_err());
        assert!(check_dns_subdomain("system-node-critical").is_ok());
        for bad in ["a..b", ".a", "a-", "A", "a_b"] {
            assert!(check_dns_subdomain(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_schema_kept_as_data_states_the_limits_parse_applies() {
        let s = schema();
        assert_eq!(s.pointer("/properties/nodeSelector/maxProperties"), Some(&json!(MAX_ENTRIES)));
        assert_eq!(s.pointer("/properties/tolerations/maxItems"), Some(&json!(MAX_ENTRIES)));
        assert_eq!(s.pointer("/properties/tolerations/items/properties/effect/enum"), Some(&json!(EFFECTS)));
    }
}
