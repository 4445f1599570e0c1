//! Why a reconcile failed; the label feeds `stateward_reconcile_total{result}` and Events.

use crate::runtime::RuntimeError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("plugin failed: {0}")]
    Plugin(#[from] RuntimeError),
    #[error("policy denied the plan: {0}")]
    PolicyDenied(String),
    #[error("{verb} {kind} {name}: {}", api_message(source))]
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
    /// The reconcile panicked; caught at the reconcile boundary (controller::panics).
    #[error("reconcile panicked: {0}")]
    Panicked(String),
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
            Self::Panicked(_) => "panicked",
        }
    }

    /// The condition reason shown on the resource (Degraded).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Plugin(RuntimeError::RequestsRefused { .. }) => "RequestsRefused",
            Self::Plugin(_) => "PluginFailed",
            Self::PolicyDenied(_) => "PolicyDenied",
            Self::Api { .. } => "ApiError",
            Self::Resource(..) => "InvalidResource",
            Self::NotLeader => "NotLeader",
            Self::NameConflict(_) => "NameConflict",
            Self::CacheNotReady(_) => "CacheNotReady",
            Self::ObjectConflict { .. } => "ObjectConflict",
            Self::Panicked(_) => "ReconcilePanicked",
        }
    }

    /// A request that never got an answer from the API server (a pooled connection it closed,
    /// a reset): nothing was refused, so the next try may follow at once.
    pub fn is_transport(&self) -> bool {
        matches!(self, Self::Api { source: kube::Error::Service(_) | kube::Error::HyperError(_), .. })
    }

    /// Whether retrying cannot help until someone changes something: an object in the way, or
    /// the API server refusing the request as such (400 bad request, 403 forbidden, e.g. an
    /// exceeded ResourceQuota, 404 for a kind that is not installed, 422 invalid). Conflicts
    /// (409), throttling (429), timeouts and server errors pass by themselves.
    pub fn needs_the_user(&self) -> bool {
        match self {
            Self::ObjectConflict { .. } => true,
            Self::Api { source: kube::Error::Api(status), .. } => {
                matches!(status.code, 400 | 403 | 404 | 422)
            }
            _ => false,
        }
    }

    pub fn api(verb: &'static str, kind: &str, name: &str, source: kube::Error) -> Self {
        Self::Api { verb, kind: kind.to_string(), name: name.to_string(), source }
    }
}

/// The API server's own words for a refusal (the status message, code and reason), instead
/// of the client's debug dump of the whole Status; what people read in conditions and Events.
fn api_message(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) if status.reason.is_empty() => {
            format!("{} ({})", status.message, status.code)
        }
        kube::Error::Api(status) => format!("{} ({} {})", status.message, status.code, status.reason),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::Error;

    fn refused(code: u16) -> Error {
        let status = kube::core::Status { code, message: "no".into(), ..Default::default() };
        Error::api("apply", "StatefulSet", "db", kube::Error::Api(Box::new(status)))
    }

    #[test]
    fn refusals_need_the_user_and_transient_failures_do_not() {
        for code in [400, 403, 404, 422] {
            assert!(refused(code).needs_the_user(), "{code}");
        }
        for code in [409, 429, 500, 503, 504] {
            assert!(!refused(code).needs_the_user(), "{code}");
        }
        assert!(!Error::NotLeader.needs_the_user());
        assert_eq!(refused(403).to_string(), "apply StatefulSet db: no (403)");
    }

    #[test]
    fn only_a_request_the_api_server_never_answered_is_a_transport_error() {
        let dropped: Box<dyn std::error::Error + Send + Sync> =
            "connection closed before message completed".into();
        assert!(Error::api("apply", "ConfigMap", "c", kube::Error::Service(dropped)).is_transport());
        for code in [409, 500, 503] {
            assert!(!refused(code).is_transport(), "{code}");
        }
        assert!(!Error::NotLeader.is_transport());
    }
}
