//! The Elasticsearch plugin: `ElasticsearchCluster` (stateward.dev) → one StatefulSet per node
//! set (or one of identical nodes without `spec.nodeSets`), the headless (transport), -masters
//! (discovery) and -http Services, the configuration and bootstrap ConfigMaps, credentials, PDB.
//! The same plugin runs Elasticsearch 8 and OpenSearch 2 (`spec.distribution`).

#![forbid(unsafe_code)]

mod config;
mod drain;
pub mod live;
mod node;
mod roll;
mod spec;

/// The REST port.
const HTTP_PORT: u16 = 9200;
/// The configuration's key in the ConfigMap (mounted under the distribution's own file name).
const CONFIG_FILE: &str = "elasticsearch.yml";

use serde_json::{json, Map, Value};
use stateward_sdk::builders::objects::Port;
use stateward_sdk::builders::statefulset::ContainerSpec;
use stateward_sdk::builders::{Ctx, MemberSet};
use stateward_sdk::driver::{Blueprint, ClientService, Members};
use stateward_sdk::params::ParamRule;
use stateward_sdk::spec::{version_numbers, Cluster, ClusterSpec};
use stateward_sdk::status::Derived;
use stateward_sdk::FieldError;

pub use stateward_sdk::Service;

/// The plugin; `Elasticsearch::reconcile(observed)` through [`Service`].
pub struct Elasticsearch;

impl Blueprint for Elasticsearch {
    const NAME: &'static str = "elasticsearch";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const KIND: &'static str = "ElasticsearchCluster";
    const PLURAL: &'static str = "elasticsearchclusters";
    const SHORT: &'static str = "esc";
    const COMPONENT: &'static str = "search";
    const CONFIG_FILE: &'static str = CONFIG_FILE;
    const PORTS: &'static [Port] =
        &[Port { name: "http", port: HTTP_PORT }, Port { name: "transport", port: 9300 }];
    const SECRET_KEYS: &'static [(&'static str, u32)] = &[("password", 24)];
    /// The built-in superuser the password belongs to (requests authenticate as it).
    const SECRET_DERIVED: &'static [(&'static str, &'static str)] = &[("username", "elastic")];
    const PARAMETERS: &'static [ParamRule] = config::PARAMETERS;
    const FORBIDDEN: &'static [&'static str] = config::FORBIDDEN;
    /// Nodes present their certificate to each other on the transport layer.
    const CERTIFICATE_ROLE: stateward_sdk::builders::CertificateRole =
        stateward_sdk::builders::CertificateRole::Peer;
    const NO_PRIMARY: Option<&'static str> = Some(
        "an Elasticsearch cluster has no primary to switch over to: its master is elected among the \
         master-eligible nodes, and every data node serves writes for the shards it holds",
    );

    fn default_image(spec: &ClusterSpec) -> String {
        match spec::distribution(&spec.raw) {
            spec::Distribution::Elasticsearch => {
                format!("docker.elastic.co/elasticsearch/elasticsearch:{}", spec.version)
            }
            spec::Distribution::OpenSearch => format!("opensearchproject/opensearch:{}", spec.version),
        }
    }

    fn config(ctx: &Ctx) -> String {
        config::render(ctx)
    }

    fn container(ctx: &Ctx, image: String) -> ContainerSpec {
        node::container(ctx, &MemberSet::whole(ctx.cluster), image, Self::PORTS)
    }

    fn member_sets(ctx: &Ctx) -> Vec<MemberSet> {
        spec::node_sets(ctx.cluster).iter().map(node::member_set).collect()
    }

    fn set_container(ctx: &Ctx, set: &MemberSet, image: String) -> ContainerSpec {
        node::container(ctx, set, image, Self::PORTS)
    }

    fn client_services() -> Vec<ClientService> {
        vec![ClientService { suffix: "http", members: Members::All }]
    }

    fn status_extra(ctx: &Ctx, _derived: &Derived) -> Map<String, Value> {
        // Until the cluster answers GET /_cluster/health (see live.rs), its health is unknown.
        let mut m = Map::new();
        m.insert("clusterHealth".into(), json!({ "status": "unknown" }));
        m.insert("distribution".into(), json!(spec::distribution(&ctx.cluster.spec.raw).as_str()));
        m
    }

    fn live(ctx: &Ctx, input: &stateward_sdk::live::LiveInput) -> stateward_sdk::live::Live {
        live::live(ctx, input, HTTP_PORT)
    }

    fn status_extra_schema() -> Map<String, Value> {
        let mut m = live::schema();
        m.insert(
            "distribution".into(),
            json!({ "type": "string", "enum": ["elasticsearch", "opensearch"], "description": "The server the nodes run." }),
        );
        m
    }

    fn spec_extra_schema() -> Map<String, Value> {
        spec::schema()
    }

    fn validate_spec(spec: &Value, cluster: &Cluster) -> Vec<FieldError> {
        let mut errs = spec::validate(spec, cluster);
        if spec::distribution(spec) == spec::Distribution::OpenSearch {
            for key in config::ELASTICSEARCH_ONLY.iter().filter(|k| cluster.spec.parameters.contains_key(**k))
            {
                errs.push(FieldError::new(
                    format!("spec.parameters.{key}"),
                    "is an Elasticsearch setting OpenSearch does not have (it would refuse to start)",
                ));
            }
        }
        errs
    }

    fn validate_spec_update(new_spec: &Value, old_spec: &Value) -> Vec<FieldError> {
        spec::validate_update(new_spec, old_spec)
    }

    fn validate_update(new: &Cluster, old: &Cluster) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let (nv, ov) = (version_numbers(&new.spec.version), version_numbers(&old.spec.version));
        if nv < ov {
            errs.push(FieldError::new(
                "spec.version",
                format!("Elasticsearch cannot downgrade from {} to {}", old.spec.version, new.spec.version),
            ));
        } else if nv.first().zip(ov.first()).is_some_and(|(n, o)| *n > o + 1) {
            errs.push(FieldError::new(
                "spec.version",
                format!("upgrade from {} to {} skips a major version", old.spec.version, new.spec.version),
            ));
        }
        errs
    }
}

stateward_sdk::export_plugin!(Elasticsearch);

#[cfg(test)]
mod tests;
