//! Sentinel, which performs the failovers of replication mode.
//!
//! **Where the Sentinels run: one in every Redis pod, as a second process of its container**,
//! not as a second StatefulSet. Why:
//! - the SDK builds one StatefulSet per resource and the host knows nothing of any service:
//!   a second StatefulSet would be a Redis-shaped feature of the generic parts;
//! - the plugin asks the Sentinels through the same `exec` into the `redis` container, with the
//!   one tool the policy allows it (`redis-cli`), and they read the password from the same
//!   in-memory file as the server;
//! - the number of Sentinels follows `spec.replicas`, so there is nothing else to size, place
//!   or spread: the pods' anti-affinity already spreads the Sentinels.
//!
//! The cost: the master's pod takes its Sentinel with it, so the others must still be a
//! majority of all Sentinels (the failover is authorized by a majority, whatever the quorum):
//! replication mode needs 3 pods at least ([`crate::spec::MIN_REPLICATION_PODS`]). A second
//! container would be cleaner than a second process; the SDK makes one container per pod, and
//! the entry script keeps the Sentinel running (started again a second after it exits).
//!
//! Every Sentinel's file is written at the container's start into the pod's in-memory run
//! directory (Sentinel rewrites it as it learns): the master it monitors is the one the other
//! Sentinels name then, or pod 0 when none answers (the cluster's first start). Addresses are
//! the pods' stable names through the headless Service (`resolve-hostnames`,
//! `announce-hostnames`, the servers' `replica-announce-ip`): a pod made again keeps its name,
//! not its IP.

use stateward_sdk::builders::Ctx;

use crate::spec;

/// Sentinel's port, in every pod of replication mode.
pub const PORT: u16 = 6_379 + 20_000;
/// The name the Sentinels know the master by.
pub const MASTER_NAME: &str = "primary";

/// The lines of sentinel.conf before `sentinel monitor`, which does not depend on the pod.
pub fn global_settings(ctx: &Ctx) -> Vec<String> {
    vec![
        format!("port {PORT}"),
        format!("bind {}", crate::config::bind(ctx)),
        "daemonize no".into(),
        "logfile \"\"".into(),
        "sentinel resolve-hostnames yes".into(),
        "sentinel announce-hostnames yes".into(),
    ]
}

/// The quorum `sentinel monitor` is given.
pub fn quorum(ctx: &Ctx) -> i64 {
    spec::sentinel(&ctx.cluster.spec.raw, ctx.cluster.spec.replicas).quorum
}

/// The lines of sentinel.conf after `sentinel monitor` (they name the master it declares).
pub fn master_settings(ctx: &Ctx) -> Vec<String> {
    let s = spec::sentinel(&ctx.cluster.spec.raw, ctx.cluster.spec.replicas);
    vec![
        format!("sentinel down-after-milliseconds {MASTER_NAME} {}", s.down_after_ms),
        format!("sentinel failover-timeout {MASTER_NAME} {}", s.failover_timeout_ms),
        format!("sentinel parallel-syncs {MASTER_NAME} 1"),
    ]
}
