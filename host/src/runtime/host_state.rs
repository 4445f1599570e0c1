//! What one call's `Store` holds: an empty WASI context, the resource limiter and the log sink.

use rand::SeedableRng;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::v0_1::stateward::plugin::host as host_v0_1;
use super::bindings::v0_2::stateward::plugin::host::{Host, Level};

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
    pub fn new(limits: &super::Limits) -> Self {
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
            limiter: MemoryLimiter::new(limits),
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
            out.extend(text.lines().filter(|l| !l.trim().is_empty()).map(|l| (level, l.to_string())));
        }
        out
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl super::bindings::v0_2::stateward::plugin::types::Host for HostState {}
impl super::bindings::v0_1::stateward::plugin::types::Host for HostState {}

/// A 0.1.0 component logs through the same buffer.
impl host_v0_1::Host for HostState {
    fn log(&mut self, level: host_v0_1::Level, message: String) {
        let level = match level {
            host_v0_1::Level::Trace => Level::Trace,
            host_v0_1::Level::Debug => Level::Debug,
            host_v0_1::Level::Info => Level::Info,
            host_v0_1::Level::Warn => Level::Warn,
            host_v0_1::Level::Error => Level::Error,
        };
        Host::log(self, level, message);
    }
}

impl Host for HostState {
    fn log(&mut self, level: Level, message: String) {
        if self.log_bytes + message.len() > LOG_CAPACITY {
            return;
        }
        self.log_bytes += message.len();
        self.logs.push((level, message));
    }
}

/// Elements any one table may have.
const MAX_TABLE_ELEMENTS: usize = 100_000;

/// Caps the sum of every linear memory and table of one call's store (a store may hold many
/// memories: multi-memory is on), and how many memories, tables and instances it may create.
/// Remembers a refused growth so that the trap which follows can be reported as out-of-memory
/// rather than as a generic trap.
pub struct MemoryLimiter {
    limit: usize,
    /// Bytes of all memories and tables of the store: each creation or growth adds to it.
    used: usize,
    /// The last growth allowed, taken back if wasmtime then fails to perform it.
    pending: usize,
    memories: usize,
    tables: usize,
    instances: usize,
    /// The store's total that a refused growth would have reached.
    pub refused: Option<usize>,
}

impl MemoryLimiter {
    fn new(limits: &super::Limits) -> Self {
        Self {
            limit: limits.memory_bytes,
            used: 0,
            pending: 0,
            memories: limits.memories,
            tables: limits.tables,
            instances: limits.instances,
            refused: None,
        }
    }

    /// Adds `grow` bytes to the store's total, or refuses when it would pass the cap.
    fn grow(&mut self, grow: usize) -> bool {
        let total = self.used.saturating_add(grow);
        if total > self.limit {
            self.refused = Some(total);
            return false;
        }
        self.used = total;
        self.pending = grow;
        true
    }

    fn grow_failed(&mut self) {
        self.used = self.used.saturating_sub(std::mem::take(&mut self.pending));
    }
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    /// Called for a memory's initial size at instantiation (`current` 0) and for every growth.
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(self.grow(desired.saturating_sub(current)))
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.grow_failed();
        Ok(())
    }

    /// Each table element takes a pointer's worth of host memory.
    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > MAX_TABLE_ELEMENTS {
            return Ok(false);
        }
        Ok(self.grow(desired.saturating_sub(current).saturating_mul(std::mem::size_of::<usize>())))
    }

    fn table_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.grow_failed();
        Ok(())
    }

    fn instances(&self) -> usize {
        self.instances
    }

    fn tables(&self) -> usize {
        self.tables
    }

    fn memories(&self) -> usize {
        self.memories
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use wasmtime::ResourceLimiter;

    use super::*;

    fn limiter(memory_bytes: usize) -> MemoryLimiter {
        MemoryLimiter::new(&super::super::Limits { memory_bytes, ..Default::default() })
    }

    /// Memories and tables of one store share the cap; a refusal reports the total it would
    /// have reached, and a growth wasmtime could not perform is taken back.
    #[test]
    fn memories_and_tables_share_one_cap() {
        let mut l = limiter(100);
        assert!(l.memory_growing(0, 60, None).unwrap());
        assert!(!l.memory_growing(0, 60, None).unwrap(), "a second memory adds to the first");
        assert_eq!(l.refused, Some(120));
        assert!(l.memory_growing(60, 90, None).unwrap());
        l.memory_grow_failed(wasmtime::Error::msg("mmap failed")).unwrap();
        assert_eq!(l.used, 60);
        assert!(l.table_growing(0, 5, None).unwrap(), "40 bytes of table fit");
        assert!(!l.table_growing(5, 6, None).unwrap(), "8 more do not");
        assert!(!limiter(usize::MAX).table_growing(0, MAX_TABLE_ELEMENTS + 1, None).unwrap());
    }
}
