//! The operator's metrics: one `prometheus-client` registry holding every family listed in
//! docs/architecture.md (Telemetry), behind a cheap-to-clone handle so the controller, the plugin
//! runtime and the HTTP server all record into and read from the same registry.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::encoding::{text, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

/// Histogram buckets in seconds, 1 ms to 10 s on a 1-2.5-5 ladder: a reconcile, a plugin call or
/// a policy evaluation normally takes milliseconds, and anything past 10 s is an outlier whose
/// exact value matters less than that it is counted. Written out so the exposition shows
/// exact bucket bounds (`le="0.0025"`) instead of accumulated floating-point noise.
const DURATION_BUCKETS: [f64; 13] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerResult {
    controller: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabel {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginExport {
    plugin: String,
    export: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginReason {
    plugin: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginBuild {
    plugin: String,
    version: String,
    digest: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyResult {
    policy: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabel {
    policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DigestLabel {
    digest: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindRule {
    kind: String,
    rule: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindPhase {
    kind: String,
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbResult {
    verb: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbKind {
    verb: String,
    kind: String,
}

/// Handle to the operator's metric registry. Cloning is cheap (one `Arc`); every clone records
/// into the same families, so hand one to each component instead of threading a reference.
#[derive(Clone, Debug)]
pub struct Metrics {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    registry: Registry,
    reconciles: Family<ControllerResult, Counter>,
    reconcile_seconds: Histograms<ControllerResult>,
    reconcile_panics: Family<ControllerLabel, Counter>,
    plugin_call_seconds: Histograms<PluginExport>,
    plugin_traps: Family<PluginReason, Counter>,
    plugins_loaded: Family<PluginBuild, Gauge>,
    plugin_load_failures: Family<PluginReason, Counter>,
    policy_decisions: Family<PolicyResult, Counter>,
    policy_eval_seconds: Histograms<PolicyLabel>,
    managed_resources: Family<KindPhase, Gauge>,
    api_writes: Family<VerbKind, Counter>,
    requests: Family<VerbResult, Counter>,
    request_seconds: Histograms<VerbResult>,
    policy_bundle: Family<DigestLabel, Gauge>,
    policy_bundle_failures: Family<ReasonLabel, Counter>,
    policy_violations: Family<KindRule, Gauge>,
    /// The build currently loaded per plugin, so loading a new one retires the old series.
    loaded_builds: Mutex<HashMap<String, PluginBuild>>,
    /// Phases ever reported per kind, so a phase that empties out drops to 0 instead of
    /// keeping its last count forever.
    seen_phases: Mutex<HashMap<String, BTreeSet<String>>>,
    /// Rules ever reported violated per kind, for the same reason.
    seen_rules: Mutex<HashMap<String, BTreeSet<String>>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Builds the registry with every family registered up front, so `/metrics` lists each
    /// metric's HELP/TYPE even before the first observation.
    pub fn new() -> Self {
        // The prefix gives every family the `stateward_` namespace; prometheus-client appends
        // `_total` to counters and the unit suffix to families registered with a unit.
        // The process collector's `process_*` names are a cross-language convention and stay
        // unprefixed, so the root registry has no prefix and ours live in a sub-registry.
        let mut root = Registry::default();
        root.register_collector(Box::new(super::process::ProcessCollector));
        let registry = root.sub_registry_with_prefix("stateward");
        let reconciles = Family::default();
        registry.register("reconcile", "Reconciles finished, by controller and result", reconciles.clone());
        let reconcile_seconds: Histograms<_> = Family::new_with_constructor(duration_histogram);
        registry.register_with_unit(
            "reconcile_duration",
            "Wall time of one reconcile, by controller and result",
            Unit::Seconds,
            reconcile_seconds.clone(),
        );
        let reconcile_panics = Family::default();
        registry.register(
            "reconcile_panics",
            "Reconciles that panicked (caught, counted as failed), by controller",
            reconcile_panics.clone(),
        );
        let plugin_call_seconds: Histograms<_> = Family::new_with_constructor(duration_histogram);
        registry.register_with_unit(
            "plugin_call_duration",
            "Wall time of one call into a Wasm plugin export",
            Unit::Seconds,
            plugin_call_seconds.clone(),
        );
        let plugin_traps = Family::default();
        registry.register(
            "plugin_traps",
            "Plugin calls that ended in a trap, by reason",
            plugin_traps.clone(),
        );
        let plugins_loaded = Family::default();
        registry.register(
            "plugins_loaded",
            "Plugin builds currently loaded (1 per loaded plugin, labelled with its build)",
            plugins_loaded.clone(),
        );
        let plugin_load_failures = Family::default();
        registry.register(
            "plugin_load_failures",
            "Plugin loads that were refused or failed, by reason",
            plugin_load_failures.clone(),
        );
        let policy_decisions = Family::default();
        registry.register(
            "policy_decisions",
            "Policy decisions, by policy and result",
            policy_decisions.clone(),
        );
        let policy_eval_seconds: Histograms<_> = Family::new_with_constructor(duration_histogram);
        registry.register_with_unit(
            "policy_eval_duration",
            "Wall time of one policy evaluation",
            Unit::Seconds,
            policy_eval_seconds.clone(),
        );
        let managed_resources = Family::default();
        registry.register(
            "managed_resources",
            "Custom resources managed, by kind and status phase",
            managed_resources.clone(),
        );
        let api_writes = Family::default();
        registry.register(
            "api_writes",
            "Write requests sent to the Kubernetes API server, by verb and kind",
            api_writes.clone(),
        );
        let requests = Family::default();
        registry.register(
            "requests",
            "Requests of plans to the running service (exec, http) answered, by verb and result: ok (an exit code or status), error (sent, no answer: timeout, connection, stream), not_sent (the target could not be resolved)",
            requests.clone(),
        );
        let request_seconds: Histograms<_> = Family::new_with_constructor(duration_histogram);
        registry.register_with_unit(
            "request_duration",
            "Wall time of one request sent to the running service, by verb and result",
            Unit::Seconds,
            request_seconds.clone(),
        );
        let policy_bundle = Family::default();
        registry.register(
            "policy_bundle_info",
            "The policy bundle in force (1, labelled with its digest)",
            policy_bundle.clone(),
        );
        let policy_bundle_failures = Family::default();
        registry.register(
            "policy_bundle_load_failures",
            "Policy bundles from ConfigMaps that were rejected, by reason",
            policy_bundle_failures.clone(),
        );
        let policy_violations = Family::default();
        registry.register(
            "policy_violations",
            "Existing resources the admission policy would deny now (audit sweep), by kind and rule",
            policy_violations.clone(),
        );
        // Trace export counters, shared with the exporter set up before this registry existed.
        let otel = &super::otel::STATS;
        registry.register(
            "otel_spans_exported",
            "Trace spans accepted by the OTLP collector",
            otel.exported.clone(),
        );
        registry.register(
            "otel_spans_dropped",
            "Trace spans lost before export: queue_full (export too slow or down) or export_failed",
            otel.dropped.clone(),
        );
        let inner = Inner {
            registry: root,
            reconciles,
            reconcile_seconds,
            reconcile_panics,
            plugin_call_seconds,
            plugin_traps,
            plugins_loaded,
            plugin_load_failures,
            policy_decisions,
            policy_eval_seconds,
            managed_resources,
            api_writes,
            requests,
            request_seconds,
            policy_bundle,
            policy_bundle_failures,
            policy_violations,
            loaded_builds: Mutex::new(HashMap::new()),
            seen_phases: Mutex::new(HashMap::new()),
            seen_rules: Mutex::new(HashMap::new()),
        };
        Self { inner: Arc::new(inner) }
    }

    /// Records one answered request (`stateward_requests_total{verb, result}`) and, when it was
    /// sent, its wall time (`stateward_request_duration_seconds`).
    pub fn request(&self, verb: &str, result: &str, seconds: Option<f64>) {
        let labels = VerbResult { verb: verb.to_owned(), result: result.to_owned() };
        self.inner.requests.get_or_create(&labels).inc();
        if let Some(seconds) = seconds {
            self.inner.request_seconds.get_or_create(&labels).observe(seconds);
        }
    }

    /// Records one finished reconcile: `stateward_reconcile_total` and
    /// `stateward_reconcile_duration_seconds`, both labelled `{controller, result}`.
    pub fn reconcile(&self, controller: &str, result: &str, seconds: f64) {
        let labels = ControllerResult { controller: controller.to_owned(), result: result.to_owned() };
        self.inner.reconciles.get_or_create(&labels).inc();
        self.inner.reconcile_seconds.get_or_create(&labels).observe(seconds);
    }

    /// Counts a reconcile that panicked (`stateward_reconcile_panics_total{controller}`).
    pub fn reconcile_panic(&self, controller: &str) {
        self.inner
            .reconcile_panics
            .get_or_create(&ControllerLabel { controller: controller.to_owned() })
            .inc();
    }

    /// Records one call into a plugin export (`stateward_plugin_call_duration_seconds`).
    pub fn plugin_call(&self, plugin: &str, export: &str, seconds: f64) {
        let labels = PluginExport { plugin: plugin.to_owned(), export: export.to_owned() };
        self.inner.plugin_call_seconds.get_or_create(&labels).observe(seconds);
    }

    /// Counts a plugin trap (`stateward_plugin_traps_total{plugin, reason}`), e.g. fuel exhausted.
    pub fn plugin_trap(&self, plugin: &str, reason: &str) {
        let labels = PluginReason { plugin: plugin.to_owned(), reason: reason.to_owned() };
        self.inner.plugin_traps.get_or_create(&labels).inc();
    }

    /// Marks a plugin build as loaded (`stateward_plugins_loaded{plugin, version, digest} 1`).
    /// The series of a previously loaded build of the same plugin is removed, so summing the
    /// family counts plugins, not every build ever seen.
    pub fn plugin_loaded(&self, plugin: &str, version: &str, digest: &str) {
        let build =
            PluginBuild { plugin: plugin.to_owned(), version: version.to_owned(), digest: digest.to_owned() };
        let mut loaded = self.inner.loaded_builds.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(old) = loaded.insert(plugin.to_owned(), build.clone()) {
            if old != build {
                self.inner.plugins_loaded.remove(&old);
            }
        }
        self.inner.plugins_loaded.get_or_create(&build).set(1);
    }

    /// Marks `digest` as the policy bundle in force (`stateward_policy_bundle_info`).
    pub fn policy_bundle_loaded(&self, digest: &str) {
        self.inner.policy_bundle.clear();
        self.inner.policy_bundle.get_or_create(&DigestLabel { digest: digest.to_owned() }).set(1);
    }

    /// Counts a rejected policy bundle (`stateward_policy_bundle_load_failures_total`).
    pub fn policy_bundle_failure(&self, reason: &str) {
        self.inner.policy_bundle_failures.get_or_create(&ReasonLabel { reason: reason.to_owned() }).inc();
    }

    /// Replaces one kind's audit-sweep result: violating resources per rule
    /// (`stateward_policy_violations{kind, rule}`); rules with none drop to 0.
    pub fn policy_violations(&self, kind: &str, counts: &BTreeMap<String, i64>) {
        set_counts(&self.inner.policy_violations, &self.inner.seen_rules, kind, counts, |rule| KindRule {
            kind: kind.to_owned(),
            rule: rule.to_owned(),
        });
    }

    /// Counts a refused or failed plugin load (`stateward_plugin_load_failures_total`).
    pub fn plugin_load_failure(&self, plugin: &str, reason: &str) {
        let labels = PluginReason { plugin: plugin.to_owned(), reason: reason.to_owned() };
        self.inner.plugin_load_failures.get_or_create(&labels).inc();
    }

    /// Records one policy evaluation: `stateward_policy_decisions_total{policy, result}` and
    /// `stateward_policy_eval_duration_seconds{policy}` (the result is not a histogram label so
    /// the bucket series stay few).
    pub fn policy_decision(&self, policy: &str, result: &str, seconds: f64) {
        let labels = PolicyResult { policy: policy.to_owned(), result: result.to_owned() };
        self.inner.policy_decisions.get_or_create(&labels).inc();
        let policy = PolicyLabel { policy: policy.to_owned() };
        self.inner.policy_eval_seconds.get_or_create(&policy).observe(seconds);
    }

    /// Sets `stateward_managed_resources{kind, phase}` from a full count of one kind's resources
    /// by phase; phases with none drop to 0.
    pub fn managed_resources(&self, kind: &str, counts: &BTreeMap<String, i64>) {
        set_counts(&self.inner.managed_resources, &self.inner.seen_phases, kind, counts, |phase| KindPhase {
            kind: kind.to_owned(),
            phase: phase.to_owned(),
        });
    }

    /// Counts one write request to the API server (`stateward_api_writes_total{verb, kind}`);
    /// a converged resource must leave this unchanged when reconciled again.
    pub fn api_write(&self, verb: &str, kind: &str) {
        let labels = VerbKind { verb: verb.to_owned(), kind: kind.to_owned() };
        self.inner.api_writes.get_or_create(&labels).inc();
    }

    /// The whole registry in the OpenMetrics text format (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an error here could only come from a label
        // encoder, and a partial exposition is still more useful than none.
        if let Err(err) = text::encode(&mut out, &self.inner.registry) {
            tracing::warn!(error = %err, "encoding metrics failed");
        }
        out
    }
}

/// Sets one kind's gauges from a full count. Values reported before but absent from `counts`
/// are set to 0, because the caller reports what exists now, not what changed.
fn set_counts<L: Clone + std::hash::Hash + Eq>(
    family: &Family<L, Gauge>,
    seen: &Mutex<HashMap<String, BTreeSet<String>>>,
    kind: &str,
    counts: &BTreeMap<String, i64>,
    labels: impl Fn(&str) -> L,
) {
    let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
    let known = seen.entry(kind.to_owned()).or_default();
    known.extend(counts.keys().cloned());
    for value in known.iter() {
        family.get_or_create(&labels(value)).set(counts.get(value).copied().unwrap_or(0));
    }
}
