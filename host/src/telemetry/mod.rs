//! Telemetry for the operator (docs/architecture.md, Telemetry): one Prometheus registry (with the `process_*`
//! metrics), the plain HTTP port that serves it together with health and debug endpoints, the
//! `tracing` log setup, OTLP trace export with trace ids in logs and audit records, and the
//! deduplicated Kubernetes Events the controller and the reloader publish.
//!
//! Kept apart from the controller so the reconcile code only calls small recording methods and
//! never deals with metric families, HTTP routing or subscriber wiring.

pub mod events;
pub mod http;
pub mod logging;
pub mod metrics;
pub mod otel;
pub mod process;

pub use http::{serve, DebugState};
pub use metrics::Metrics;
