//! The compiled policy engine, built once per bundle digest. Decisions run on regorus' RVM: each
//! decision point's `deny`/`warn` rules are compiled to one bytecode program at load time and
//! every decision executes it in a VM kept per thread (no lock, no re-parse). A warmed interpreter
//! `regorus::Engine` (cloned per call; a clone shares the parsed modules and data) serves tests,
//! ad-hoc queries, and any decision point the RVM compiler cannot handle.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use regorus::languages::rego::compiler::Compiler;
use regorus::rvm::program::Program;
use regorus::rvm::vm::RegoVM;
use regorus::utils::limits::ExecutionTimerConfig;

use super::bundle::Bundle;
use super::error::PolicyError;

/// The three decision points (docs/architecture.md), each a Rego package with `deny` and
/// optional `warn` sets of messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DecisionPoint {
    /// `data.stateward.admission`: who may change what.
    Admission,
    /// `data.stateward.guardrails`: what a plugin's plan may contain.
    Guardrails,
    /// `data.stateward.plugins`: which plugin builds may load.
    Plugins,
}

impl DecisionPoint {
    /// All decision points.
    pub const ALL: [Self; 3] = [Self::Admission, Self::Guardrails, Self::Plugins];

    /// Short name, used in audit labels and enforcement data.
    pub fn name(self) -> &'static str {
        match self {
            Self::Admission => "admission",
            Self::Guardrails => "guardrails",
            Self::Plugins => "plugins",
        }
    }

    /// The package path, e.g. `data.stateward.guardrails`.
    pub fn package(self) -> String {
        format!("data.stateward.{}", self.name())
    }

    /// The decision-log `path`, OPA style: `stateward/guardrails`.
    pub fn log_path(self) -> String {
        format!("stateward/{}", self.name())
    }
}

/// What happens when a rule's deny message fires, chosen per rule in policy data at
/// `data.stateward.config.enforcement.<point>.<rule-id>` (like Gatekeeper's enforcementAction).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Block the change (the default for every rule, and for messages without a rule id).
    #[default]
    Deny,
    /// Apply, but surface a warning.
    Warn,
    /// Apply, and only record in the audit log what would have been denied.
    Dryrun,
}

impl Mode {
    /// The stricter of two modes: deny over warn over dryrun.
    pub fn stricter(self, other: Self) -> Self {
        let rank = |m: Self| match m {
            Self::Deny => 2,
            Self::Warn => 1,
            Self::Dryrun => 0,
        };
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "deny" => Some(Self::Deny),
            "warn" => Some(Self::Warn),
            "dryrun" => Some(Self::Dryrun),
            _ => None,
        }
    }
}

/// The rule id of a message: the text before the first `": "` when it is a non-empty run of
/// `[a-z0-9-]`, e.g. `privileged` in `"privileged: container db runs privileged"`.
pub fn rule_id(message: &str) -> Option<&str> {
    let (id, _) = message.split_once(": ")?;
    let ok = !id.is_empty() && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    ok.then_some(id)
}

/// The raw outcome of evaluating one decision point: what the policy said, before enforcement
/// modes are applied. A failed evaluation has `error` set and is treated as a deny.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Evaluation {
    /// The `deny` set, sorted.
    pub deny: Vec<String>,
    /// The `warn` set, sorted (empty when the package has no `warn` rule).
    pub warn: Vec<String>,
    /// Why evaluation failed (missing rule, evaluation error, wrong result type).
    pub error: Option<String>,
    /// Wall time of the Rego evaluation, for `metrics.timer_rego_eval_ns`.
    pub eval_ns: u64,
}

/// One `test_*` rule's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestOutcome {
    /// Full rule path, e.g. `data.stateward.guardrails_test.test_privileged_denied`.
    pub name: String,
    /// True when the rule evaluated to `true`.
    pub passed: bool,
    /// The evaluation error, if any.
    pub error: Option<String>,
}

/// Upper bound on RVM instructions per decision: a runaway policy fails closed instead of
/// stalling a reconcile (regorus' default of 25 000 is too low for large pod templates).
const MAX_INSTRUCTIONS: usize = 5_000_000;

/// Wall-clock bound of every evaluation: each decision (RVM or interpreter), the first
/// evaluation of a new bundle, each of its tests, each query. A decision of the shipped policy
/// takes well under a millisecond; a bundle that runs past this fails closed (a decision is
/// denied, a new bundle refused).
///
/// Why in-process and not a child process: regorus checks this timer cooperatively in the
/// interpreter's and the RVM's loops, so every path is bounded in time without a process
/// per decision (a decision is ~100 µs, a spawn is ~1 ms). What the timer cannot stop is one
/// builtin call that allocates by its argument, not by data already in memory
/// (`numbers.range(0, 1e12)` reserves 24 TB at once and aborts the process): those builtins
/// are refused at compile time ([`UNBOUNDED_BUILTINS`]). Growth by composition (say, string
/// doubling over a few dozen statements) is bounded by neither; bounding it needs allocation
/// accounting (regorus' `allocator-memory-limits`, which brings its own allocator) or an
/// evaluation process with an address-space rlimit.
pub const EVAL_TIME_LIMIT: Duration = Duration::from_secs(1);

/// Loop iterations between two reads of the clock.
const TIMER_CHECK_INTERVAL: u32 = 64;

/// Builtins whose result is sized by an argument's value, computed in one uninterruptible step:
/// a bundle that calls one is refused. None of the shipped policies needs them.
pub const UNBOUNDED_BUILTINS: [&str; 3] = ["numbers.range", "numbers.range_step", "bits.lsh"];

/// The widest field (width or precision) a `sprintf` format may ask for: regorus pads in one
/// allocation, so `sprintf("%4000000000d", [1])` asks for 4 GB at once. Every `sprintf` of a
/// bundle must have a literal format whose fields are at most this wide (no `*` width taken
/// from the arguments); the shipped policies use none.
pub const MAX_SPRINTF_FIELD: u32 = 999;

fn timer() -> ExecutionTimerConfig {
    ExecutionTimerConfig {
        limit: EVAL_TIME_LIMIT,
        check_interval: NonZeroU32::new(TIMER_CHECK_INTERVAL).unwrap_or(NonZeroU32::MIN),
    }
}

/// True when a regorus error is one of its execution limits (time, RVM instructions).
fn is_limit_error(message: &str) -> bool {
    message.contains("exceeded time limit") || message.contains("instruction limit")
}

/// How often a check of the bundle (its first evaluation, a test) is run when it hits the
/// time limit without having had the CPU for it.
const STARVED_ATTEMPTS: u32 = 3;

/// CPU time this thread has had, from the kernel's scheduler statistics (Linux).
fn thread_cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    Some(Duration::from_nanos(stat.split_whitespace().next()?.parse().ok()?))
}

/// True when an evaluation that hit the wall-clock limit ran on the CPU for less than half of
/// it: the machine was busy (a loaded CI runner, a node under pressure), not the policy slow.
/// Unknown CPU time counts as starved, so the check is tried again rather than refused.
fn starved(cpu: Option<Duration>) -> bool {
    cpu.is_none_or(|used| used < EVAL_TIME_LIMIT / 2)
}

/// Runs one check of a bundle under the time limit, again (up to [`STARVED_ATTEMPTS`] in all)
/// while it hits the limit starved of CPU: the limit is wall clock (regorus' timer), and a
/// bundle, the shipped one too, must not be refused because the machine was busy. A check that
/// spends the CPU it is given (a runaway rule) is refused at its first limit.
fn bounded<T>(mut check: impl FnMut() -> Result<T, String>) -> Result<T, String> {
    let mut attempt = 1;
    loop {
        let before = thread_cpu_time();
        let result = check();
        let used = before.zip(thread_cpu_time()).map(|(a, b)| b.saturating_sub(a));
        match result {
            Err(e) if is_limit_error(&e) && starved(used) && attempt < STARVED_ATTEMPTS => attempt += 1,
            other => return other,
        }
    }
}

/// The host-generated rule each decision point's RVM program runs (see `compile_rvm`).
const DECISION_RULE: &str = "stateward_host_decision";

/// Engine ids, so a thread's cached VM is never used with another engine's program or data.
static NEXT_ENGINE_ID: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The VM of the last RVM decision on this thread, keyed by engine id and decision point.
    /// It holds a reference to that engine's program and data until the thread's next decision
    /// on another engine or point replaces it.
    static RVM: RefCell<Option<((u64, DecisionPoint), RegoVM)>> = const { RefCell::new(None) };
}

/// A compiled, immutable bundle. Share it as `Arc<PolicyEngine>`; `evaluate` takes `&self`.
#[derive(Debug)]
pub struct PolicyEngine {
    id: u64,
    engine: regorus::Engine,
    data: regorus::Value,
    programs: BTreeMap<DecisionPoint, Arc<Program>>,
    rvm_fallbacks: BTreeMap<DecisionPoint, String>,
    digest: String,
    enforcement: BTreeMap<DecisionPoint, BTreeMap<String, Mode>>,
    has_warn: BTreeSet<DecisionPoint>,
    points: BTreeSet<DecisionPoint>,
    tests: Vec<String>,
    /// `"deny"` and `"warn"`, the fields of the RVM's decision object, built once.
    result_keys: [regorus::Value; 2],
}

impl PolicyEngine {
    /// Parses and compiles `bundle`. Fails on a syntax error, bad data, an invalid enforcement
    /// mode, or a decision point whose `deny` rule errors on an empty input.
    pub fn compile(bundle: &Bundle) -> Result<Self, PolicyError> {
        let mut engine = regorus::Engine::new();
        // Every clone (per decision, test, query) inherits the timer; each evaluation restarts it.
        engine.set_execution_timer_config(timer());
        let mut packages: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut tests = Vec::new();
        for m in bundle.modules() {
            if let Some(why) = unbounded_sprintf(&m.contents) {
                return Err(PolicyError::Bound(format!("{}: {why}", m.name)));
            }
            if let Some(builtin) = unbounded_builtin(&m.contents) {
                return Err(PolicyError::Bound(format!(
                    "{}: calls {builtin}, whose result is sized by its argument (refused: {})",
                    m.name,
                    UNBOUNDED_BUILTINS.join(", ")
                )));
            }
            let package = engine
                .add_policy(m.name.clone(), m.contents.clone())
                .map_err(|e| PolicyError::ParsePolicy { file: m.name.clone(), message: e.to_string() })?;
            for rule in test_rule_names(&m.contents) {
                tests.push(format!("{package}.{rule}"));
            }
            packages.entry(package).or_default().push(m.name.clone());
        }
        tests.sort();
        tests.dedup();
        for (file, doc) in bundle.data_documents()? {
            engine
                .add_data(
                    to_rego(&doc)
                        .map_err(|e| PolicyError::LoadData { file: file.clone(), message: e.to_string() })?,
                )
                .map_err(|e| PolicyError::LoadData { file, message: e.to_string() })?;
        }

        let mut points = BTreeSet::new();
        let mut has_warn = BTreeSet::new();
        for point in DecisionPoint::ALL {
            let Some(files) = packages.get(&point.package()) else {
                continue;
            };
            points.insert(point);
            for f in files {
                if engine.has_declared_rule_rooted_at(f, "warn").unwrap_or(false) {
                    has_warn.insert(point);
                }
            }
        }
        let enforcement = read_enforcement(&engine)?;

        let data = engine.get_data();
        let mut this = Self {
            id: NEXT_ENGINE_ID.fetch_add(1, Ordering::Relaxed),
            engine,
            data,
            programs: BTreeMap::new(),
            rvm_fallbacks: BTreeMap::new(),
            digest: bundle.digest().to_string(),
            enforcement,
            has_warn,
            points,
            tests,
            result_keys: [regorus::Value::from("deny"), regorus::Value::from("warn")],
        };
        // Warm up: the first evaluation prepares (analyses and schedules) the modules; the
        // prepared state is what every per-decision clone starts from. It also surfaces
        // errors the parser cannot see.
        this.engine.set_input(regorus::Value::new_object());
        for point in this.points.clone() {
            let path = format!("{}.deny", point.package());
            bounded(|| this.engine.eval_rule(path.clone()).map_err(|e| e.to_string())).map_err(|e| {
                let message = format!("{path}: {e}");
                if is_limit_error(&message) {
                    PolicyError::Bound(message)
                } else {
                    PolicyError::CompileBundle(message)
                }
            })?;
        }
        for point in this.points.clone() {
            match this.compile_rvm(point) {
                Ok(program) => {
                    this.programs.insert(point, program);
                }
                Err(why) => {
                    this.rvm_fallbacks.insert(point, why);
                }
            }
        }
        Ok(this)
    }

    /// Compiles the `deny` (and `warn`) rules of `point` to one RVM program with a single
    /// entry point, a host-generated rule `{"deny": deny, "warn": warn}` added to the package
    /// in a private copy of the engine: one execution then computes the helper rules both sets
    /// share (the pod spec, the container list) once instead of once per set.
    fn compile_rvm(&self, point: DecisionPoint) -> Result<Arc<Program>, String> {
        let fields = if self.has_warn.contains(&point) {
            r#"{"deny": deny, "warn": warn}"#
        } else {
            r#"{"deny": deny}"#
        };
        let mut engine = self.engine.clone();
        engine
            .add_policy(
                format!("stateward-host/{}.rego", point.name()),
                format!("package stateward.{}\n\n{DECISION_RULE} := {fields}\n", point.name()),
            )
            .map_err(|e| e.to_string())?;
        let entry = format!("{}.{DECISION_RULE}", point.package());
        let compiled = engine.compile_with_entrypoint(&entry.as_str().into()).map_err(|e| e.to_string())?;
        Compiler::compile_from_policy(&compiled, &[entry.as_str()]).map_err(|e| e.to_string())
    }

    /// Decision points evaluated by the interpreter because the RVM compiler refused them, with
    /// its reason (empty for the shipped policies; surfaced for diagnostics).
    pub fn rvm_fallbacks(&self) -> &BTreeMap<DecisionPoint, String> {
        &self.rvm_fallbacks
    }

    /// Compiles `bundle` and runs its `test_*` rules; rejects the bundle whole if any fails.
    /// Use this for bundles that replace a running one (hot reload).
    /// A test that runs past [`EVAL_TIME_LIMIT`] refuses the bundle as out of bounds.
    pub fn compile_tested(bundle: &Bundle) -> Result<Self, PolicyError> {
        let this = Self::compile(bundle)?;
        let failed: Vec<TestOutcome> = this.run_tests().into_iter().filter(|t| !t.passed).collect();
        if let Some(t) = failed.iter().find(|t| t.error.as_deref().is_some_and(is_limit_error)) {
            return Err(PolicyError::Bound(format!(
                "{}: {}",
                t.name,
                t.error.as_deref().unwrap_or_default()
            )));
        }
        if failed.is_empty() {
            Ok(this)
        } else {
            Err(PolicyError::TestBundle(failed.into_iter().map(|t| t.name).collect::<Vec<_>>().join(", ")))
        }
    }

    /// The bundle digest this engine was compiled from.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The decision points the bundle defines.
    pub fn points(&self) -> impl Iterator<Item = DecisionPoint> + '_ {
        self.points.iter().copied()
    }

    /// The enforcement mode of `rule` at `point` (default [`Mode::Deny`]).
    pub fn mode(&self, point: DecisionPoint, rule: Option<&str>) -> Mode {
        self.explicit_mode(point, rule).unwrap_or_default()
    }

    /// The enforcement mode the bundle's data sets for `rule` at `point`, if it sets one.
    pub fn explicit_mode(&self, point: DecisionPoint, rule: Option<&str>) -> Option<Mode> {
        rule.and_then(|r| self.enforcement.get(&point)?.get(r).copied())
    }

    /// True when the bundle defines `point`'s package.
    pub fn defines(&self, point: DecisionPoint) -> bool {
        self.points.contains(&point)
    }

    /// Evaluates `deny` (and `warn`) of `point` for `input`. Never fails: a missing package or
    /// rule, an evaluation error or a result that is not a set of strings comes back in
    /// `error`, which callers treat as a deny.
    pub fn evaluate(&self, point: DecisionPoint, input: &serde_json::Value) -> Evaluation {
        let start = Instant::now();
        let mut out = Evaluation::default();
        if !self.points.contains(&point) {
            out.error = Some(format!("bundle has no package {}", point.package()));
            return out;
        }
        let input = super::input::to_rego_input(input);
        // Rule paths are only formatted when needed (interpreter, errors): a decision is short
        // enough for a few string allocations to show.
        let deny_path = || format!("{}.deny", point.package());
        let warn_path = || format!("{}.warn", point.package());
        let with_warn = self.has_warn.contains(&point);
        let results = match self.programs.get(&point) {
            Some(program) => self.run_rvm(point, program, input),
            None => {
                let warn = with_warn.then(warn_path);
                self.run_interpreter(input, &deny_path(), warn.as_deref())
            }
        };
        match results {
            Err(e) => out.error = Some(e),
            Ok((deny, warn)) => {
                match messages(&deny) {
                    Some(m) => out.deny = m,
                    None => out.error = Some(format!("{} is not a set of strings: {deny}", deny_path())),
                }
                match warn {
                    None | Some(regorus::Value::Undefined) => {}
                    Some(w) => match messages(&w) {
                        Some(m) => out.warn = m,
                        None if out.error.is_none() => {
                            out.error = Some(format!("{} is not a set of strings: {w}", warn_path()));
                        }
                        None => {}
                    },
                }
            }
        }
        out.eval_ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        out
    }

    fn run_rvm(
        &self,
        point: DecisionPoint,
        program: &Arc<Program>,
        input: regorus::Value,
    ) -> Result<(regorus::Value, Option<regorus::Value>), String> {
        let decision = RVM.with(|cell| {
            // Re-entrant use (none today) gets a fresh VM instead of a borrow panic.
            let Ok(mut cached) = cell.try_borrow_mut() else {
                return self.execute(&mut self.new_vm(program)?, point, input);
            };
            let key = (self.id, point);
            let vm = match &mut *cached {
                Some((k, vm)) if *k == key => vm,
                slot => &mut slot.insert((key, self.new_vm(program)?)).1,
            };
            let result = self.execute(vm, point, input);
            // Release this decision's input now rather than when the thread's next decision
            // replaces it; after a failed execution, start the next one from a new VM.
            vm.set_input(regorus::Value::Undefined);
            if result.is_err() {
                *cached = None;
            }
            result
        })?;
        let [deny_key, warn_key] = &self.result_keys;
        let warn = self.has_warn.contains(&point).then(|| decision[warn_key].clone());
        Ok((decision[deny_key].clone(), warn))
    }

    /// A VM with `program` and the bundle's data loaded. Loading costs about as much as a tenth
    /// of a decision (`set_data` checks the data against every rule path), so each thread keeps
    /// one per engine and decision point (`RVM`); every execution starts from a clean state
    /// (regorus resets the rule cache, registers and stacks at each entry point call).
    fn new_vm(&self, program: &Arc<Program>) -> Result<RegoVM, String> {
        let mut vm = RegoVM::new();
        vm.set_max_instructions(MAX_INSTRUCTIONS);
        vm.set_execution_timer_config(Some(timer()));
        vm.load_program(program.clone());
        vm.set_data(self.data.clone()).map_err(|e| format!("loading data: {e}"))?;
        Ok(vm)
    }

    fn execute(
        &self,
        vm: &mut RegoVM,
        point: DecisionPoint,
        input: regorus::Value,
    ) -> Result<regorus::Value, String> {
        vm.set_input(input);
        vm.execute_entry_point_by_index(0).map_err(|e| format!("{}.deny: {e}", point.package()))
    }

    fn run_interpreter(
        &self,
        input: regorus::Value,
        deny: &str,
        warn: Option<&str>,
    ) -> Result<(regorus::Value, Option<regorus::Value>), String> {
        let mut engine = self.engine.clone();
        engine.set_input(input);
        let d = engine.eval_rule(deny.to_string()).map_err(|e| format!("{deny}: {e}"))?;
        let w = match warn {
            Some(w) => Some(engine.eval_rule(w.to_string()).map_err(|e| format!("{w}: {e}"))?),
            None => None,
        };
        Ok((d, w))
    }

    /// Evaluates an arbitrary query (a rule, a package, or `data`) for `input`, as
    /// `opa eval -d DIR -i FILE QUERY` does. An undefined result is JSON `null`.
    pub fn query(&self, path: &str, input: &serde_json::Value) -> Result<serde_json::Value, PolicyError> {
        let err = |message: String| PolicyError::Evaluate { path: path.to_string(), message };
        let mut engine = self.engine.clone();
        engine.set_input(to_rego(input).map_err(|e| err(format!("converting input: {e}")))?);
        let results = engine.eval_query(path.to_string(), false).map_err(|e| err(e.to_string()))?;
        let Some(value) = results.result.first().and_then(|r| r.expressions.first()).map(|e| e.value.clone())
        else {
            return Ok(serde_json::Value::Null);
        };
        let json = value.to_json_str().map_err(|e| err(e.to_string()))?;
        serde_json::from_str(&json).map_err(|e| err(e.to_string()))
    }

    /// Runs every `test_*` rule of the bundle (all modules, as `opa test` does).
    pub fn run_tests(&self) -> Vec<TestOutcome> {
        self.tests
            .iter()
            .map(|name| {
                let run = || {
                    let mut engine = self.engine.clone();
                    engine.set_input(regorus::Value::Undefined);
                    engine.eval_rule(name.clone()).map_err(|e| e.to_string())
                };
                match bounded(run) {
                    Ok(v) => TestOutcome {
                        name: name.clone(),
                        passed: v == regorus::Value::Bool(true),
                        error: None,
                    },
                    Err(e) => TestOutcome { name: name.clone(), passed: false, error: Some(e) },
                }
            })
            .collect()
    }
}

fn to_rego(v: &serde_json::Value) -> Result<regorus::Value, serde_json::Error> {
    <regorus::Value as serde::Deserialize>::deserialize(v)
}

/// A set (or array) of strings as sorted strings; anything else is `None`.
fn messages(v: &regorus::Value) -> Option<Vec<String>> {
    let items: Vec<&regorus::Value> = match v {
        regorus::Value::Set(s) => s.iter().collect(),
        regorus::Value::Array(a) => a.iter().collect(),
        _ => return None,
    };
    let mut out =
        items.into_iter().map(|i| i.as_string().ok().map(|s| s.to_string())).collect::<Option<Vec<_>>>()?;
    out.sort();
    out.dedup();
    Some(out)
}

/// The first of [`UNBOUNDED_BUILTINS`] that `source` names outside comments and strings.
/// A mention (a `with … as` mock too) is refused like a call: failing closed costs nothing.
fn unbounded_builtin(source: &str) -> Option<&'static str> {
    let code = code_only(source);
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.';
    UNBOUNDED_BUILTINS.into_iter().find(|name| {
        code.match_indices(name).any(|(at, _)| {
            let before = code[..at].chars().next_back();
            let after = code[at + name.len()..].chars().next();
            !before.is_some_and(ident) && !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        })
    })
}

/// Why a `sprintf` call of `source` could allocate by its format (see [`MAX_SPRINTF_FIELD`]):
/// its format is not a string literal, takes a width from its arguments, or asks for a field
/// wider than the bound. None when every call is bounded.
fn unbounded_sprintf(source: &str) -> Option<String> {
    let chars: Vec<char> = source.chars().collect();
    let mut i = 0;
    // Skips a string literal starting at `i` (its quote); returns its contents (escapes kept).
    let literal = |i: &mut usize| -> String {
        let quote = chars[*i];
        let mut text = String::new();
        *i += 1;
        while *i < chars.len() && chars[*i] != quote {
            if quote == '"' && chars[*i] == '\\' {
                text.push(chars[*i]);
                *i += 1;
            }
            if let Some(c) = chars.get(*i) {
                text.push(*c);
            }
            *i += 1;
        }
        *i += 1;
        text
    };
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.';
    while i < chars.len() {
        match chars[i] {
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '"' | '`' => {
                literal(&mut i);
            }
            _ if chars[i..].starts_with(&['s', 'p', 'r', 'i', 'n', 't', 'f'])
                && !(i > 0 && ident(chars[i - 1])) =>
            {
                i += "sprintf".len();
                if chars.get(i).is_some_and(|c| ident(*c)) {
                    continue;
                }
                while chars.get(i).is_some_and(|c| c.is_whitespace()) {
                    i += 1;
                }
                if chars.get(i) != Some(&'(') {
                    continue; // a mention (`with sprintf as …`), not a call
                }
                i += 1;
                while chars.get(i).is_some_and(|c| c.is_whitespace()) {
                    i += 1;
                }
                if !matches!(chars.get(i), Some('"' | '`')) {
                    return Some(
                        "a sprintf format must be a string literal (its field widths are checked at load)"
                            .into(),
                    );
                }
                let format = literal(&mut i);
                if let Some(why) = wide_field(&format) {
                    return Some(format!("sprintf format {format:?}: {why}"));
                }
            }
            _ => i += 1,
        }
    }
    None
}

/// What in a `sprintf` format asks for an unbounded field: a `*` width or precision, or one
/// wider than [`MAX_SPRINTF_FIELD`].
fn wide_field(format: &str) -> Option<String> {
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            continue;
        }
        if chars.peek() == Some(&'%') {
            chars.next();
            continue;
        }
        while chars.peek().is_some_and(|c| "+-# 0".contains(*c)) {
            chars.next();
        }
        for part in ["width", "precision"] {
            if part == "precision" {
                if chars.peek() != Some(&'.') {
                    break;
                }
                chars.next();
            }
            if chars.peek() == Some(&'*') {
                return Some(format!("a {part} taken from the arguments (*) is refused"));
            }
            let mut digits = String::new();
            while let Some(d) = chars.peek().filter(|c| c.is_ascii_digit()) {
                digits.push(*d);
                chars.next();
            }
            if digits.parse::<u64>().map_or(!digits.is_empty(), |n| n > u64::from(MAX_SPRINTF_FIELD)) {
                return Some(format!("a {part} of {digits} is over {MAX_SPRINTF_FIELD}"));
            }
        }
    }
    None
}

/// `source` with comments and the contents of string literals blanked out.
fn code_only(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut chars = source.chars();
    while let Some(c) = chars.next() {
        match c {
            '#' => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '"' => {
                out.push(' ');
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            '`' => {
                out.push(' ');
                for c in chars.by_ref() {
                    if c == '`' {
                        break;
                    }
                }
            }
            c => out.push(c),
        }
    }
    out
}

/// Names of top-level `test_*` rules: a rule head starts in column 0 of a module.
fn test_rule_names(source: &str) -> Vec<String> {
    source
        .lines()
        .filter(|l| l.starts_with("test_"))
        .map(|l| l.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>())
        .collect()
}

fn read_enforcement(
    engine: &regorus::Engine,
) -> Result<BTreeMap<DecisionPoint, BTreeMap<String, Mode>>, PolicyError> {
    let bad = |m: String| PolicyError::CompileBundle(format!("enforcement data: {m}"));
    let data = engine.get_data().to_json_str().map_err(|e| bad(e.to_string()))?;
    let data: serde_json::Value = serde_json::from_str(&data).map_err(|e| bad(e.to_string()))?;
    let mut out = BTreeMap::new();
    let Some(table) = data.pointer("/stateward/config/enforcement") else {
        return Ok(out);
    };
    let table = table.as_object().ok_or_else(|| bad("not an object".into()))?;
    for (point_name, rules) in table {
        let point = DecisionPoint::ALL
            .into_iter()
            .find(|p| p.name() == point_name)
            .ok_or_else(|| bad(format!("unknown decision point {point_name}")))?;
        let rules = rules.as_object().ok_or_else(|| bad(format!("{point_name}: not an object")))?;
        let mut modes = BTreeMap::new();
        for (rule, mode) in rules {
            let mode = mode
                .as_str()
                .and_then(Mode::parse)
                .ok_or_else(|| bad(format!("{point_name}.{rule}: mode must be deny, warn or dryrun")))?;
            modes.insert(rule.clone(), mode);
        }
        out.insert(point, modes);
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::policy::bundle::BundleFile;

    const LIMIT_HIT: &str = "execution exceeded time limit (elapsed=1004205101ns, limit=1000000000ns)";

    /// A check that hit the wall-clock limit while the machine kept it off the CPU (here: it
    /// slept) is run again, and its next answer counts: the shipped bundle's own tests were
    /// refused that way on a loaded machine, and the operator exited at start.
    #[test]
    fn a_check_starved_of_cpu_at_the_time_limit_is_run_again() {
        let mut runs = 0;
        let result = bounded(|| {
            runs += 1;
            std::thread::sleep(Duration::from_millis(20));
            if runs == 1 {
                Err(LIMIT_HIT.to_string())
            } else {
                Ok(runs)
            }
        });
        assert_eq!(result, Ok(2));
        let mut runs = 0;
        let always = bounded(|| -> Result<(), String> {
            runs += 1;
            Err(LIMIT_HIT.to_string())
        });
        assert!(always.is_err_and(|e| is_limit_error(&e)));
        assert_eq!(runs, STARVED_ATTEMPTS, "a bounded number of attempts");
    }

    /// A check that spent the CPU it was given (a runaway rule) is refused at its first limit,
    /// and any other error is never retried.
    #[test]
    fn a_check_that_used_its_cpu_or_failed_otherwise_is_not_run_again() {
        if thread_cpu_time().is_none() {
            return; // no scheduler statistics here: every limit counts as starved
        }
        let mut runs = 0;
        let spun = bounded(|| -> Result<(), String> {
            runs += 1;
            // Spins until it has had three quarters of the limit on the CPU, however busy the
            // machine is.
            let start = thread_cpu_time().unwrap();
            let mut x = 0u64;
            while thread_cpu_time().unwrap().saturating_sub(start) < EVAL_TIME_LIMIT * 3 / 4 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            Err(LIMIT_HIT.to_string())
        });
        assert!(spun.is_err());
        assert_eq!(runs, 1);
        let mut runs = 0;
        let broken = bounded(|| -> Result<(), String> {
            runs += 1;
            Err("var x is unsafe".to_string())
        });
        assert!(broken.is_err());
        assert_eq!(runs, 1);
    }

    /// Every `sprintf` needs a literal format whose fields are at most 999 wide; comments,
    /// strings and other names that contain the word are not calls.
    #[test]
    fn a_sprintf_is_bounded_by_its_literal_format() {
        let bounded = [
            r#"msg := sprintf("%s may not %d%% %-10s %.3f", [a, b, c, d])"#,
            "msg := sprintf(`%999d`, [1])",
            r#"# sprintf(x, [1]) in a comment
x := "sprintf(y)""#,
            r#"x := my_sprintf(y) with sprintf as z"#,
        ];
        for source in bounded {
            assert_eq!(unbounded_sprintf(source), None, "{source}");
        }
        let refused = [
            (r#"m := sprintf("%4000000000d", [1])"#, "a width of 4000000000"),
            (r#"m := sprintf("%.1000f", [1])"#, "a precision of 1000"),
            (r#"m := sprintf("%*d", [n, 1])"#, "(*)"),
            (r#"m := sprintf( "ok %s \" %-01000s", [a, b])"#, "a width of 1000"),
            (
                "f := input.f
m := sprintf(f, [1])",
                "must be a string literal",
            ),
        ];
        for (source, why) in refused {
            let found = unbounded_sprintf(source);
            assert!(found.as_deref().is_some_and(|f| f.contains(why)), "{source}: {found:?}");
        }
    }

    fn engine(limit: u64) -> PolicyEngine {
        let file = |name: &str, contents: String| BundleFile { name: name.into(), contents };
        let bundle = Bundle::from_files([
            file(
                "g.rego",
                "package stateward.guardrails\n\ndeny contains \"over\" if input.n > data.limit\n".into(),
            ),
            file("p.rego", "package stateward.plugins\n\ndeny contains \"odd\" if input.n % 2 == 1\n".into()),
            file("data.json", format!("{{\"limit\": {limit}}}")),
        ])
        .unwrap();
        PolicyEngine::compile(&bundle).unwrap()
    }

    /// The per-thread conversions of `plugin` and `resource` are only reused for equal JSON:
    /// a sequence of decisions on one thread decides like each on a fresh thread.
    #[test]
    fn shared_members_follow_the_input() {
        let bundle = Bundle::from_files([BundleFile {
            name: "g.rego".into(),
            contents: "package stateward.guardrails\n\ndeny contains json.marshal([input.plugin, input.resource, input.action])\n".into(),
        }])
        .unwrap();
        let engine = Arc::new(PolicyEngine::compile(&bundle).unwrap());
        let inputs = [
            serde_json::json!({"plugin": {"name": "a"}, "resource": {"n": 1}, "action": 1}),
            serde_json::json!({"plugin": {"name": "a"}, "resource": {"n": 1}, "action": 2}),
            serde_json::json!({"plugin": {"name": "b"}, "resource": {"n": 1.0}, "action": 2}),
            serde_json::json!({"plugin": {"name": "b"}, "resource": {"n": -0.0}, "action": 2}),
            serde_json::json!({"plugin": {"name": "b"}, "resource": {"n": 0.0}, "action": 2}),
            serde_json::json!({"plugin": null, "action": 2}),
            serde_json::json!({"plugin": {"name": "b"}, "resource": [1, 2], "action": 2}),
            serde_json::json!([1]),
        ];
        for input in inputs.iter().chain(inputs.iter().rev()) {
            let warm = engine.evaluate(DecisionPoint::Guardrails, input);
            let (engine, input) = (engine.clone(), input.clone());
            let cold = std::thread::spawn(move || engine.evaluate(DecisionPoint::Guardrails, &input))
                .join()
                .unwrap();
            assert_eq!((warm.deny, warm.error), (cold.deny, cold.error));
        }
    }

    /// The per-thread VM is keyed by engine and decision point: alternating between two
    /// engines (another bundle's data) and two points on one thread never mixes them up.
    #[test]
    fn per_thread_vm_follows_engine_and_point() {
        let (low, high) = (engine(1), engine(10));
        let input = serde_json::json!({"n": 5});
        for _ in 0..3 {
            assert_eq!(low.evaluate(DecisionPoint::Guardrails, &input).deny, ["over"]);
            assert!(high.evaluate(DecisionPoint::Guardrails, &input).deny.is_empty());
            assert_eq!(high.evaluate(DecisionPoint::Plugins, &input).deny, ["odd"]);
            assert!(low.evaluate(DecisionPoint::Guardrails, &serde_json::json!({"n": 0})).deny.is_empty());
        }
        assert!(low.rvm_fallbacks().is_empty() && high.rvm_fallbacks().is_empty());
    }
}
