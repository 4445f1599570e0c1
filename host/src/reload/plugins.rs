//! Plugin builds shipped in ConfigMaps: how one is packed, and the checks a build passes
//! before it may replace the plugin serving its kinds.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::ByteString;
use kube::api::ObjectMeta;
use kube::ResourceExt;
use sha2::{Digest, Sha256};

use crate::policy::{DecisionContext, Gate};
use crate::policy_input::{ConfigMapRef, PluginLoad};
use crate::runtime::{KindInfo, LiveRegistry, Plugin, RuntimeError, Sandbox};

/// Label naming the plugin a ConfigMap carries (its value is the plugin's name).
pub const PLUGIN_LABEL: &str = "stateward.dev/plugin";
/// Annotation with the SHA-256 of the component (`sha256:<hex>` or bare hex).
pub const DIGEST_ANNOTATION: &str = "stateward.dev/sha256";
/// The `binaryData` key holding the component as it is.
pub const WASM_KEY: &str = "plugin.wasm";
/// The `binaryData` key holding the component gzip-compressed (what `stateward plugin pack`
/// writes: a third of the size, so a component may grow well past what a ConfigMap holds raw).
pub const WASM_GZ_KEY: &str = "plugin.wasm.gz";
/// A compressed component is refused, before anything else reads it, when it expands to more
/// than this many times its compressed size (components compress about 3:1)...
pub const MAX_EXPANSION: usize = 20;
/// ...or to more than this.
pub const MAX_COMPONENT_BYTES: usize = 16 * 1024 * 1024;
/// The API server refuses objects over 1 MiB (etcd's request limit), base64 and metadata
/// included; a component must leave room for both.
pub const MAX_CONFIGMAP_BYTES: usize = 1024 * 1024;
const METADATA_ALLOWANCE: usize = 16 * 1024;

/// Why a build was refused; `reason` is the metric label and Event reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub plugin: String,
    pub reason: &'static str,
    pub message: String,
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "plugin {} rejected ({}): {}", self.plugin, self.reason, self.message)
    }
}

/// `sha256:<hex>` of a component.
pub fn digest_of(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The most `binaryData` bytes that fit a ConfigMap once base64-encoded.
pub fn max_component_bytes() -> usize {
    (MAX_CONFIGMAP_BYTES - METADATA_ALLOWANCE) / 4 * 3
}

/// The ConfigMap that ships `bytes` as plugin `name`, compressed under [`WASM_GZ_KEY`], its
/// digest that of the component itself (what `stateward plugin pack` prints).
pub fn pack(bytes: &[u8], name: &str, namespace: &str) -> Result<ConfigMap, String> {
    if !bytes.starts_with(b"\0asm") {
        return Err("not a WebAssembly file (no \\0asm header)".into());
    }
    if bytes.len() > MAX_COMPONENT_BYTES {
        return Err(format!(
            "the component is {} bytes; the operator loads at most {MAX_COMPONENT_BYTES}",
            bytes.len()
        ));
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(bytes).map_err(|e| format!("compressing the component: {e}"))?;
    let compressed = gz.finish().map_err(|e| format!("compressing the component: {e}"))?;
    if compressed.len() > max_component_bytes() {
        return Err(format!(
            "the component is {} bytes compressed; a ConfigMap holds at most {} (1 MiB after base64 and metadata)",
            compressed.len(),
            max_component_bytes()
        ));
    }
    Ok(ConfigMap {
        metadata: ObjectMeta {
            name: Some(format!("stateward-plugin-{name}")),
            namespace: Some(namespace.to_string()),
            labels: Some([(PLUGIN_LABEL.to_string(), name.to_string())].into()),
            annotations: Some([(DIGEST_ANNOTATION.to_string(), digest_of(bytes))].into()),
            ..ObjectMeta::default()
        },
        binary_data: Some([(WASM_GZ_KEY.to_string(), ByteString(compressed))].into()),
        ..ConfigMap::default()
    })
}

/// The `binaryData` entry a ConfigMap ships its component in, as stored: exactly one of
/// [`WASM_KEY`] and [`WASM_GZ_KEY`]. Err: the rejection reason and why.
pub fn shipped(cm: &ConfigMap) -> Result<(&'static str, &[u8]), (&'static str, String)> {
    let get = |key: &str| cm.binary_data.as_ref().and_then(|d| d.get(key)).map(|b| b.0.as_slice());
    match (get(WASM_KEY), get(WASM_GZ_KEY)) {
        (Some(raw), None) => Ok((WASM_KEY, raw)),
        (None, Some(gz)) => Ok((WASM_GZ_KEY, gz)),
        (Some(_), Some(_)) => Err((
            "ambiguous_data",
            format!("binaryData holds both \"{WASM_KEY}\" and \"{WASM_GZ_KEY}\"; ship the component once"),
        )),
        (None, None) => Err((
            "missing_data",
            format!("binaryData[\"{WASM_KEY}\"] or binaryData[\"{WASM_GZ_KEY}\"] is missing"),
        )),
    }
}

/// The component a ConfigMap ships, decompressed when it is compressed: never more than
/// [`MAX_EXPANSION`] times the compressed size nor [`MAX_COMPONENT_BYTES`] is inflated, so a
/// small ConfigMap cannot make the operator allocate much.
pub fn component(cm: &ConfigMap) -> Result<Vec<u8>, (&'static str, String)> {
    let (key, data) = shipped(cm)?;
    if key == WASM_KEY {
        return Ok(data.to_vec());
    }
    let limit = MAX_COMPONENT_BYTES.min(data.len().saturating_mul(MAX_EXPANSION));
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data)
        .take(u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|e| ("bad_compression", format!("binaryData[\"{WASM_GZ_KEY}\"] is not gzip data: {e}")))?;
    if out.len() > limit {
        let bound = if limit == MAX_COMPONENT_BYTES {
            format!("{MAX_COMPONENT_BYTES} bytes")
        } else {
            format!("{MAX_EXPANSION} times its {} compressed bytes", data.len())
        };
        return Err(("too_large", format!("binaryData[\"{WASM_GZ_KEY}\"] expands to more than {bound}")));
    }
    Ok(out)
}

/// Runs every check on the build a ConfigMap carries and returns the loaded plugin, or why
/// it must not serve. Nothing is swapped here. Blocking: compiling a component takes time.
///
/// Order: the bytes and digest first (cheap); then the `stateward.plugins` policy on what the
/// ConfigMap alone tells (name, digest, size, labels), so a build it refuses is never compiled
/// nor run; then loading (compile or precompiled cache, imports, WIT version, `info()`); then
/// the policy again with the version and kinds `info()` told; then the kinds against the build
/// it replaces.
pub fn vet(
    cm: &ConfigMap,
    sandbox: &Arc<Sandbox>,
    gate: &Gate,
    registry: &LiveRegistry,
) -> Result<Plugin, Rejection> {
    let name = cm.labels().get(PLUGIN_LABEL).cloned().unwrap_or_default();
    let reject = |reason: &'static str, message: String| Rejection { plugin: name.clone(), reason, message };
    if name.is_empty() {
        return Err(reject("missing_name", format!("label {PLUGIN_LABEL} has no value")));
    }
    let (key, _) = shipped(cm).map_err(|(reason, message)| reject(reason, message))?;
    let component = component(cm).map_err(|(reason, message)| reject(reason, message))?;
    let bytes = component.as_slice();
    let declared = cm.annotations().get(DIGEST_ANNOTATION).map(|d| d.trim().to_ascii_lowercase());
    let actual = digest_of(bytes);
    match declared {
        None => return Err(reject("missing_digest", format!("annotation {DIGEST_ANNOTATION} is missing"))),
        Some(d) if d.trim_start_matches("sha256:") != actual.trim_start_matches("sha256:") => {
            return Err(reject(
                "digest_mismatch",
                format!("annotation {DIGEST_ANNOTATION} says {d}, the component in binaryData[\"{key}\"] is {actual}"),
            ));
        }
        Some(_) => {}
    }
    let ctx = DecisionContext::in_current_span(format!(
        "configmap/{}/{}",
        cm.namespace().unwrap_or_default(),
        cm.name_any()
    ));
    let configmap = ConfigMapRef { name: cm.name_any(), labels: cm.labels().clone() };
    decide(gate, &ctx, &PluginLoad::before_compile(&name, &actual, bytes.len(), configmap.clone()))
        .map_err(|m| reject("policy_denied", m))?;
    let plugin = Plugin::load(sandbox, bytes).map_err(|e| reject(load_reason(&e), e.to_string()))?;
    if plugin.name() != name {
        return Err(reject(
            "name_mismatch",
            format!(
                "the component calls itself {:?} but the label {PLUGIN_LABEL} says {name:?}",
                plugin.name()
            ),
        ));
    }
    let loaded = PluginLoad { config_map: Some(configmap), ..PluginLoad::of(&plugin, PluginLoad::CONFIGMAP) };
    decide(gate, &ctx, &loaded).map_err(|m| reject("policy_denied", m))?;
    check_kinds(&plugin, registry).map_err(|m| reject("kind_changed", m))?;
    if let Some(previous) = registry.by_name(plugin.name()) {
        check_api(&previous, &plugin).map_err(|m| reject("api_changed", m))?;
    }
    Ok(plugin)
}

/// One audited `stateward.plugins` decision; the denials (and error) when it refuses.
fn decide(gate: &Gate, ctx: &DecisionContext, load: &PluginLoad) -> Result<(), String> {
    let verdict = gate.plugin_load(ctx, load);
    if verdict.allowed() {
        return Ok(());
    }
    let mut messages = verdict.denied;
    messages.extend(verdict.error);
    Err(messages.join("; "))
}

/// A new build must serve exactly the kinds of the build it replaces; a plugin new to this
/// operator may only claim kinds no other plugin serves.
fn check_kinds(plugin: &Plugin, registry: &LiveRegistry) -> Result<(), String> {
    let kinds = |p: &Plugin| -> BTreeSet<(String, String)> {
        p.info().kinds.iter().map(|k| (k.group.clone(), k.kind.clone())).collect()
    };
    let new = kinds(plugin);
    let show = |s: &BTreeSet<(String, String)>| {
        s.iter().map(|(g, k)| format!("{k}.{g}")).collect::<Vec<_>>().join(", ")
    };
    match registry.by_name(plugin.name()) {
        Some(previous) => {
            let old = kinds(&previous);
            if old != new {
                return Err(format!(
                    "the running build serves [{}], this one declares [{}]; a plugin's kinds may not change while it runs",
                    show(&old),
                    show(&new)
                ));
            }
        }
        None => {
            for (group, kind) in &new {
                if let Some(owner) = registry.get(group, kind) {
                    return Err(format!("{kind}.{group} is already served by plugin {}", owner.name()));
                }
            }
        }
    }
    Ok(())
}

/// A replacement's kinds against the running build's, each by [`same_api`].
fn check_api(previous: &Plugin, plugin: &Plugin) -> Result<(), String> {
    for before in &previous.info().kinds {
        let after = plugin.info().kinds.iter().find(|k| k.group == before.group && k.kind == before.kind);
        if let Some(after) = after {
            same_api(before, after)?;
        }
    }
    Ok(())
}

/// What the API server and the webhook configuration know of a kind must stay as the running
/// build declared it: the plural (the CRD's name and the webhook rules' resource), the storage
/// version (what stored objects are read as), and every served version (clients and stored
/// objects' conversions use them). Adding a served version is fine.
fn same_api(before: &KindInfo, after: &KindInfo) -> Result<(), String> {
    let kind = format!("{}.{}", before.kind, before.group);
    if before.plural != after.plural {
        return Err(format!(
            "{kind}: plural {:?} would become {:?}; the CRD and the webhook rules are named by it",
            before.plural, after.plural
        ));
    }
    let storage = |k: &KindInfo| k.storage_version().map(|v| v.name.clone()).unwrap_or_default();
    if storage(before) != storage(after) {
        return Err(format!(
            "{kind}: storage version {:?} would become {:?}; objects are stored at it",
            storage(before),
            storage(after)
        ));
    }
    let served = |k: &KindInfo| -> BTreeSet<String> {
        k.versions.iter().filter(|v| v.served).map(|v| v.name.clone()).collect()
    };
    let dropped: Vec<String> = served(before).difference(&served(after)).cloned().collect();
    if !dropped.is_empty() {
        return Err(format!(
            "{kind}: served version(s) {} would no longer be served; clients and the webhooks use them",
            dropped.join(", ")
        ));
    }
    Ok(())
}

fn load_reason(err: &RuntimeError) -> &'static str {
    match err {
        RuntimeError::NotAComponent(_) => "not_a_component",
        RuntimeError::WitVersion { .. } => "wit_version",
        RuntimeError::ForbiddenImport { .. } => "forbidden_import",
        RuntimeError::MissingExport => "missing_export",
        e if e.is_trap() => "info_failed",
        e => e.label(),
    }
}
