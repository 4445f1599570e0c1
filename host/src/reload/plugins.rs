//! Plugin builds shipped in ConfigMaps: how one is packed, and the checks a build passes
//! before it may replace the plugin serving its kinds.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::ByteString;
use kube::api::ObjectMeta;
use kube::ResourceExt;
use sha2::{Digest, Sha256};

use crate::policy::{DecisionContext, Gate, KindRef, PluginLoad};
use crate::runtime::{LiveRegistry, Plugin, RuntimeError, Sandbox};

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

/// The `stateward.plugins` policy input for a loaded build (hot-loaded or built in).
pub fn load_input(plugin: &Plugin) -> PluginLoad {
    PluginLoad {
        name: plugin.name().to_string(),
        version: plugin.version().to_string(),
        digest: format!("sha256:{}", plugin.digest()),
        size: plugin.size() as u64,
        kinds: kind_refs(plugin),
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
/// Order: the bytes and digest first (cheap), then loading (compile or precompiled cache,
/// imports, WIT version, `info()`), then the `stateward.plugins` policy, which needs the
/// version and kinds that only `info()` tells, then the kinds against the build it replaces.
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
    let plugin = Plugin::load(sandbox, bytes).map_err(|e| reject(load_reason(&e), e.to_string()))?;
    if plugin.name() != name {
        return Err(reject(
            "name_mismatch",
            format!("the component calls itself {:?} but the label {PLUGIN_LABEL} says {name:?}", plugin.name()),
        ));
    }
    let verdict = gate.plugin_load(
        &DecisionContext { requested_by: format!("configmap/{}/{}", cm.namespace().unwrap_or_default(), cm.name_any()), ..DecisionContext::default() },
        &load_input(&plugin),
    );
    if !verdict.allowed() {
        let mut messages = verdict.denied.clone();
        messages.extend(verdict.error.clone());
        return Err(reject("policy_denied", messages.join("; ")));
    }
    check_kinds(&plugin, registry).map_err(|m| reject("kind_changed", m))?;
    Ok(plugin)
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

/// The kinds a plugin declares, as the policy input names them (`group/storageVersion`).
pub fn kind_refs(plugin: &Plugin) -> Vec<KindRef> {
    plugin
        .info()
        .kinds
        .iter()
        .map(|k| KindRef {
            api_version: format!("{}/{}", k.group, k.storage_version().map_or("", |v| v.name.as_str())),
            kind: k.kind.clone(),
        })
        .collect()
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
