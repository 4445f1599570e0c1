//! The PostgreSQL plugin: `PostgresCluster` (stateward.dev) → StatefulSet, Services (-rw, -ro),
//! ConfigMap with postgresql.conf, credentials, PodDisruptionBudget.
//!
//! Built natively it is a plain library (tests, benchmarks); for `wasm32` it is a component.

#![forbid(unsafe_code)]

mod config;

use serde_json::{json, Map, Value};
use stateward_sdk::builders::objects::Port;
use stateward_sdk::builders::statefulset::{env, env_from_secret, exec_probe, ContainerSpec, Identity, ResourceDefaults};
use stateward_sdk::builders::{Ctx, CONFIG_DIR};
use stateward_sdk::driver::{Blueprint, ClientService};
use stateward_sdk::params::ParamRule;
use stateward_sdk::spec::{version_numbers, Cluster};
use stateward_sdk::status::Derived;
use stateward_sdk::FieldError;

pub use stateward_sdk::Service;

/// The plugin; `Postgres::reconcile(observed)` through [`Service`].
pub struct Postgres;

/// Where the volume is mounted; PGDATA is a subdirectory so initdb finds it empty.
const DATA_MOUNT: &str = "/var/lib/postgresql/data";

impl Blueprint for Postgres {
    const NAME: &'static str = "postgres";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const KIND: &'static str = "PostgresCluster";
    const PLURAL: &'static str = "postgresclusters";
    const SHORT: &'static str = "pgc";
    const COMPONENT: &'static str = "database";
    const CONFIG_FILE: &'static str = "postgresql.conf";
    const PORTS: &'static [Port] = &[Port { name: "postgres", port: 5432 }];
    const SECRET_KEYS: &'static [(&'static str, u32)] = &[("password", 24)];
    const PARAMETERS: &'static [ParamRule] = config::PARAMETERS;
    const FORBIDDEN: &'static [&'static str] = config::FORBIDDEN;

    fn default_image(version: &str) -> String {
        format!("postgres:{version}")
    }

    fn config(ctx: &Ctx) -> String {
        config::render(ctx)
    }

    fn container(ctx: &Ctx, image: String) -> ContainerSpec {
        // The Debian images run as postgres (999), the Alpine ones as postgres (70).
        let id = if ctx.cluster.spec.version.ends_with("-alpine") { 70 } else { 999 };
        let ready = "pg_isready --host=127.0.0.1 --port=5432 --username=postgres --timeout=3";
        ContainerSpec {
            image,
            command: Vec::new(),
            args: vec!["postgres".into(), "-c".into(), format!("config_file={CONFIG_DIR}/postgresql.conf")],
            env: vec![
                env("PGDATA", &format!("{DATA_MOUNT}/pgdata")),
                env("POSTGRES_USER", "postgres"),
                env_from_secret("POSTGRES_PASSWORD", &ctx.secret(), "password"),
            ],
            ports: Self::PORTS.to_vec(),
            readiness: exec_probe(ready, 5, 10, 5, 3),
            liveness: exec_probe(ready, 30, 10, 5, 6),
            data_mount: DATA_MOUNT,
            extra_mounts: Vec::new(),
            identity: Identity { uid: id, gid: id },
            defaults: ResourceDefaults {
                request_cpu: "250m",
                request_memory: "256Mi",
                limit_cpu: "1",
                limit_memory: "1Gi",
            },
            termination_grace_seconds: 60,
            parallel: false,
        }
    }

    fn client_services() -> Vec<ClientService> {
        vec![
            ClientService { suffix: "rw", primary_only: true },
            ClientService { suffix: "ro", primary_only: false },
        ]
    }

    fn status_extra(ctx: &Ctx, _derived: &Derived) -> Map<String, Value> {
        // Pod 0 is the primary until switchover (a later `request` action) exists.
        let mut m = Map::new();
        m.insert("currentPrimary".into(), json!(ctx.pod(0)));
        m
    }

    fn status_extra_schema() -> Map<String, Value> {
        let mut m = Map::new();
        m.insert(
            "currentPrimary".into(),
            json!({ "type": "string", "description": "Pod that accepts writes (behind the -rw Service)." }),
        );
        m
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
