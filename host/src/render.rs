//! `stateward render`: a plugin's plan for a resource, offline, with no cluster.

use serde_json::Value;

use crate::runtime::{Action, Observed, Plan, Registry, Response, RuntimeError};

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("{what}: {reason}")]
    Input { what: String, reason: String },
    #[error("no loaded plugin serves {api_version} {kind}")]
    NoPlugin { api_version: String, kind: String },
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// The plan for one resource, with who made it.
#[derive(Debug, serde::Serialize)]
pub struct Rendered {
    pub plugin: RenderedBy,
    /// The resource at its storage version, as the plugin saw it.
    pub resource: Value,
    pub plan: Plan,
    /// The guardrails' verdict on the plan, when a policy bundle was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyVerdict>,
}

/// What the guardrails would decide, so a held-back plan is visible before anything runs.
#[derive(Debug, serde::Serialize)]
pub struct PolicyVerdict {
    pub allowed: bool,
    /// (target, message) for each enforced deny.
    pub denied: Vec<(String, String)>,
    pub warned: Vec<(String, String)>,
}

/// The plugin build that made a rendered plan (`plugin` in the output; digest as bare hex).
#[derive(Debug, serde::Serialize)]
pub struct RenderedBy {
    pub name: String,
    pub version: String,
    pub digest: String,
}

fn input_err(what: &str, reason: impl Into<String>) -> RenderError {
    RenderError::Input { what: what.to_string(), reason: reason.into() }
}

/// Parses one or more YAML (or JSON) documents, skipping empty ones.
pub fn parse_documents(text: &str, what: &str) -> Result<Vec<Value>, RenderError> {
    let mut docs = Vec::new();
    for (i, doc) in yaml_serde::Deserializer::from_str(text).enumerate() {
        let value: Value = serde::Deserialize::deserialize(doc)
            .map_err(|e| input_err(what, format!("document {}: {e}", i + 1)))?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

/// Like [`render`], then asks the guardrails about every action of the plan.
pub fn render_checked(
    registry: &Registry,
    gate: &crate::policy::Gate,
    resource: Value,
    children: &[Value],
    responses: &[Response],
    now_ms: u64,
) -> Result<Rendered, RenderError> {
    let mut rendered = match render(registry, resource.clone(), children, responses, now_ms) {
        Ok(rendered) => rendered,
        Err(RenderError::Runtime(err)) => {
            // A plan the host refused is audited like a denial, as the operator audits it.
            let api_version = str_at(&resource, "/apiVersion").unwrap_or_default();
            let kind = str_at(&resource, "/kind").unwrap_or_default();
            if let Some(plugin) = registry.for_object(api_version, kind) {
                crate::guardrails::record_refusal(gate, plugin, &resource, &err);
            }
            return Err(RenderError::Runtime(err));
        }
        Err(other) => return Err(other),
    };
    let api_version = str_at(&rendered.resource, "/apiVersion").unwrap_or_default();
    let kind = str_at(&rendered.resource, "/kind").unwrap_or_default();
    if let Some(plugin) = registry.for_object(api_version, kind) {
        let verdict = crate::guardrails::check(
            gate,
            plugin,
            &rendered.resource,
            children,
            &rendered.plan.actions,
            Some(&rendered.plan.status),
        );
        rendered.policy = Some(PolicyVerdict {
            allowed: verdict.allowed(),
            denied: verdict.denials(),
            warned: verdict.warnings(),
        });
    }
    Ok(rendered)
}

/// Converts the resource to its storage version if needed, then asks its plugin for a plan, as
/// if `children` were observed and `responses` were the answers to its earlier requests (so a
/// plan that depends on the live service renders offline).
pub fn render(
    registry: &Registry,
    mut resource: Value,
    children: &[Value],
    responses: &[Response],
    now_ms: u64,
) -> Result<Rendered, RenderError> {
    let api_version = str_at(&resource, "/apiVersion")
        .ok_or_else(|| input_err("resource", "apiVersion is missing"))?
        .to_string();
    let kind =
        str_at(&resource, "/kind").ok_or_else(|| input_err("resource", "kind is missing"))?.to_string();
    if str_at(&resource, "/metadata/name").is_none_or(str::is_empty) {
        return Err(input_err("resource", "metadata.name is missing"));
    }
    let plugin = registry
        .for_object(&api_version, &kind)
        .ok_or_else(|| RenderError::NoPlugin { api_version: api_version.clone(), kind: kind.clone() })?;
    let kind_info = plugin
        .info()
        .kinds
        .iter()
        .find(|k| k.kind == kind)
        .ok_or_else(|| RenderError::NoPlugin { api_version: api_version.clone(), kind: kind.clone() })?;
    if let Some(storage) = kind_info.storage_version() {
        let wanted = format!("{}/{}", kind_info.group, storage.name);
        if api_version != wanted {
            resource = plugin.convert(&resource.to_string(), &wanted)?;
        }
    }
    let namespace = str_at(&resource, "/metadata/namespace").unwrap_or("default").to_string();
    if let Some(meta) = resource.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("namespace".into(), Value::String(namespace.clone()));
    }
    let children: Vec<String> = children.iter().map(crate::children::plugin_view).collect();
    let text = resource.to_string();
    let observed = Observed { resource: &text, children: &children, now_ms, responses };
    let plan = plugin.reconcile_observed(&observed, &namespace)?;
    Ok(Rendered {
        plugin: RenderedBy {
            name: plugin.name().to_string(),
            version: plugin.version().to_string(),
            digest: plugin.digest().to_string(),
        },
        resource,
        plan,
        policy: None,
    })
}

/// The child manifests as YAML documents, ready for `kubectl apply --server-side`; the rest
/// of the plan (secrets to ensure, deletes, status, events) follows as YAML comments.
pub fn to_yaml(rendered: &Rendered) -> Result<String, RenderError> {
    let yaml = |v: &Value| {
        yaml_serde::to_string(v).map_err(|e| input_err("output", format!("cannot write YAML: {e}")))
    };
    let mut out = String::new();
    let mut notes = Vec::new();
    for action in &rendered.plan.actions {
        match action {
            Action::Apply { object } => {
                out.push_str("---\n");
                out.push_str(&yaml(object)?);
            }
            Action::Delete { target } => {
                notes.push(format!("delete {} {} {}", target.api_version, target.kind, target.name))
            }
            Action::EnsureSecret { secret } => {
                let keys: Vec<&str> = secret.keys.iter().map(|(k, _)| k.as_str()).collect();
                notes.push(format!(
                    "ensure-secret {} (keys: {}; random values, created once)",
                    secret.name,
                    keys.join(", ")
                ));
            }
            Action::LabelPod { pods } => {
                let keys: Vec<&str> =
                    pods.labels.iter().chain(&pods.annotations).map(|(k, _)| k.as_str()).collect();
                notes.push(format!("label-pod {} ({})", pods.pod, keys.join(", ")));
            }
            Action::Exec { request } => notes.push(format!(
                "exec {} in {}/{}: {} ({:?})",
                request.id,
                request.what.pod,
                request.what.container,
                request.what.command.join(" "),
                request.mode
            )),
            Action::Http { request } => notes.push(format!(
                "http {} {:?}:{} {} {} ({:?})",
                request.id,
                request.what.target,
                request.what.port,
                request.what.method,
                request.what.path,
                request.mode
            )),
        }
    }
    out.push_str(&format!(
        "# plugin: {} {} sha256:{}\n",
        rendered.plugin.name, rendered.plugin.version, rendered.plugin.digest
    ));
    if let Some(policy) = &rendered.policy {
        let verdict =
            if policy.allowed { "allowed" } else { "DENIED: nothing of this plan would be applied" };
        out.push_str(&format!("# policy: {verdict}\n"));
        for (target, message) in &policy.denied {
            out.push_str(&format!("#   deny {target}: {message}\n"));
        }
        for (target, message) in &policy.warned {
            out.push_str(&format!("#   warn {target}: {message}\n"));
        }
    }
    for note in notes {
        out.push_str(&format!("# {note}\n"));
    }
    let mut tail = serde_json::Map::new();
    tail.insert("status".into(), serde_json::to_value(&rendered.plan.status).unwrap_or_default());
    tail.insert("events".into(), serde_json::to_value(&rendered.plan.events).unwrap_or_default());
    if let Some(after) = rendered.plan.requeue_after {
        tail.insert("requeueAfterMs".into(), Value::from(after.as_millis() as u64));
    }
    for line in yaml(&Value::Object(tail))?.lines() {
        out.push_str(&format!("# {line}\n"));
    }
    Ok(out)
}
