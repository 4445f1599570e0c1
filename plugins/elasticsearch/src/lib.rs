//! The Elasticsearch plugin: `ElasticsearchCluster` (stateward.dev) → StatefulSet of
//! master-eligible data nodes, headless (transport) and -http Services, ConfigMap with
//! elasticsearch.yml, credentials, PDB.

#![forbid(unsafe_code)]

mod config;
pub mod live;

/// The REST port.
const HTTP_PORT: u16 = 9200;

use serde_json::{json, Map, Value};
use stateward_sdk::builders::objects::Port;
use stateward_sdk::builders::statefulset::{
    env_from_secret, http_probe, ContainerSpec, Identity, ResourceDefaults,
};
use stateward_sdk::builders::Ctx;
use stateward_sdk::driver::{Blueprint, ClientService, Members};
use stateward_sdk::params::ParamRule;
use stateward_sdk::spec::{version_numbers, Cluster};
use stateward_sdk::status::Derived;
use stateward_sdk::FieldError;

pub use stateward_sdk::Service;

/// The plugin; `Elasticsearch::reconcile(observed)` through [`Service`].
pub struct Elasticsearch;

const HOME: &str = "/usr/share/elasticsearch";

impl Blueprint for Elasticsearch {
    const NAME: &'static str = "elasticsearch";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const KIND: &'static str = "ElasticsearchCluster";
    const PLURAL: &'static str = "elasticsearchclusters";
    const SHORT: &'static str = "esc";
    const COMPONENT: &'static str = "search";
    const CONFIG_FILE: &'static str = "elasticsearch.yml";
    const PORTS: &'static [Port] =
        &[Port { name: "http", port: HTTP_PORT }, Port { name: "transport", port: 9300 }];
    const SECRET_KEYS: &'static [(&'static str, u32)] = &[("password", 24)];
    const PARAMETERS: &'static [ParamRule] = config::PARAMETERS;
    const FORBIDDEN: &'static [&'static str] = config::FORBIDDEN;
    const NO_PRIMARY: Option<&'static str> = Some(
        "an Elasticsearch cluster has no primary to switch over to: its master is elected among the \
         master-eligible nodes, and every data node serves writes for the shards it holds",
    );

    fn default_image(version: &str) -> String {
        format!("docker.elastic.co/elasticsearch/elasticsearch:{version}")
    }

    fn config(ctx: &Ctx) -> String {
        config::render(ctx)
    }

    fn container(ctx: &Ctx, image: String) -> ContainerSpec {
        // The image reads its configuration directory, which also holds jvm.options and
        // log4j2 settings: mount just elasticsearch.yml over the image's copy.
        let health = "/_cluster/health?local=true";
        ContainerSpec {
            image,
            command: Vec::new(),
            args: Vec::new(),
            env: vec![env_from_secret("ELASTIC_PASSWORD", &ctx.secret(), "password")],
            ports: Self::PORTS.to_vec(),
            readiness: http_probe(health, "http", 10, 10, 5, 3),
            liveness: http_probe(health, "http", 90, 20, 10, 6),
            startup: None,
            data_mount: "/usr/share/elasticsearch/data",
            extra_mounts: vec![json!({
                "name": "config",
                "mountPath": format!("{HOME}/config/elasticsearch.yml"),
                "subPath": "elasticsearch.yml",
                "readOnly": true,
            })],
            extra_volumes: Vec::new(),
            identity: Identity { uid: 1000, gid: 1000 },
            defaults: ResourceDefaults {
                request_cpu: "500m",
                request_memory: "2Gi",
                limit_cpu: "2",
                limit_memory: "2Gi",
            },
            termination_grace_seconds: 120,
            // Nodes discover each other and elect a master together: start them all at once.
            parallel: true,
            rolled_by_plugin: false,
            pre_stop: None,
        }
    }

    fn client_services() -> Vec<ClientService> {
        vec![ClientService { suffix: "http", members: Members::All }]
    }

    fn status_extra(_ctx: &Ctx, _derived: &Derived) -> Map<String, Value> {
        // Until the cluster answers GET /_cluster/health (see live.rs), its health is unknown.
        let mut m = Map::new();
        m.insert("clusterHealth".into(), json!({ "status": "unknown" }));
        m
    }

    fn live(ctx: &Ctx, input: &stateward_sdk::live::LiveInput) -> stateward_sdk::live::Live {
        live::live(ctx, input, HTTP_PORT)
    }

    fn status_extra_schema() -> Map<String, Value> {
        live::schema()
    }

    fn validate_update(new: &Cluster, old: &Cluster) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let (n, o) = (new.spec.replicas, old.spec.replicas);
        if o >= 3 && n * 2 <= o {
            errs.push(FieldError::new(
                "spec.replicas",
                format!("scaling from {o} to {n} at once would lose the master quorum; scale down in smaller steps"),
            ));
        }
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
