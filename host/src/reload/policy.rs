//! Policy bundles shipped in ConfigMaps: every ConfigMap labelled `stateward.dev/policy=true`
//! contributes its `*.rego` and `*.json` keys, and together they make a layer over the policy
//! floor (crate::policy::floor), never a replacement of it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;

use crate::policy::{Bundle, BundleFile, PolicyEngine, PolicyError};

/// Label selecting the ConfigMaps that make up the policy bundle.
pub const POLICY_LABEL: &str = "stateward.dev/policy";

/// Why a bundle was refused; `reason` is the metric label and Event reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleRejection {
    pub reason: &'static str,
    pub message: String,
}

/// The bundle the labelled ConfigMaps make, keyed by ConfigMap name; `None` when there are
/// none (the floor decides alone). Keys are bundle file names; two ConfigMaps may not
/// carry the same key.
pub fn bundle_of(configmaps: &BTreeMap<String, ConfigMap>) -> Result<Option<Bundle>, BundleRejection> {
    if configmaps.is_empty() {
        return Ok(None);
    }
    let mut files: BTreeMap<String, (String, String)> = BTreeMap::new();
    for (cm_name, cm) in configmaps {
        for (key, contents) in cm.data.iter().flatten() {
            if let Some((other, _)) = files.get(key) {
                return Err(BundleRejection {
                    reason: "duplicate_file",
                    message: format!("{key} is in both ConfigMap {other} and ConfigMap {cm_name}"),
                });
            }
            files.insert(key.clone(), (cm_name.clone(), contents.clone()));
        }
    }
    let files = files.into_iter().map(|(name, (_, contents))| BundleFile { name, contents });
    Bundle::from_files(files)
        .map(Some)
        .map_err(|e| BundleRejection { reason: "invalid_bundle", message: e.to_string() })
}

/// How long checking a bundle (compile, first evaluation, tests) may take in all; each
/// evaluation in it has its own, shorter bound ([`crate::policy::engine::EVAL_TIME_LIMIT`]).
pub const VET_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Compiles a bundle and runs its tests; any failure rejects the bundle whole.
pub fn vet(bundle: &Bundle) -> Result<PolicyEngine, BundleRejection> {
    PolicyEngine::compile_tested(bundle).map_err(|e| {
        let reason = match e {
            PolicyError::TestBundle(_) => "tests_failed",
            PolicyError::Bound(_) => "bound_exceeded",
            _ => "compile_failed",
        };
        BundleRejection { reason, message: e.to_string() }
    })
}

/// The names of the ConfigMaps in a set, for messages.
pub fn names(configmaps: &BTreeMap<String, ConfigMap>) -> String {
    configmaps.values().map(|c| c.name_any()).collect::<Vec<_>>().join(", ")
}
