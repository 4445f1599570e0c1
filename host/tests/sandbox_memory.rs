//! The sandbox's memory cap holds for a whole call, not per linear memory: a hostile component
//! with many memories (tests/fixtures/multi-memory) is refused at load when it declares more
//! memories or tables than a call may have, and its memories share one cap when it declares
//! fewer, on both instance allocators. The process's peak RSS is measured around each load.
//!
//! Its own test binary: the RSS of a process running the other sandbox tests in parallel
//! (one builds 100 MB of output) would swamp the measurement. Tests here run one at a time.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::{Arc, Mutex};

use stateward::runtime::{AllocatorKind, Limits, Plugin, RuntimeError, Sandbox};

const MIB: u64 = 1 << 20;
/// Peak RSS a load may add besides guest memory: compiling the tiny component, wasmtime's
/// instance metadata, allocator noise.
const SLACK: u64 = 48 * MIB;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let line = status.lines().find(|l| l.starts_with(field)).expect("field in /proc/self/status");
    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("a number of kB")
}

/// Runs `f` and returns its result with the growth of the process's peak RSS (VmHWM) over the
/// RSS before it, the peak having been reset to the current RSS first.
fn peak_rss_growth<R>(f: impl FnOnce() -> R) -> (R, u64) {
    std::fs::write("/proc/self/clear_refs", "5").expect("reset the peak RSS");
    let before = status_kib("VmRSS:") * 1024;
    let out = f();
    let peak = status_kib("VmHWM:") * 1024;
    (out, peak.saturating_sub(before))
}

fn sandbox_with(limits: Limits, allocator: AllocatorKind) -> Arc<Sandbox> {
    Sandbox::new(limits, allocator, None).expect("sandbox")
}

fn sandbox(allocator: AllocatorKind) -> Arc<Sandbox> {
    sandbox_with(Limits::default(), allocator)
}

const ALLOCATORS: [AllocatorKind; 2] = [AllocatorKind::OnDemand, AllocatorKind::Pooling];

/// Four 60 MiB memories (240 MiB) against the default 64 MiB cap, with the count limit raised
/// to let four memories through: each one fits the cap on its own, together they do not;
/// instantiation fails before the guest touches any of them.
#[test]
fn memories_of_one_call_share_one_cap() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let bytes = support::multi_memory(4, 960, 0);
    for allocator in ALLOCATORS {
        let sandbox = sandbox_with(Limits { memories: 4, ..Limits::default() }, allocator);
        let cap = sandbox.limits().memory_bytes as u64;
        let (result, growth) = peak_rss_growth(|| Plugin::load(&sandbox, &bytes));
        println!("{allocator:?}: 4 x 60 MiB memories, cap {} MiB: peak RSS +{} MiB", cap / MIB, growth / MIB);
        match result {
            Err(RuntimeError::OutOfMemory { requested, limit, .. }) => {
                assert_eq!(limit as u64, cap);
                assert!(requested > limit, "requested {requested} of {limit}");
            }
            other => panic!("{allocator:?}: expected OutOfMemory, got {other:?}"),
        }
        assert!(growth < cap + SLACK, "{allocator:?}: peak RSS grew {} MiB", growth / MIB);
    }
}

/// The component: eight 64 MiB memories. It declares more memories than a call may
/// have, so it is refused at load, naming the count and the limit, before anything runs.
#[test]
fn component_with_more_memories_than_allowed_is_refused_at_load() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let bytes = support::multi_memory(8, 1024, 0);
    for allocator in ALLOCATORS {
        let sandbox = sandbox(allocator);
        let (result, growth) = peak_rss_growth(|| Plugin::load(&sandbox, &bytes));
        println!("{allocator:?}: 8 x 64 MiB memories: peak RSS +{} MiB", growth / MIB);
        let err = result.expect_err("must be refused");
        match &err {
            RuntimeError::TooManyResources { what, declared, limit } => {
                assert_eq!(*what, "linear memories");
                assert_eq!(*declared, 8);
                assert_eq!(*limit, sandbox.limits().memories);
            }
            other => panic!("{allocator:?}: expected TooManyResources, got {other}"),
        }
        assert!(err.to_string().contains("8 linear memories"), "{err}");
        assert_eq!(err.label(), "too_many_resources");
        assert!(growth < SLACK, "{allocator:?}: peak RSS grew {} MiB", growth / MIB);
    }
}

#[test]
fn component_with_more_tables_than_allowed_is_refused_at_load() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let bytes = support::multi_memory(1, 1, 100);
    let sandbox = sandbox(AllocatorKind::OnDemand);
    let err = Plugin::load(&sandbox, &bytes).expect_err("must be refused");
    match &err {
        RuntimeError::TooManyResources { what, declared, limit } => {
            assert_eq!(*what, "tables");
            assert_eq!(*declared, 100);
            assert_eq!(*limit, sandbox.limits().tables);
        }
        other => panic!("expected TooManyResources, got {other}"),
    }
}

/// Within the limits, the fixture loads as far as its own trap: the checks refuse only what
/// is over them.
#[test]
fn component_within_the_limits_runs_until_its_trap() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let bytes = support::multi_memory(2, 256, 1);
    for allocator in ALLOCATORS {
        let sandbox = sandbox(allocator);
        let (result, growth) = peak_rss_growth(|| Plugin::load(&sandbox, &bytes));
        println!("{allocator:?}: 2 x 16 MiB memories: peak RSS +{} MiB", growth / MIB);
        let err = result.expect_err("the fixture traps");
        assert!(matches!(err, RuntimeError::Trap { .. }), "{allocator:?}: {err}");
    }
}
