//! Growing data volumes. A StatefulSet's claim template cannot change once created, so a larger
//! `spec.storage.size` is applied to each existing data claim instead (online expansion: the
//! storage class must allow it, `allowVolumeExpansion: true`; the API server says so if not).
//! The template keeps the size it was created with; a member added later starts from it and is
//! grown on the next pass. Volumes never shrink: `validate` refuses a smaller size.

use serde_json::{json, Value};

use super::{Ctx, MemberSet, DATA_VOLUME, INSTANCE_LABEL};
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

/// The data claims of one member set among the children: labelled with the cluster's instance
/// and named `data-<statefulset>-<ordinal>` as its claim template makes them.
fn data_claims<'a>(
    ctx: &'a Ctx,
    set: &MemberSet,
    children: &'a [Value],
) -> impl Iterator<Item = (&'a str, &'a Value)> + 'a {
    let prefix = format!("{DATA_VOLUME}-{}-", set.statefulset(ctx));
    children
        .iter()
        .filter(|c| str_at(c, &["kind"]) == Some("PersistentVolumeClaim"))
        .filter(|c| str_at(c, &["metadata", "labels", INSTANCE_LABEL]) == Some(ctx.name()))
        .filter_map(move |c| {
            let name = str_at(c, &["metadata", "name"])?;
            let ordinal = name.strip_prefix(&prefix)?;
            (!ordinal.is_empty() && ordinal.bytes().all(|b| b.is_ascii_digit())).then_some((name, c))
        })
}

/// A partial claim raising the storage request of every data claim of one member set that asks
/// for less than its size (server-side applied: only that field is ours). Claims whose request
/// cannot be read are left alone.
pub fn grow_claims(ctx: &Ctx, set: &MemberSet, children: &[Value]) -> Vec<Value> {
    let size = &set.storage_size;
    let Some(want) = parse_quantity(size) else { return Vec::new() };
    data_claims(ctx, set, children)
        .filter_map(|(name, c)| {
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

/// While any bound data claim of one member set has less capacity than its size, a message
/// saying how many have it (the resize runs in the storage driver and the kubelet; the claims'
/// status shows when it is done).
pub fn resizing(ctx: &Ctx, set: &MemberSet, children: &[Value]) -> Option<String> {
    let size = &set.storage_size;
    let want = parse_quantity(size)?;
    let capacities: Vec<Option<u128>> = data_claims(ctx, set, children)
        .filter(|(_, c)| str_at(c, &["status", "phase"]) == Some("Bound"))
        .map(|(_, c)| c.pointer("/status/capacity/storage").and_then(Value::as_str).and_then(parse_quantity))
        .collect();
    let done = capacities.iter().filter(|c| c.is_some_and(|c| c >= want)).count();
    (done < capacities.len()).then(|| format!("{done} of {} data claims have {size}", capacities.len()))
}
