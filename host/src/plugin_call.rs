//! The one way the operator calls a plugin export. Reconcile and finalize (the controller),
//! validate and convert (the webhooks) all go through [`call`], so every call is treated alike:
//! the same probation, the same `plugin.call` span, the same metrics.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::runtime::{Lane, Plugin, RuntimeError, Sandbox};
use crate::telemetry::Metrics;

/// Calls `export` of `plugin` (`f` makes the call) on the sandbox's call pool, off the async
/// runtime:
/// - a plugin on probation (a call of it ran out of time or memory and none has succeeded
///   since) gets one call at a time ([`Plugin::probation_permit`]);
/// - the call runs in a `plugin.call` span (plugin, version, export, and `elapsed_ms` once it
///   returns), which its `log` lines become events of;
/// - it takes a slot of its lane: validate and convert (the webhooks) have slots apart from
///   reconcile and finalize ([`Lane`]);
/// - its wall time goes to `stateward_plugin_call_duration_seconds{plugin, export}`, and an
///   answer that is a trap, timeout or out-of-memory counts in
///   `stateward_plugin_traps_total{plugin, reason}`.
///
/// The outer error says the call could not run (the pool is closed, the task failed); the inner
/// result is the export's own answer.
pub async fn call<T: Send + 'static>(
    sandbox: &Sandbox,
    metrics: &Metrics,
    plugin: &Arc<Plugin>,
    export: &'static str,
    f: impl FnOnce(&Plugin) -> Result<T, RuntimeError> + Send + 'static,
) -> Result<Result<T, RuntimeError>, RuntimeError> {
    let span = tracing::info_span!(
        "plugin.call",
        plugin = plugin.name(),
        version = plugin.version(),
        export,
        elapsed_ms = tracing::field::Empty
    );
    let started = Instant::now();
    let _probation = if plugin.on_probation() { plugin.probation_permit().await } else { None };
    let (guest, in_call) = (Arc::clone(plugin), span.clone());
    let answer = sandbox.run_blocking(Lane::of(export), move || in_call.in_scope(|| f(&guest))).await?;
    let elapsed = started.elapsed();
    span.record("elapsed_ms", millis(elapsed));
    metrics.plugin_call(plugin.name(), export, elapsed.as_secs_f64());
    if let Err(err) = &answer {
        if err.is_trap() {
            metrics.plugin_trap(plugin.name(), err.label());
        }
    }
    Ok(answer)
}

/// Milliseconds with microsecond resolution, for span attributes people read.
fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}
