//! The one wasmtime engine of the process, its configuration, limits and epoch ticker.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Engine, Store};

use super::bindings::Plugin as PluginWorld;
use super::cache::PrecompiledCache;
use super::host_state::HostState;
use super::RuntimeError;

/// How often the epoch advances; the granularity of the wall-clock budget.
const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Per-call limits. Defaults: 2 s wall clock, 64 MiB memory, 4 MiB output.
#[derive(Clone, Debug)]
pub struct Limits {
    pub budget: Duration,
    pub memory_bytes: usize,
    pub output_bytes: usize,
    /// Guest calls running at once; the rest wait their turn.
    pub concurrency: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            budget: Duration::from_secs(2),
            memory_bytes: 64 << 20,
            output_bytes: 4 << 20,
            concurrency: 8,
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

/// The engine, linker and limits shared by every plugin.
pub struct Sandbox {
    pub(super) engine: Engine,
    pub(super) linker: Linker<HostState>,
    pub(super) limits: Limits,
    pub(super) cache: Option<PrecompiledCache>,
    pub(super) permits: Arc<tokio::sync::Semaphore>,
    allocator: AllocatorKind,
}

impl Sandbox {
    /// Builds the engine; `cache_dir` keeps precompiled components across restarts.
    pub fn new(
        limits: Limits,
        allocator: AllocatorKind,
        cache_dir: Option<PathBuf>,
    ) -> Result<Arc<Self>, RuntimeError> {
        let (engine, allocator) = match allocator {
            AllocatorKind::OnDemand => (build_engine(&limits, false)?, AllocatorKind::OnDemand),
            AllocatorKind::Pooling => (build_engine(&limits, true)?, AllocatorKind::Pooling),
            AllocatorKind::Auto => match build_engine(&limits, true) {
                Ok(engine) => (engine, AllocatorKind::Pooling),
                Err(err) => {
                    tracing::warn!(error = %err, "pooling allocator unavailable, using on-demand");
                    (build_engine(&limits, false)?, AllocatorKind::OnDemand)
                }
            },
        };
        let mut linker = Linker::new(&engine);
        link_wasi(&mut linker).map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        PluginWorld::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)
            .map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        spawn_epoch_ticker(&engine)?;
        let cache = cache_dir.map(|dir| PrecompiledCache::new(dir, &engine));
        Ok(Arc::new(Self {
            permits: Arc::new(tokio::sync::Semaphore::new(limits.concurrency.max(1))),
            engine,
            linker,
            limits,
            cache,
            allocator,
        }))
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The allocator actually in use (after `Auto` fell back, if it did).
    pub fn allocator(&self) -> AllocatorKind {
        self.allocator
    }

    /// Runs a blocking plugin call on the blocking pool, at most `concurrency` at once, so a
    /// slow guest never stalls the async reactor.
    pub async fn run_blocking<R: Send + 'static>(
        &self,
        call: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, RuntimeError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|e| RuntimeError::Engine(format!("call pool closed: {e}")))?;
        let span = tracing::Span::current();
        tokio::task::spawn_blocking(move || span.in_scope(call))
            .await
            .map_err(|e| RuntimeError::Engine(format!("plugin call task failed: {e}")))
    }

    /// A fresh store for one call, with its memory cap and wall-clock deadline armed.
    pub(super) fn store(&self) -> Store<HostState> {
        let mut store = Store::new(&self.engine, HostState::new(self.limits.memory_bytes));
        store.limiter(|state| &mut state.limiter);
        let ticks = self.limits.budget.as_millis() / EPOCH_TICK.as_millis();
        store.set_epoch_deadline(u64::try_from(ticks).unwrap_or(u64::MAX).max(1));
        store.epoch_deadline_trap();
        store
    }
}

fn build_engine(limits: &Limits, pooling: bool) -> Result<Engine, RuntimeError> {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    if pooling {
        let slots = u32::try_from(limits.concurrency.max(1) * 2).unwrap_or(64);
        let mut pool = wasmtime::PoolingAllocationConfig::new();
        pool.total_component_instances(slots)
            .total_core_instances(slots * 4)
            .total_memories(slots * 2)
            .total_tables(slots * 4)
            .total_stacks(slots)
            .max_memory_size(limits.memory_bytes);
        config.allocation_strategy(pool);
        config.memory_init_cow(true);
    }
    Engine::new(&config).map_err(|e| RuntimeError::Engine(format!("{e:#}")))
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
