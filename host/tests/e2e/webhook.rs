//! What the webhook tests share: an operator whose admission webhook listens on a loopback port
//! with a ValidatingWebhookConfiguration of the test's own, and waiting until it serves.
#![allow(clippy::expect_used)]

use std::time::{Duration, Instant};

use anyhow::bail;
use kube::api::{DynamicObject, PostParams};
use kube::Api;
use serde_json::Value;
use stateward_testkit::TestEnv;

use crate::e2e::{Operator, OperatorOpts, POSTGRES};

/// Deletes the test's ValidatingWebhookConfiguration when the test ends (before the
/// namespace teardown, which must be able to change the custom resources).
pub struct VwcGuard {
    kubectl: std::process::Command,
}

impl VwcGuard {
    pub fn new(env: &TestEnv) -> VwcGuard {
        Self::named(env, &vwc_name(env))
    }

    /// The guard of another configuration of the test's (a second replica's).
    pub fn named(env: &TestEnv, name: &str) -> VwcGuard {
        let mut kubectl = env.kubectl();
        kubectl.args(["delete", "validatingwebhookconfiguration", name, "--ignore-not-found"]);
        VwcGuard { kubectl }
    }
}

impl Drop for VwcGuard {
    fn drop(&mut self) {
        let _ = self.kubectl.output();
    }
}

pub fn vwc_name(env: &TestEnv) -> String {
    format!("stateward-{}", env.namespace)
}

/// Starts an operator for the test namespace whose webhook listens on `port`.
pub fn webhook_operator(env: &TestEnv, name: &str, port: u16, extra: &[&str]) -> Operator {
    let mut args: Vec<String> = vec![
        "--webhook-addr".into(),
        format!("127.0.0.1:{port}"),
        "--webhook-url".into(),
        format!("https://127.0.0.1:{port}"),
        "--webhook-configuration".into(),
        vwc_name(env),
        "--webhook-configure".into(),
        "validating".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    Operator::start_with(
        env,
        name,
        OperatorOpts {
            namespace: env.namespace.clone(),
            lease_namespace: env.namespace.clone(),
            webhook_args: args,
            ..Default::default()
        },
    )
}

pub fn pg_api(env: &TestEnv) -> Api<DynamicObject> {
    POSTGRES.api(env)
}

pub fn object(v: &Value) -> DynamicObject {
    serde_json::from_value(v.clone()).expect("manifest is an object")
}

pub fn dry_run() -> PostParams {
    PostParams { dry_run: true, field_manager: None }
}

/// Waits until the API server calls the webhook successfully (configuration applied, CA
/// trusted, server up): a server-side dry-run create goes through.
pub async fn wait_webhook_ready(env: &TestEnv, op: &mut Operator) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let api = pg_api(env);
    let probe = object(&POSTGRES.manifest("probe", 3, "Retain"));
    let vwcs: Api<DynamicObject> = Api::all_with(
        env.client.clone(),
        &kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk(
                "admissionregistration.k8s.io",
                "v1",
                "ValidatingWebhookConfiguration",
            ),
            "validatingwebhookconfigurations",
        ),
    );
    loop {
        if let Some(status) = op.exited() {
            bail!("operator exited with {status}:\n{}", op.log_tail(40));
        }
        let configured = vwcs.get_opt(&vwc_name(env)).await?.is_some();
        if configured && api.create(&dry_run(), &probe).await.is_ok() {
            return Ok(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(90) {
            bail!("webhook not serving after 90 s:\n{}", op.log_tail(40));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
