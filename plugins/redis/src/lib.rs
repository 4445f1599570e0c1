//! The Redis plugin: `RedisCluster` (stateward.dev) → StatefulSet (pod 0 primary, the others
//! replicas of it), headless and client Services, ConfigMap with redis.conf, credentials, PDB.

#![forbid(unsafe_code)]

mod config;

use serde_json::{json, Map, Value};
use stateward_sdk::builders::objects::Port;
use stateward_sdk::builders::statefulset::{env, env_from_secret, exec_probe, ContainerSpec, Identity, ResourceDefaults};
use stateward_sdk::builders::{Ctx, CONFIG_DIR};
use stateward_sdk::driver::{Blueprint, ClientService};
use stateward_sdk::params::ParamRule;
use stateward_sdk::status::Derived;

pub use stateward_sdk::Service;

/// The plugin; `Redis::reconcile(observed)` through [`Service`].
pub struct Redis;

const PORT: u16 = 6379;

/// `standalone` for one member, `replication` (pod 0 primary) otherwise.
fn mode(replicas: i64) -> &'static str {
    if replicas > 1 {
        "replication"
    } else {
        "standalone"
    }
}

impl Blueprint for Redis {
    const NAME: &'static str = "redis";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const KIND: &'static str = "RedisCluster";
    const PLURAL: &'static str = "redisclusters";
    const SHORT: &'static str = "rdc";
    const COMPONENT: &'static str = "cache";
    const CONFIG_FILE: &'static str = "redis.conf";
    const PORTS: &'static [Port] = &[Port { name: "redis", port: PORT }, Port { name: "redis-tls", port: config::TLS_PORT }];
    const SECRET_KEYS: &'static [(&'static str, u32)] = &[("password", 24)];
    const PARAMETERS: &'static [ParamRule] = config::PARAMETERS;
    const FORBIDDEN: &'static [&'static str] = config::FORBIDDEN;

    fn default_image(version: &str) -> String {
        format!("redis:{version}")
    }

    fn config(ctx: &Ctx) -> String {
        config::render(ctx)
    }

    fn container(ctx: &Ctx, image: String) -> ContainerSpec {
        // The password stays out of the ConfigMap: it comes from the Secret through the env.
        // Members other than pod 0 replicate from pod 0 through its stable DNS name.
        let script = format!(
            "set -e\n\
             ordinal=\"${{HOSTNAME##*-}}\"\n\
             if [ \"$ordinal\" != 0 ]; then set -- --replicaof \"$PRIMARY_HOST\" {PORT}; fi\n\
             exec redis-server {CONFIG_DIR}/redis.conf --requirepass \"$REDIS_PASSWORD\" --masterauth \"$REDIS_PASSWORD\" \"$@\""
        );
        let probe = format!("REDISCLI_AUTH=\"$REDIS_PASSWORD\" redis-cli -h 127.0.0.1 -p {PORT} ping | grep -qx PONG");
        ContainerSpec {
            image,
            command: vec!["sh".into(), "-c".into(), script],
            args: Vec::new(),
            env: vec![
                env_from_secret("REDIS_PASSWORD", &ctx.secret(), "password"),
                env("PRIMARY_HOST", &ctx.pod_host(0)),
            ],
            ports: Self::PORTS.to_vec(),
            readiness: exec_probe(&probe, 5, 10, 5, 3),
            liveness: exec_probe(&probe, 30, 10, 5, 6),
            data_mount: "/data",
            extra_mounts: Vec::new(),
            identity: Identity { uid: 999, gid: 999 },
            defaults: ResourceDefaults {
                request_cpu: "100m",
                request_memory: "128Mi",
                limit_cpu: "1",
                limit_memory: "512Mi",
            },
            termination_grace_seconds: 30,
            parallel: false,
        }
    }

    fn client_services() -> Vec<ClientService> {
        // Clients write: the Service follows the primary.
        vec![ClientService { suffix: "", primary_only: true }]
    }

    fn status_extra(ctx: &Ctx, _derived: &Derived) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("mode".into(), json!(mode(ctx.cluster.spec.replicas)));
        m
    }

    fn status_extra_schema() -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("mode".into(), json!({ "type": "string", "enum": ["standalone", "replication"] }));
        m
    }
}

#[cfg(feature = "component")]
stateward_sdk::export_plugin!(Redis);

#[cfg(test)]
mod tests;
