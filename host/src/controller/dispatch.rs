//! The plan's requests to the running service, handed to [`Requests`] after the guardrails
//! allowed them: each target is resolved from the observed children (a Pod or Service of this
//! instance, its address, the Secrets it names), a request that is not due is left alone, and a
//! one-shot request is recorded in status before it is sent. A target that cannot be reached
//! becomes an answer with an error at once; nothing here waits for a request to finish.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use base64::Engine as _;
use kube::core::DynamicObject;
use kube::Api;
use serde_json::Value;

use crate::requests::{Exec, Http, HttpAuth, Ledger, Owner, Prepared, Requests, Submission};
use crate::runtime::{Action, HttpTarget, Request, RequestMode, Response};

/// Everything a request is resolved against.
pub struct Scene<'a> {
    pub owner: &'a Owner,
    pub resource: &'a Value,
    pub children: &'a [Value],
    /// The custom resource's API, for the one-shot ledger in its status.
    pub api: Api<DynamicObject>,
    pub plugin: &'a str,
    pub now_ms: u64,
    /// Checked again before each request is recorded and sent: a reconcile that began as
    /// leader may outlive the Lease, and a new leader may be sending the same requests.
    pub leadership: &'a crate::leader::Leadership,
}

/// Sends every request of `actions` that is due. Returns the resource as the API server
/// stored it after the last one-shot record, if any was written: each record of one plan is
/// made over the previous one's version (the second would otherwise conflict with the first).
pub async fn dispatch(requests: &Arc<Requests>, scene: &Scene<'_>, actions: &[Action]) -> Option<Value> {
    let ledger = crate::requests::records(scene.resource);
    let mut stored: Option<Value> = None;
    for action in actions {
        if !scene.leadership.is_leader() {
            tracing::debug!("no longer the leader: the plan's remaining requests are not sent");
            break;
        }
        let (id, mode, timeout, prepared, audit) = match action {
            Action::Exec { request } => {
                (&request.id, request.mode, request.timeout, exec(scene, request), audit_of(action, scene))
            }
            Action::Http { request } => {
                (&request.id, request.mode, request.timeout, http(scene, request), audit_of(action, scene))
            }
            _ => continue,
        };
        if mode == RequestMode::Once && ledger.iter().any(|r| &r.id == id) {
            continue;
        }
        if !requests.due(scene.owner, id, mode) {
            continue;
        }
        let prepared = match prepared {
            Ok(prepared) => prepared,
            Err(error) => {
                requests.answer_now(
                    scene.owner,
                    &format!("plugin/{}", scene.plugin),
                    &audit,
                    Response { id: id.clone(), error: Some(error), ..Response::default() },
                    mode != RequestMode::Once,
                );
                continue;
            }
        };
        let ledger = match mode {
            RequestMode::Every(_) => None,
            RequestMode::Once => {
                let over = stored.as_ref().unwrap_or(scene.resource);
                match Ledger::sent(scene.api.clone(), over, id, scene.now_ms).await {
                    Ok((ledger, resource)) => {
                        stored = Some(resource);
                        Some(ledger)
                    }
                    Err(error) => {
                        // Not recorded, so not sent: a later reconcile tries again.
                        tracing::warn!(id = %id, error = %error, "one-shot request not sent");
                        continue;
                    }
                }
            }
        };
        let submission = Submission {
            id: id.clone(),
            mode,
            timeout,
            prepared,
            requested_by: format!("plugin/{}", scene.plugin),
            ledger,
            audit,
        };
        requests.start(scene.owner.clone(), submission);
    }
    stored
}

/// What the audit record of the outcome names: the verb and the target as policy saw them.
fn audit_of(action: &Action, scene: &Scene<'_>) -> Value {
    let planned = crate::policy_input::PlannedAction::of(action, scene.resource, &[]);
    serde_json::json!({
        "verb": planned.verb,
        "resource": crate::policy_input::resource(scene.resource),
        "object": planned.object,
    })
}

fn child<'a>(scene: &'a Scene<'_>, kind: &str, name: &str) -> Result<&'a Value, String> {
    scene
        .children
        .iter()
        .find(|c| c["apiVersion"] == "v1" && c["kind"] == kind && c["metadata"]["name"] == name)
        .ok_or_else(|| {
            format!(
                "{kind} {name} is not one of this instance's observed children (gone, not labelled \
                 for it, or the plugin does not own v1 {kind})"
            )
        })
}

fn exec(scene: &Scene<'_>, request: &Request<crate::runtime::ExecRequest>) -> Result<Prepared, String> {
    let e = &request.what;
    let pod = child(scene, "Pod", &e.pod)?;
    let running = pod
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|c| c["name"] == e.container.as_str())
        .is_some_and(|c| c.pointer("/state/running").is_some());
    if !running {
        return Err(format!("container {} of pod {} is not running", e.container, e.pod));
    }
    Ok(Prepared::Exec(Exec {
        namespace: scene.owner.namespace.clone(),
        pod: e.pod.clone(),
        container: e.container.clone(),
        command: e.command.clone(),
        stdin: e.stdin.clone(),
    }))
}

fn http(scene: &Scene<'_>, request: &Request<crate::runtime::HttpRequest>) -> Result<Prepared, String> {
    let h = &request.what;
    let ip = match &h.target {
        HttpTarget::Pod(name) => child(scene, "Pod", name)?.pointer("/status/podIP").and_then(Value::as_str),
        HttpTarget::Service(name) => {
            child(scene, "Service", name)?.pointer("/spec/clusterIP").and_then(Value::as_str)
        }
    };
    let ip: IpAddr = ip
        .filter(|ip| *ip != "None")
        .and_then(|ip| ip.parse().ok())
        .ok_or_else(|| format!("{:?} has no address yet", h.target))?;
    let secret_key = |secret: &str, key: &str| -> Result<String, String> {
        let encoded = child(scene, "Secret", secret)?
            .pointer(&format!("/data/{}", key.replace('~', "~0").replace('/', "~1")))
            .and_then(Value::as_str)
            .ok_or_else(|| format!("Secret {secret} has no key {key}"))?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|e| format!("Secret {secret} key {key}: {e}"))?;
        String::from_utf8(bytes).map_err(|_| format!("Secret {secret} key {key} is not text"))
    };
    let tls = match &h.tls {
        Some(t) => Some((secret_key(&t.ca_secret, "ca.crt")?, t.server_name.clone())),
        None => None,
    };
    let auth = match &h.basic_auth {
        Some(a) => Some(HttpAuth {
            username: secret_key(&a.secret, &a.username_key)?,
            password: secret_key(&a.secret, &a.password_key)?,
        }),
        None => None,
    };
    Ok(Prepared::Http(Http {
        address: SocketAddr::new(ip, h.port),
        tls,
        method: h.method.clone(),
        path: h.path.clone(),
        headers: h.headers.clone(),
        body: h.body.clone(),
        auth,
    }))
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// Hardening-2 9: a replica that lost the Lease after its reconcile began sends none of
    /// the plan's requests; the same plan is sent while it leads.
    #[tokio::test]
    async fn requests_are_sent_only_while_leading() {
        let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().expect("url")))
            .expect("client");
        let sent = Arc::new(AtomicUsize::new(0));
        let outcomes: crate::requests::Outcomes = {
            let sent = Arc::clone(&sent);
            Arc::new(move |o: &crate::requests::Outcome<'_>| {
                if o.sent {
                    sent.fetch_add(1, Ordering::SeqCst);
                }
            })
        };
        let settings = crate::requests::RequestSettings { per_resource: 4, total: 4, output_bytes: 1024 };
        let requests = Requests::new(client.clone(), settings, outcomes);
        let owner = Owner { kind: "PostgresCluster".into(), namespace: "db".into(), name: "main".into() };
        let resource = serde_json::json!({ "metadata": { "name": "main", "namespace": "db" } });
        let pod = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": { "name": "main-0", "namespace": "db" },
            "status": { "containerStatuses": [{ "name": "postgres", "state": { "running": {} } }] },
        });
        let children = [pod];
        let ar = kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("stateward.dev", "v1", "PostgresCluster"),
            "postgresclusters",
        );
        let poll = Action::Exec {
            request: Request {
                id: "stats-main-0".into(),
                mode: RequestMode::Every(Duration::from_secs(2)),
                timeout: Duration::from_secs(1),
                what: crate::runtime::ExecRequest {
                    pod: "main-0".into(),
                    container: "postgres".into(),
                    command: vec!["true".into()],
                    stdin: None,
                },
            },
        };
        for (leading, expected) in [(false, 0), (true, 1)] {
            let (leadership, _keep) = crate::leader::Leadership::fixed(leading);
            let scene = Scene {
                owner: &owner,
                resource: &resource,
                children: &children,
                api: crate::watched::api(&client, Some("db"), &ar),
                plugin: "postgres",
                now_ms: 0,
                leadership: &leadership,
            };
            dispatch(&requests, &scene, std::slice::from_ref(&poll)).await;
            let answered = async {
                while sent.load(Ordering::SeqCst) < expected {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            };
            tokio::time::timeout(Duration::from_secs(5), answered).await.expect("the request was sent");
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert_eq!(sent.load(Ordering::SeqCst), expected, "leading: {leading}");
        }
    }
}
