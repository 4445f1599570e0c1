//! Proves the local control plane (tests/cluster) is a real Kubernetes: scheduling over
//! zones with topology-aware volume binding, garbage collection, CEL validation of CRDs,
//! admission webhooks and policies, service-account tokens, and the built kubectl.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, ensure, Context as _};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::authentication::v1::{SelfSubjectReview, TokenRequest};
use k8s_openapi::api::core::v1::{
    ConfigMap, Node, PersistentVolume, PersistentVolumeClaim, Pod, ServiceAccount,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::ByteString;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Api, Client, Config};
use serde_json::json;
use stateward_testkit::{LoopbackCert, TestEnv};

/// Upper bound for any single test, so a broken cluster fails the run instead of hanging it.
const TEST_TIMEOUT: Duration = Duration::from_secs(240);

async fn bounded<F: Future<Output = anyhow::Result<()>>>(f: F) -> anyhow::Result<()> {
    tokio::time::timeout(TEST_TIMEOUT, f).await.context("test timed out")?
}

/// Polls `check` every 250 ms until it yields `Some`, or fails after `secs` seconds with `what`.
async fn eventually<T, F, Fut>(secs: u64, what: &str, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("timed out after {secs}s waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn api_error_message(err: &kube::Error) -> Option<(u16, String)> {
    match err {
        kube::Error::Api(status) => Some((status.code, status.message.clone())),
        _ => None,
    }
}

#[tokio::test]
async fn statefulset_pods_spread_over_zones_become_ready_and_bind_precreated_volumes() -> anyhow::Result<()> {
    let env = TestEnv::new("sts").await?;
    bounded(async {
        let sts: StatefulSet = serde_json::from_value(json!({
            "metadata": { "name": "db" },
            "spec": {
                "replicas": 3,
                "serviceName": "db",
                "selector": { "matchLabels": { "app": "db" } },
                "template": {
                    "metadata": { "labels": { "app": "db" } },
                    "spec": {
                        "containers": [{
                            "name": "db", "image": "registry.invalid/db:1",
                            "resources": { "requests": { "cpu": "500m", "memory": "1Gi" } },
                            "volumeMounts": [{ "name": "data", "mountPath": "/data" }]
                        }],
                        "topologySpreadConstraints": [{
                            "maxSkew": 1,
                            "topologyKey": "topology.kubernetes.io/zone",
                            "whenUnsatisfiable": "DoNotSchedule",
                            "labelSelector": { "matchLabels": { "app": "db" } }
                        }]
                    }
                },
                "volumeClaimTemplates": [{
                    "metadata": { "name": "data" },
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": { "requests": { "storage": "1Gi" } }
                    }
                }]
            }
        }))?;
        let sets: Api<StatefulSet> = env.api();
        sets.create(&PostParams::default(), &sts).await?;

        eventually(150, "3 ready replicas", || async {
            let s = sets.get("db").await?;
            Ok((s.status.and_then(|s| s.ready_replicas) == Some(3)).then_some(()))
        })
        .await?;

        let nodes: Api<Node> = Api::all(env.client.clone());
        let pvs: Api<PersistentVolume> = Api::all(env.client.clone());
        let pods: Api<Pod> = env.api();
        let pvcs: Api<PersistentVolumeClaim> = env.api();
        let mut zones = BTreeSet::new();
        for i in 0..3 {
            let pod = pods.get(&format!("db-{i}")).await?;
            let status = pod.status.context("pod status")?;
            ensure!(status.phase.as_deref() == Some("Running"), "db-{i} phase {:?}", status.phase);
            let ready = status
                .conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            ensure!(ready, "db-{i} is not Ready");
            let node_name = pod.spec.and_then(|s| s.node_name).context("pod not scheduled")?;
            let node = nodes.get(&node_name).await?;
            let zone = node.metadata.labels.unwrap_or_default().get("topology.kubernetes.io/zone").cloned();
            zones.insert(zone.context("node without zone")?);

            let pvc = pvcs.get(&format!("data-db-{i}")).await?;
            let pvc_spec = pvc.spec.context("pvc spec")?;
            ensure!(pvc.status.and_then(|s| s.phase).as_deref() == Some("Bound"), "data-db-{i} is not Bound");
            // The claim template names no class: the default one was filled in.
            ensure!(
                pvc_spec.storage_class_name.as_deref() == Some("local"),
                "class {:?}",
                pvc_spec.storage_class_name
            );
            let pv_name = pvc_spec.volume_name.context("pvc without volume")?;
            let pv = pvs.get(&pv_name).await?;
            ensure!(
                pv.metadata.labels.unwrap_or_default().get("stateward.test/pool").map(String::as_str)
                    == Some("local"),
                "{pv_name} is not a pre-created pool volume"
            );
            // Topology-aware binding: the volume is pinned to the very node the pod runs on.
            let affinity = serde_json::to_value(pv.spec.context("pv spec")?.node_affinity)?;
            let pinned =
                affinity["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"][0].clone();
            ensure!(pinned == json!(node_name), "{pv_name} pinned to {pinned}, pod on {node_name}");
        }
        ensure!(zones.len() == 3, "pods landed in zones {zones:?}");
        Ok(())
    })
    .await
}

#[tokio::test]
async fn deleting_an_owner_garbage_collects_its_children() -> anyhow::Result<()> {
    let env = TestEnv::new("gc").await?;
    bounded(async {
        let cms: Api<ConfigMap> = env.api();
        let owner = cms
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({ "metadata": { "name": "owner" } }))?,
            )
            .await?;
        let uid = owner.metadata.uid.context("owner uid")?;
        let owner_ref = json!([{ "apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid }]);
        for name in ["child-a", "child-b"] {
            let child = json!({ "metadata": { "name": name, "ownerReferences": owner_ref } });
            cms.create(&PostParams::default(), &serde_json::from_value(child)?).await?;
        }
        cms.create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": "bystander" } }))?,
        )
        .await?;

        cms.delete("owner", &DeleteParams::background()).await?;
        eventually(60, "children to be garbage-collected", || async {
            let a = cms.get_opt("child-a").await?;
            let b = cms.get_opt("child-b").await?;
            Ok((a.is_none() && b.is_none()).then_some(()))
        })
        .await?;
        ensure!(cms.get_opt("bystander").await?.is_some(), "an unowned object was collected");
        Ok(())
    })
    .await
}

const WIDGET_GROUP: &str = "testkit.stateward.test";

#[tokio::test]
async fn crd_cel_and_bounds_reject_bad_create_and_update_with_the_api_servers_message() -> anyhow::Result<()>
{
    let env = TestEnv::new("crd").await?;
    bounded(async {
        let crd: CustomResourceDefinition = serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": { "name": format!("widgets.{WIDGET_GROUP}") },
            "spec": {
                "group": WIDGET_GROUP,
                "names": { "kind": "Widget", "plural": "widgets", "singular": "widget" },
                "scope": "Namespaced",
                "versions": [{
                    "name": "v1", "served": true, "storage": true,
                    "schema": { "openAPIV3Schema": {
                        "type": "object",
                        "properties": { "spec": {
                            "type": "object",
                            "required": ["size", "storageClass"],
                            "properties": {
                                "size": { "type": "integer", "minimum": 1, "maximum": 10 },
                                "storageClass": {
                                    "type": "string",
                                    "x-kubernetes-validations": [{
                                        "rule": "self == oldSelf",
                                        "message": "storageClass is immutable"
                                    }]
                                }
                            }
                        }}
                    }}
                }]
            }
        }))?;
        let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
        crds.patch(
            &format!("widgets.{WIDGET_GROUP}"),
            &PatchParams::apply("stateward-testkit").force(),
            &Patch::Apply(&crd),
        )
        .await?;
        eventually(30, "CRD Established", || async {
            let c = crds.get(&format!("widgets.{WIDGET_GROUP}")).await?;
            let established = c
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            Ok(established.then_some(()))
        })
        .await?;

        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(WIDGET_GROUP, "v1", "Widget"),
            "widgets",
        );
        let widgets: Api<DynamicObject> = Api::namespaced_with(env.client.clone(), &env.namespace, &ar);
        let widget = |name: &str, size: i64, class: &str| -> anyhow::Result<DynamicObject> {
            Ok(serde_json::from_value(json!({
                "apiVersion": format!("{WIDGET_GROUP}/v1"), "kind": "Widget",
                "metadata": { "name": name },
                "spec": { "size": size, "storageClass": class }
            }))?)
        };
        // A freshly established CRD can take a moment to be served.
        eventually(30, "the Widget API to be served", || async {
            match widgets.create(&PostParams::default(), &widget("good", 3, "local")?).await {
                Ok(_) => Ok(Some(())),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
                Err(e) => Err(e.into()),
            }
        })
        .await?;

        for (name, size, expected) in [
            (
                "too-small",
                0,
                "spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1",
            ),
            (
                "too-big",
                11,
                "spec.size: Invalid value: 11: spec.size in body should be less than or equal to 10",
            ),
        ] {
            let err = widgets
                .create(&PostParams::default(), &widget(name, size, "local")?)
                .await
                .err()
                .with_context(|| format!("create of {name} (size {size}) was accepted"))?;
            let (code, msg) = api_error_message(&err).with_context(|| format!("not an API error: {err}"))?;
            ensure!(code == 422, "code {code}: {msg}");
            ensure!(msg.contains(expected), "unexpected message: {msg}");
        }

        let err = widgets
            .patch(
                "good",
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "storageClass": "fast" } })),
            )
            .await
            .err()
            .context("changing the immutable storageClass was accepted")?;
        let (code, msg) = api_error_message(&err).with_context(|| format!("not an API error: {err}"))?;
        ensure!(code == 422, "code {code}: {msg}");
        ensure!(
            msg.contains("spec.storageClass: Invalid value: \"string\": storageClass is immutable"),
            "unexpected message: {msg}"
        );

        let err = widgets
            .patch("good", &PatchParams::default(), &Patch::Merge(json!({ "spec": { "size": 20 } })))
            .await
            .err()
            .context("size 20 was accepted on update")?;
        let (_, msg) = api_error_message(&err).with_context(|| format!("not an API error: {err}"))?;
        ensure!(msg.contains("should be less than or equal to 10"), "unexpected message: {msg}");

        // Valid updates still go through: the rules reject exactly what they should.
        let updated = widgets
            .patch("good", &PatchParams::default(), &Patch::Merge(json!({ "spec": { "size": 5 } })))
            .await?;
        ensure!(updated.data["spec"]["size"] == json!(5));
        ensure!(updated.data["spec"]["storageClass"] == json!("local"));
        Ok(())
    })
    .await
}

/// One admission request as the test webhook saw it.
#[derive(Debug, Clone)]
struct Seen {
    namespace: String,
    name: String,
    operation: String,
}

/// Serves a validating webhook over TLS on 127.0.0.1 that denies objects named `deny-*`.
async fn serve_webhook(cert: &LoopbackCert, seen: Arc<Mutex<Vec<Seen>>>) -> anyhow::Result<u16> {
    use tokio_rustls::rustls;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![rustls::pki_types::CertificateDer::from(cert.cert_der.clone())],
            rustls::pki_types::PrivateKeyDer::Pkcs8(cert.key_der.clone().into()),
        )?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let seen = seen.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let seen = seen.clone();
                    async move { Ok::<_, Infallible>(review(req, &seen).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    Ok(port)
}

async fn review(req: Request<Incoming>, seen: &Mutex<Vec<Seen>>) -> Response<Full<Bytes>> {
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return Response::builder().status(400).body(Full::new(Bytes::new())).unwrap_or_default(),
    };
    let review: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let request = &review["request"];
    let name = request["name"].as_str().unwrap_or_default().to_owned();
    if let Ok(mut s) = seen.lock() {
        s.push(Seen {
            namespace: request["namespace"].as_str().unwrap_or_default().to_owned(),
            name: name.clone(),
            operation: request["operation"].as_str().unwrap_or_default().to_owned(),
        });
    }
    let allowed = !name.starts_with("deny-");
    let response = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {
            "uid": request["uid"],
            "allowed": allowed,
            "status": { "code": if allowed { 200 } else { 403 }, "message": "names starting with deny- are refused by the stateward test webhook" }
        }
    });
    Response::new(Full::new(Bytes::from(response.to_string())))
}

#[tokio::test]
async fn api_server_calls_a_validating_webhook_served_on_loopback() -> anyhow::Result<()> {
    let env = TestEnv::new("webhook").await?;
    bounded(async {
        let cert = LoopbackCert::generate()?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let port = serve_webhook(&cert, seen.clone()).await?;

        let name = format!("stateward-testkit-{}", env.namespace);
        let mut config: ValidatingWebhookConfiguration = serde_json::from_value(json!({
            "metadata": { "name": name },
            "webhooks": [{
                "name": "configmaps.testkit.stateward.test",
                "clientConfig": { "url": format!("https://127.0.0.1:{port}/validate") },
                "rules": [{ "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"] }],
                // Only this test's namespace, so a leftover config cannot disturb other tests.
                "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": env.namespace } },
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "failurePolicy": "Fail",
                "timeoutSeconds": 5
            }]
        }))?;
        if let Some(w) = config.webhooks.as_mut().and_then(|w| w.first_mut()) {
            w.client_config.ca_bundle = Some(ByteString(cert.ca_pem.clone().into_bytes()));
        }
        let configs: Api<ValidatingWebhookConfiguration> = Api::all(env.client.clone());
        configs.create(&PostParams::default(), &config).await?;

        let cms: Api<ConfigMap> = env.api();
        let cm = |n: &str| -> anyhow::Result<ConfigMap> { Ok(serde_json::from_value(json!({ "metadata": { "name": n } }))?) };
        // The API server picks new webhook configurations up asynchronously.
        let mut attempt = 0;
        let message = eventually(30, "the webhook to deny a deny-* ConfigMap", || {
            attempt += 1;
            let cm = cm(&format!("deny-{attempt}"));
            let cms = cms.clone();
            async move {
                match cms.create(&PostParams::default(), &cm?).await {
                    Ok(_) => Ok(None),
                    Err(e) => Ok(Some(api_error_message(&e).with_context(|| format!("not an API error: {e}"))?)),
                }
            }
        })
        .await?;
        ensure!(
            message.1.contains("configmaps.testkit.stateward.test")
                && message.1.contains("names starting with deny- are refused by the stateward test webhook"),
            "unexpected denial: {message:?}"
        );
        cms.create(&PostParams::default(), &cm("allowed")?).await.context("webhook denied an allowed name")?;

        let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
        ensure!(seen.iter().any(|s| s.name == "allowed"), "webhook never saw the allowed create: {seen:?}");
        ensure!(
            seen.iter().all(|s| s.namespace == env.namespace && s.operation == "CREATE"),
            "unexpected requests: {seen:?}"
        );
        configs.delete(&name, &DeleteParams::default()).await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn validating_admission_policy_denies_with_its_cel_message() -> anyhow::Result<()> {
    let env = TestEnv::new("vap").await?;
    bounded(async {
        let name = format!("stateward-testkit-{}", env.namespace);
        let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": { "resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["configmaps"]
                }]},
                "validations": [{
                    "expression": "!has(object.data) || !('forbidden' in object.data)",
                    "message": "the key 'forbidden' is not allowed"
                }]
            }
        }))?;
        let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": { "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": env.namespace } } }
            }
        }))?;
        let policies: Api<ValidatingAdmissionPolicy> = Api::all(env.client.clone());
        let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(env.client.clone());
        policies.create(&PostParams::default(), &policy).await?;
        bindings.create(&PostParams::default(), &binding).await?;

        let cms: Api<ConfigMap> = env.api();
        let mut attempt = 0;
        let message = eventually(30, "the policy to deny", || {
            attempt += 1;
            let cms = cms.clone();
            let cm = serde_json::from_value::<ConfigMap>(json!({
                "metadata": { "name": format!("bad-{attempt}") }, "data": { "forbidden": "x" }
            }));
            async move {
                match cms.create(&PostParams::default(), &cm?).await {
                    Ok(_) => Ok(None),
                    Err(e) => Ok(Some(api_error_message(&e).with_context(|| format!("not an API error: {e}"))?)),
                }
            }
        })
        .await?;
        ensure!(message.0 == 422 || message.0 == 403, "code {}", message.0);
        ensure!(message.1.contains("the key 'forbidden' is not allowed"), "unexpected message: {}", message.1);
        let ok: ConfigMap = serde_json::from_value(json!({ "metadata": { "name": "good" }, "data": { "fine": "x" } }))?;
        cms.create(&PostParams::default(), &ok).await.context("policy denied an allowed ConfigMap")?;
        bindings.delete(&name, &DeleteParams::default()).await?;
        policies.delete(&name, &DeleteParams::default()).await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn service_account_tokens_authenticate() -> anyhow::Result<()> {
    let env = TestEnv::new("sa").await?;
    bounded(async {
        let sas: Api<ServiceAccount> = env.api();
        let tr =
            sas.create_token_request("default", &PostParams::default(), &TokenRequest::default()).await?;
        let token = tr.status.context("token request without status")?.token;

        let kubeconfig = kube::config::Kubeconfig::read_from(env.kubeconfig())?;
        let mut config = Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
        config.auth_info = serde_json::from_value(json!({ "token": token }))?;
        let sa_client = Client::try_from(config)?;
        let review = Api::<SelfSubjectReview>::all(sa_client)
            .create(&PostParams::default(), &SelfSubjectReview::default())
            .await?;
        let user = review.status.and_then(|s| s.user_info).and_then(|u| u.username);
        ensure!(
            user.as_deref() == Some(format!("system:serviceaccount:{}:default", env.namespace).as_str()),
            "authenticated as {user:?}"
        );
        Ok(())
    })
    .await
}

#[tokio::test]
async fn built_kubectl_lists_nodes_wide_over_three_zones() -> anyhow::Result<()> {
    let env = TestEnv::new("kubectl").await?;
    bounded(async {
        let kubectl = env.kubectl();
        let out = tokio::task::spawn_blocking(move || {
            let mut kubectl = kubectl;
            kubectl.args(["get", "nodes", "-o", "wide", "-L", "topology.kubernetes.io/zone"]).output()
        })
        .await??;
        let stdout = String::from_utf8_lossy(&out.stdout);
        ensure!(out.status.success(), "kubectl failed: {}", String::from_utf8_lossy(&out.stderr));
        let header = stdout.lines().next().unwrap_or_default();
        for col in ["NAME", "STATUS", "VERSION", "INTERNAL-IP", "OS-IMAGE", "ZONE"] {
            ensure!(header.contains(col), "no {col} column in {header}");
        }
        let mut zones: BTreeMap<String, usize> = BTreeMap::new();
        for line in stdout.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            ensure!(cols.get(1) == Some(&"Ready"), "node not Ready: {line}");
            if let Some(zone) = cols.last() {
                *zones.entry((*zone).to_owned()).or_default() += 1;
            }
        }
        ensure!(zones.len() >= 3, "nodes over zones {zones:?}:\n{stdout}");

        // Both ends report the stamped release, not v0.0.0.
        let kubectl = env.kubectl();
        let out = tokio::task::spawn_blocking(move || {
            let mut kubectl = kubectl;
            kubectl.args(["version", "-o", "json"]).output()
        })
        .await??;
        ensure!(out.status.success(), "kubectl version failed: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        let client = v["clientVersion"]["gitVersion"].as_str().unwrap_or_default();
        let server = v["serverVersion"]["gitVersion"].as_str().unwrap_or_default();
        ensure!(client.starts_with("v1.") && client != "v0.0.0", "client version {client}");
        ensure!(client == server, "client {client} vs server {server}");
        Ok(())
    })
    .await
}
