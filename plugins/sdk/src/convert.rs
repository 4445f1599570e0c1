//! Lossless conversion between v1 (storage) and v1alpha1.
//!
//! v1alpha1 has flat `storageSize`/`storageClassName` and no `deletionProtection`. What
//! v1alpha1 cannot hold travels in the annotation [`CONVERSION_ANNOTATION`] and is restored
//! on the way back, so v1 → v1alpha1 → v1 (and the reverse) returns the original object.

use serde_json::{json, Map, Value};

use crate::schema::{GROUP, V1, V1ALPHA1};
use crate::spec::parse_object;

/// Annotation carrying v1-only fields while an object is served as v1alpha1.
pub const CONVERSION_ANNOTATION: &str = "stateward.dev/conversion-data";

/// Converts a CR of any stateward kind to `to_version`: "v1" or the full "stateward.dev/v1".
pub fn convert(object: &str, to_version: &str) -> Result<String, String> {
    let to_version = to_version.strip_prefix(GROUP).and_then(|v| v.strip_prefix('/')).unwrap_or(to_version);
    let mut obj = parse_object(object).map_err(|e| e.message)?;
    let from = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .and_then(|a| a.strip_prefix(GROUP))
        .and_then(|a| a.strip_prefix('/'))
        .map(str::to_string)
        .ok_or_else(|| format!("apiVersion is not {GROUP}/<version>"))?;
    for v in [&from, &to_version.to_string()] {
        if v != V1 && v != V1ALPHA1 {
            return Err(format!("unknown version {v:?}: expected {V1} or {V1ALPHA1}"));
        }
    }
    match (from.as_str(), to_version) {
        (V1, V1ALPHA1) => to_alpha(&mut obj)?,
        (V1ALPHA1, V1) => to_v1(&mut obj)?,
        _ => {}
    }
    if let Some(m) = obj.as_object_mut() {
        m.insert("apiVersion".into(), json!(format!("{GROUP}/{to_version}")));
    }
    Ok(obj.to_string())
}

fn spec_mut(obj: &mut Value) -> Result<Option<&mut Map<String, Value>>, String> {
    match obj.get_mut("spec") {
        None => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(_) => Err("spec must be an object".into()),
    }
}

fn annotations_mut(obj: &mut Value) -> Result<&mut Map<String, Value>, String> {
    let meta = obj
        .as_object_mut()
        .ok_or("object expected")?
        .entry("metadata")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .ok_or("metadata must be an object")?;
    meta.entry("annotations")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .ok_or_else(|| "metadata.annotations must be an object".to_string())
}

fn to_alpha(obj: &mut Value) -> Result<(), String> {
    let mut saved = Map::new();
    if let Some(spec) = spec_mut(obj)? {
        if let Some(storage) = spec.remove("storage") {
            match storage {
                Value::Object(mut st) => {
                    if let Some(size) = st.remove("size") {
                        spec.insert("storageSize".into(), size);
                    }
                    if let Some(class) = st.remove("className") {
                        spec.insert("storageClassName".into(), class);
                    }
                    if !st.is_empty() {
                        saved.insert("storage".into(), Value::Object(st));
                    }
                }
                other => {
                    saved.insert("storage".into(), other);
                }
            }
        } else {
            saved.insert("noStorage".into(), json!(true));
        }
        if let Some(dp) = spec.remove("deletionProtection") {
            saved.insert("deletionProtection".into(), dp);
        }
    }
    if !saved.is_empty() {
        annotations_mut(obj)?.insert(CONVERSION_ANNOTATION.into(), json!(Value::Object(saved).to_string()));
    }
    Ok(())
}

fn to_v1(obj: &mut Value) -> Result<(), String> {
    let saved: Map<String, Value> = match remove_annotation(obj) {
        Some(text) => match serde_json::from_str(&text) {
            Ok(Value::Object(m)) => m,
            _ => return Err(format!("annotation {CONVERSION_ANNOTATION} is not a JSON object")),
        },
        None => Map::new(),
    };
    let Some(spec) = spec_mut(obj)? else { return Ok(()) };
    let mut storage = match saved.get("storage") {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    if let Some(size) = spec.remove("storageSize") {
        storage.insert("size".into(), size);
    }
    if let Some(class) = spec.remove("storageClassName") {
        storage.insert("className".into(), class);
    }
    match saved.get("storage") {
        Some(v) if !v.is_object() => {
            spec.insert("storage".into(), v.clone());
        }
        _ if saved.get("noStorage") == Some(&json!(true)) && storage.is_empty() => {}
        _ => {
            spec.insert("storage".into(), Value::Object(storage));
        }
    }
    if let Some(dp) = saved.get("deletionProtection") {
        spec.insert("deletionProtection".into(), dp.clone());
    }
    Ok(())
}

/// Takes the conversion annotation out, dropping `annotations` if that emptied it.
fn remove_annotation(obj: &mut Value) -> Option<String> {
    let meta = obj.get_mut("metadata")?.as_object_mut()?;
    let ann = meta.get_mut("annotations")?.as_object_mut()?;
    let text = ann.remove(CONVERSION_ANNOTATION)?.as_str().map(str::to_string);
    if ann.is_empty() {
        meta.remove("annotations");
    }
    text
}
