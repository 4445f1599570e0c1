//! Scale benchmark: N mixed custom resources (N = 100, 300, 1000 by default) on the local
//! control plane, against a raw server-side-apply loader of the same children in the same run.
//! Prints one table and writes it to target/scale-report.md (see tests/scale/mod.rs for
//! what is measured and how).
//!
//! ```sh
//! cargo bench -p stateward --bench scale                      # 100, 300, 1000
//! cargo bench -p stateward --bench scale -- --sizes 100,300 --steady-secs 60 --concurrency 8
//! ```
//!
//! The benchmark starts its own cluster through tests/cluster/up (unless one is running) with
//! 12 kwok nodes and 1080 volumes, and the controller manager's client limits raised
//! (`--kube-api-qps=200`) so its StatefulSet controller is not the first bound. The operator
//! is the `stateward` binary built with the benchmark (release profile), or `--operator PATH`.

#[path = "../tests/scale/mod.rs"]
mod scale;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context as _};

struct Args {
    sizes: Vec<usize>,
    concurrency: u16,
    steady: Duration,
    operator: PathBuf,
    out: PathBuf,
    baseline: bool,
    storm: bool,
    restart: bool,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        sizes: vec![100, 300, 1000],
        concurrency: 8,
        steady: Duration::from_secs(60),
        operator: PathBuf::from(env!("CARGO_BIN_EXE_stateward")),
        out: scale::target_dir().join("scale-report.md"),
        baseline: true,
        storm: true,
        restart: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--sizes" => a.sizes = value()?.split(',').map(|s| s.trim().parse()).collect::<Result<_, _>>()?,
            "--concurrency" => a.concurrency = value()?.parse()?,
            "--steady-secs" => a.steady = Duration::from_secs(value()?.parse()?),
            "--operator" => a.operator = PathBuf::from(value()?),
            "--out" => a.out = PathBuf::from(value()?),
            "--no-baseline" => a.baseline = false,
            "--no-storm" => a.storm = false,
            "--no-restart" => a.restart = false,
            "--bench" => {} // added by `cargo bench`
            other => bail!("unknown argument {other}"),
        }
    }
    Ok(a)
}

/// Runs tests/cluster/up (which reuses a healthy cluster) with a pool big enough for 1000,
/// unless the caller set the sizes; returns the admin kubeconfig.
fn cluster_up() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("STATEWARD_KUBECONFIG") {
        return Ok(PathBuf::from(path));
    }
    let mut up = Command::new(stateward_testkit::cluster_dir().join("up"));
    let defaults = [
        ("STATEWARD_NODES_PER_ZONE", "4".to_string()),
        ("STATEWARD_PV_SIZES", vec!["1Gi"; 90].join(" ")),
        ("STATEWARD_KCM_EXTRA_ARGS", "--kube-api-qps=200 --kube-api-burst=400".to_string()),
    ];
    for (var, value) in defaults {
        if std::env::var_os(var).is_none() {
            up.env(var, value);
        }
    }
    let out = up.stderr(std::process::Stdio::inherit()).output().context("running tests/cluster/up")?;
    if !out.status.success() {
        bail!("tests/cluster/up failed ({})", out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let path = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .context("tests/cluster/up printed no kubeconfig")?;
    Ok(PathBuf::from(path.trim()))
}

fn main() -> anyhow::Result<()> {
    let args = args()?;
    let kubeconfig = cluster_up()?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let bench = scale::Bench::new(&kubeconfig, &args.operator).await?;
        let work_dir = scale::target_dir().join("scale-runs");
        let mut reports = Vec::new();
        for &n in &args.sizes {
            let opts = scale::Options {
                n,
                concurrency: args.concurrency,
                steady: args.steady,
                timeout: Duration::from_secs(900),
                baseline: args.baseline,
                storm: args.storm,
                restart: args.restart,
                work_dir: work_dir.clone(),
            };
            let report = bench.run(&opts).await.with_context(|| format!("run at N = {n}"))?;
            eprintln!("{report:#?}");
            reports.push(report);
            // Partial results survive a later failure.
            write_report(&args, &reports)?;
        }
        let text = write_report(&args, &reports)?;
        println!("{text}");
        println!("written to {}", args.out.display());
        anyhow::Ok(())
    })
}

fn write_report(args: &Args, reports: &[scale::Report]) -> anyhow::Result<String> {
    let mut text = scale::table(reports);
    let points: Vec<(f64, f64)> = reports.iter().map(|r| (r.n as f64, r.operator_secs)).collect();
    if let Some((slope, intercept)) = scale::fit(&points) {
        text.push_str(&format!(
            "\nOperator time ≈ {intercept:.1} s + {:.1} ms × N (least squares over N = {:?}).\n",
            slope * 1000.0,
            reports.iter().map(|r| r.n).collect::<Vec<_>>()
        ));
    }
    let base: Vec<(f64, f64)> = reports.iter().filter_map(|r| Some((r.n as f64, r.baseline_secs?))).collect();
    if let Some((slope, intercept)) = scale::fit(&base) {
        text.push_str(&format!("Baseline time ≈ {intercept:.1} s + {:.1} ms × N.\n", slope * 1000.0));
    }
    text.push_str(&format!(
        "\nConcurrency {} per kind (loader: {} workers); steady window {} s; 1 replica per resource.\n",
        args.concurrency,
        usize::from(args.concurrency) * scale::KINDS.len(),
        args.steady.as_secs()
    ));
    if let Some(parent) = args.out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&args.out, &text)?;
    Ok(text)
}
