//! Builders for the Kubernetes children every stateward cluster has.
//!
//! Objects are `serde_json::Value`s; without `preserve_order` their maps are sorted, so the
//! same input always serialises to the same bytes.

pub mod objects;
pub mod statefulset;
pub mod volumes;

use serde_json::{json, Map, Value};

use crate::spec::{Cluster, Resources};

/// Label every child carries; the host selects children by it.
pub const INSTANCE_LABEL: &str = "stateward.dev/instance";
/// Pod-template annotation with the hash of the generated configuration: a change rolls the pods.
pub const CONFIG_HASH_ANNOTATION: &str = "stateward.dev/config-hash";
/// StatefulSet annotation (on the object, not its pod template, so it rolls no pod) with the
/// hash of the pod template the plugin rendered: a cached StatefulSet carrying another hash
/// has not been seen since the last apply, and its revisions say nothing of the new template.
pub const TEMPLATE_HASH_ANNOTATION: &str = "stateward.dev/template-hash";
/// Name of the data volume (and so PVCs are `data-<name>-<ordinal>`).
pub const DATA_VOLUME: &str = "data";
/// Where the generated configuration is mounted.
pub const CONFIG_DIR: &str = "/etc/stateward";
/// Where the pods mount their server certificate (`tls.crt`, `tls.key`, `ca.crt`), beside
/// (not inside) the read-only config mount.
pub const TLS_DIR: &str = "/etc/stateward-tls";
/// Label naming the member set of a pod (and its StatefulSet's selector) when a cluster has
/// more than one kind of member; absent for a cluster's only set.
pub const SET_LABEL: &str = "stateward.dev/member-set";
/// Label of an `ensure-secret` that asks the host for a certificate from the instance's own CA;
/// the host issues it, renews it and rolls the pods that mount it. Its value is the
/// certificate's role ([`CertificateRole`]).
pub const CERTIFICATE_LABEL: &str = "stateward.dev/certificate";

/// What the members do with their certificate, and so the usages it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertificateRole {
    /// They serve clients with it (`server`: server authentication only).
    Server,
    /// They also present it to each other as clients, as Elasticsearch's transport layer does
    /// (`peer`: server and client authentication).
    Peer,
}

impl CertificateRole {
    /// The [`CERTIFICATE_LABEL`] value.
    pub fn label_value(self) -> &'static str {
        match self {
            CertificateRole::Server => "server",
            CertificateRole::Peer => "peer",
        }
    }
}

/// Naming and labelling for one cluster of one service.
#[derive(Debug, Clone, Copy)]
pub struct Ctx<'a> {
    pub cluster: &'a Cluster,
    /// `app.kubernetes.io/name`, e.g. "postgres".
    pub service: &'static str,
    /// `app.kubernetes.io/component`, e.g. "database".
    pub component: &'static str,
}

impl Ctx<'_> {
    /// The CR name, also the StatefulSet's.
    pub fn name(&self) -> &str {
        &self.cluster.name
    }

    /// `<name>-headless`: the StatefulSet's governing Service.
    pub fn headless(&self) -> String {
        format!("{}-headless", self.cluster.name)
    }

    /// `<name>-config`.
    pub fn config_map(&self) -> String {
        format!("{}-config", self.cluster.name)
    }

    /// `<name>-credentials`.
    pub fn secret(&self) -> String {
        format!("{}-credentials", self.cluster.name)
    }

    /// `<name>-tls`: the server certificate the host issues.
    pub fn tls_secret(&self) -> String {
        format!("{}-tls", self.cluster.name)
    }

    /// Pod `<name>-<ordinal>`.
    pub fn pod(&self, ordinal: i64) -> String {
        format!("{}-{ordinal}", self.cluster.name)
    }

    /// Stable DNS name of one pod through the headless Service.
    pub fn pod_host(&self, ordinal: i64) -> String {
        format!("{}.{}", self.pod(ordinal), self.headless())
    }

    /// Selector labels: never change for the life of the cluster (StatefulSet selectors are immutable).
    pub fn selector(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("app.kubernetes.io/name".into(), json!(self.service));
        m.insert("app.kubernetes.io/instance".into(), json!(self.cluster.name));
        m
    }

    /// What a Service of this instance selects: its pods by [`Self::selector`] and by
    /// `stateward.dev/instance`, which the guardrails require of every Service a plugin
    /// applies (so none selects another workload's pods). Not the StatefulSets' selector: that
    /// is immutable on the sets earlier releases made.
    pub fn service_selector(&self) -> Map<String, Value> {
        let mut m = self.selector();
        m.insert(INSTANCE_LABEL.into(), json!(self.cluster.name));
        m
    }

    /// Labels that never change: selector + managed-by + component + instance. Used on
    /// volumeClaimTemplates (immutable) so every PVC carries `stateward.dev/instance`.
    pub fn stable_labels(&self) -> Map<String, Value> {
        let mut m = self.selector();
        m.insert("app.kubernetes.io/managed-by".into(), json!("stateward"));
        m.insert("app.kubernetes.io/component".into(), json!(self.component));
        m.insert(INSTANCE_LABEL.into(), json!(self.cluster.name));
        m
    }

    /// All labels, including `app.kubernetes.io/version`.
    pub fn labels(&self) -> Map<String, Value> {
        let mut m = self.stable_labels();
        m.insert("app.kubernetes.io/version".into(), json!(label_value(&self.cluster.spec.version)));
        m
    }

    /// `metadata` for a child called `name`.
    pub fn metadata(&self, name: &str) -> Value {
        json!({ "name": name, "labels": self.labels() })
    }

    /// Labels as (key, value) pairs, for secret requests.
    pub fn label_pairs(&self) -> Vec<(String, String)> {
        self.labels().into_iter().map(|(k, v)| (k, v.as_str().unwrap_or_default().to_string())).collect()
    }
}

/// A label value is at most 63 characters of `[A-Za-z0-9._-]`.
fn label_value(s: &str) -> String {
    s.chars().filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')).take(63).collect()
}

/// One StatefulSet of a cluster's members. Most services have one, named as the CR
/// ([`MemberSet::whole`]). A service whose members differ (Elasticsearch node sets with their
/// own roles and sizes) has one per kind of member, `<name>-<set>`, all behind the same
/// headless Service and credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberSet {
    /// "" for a cluster's only set; otherwise appended to the CR name.
    pub set: String,
    pub replicas: i64,
    pub resources: Resources,
    /// The data claim size for new members (see `volumes` for existing ones).
    pub storage_size: String,
    /// Further labels on its pods (e.g. a role another Service selects by).
    pub pod_labels: Vec<(String, String)>,
}

impl MemberSet {
    /// The one set of a cluster whose members are all alike: sized by the common spec.
    pub fn whole(cluster: &Cluster) -> Self {
        MemberSet {
            set: String::new(),
            replicas: cluster.spec.replicas,
            resources: cluster.spec.resources.clone(),
            storage_size: cluster.spec.storage.size.clone(),
            pod_labels: Vec::new(),
        }
    }

    /// The StatefulSet's name: the CR's, or `<name>-<set>`.
    pub fn statefulset(&self, ctx: &Ctx) -> String {
        if self.set.is_empty() {
            ctx.name().to_string()
        } else {
            format!("{}-{}", ctx.name(), self.set)
        }
    }

    /// Pod `<statefulset>-<ordinal>`.
    pub fn pod(&self, ctx: &Ctx, ordinal: i64) -> String {
        format!("{}-{ordinal}", self.statefulset(ctx))
    }

    /// The StatefulSet's selector: the cluster's, narrowed to the set when it has a name.
    pub fn selector(&self, ctx: &Ctx) -> Map<String, Value> {
        let mut m = ctx.selector();
        if !self.set.is_empty() {
            m.insert(SET_LABEL.into(), json!(self.set));
        }
        m
    }
}
