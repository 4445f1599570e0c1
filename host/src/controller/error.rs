//! Why a reconcile failed; the label feeds `stateward_reconcile_total{result}` and Events.

use crate::runtime::RuntimeError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("plugin failed: {0}")]
    Plugin(#[from] RuntimeError),
    #[error("policy denied the plan: {0}")]
    PolicyDenied(String),
    #[error("{verb} {kind} {name}: {source}")]
    Api {
        verb: &'static str,
        kind: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("resource {0} is malformed: {1}")]
    Resource(String, String),
    #[error("no longer the leader; refusing to write")]
    NotLeader,
    #[error("metadata.name: {0} in this namespace already has this name; its children, volumes and credentials are named after it, so this resource is left alone (nothing written, nothing deleted): rename it")]
    NameConflict(super::claims::Holder),
    #[error("{kind} {name} already exists and {why}; refusing to take it over: rename this resource, or move that object out of the way")]
    ObjectConflict { kind: String, name: String, why: String },
    #[error("the {0} cache has not listed yet (is its CRD installed, and may the operator list it?): cannot tell whether this name is taken")]
    CacheNotReady(String),
}

impl Error {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Plugin(_) => "plugin_failed",
            Self::PolicyDenied(_) => "policy_denied",
            Self::Api { .. } => "api_error",
            Self::Resource(..) => "bad_resource",
            Self::NotLeader => "not_leader",
            Self::NameConflict(_) => "name_conflict",
            Self::CacheNotReady(_) => "cache_not_ready",
            Self::ObjectConflict { .. } => "object_conflict",
        }
    }

    /// The condition reason shown on the resource (Degraded).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Plugin(_) => "PluginFailed",
            Self::PolicyDenied(_) => "PolicyDenied",
            Self::Api { .. } => "ApiError",
            Self::Resource(..) => "InvalidResource",
            Self::NotLeader => "NotLeader",
            Self::NameConflict(_) => "NameConflict",
            Self::CacheNotReady(_) => "CacheNotReady",
            Self::ObjectConflict { .. } => "ObjectConflict",
        }
    }

    pub fn api(verb: &'static str, kind: &str, name: &str, source: kube::Error) -> Self {
        Self::Api {
            verb,
            kind: kind.to_string(),
            name: name.to_string(),
            source,
        }
    }
}
