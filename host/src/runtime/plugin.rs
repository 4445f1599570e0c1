//! One loaded plugin: its digest, what `info()` declared, and the pre-linked instance every
//! call starts from.

use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::Store;

use super::bindings::v0_2::stateward::plugin::host::Level;
use super::bindings::v0_2::stateward::plugin::types as wit;
use super::bindings::{v0_1, v0_2};
use super::contract::{self, Contract};
use super::host_state::HostState;
use super::plan::{ChildKind, Cleanup, Plan, PlanRules, Response};
use super::sandbox::Sandbox;
use super::{RuntimeError, WIT_PACKAGE};

/// Import prefixes a plugin may have; everything else is refused at load.
const ALLOWED_IMPORTS: &[&str] = &["wasi:io/", "wasi:cli/", "wasi:random/"];

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginInfo {
    pub name: String,
    pub version: String,
    pub kinds: Vec<KindInfo>,
    pub owns: Vec<ChildKind>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KindInfo {
    pub group: String,
    pub kind: String,
    pub plural: String,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub versions: Vec<CrdVersion>,
}

impl KindInfo {
    /// The one version objects are stored (and reconciled) at.
    pub fn storage_version(&self) -> Option<&CrdVersion> {
        self.versions.iter().find(|v| v.storage)
    }
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CrdVersion {
    pub name: String,
    pub served: bool,
    pub storage: bool,
    pub deprecated: bool,
    pub schema: Value,
    pub printer_columns: Value,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FieldError {
    pub path: String,
    pub message: String,
}

/// The pre-linked component, of the contract version it was built against.
enum Pre {
    V0_1(v0_1::PluginPre<HostState>),
    V0_2(v0_2::PluginPre<HostState>),
}

/// One call's instance.
enum Instance {
    V0_1(v0_1::Plugin),
    V0_2(v0_2::Plugin),
}

/// A component that passed every load check and answered `info()`.
pub struct Plugin {
    sandbox: Arc<Sandbox>,
    pre: Pre,
    info: PluginInfo,
    digest: String,
    size: usize,
    imports: Vec<String>,
    exports: Vec<String>,
    from_cache: bool,
    /// Functions this load found compiled already and compiled anew (none of either when the
    /// precompiled cache answered).
    reuse: super::Reuse,
    /// How long making its code took (compiling, or loading it from the precompiled cache).
    compile_time: std::time::Duration,
    /// Consecutive calls that ran out of time or memory; see [`Plugin::on_probation`].
    faults: std::sync::atomic::AtomicU32,
    probation: tokio::sync::Semaphore,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.info.name)
            .field("version", &self.info.version)
            .field("digest", &self.digest)
            .finish()
    }
}

impl Plugin {
    /// Checks what it declares (memories, tables, instances) against the per-call limits,
    /// compiles (or loads from the precompiled cache), checks imports, exports and the WIT
    /// version, links, and asks the plugin who it is.
    pub fn load(sandbox: &Arc<Sandbox>, bytes: &[u8]) -> Result<Self, RuntimeError> {
        super::declared::Declared::of(bytes)?.check(&sandbox.limits)?;
        let digest = hex::encode(Sha256::digest(bytes));
        let functions_before = sandbox.functions.reuse();
        let started = std::time::Instant::now();
        let (component, from_cache) = match &sandbox.cache {
            Some(cache) => cache.load_or_compile(&sandbox.engine, &digest, bytes)?,
            None => (
                Component::new(&sandbox.engine, bytes)
                    .map_err(|e| RuntimeError::NotAComponent(format!("{e:#}")))?,
                false,
            ),
        };
        let compile_time = started.elapsed();
        let reuse = sandbox.functions.reuse().since(functions_before);
        let ty = component.component_type();
        let imports: Vec<String> = ty.imports(&sandbox.engine).map(|(n, _)| n.to_string()).collect();
        let exports: Vec<String> = ty.exports(&sandbox.engine).map(|(n, _)| n.to_string()).collect();
        let contract = check_exports(&exports)?;
        check_imports(&imports, contract)?;
        let instance_pre =
            sandbox.linker.instantiate_pre(&component).map_err(|e| RuntimeError::Link(format!("{e:#}")))?;
        let link = |e: wasmtime::Error| RuntimeError::Link(format!("{e:#}"));
        let pre = match contract {
            Contract::V0_1 => Pre::V0_1(v0_1::PluginPre::new(instance_pre).map_err(link)?),
            Contract::V0_2 => Pre::V0_2(v0_2::PluginPre::new(instance_pre).map_err(link)?),
        };
        let mut plugin = Self {
            sandbox: Arc::clone(sandbox),
            pre,
            info: PluginInfo {
                name: "(loading)".into(),
                version: String::new(),
                kinds: Vec::new(),
                owns: Vec::new(),
            },
            digest,
            size: bytes.len(),
            imports,
            exports,
            from_cache,
            reuse,
            compile_time,
            faults: std::sync::atomic::AtomicU32::new(0),
            probation: tokio::sync::Semaphore::new(1),
        };
        let raw = plugin.call("info", |p, s| match p {
            Instance::V0_1(p) => p.stateward_plugin_service().call_info(s).map(contract::info),
            Instance::V0_2(p) => p.stateward_plugin_service().call_info(s),
        })?;
        plugin.info = convert_info(raw)?;
        Ok(plugin)
    }

    /// Reads a `.wasm` file and loads it.
    pub fn load_file(sandbox: &Arc<Sandbox>, path: &std::path::Path) -> Result<Self, RuntimeError> {
        let bytes = std::fs::read(path)
            .map_err(|source| RuntimeError::Read { path: path.display().to_string(), source })?;
        Self::load(sandbox, &bytes)
    }

    pub fn info(&self) -> &PluginInfo {
        &self.info
    }
    pub fn name(&self) -> &str {
        &self.info.name
    }
    pub fn version(&self) -> &str {
        &self.info.version
    }
    /// Hex SHA-256 of the component bytes.
    pub fn digest(&self) -> &str {
        &self.digest
    }
    /// The digest as every policy input and the status carry it: `sha256:<hex>`.
    pub fn prefixed_digest(&self) -> String {
        format!("sha256:{}", self.digest)
    }
    pub fn size(&self) -> usize {
        self.size
    }
    pub fn imports(&self) -> &[String] {
        &self.imports
    }
    pub fn exports(&self) -> &[String] {
        &self.exports
    }
    /// The version of the WIT contract the component was built against.
    pub fn contract(&self) -> Contract {
        match self.pre {
            Pre::V0_1(_) => Contract::V0_1,
            Pre::V0_2(_) => Contract::V0_2,
        }
    }
    /// How long making its code took: compiling, or loading it from the precompiled cache.
    pub fn compile_time(&self) -> std::time::Duration {
        self.compile_time
    }
    /// The compiler that made its code.
    pub fn compiler(&self) -> super::Compiler {
        self.sandbox.compiler()
    }
    /// Whether this load came from the on-disk precompiled cache.
    pub fn loaded_from_cache(&self) -> bool {
        self.from_cache
    }
    /// How many of its functions this load compiled and how many it found compiled by an
    /// earlier build (exact when no other load ran at the same time, as hot reloads do not).
    pub fn compile_reuse(&self) -> super::Reuse {
        self.reuse
    }

    /// Semantic validation of a new object (and the old one on update).
    pub fn validate(&self, new: &str, old: Option<&str>) -> Result<Vec<FieldError>, RuntimeError> {
        let (new, old) = (new.to_string(), old.map(str::to_string));
        let errors = self.call("validate", |p, s| match p {
            Instance::V0_1(p) => p
                .stateward_plugin_service()
                .call_validate(s, &new, old.as_ref())
                .map(|errors| errors.into_iter().map(contract::field_error).collect()),
            Instance::V0_2(p) => p.stateward_plugin_service().call_validate(s, &new, old.as_ref()),
        })?;
        let size: usize = errors.iter().map(|e| e.path.len() + e.message.len()).sum();
        self.check_output("validate", size)?;
        Ok(errors.into_iter().map(|e| FieldError { path: e.path, message: e.message }).collect())
    }

    /// Asks for the plan that moves the observed state toward the resource's spec, with no
    /// answers to earlier requests (tests, benchmarks, `render` without `--responses`).
    pub fn reconcile(
        &self,
        resource: &str,
        children: &[String],
        now_ms: u64,
        namespace: &str,
    ) -> Result<Plan, RuntimeError> {
        self.reconcile_observed(&Observed { resource, children, now_ms, responses: &[] }, namespace)
    }

    /// Asks for the plan that moves the observed state toward the resource's spec.
    pub fn reconcile_observed(&self, observed: &Observed<'_>, namespace: &str) -> Result<Plan, RuntimeError> {
        let input = observed.to_wit();
        let answer = self.call("reconcile", |p, s| match p {
            Instance::V0_1(p) => p
                .stateward_plugin_service()
                .call_reconcile(s, &contract::observed(&input))
                .map(|r| r.map(contract::plan)),
            Instance::V0_2(p) => p.stateward_plugin_service().call_reconcile(s, &input),
        })?;
        let plan = answer.map_err(|message| self.plugin_error("reconcile", message))?;
        let rules = self.rules(namespace);
        rules.check_requests(&plan.actions)?;
        self.check_output("reconcile", plan_size(&plan.actions) + plan.status.extra.len())?;
        Ok(Plan {
            actions: rules.actions(plan.actions)?,
            status: rules.status(plan.status)?,
            events: rules.events(plan.events)?,
            requeue_after: plan.requeue_after_ms.map(std::time::Duration::from_millis),
        })
    }

    /// Asks what is left to clean up before the finalizer may go, with no answers to requests.
    pub fn finalize(
        &self,
        resource: &str,
        children: &[String],
        now_ms: u64,
        namespace: &str,
    ) -> Result<Cleanup, RuntimeError> {
        self.finalize_observed(&Observed { resource, children, now_ms, responses: &[] }, namespace)
    }

    /// Asks what is left to clean up before the finalizer may go.
    pub fn finalize_observed(
        &self,
        observed: &Observed<'_>,
        namespace: &str,
    ) -> Result<Cleanup, RuntimeError> {
        let input = observed.to_wit();
        let answer = self.call("finalize", |p, s| match p {
            Instance::V0_1(p) => p
                .stateward_plugin_service()
                .call_finalize(s, &contract::observed(&input))
                .map(|r| r.map(contract::cleanup)),
            Instance::V0_2(p) => p.stateward_plugin_service().call_finalize(s, &input),
        })?;
        let cleanup = answer.map_err(|message| self.plugin_error("finalize", message))?;
        self.rules(namespace).check_requests(&cleanup.actions)?;
        self.check_output("finalize", plan_size(&cleanup.actions))?;
        let rules = self.rules(namespace);
        Ok(Cleanup {
            actions: rules.actions(cleanup.actions)?,
            events: rules.events(cleanup.events)?,
            done: cleanup.done,
        })
    }

    /// Converts an object of one of this plugin's kinds to `to_version`.
    pub fn convert(&self, object: &str, to_version: &str) -> Result<Value, RuntimeError> {
        let (object, to_version) = (object.to_string(), to_version.to_string());
        let answer = self.call("convert", |p, s| match p {
            Instance::V0_1(p) => p.stateward_plugin_service().call_convert(s, &object, &to_version),
            Instance::V0_2(p) => p.stateward_plugin_service().call_convert(s, &object, &to_version),
        })?;
        let json = answer.map_err(|message| self.plugin_error("convert", message))?;
        self.check_output("convert", json.len())?;
        serde_json::from_str(&json).map_err(|e| RuntimeError::MalformedPlan {
            plugin: self.info.name.clone(),
            reason: format!("convert returned invalid JSON: {e}"),
        })
    }

    fn rules<'a>(&'a self, namespace: &'a str) -> PlanRules<'a> {
        PlanRules {
            plugin: &self.info.name,
            owns: &self.info.owns,
            namespace,
            limits: &self.sandbox.limits.requests,
        }
    }

    fn plugin_error(&self, export: &'static str, message: String) -> RuntimeError {
        RuntimeError::Plugin { plugin: self.info.name.clone(), export, message }
    }

    fn check_output(&self, export: &'static str, size: usize) -> Result<(), RuntimeError> {
        let limit = self.sandbox.limits.output_bytes;
        if size > limit {
            return Err(RuntimeError::OutputTooLarge { plugin: self.info.name.clone(), export, size, limit });
        }
        Ok(())
    }

    /// Runs one export in a fresh store and turns any failure into a typed error.
    fn call<R>(
        &self,
        export: &'static str,
        f: impl FnOnce(&Instance, &mut Store<HostState>) -> wasmtime::Result<R>,
    ) -> Result<R, RuntimeError> {
        let mut store = self.sandbox.store();
        let instance = match &self.pre {
            Pre::V0_1(pre) => pre.instantiate(&mut store).map(Instance::V0_1),
            Pre::V0_2(pre) => pre.instantiate(&mut store).map(Instance::V0_2),
        };
        let result = instance.and_then(|instance| f(&instance, &mut store));
        let output = store.data_mut().take_output();
        self.forward_logs(export, &output);
        let result = result.map_err(|err| self.classify(export, err, &store, &output));
        use std::sync::atomic::Ordering::Relaxed;
        match &result {
            Ok(_) => self.faults.store(0, Relaxed),
            Err(RuntimeError::Timeout { .. } | RuntimeError::OutOfMemory { .. }) => {
                self.faults.fetch_add(1, Relaxed);
            }
            Err(_) => {}
        }
        result
    }

    /// True after a call ran out of time or memory, until one succeeds. A plugin on probation
    /// gets one call at a time (take [`Plugin::probation_permit`] first), so a build that
    /// loops burns at most one core's worth of budget while other kinds reconcile at speed.
    pub fn on_probation(&self) -> bool {
        self.faults.load(std::sync::atomic::Ordering::Relaxed) > 0
    }

    /// The single permit of a plugin on probation.
    pub async fn probation_permit(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        self.probation.acquire().await.ok()
    }

    fn forward_logs(&self, export: &'static str, lines: &[(Level, String)]) {
        let plugin = self.info.name.as_str();
        for (level, line) in lines {
            match level {
                Level::Trace => tracing::trace!(plugin, export, "{line}"),
                Level::Debug => tracing::debug!(plugin, export, "{line}"),
                Level::Info => tracing::info!(plugin, export, "{line}"),
                Level::Warn => tracing::warn!(plugin, export, "{line}"),
                Level::Error => tracing::error!(plugin, export, "{line}"),
            }
        }
    }

    fn classify(
        &self,
        export: &'static str,
        err: wasmtime::Error,
        store: &Store<HostState>,
        output: &[(Level, String)],
    ) -> RuntimeError {
        let plugin = self.info.name.clone();
        if let Some(requested) = store.data().limiter.refused {
            return RuntimeError::OutOfMemory {
                plugin,
                export,
                requested,
                limit: self.sandbox.limits.memory_bytes,
            };
        }
        if matches!(err.downcast_ref::<wasmtime::Trap>(), Some(wasmtime::Trap::Interrupt)) {
            return RuntimeError::Timeout { plugin, export, budget: self.sandbox.limits.budget };
        }
        let mut message = match err.downcast_ref::<wasmtime::Trap>() {
            Some(trap) => trap.to_string(),
            None => format!("{err:#}"),
        };
        // A guest panic prints its message on stderr just before the trap: keep it.
        let printed = output.iter().rev().find(|(l, line)| *l == Level::Warn && !line.starts_with("note:"));
        if let Some((_, last)) = printed {
            message = format!("{message} ({last})");
        }
        RuntimeError::Trap { plugin, export, message }
    }
}

fn plan_size(actions: &[wit::Action]) -> usize {
    actions
        .iter()
        .map(|a| match a {
            wit::Action::Apply(json) => json.len(),
            wit::Action::Delete(r) => r.api_version.len() + r.kind.len() + r.name.len(),
            wit::Action::EnsureSecret(s) => {
                s.name.len()
                    + s.keys.iter().map(|(k, _)| k.len() + 4).sum::<usize>()
                    + s.derived.iter().map(|d| d.key.len() + d.template.len()).sum::<usize>()
            }
            wit::Action::LabelPod(p) => {
                let pairs = p.labels.iter().chain(&p.annotations);
                p.pod.len() + pairs.map(|(k, v)| k.len() + v.as_ref().map_or(0, String::len)).sum::<usize>()
            }
            wit::Action::Exec(e) => {
                e.id.len()
                    + e.pod.len()
                    + e.container.len()
                    + e.command.iter().map(String::len).sum::<usize>()
                    + e.stdin.as_ref().map_or(0, String::len)
            }
            wit::Action::Http(h) => {
                h.id.len()
                    + h.path.len()
                    + h.method.len()
                    + h.headers.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
                    + h.body.as_ref().map_or(0, String::len)
            }
        })
        .sum()
}

/// What the host saw, as one call hands it to `reconcile` or `finalize`.
pub struct Observed<'a> {
    pub resource: &'a str,
    pub children: &'a [String],
    pub now_ms: u64,
    /// Answers to earlier requests (a 0.1.0 component never gets them: it never asked).
    pub responses: &'a [Response],
}

impl Observed<'_> {
    fn to_wit(&self) -> wit::Observed {
        wit::Observed {
            resource: self.resource.to_string(),
            children: self.children.to_vec(),
            now_ms: self.now_ms,
            responses: self.responses.iter().map(Response::to_wit).collect(),
        }
    }
}

/// Its own package's imports must be of the version its exports are.
fn check_imports(imports: &[String], contract: Contract) -> Result<(), RuntimeError> {
    let own_package = format!("{WIT_PACKAGE}/");
    let mut forbidden = Vec::new();
    for import in imports {
        if let Some(interface) = import.strip_prefix(&own_package) {
            if interface.rsplit_once('@').map(|(_, v)| v) != Some(contract.version()) {
                return Err(RuntimeError::WitVersion { found: import.clone() });
            }
            continue;
        }
        if !ALLOWED_IMPORTS.iter().any(|p| import.starts_with(p)) {
            forbidden.push(import.clone());
        }
    }
    if forbidden.is_empty() {
        Ok(())
    } else {
        Err(RuntimeError::ForbiddenImport { imports: forbidden })
    }
}

/// The contract a component speaks is the version of the `service` it exports.
fn check_exports(exports: &[String]) -> Result<Contract, RuntimeError> {
    let service = format!("{WIT_PACKAGE}/service@");
    let found = exports.iter().find(|e| e.starts_with(&service)).ok_or(RuntimeError::MissingExport)?;
    found
        .strip_prefix(&service)
        .and_then(Contract::parse)
        .ok_or_else(|| RuntimeError::WitVersion { found: found.clone() })
}

fn convert_info(raw: wit::PluginInfo) -> Result<PluginInfo, RuntimeError> {
    let bad = |reason: String| RuntimeError::MalformedPlan { plugin: raw.name.clone(), reason };
    let mut kinds = Vec::new();
    for k in &raw.kinds {
        let mut versions = Vec::new();
        for v in &k.versions {
            let parse = |what: &str, json: &str| {
                serde_json::from_str::<Value>(json)
                    .map_err(|e| bad(format!("info(): {} {} {what} is not JSON: {e}", k.kind, v.name)))
            };
            versions.push(CrdVersion {
                name: v.name.clone(),
                served: v.served,
                storage: v.storage,
                deprecated: v.deprecated,
                schema: parse("schema", &v.schema)?,
                printer_columns: parse("printer-columns", &v.printer_columns)?,
            });
        }
        if versions.iter().filter(|v| v.storage).count() != 1 {
            return Err(bad(format!("info(): kind {} must have exactly one storage version", k.kind)));
        }
        kinds.push(KindInfo {
            group: k.group.clone(),
            kind: k.kind.clone(),
            plural: k.plural.clone(),
            short_names: k.short_names.clone(),
            categories: k.categories.clone(),
            versions,
        });
    }
    if raw.name.is_empty() || kinds.is_empty() {
        return Err(bad("info() must name the plugin and at least one kind".into()));
    }
    Ok(PluginInfo {
        owns: raw
            .owns
            .iter()
            .map(|c| ChildKind { api_version: c.api_version.clone(), kind: c.kind.clone() })
            .collect(),
        name: raw.name,
        version: raw.version,
        kinds,
    })
}
