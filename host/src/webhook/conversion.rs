//! The CRD conversion webhook: every object of a ConversionReview goes to the plugin that owns
//! its kind (`plugin.convert`). One failure fails the whole review, as the API server expects.

use std::sync::Arc;

use serde_json::{json, Value};
use tracing::Instrument as _;

use super::Webhook;
use crate::plugin_call;
use crate::telemetry::otel::webhook_span;

/// Answers one ConversionReview (any JSON in, always a ConversionReview out).
pub async fn review(webhook: Arc<Webhook>, body: Value) -> Value {
    let uid = body.pointer("/request/uid").cloned().unwrap_or(Value::String(String::new()));
    let desired =
        body.pointer("/request/desiredAPIVersion").and_then(Value::as_str).unwrap_or("").to_string();
    let objects = body.pointer("/request/objects").and_then(Value::as_array).cloned().unwrap_or_default();
    let kind = objects.first().and_then(|o| o.get("kind")).and_then(Value::as_str).unwrap_or("").to_string();
    let span = webhook_span("convert", &kind, "", "");
    span.record("desired", desired.as_str());
    span.record("objects", objects.len());
    let converted = convert_all(webhook, &desired, objects).instrument(span.clone()).await;
    span.record("result", if converted.is_ok() { "success" } else { "failure" });
    let response = match converted {
        Ok(objects) => json!({ "uid": uid, "convertedObjects": objects, "result": { "status": "Success" } }),
        Err(message) => {
            tracing::warn!(%message, "conversion failed");
            json!({ "uid": uid, "convertedObjects": [], "result": { "status": "Failure", "message": message } })
        }
    };
    json!({ "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview", "response": response })
}

async fn convert_all(
    webhook: Arc<Webhook>,
    desired: &str,
    objects: Vec<Value>,
) -> Result<Vec<Value>, String> {
    if desired.is_empty() {
        return Err("ConversionReview without desiredAPIVersion".into());
    }
    let mut out = Vec::with_capacity(objects.len());
    for object in objects {
        let api_version = object.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
        if api_version == desired {
            out.push(object);
            continue;
        }
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        let Some(plugin) = webhook.registry.get(group, kind) else {
            return Err(format!("no plugin serves {kind} {api_version}"));
        };
        let name = object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
        let (text, to) = (object.to_string(), desired.to_string());
        let converted =
            plugin_call::call(&webhook.sandbox, &webhook.metrics, &plugin, "convert", move |guest| {
                guest.convert(&text, &to)
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("{kind} {name}: {e}"))?;
        if converted.get("apiVersion").and_then(Value::as_str) != Some(desired) {
            return Err(format!("{kind} {name}: the plugin did not convert to {desired}"));
        }
        out.push(converted);
    }
    Ok(out)
}
