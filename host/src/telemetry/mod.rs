//! Telemetry for the operator (DESIGN.md §7): one Prometheus registry (with the `process_*`
//! metrics), the plain HTTP port that serves it together with health and debug endpoints, the
//! `tracing` log setup, and OTLP trace export with trace ids in logs and audit records.
//!
//! Kept apart from the controller so the reconcile code only calls small recording methods and
//! never deals with metric families, HTTP routing or subscriber wiring.

pub mod http;
pub mod logging;
pub mod metrics;
pub mod otel;
pub mod process;

pub use http::{serve, DebugState};
pub use metrics::Metrics;
