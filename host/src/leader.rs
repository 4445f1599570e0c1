//! Leader election on a `coordination.k8s.io/v1` Lease, so that of several replicas only one
//! writes to the cluster.
//!
//! The protocol follows client-go's `leaderelection`: a candidate takes the Lease when it is
//! absent, released (empty holder), expired (unchanged for `leaseDurationSeconds` as this replica observed it) or
//! already its own; every write is a `replace` carrying the `resourceVersion` that was read,
//! so of two racing candidates the API server lets exactly one win (the other gets 409).
//! The leader renews every `retry_period`; if no renewal has succeeded for `renew_deadline`
//! it reports `false` before anyone else may take the Lease (`renew_deadline <
//! lease_duration`), so two replicas never both believe they lead.
//!
//! No wall clock is compared across machines (hardening finding 8): like client-go's
//! `observedTime`, a follower judges another holder's Lease by when *it* saw the Lease last
//! change (its `resourceVersion`), on its own monotonic clock, and takes it only once
//! `leaseDurationSeconds` have passed since without a change. A holder whose clock runs behind
//! (an old `renewTime`) keeps its Lease as long as it renews; one whose clock runs ahead loses
//! it a lease duration after it stops. The price, as in client-go: a replica that starts next
//! to a dead holder's Lease waits one lease duration before taking it. The leader's own
//! step-down uses the monotonic clock too, measured from before the renewal request was sent,
//! so it is conservative.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;

/// Where the Lease lives, who we are, and the timing (defaults as in client-go/kube-controller-manager).
#[derive(Debug, Clone)]
pub struct LeaderConfig {
    /// Namespace of the Lease (usually the operator's own).
    pub namespace: String,
    /// Name of the Lease shared by all replicas.
    pub lease_name: String,
    /// Unique per replica (e.g. the pod name), written to `holderIdentity`: replicas sharing one would both lead.
    pub identity: String,
    /// How long a Lease stays valid after its last renewal; followers wait this long.
    pub lease_duration: Duration,
    /// The leader steps down if it could not renew for this long; must be < `lease_duration`.
    pub renew_deadline: Duration,
    /// Interval between renewals (leader) and acquisition attempts (followers).
    pub retry_period: Duration,
}

impl LeaderConfig {
    /// A config with the default timing: 15 s lease, 10 s renew deadline, 2 s retry period.
    pub fn new(
        namespace: impl Into<String>,
        lease_name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        LeaderConfig {
            namespace: namespace.into(),
            lease_name: lease_name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Read side of the election: cheap to clone, one per task that must only write as leader.
#[derive(Debug, Clone)]
pub struct Leadership {
    rx: watch::Receiver<bool>,
}

impl Leadership {
    /// True while this replica holds the Lease. Check it right before each write; a write
    /// started while true still lands inside the Lease (the step-down margin is
    /// `lease_duration - renew_deadline`). False once the elector task is gone (e.g. aborted).
    pub fn is_leader(&self) -> bool {
        *self.rx.borrow() && self.rx.has_changed().is_ok()
    }

    /// Waits for the next change and returns the new state; `None` once the elector has
    /// stopped (leadership is then permanently false).
    pub async fn changed(&mut self) -> Option<bool> {
        self.rx.changed().await.ok()?;
        Some(*self.rx.borrow_and_update())
    }

    /// Waits until this replica leads: `true` when it does, `false` if the elector stopped first.
    pub async fn acquired(&mut self) -> bool {
        self.rx.wait_for(|leading| *leading).await.is_ok()
    }
}

#[cfg(test)]
impl Leadership {
    /// A replica that leads for as long as the returned sender lives, with no Lease behind it:
    /// for reconcile tests against a mocked API server.
    pub(crate) fn fixed(leading: bool) -> (Self, watch::Sender<bool>) {
        let (tx, rx) = watch::channel(leading);
        (Self { rx }, tx)
    }
}

/// Why one acquire/renew round failed (logged, then retried: never fatal).
#[derive(Debug, thiserror::Error)]
enum RoundError {
    #[error("lease API call failed: {0}")]
    Api(#[from] kube::Error),
    #[error("no answer within the renew deadline")]
    Timeout,
}

/// Starts the elector. Leadership is reported through the returned [`Leadership`]; the task
/// runs until `shutdown` completes, then steps down and releases the Lease (so a successor
/// takes over within one `retry_period` instead of waiting for expiry) and ends.
pub fn spawn(
    client: Client,
    cfg: LeaderConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> (Leadership, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(false);
    let cfg = sane(cfg);
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let handle = tokio::spawn(run(api, cfg, tx, shutdown));
    (Leadership { rx }, handle)
}

/// Repairs timings that would break the no-two-leaders guarantee (spawn cannot fail).
fn sane(mut cfg: LeaderConfig) -> LeaderConfig {
    let min = Duration::from_millis(100);
    cfg.lease_duration = cfg.lease_duration.max(Duration::from_secs(1));
    if cfg.renew_deadline >= cfg.lease_duration || cfg.renew_deadline < min {
        let fixed = cfg.lease_duration * 2 / 3;
        tracing::error!(lease = %cfg.lease_name, ?cfg.renew_deadline, ?fixed, "renew_deadline must be < lease_duration; using 2/3 of it");
        cfg.renew_deadline = fixed;
    }
    if cfg.retry_period >= cfg.renew_deadline || cfg.retry_period < min {
        let fixed = (cfg.renew_deadline / 4).max(min);
        tracing::error!(lease = %cfg.lease_name, ?cfg.retry_period, ?fixed, "retry_period must be < renew_deadline; using 1/4 of it");
        cfg.retry_period = fixed;
    }
    cfg
}

async fn run(
    api: Api<Lease>,
    cfg: LeaderConfig,
    tx: watch::Sender<bool>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    // Monotonic time just before the request of the last successful acquire/renew, while leading.
    let mut held_since: Option<Instant> = None;
    let mut observed = Observation::default();
    let mut failures: u32 = 0;
    loop {
        let started = Instant::now();
        // A leader's round may not outlive its deadline; a follower's is bounded likewise.
        let deadline = held_since.unwrap_or(started) + cfg.renew_deadline;
        let round = async {
            match tokio::time::timeout_at(deadline, try_acquire_or_renew(&api, &cfg, &mut observed)).await {
                Ok(r) => r,
                Err(_) => Err(RoundError::Timeout),
            }
        };
        let outcome = tokio::select! {
            r = round => r,
            () = &mut shutdown => break,
        };
        match outcome {
            Ok(true) => {
                if held_since.is_none() {
                    tracing::info!(lease = %cfg.lease_name, identity = %cfg.identity, "became leader");
                }
                held_since = Some(started);
                failures = 0;
            }
            Ok(false) => {
                if held_since.take().is_some() {
                    tracing::warn!(lease = %cfg.lease_name, identity = %cfg.identity, "lost the lease to another replica");
                }
                failures = 0;
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                tracing::warn!(lease = %cfg.lease_name, identity = %cfg.identity, failures, "leader election round failed: {e}");
            }
        }
        if held_since.is_some_and(|t| Instant::now() >= t + cfg.renew_deadline) {
            tracing::warn!(lease = %cfg.lease_name, identity = %cfg.identity, "could not renew within the renew deadline; stepping down");
            held_since = None;
        }
        let leading = held_since.is_some();
        tx.send_if_modified(|current| std::mem::replace(current, leading) != leading);
        // Leaders keep the steady cadence (their deadline is what matters); failing followers
        // back off exponentially up to 4 retry periods, so a takeover is still timely.
        let delay = match (held_since, failures) {
            (Some(_), _) | (None, 0) => cfg.retry_period,
            (None, n) => cfg.retry_period * 2u32.saturating_pow(n.min(3) - 1).min(4),
        };
        let mut wake = Instant::now() + delay;
        if let Some(t) = held_since {
            // Wake up at the deadline at the latest, so stepping down is never late.
            wake = wake.min(t + cfg.renew_deadline);
        }
        tokio::select! {
            () = tokio::time::sleep_until(wake) => {}
            () = &mut shutdown => break,
        }
    }
    // Step down first: from here on nobody may act on our leadership.
    tx.send_replace(false);
    let was_leader = held_since.is_some();
    match tokio::time::timeout(cfg.renew_deadline, release(&api, &cfg)).await {
        Ok(Ok(true)) => {
            tracing::info!(lease = %cfg.lease_name, identity = %cfg.identity, "released the lease")
        }
        Ok(Ok(false)) => {}
        Ok(Err(e)) => tracing::warn!(lease = %cfg.lease_name, was_leader, "could not release the lease: {e}"),
        Err(_) => tracing::warn!(lease = %cfg.lease_name, was_leader, "releasing the lease timed out"),
    }
}

fn now() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

/// Seconds for `leaseDurationSeconds`, rounded up (never shorter than configured).
fn whole_seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs() + u64::from(d.subsec_nanos() > 0)).unwrap_or(i32::MAX)
}

fn holder(spec: &LeaseSpec) -> &str {
    spec.holder_identity.as_deref().unwrap_or("")
}

/// What this replica last saw of the Lease, and when by its own monotonic clock (client-go's
/// `observedTime`): the only time another holder's Lease is judged by (see module docs).
#[derive(Debug, Default)]
struct Observation {
    /// The Lease's `resourceVersion` when last read: every renewal changes it.
    version: Option<String>,
    at: Option<Instant>,
}

impl Observation {
    /// Records a read of the Lease; the clock restarts only when the Lease changed.
    fn saw(&mut self, lease: &Lease) {
        if self.at.is_none() || self.version != lease.metadata.resource_version {
            self.version = lease.metadata.resource_version.clone();
            self.at = Some(Instant::now());
        }
    }

    /// Whether the Lease still protects its holder: a holder is named and it has changed within
    /// its `leaseDurationSeconds`, as this replica observed it.
    fn is_held(&self, spec: &LeaseSpec) -> bool {
        let (Some(at), Some(secs)) = (self.at, spec.lease_duration_seconds) else {
            return false;
        };
        let duration = Duration::from_secs(u64::try_from(secs).unwrap_or(0));
        !holder(spec).is_empty() && Instant::now() < at + duration
    }
}

/// A 409 means another writer got there first: we lost the race, nothing is wrong.
fn lost_race(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_conflict() || s.is_already_exists())
}

/// One round: `Ok(true)` if we hold the Lease afterwards, `Ok(false)` if someone else does.
async fn try_acquire_or_renew(
    api: &Api<Lease>,
    cfg: &LeaderConfig,
    observed: &mut Observation,
) -> Result<bool, RoundError> {
    let ours = |transitions, acquired| LeaseSpec {
        holder_identity: Some(cfg.identity.clone()),
        lease_duration_seconds: Some(whole_seconds(cfg.lease_duration)),
        acquire_time: Some(acquired),
        renew_time: Some(now()),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    };
    let Some(mut lease) = api.get_opt(&cfg.lease_name).await? else {
        let lease = Lease {
            metadata: ObjectMeta { name: Some(cfg.lease_name.clone()), ..ObjectMeta::default() },
            spec: Some(ours(0, now())),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(e) if lost_race(&e) => Ok(false),
            Err(e) => Err(e.into()),
        };
    };
    observed.saw(&lease);
    let old = lease.spec.take().unwrap_or_default();
    let mine = holder(&old) == cfg.identity;
    if !mine && observed.is_held(&old) {
        return Ok(false);
    }
    let transitions = old.lease_transitions.unwrap_or(0);
    lease.spec = Some(if mine {
        ours(transitions, old.acquire_time.unwrap_or_else(now))
    } else {
        ours(transitions.saturating_add(1), now())
    });
    // `lease.metadata.resourceVersion` is the one we read: the replace is a compare-and-swap.
    match api.replace(&cfg.lease_name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(e) if lost_race(&e) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Empties `holderIdentity` if we still hold the Lease, so a follower takes it on its next
/// round; `Ok(false)` when there was nothing of ours to release.
async fn release(api: &Api<Lease>, cfg: &LeaderConfig) -> Result<bool, kube::Error> {
    let Some(mut lease) = api.get_opt(&cfg.lease_name).await? else {
        return Ok(false);
    };
    let Some(spec) = lease.spec.as_mut().filter(|s| holder(s) == cfg.identity) else {
        return Ok(false);
    };
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(now());
    match api.replace(&cfg.lease_name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(e) if lost_race(&e) => Ok(false),
        Err(e) => Err(e),
    }
}
