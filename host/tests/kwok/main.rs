//! The host against the local cluster (tests/cluster: a real API server, kwok nodes): the
//! operator binary end to end, leader election, RBAC, webhooks, hot reload, policies, traces.
//! Every test has its own namespace and operator, so they run in parallel; one test binary with
//! a module per concern, so the suite compiles and links the shared helpers (e2e) once.
//! Tests that change what every other test shares are in `cluster_wide`.
//!
//! Run: `scripts/build-plugins && cargo test -p stateward --test kwok` (a module alone:
//! `-- e2e_controller::`).

#[path = "../e2e/mod.rs"]
mod e2e;
#[path = "../support/mod.rs"]
mod support;
#[path = "../e2e/webhook.rs"]
mod webhook_env;

mod api_refusals;
mod child_cache_backpressure;
mod e2e_controller;
mod events_dedup;
mod hot_reload_live;
mod leader;
mod name_conflict;
mod network_policy;
mod outage;
mod policy_live;
mod rbac;
mod reload_guard;
mod service_ca;
mod tracing_jaeger;
mod upgrade;
mod volume_growth;
mod webhooks;
