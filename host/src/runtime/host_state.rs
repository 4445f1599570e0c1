//! What one call's `Store` holds: an empty WASI context, the memory limiter and the log sink.

use rand::SeedableRng;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::stateward::plugin::host::{Host, Level};

/// Bytes of guest stdout/stderr and `log` text kept per call; the rest is dropped.
const LOG_CAPACITY: usize = 64 * 1024;

pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub limiter: MemoryLimiter,
    pub logs: Vec<(Level, String)>,
    log_bytes: usize,
    stdout: MemoryOutputPipe,
    stderr: MemoryOutputPipe,
}

impl HostState {
    /// An empty WASI context: no arguments, no variables, empty stdin, stdout/stderr captured,
    /// random numbers from a fixed seed so that plans stay reproducible.
    pub fn new(memory_limit: usize) -> Self {
        let stdout = MemoryOutputPipe::new(LOG_CAPACITY);
        let stderr = MemoryOutputPipe::new(LOG_CAPACITY);
        let mut builder = WasiCtx::builder();
        builder
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .secure_random(rand::rngs::StdRng::seed_from_u64(0x5747_6172_6421))
            .insecure_random(rand::rngs::StdRng::seed_from_u64(0x5747_6172_6422))
            .insecure_random_seed(0x5747_6172_6423);
        Self {
            wasi: builder.build(),
            table: ResourceTable::new(),
            limiter: MemoryLimiter::new(memory_limit),
            logs: Vec::new(),
            log_bytes: 0,
            stdout,
            stderr,
        }
    }

    /// Everything the guest printed, one entry per non-empty line, stderr as warnings.
    pub fn take_output(&mut self) -> Vec<(Level, String)> {
        let mut out = std::mem::take(&mut self.logs);
        for (pipe, level) in [(&self.stdout, Level::Info), (&self.stderr, Level::Warn)] {
            let bytes = pipe.contents();
            let text = String::from_utf8_lossy(&bytes);
            out.extend(
                text.lines()
                    .filter(|l| !l.trim().is_empty())
                    .map(|l| (level, l.to_string())),
            );
        }
        out
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl super::bindings::stateward::plugin::types::Host for HostState {}

impl Host for HostState {
    fn log(&mut self, level: Level, message: String) {
        if self.log_bytes + message.len() > LOG_CAPACITY {
            return;
        }
        self.log_bytes += message.len();
        self.logs.push((level, message));
    }
}

/// Caps linear memory and table growth, and remembers a refused growth so that the trap
/// which follows can be reported as out-of-memory rather than as a generic trap.
pub struct MemoryLimiter {
    limit: usize,
    pub refused: Option<usize>,
}

impl MemoryLimiter {
    fn new(limit: usize) -> Self {
        Self {
            limit,
            refused: None,
        }
    }
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.limit {
            self.refused = Some(desired);
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}
