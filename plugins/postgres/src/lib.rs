//! The PostgreSQL plugin: `PostgresCluster` (stateward.dev) → StatefulSet, Services (-rw, -ro,
//! -r), ConfigMaps with postgresql.conf and the topology, the superuser's credentials and the
//! application's (see [`app`]), PodDisruptionBudget; one primary and hot standbys streaming
//! from it, failover and switchover (see [`ha`]).
//!
//! Built natively it is a plain library (tests, benchmarks); for `wasm32` it is a component.

#![forbid(unsafe_code)]

pub mod app;
pub mod bootstrap;
mod config;
pub mod ha;
pub mod live;
pub mod redundancy;
pub mod roll;
pub mod spec;
pub mod topology;

use serde_json::{Map, Value};
use stateward_sdk::builders::objects::Port;
use stateward_sdk::builders::statefulset::{
    env, env_from_secret, exec_probe, ContainerSpec, Identity, ResourceDefaults,
};
use stateward_sdk::builders::{Ctx, CONFIG_DIR};
use stateward_sdk::driver::{Blueprint, ClientService, Members};
use stateward_sdk::params::ParamRule;
use stateward_sdk::spec::{version_numbers, Cluster, ClusterSpec};
use stateward_sdk::status::Derived;
use stateward_sdk::{FieldError, SecretRequest};

pub use stateward_sdk::Service;

/// The plugin; `Postgres::reconcile(observed)` through [`Service`].
pub struct Postgres;

/// Where the volume is mounted; PGDATA is a subdirectory so initdb finds it empty.
pub(crate) const DATA_MOUNT: &str = "/var/lib/postgresql/data";
/// `PGDATA` in the pods.
pub const PGDATA: &str = "/var/lib/postgresql/data/pgdata";

impl Blueprint for Postgres {
    const NAME: &'static str = "postgres";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const KIND: &'static str = "PostgresCluster";
    const PLURAL: &'static str = "postgresclusters";
    const SHORT: &'static str = "pgc";
    const COMPONENT: &'static str = "database";
    const CONFIG_FILE: &'static str = "postgresql.conf";
    const PORTS: &'static [Port] = &[Port { name: "postgres", port: 5432 }];
    const SECRET_KEYS: &'static [(&'static str, u32)] = &[("password", 24), ("replication-password", 24)];
    const PARAMETERS: &'static [ParamRule] = config::PARAMETERS;
    const FORBIDDEN: &'static [&'static str] = config::FORBIDDEN;

    fn default_image(spec: &ClusterSpec) -> String {
        format!("postgres:{}", spec.version)
    }

    fn config(ctx: &Ctx) -> String {
        config::render(ctx)
    }

    fn extra_files(ctx: &Ctx) -> Vec<(&'static str, String)> {
        vec![
            (bootstrap::HBA_FILE, bootstrap::pg_hba(ctx)),
            (bootstrap::ENTRYPOINT, bootstrap::entrypoint(ctx)),
        ]
    }

    fn container(ctx: &Ctx, image: String) -> ContainerSpec {
        // The Debian images run as postgres (999), the Alpine ones as postgres (70).
        let id = if ctx.cluster.spec.version.ends_with("-alpine") { 70 } else { 999 };
        // Over TCP, as clients come; pg_isready needs no password. --timeout stays below the
        // probe's own so a slow answer is reported, not cut off.
        let ready = "pg_isready --host=127.0.0.1 --port=5432 --username=postgres --timeout=4";
        let (app_volume, app_mount) = app::volume_and_mount(ctx);
        ContainerSpec {
            image,
            // The entry script, not the image's entrypoint: the same start on every image.
            command: vec!["sh".into(), format!("{CONFIG_DIR}/{}", bootstrap::ENTRYPOINT)],
            args: Vec::new(),
            env: [
                vec![
                    env("PGDATA", PGDATA),
                    env_from_secret("POSTGRES_PASSWORD", &ctx.secret(), "password"),
                    env_from_secret("STATEWARD_REPLICATION_PASSWORD", &ctx.secret(), "replication-password"),
                ],
                topology::env_vars(ctx),
            ]
            .concat(),
            ports: Self::PORTS.to_vec(),
            readiness: exec_probe(ready, 0, 10, 5, 3),
            liveness: exec_probe(ready, 0, 15, 10, 4),
            // initdb, or crash recovery after an unclean stop, may take minutes on a busy
            // node: up to 15 before liveness takes over.
            startup: Some(exec_probe(ready, 5, 10, 5, 90)),
            data_mount: DATA_MOUNT,
            extra_mounts: vec![app_mount],
            extra_volumes: vec![app_volume],
            identity: Identity { uid: id, gid: id },
            defaults: ResourceDefaults {
                request_cpu: "250m",
                request_memory: "256Mi",
                limit_cpu: "1",
                limit_memory: "1Gi",
            },
            termination_grace_seconds: 60,
            parallel: false,
            rolled_by_plugin: true,
            // A fast shutdown, not the smart one SIGTERM asks for (which waits for every client
            // to leave): a deleted or rolled member stops cleanly and at once, the primary's
            // last WAL sent to the standbys before the failover that follows.
            pre_stop: Some(
                ["pg_ctl", "stop", &format!("--pgdata={PGDATA}"), "--mode=fast", "--timeout=50"]
                    .iter()
                    .map(|s| (*s).to_string())
                    .collect(),
            ),
        }
    }

    fn extra_secrets(ctx: &Ctx) -> Vec<SecretRequest> {
        let spec = &ctx.cluster.spec.raw;
        vec![app::secret(ctx, &spec::bootstrap(spec), spec::tls_only(spec))]
    }

    fn client_services() -> Vec<ClientService> {
        vec![
            // The primary, as the plugin labels it from what the servers answer.
            ClientService { suffix: "rw", members: Members::Labelled(live::ROLE_LABEL, "primary") },
            // Standbys whose WAL receiver streams.
            ClientService { suffix: "ro", members: Members::Labelled(live::ROLE_LABEL, "replica") },
            // Any ready instance.
            ClientService { suffix: "r", members: Members::All },
        ]
    }

    fn status_extra(_ctx: &Ctx, _derived: &Derived) -> Map<String, Value> {
        // The roles come from the running servers (`live`).
        Map::new()
    }

    fn live(ctx: &Ctx, input: &stateward_sdk::live::LiveInput) -> stateward_sdk::live::Live {
        live::live(ctx, input)
    }

    fn status_extra_schema() -> Map<String, Value> {
        live::schema()
    }

    fn spec_extra_schema() -> Map<String, Value> {
        spec::schema()
    }

    fn validate_spec(spec: &Value, cluster: &Cluster) -> Vec<FieldError> {
        spec::validate(spec, cluster.spec.replicas)
    }

    fn validate_spec_update(new_spec: &Value, old_spec: &Value) -> Vec<FieldError> {
        spec::validate_update(new_spec, old_spec)
    }

    fn validate_update(new: &Cluster, old: &Cluster) -> Vec<FieldError> {
        let (n, o) = (version_numbers(&new.spec.version), version_numbers(&old.spec.version));
        if n.first() > o.first() {
            return vec![FieldError::new(
                "spec.version",
                format!(
                    "major upgrade from {} to {} needs pg_upgrade, which is not supported yet",
                    old.spec.version, new.spec.version
                ),
            )];
        }
        Vec::new()
    }
}

stateward_sdk::export_plugin!(Postgres);

#[cfg(test)]
mod tests;
