//! Leader election against the real API server of the local cluster (stateward-testkit):
//! mutual exclusion, takeover after a crash and after a graceful release, API failures.
//! Default timings (15 s lease, 10 s deadline, 2 s retry) so the measured takeover times are
//! the ones production gets. Run: `cargo test -p stateward --test kwok -- leader:: --nocapture`.

use std::time::Duration;

use anyhow::{ensure, Context as _};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use stateward::leader::{self, LeaderConfig, Leadership};
use stateward_testkit::TestEnv;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

const LEASE: &str = "stateward-leader";

/// A running elector plus the switch for its graceful shutdown.
struct Elector {
    leadership: Leadership,
    handle: JoinHandle<()>,
    stop: oneshot::Sender<()>,
}

fn start(client: kube::Client, cfg: LeaderConfig) -> Elector {
    let (stop, stopped) = oneshot::channel::<()>();
    let (leadership, handle) = leader::spawn(client, cfg, async {
        let _ = stopped.await;
    });
    Elector { leadership, handle, stop }
}

fn elector(env: &TestEnv, identity: &str) -> Elector {
    start(env.client.clone(), LeaderConfig::new(&env.namespace, LEASE, identity))
}

/// Polls every 50 ms until `cond` holds; returns the time it took, or fails after `limit`.
async fn wait_for(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) -> anyhow::Result<Duration> {
    let start = Instant::now();
    while !cond() {
        ensure!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(start.elapsed())
}

async fn lease(env: &TestEnv) -> anyhow::Result<(String, i32)> {
    let lease = env.api::<Lease>().get(LEASE).await?;
    let spec = lease.spec.context("lease without spec")?;
    Ok((spec.holder_identity.unwrap_or_default(), spec.lease_transitions.unwrap_or(0)))
}

async fn stop(e: Elector) -> anyhow::Result<()> {
    let _ = e.stop.send(());
    tokio::time::timeout(Duration::from_secs(15), e.handle).await.context("elector did not stop")??;
    ensure!(!e.leadership.is_leader(), "still leader after shutdown");
    Ok(())
}

/// Two electors race for a fresh Lease: from the first acquisition on, exactly one of them
/// leads at every sample, and it is the one named in the Lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_leader_at_a_time() -> anyhow::Result<()> {
    let env = TestEnv::new("leader-one").await?;
    let (a, b) = (elector(&env, "replica-a"), elector(&env, "replica-b"));
    let took = wait_for(Duration::from_secs(20), "first leader", || {
        a.leadership.is_leader() || b.leadership.is_leader()
    })
    .await?;
    println!("first acquisition of a fresh lease after {took:?}");
    for i in 0..100 {
        let (la, lb) = (a.leadership.is_leader(), b.leadership.is_leader());
        ensure!(la != lb, "sample {i}: replica-a leads={la}, replica-b leads={lb}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let leader = if a.leadership.is_leader() { "replica-a" } else { "replica-b" };
    let (holder, transitions) = lease(&env).await?;
    ensure!(holder == leader, "lease names {holder}, but {leader} believes it leads");
    ensure!(transitions == 0, "leadership changed hands {transitions} times in 10 s");
    stop(a).await?;
    stop(b).await?;
    Ok(())
}

/// The leader's task is aborted without releasing (a `kill -9`): the follower must wait for
/// the Lease to expire (not steal it early) and then take over within 20 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_after_crash_within_20s() -> anyhow::Result<()> {
    let env = TestEnv::new("leader-crash").await?;
    let a = elector(&env, "replica-a");
    wait_for(Duration::from_secs(20), "replica-a leads", || a.leadership.is_leader()).await?;
    let b = elector(&env, "replica-b");
    tokio::time::sleep(Duration::from_secs(3)).await;
    ensure!(!b.leadership.is_leader(), "replica-b leads while replica-a holds the lease");
    let (_, before) = lease(&env).await?;

    a.handle.abort();
    let took = wait_for(Duration::from_secs(25), "replica-b takes over", || b.leadership.is_leader()).await?;
    println!("takeover after the leader was killed: {took:?}");
    ensure!(!a.leadership.is_leader(), "an aborted elector must not report leadership");
    ensure!(took <= Duration::from_secs(20), "takeover took {took:?} > 20 s");
    // The lease was renewed at most one retry period before the kill, so it was valid for
    // at least 15 - 2 = 13 s more; taking it much earlier would mean two writers.
    ensure!(took >= Duration::from_secs(12), "took over after {took:?}: the lease was still valid");
    let (holder, after) = lease(&env).await?;
    ensure!(holder == "replica-b", "lease holder is {holder}");
    ensure!(after == before + 1, "leaseTransitions {before} -> {after}");
    stop(b).await
}

/// Graceful shutdown releases the Lease, so the follower takes over on its next round
/// instead of waiting for expiry; at no sample do both lead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_after_release_within_one_retry() -> anyhow::Result<()> {
    let env = TestEnv::new("leader-release").await?;
    let a = elector(&env, "replica-a");
    wait_for(Duration::from_secs(20), "replica-a leads", || a.leadership.is_leader()).await?;
    let b = elector(&env, "replica-b");
    tokio::time::sleep(Duration::from_secs(3)).await;
    ensure!(!b.leadership.is_leader(), "replica-b leads while replica-a holds the lease");
    let (_, before) = lease(&env).await?;

    let a_view = a.leadership.clone();
    let started = Instant::now();
    let _ = a.stop.send(());
    let took = wait_for(Duration::from_secs(15), "replica-b takes over", || b.leadership.is_leader()).await?;
    ensure!(!a_view.is_leader(), "both lead after the release");
    tokio::time::timeout(Duration::from_secs(15), a.handle).await.context("replica-a did not stop")??;
    println!("takeover after a graceful release: {:?}", started.elapsed());
    let retry = LeaderConfig::new("", "", "").retry_period;
    // Taken at the next retry: a figure against the retry period and 1 s; the ceiling is liveness.
    stateward_testkit::report::seconds(
        "leader.takeover_after_release",
        took,
        Some(retry + Duration::from_secs(1)),
    );
    ensure!(took <= retry * 3 + Duration::from_secs(3), "takeover took {took:?} > 3 retry periods + 3 s");
    let (holder, after) = lease(&env).await?;
    ensure!(holder == "replica-b", "lease holder is {holder}");
    ensure!(after == before + 1, "leaseTransitions {before} -> {after}");
    stop(b).await
}

/// A Lease left behind by a dead holder is taken once it has not changed for its
/// `leaseDurationSeconds` as the candidate observed it (client-go's rule), counting the
/// transition, whatever its `renewTime` says; a Lease another holder renews is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_lease_is_taken_valid_one_is_not() -> anyhow::Result<()> {
    let env = TestEnv::new("leader-expired").await?;
    let leases: Api<Lease> = env.api();
    let pp = kube::api::PostParams::default();
    let old = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(60);
    leases.create(&pp, &foreign(LEASE, 4, old)?).await?;
    leases.create(&pp, &foreign("held", 4, jiff::Timestamp::now())?).await?;
    let renewing = keep_renewing(leases.clone(), "held", jiff::SignedDuration::ZERO);

    let a = elector(&env, "replica-a");
    let b = start(env.client.clone(), LeaderConfig::new(&env.namespace, "held", "replica-b"));
    let took = wait_for(Duration::from_secs(10), "expired lease taken", || a.leadership.is_leader()).await?;
    println!("dead holder's lease (renewTime 60 s ago, 4 s lease) taken after {took:?}");
    ensure!(took >= Duration::from_secs(4), "taken after {took:?}, before it went unchanged for 4 s");
    let (holder, transitions) = lease(&env).await?;
    ensure!(holder == "replica-a" && transitions == 8, "lease: {holder}, transitions {transitions}");
    ensure!(!b.leadership.is_leader(), "replica-b took a lease another holder renews");
    let held = leases.get("held").await?.spec.and_then(|s| s.holder_identity);
    ensure!(held.as_deref() == Some("ghost"), "renewed lease now held by {held:?}");
    renewing.abort();
    stop(a).await?;
    stop(b).await
}

/// Hardening finding 8: clock skew does not make two leaders. A live holder whose wall clock
/// runs 60 s behind (every `renewTime` it writes is a minute old) keeps its Lease while it
/// renews; it is taken only a lease duration after its last renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_with_a_slow_clock_keeps_its_lease_while_it_renews() -> anyhow::Result<()> {
    let env = TestEnv::new("leader-skew").await?;
    let leases: Api<Lease> = env.api();
    let skew = jiff::SignedDuration::from_secs(-60);
    leases
        .create(&kube::api::PostParams::default(), &foreign(LEASE, 4, jiff::Timestamp::now() + skew)?)
        .await?;
    let renewing = keep_renewing(leases.clone(), LEASE, skew);
    let a = elector(&env, "replica-a");
    for i in 0..80 {
        ensure!(!a.leadership.is_leader(), "sample {i}: took a lease its holder renews (clock 60 s slow)");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    renewing.abort();
    let stopped = Instant::now();
    let took =
        wait_for(Duration::from_secs(15), "takeover after the holder stopped", || a.leadership.is_leader())
            .await?;
    println!(
        "holder with a 60 s slow clock: kept its lease for 8 s of renewals, taken {took:?} after it stopped"
    );
    ensure!(
        stopped.elapsed() >= Duration::from_secs(3),
        "taken {took:?} after the last renewal, within its 4 s lease"
    );
    stop(a).await
}

/// A Lease held by "ghost" for `secs` seconds, renewed at `renewed`.
fn foreign(name: &str, secs: i32, renewed: jiff::Timestamp) -> anyhow::Result<Lease> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "spec": { "holderIdentity": "ghost", "leaseDurationSeconds": secs, "leaseTransitions": 7,
                  "renewTime": micro_time(renewed) }
    }))?)
}

fn micro_time(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// Renews "ghost"'s Lease `name` every second, writing its own clock (`now + skew`).
fn keep_renewing(leases: Api<Lease>, name: &str, skew: jiff::SignedDuration) -> JoinHandle<()> {
    let name = name.to_string();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let patch =
                serde_json::json!({ "spec": { "renewTime": micro_time(jiff::Timestamp::now() + skew) } });
            let _ = leases
                .patch(&name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
                .await;
        }
    })
}

/// With the API server unreachable every round fails: the elector logs and retries, never
/// panics or exits on its own, never claims leadership, and still shuts down on request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_errors_never_make_a_leader() -> anyhow::Result<()> {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.local_addr()?.port()
    };
    let config = kube::Config::new(format!("http://127.0.0.1:{closed}").parse()?);
    let client = kube::Client::try_from(config)?;
    let mut cfg = LeaderConfig::new("default", LEASE, "replica-a");
    cfg.lease_duration = Duration::from_secs(3);
    cfg.renew_deadline = Duration::from_secs(2);
    cfg.retry_period = Duration::from_millis(200);
    let e = start(client, cfg);
    for i in 0..40 {
        ensure!(!e.leadership.is_leader(), "sample {i}: leader without an API server");
        ensure!(!e.handle.is_finished(), "sample {i}: the elector ended on its own");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop(e).await
}

/// A loopback TCP forwarder to the API server that can be "cut": from then on, every open
/// and new connection hangs (no data, no reset), like a network partition.
async fn partitionable(target: String) -> anyhow::Result<(u16, tokio::sync::watch::Sender<bool>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let (cut, cut_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let (target, mut cut_rx) = (target.clone(), cut_rx.clone());
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                    if !*cut_rx.borrow() {
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => return,
                            _ = cut_rx.wait_for(|c| *c) => {}
                        }
                    }
                    // Partitioned: keep both sockets open and silent until the test ends.
                    std::future::pending::<()>().await;
                }
            });
        }
    });
    Ok((port, cut))
}

/// The leader loses the API server (hanging connections): it must step down within the
/// renew deadline, before the Lease expires, and only then may the follower take over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_leader_steps_down_before_takeover() -> anyhow::Result<()> {
    let env = TestEnv::new("leader-partition").await?;
    let kubeconfig = kube::config::Kubeconfig::read_from(env.kubeconfig())?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    let api_server = config.cluster_url.authority().context("API server URL without host")?.to_string();
    let (port, cut) = partitionable(api_server).await?;
    config.cluster_url = format!("https://127.0.0.1:{port}").parse()?;
    let cfg = LeaderConfig::new(&env.namespace, LEASE, "replica-a");
    let (renew_deadline, lease_duration) = (cfg.renew_deadline, cfg.lease_duration);
    let a = start(kube::Client::try_from(config)?, cfg);
    wait_for(Duration::from_secs(20), "replica-a leads", || a.leadership.is_leader()).await?;
    let b = elector(&env, "replica-b");
    tokio::time::sleep(Duration::from_secs(3)).await;
    ensure!(a.leadership.is_leader() && !b.leadership.is_leader(), "replica-a should still lead");

    let cut_at = Instant::now();
    cut.send_replace(true);
    let mut stepped_down = None;
    while !b.leadership.is_leader() {
        let la = a.leadership.is_leader();
        ensure!(!(la && b.leadership.is_leader()), "both lead {:?} after the cut", cut_at.elapsed());
        if !la && stepped_down.is_none() {
            stepped_down = Some(cut_at.elapsed());
        }
        ensure!(cut_at.elapsed() < Duration::from_secs(25), "replica-b did not take over");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = cut_at.elapsed();
    let stepped_down = stepped_down.context("replica-b leads while replica-a never stepped down")?;
    println!("partition: leader stepped down after {stepped_down:?}, follower took over after {took:?}");
    // The last renewal succeeded at most one retry period before the cut.
    ensure!(
        stepped_down <= renew_deadline + Duration::from_millis(500),
        "stepped down late: {stepped_down:?}"
    );
    ensure!(took <= lease_duration + Duration::from_secs(5), "takeover took {took:?}");
    ensure!(!a.leadership.is_leader(), "replica-a leads again while partitioned");
    a.handle.abort();
    stop(b).await
}
