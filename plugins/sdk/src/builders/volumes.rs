//! Growing data volumes. A StatefulSet's claim template cannot change once created, so a larger
//! `spec.storage.size` is applied to each existing data claim instead (online expansion: the
//! storage class must allow it, `allowVolumeExpansion: true`; the API server says so if not).
//! The template keeps the size it was created with; a member added later starts from it and is
//! grown on the next pass. Volumes never shrink: `validate` refuses a smaller size.

use serde_json::{json, Value};

use super::{Ctx, DATA_VOLUME, INSTANCE_LABEL};
use crate::json::str_at;
use crate::spec::parse_quantity;

/// The requested size of the data claim template of an existing StatefulSet.
pub fn template_size(statefulset: &Value) -> Option<String> {
    statefulset
        .pointer("/spec/volumeClaimTemplates")?
        .as_array()?
        .iter()
        .find(|t| t.pointer("/metadata/name").and_then(Value::as_str) == Some(DATA_VOLUME))?
        .pointer("/spec/resources/requests/storage")?
        .as_str()
        .map(str::to_string)
}

/// A partial claim raising the storage request of every data claim of this cluster that asks
/// for less than `spec.storage.size` (server-side applied: only that field is ours). Claims
/// whose request cannot be read are left alone.
pub fn grow_claims(ctx: &Ctx, children: &[Value]) -> Vec<Value> {
    let size = &ctx.cluster.spec.storage.size;
    let Some(want) = parse_quantity(size) else { return Vec::new() };
    let prefix = format!("{DATA_VOLUME}-{}-", ctx.name());
    children
        .iter()
        .filter(|c| str_at(c, &["kind"]) == Some("PersistentVolumeClaim"))
        .filter(|c| str_at(c, &["metadata", "labels", INSTANCE_LABEL]) == Some(ctx.name()))
        .filter_map(|c| {
            let name = str_at(c, &["metadata", "name"])?;
            let ordinal = name.strip_prefix(&prefix)?;
            if ordinal.is_empty() || !ordinal.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let have = parse_quantity(c.pointer("/spec/resources/requests/storage")?.as_str()?)?;
            (have < want).then(|| {
                json!({
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": { "name": name, "labels": ctx.stable_labels() },
                    "spec": { "resources": { "requests": { "storage": size } } },
                })
            })
        })
        .collect()
}
