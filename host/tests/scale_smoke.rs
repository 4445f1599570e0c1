//! The scale benchmark (benches/scale.rs) at N = 20, so it cannot rot: 20 mixed resources
//! must all become Available; as the API server counts the operator's ServiceAccount, every
//! child is written exactly once and the resource itself (finalizer, status) at most
//! [`MAX_RESOURCE_WRITES`] times; no write at all in a short steady window; the operator's
//! own write counter agrees; a change to all 20 specs must converge again; and an operator
//! restarted on the same build (an upgrade whose plans are identical) writes nothing. The raw
//! server-side-apply baseline runs too (its writes must equal the children it applies).
#![allow(clippy::expect_used)]

mod scale;

use std::time::Duration;

/// Writes to the resource itself and its status per resource on the way to Available: the
/// finalizer, the statuses the plugins report on the way, and one more since the plugins ask
/// their running pods (WIT 0.2 polls): the first answers (on kwok, errors: no process runs
/// there) land in `status.instances`. Measured at N = 20: 5.15 (6.00–6.10 before a reconcile
/// on a cache behind its own status write stopped writing again, controller/written.rs), and
/// again 6.10 in one of two full CI runs on a loaded machine, all of the excess in
/// PostgreSQL's status (6.1 writes each against Redis' 5.0 and Elasticsearch's 4.0): the
/// bound allows that one more write until PostgreSQL writes its first poll answers once. A
/// write loop would be far above it.
const MAX_RESOURCE_WRITES: f64 = 7.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_mixed_resources_converge_within_the_write_budget() {
    let cluster = stateward_testkit::cluster().await.expect("local cluster");
    let bench =
        scale::Bench::new(cluster.kubeconfig(), std::path::Path::new(env!("CARGO_BIN_EXE_stateward")))
            .await
            .expect("benchmark setup");
    let work_dir = std::env::temp_dir().join(stateward_testkit::unique_name("scale-smoke"));
    let opts = scale::Options {
        n: 20,
        concurrency: 8,
        steady: Duration::from_secs(15),
        timeout: Duration::from_secs(240),
        baseline: true,
        storm: true,
        restart: true,
        work_dir: work_dir.clone(),
    };
    let started = std::time::Instant::now();
    let report = bench.run(&opts).await.expect("scale run at N = 20");
    eprintln!("scale smoke ({:.0?}):\n{}", started.elapsed(), scale::table(std::slice::from_ref(&report)));
    eprintln!("{report:#?}");

    assert_eq!(report.available, 20, "not every resource became Available");
    assert!(report.children_per_cr >= 6.0, "the plans are smaller than expected: {}", report.children_per_cr);
    // The counter sees the operator: creating children takes at least one write per child.
    assert!(
        report.writes_per_cr >= report.children_per_cr,
        "the API server counted {} writes per resource for {} children: the FlowSchema does not see the operator",
        report.writes_per_cr,
        report.children_per_cr
    );
    // Every child is written once on the way to Available (the applied-hash check); a stale
    // cache may re-apply a few (3 of 6334 at N = 1000), a write loop would be far above.
    // Besides, each pod gets its fence label (`stateward.dev/fenced`) once: one pod a resource.
    let child_writes = report.writes_per_cr - report.resource_writes_per_cr;
    let expected = report.children_per_cr + 1.0;
    assert!(
        child_writes >= expected - 1e-9 && child_writes <= expected * 1.05,
        "{child_writes:.2} child writes per resource for {:.2} planned children and a pod label",
        report.children_per_cr
    );
    // The resource itself: the finalizer and one status write per state the plugins report on
    // the way (no StatefulSet yet, pods not ready, Running). Issue 10's target counts one
    // status write (children + 2 in all); today's controller writes each intermediate status,
    // so the bound here is the finalizer plus at most four status writes; tighten it with the
    // controller.
    assert!(
        report.resource_writes_per_cr <= MAX_RESOURCE_WRITES,
        "{:.2} writes per resource to the resource and its status (finalizer + status), bound {MAX_RESOURCE_WRITES}",
        report.resource_writes_per_cr
    );
    if report.writes_per_cr > report.children_per_cr + 2.0 {
        eprintln!(
            "scale smoke: issue 10's target missed: {:.2} writes per resource > children + 2 = {:.2}",
            report.writes_per_cr,
            report.children_per_cr + 2.0
        );
    }
    // The operator's own counter agrees with the API server's.
    assert!(
        (report.metric_writes_per_cr - report.writes_per_cr).abs() <= 0.1,
        "stateward_api_writes_total counted {:.2} writes per resource, the API server {:.2}",
        report.metric_writes_per_cr,
        report.writes_per_cr
    );
    assert_eq!(report.steady_writes, 0.0, "writes in the steady window");
    // [in-cluster] must-show 7a: an upgrade onto a build whose plans are identical (here the
    // same build, stopped and started as a rolling update does) writes nothing to the 20
    // converged resources while the new leader reconciles every one of them.
    assert!(report.restart_reconciles.unwrap_or(0.0) >= 20.0, "the restarted operator reconciled {report:?}");
    assert_eq!(report.restart_writes, Some(0.0), "writes after a restart onto the same build");
    assert_eq!(report.restart_events, Some(0.0), "Events after a restart onto the same build");
    assert_eq!(report.steady_events, 0.0, "Events in the steady window");
    assert_eq!(report.steady_metric_writes, 0.0, "stateward_api_writes_total moved in the steady window");
    let baseline_writes = report.baseline_writes_per_cr.expect("baseline ran");
    assert!(
        (baseline_writes - report.children_per_cr).abs() < 1e-9,
        "the loader's writes per resource {baseline_writes} differ from the planned children {}",
        report.children_per_cr
    );
    assert!(report.storm_secs.is_some(), "the change storm did not converge");
    assert!(report.p99_ms >= report.p50_ms && report.p50_ms > 0.0, "no reconcile histogram: {report:?}");
    assert!(report.peak_rss_mib > 0.0 && report.cpu_total_secs > 0.0);
    let _ = std::fs::remove_dir_all(&work_dir);
}
