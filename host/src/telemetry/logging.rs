//! Log setup (docs/architecture.md, Telemetry): `tracing` events as JSON lines for a cluster's log pipeline, or as
//! plain text for a person at a terminal.
//!
//! The JSON lines come from a small formatter of our own rather than tracing-subscriber's stock
//! `.json()`: the stock one nests span fields under `span`/`spans` objects *next to the span's own
//! `name` key*, so the reconcile span's `name` field (the resource name) turns into
//! a duplicate JSON key that parsers resolve to the span name. Ours flattens the fields of every
//! enclosing span and of the event into one object, so each line carries
//! `kind, namespace, name, trace_id, …` at the top level, and lists the span names in `spans`.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// Filter used when `RUST_LOG` is unset or unparsable: our own events at info, while the client
/// and HTTP stacks, which log every request and watch restart at info, only speak up on trouble.
pub const DEFAULT_FILTER: &str = "info,kube=warn,tower=warn,hyper=warn";

/// Installs the global subscriber, writing to stderr so stdout stays free for command output,
/// together with the OpenTelemetry layer (see [`super::otel`]): OTLP export when the `OTEL_*`
/// variables ask for it, and trace ids for every span either way.
///
/// With `json`, each event is one JSON object: `timestamp`, `level`, `target`, the fields of all
/// enclosing spans (outermost first, inner ones win), the event's own fields (they win over span
/// fields; the text is `message`), `spans`, the enclosing span names outermost first, and inside
/// a span its `trace_id` and `span_id` (W3C hex, the ids Jaeger shows).
///
/// Calling it again (or after another subscriber was installed, e.g. by a test) does nothing:
/// the first subscriber stays, which is what a process-wide logger should do.
pub fn init(json: bool) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let (provider, otel_error) = super::otel::init_global();
    let registry = tracing_subscriber::registry().with(filter).with(super::otel::layer(&provider));
    // Colours only for a terminal: logs written to a file or a pipe stay plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi);
    // try_init fails only when a global subscriber exists already; keeping that one is the
    // intended idempotent behaviour, so the error carries nothing to act on.
    let _ = if json {
        // JsonFields stores each span's fields as a JSON object string, which FlatJson reads back.
        registry.with(fmt.fmt_fields(JsonFields::new()).event_format(FlatJson)).try_init()
    } else {
        registry.with(fmt).try_init()
    };
    if let Some(err) = otel_error {
        tracing::warn!(error = %err, "trace export disabled");
    }
}

/// Flushes and stops trace export; call once before the process exits.
pub fn shutdown() {
    super::otel::shutdown(std::time::Duration::from_secs(3));
}

/// Event formatter writing one flat JSON object per line (see the module docs for why).
#[derive(Debug, Clone, Copy, Default)]
pub struct FlatJson;

impl<S, N> FormatEvent<S, N> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut line = Map::new();
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        line.insert("timestamp".into(), Value::String(timestamp));
        line.insert("level".into(), Value::String(meta.level().to_string()));
        line.insert("target".into(), Value::String(meta.target().to_owned()));

        let mut spans = Vec::new();
        let mut innermost = None;
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                spans.push(Value::String(span.name().to_owned()));
                innermost = Some(span.id());
                let extensions = span.extensions();
                let Some(fields) = extensions.get::<FormattedFields<N>>() else { continue };
                // Written by JsonFields as `{"k":v,…}`, or empty for a span without fields.
                if let Ok(Value::Object(map)) = serde_json::from_str::<Value>(&fields.fields) {
                    line.extend(map);
                }
            }
        }
        // After the loop: the OpenTelemetry lookup locks span extensions itself.
        if let Some((trace_id, span_id)) = innermost.and_then(|id| otel_ids(&id)) {
            line.insert("trace_id".into(), Value::String(trace_id));
            line.insert("span_id".into(), Value::String(span_id));
        }

        let mut visitor = FieldsToJson { line: &mut line, log_target: None };
        event.record(&mut visitor);
        // Records from crates that use `log` arrive with target "log" and their real target in a
        // `log.target` field (tracing-log's bridge); report the real one, as the stock formatter does.
        if let Some(target) = visitor.log_target.take() {
            line.insert("target".into(), Value::String(target));
        }
        if !spans.is_empty() {
            line.insert("spans".into(), Value::Array(spans));
        }
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// The OpenTelemetry trace and span id of a `tracing` span, when the OpenTelemetry layer is
/// installed in the current dispatcher.
fn otel_ids(id: &tracing::span::Id) -> Option<(String, String)> {
    use opentelemetry::trace::TraceContextExt;
    let cx =
        tracing::dispatcher::get_default(|dispatch| tracing_opentelemetry::get_otel_context(id, dispatch))?;
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid().then(|| (sc.trace_id().to_string(), sc.span_id().to_string()))
}

/// Collects an event's fields into a JSON map, keeping numbers and booleans typed. The `log.*`
/// fields added by the `log` bridge (target, module path, file, line) are dropped, except the
/// target, which replaces the placeholder "log".
struct FieldsToJson<'a> {
    line: &'a mut Map<String, Value>,
    log_target: Option<String>,
}

impl FieldsToJson<'_> {
    fn put(&mut self, field: &Field, value: Value) {
        let name = field.name();
        if name.starts_with("log.") {
            if let ("log.target", Value::String(target)) = (name, value) {
                self.log_target = Some(target);
            }
            return;
        }
        self.line.insert(name.to_owned(), value);
    }
}

impl Visit for FieldsToJson<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, serde_json::Number::from_f64(value).map_or(Value::Null, Value::Number));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::Bool(value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::String(value.to_owned()));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::String(value.to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // `message` arrives here as format_args!, whose Debug output is the plain text.
        self.put(field, Value::String(format!("{value:?}")));
    }
}
