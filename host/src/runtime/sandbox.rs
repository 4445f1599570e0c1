//! The one wasmtime engine of the process, its configuration, limits and epoch ticker.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Engine, Store};

use super::bindings::{v0_1, v0_2};
use super::cache::PrecompiledCache;
use super::function_cache::{self, FunctionCache};
use super::host_state::HostState;
use super::RuntimeError;

/// How often the epoch advances; the granularity of the wall-clock budget.
const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Per-call limits. Defaults: 2 s wall clock, 64 MiB memory, 4 MiB output; at most 2 linear
/// memories, 16 tables and 32 core instances per call.
#[derive(Clone, Debug)]
pub struct Limits {
    pub budget: Duration,
    /// Cap on the sum of every linear memory and table one call creates. Multi-memory is on,
    /// so a component may declare many memories: a cap per memory would let N of them take N
    /// times the cap in one call.
    pub memory_bytes: usize,
    pub output_bytes: usize,
    /// Guest calls running at once; the rest wait their turn.
    pub concurrency: usize,
    /// Linear memories one call may create (a Rust plugin has one).
    pub memories: usize,
    /// Tables one call may create (a Rust plugin and its component glue have a few).
    pub tables: usize,
    /// Core instances one call may create (a Rust plugin and its component glue have a few).
    pub instances: usize,
    /// What one plan may ask of the running service.
    pub requests: super::plan::RequestLimits,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            budget: Duration::from_secs(2),
            memory_bytes: 64 << 20,
            output_bytes: 4 << 20,
            concurrency: 8,
            memories: 2,
            tables: 16,
            instances: 32,
            requests: super::plan::RequestLimits::default(),
        }
    }
}

/// Which instance allocator backs the stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AllocatorKind {
    /// Fresh mmap per instance; never fails to start.
    OnDemand,
    /// Pre-reserved slots with copy-on-write memory images; may fail on constrained nodes.
    Pooling,
    /// Pooling when its virtual-memory reservation succeeds, on-demand otherwise.
    Auto,
}

/// Which of wasmtime's compilers turns a plugin's Wasm into machine code. Both are in
/// wasmtime's first tier of support on x86-64 (fuzzed continuously, security advisories).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Compiler {
    /// Winch, the baseline compiler: one pass per function, about six times faster to compile
    /// than Cranelift, code somewhat slower. A hot-loaded build serves sooner, and a plugin
    /// call's cost is mostly the host's (JSON in and out) anyway.
    Winch,
    /// Cranelift, the optimising compiler: faster code, slower to compile; a new build of a
    /// running plugin compiles only the functions that changed (the incremental cache).
    Cranelift,
    /// Winch where wasmtime supports it in its first tier (x86-64), Cranelift elsewhere.
    Auto,
}

impl Compiler {
    /// `Auto` made concrete for this machine.
    pub fn resolve(self) -> Self {
        match self {
            Compiler::Auto if cfg!(target_arch = "x86_64") => Compiler::Winch,
            Compiler::Auto => Compiler::Cranelift,
            other => other,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Compiler::Winch => "winch",
            Compiler::Cranelift => "cranelift",
            Compiler::Auto => "auto",
        }
    }
}

/// The engine, linker and limits shared by every plugin.
pub struct Sandbox {
    pub(super) engine: Engine,
    pub(super) linker: Linker<HostState>,
    pub(super) limits: Limits,
    pub(super) cache: Option<PrecompiledCache>,
    /// Functions compiled before, reused by later builds (a hot reload compiles what changed).
    pub(super) functions: Arc<FunctionCache>,
    /// Call slots of reconcile and finalize, and apart from them those of the webhooks'
    /// validate and convert: a flood of admission reviews waits for its own slots and never
    /// queues ahead of reconciles.
    permits: Arc<tokio::sync::Semaphore>,
    admission_permits: Arc<tokio::sync::Semaphore>,
    allocator: AllocatorKind,
    compiler: Compiler,
}

/// Which slots a call takes (see [`Sandbox::run_blocking`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// Reconcile and finalize: `concurrency` at once.
    Controller,
    /// Validate and convert from the webhooks: a quarter of that (at least one) at once.
    Admission,
}

impl Lane {
    /// The lane of a plugin export.
    pub fn of(export: &str) -> Self {
        if matches!(export, "validate" | "convert") {
            Lane::Admission
        } else {
            Lane::Controller
        }
    }
}

/// Admission calls at once for `concurrency` reconcile calls.
fn admission_slots(concurrency: usize) -> usize {
    (concurrency / 4).max(1)
}

impl Sandbox {
    /// Builds the engine with this machine's default compiler ([`Compiler::Auto`]); `cache_dir`
    /// keeps precompiled components across restarts.
    pub fn new(
        limits: Limits,
        allocator: AllocatorKind,
        cache_dir: Option<PathBuf>,
    ) -> Result<Arc<Self>, RuntimeError> {
        Self::with_compiler(limits, allocator, Compiler::Auto, cache_dir)
    }

    /// [`Sandbox::new`] with the compiler chosen. The precompiled cache keeps each compiler's
    /// code apart (the engine's compatibility hash differs).
    pub fn with_compiler(
        limits: Limits,
        allocator: AllocatorKind,
        compiler: Compiler,
        cache_dir: Option<PathBuf>,
    ) -> Result<Arc<Self>, RuntimeError> {
        let compiler = compiler.resolve();
        let functions = Arc::new(FunctionCache::new(function_cache::DEFAULT_MAX_BYTES));
        let build = |pooling| build_engine(&limits, pooling, compiler, &functions);
        let (engine, allocator) = match allocator {
            AllocatorKind::OnDemand => (build(false)?, AllocatorKind::OnDemand),
            AllocatorKind::Pooling => (build(true)?, AllocatorKind::Pooling),
            AllocatorKind::Auto => match build(true) {
                Ok(engine) => (engine, AllocatorKind::Pooling),
                Err(err) => {
                    tracing::warn!(error = %err, "pooling allocator unavailable, using on-demand");
                    (build(false)?, AllocatorKind::OnDemand)
                }
            },
        };
        let mut linker = Linker::new(&engine);
        link_wasi(&mut linker).map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        // Both contracts' host interfaces: a component of either version links.
        v0_2::Plugin::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)
            .and_then(|()| v0_1::Plugin::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s))
            .map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        spawn_epoch_ticker(&engine)?;
        let cache = cache_dir.map(|dir| PrecompiledCache::new(dir, &engine));
        Ok(Arc::new(Self {
            permits: Arc::new(tokio::sync::Semaphore::new(limits.concurrency.max(1))),
            admission_permits: Arc::new(tokio::sync::Semaphore::new(admission_slots(limits.concurrency))),
            engine,
            linker,
            limits,
            cache,
            functions,
            allocator,
            compiler,
        }))
    }

    /// The compiler in use (never `Auto`).
    pub fn compiler(&self) -> Compiler {
        self.compiler
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Bytes of compiled functions kept for later builds to reuse.
    pub fn compiled_function_bytes(&self) -> usize {
        self.functions.bytes()
    }

    /// The allocator actually in use (after `Auto` fell back, if it did).
    pub fn allocator(&self) -> AllocatorKind {
        self.allocator
    }

    /// Runs a blocking plugin call on the blocking pool, within the slots of its `lane`, so a
    /// slow guest never stalls the async reactor.
    pub async fn run_blocking<R: Send + 'static>(
        &self,
        lane: Lane,
        call: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, RuntimeError> {
        let permits = match lane {
            Lane::Controller => &self.permits,
            Lane::Admission => &self.admission_permits,
        };
        let _permit =
            permits.acquire().await.map_err(|e| RuntimeError::Engine(format!("call pool closed: {e}")))?;
        let span = tracing::Span::current();
        tokio::task::spawn_blocking(move || span.in_scope(call))
            .await
            .map_err(|e| RuntimeError::Engine(format!("plugin call task failed: {e}")))
    }

    /// A fresh store for one call, with its memory cap and wall-clock deadline armed.
    pub(super) fn store(&self) -> Store<HostState> {
        let mut store = Store::new(&self.engine, HostState::new(&self.limits));
        store.limiter(|state| &mut state.limiter);
        let ticks = self.limits.budget.as_millis() / EPOCH_TICK.as_millis();
        store.set_epoch_deadline(u64::try_from(ticks).unwrap_or(u64::MAX).max(1));
        store.epoch_deadline_trap();
        store
    }
}

fn build_engine(
    limits: &Limits,
    pooling: bool,
    compiler: Compiler,
    functions: &Arc<FunctionCache>,
) -> Result<Engine, RuntimeError> {
    let engine_error = |e: wasmtime::Error| RuntimeError::Engine(format!("{e:#}"));
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    match compiler {
        Compiler::Winch => {
            config.strategy(wasmtime::Strategy::Winch);
        }
        // The incremental cache is Cranelift's own.
        Compiler::Cranelift | Compiler::Auto => {
            config.strategy(wasmtime::Strategy::Cranelift);
            config.enable_incremental_compilation(Arc::clone(functions) as _).map_err(engine_error)?;
        }
    }
    if pooling {
        // The pool agrees with the store's limiter: a component gets as many memories, tables
        // and core instances as one call may create, each memory at most the whole call's cap
        // (the limiter then caps their sum), and the totals are that times the slots.
        // Both lanes' calls at once, with room to spare.
        let calls = limits.concurrency.max(1) + admission_slots(limits.concurrency);
        let slots = u32::try_from(calls * 2).unwrap_or(64);
        let per_call = |n: usize| u32::try_from(n.max(1)).unwrap_or(u32::MAX);
        let (memories, tables, instances) =
            (per_call(limits.memories), per_call(limits.tables), per_call(limits.instances));
        let mut pool = wasmtime::PoolingAllocationConfig::new();
        pool.total_component_instances(slots)
            .total_core_instances(slots.saturating_mul(instances))
            .total_memories(slots.saturating_mul(memories))
            .total_tables(slots.saturating_mul(tables))
            .total_stacks(slots)
            .max_core_instances_per_component(instances)
            .max_memories_per_component(memories)
            .max_memories_per_module(memories)
            .max_tables_per_component(tables)
            .max_tables_per_module(tables)
            .max_memory_size(limits.memory_bytes);
        config.allocation_strategy(pool);
        config.memory_init_cow(true);
    }
    Engine::new(&config).map_err(engine_error)
}

/// Links only the WASI interfaces a Rust `std` guest imports by itself: io and cli.
/// Filesystem, sockets, clocks and http are never linked, so a component that needs them
/// cannot be instantiated; `Plugin::load` refuses it earlier with the import's name.
fn link_wasi(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    use wasmtime_wasi::cli::{WasiCli, WasiCliView};
    use wasmtime_wasi::p2::bindings::sync::io;
    use wasmtime_wasi::p2::bindings::{cli, random};
    use wasmtime_wasi::random::WasiRandom;
    use wasmtime_wasi::WasiView;

    struct Table;
    impl wasmtime::component::HasData for Table {
        type Data<'a> = &'a mut wasmtime::component::ResourceTable;
    }
    let l = linker;
    io::error::add_to_linker::<HostState, Table>(l, |t| t.ctx().table)?;
    io::poll::add_to_linker::<HostState, Table>(l, |t| t.ctx().table)?;
    io::streams::add_to_linker::<HostState, Table>(l, |t| t.ctx().table)?;
    cli::exit::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::environment::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::stdin::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::stdout::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::stderr::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_input::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_output::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_stdin::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_stdout::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_stderr::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    random::random::add_to_linker::<HostState, WasiRandom>(l, |t| t.ctx().ctx.random())?;
    random::insecure::add_to_linker::<HostState, WasiRandom>(l, |t| t.ctx().ctx.random())?;
    random::insecure_seed::add_to_linker::<HostState, WasiRandom>(l, |t| t.ctx().ctx.random())?;
    Ok(())
}

/// Advances the engine's epoch every tick until the engine is dropped.
fn spawn_epoch_ticker(engine: &Engine) -> Result<(), RuntimeError> {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("wasm-epoch".into())
        .spawn(move || loop {
            std::thread::sleep(EPOCH_TICK);
            match weak.upgrade() {
                Some(engine) => engine.increment_epoch(),
                None => return,
            }
        })
        .map(drop)
        .map_err(|e| RuntimeError::Engine(format!("cannot start the epoch ticker: {e}")))
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod lane_tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_admission_lane_leaves_reconciles_their_slots() {
        let limits = Limits { concurrency: 4, ..Limits::default() };
        let sandbox = Sandbox::new(limits, AllocatorKind::OnDemand, None).expect("sandbox");
        // Every admission slot held by a call that waits to be released.
        let (release, held) = std::sync::mpsc::channel::<()>();
        let held = Arc::new(std::sync::Mutex::new(held));
        let mut blocked = Vec::new();
        // As many as the controller lane has slots, and one more: with one shared pool they
        // would take every slot.
        for _ in 0..=4 {
            let (sandbox, held) = (Arc::clone(&sandbox), Arc::clone(&held));
            blocked.push(tokio::spawn(async move {
                sandbox
                    .run_blocking(Lane::Admission, move || {
                        let _ = held.lock().map(|rx| rx.recv_timeout(Duration::from_secs(10)));
                    })
                    .await
            }));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let started = std::time::Instant::now();
        let answer =
            tokio::time::timeout(Duration::from_secs(2), sandbox.run_blocking(Lane::Controller, || 7))
                .await
                .expect("a reconcile call waited behind admission")
                .expect("ran");
        assert_eq!(answer, 7);
        assert!(started.elapsed() < Duration::from_millis(500), "{:?}", started.elapsed());
        // And another admission call does wait for its lane.
        let waiting =
            tokio::time::timeout(Duration::from_millis(200), sandbox.run_blocking(Lane::Admission, || ()))
                .await;
        assert!(waiting.is_err(), "an admission call ran past a full lane");
        for _ in 0..blocked.len() {
            let _ = release.send(());
        }
        for b in blocked {
            b.await.expect("joined").expect("ran");
        }
        assert_eq!(Lane::of("validate"), Lane::Admission);
        assert_eq!(Lane::of("convert"), Lane::Admission);
        assert_eq!(Lane::of("reconcile"), Lane::Controller);
    }
}
