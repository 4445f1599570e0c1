//! Reconcile of a 3-replica PostgreSQL cluster with its children: through the Wasm plugin and
//! through the same plugin crate compiled natively, in the same run; plus cold load from the
//! precompiled cache, for each of wasmtime's two compilers. Prints a table of p50/p99 and ratios.
//!
//! cargo bench -p stateward --bench plugin_call
#![allow(clippy::expect_used)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use criterion::Criterion;
use serde_json::{json, Value};
use stateward::runtime::{Action, AllocatorKind, Compiler, Limits, Plugin, Sandbox};
use stateward_sdk::{Observed, Service};

const RESOURCE: &str = r#"{"apiVersion":"stateward.dev/v1","kind":"PostgresCluster",
  "metadata":{"name":"bench","namespace":"default","generation":2,"uid":"00000000-0000-0000-0000-000000000001"},
  "spec":{"version":"16.4","replicas":3,"storage":{"size":"10Gi","className":"local"},"retentionPolicy":"Retain"}}"#;

/// The children a converged cluster has: the plan's own objects, with a ready StatefulSet.
fn observed_children(plugin: &Plugin) -> Vec<String> {
    let plan = plugin.reconcile(RESOURCE, &[], 0, "default").expect("first plan");
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::Apply { object } => Some(object.clone()),
            _ => None,
        })
        .map(|mut o: Value| {
            if o["kind"] == "StatefulSet" {
                o["status"] = json!({"replicas": 3, "readyReplicas": 3, "updatedReplicas": 3,
                    "currentReplicas": 3, "currentRevision": "r1", "updateRevision": "r1",
                    "observedGeneration": 1});
            }
            o.to_string()
        })
        .collect()
}

fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    (at(0.50), at(0.99))
}

fn sample(n: usize, mut f: impl FnMut()) -> Vec<Duration> {
    for _ in 0..n / 10 {
        f();
    }
    (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect()
}

fn main() {
    let wasm_path = support::wasm("stateward-postgres");
    let bytes = std::fs::read(&wasm_path).expect("read plugin");
    let mut rows = Vec::new();
    let mut criterion =
        Criterion::default().configure_from_args().sample_size(30).measurement_time(Duration::from_secs(3));

    let runs = [Compiler::Cranelift, Compiler::Winch]
        .into_iter()
        .flat_map(|c| [AllocatorKind::OnDemand, AllocatorKind::Pooling].map(|a| (c, a)));
    for (compiler, allocator) in runs {
        let sandbox = Sandbox::with_compiler(Limits::default(), allocator, compiler, None).expect("sandbox");
        let plugin = Plugin::load(&sandbox, &bytes).expect("load");
        let children = observed_children(&plugin);
        let name = format!("reconcile/wasm/{compiler:?}/{allocator:?}");
        criterion.bench_function(&name, |b| {
            b.iter(|| plugin.reconcile(RESOURCE, &children, 0, "default").expect("plan"))
        });
        let s = sample(2000, || {
            plugin.reconcile(RESOURCE, &children, 0, "default").expect("plan");
        });
        rows.push((name, percentiles(s)));
        // A fresh instance answering a trivial call: the sandbox's fixed cost per call.
        let s = sample(2000, || {
            plugin.validate("", None).expect("validate");
        });
        rows.push((format!("instantiate + trivial call/{compiler:?}/{allocator:?}"), percentiles(s)));
    }

    let sandbox = Sandbox::new(Limits::default(), AllocatorKind::OnDemand, None).expect("sandbox");
    let children = observed_children(&Plugin::load(&sandbox, &bytes).expect("load"));
    let observed = || Observed {
        resource: RESOURCE.to_string(),
        children: children.clone(),
        now_ms: 0,
        responses: Vec::new(),
    };
    criterion.bench_function("reconcile/native", |b| {
        b.iter(|| stateward_postgres::Postgres::reconcile(observed()).expect("plan"))
    });
    let native = percentiles(sample(2000, || {
        stateward_postgres::Postgres::reconcile(observed()).expect("plan");
    }));

    // Cold load: a new engine each time, the component coming from the on-disk cache; and
    // compiling, with each compiler.
    let cache = std::env::temp_dir().join(format!("stateward-bench-cache-{}", std::process::id()));
    let make =
        || Sandbox::new(Limits::default(), AllocatorKind::OnDemand, Some(cache.clone())).expect("sandbox");
    Plugin::load(&make(), &bytes).expect("warm the cache");
    let cold_cached = percentiles(sample(30, || {
        let p = Plugin::load(&make(), &bytes).expect("load");
        assert!(p.loaded_from_cache());
    }));
    let cold_compile = |compiler| {
        percentiles(sample(5, || {
            let sandbox = Sandbox::with_compiler(Limits::default(), AllocatorKind::OnDemand, compiler, None)
                .expect("sandbox");
            Plugin::load(&sandbox, &bytes).expect("load");
        }))
    };
    let compiled = [Compiler::Cranelift, Compiler::Winch].map(|c| (c, cold_compile(c)));
    let _ = std::fs::remove_dir_all(&cache);

    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "\nplugin call benchmark (postgres, 3 replicas, {} children, {} byte component)",
        children.len(),
        bytes.len()
    );
    println!("| measurement | p50 | p99 | p50 / native p50 |");
    println!("|---|---|---|---|");
    println!("| reconcile/native | {:.1} µs | {:.1} µs | 1.00 |", us(native.0), us(native.1));
    for (name, (p50, p99)) in &rows {
        println!("| {name} | {:.1} µs | {:.1} µs | {:.2} |", us(*p50), us(*p99), us(*p50) / us(native.0));
    }
    println!(
        "| cold load, precompiled cache | {:.2} ms | {:.2} ms | |",
        us(cold_cached.0) / 1e3,
        us(cold_cached.1) / 1e3
    );
    for (compiler, (p50, p99)) in compiled {
        println!(
            "| cold load, compiling/{compiler:?} | {:.1} ms | {:.1} ms | |",
            us(p50) / 1e3,
            us(p99) / 1e3
        );
    }
    println!("targets: wasm/native <= 3.0, wasm p50 <= 250 µs, cold load <= 50 ms");
}
