//! CustomResourceDefinitions rendered from what each plugin's `info()` declares, so that
//! deploy/crds is generated and can never drift from the plugins.

use serde_json::{json, Value};

use crate::runtime::KindInfo;

/// One CRD for a plugin-declared kind: every version with its schema and printer columns,
/// the status subresource, namespaced scope, and, with more than one version, `conversion` as
/// its `spec.conversion`. The caller names the conversion webhook (for deploy/crds:
/// `webhook::config::crd_conversion(&Endpoint::default(), None)`, the webhook Service; the
/// operator injects the caBundle at run time), so CRDs know nothing of the webhook server.
pub fn render(kind: &KindInfo, conversion: &Value) -> Value {
    let versions: Vec<Value> = kind
        .versions
        .iter()
        .map(|v| {
            let mut version = json!({
                "name": v.name,
                "served": v.served,
                "storage": v.storage,
                "schema": { "openAPIV3Schema": v.schema },
                "subresources": { "status": {} },
                "additionalPrinterColumns": v.printer_columns,
            });
            if v.deprecated {
                version["deprecated"] = Value::Bool(true);
            }
            version
        })
        .collect();
    let mut crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": format!("{}.{}", kind.plural, kind.group),
            "labels": { "app.kubernetes.io/managed-by": "stateward" },
        },
        "spec": {
            "group": kind.group,
            "scope": "Namespaced",
            "names": {
                "kind": kind.kind,
                "listKind": format!("{}List", kind.kind),
                "plural": kind.plural,
                "singular": kind.kind.to_lowercase(),
                "shortNames": kind.short_names,
                "categories": kind.categories,
            },
            "versions": versions,
        },
    });
    if kind.versions.len() > 1 {
        crd["spec"]["conversion"] = conversion.clone();
    }
    crd
}

/// File name under deploy/crds for a kind.
pub fn file_name(kind: &KindInfo) -> String {
    format!("{}.{}.yaml", kind.plural, kind.group)
}
