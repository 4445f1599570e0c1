//! CRD conversion through the webhook against the local cluster's real kube-apiserver
//! (issue 7): v1alpha1 ⇄ v1 served by the plugin that owns the kind.
//!
//! Conversion config lives on the CRDs, which are cluster-scoped and shared by every test.
//! So it runs in `cluster_wide`, alone: cargo runs test binaries one after another, so while
//! it points the CRDs at its own operator (`--webhook-configure all`, a loopback URL) no other
//! test of the suite runs. When it ends, the CRDs get back the conversion
//! stanza of deploy/crds (the webhook Service, no caBundle) and deploy/crds is re-applied
//! (storage back on v1), whatever happened. Other tests only use v1, the storage version, for
//! which the API server never calls the converter, so the Service reference left in place
//! (unreachable in the test cluster) never matters to them.
//!
//! Shown: create as v1alpha1 → read as v1 → update as v1 → read as v1alpha1 → update as
//! v1alpha1 → read as v1, each answer equal to the plugin's own `convert` and no field lost;
//! objects stored at v1alpha1 (storage switched for a moment) read back as v1 and a v1 object
//! stored as v1alpha1 keeps its v1-only field; a list at v1alpha1 converts every item.
//!
//! Run: `cargo test -p stateward --test cluster_wide -- webhook_conversion:: --nocapture`.

use crate::e2e;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use e2e::{Operator, OperatorOpts, Teardown, KINDS, POSTGRES};
use kube::api::{Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::Api;
use serde_json::{json, Value};
use stateward::runtime::{AllocatorKind, Limits, Registry, Sandbox};
use stateward::webhook::{config::crd_conversion, Endpoint};
use stateward_testkit::TestEnv;

/// Puts deploy/crds' conversion stanza back on the shared CRDs (runs after the operator is
/// gone, so it cannot re-patch them) and deletes the test's webhook configuration.
struct Restore {
    kubeconfig: std::path::PathBuf,
    vwc: String,
}

impl Drop for Restore {
    fn drop(&mut self) {
        let mut conversion = crd_conversion(&Endpoint::default(), None);
        conversion["webhook"]["clientConfig"]["url"] = Value::Null;
        conversion["webhook"]["clientConfig"]["caBundle"] = Value::Null;
        let patch = json!({ "spec": { "conversion": conversion } }).to_string();
        let kubectl = || {
            let mut c = std::process::Command::new(stateward_testkit::kubectl_binary());
            c.arg("--kubeconfig").arg(&self.kubeconfig);
            c
        };
        for kind in KINDS {
            let out = kubectl()
                .args([
                    "patch",
                    "crd",
                    &format!("{}.stateward.dev", kind.plural),
                    "--type",
                    "merge",
                    "-p",
                    &patch,
                ])
                .output();
            if !out.as_ref().is_ok_and(|o| o.status.success()) {
                eprintln!("could not restore the conversion of {}: {out:?}", kind.plural);
            }
        }
        // Then deploy/crds as the e2e tests apply them (storage flags back to v1).
        let crds = e2e::workspace_root().join("deploy").join("crds");
        let out = kubectl()
            .args(["apply", "--server-side", "--force-conflicts", "--field-manager", "stateward-e2e", "-f"])
            .arg(&crds)
            .output();
        if !out.as_ref().is_ok_and(|o| o.status.success()) {
            eprintln!("could not re-apply {}: {out:?}", crds.display());
        }
        let _ = kubectl()
            .args(["delete", "validatingwebhookconfiguration", &self.vwc, "--ignore-not-found"])
            .output();
    }
}

/// Writes every PostgresCluster of the test again at v1, the storage version once more.
/// Anything written while v1alpha1 was stored (the objects made then, and any status or
/// finalizer write the operator made meanwhile) is encoded as v1alpha1 in etcd; once Restore
/// points the conversion at the absent webhook Service, the API server could not list the kind
/// at all, for every later test. (stored-from-v1 has deletionProtection and outlives the test
/// until its namespace goes.)
async fn migrate_to_v1(v1: &Api<DynamicObject>) -> anyhow::Result<()> {
    let stamp = json!({"metadata": {"annotations": {"stateward.test/rewritten-at": "v1"}}});
    for item in v1.list(&Default::default()).await?.items {
        let name = item.metadata.name.clone().unwrap_or_default();
        match v1.patch(&name, &PatchParams::default(), &Patch::Merge(&stamp)).await {
            Ok(_) => {}
            // Deleted meanwhile (stored-alpha, once its finalizer is gone): nothing left to rewrite.
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => return Err(e).with_context(|| format!("rewriting {name} at v1")),
        }
    }
    Ok(())
}

fn api(env: &TestEnv, version: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("stateward.dev", version, POSTGRES.kind),
        POSTGRES.plural,
    );
    Api::namespaced_with(env.client.clone(), &env.namespace, &ar)
}

async fn get(env: &TestEnv, version: &str, name: &str) -> anyhow::Result<Value> {
    Ok(serde_json::to_value(api(env, version).get(name).await?)?)
}

fn registry() -> anyhow::Result<Registry> {
    let sandbox = Sandbox::new(Limits::default(), AllocatorKind::OnDemand, None)?;
    Ok(Registry::load_dir(&sandbox, &e2e::plugin_dir())?)
}

/// What the plugin itself makes of `object` at `to` (the reference the API server's answer
/// must match: the same function the plugin's round-trip tests check).
fn convert(registry: &Registry, object: &Value, to: &str) -> anyhow::Result<Value> {
    let plugin = registry.get("stateward.dev", POSTGRES.kind).context("postgres plugin")?;
    Ok(plugin.convert(&object.to_string(), &format!("stateward.dev/{to}"))?)
}

/// Makes `version` the storage version of the PostgresCluster CRD and waits until the API
/// server records it in status.storedVersions (the handler serves with it from then on).
async fn set_storage(env: &TestEnv, version: &str) -> anyhow::Result<()> {
    let crds: Api<DynamicObject> = Api::all_with(
        env.client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
            "customresourcedefinitions",
        ),
    );
    let name = "postgresclusters.stateward.dev";
    let crd = serde_json::to_value(crds.get(name).await?)?;
    let mut versions = crd["spec"]["versions"].as_array().cloned().context("versions")?;
    for v in &mut versions {
        v["storage"] = json!(v["name"] == version);
    }
    crds.patch(name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"versions": versions}}))).await?;
    let started = Instant::now();
    loop {
        let crd = serde_json::to_value(crds.get(name).await?)?;
        if crd["status"]["storedVersions"].as_array().is_some_and(|s| s.iter().any(|v| v == version)) {
            // The handler swaps storage asynchronously after the CRD update.
            tokio::time::sleep(Duration::from_secs(2)).await;
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(30) {
            bail!("storage version {version} never recorded");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn v1alpha1_and_v1_round_trip_through_the_conversion_webhook() -> anyhow::Result<()> {
    let _alone = crate::alone().await;
    let env = TestEnv::new("wh-convert").await?;
    let _teardown = Teardown::new(&env);
    let vwc = format!("stateward-{}", env.namespace);
    let _restore = Restore { kubeconfig: env.kubeconfig().to_path_buf(), vwc: vwc.clone() };
    let port = e2e::free_port();
    let url = format!("https://127.0.0.1:{port}");
    let mut op = Operator::start_with(
        &env,
        "wh-convert",
        OperatorOpts {
            namespace: env.namespace.clone(),
            lease_namespace: env.namespace.clone(),
            webhook_args: [
                "--webhook-addr",
                &format!("127.0.0.1:{port}"),
                "--webhook-url",
                &url,
                "--webhook-configuration",
                &vwc,
                "--webhook-configure",
                "all",
            ]
            .map(String::from)
            .to_vec(),
            ..Default::default()
        },
    );

    let legacy = json!({
        "apiVersion": "stateward.dev/v1alpha1",
        "kind": POSTGRES.kind,
        "metadata": { "name": "legacy" },
        "spec": {
            "version": "17.2", "replicas": 3, "storageSize": "1Gi", "storageClassName": "local",
            "retentionPolicy": "Retain",
            "resources": { "requests": { "cpu": "50m", "memory": "64Mi" }, "limits": { "cpu": "250m", "memory": "128Mi" } },
        },
    });
    let legacy_obj: DynamicObject = serde_json::from_value(legacy.clone())?;
    // Ready when the API server accepts a v1alpha1 object through our converter (the CRD
    // change reaches its handlers asynchronously).
    let started = Instant::now();
    let alpha = api(&env, "v1alpha1");
    loop {
        if let Some(status) = op.exited() {
            bail!("operator exited with {status}:\n{}", op.log_tail(40));
        }
        let pp = PostParams { dry_run: true, field_manager: None };
        match alpha.create(&pp, &legacy_obj).await {
            Ok(_) => break,
            Err(e) if started.elapsed() > Duration::from_secs(90) => {
                bail!("conversion never worked: {e}\n{}", op.log_tail(40))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
    let crd: Value = serde_json::to_value(
        Api::<DynamicObject>::all_with(
            env.client.clone(),
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
                "customresourcedefinitions",
            ),
        )
        .get("postgresclusters.stateward.dev")
        .await?,
    )?;
    let client_config = &crd["spec"]["conversion"]["webhook"]["clientConfig"];
    ensure!(client_config["url"] == format!("{url}/convert"), "CRD clientConfig {client_config}");
    ensure!(client_config["caBundle"].as_str().is_some_and(|b| !b.is_empty()), "no caBundle injected");
    eprintln!("conversion webhook effective {:.1?} after start", started.elapsed());

    let registry = Arc::new(registry()?);
    // 1. Create as v1alpha1, read as v1.
    alpha.create(&PostParams::default(), &legacy_obj).await.context("create as v1alpha1")?;
    let as_alpha = get(&env, "v1alpha1", "legacy").await?;
    let as_v1 = get(&env, "v1", "legacy").await?;
    ensure!(
        as_v1["spec"]["storage"] == json!({"size": "1Gi", "className": "local"}),
        "v1 storage: {}",
        as_v1["spec"]
    );
    ensure!(as_v1["spec"].get("storageSize").is_none(), "v1 kept the v1alpha1 field: {}", as_v1["spec"]);
    let expected = convert(&registry, &as_alpha, "v1")?;
    ensure!(
        as_v1["spec"] == expected["spec"],
        "served v1 {} != plugin's {}",
        as_v1["spec"],
        expected["spec"]
    );
    ensure!(
        as_alpha["spec"] == legacy["spec"],
        "v1alpha1 read back {} != created {}",
        as_alpha["spec"],
        legacy["spec"]
    );

    // 2. Update as v1 with a field v1alpha1 cannot hold, read as v1alpha1.
    let v1 = api(&env, "v1");
    v1.patch(
        "legacy",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"deletionProtection": true, "replicas": 4}})),
    )
    .await
    .context("update as v1")?;
    let updated_v1 = get(&env, "v1", "legacy").await?;
    let as_alpha = get(&env, "v1alpha1", "legacy").await?;
    ensure!(
        as_alpha["spec"].get("deletionProtection").is_none(),
        "v1alpha1 shows a v1-only field: {}",
        as_alpha["spec"]
    );
    ensure!(
        as_alpha["spec"]["storageSize"] == "1Gi" && as_alpha["spec"]["replicas"] == 4,
        "v1alpha1 spec: {}",
        as_alpha["spec"]
    );
    let expected = convert(&registry, &updated_v1, "v1alpha1")?;
    ensure!(
        as_alpha["spec"] == expected["spec"],
        "served v1alpha1 {} != plugin's {}",
        as_alpha["spec"],
        expected["spec"]
    );

    // 3. Update as v1alpha1; the v1-only field survives (carried in the conversion annotation).
    alpha
        .patch("legacy", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 5}})))
        .await
        .context("update as v1alpha1")?;
    let back = get(&env, "v1", "legacy").await?;
    ensure!(
        back["spec"]["deletionProtection"] == true,
        "deletionProtection lost through v1alpha1: {}",
        back["spec"]
    );
    ensure!(back["spec"]["replicas"] == 5, "v1alpha1 update not seen as v1: {}", back["spec"]);
    let mut want = updated_v1["spec"].clone();
    want["replicas"] = json!(5);
    ensure!(back["spec"] == want, "fields changed: {} vs {}", back["spec"], want);

    // 4. Objects stored at v1alpha1 (an older storage version) read back as v1, and the
    //    reverse: storage switched to v1alpha1 for a moment, then back to v1.
    set_storage(&env, "v1alpha1").await?;
    let mut stored_alpha = legacy.clone();
    stored_alpha["metadata"]["name"] = json!("stored-alpha");
    alpha
        .create(&PostParams::default(), &serde_json::from_value(stored_alpha.clone())?)
        .await
        .context("create while v1alpha1 is stored")?;
    let mut protected = POSTGRES.manifest("stored-from-v1", 3, "Retain");
    protected["spec"]["deletionProtection"] = json!(true);
    v1.create(&PostParams::default(), &serde_json::from_value(protected.clone())?)
        .await
        .context("create as v1 while v1alpha1 is stored")?;
    set_storage(&env, "v1").await?;
    let read = get(&env, "v1", "stored-alpha").await?;
    let expected = convert(&registry, &get(&env, "v1alpha1", "stored-alpha").await?, "v1")?;
    ensure!(
        read["spec"] == expected["spec"] && read["spec"]["storage"]["size"] == "1Gi",
        "stored v1alpha1 read as v1: {}",
        read["spec"]
    );
    let read = get(&env, "v1", "stored-from-v1").await?;
    ensure!(
        read["spec"] == protected["spec"],
        "v1 stored as v1alpha1 lost fields: {} vs {}",
        read["spec"],
        protected["spec"]
    );
    v1.delete("stored-alpha", &Default::default()).await?;
    migrate_to_v1(&v1).await?;

    // 5. The objects in a list at v1alpha1 are converted too (a multi-object review).
    v1.create(&PostParams::default(), &serde_json::from_value(POSTGRES.manifest("modern", 3, "Retain"))?)
        .await?;
    let listed = alpha.list(&Default::default()).await?;
    ensure!(listed.items.len() >= 3, "listed {} objects", listed.items.len());
    for item in listed.items {
        let item = serde_json::to_value(item)?;
        ensure!(
            item["apiVersion"] == "stateward.dev/v1alpha1" && item["spec"]["storageSize"].is_string(),
            "not converted: {item}"
        );
    }
    migrate_to_v1(&v1).await?;
    Ok(())
}
