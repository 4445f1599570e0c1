//! A review's way in, bounded in size, memory and time before it is evaluated.
//!
//! Whoever reaches the webhook port can send reviews (the webhook does not authenticate its
//! client). So a body is refused over [`REVIEW_BODY_LIMIT`] before it is read; its bytes are
//! charged to a budget of bodies being read, and before it is parsed, what parsing may cost
//! (`PARSE_FACTOR` times its size) to a budget of bodies being evaluated: one for bodies up to
//! [`SMALL_BODY`] (every review of a resource of usual size) and one for larger ones, so small
//! reviews never queue behind large ones. Only a body read whole takes one of the
//! [`REVIEWS_AT_ONCE`] evaluation slots, so a slow sender holds its own connection and bytes,
//! never a slot. Everything, the wait for budget and slot included,
//! ends within the review timeout with a 503, which the API server answers with the webhook's
//! failure policy.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use axum::Router;
use tokio::sync::Semaphore;

/// Largest review body accepted: the object and the old object of an AdmissionReview, each at
/// most etcd's 1.5 MiB (a larger one cannot be stored anyway), and the review around them.
pub const REVIEW_BODY_LIMIT: usize = 3 * 1024 * 1024 + 256 * 1024;

/// Reviews evaluated at once; more wait (within the timeout) instead of crowding the plugins'
/// sandbox and the policy engine.
pub const REVIEWS_AT_ONCE: usize = 16;

/// What parsing a JSON body may cost per byte of it: `[0,0,…]` becomes a 32-byte value for
/// every 2 bytes, in a vector that may have doubled; the bytes themselves besides.
const PARSE_FACTOR: usize = 34;

/// A body up to this size is evaluated within the small bodies' budget.
pub const SMALL_BODY: usize = 256 * 1024;

/// The budgets, in KiB: bodies being read (their bytes), and bodies being parsed and evaluated
/// (`PARSE_FACTOR` × their bytes), small and large ones apart. Together (352 MiB) well under
/// the operator's memory limit.
#[derive(Debug, Clone, Copy)]
pub struct Budgets {
    pub reading_kib: usize,
    pub small_kib: usize,
    pub large_kib: usize,
}

impl Default for Budgets {
    fn default() -> Self {
        Self { reading_kib: 64 * 1024, small_kib: 96 * 1024, large_kib: 192 * 1024 }
    }
}

struct Intake {
    reading: Semaphore,
    small: Semaphore,
    large: Semaphore,
    slots: Semaphore,
    budgets: Budgets,
    timeout: Duration,
}

/// `routes` with every request taken in by [`take_in`], each within `timeout`.
pub fn bounded(routes: Router, timeout: Duration, budgets: Budgets) -> Router {
    let intake = Arc::new(Intake {
        reading: Semaphore::new(budgets.reading_kib),
        small: Semaphore::new(budgets.small_kib),
        large: Semaphore::new(budgets.large_kib),
        slots: Semaphore::new(REVIEWS_AT_ONCE),
        budgets,
        timeout,
    });
    routes.layer(axum::middleware::from_fn_with_state(intake, take_in))
}

/// KiB charged for `bytes` × `factor`, at least 1 and at most the whole `budget` (a charge
/// larger than its budget would wait forever).
fn charge(bytes: usize, factor: usize, budget: usize) -> u32 {
    let kib = bytes.saturating_mul(factor).div_ceil(1024).clamp(1, budget.max(1));
    u32::try_from(kib).unwrap_or(u32::MAX)
}

async fn take_in(State(intake): State<Arc<Intake>>, request: Request, next: Next) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > REVIEW_BODY_LIMIT) {
        return too_large();
    }
    let work = async {
        // Without a length, the most a body may be.
        let expected = declared.unwrap_or(REVIEW_BODY_LIMIT);
        let budgets = intake.budgets;
        let _reading = intake.reading.acquire_many(charge(expected, 1, budgets.reading_kib)).await.ok()?;
        let (parts, body) = request.into_parts();
        let Ok(bytes) = axum::body::to_bytes(body, REVIEW_BODY_LIMIT).await else {
            return Some(too_large());
        };
        let (lane, budget) = match bytes.len() <= SMALL_BODY {
            true => (&intake.small, budgets.small_kib),
            false => (&intake.large, budgets.large_kib),
        };
        let _evaluating = lane.acquire_many(charge(bytes.len(), PARSE_FACTOR, budget)).await.ok()?;
        let _slot = intake.slots.acquire().await.ok()?;
        Some(next.run(Request::from_parts(parts, Body::from(bytes))).await)
    };
    match tokio::time::timeout(intake.timeout, work).await {
        Ok(Some(response)) => response,
        _ => (StatusCode::SERVICE_UNAVAILABLE, "the review did not finish within its time").into_response(),
    }
}

fn too_large() -> Response {
    (StatusCode::PAYLOAD_TOO_LARGE, format!("a review body is at most {REVIEW_BODY_LIMIT} bytes"))
        .into_response()
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;
    use axum::routing::post;
    use futures::SinkExt as _;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;
    use tower::ServiceExt as _;

    async fn echo(body: String) -> String {
        body
    }

    /// A request whose body promises `declared` bytes, sends `sent`, then nothing.
    async fn stalled(
        declared: usize,
        sent: usize,
    ) -> (Request, futures::channel::mpsc::Sender<Result<Vec<u8>, std::io::Error>>) {
        let (mut tx, body) = futures::channel::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
        tx.send(Ok(vec![b'x'; sent])).await.expect("send");
        let request = axum::http::Request::post("/")
            .header("content-length", declared.to_string())
            .body(Body::from_stream(body))
            .expect("request");
        (request, tx)
    }

    #[tokio::test]
    async fn a_review_whose_body_never_completes_is_answered_503_within_the_timeout() {
        let routes =
            bounded(Router::new().route("/", post(echo)), Duration::from_millis(300), Budgets::default());
        let (request, tx) = stalled(100, 10).await;
        let started = Instant::now();
        let response = tokio::time::timeout(Duration::from_secs(5), routes.clone().oneshot(request))
            .await
            .expect("answered, not left hanging")
            .expect("infallible");
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(started.elapsed() >= Duration::from_millis(300), "{:?}", started.elapsed());
        // A complete body within the time is served.
        let request = axum::http::Request::post("/").body(Body::from("ok")).expect("request");
        let response = routes.oneshot(request).await.expect("infallible");
        assert_eq!(response.status(), StatusCode::OK);
        drop(tx);
    }

    /// More slow senders than there are slots: a complete review is still answered at once,
    /// since a body is read before it takes a slot.
    #[tokio::test]
    async fn slow_senders_hold_no_evaluation_slot() {
        let routes =
            bounded(Router::new().route("/", post(echo)), Duration::from_secs(3), Budgets::default());
        let mut senders = Vec::new();
        let mut pending = Vec::new();
        for _ in 0..REVIEWS_AT_ONCE + 4 {
            let (request, tx) = stalled(1000, 10).await;
            senders.push(tx);
            pending.push(tokio::spawn(routes.clone().oneshot(request)));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let request = axum::http::Request::post("/").body(Body::from("ok")).expect("request");
        let response = routes.oneshot(request).await.expect("infallible");
        assert_eq!(response.status(), StatusCode::OK);
        assert!(
            pending.iter().all(|p| !p.is_finished()),
            "answered only once a slow sender's time was up: it waited behind them"
        );
        drop(senders);
        for p in pending {
            let _ = p.await;
        }
    }

    /// A body over the limit is refused by its declared length, before it is read, and by
    /// its bytes when it declares none.
    #[tokio::test]
    async fn a_body_over_the_limit_is_refused_413() {
        let routes =
            bounded(Router::new().route("/", post(echo)), Duration::from_secs(3), Budgets::default());
        let (request, tx) = stalled(REVIEW_BODY_LIMIT + 1, 10).await;
        let response = routes.clone().oneshot(request).await.expect("infallible");
        assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
        drop(tx);
        let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
            (0..4).map(|_| Ok(vec![b' '; REVIEW_BODY_LIMIT / 3])).collect();
        let body = Body::from_stream(futures::stream::iter(chunks));
        let request = axum::http::Request::post("/").body(body).expect("request");
        let response = routes.oneshot(request).await.expect("infallible");
        assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }

    /// Large bodies are evaluated only as many at once as their parsing may cost within their
    /// budget; small ones pass beside them, never queued behind them.
    #[tokio::test]
    async fn large_bodies_wait_for_the_memory_their_parsing_may_take() {
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let finished = Arc::new(AtomicUsize::new(0));
        let handler = {
            let (running, most, finished) = (Arc::clone(&running), Arc::clone(&most), Arc::clone(&finished));
            move |body: String| async move {
                if body.len() > 1000 {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    running.fetch_sub(1, Ordering::SeqCst);
                    finished.fetch_add(1, Ordering::SeqCst);
                }
                "done"
            }
        };
        // Room for the parsing of one 300 KB body at a time.
        let budgets = Budgets {
            reading_kib: 64 * 1024,
            small_kib: 1024,
            large_kib: 300 * PARSE_FACTOR * 1000 / 1024 + 1,
        };
        let routes = bounded(Router::new().route("/", post(handler)), Duration::from_secs(5), budgets);
        let large = || axum::http::Request::post("/").body(Body::from(vec![b'0'; 300_000])).expect("request");
        let tasks: Vec<_> = (0..4).map(|_| tokio::spawn(routes.clone().oneshot(large()))).collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let small = axum::http::Request::post("/").body(Body::from("ok")).expect("request");
        assert_eq!(routes.oneshot(small).await.expect("infallible").status(), StatusCode::OK);
        assert!(finished.load(Ordering::SeqCst) < 4, "the small review waited for every large one");
        for t in tasks {
            assert_eq!(t.await.expect("task").expect("infallible").status(), StatusCode::OK);
        }
        assert_eq!(most.load(Ordering::SeqCst), 1, "one large body evaluated at a time");
    }
}
