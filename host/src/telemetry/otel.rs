//! OTLP trace export (docs/architecture.md, Telemetry): every `tracing` span becomes an OpenTelemetry span through
//! tracing-opentelemetry, and finished spans leave the process in batches over OTLP/HTTP
//! (protobuf) when the standard variables ask for it.
//!
//! Configuration is the OpenTelemetry SDK's own environment contract:
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (base URL, `/v1/traces` is appended) or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (full URL), `OTEL_EXPORTER_OTLP_PROTOCOL` /
//! `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` (`http/protobuf`, the only one built in),
//! `OTEL_SERVICE_NAME` (default `stateward`), `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`
//! (read by the SDK; default `parentbased_always_on`), `OTEL_EXPORTER_OTLP_TIMEOUT` /
//! `OTEL_EXPORTER_OTLP_HEADERS`, and `OTEL_BSP_*` for the batch processor. With neither endpoint
//! variable set nothing is exported.
//!
//! Spans get trace ids either way (with export off they are simply never sampled), so log lines
//! and audit records carry a `trace_id` that a later export-enabled run would also show.
//!
//! Export can never slow a reconcile: a span is handed to a bounded queue and dropped (and
//! counted in `stateward_otel_spans_dropped_total{reason="queue_full"}`) when the queue is full;
//! the batch processor runs on its own thread and the HTTP requests on a dedicated one-thread
//! runtime, so a dead or slow collector only costs that thread's time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider, SpanData, SpanExporter,
    SpanProcessor,
};
use opentelemetry_sdk::Resource;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Service name used when `OTEL_SERVICE_NAME` is unset.
pub const DEFAULT_SERVICE_NAME: &str = "stateward";

/// Spans waiting for export at most; past this, new spans are dropped and counted. One reconcile
/// makes about six spans, so this holds a few hundred reconciles' worth.
pub const DEFAULT_QUEUE_SPANS: usize = 2048;

/// How often the batch processor sends what it has: short, so a trace shows up in the UI a
/// moment after its reconcile rather than five seconds later (the SDK default).
const DEFAULT_EXPORT_INTERVAL: Duration = Duration::from_millis(500);

/// Span name of a webhook request's root span (see [`webhook_span`]).
pub const WEBHOOK_SPAN: &str = "webhook";

/// What went wrong configuring export; the operator logs it and runs without export.
#[derive(Debug, thiserror::Error)]
pub enum OtelError {
    /// The protocol variable names something this build cannot speak.
    #[error("OTLP protocol {0:?} is not supported (this build speaks http/protobuf)")]
    Protocol(String),
    /// The endpoint is not a plain `http://` URL.
    #[error(
        "OTLP endpoint {0:?} is not supported: only http:// endpoints (e.g. a collector in the cluster)"
    )]
    Endpoint(String),
    /// The exporter or its HTTP client could not be built.
    #[error("building the OTLP exporter: {0}")]
    Build(String),
}

/// Where and how to export, read from the standard variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportSettings {
    /// Full traces URL (`…/v1/traces`).
    pub endpoint: String,
    /// Spans the queue holds before dropping.
    pub queue_spans: usize,
    /// Interval between batch exports.
    pub interval: Duration,
}

impl ExportSettings {
    /// Export to `endpoint` (a base URL like `http://collector:4318`, `/v1/traces` appended).
    pub fn to_base(endpoint: &str) -> Self {
        Self {
            endpoint: format!("{}/v1/traces", endpoint.trim_end_matches('/')),
            queue_spans: DEFAULT_QUEUE_SPANS,
            interval: DEFAULT_EXPORT_INTERVAL,
        }
    }

    /// Reads the OTEL_* variables; `Ok(None)` when no endpoint is set (export off).
    pub fn from_env() -> Result<Option<Self>, OtelError> {
        Self::from_lookup(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
    }

    /// [`Self::from_env`] over any variable source (tests pass a map).
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, OtelError> {
        let protocol =
            var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"));
        let mut settings =
            match (var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), var("OTEL_EXPORTER_OTLP_ENDPOINT")) {
                (Some(full), _) => Self { endpoint: full, ..Self::to_base("") },
                (None, Some(base)) => Self::to_base(&base),
                (None, None) => return Ok(None),
            };
        if let Some(protocol) = protocol {
            if protocol.trim() != "http/protobuf" {
                return Err(OtelError::Protocol(protocol));
            }
        }
        if !settings.endpoint.starts_with("http://") {
            return Err(OtelError::Endpoint(settings.endpoint));
        }
        if let Some(size) = var("OTEL_BSP_MAX_QUEUE_SIZE").and_then(|v| v.trim().parse().ok()) {
            settings.queue_spans = size;
        }
        if let Some(ms) = var("OTEL_BSP_SCHEDULE_DELAY").and_then(|v| v.trim().parse().ok()) {
            settings.interval = Duration::from_millis(ms);
        }
        Ok(Some(settings))
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct Reason {
    reason: &'static str,
}

/// Process-wide export counters. They live outside [`super::Metrics`] because the exporter is
/// set up with the logger, before any registry exists; `Metrics::new` registers these same
/// (shared) counters.
#[derive(Debug, Clone, Default)]
pub struct ExportStats {
    pub(crate) exported: Counter,
    pub(crate) dropped: Family<Reason, Counter>,
}

impl ExportStats {
    /// Spans accepted by the collector.
    pub fn exported(&self) -> u64 {
        self.exported.get()
    }

    /// Spans lost: `queue_full` (the queue was at capacity) or `export_failed` (the collector
    /// could not be reached or refused the batch).
    pub fn dropped(&self, reason: &'static str) -> u64 {
        self.dropped.get_or_create(&Reason { reason }).get()
    }

    fn drop_spans(&self, reason: &'static str, n: usize) {
        self.dropped.get_or_create(&Reason { reason }).inc_by(n as u64);
    }
}

/// The counters of this process's exporter (what `/metrics` shows).
pub static STATS: LazyLock<ExportStats> = LazyLock::new(ExportStats::default);

static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// Builds the tracer provider: with `export`, a bounded batch exporter over OTLP/HTTP counting
/// into `stats`; without, a provider that samples nothing (spans still get ids for the logs).
///
/// Must be called where a `Drop` of the export runtime is allowed later (any thread: the
/// runtime is shut down in the background).
pub fn provider(
    export: Option<&ExportSettings>,
    stats: &ExportStats,
) -> Result<SdkTracerProvider, OtelError> {
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(DEFAULT_SERVICE_NAME);
    }
    let builder = SdkTracerProvider::builder().with_resource(resource.build());
    let Some(export) = export else {
        return Ok(builder.with_sampler(Sampler::AlwaysOff).build());
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(export.endpoint.clone())
        .with_http_client(ExportClient::new(export_timeout())?)
        .build()
        .map_err(|e| OtelError::Build(e.to_string()))?;
    let queue = Arc::new(Queue { spans: AtomicUsize::new(0), capacity: export.queue_spans.max(1) });
    let exporter = CountingExporter { inner: exporter, queue: Arc::clone(&queue), stats: stats.clone() };
    let batch = BatchSpanProcessor::builder(exporter)
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_max_queue_size(queue.capacity)
                .with_max_export_batch_size(512.min(queue.capacity))
                .with_scheduled_delay(export.interval)
                .build(),
        )
        .build();
    Ok(builder.with_span_processor(BoundedProcessor { inner: batch, queue, stats: stats.clone() }).build())
}

/// The `tracing` layer turning spans into OpenTelemetry spans of `provider`. Error-level events
/// mark their span as failed; span events carry the level and target.
pub fn layer<S>(provider: &SdkTracerProvider) -> tracing_opentelemetry::OpenTelemetryLayer<S, SdkTracer>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("stateward"))
        .with_location(false)
        .with_threads(false)
}

/// Builds this process's provider from the environment and keeps it for [`shutdown`]. A bad
/// configuration is reported through the returned error and leaves export off.
pub fn init_global() -> (SdkTracerProvider, Option<OtelError>) {
    let (export, error) = match ExportSettings::from_env() {
        Ok(export) => (export, None),
        Err(err) => (None, Some(err)),
    };
    let (provider, error) = match provider(export.as_ref(), &STATS) {
        Ok(p) => (p, error),
        Err(err) => {
            (self::provider(None, &STATS).unwrap_or_else(|_| SdkTracerProvider::builder().build()), Some(err))
        }
    };
    let _ = PROVIDER.set(provider.clone());
    (provider, error)
}

/// Sends what is still queued (waiting at most `timeout` in all) and stops the exporter; call
/// once on the way out so the last reconciles' spans are not lost.
pub fn shutdown(timeout: Duration) {
    if let Some(provider) = PROVIDER.get() {
        // Shutdown exports what is queued within the timeout (a separate force_flush would wait
        // for a slow collector without one, delaying the exit past the pod's grace period).
        let _ = provider.shutdown_with_timeout(timeout);
    }
}

/// W3C ids (32 and 16 lowercase hex digits) of the current span's trace, if the current span
/// belongs to one. Audit records and admission answers use this to point at their trace.
pub fn current_ids() -> Option<(String, String)> {
    let cx = tracing::Span::current().context();
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid().then(|| (sc.trace_id().to_string(), sc.span_id().to_string()))
}

/// The root span of one webhook request, so every request is a trace of its own: the admission
/// webhook opens `webhook_span("validate", kind, namespace, name)` and the conversion webhook
/// `webhook_span("convert", kind, "", "")`, and each `.instrument()`s its handler with it, so
/// policy decisions made inside it are audited with its trace id. The handler records the
/// request's details (`operation`, `user`, `dry_run` for admission; `desired`, `objects` for
/// conversion) and its `result` (`span.record("result", "allow")`).
pub fn webhook_span(export: &str, kind: &str, namespace: &str, name: &str) -> tracing::Span {
    tracing::info_span!(
        parent: None,
        "webhook",
        otel.name = format!("webhook {export}"),
        otel.kind = "server",
        export,
        kind,
        namespace,
        name,
        operation = tracing::field::Empty,
        user = tracing::field::Empty,
        dry_run = tracing::field::Empty,
        desired = tracing::field::Empty,
        objects = tracing::field::Empty,
        result = tracing::field::Empty,
    )
}

fn export_timeout() -> Duration {
    ["OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
        .map_or(Duration::from_secs(10), Duration::from_millis)
}

/// Spans handed to the batch processor and not yet taken by an export.
#[derive(Debug)]
struct Queue {
    spans: AtomicUsize,
    capacity: usize,
}

impl Queue {
    fn try_take_slot(&self) -> bool {
        self.spans
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.capacity).then_some(n + 1))
            .is_ok()
    }

    fn release(&self, n: usize) {
        let _ = self.spans.fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| Some(q.saturating_sub(n)));
    }
}

/// The SDK's batch processor with our own admission count in front of it: the SDK drops spans
/// when its channel is full but only reports the count at shutdown, whereas the metric must move
/// as it happens. Our slot count never exceeds the SDK channel's capacity, so every drop is ours.
#[derive(Debug)]
struct BoundedProcessor {
    inner: BatchSpanProcessor,
    queue: Arc<Queue>,
    stats: ExportStats,
}

impl SpanProcessor for BoundedProcessor {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if self.queue.try_take_slot() {
            self.inner.on_end(span);
        } else {
            self.stats.drop_spans("queue_full", 1);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// Frees queue slots as batches leave and counts what the collector took or refused.
#[derive(Debug)]
struct CountingExporter<E> {
    inner: E,
    queue: Arc<Queue>,
    stats: ExportStats,
}

impl<E: SpanExporter> SpanExporter for CountingExporter<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        self.queue.release(n);
        let result = self.inner.export(batch).await;
        match &result {
            Ok(()) => {
                self.stats.exported.inc_by(n as u64);
            }
            Err(_) => self.stats.drop_spans("export_failed", n),
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// Largest collector answer read (an OTLP response is a few bytes).
const MAX_RESPONSE_BYTES: usize = 1 << 20;

/// OTLP/HTTP client on hyper (already in the tree through kube) driven by its own one-thread
/// tokio runtime: the batch processor calls it from a plain thread, and keeping its I/O off the
/// operator's runtime means a hanging collector cannot take reactor time from reconciles.
#[derive(Debug)]
struct ExportClient {
    client: Client<HttpConnector, Full<Bytes>>,
    runtime: Runtime,
    timeout: Duration,
}

impl ExportClient {
    fn new(timeout: Duration) -> Result<Self, OtelError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("otlp-export")
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| OtelError::Build(format!("export runtime: {e}")))?;
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Self { client, runtime: Runtime(Some(runtime)), timeout })
    }
}

#[async_trait::async_trait]
impl HttpClient for ExportClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let Some(runtime) = &self.runtime.0 else {
            return Err("export runtime stopped".into());
        };
        let (client, timeout) = (self.client.clone(), self.timeout);
        let request = request.map(Full::new);
        let task = runtime.spawn(async move {
            let exchange = async {
                let response = client.request(request).await?;
                let (parts, body) = response.into_parts();
                let body = Limited::new(body, MAX_RESPONSE_BYTES).collect().await?.to_bytes();
                Ok::<_, HttpError>(Response::from_parts(parts, body))
            };
            match tokio::time::timeout(timeout, exchange).await {
                Ok(answer) => answer,
                Err(_) => Err(format!("no answer within {timeout:?}").into()),
            }
        });
        task.await?
    }
}

/// Owns the export runtime; shuts it down without waiting, which is allowed from any context
/// (a plain `Drop` of a runtime panics inside another runtime).
#[derive(Debug)]
struct Runtime(Option<tokio::runtime::Runtime>);

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> =
            vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn export_is_off_without_an_endpoint() {
        assert_eq!(ExportSettings::from_lookup(lookup(&[("OTEL_SERVICE_NAME", "x")])).ok(), Some(None));
    }

    #[test]
    fn base_endpoint_gets_the_traces_path_and_a_full_one_is_kept() {
        let s = ExportSettings::from_lookup(lookup(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/")]));
        assert_eq!(s.ok().flatten().map(|s| s.endpoint).as_deref(), Some("http://c:4318/v1/traces"));
        let s = ExportSettings::from_lookup(lookup(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:1/x"),
        ]));
        assert_eq!(s.ok().flatten().map(|s| s.endpoint).as_deref(), Some("http://t:1/x"));
    }

    #[test]
    fn unsupported_protocol_and_scheme_are_errors() {
        let grpc = ExportSettings::from_lookup(lookup(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ]));
        assert!(matches!(grpc, Err(OtelError::Protocol(_))));
        let https = ExportSettings::from_lookup(lookup(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318")]));
        assert!(matches!(https, Err(OtelError::Endpoint(_))));
    }

    #[test]
    fn the_queue_refuses_past_capacity_and_frees_on_export() {
        let q = Queue { spans: AtomicUsize::new(0), capacity: 2 };
        assert!(q.try_take_slot() && q.try_take_slot());
        assert!(!q.try_take_slot());
        q.release(5);
        assert!(q.try_take_slot());
    }
}
