//! The API server unreachable for a minute, seen from the operator: every connection through
//! a loopback TCP proxy is cut and refused, then restored. The operator must not exit, must
//! not delete anything on the strength of its stale cache, and must converge afterwards
//! (a child deleted during the outage is recreated; a spec change made after it is applied).
//!
//! The API server itself keeps running (other tests share it); a restart of the real process
//! and a watch answered 410 Gone are not exercised here.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use crate::e2e;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use e2e::*;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Service};
use kube::api::{DeleteParams, ListParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use stateward_testkit::TestEnv;
use tokio::net::{TcpListener, TcpStream};

const OUTAGE: Duration = Duration::from_secs(60);

/// Forwards loopback TCP to the API server until cut; while cut, every connection is closed.
struct Proxy {
    port: u16,
    cut: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Proxy {
    async fn start(target: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let (c, list) = (Arc::clone(&cut), Arc::clone(&conns));
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if c.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let task = tokio::spawn(async move {
                    if let Ok(mut upstream) = TcpStream::connect(("127.0.0.1", target)).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut upstream).await;
                    }
                });
                list.lock().unwrap().push(task);
            }
        });
        Proxy { port, cut, conns }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for task in self.conns.lock().unwrap().drain(..) {
            task.abort();
        }
    }

    fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

/// The test kubeconfig with its server pointed at the proxy (same host, so TLS still verifies).
fn proxied_kubeconfig(env: &TestEnv, dir: &std::path::Path, proxy: u16) -> (std::path::PathBuf, u16) {
    let text = std::fs::read_to_string(env.kubeconfig()).unwrap();
    let mut target = 0;
    let rewritten: Vec<String> = text
        .lines()
        .map(|line| match line.trim_start().strip_prefix("server: https://127.0.0.1:") {
            Some(port) => {
                target = port.trim().parse().unwrap();
                line.replace(&format!("127.0.0.1:{target}"), &format!("127.0.0.1:{proxy}"))
            }
            None => line.to_string(),
        })
        .collect();
    assert_ne!(target, 0, "no loopback server in the kubeconfig");
    let path = dir.join("kubeconfig-proxied");
    std::fs::write(&path, rewritten.join("\n")).unwrap();
    (path, target)
}

fn api_port(env: &TestEnv) -> u16 {
    let text = std::fs::read_to_string(env.kubeconfig()).unwrap();
    text.lines()
        .find_map(|l| l.trim_start().strip_prefix("server: https://127.0.0.1:"))
        .and_then(|p| p.trim().parse().ok())
        .expect("loopback server in the kubeconfig")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_outage_neither_exits_nor_deletes_and_converges_after() {
    let env = TestEnv::new("outage").await.unwrap();
    let proxy = Proxy::start(api_port(&env)).await;
    let dir = tempdir::Dir::new("outage");
    let (kubeconfig, _) = proxied_kubeconfig(&env, &dir.0, proxy.port);
    let mut op = Operator::start_with(
        &env,
        "outage",
        OperatorOpts {
            namespace: env.namespace.clone(),
            lease_namespace: env.namespace.clone(),
            kubeconfig: Some(kubeconfig),
            ..Default::default()
        },
    );
    op.wait_ready(Duration::from_secs(60)).await;
    let name = "cache";
    apply(&env, &env.namespace, &REDIS.manifest(name, 3, "Retain"));
    wait_running(&env, REDIS, name, 3, Duration::from_secs(180)).await;

    let sts: Api<StatefulSet> = env.api();
    let pvcs: Api<PersistentVolumeClaim> = env.api();
    let services: Api<Service> = env.api();
    let sts_uid = sts.get(name).await.unwrap().uid();
    let pvc_uids: Vec<String> =
        pvcs.list(&ListParams::default()).await.unwrap().items.iter().filter_map(|p| p.uid()).collect();
    assert_eq!(pvc_uids.len(), 3);
    proxy.cut();
    let started = Instant::now();
    // Counted after the cut: a write the API server answered just before it is counted when its
    // answer arrives, which may be after a count taken before the cut (the Redis plugin writes
    // status on most polls). Past this second no write can reach the API server.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let writes_before = op.api_writes().unwrap();
    // While the operator is blind, a child disappears behind its back.
    let headless = format!("{name}-headless");
    services.delete(&headless, &DeleteParams::default()).await.unwrap();
    while started.elapsed() < OUTAGE {
        if let Some(status) = op.exited() {
            panic!("operator exited during the outage with {status}:\n{}", op.log_tail(80));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(op.api_writes().unwrap(), writes_before, "no write can have reached the API server");
    proxy.restore();
    let restored = Instant::now();

    let (_, took) = wait_for("the deleted Service to be recreated", Duration::from_secs(60), || {
        let services = services.clone();
        let headless = headless.clone();
        async move {
            services
                .get_opt(&headless)
                .await
                .map_err(|e| e.to_string())?
                .map(|_| ())
                .ok_or("absent".to_string())
        }
    })
    .await;
    eprintln!("outage: {OUTAGE:?} cut; deleted child recreated {took:.1?} after the API came back");
    patch_ok(&env, &env.namespace, &format!("redisclusters/{name}"), &json!({"spec": {"replicas": 4}}));
    wait_running(&env, REDIS, name, 4, Duration::from_secs(120)).await;
    eprintln!("outage: scale 3→4 after the outage converged {:.1?} after restore", restored.elapsed());

    assert!(op.exited().is_none(), "the operator must still be running");
    assert_eq!(sts.get(name).await.unwrap().uid(), sts_uid, "the StatefulSet must never be replaced");
    let now: Vec<String> =
        pvcs.list(&ListParams::default()).await.unwrap().items.iter().filter_map(|p| p.uid()).collect();
    for uid in &pvc_uids {
        assert!(now.contains(uid), "PVC {uid} was lost");
    }
}
