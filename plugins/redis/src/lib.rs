//! The Redis plugin: `RedisCluster` (stateward.dev) → StatefulSet, headless and client
//! Services (the bare name and `-master`: the master; `-replicas`: the replicas linked to it),
//! ConfigMap with redis.conf and the entry script, credentials, PDB. `spec.mode` (see [`spec`]):
//! a standalone server, or one master, replicas and a Sentinel in every pod that fails over
//! (see [`sentinel`]); the plugin follows the master the Sentinels name (see [`roles`]); or a
//! Redis Cluster the plugin forms and keeps addressed (see [`cluster`]).

#![forbid(unsafe_code)]

pub mod acl;
pub mod cluster;
mod config;
pub mod entrypoint;
pub mod live;
pub mod redundancy;
pub mod roles;
pub mod roll;
pub mod sentinel;
pub mod spec;
pub mod switchover;
pub mod topology;

use serde_json::{json, Map, Value};
use stateward_sdk::builders::objects::Port;
use stateward_sdk::builders::statefulset::{
    env, env_from_secret, exec_probe, ContainerSpec, Identity, ResourceDefaults,
};
use stateward_sdk::builders::{Ctx, CONFIG_DIR};
use stateward_sdk::driver::{Blueprint, ClientService, Members};
use stateward_sdk::params::ParamRule;
use stateward_sdk::spec::{Cluster, ClusterSpec};
use stateward_sdk::status::Derived;
use stateward_sdk::FieldError;

pub use stateward_sdk::Service;

/// The plugin; `Redis::reconcile(observed)` through [`Service`].
pub struct Redis;

pub(crate) const PORT: u16 = 6379;
/// The pod's private in-memory directory for files made at start (the password's include file).
const RUN_DIR: &str = "/run/stateward";
const RUN_VOLUME: &str = "run";

impl Blueprint for Redis {
    const NAME: &'static str = "redis";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const KIND: &'static str = "RedisCluster";
    const PLURAL: &'static str = "redisclusters";
    const SHORT: &'static str = "rdc";
    const COMPONENT: &'static str = "cache";
    const CONFIG_FILE: &'static str = "redis.conf";
    const PORTS: &'static [Port] =
        &[Port { name: "redis", port: PORT }, Port { name: "redis-tls", port: config::TLS_PORT }];
    const SECRET_KEYS: &'static [(&'static str, u32)] = &[("password", 24)];
    const PARAMETERS: &'static [ParamRule] = config::PARAMETERS;
    const FORBIDDEN: &'static [&'static str] = config::FORBIDDEN;

    fn default_image(spec: &ClusterSpec) -> String {
        format!("redis:{}", spec.version)
    }

    fn config(ctx: &Ctx) -> String {
        config::render(ctx)
    }

    fn extra_secrets(ctx: &Ctx) -> Vec<stateward_sdk::SecretRequest> {
        acl::secrets(ctx)
    }

    fn extra_files(ctx: &Ctx) -> Vec<(&'static str, String)> {
        vec![(entrypoint::ENTRYPOINT, entrypoint::script(ctx, PORT))]
    }

    fn container(ctx: &Ctx, image: String) -> ContainerSpec {
        let probe = format!(
            "REDISCLI_AUTH=\"$REDIS_PASSWORD\" redis-cli -h 127.0.0.1 -p {PORT} ping | grep -qx PONG"
        );
        let users = acl::volume_and_mount(ctx);
        let mode = spec::mode(&ctx.cluster.spec.raw, ctx.cluster.spec.replicas);
        ContainerSpec {
            image,
            // The entry script, not the image's entrypoint: the same start on every image.
            command: vec!["sh".into(), format!("{CONFIG_DIR}/{}", entrypoint::ENTRYPOINT)],
            args: Vec::new(),
            env: [
                vec![
                    env_from_secret("REDIS_PASSWORD", &ctx.secret(), "password"),
                    // redis-cli run in the pod (probes, the operator's `info` polls, an admin's
                    // kubectl exec) authenticates from this, never from its command line.
                    env_from_secret("REDISCLI_AUTH", &ctx.secret(), "password"),
                    env(entrypoint::HEADLESS_ENV, &ctx.headless()),
                    env("STATEWARD_RUN_DIR", RUN_DIR),
                ],
                topology::env_vars(ctx),
            ]
            .concat(),
            ports: Self::PORTS.to_vec(),
            readiness: exec_probe(&probe, 0, 10, 5, 3),
            liveness: exec_probe(&probe, 0, 15, 10, 4),
            // Loading a large append-only file takes a while: up to 10 minutes.
            startup: Some(exec_probe(&probe, 2, 10, 5, 60)),
            data_mount: "/data",
            extra_mounts: [
                vec![json!({ "name": RUN_VOLUME, "mountPath": RUN_DIR })],
                users.iter().map(|u| u.1.clone()).collect(),
            ]
            .concat(),
            // In memory: the file holding the password never reaches a disk.
            extra_volumes: [
                vec![json!({
                    "name": RUN_VOLUME,
                    "emptyDir": { "medium": "Memory", "sizeLimit": "1Mi" },
                })],
                users.iter().map(|u| u.0.clone()).collect(),
            ]
            .concat(),
            identity: Identity { uid: 999, gid: 999 },
            defaults: ResourceDefaults {
                request_cpu: "100m",
                request_memory: "128Mi",
                limit_cpu: "1",
                limit_memory: "512Mi",
            },
            termination_grace_seconds: 30,
            // Cluster mode: the nodes start together; the plugin forms the cluster (see `cluster`).
            parallel: mode == spec::CLUSTER,
            // Replicas first, a master only after a switchover or failover to an updated
            // replica (see `roll` and `cluster`).
            rolled_by_plugin: mode != spec::STANDALONE,
            pre_stop: None,
        }
    }

    fn client_services() -> Vec<ClientService> {
        vec![
            // Clients write: the bare name and -master follow the master the plugin labels.
            ClientService { suffix: "", members: Members::Labelled(live::ROLE_LABEL, "master") },
            ClientService { suffix: "master", members: Members::Labelled(live::ROLE_LABEL, "master") },
            // Reads that may lag: the replicas whose link to the master is up.
            ClientService { suffix: "replicas", members: Members::Labelled(live::ROLE_LABEL, "replica") },
        ]
    }

    fn status_extra(ctx: &Ctx, _derived: &Derived) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("mode".into(), json!(spec::mode(&ctx.cluster.spec.raw, ctx.cluster.spec.replicas)));
        m
    }

    fn spec_extra_schema() -> Map<String, Value> {
        let mut m = spec::schema();
        m.extend(acl::schema());
        m
    }

    fn default_replicas(spec: &Value) -> i64 {
        spec::default_replicas(spec)
    }

    fn validate_spec(spec: &Value, cluster: &Cluster) -> Vec<FieldError> {
        [spec::validate(spec, cluster.spec.replicas), acl::validate(spec)].concat()
    }

    fn validate_update(new: &Cluster, old: &Cluster) -> Vec<FieldError> {
        spec::validate_update(&new.spec.raw, new.spec.replicas, &old.spec.raw, old.spec.replicas)
    }

    fn live(ctx: &Ctx, input: &stateward_sdk::live::LiveInput) -> stateward_sdk::live::Live {
        live::live(ctx, input, PORT)
    }

    fn status_extra_schema() -> Map<String, Value> {
        let mut m = live::schema();
        m.insert(
            "mode".into(),
            json!({ "type": "string", "enum": [spec::STANDALONE, spec::REPLICATION, spec::CLUSTER], "description": "The mode running." }),
        );
        m
    }
}

#[cfg(feature = "component")]
stateward_sdk::export_plugin!(Redis);

#[cfg(test)]
mod tests;
