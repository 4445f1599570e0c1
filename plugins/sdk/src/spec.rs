//! Parsing of the common `spec` (storage version v1) into typed values, with field paths.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::json::{at, i64_at, str_at};
use crate::scheduling::{self, Scheduling};
use crate::types::FieldError;

/// Objects larger than this are refused before parsing: no CR of ours comes near it.
pub const MAX_OBJECT_BYTES: usize = 256 * 1024;
/// Longest CR name: `<name>-headless` and the StatefulSet's revision label must stay ≤ 63.
pub const MAX_NAME_LEN: usize = 40;
/// Replica bounds, as in the CRD schema.
pub const MIN_REPLICAS: i64 = 1;
/// See [`MIN_REPLICAS`].
pub const MAX_REPLICAS: i64 = 50;
/// Replicas when the spec omits them and the plugin derives no other number (the CRD sets no
/// default: see `Blueprint::default_replicas`).
pub const DEFAULT_REPLICAS: i64 = 3;

/// What happens to the volumes when the cluster is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    Retain,
    Delete,
}

impl Retention {
    /// The spelling used in the CRD and the StatefulSet policy.
    pub fn as_str(self) -> &'static str {
        match self {
            Retention::Retain => "Retain",
            Retention::Delete => "Delete",
        }
    }
}

/// `spec.storage`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Storage {
    pub size: String,
    pub class_name: Option<String>,
}

/// CPU and memory quantities, as written by the user.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceList {
    pub cpu: Option<String>,
    pub memory: Option<String>,
}

/// `spec.resources`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    pub requests: ResourceList,
    pub limits: ResourceList,
}

/// The common spec every stateward kind shares (v1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSpec {
    pub version: String,
    pub replicas: i64,
    pub image: Option<String>,
    pub storage: Storage,
    pub retention: Retention,
    pub resources: Resources,
    /// `spec.scheduling`, with the deprecated `spec.priorityClassName` folded in.
    pub scheduling: Scheduling,
    pub deletion_protection: bool,
    /// `spec.paused`: the operator makes no change to the children until it is false again.
    pub paused: bool,
    /// `spec.hibernate`: every pod stopped, volumes and Secrets kept, until it is false again.
    pub hibernate: bool,
    /// `spec.waitForRedundancy` (default true): creation ends (phase Running, `Available`)
    /// only once the copies the spec promises exist (see `crate::redundancy`).
    pub wait_for_redundancy: bool,
    pub parameters: BTreeMap<String, String>,
    /// The whole `spec` as given, for the plugin's own fields (`Blueprint::spec_extra_schema`,
    /// checked by `Blueprint::validate_spec` before a reconcile sees them).
    pub raw: Value,
}

/// A parsed custom resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    pub name: String,
    pub generation: i64,
    pub deleting: bool,
    /// `.status.phase` as last written, to notice phase changes.
    pub last_phase: Option<String>,
    /// The [`RESTARTED_AT_ANNOTATION`] value: a change rolls the pods in the service's order.
    pub restarted_at: Option<String>,
    /// The pods [`crate::fence::FENCED_ANNOTATION`] fences, sorted.
    pub fenced: Vec<String>,
    pub spec: ClusterSpec,
}

/// Annotation on a resource asking for a rolling restart (any new value, usually the time it
/// was asked, as `kubectl stateward restart` writes it); copied onto the pod template.
pub const RESTARTED_AT_ANNOTATION: &str = "stateward.dev/restarted-at";
/// Longest [`RESTARTED_AT_ANNOTATION`] value: it lands in every pod template.
const MAX_RESTARTED_AT_BYTES: usize = 64;

/// Parses JSON text into an object, refusing oversized or non-object input.
pub fn parse_object(text: &str) -> Result<Value, FieldError> {
    if text.len() > MAX_OBJECT_BYTES {
        return Err(FieldError::new(
            "",
            format!("object is {} bytes, more than the {MAX_OBJECT_BYTES} allowed", text.len()),
        ));
    }
    let v: Value =
        serde_json::from_str(text).map_err(|e| FieldError::new("", format!("not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(FieldError::new("", "expected a JSON object"));
    }
    Ok(v)
}

/// Parses a CR (storage version) into a [`Cluster`], collecting every field error.
pub fn parse_cluster(obj: &Value) -> Result<Cluster, Vec<FieldError>> {
    let mut errs = Vec::new();
    let name = str_at(obj, &["metadata", "name"]).unwrap_or_default().to_string();
    if let Err(m) = check_name(&name) {
        errs.push(FieldError::new("metadata.name", m));
    }
    let spec = match obj.get("spec") {
        Some(s) if s.is_object() => s,
        Some(_) => {
            errs.push(FieldError::new("spec", "must be an object"));
            return Err(errs);
        }
        None => {
            errs.push(FieldError::new("spec", "is required"));
            return Err(errs);
        }
    };
    let version = match spec.get("version") {
        Some(Value::String(s)) if valid_version(s) => s.clone(),
        Some(Value::String(s)) => {
            errs.push(FieldError::new("spec.version", format!("{s:?} is not a version like 17 or 8.15.3")));
            String::new()
        }
        Some(_) => {
            errs.push(FieldError::new("spec.version", "must be a string"));
            String::new()
        }
        None => {
            errs.push(FieldError::new("spec.version", "is required"));
            String::new()
        }
    };
    let replicas = match spec.get("replicas") {
        None => DEFAULT_REPLICAS,
        Some(v) => match v.as_i64() {
            Some(n) if (MIN_REPLICAS..=MAX_REPLICAS).contains(&n) => n,
            Some(n) => {
                errs.push(FieldError::new(
                    "spec.replicas",
                    format!("{n} is outside {MIN_REPLICAS}..={MAX_REPLICAS}"),
                ));
                DEFAULT_REPLICAS
            }
            None => {
                errs.push(FieldError::new("spec.replicas", "must be an integer"));
                DEFAULT_REPLICAS
            }
        },
    };
    let image = opt_string(spec, "image", "spec.image", &mut errs);
    if let Some(img) = &image {
        if img.is_empty() || img.chars().any(char::is_whitespace) {
            errs.push(FieldError::new("spec.image", "must be a non-empty image reference without spaces"));
        }
    }
    let storage = parse_storage(spec, &mut errs);
    let retention = match spec.get("retentionPolicy") {
        None => Retention::Retain,
        Some(Value::String(s)) if s == "Retain" => Retention::Retain,
        Some(Value::String(s)) if s == "Delete" => Retention::Delete,
        Some(_) => {
            errs.push(FieldError::new("spec.retentionPolicy", "must be Retain or Delete"));
            Retention::Retain
        }
    };
    let resources = parse_resources(spec, &mut errs);
    let scheduling = scheduling::parse(spec, &mut errs);
    let deletion_protection = opt_bool(spec, "deletionProtection", &mut errs);
    let paused = opt_bool(spec, "paused", &mut errs);
    let hibernate = opt_bool(spec, "hibernate", &mut errs);
    let wait_for_redundancy = match spec.get("waitForRedundancy") {
        None | Some(Value::Null) => true,
        Some(_) => opt_bool(spec, "waitForRedundancy", &mut errs),
    };
    let restarted_at = restarted_at(obj, &mut errs);
    let fenced = crate::fence::parse(obj, &mut errs);
    let mut parameters = BTreeMap::new();
    match spec.get("parameters") {
        None => {}
        Some(Value::Object(m)) => {
            for (k, v) in m {
                match v {
                    Value::String(s) => {
                        parameters.insert(k.clone(), s.clone());
                    }
                    _ => errs.push(FieldError::new(format!("spec.parameters.{k}"), "must be a string")),
                }
            }
        }
        Some(_) => errs.push(FieldError::new("spec.parameters", "must be a map of strings")),
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    Ok(Cluster {
        name,
        generation: i64_at(obj, &["metadata", "generation"]).unwrap_or(0),
        deleting: at(obj, &["metadata", "deletionTimestamp"]).is_some_and(|v| !v.is_null()),
        last_phase: str_at(obj, &["status", "phase"]).map(str::to_string),
        restarted_at,
        fenced,
        spec: ClusterSpec {
            version,
            replicas,
            image,
            storage,
            retention,
            resources,
            scheduling,
            deletion_protection,
            paused,
            hibernate,
            wait_for_redundancy,
            parameters,
            raw: spec.clone(),
        },
    })
}

/// `spec.<key>` as a boolean, false when absent.
fn opt_bool(spec: &Value, key: &str, errs: &mut Vec<FieldError>) -> bool {
    match spec.get(key) {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            errs.push(FieldError::new(format!("spec.{key}"), "must be a boolean"));
            false
        }
    }
}

/// The restart request, if any: short printable text (it becomes a pod-template annotation).
fn restarted_at(obj: &Value, errs: &mut Vec<FieldError>) -> Option<String> {
    let value = obj.pointer("/metadata/annotations")?.get(RESTARTED_AT_ANNOTATION)?;
    let path = format!("metadata.annotations[{RESTARTED_AT_ANNOTATION}]");
    match value.as_str() {
        Some(v) if v.len() <= MAX_RESTARTED_AT_BYTES && v.chars().all(|c| c.is_ascii_graphic()) => {
            Some(v.to_string())
        }
        _ => {
            errs.push(FieldError::new(
                path,
                format!("must be at most {MAX_RESTARTED_AT_BYTES} printable characters without spaces, e.g. a time"),
            ));
            None
        }
    }
}

fn opt_string(spec: &Value, key: &str, path: &str, errs: &mut Vec<FieldError>) -> Option<String> {
    match spec.get(key) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            errs.push(FieldError::new(path, "must be a string"));
            None
        }
    }
}

fn parse_storage(spec: &Value, errs: &mut Vec<FieldError>) -> Storage {
    let mut out = Storage { size: String::new(), class_name: None };
    let Some(st) = spec.get("storage") else {
        errs.push(FieldError::new("spec.storage", "is required"));
        return out;
    };
    if !st.is_object() {
        errs.push(FieldError::new("spec.storage", "must be an object"));
        return out;
    }
    match st.get("size") {
        Some(Value::String(s)) => match parse_quantity(s) {
            Some(q) if q >= 1_000 * 1024 * 1024 => out.size = s.clone(),
            Some(_) => errs.push(FieldError::new("spec.storage.size", "must be at least 1Mi")),
            None => {
                errs.push(FieldError::new("spec.storage.size", format!("{s:?} is not a quantity like 10Gi")))
            }
        },
        Some(_) => errs.push(FieldError::new("spec.storage.size", "must be a string such as 10Gi")),
        None => errs.push(FieldError::new("spec.storage.size", "is required")),
    }
    out.class_name = opt_string(st, "className", "spec.storage.className", errs);
    out
}

fn parse_resources(spec: &Value, errs: &mut Vec<FieldError>) -> Resources {
    resources_at(spec, "spec", errs)
}

/// `<path>.resources` of `parent` (e.g. a plugin's own member set), as `spec.resources` is read.
pub fn resources_at(parent: &Value, path: &str, errs: &mut Vec<FieldError>) -> Resources {
    let mut out = Resources::default();
    let Some(r) = parent.get("resources") else { return out };
    if !r.is_object() {
        errs.push(FieldError::new(format!("{path}.resources"), "must be an object"));
        return out;
    }
    for (key, list) in [("requests", &mut out.requests), ("limits", &mut out.limits)] {
        let Some(l) = r.get(key) else { continue };
        for (res, slot) in [("cpu", &mut list.cpu), ("memory", &mut list.memory)] {
            let path = format!("{path}.resources.{key}.{res}");
            match l.get(res) {
                None | Some(Value::Null) => {}
                Some(Value::String(s)) if parse_quantity(s).is_some() => *slot = Some(s.clone()),
                Some(Value::Number(n)) if n.as_u64().is_some() => *slot = Some(n.to_string()),
                Some(_) => errs.push(FieldError::new(path, "is not a quantity like 500m or 1Gi")),
            }
        }
    }
    out
}

/// Checks a CR name: a DNS-1035 label short enough for every derived child name.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("is required".into());
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!("must be at most {MAX_NAME_LEN} characters (child names derive from it)"));
    }
    let ok_chars = name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let first_ok = name.bytes().next().is_some_and(|b| b.is_ascii_lowercase());
    let last_ok = name.bytes().last().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !(ok_chars && first_ok && last_ok) {
        return Err(
            "must be a DNS-1035 label (lower-case letters, digits, '-', starting with a letter)".into()
        );
    }
    Ok(())
}

/// The pattern of `spec.version` in the CRD schema; [`valid_version`] implements it.
pub const VERSION_PATTERN: &str = r"^[0-9]+(\.[0-9]+){0,2}(-[a-z0-9]+)?$";

/// Checks `spec.version` against [`VERSION_PATTERN`] without a regex engine.
pub fn valid_version(v: &str) -> bool {
    let (nums, suffix) = match v.split_once('-') {
        Some((n, s)) => (n, Some(s)),
        None => (v, None),
    };
    let parts: Vec<&str> = nums.split('.').collect();
    let nums_ok = parts.len() <= 3
        && parts.iter().all(|p| !p.is_empty() && p.len() <= 9 && p.bytes().all(|b| b.is_ascii_digit()));
    let suffix_ok = suffix
        .is_none_or(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
    nums_ok && suffix_ok
}

/// The numeric parts of a version, e.g. "8.15.3" → [8, 15, 3].
pub fn version_numbers(v: &str) -> Vec<u64> {
    let nums = v.split('-').next().unwrap_or_default();
    nums.split('.').filter_map(|p| p.parse().ok()).collect()
}

/// Parses a Kubernetes quantity ("500m", "1.5Gi", "2") into milli-units.
pub fn parse_quantity(s: &str) -> Option<u128> {
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let mult: u128 = match suffix {
        "" => 1_000,
        "m" => 1,
        "k" => 1_000_000,
        "M" => 1_000_000_000,
        "G" => 1_000_000_000_000,
        "T" => 1_000_000_000_000_000,
        "Ki" => 1_000 << 10,
        "Mi" => 1_000 << 20,
        "Gi" => 1_000 << 30,
        "Ti" => 1_000 << 40,
        "Pi" => 1_000 << 50,
        _ => return None,
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() || int.len() > 15 || frac.len() > 6 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let scale = 10u128.pow(u32::try_from(frac.len()).ok()?);
    let whole: u128 = format!("{int}{frac}").parse().ok()?;
    let milli = whole.checked_mul(mult)? / scale;
    // "1.5m" would be a fraction of a milli-unit: Kubernetes rounds up, we refuse.
    if whole.checked_mul(mult)? % scale != 0 {
        return None;
    }
    Some(milli)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("500m"), Some(500));
        assert_eq!(parse_quantity("2"), Some(2_000));
        assert_eq!(parse_quantity("1Gi"), Some(1_000 << 30));
        assert_eq!(parse_quantity("1.5Gi"), Some(1_500 << 30));
        assert_eq!(parse_quantity("10G"), Some(10_000_000_000_000));
        for bad in ["", "Gi", "1.2.3", "1X", "-1", "1e3", "abc", "1.5m"] {
            assert_eq!(parse_quantity(bad), None, "{bad}");
        }
    }

    #[test]
    fn versions() {
        for ok in ["17", "17.2", "8.15.3", "7-alpine"] {
            assert!(valid_version(ok), "{ok}");
        }
        for bad in ["", "v17", "1.2.3.4", "17.", "17-", "17-Alpine", "latest"] {
            assert!(!valid_version(bad), "{bad}");
        }
        assert_eq!(version_numbers("8.15.3"), vec![8, 15, 3]);
    }

    #[test]
    fn names() {
        assert!(check_name("pg-main").is_ok());
        for bad in ["", "Pg", "1pg", "pg-", "pg_main", &"a".repeat(41)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }
}
