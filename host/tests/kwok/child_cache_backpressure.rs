//! The child caches keep up after more than a channel's worth of child events.
//!
//! kube's shared reflector waits for its slowest subscriber once the 1024-slot channel is full.
//! The operator used to keep one subscription per child kind that nobody read, so after 1024
//! events on any child kind that cache froze for good: at 300 resources (benches/scale.rs)
//! every StatefulSet became ready while the operator kept reporting 0 ready pods. Here 1100
//! events go to one ConfigMap carrying the instance label; the operator must then still see a
//! child of a real resource on that same stream being deleted, and recreate it.
#![allow(clippy::expect_used)]

use crate::e2e;

use std::time::Duration;

use e2e::*;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::json;
use stateward_testkit::TestEnv;

/// More events than kube's shared-stream channel holds (1024).
const NOISE_EVENTS: usize = 1100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_cache_keeps_up_after_more_than_a_channel_of_events() {
    let env = TestEnv::new("e2e-backpressure").await.expect("test env");
    let _teardown = Teardown::new(&env);
    let mut op = Operator::start(&env, "backpressure");
    op.wait_ready(Duration::from_secs(120)).await;
    let name = "steady";
    apply(&env, &env.namespace, &REDIS.manifest(name, 1, "Delete"));
    let took = wait_running(&env, REDIS, name, 1, Duration::from_secs(180)).await;
    eprintln!("e2e[backpressure]: Running in {took:.1?}");

    // A labelled ConfigMap of an instance that does not exist, changed NOISE_EVENTS times:
    // every change is one event on the ConfigMap stream.
    let cms: Api<ConfigMap> = env.api();
    let noise: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "noise", "labels": {INSTANCE_LABEL: "no-such-instance"}}
    }))
    .expect("configmap");
    cms.create(&PostParams::default(), &noise).await.expect("create noise ConfigMap");
    futures::stream::iter(0..NOISE_EVENTS)
        .map(|i| {
            let cms = cms.clone();
            async move {
                let patch = json!({"data": {"n": i.to_string()}});
                cms.patch("noise", &PatchParams::default(), &Patch::Merge(&patch)).await
            }
        })
        .buffered(8)
        .try_collect::<Vec<_>>()
        .await
        .expect("patch noise ConfigMap");
    eprintln!("e2e[backpressure]: {NOISE_EVENTS} ConfigMap changes made");

    // The ConfigMap cache still follows the API: the operator sees the resource's own
    // ConfigMap deleted (a frozen cache would neither announce it nor show it gone) and
    // recreates it.
    let config = format!("{name}-config");
    let before = cms.get(&config).await.expect("the resource's ConfigMap").metadata.uid;
    cms.delete(&config, &DeleteParams::default()).await.expect("delete the resource's ConfigMap");
    let (_, took) = wait_for("the deleted ConfigMap to be recreated", Duration::from_secs(60), || {
        let (cms, config, before) = (cms.clone(), config.clone(), before.clone());
        async move {
            match cms.get_opt(&config).await.map_err(|e| e.to_string())? {
                Some(c) if c.metadata.uid != before && c.metadata.deletion_timestamp.is_none() => Ok(()),
                Some(_) => Err("still the old ConfigMap".to_string()),
                None => Err("no ConfigMap".to_string()),
            }
        }
    })
    .await;
    eprintln!("e2e[backpressure]: ConfigMap recreated {took:.1?} after its deletion");
    assert!(op.exited().is_none(), "operator died");
}
