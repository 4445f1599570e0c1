//! Panics stop at the reconcile boundary, and a controller task that dies anyway is seen.
//!
//! kube's controller polls each reconcile future inside the kind's controller task, so a panic
//! in a reconcile (in the policy gate, say) would end that task: the kind would silently stop
//! being reconciled while `/readyz` kept answering 200.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;

use super::Error;
use crate::telemetry::{DebugState, Metrics};

/// Runs one reconcile; a panic inside it becomes a failed reconcile ([`Error::Panicked`], so
/// the resource is retried with backoff like any failure) and counts in
/// `stateward_reconcile_panics_total{controller}`.
pub async fn catch_panic<T>(
    metrics: &Metrics,
    controller: &str,
    reconcile: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    // Unwind safety: a reconcile shares only the context's caches, metrics and locks, each of
    // which stays usable after a panic (the locks recover from poisoning).
    match AssertUnwindSafe(reconcile).catch_unwind().await {
        Ok(result) => result,
        Err(payload) => {
            let message = panic_message(payload.as_ref());
            tracing::error!(controller, panic = %message, "reconcile panicked");
            metrics.reconcile_panic(controller);
            Err(Error::Panicked(message))
        }
    }
}

/// Spawns one kind's controller task and watches it: if it ends or panics on its own (not
/// aborted), the kind is recorded as dead and `/readyz` answers 503 from then on.
pub fn supervise(
    debug: &DebugState,
    kind: &str,
    task: impl Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    debug.controller_started(kind);
    let (debug, kind) = (debug.clone(), kind.to_string());
    tokio::spawn(async move {
        let why = match AssertUnwindSafe(task).catch_unwind().await {
            Ok(()) => "ended".to_string(),
            Err(payload) => format!("panicked: {}", panic_message(payload.as_ref())),
        };
        tracing::error!(kind = %kind, why = %why, "controller task is gone; not ready");
        debug.controller_died(&kind, &why);
    })
}

/// The text of a panic payload (`panic!` with a literal or a formatted message).
fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_string())
}

#[cfg(test)]
#[allow(clippy::panic, clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_reconcile_is_a_failed_reconcile_and_counted() {
        let metrics = Metrics::new();
        let ok = catch_panic(&metrics, "Widget", async { Ok::<_, Error>(1) }).await;
        assert_eq!(ok.unwrap(), 1);
        let failed = catch_panic(&metrics, "Widget", async {
            if metrics.encode().is_empty() {
                return Ok(0);
            }
            panic!("the gate fell over");
        })
        .await;
        match failed {
            Err(e @ Error::Panicked(_)) => {
                assert_eq!(e.to_string(), "reconcile panicked: the gate fell over");
                assert_eq!(e.label(), "panicked");
            }
            other => panic!("expected a panicked reconcile, got {other:?}"),
        }
        let line = "stateward_reconcile_panics_total{controller=\"Widget\"} 1";
        assert!(metrics.encode().lines().any(|l| l == line), "no {line:?} in\n{}", metrics.encode());
    }
}
