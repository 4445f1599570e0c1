//! Tests that take away or change what every test of the local cluster shares: the API server
//! itself (restarted), the CRDs' conversion webhook, and the machine (the webhook flood). Cargo runs test binaries one after
//! another, so no other test runs beside these; [`alone`] keeps them from running beside each
//! other.
//!
//! Run: `scripts/build-plugins && cargo test -p stateward --test cluster_wide`.

#[path = "../e2e/mod.rs"]
mod e2e;
#[path = "../e2e/webhook.rs"]
mod webhook_env;

mod apiserver_restart;
mod webhook_conversion;
mod webhook_flood;

static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Held for the whole of each test here: one at a time, whatever `--test-threads` says.
pub async fn alone() -> tokio::sync::MutexGuard<'static, ()> {
    ALONE.lock().await
}
