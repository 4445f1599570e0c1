//! Plugin builds shipped in ConfigMaps: how one is packed, and the checks a build passes
//! before it may replace the plugin serving its kinds.

use std::collections::BTreeSet;
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
/// The `binaryData` key holding the component.
pub const WASM_KEY: &str = "plugin.wasm";
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

/// The largest component that fits a ConfigMap once base64-encoded.
pub fn max_component_bytes() -> usize {
    (MAX_CONFIGMAP_BYTES - METADATA_ALLOWANCE) / 4 * 3
}

/// The ConfigMap that ships `bytes` as plugin `name` (what `stateward plugin pack` prints).
pub fn pack(bytes: &[u8], name: &str, namespace: &str) -> Result<ConfigMap, String> {
    if bytes.len() > max_component_bytes() {
        return Err(format!(
            "the component is {} bytes; a ConfigMap holds at most {} (1 MiB after base64 and metadata)",
            bytes.len(),
            max_component_bytes()
        ));
    }
    if !bytes.starts_with(b"\0asm") {
        return Err("not a WebAssembly file (no \\0asm header)".into());
    }
    Ok(ConfigMap {
        metadata: ObjectMeta {
            name: Some(format!("stateward-plugin-{name}")),
            namespace: Some(namespace.to_string()),
            labels: Some([(PLUGIN_LABEL.to_string(), name.to_string())].into()),
            annotations: Some([(DIGEST_ANNOTATION.to_string(), digest_of(bytes))].into()),
            ..ObjectMeta::default()
        },
        binary_data: Some([(WASM_KEY.to_string(), ByteString(bytes.to_vec()))].into()),
        ..ConfigMap::default()
    })
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
    let bytes = cm
        .binary_data
        .as_ref()
        .and_then(|d| d.get(WASM_KEY))
        .map(|b| b.0.as_slice())
        .ok_or_else(|| reject("missing_data", format!("binaryData[\"{WASM_KEY}\"] is missing")))?;
    let declared = cm.annotations().get(DIGEST_ANNOTATION).map(|d| d.trim().to_ascii_lowercase());
    let actual = digest_of(bytes);
    match declared {
        None => return Err(reject("missing_digest", format!("annotation {DIGEST_ANNOTATION} is missing"))),
        Some(d) if d.trim_start_matches("sha256:") != actual.trim_start_matches("sha256:") => {
            return Err(reject(
                "digest_mismatch",
                format!("annotation {DIGEST_ANNOTATION} says {d}, binaryData[\"{WASM_KEY}\"] is {actual}"),
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
