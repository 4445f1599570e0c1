//! The reloaders' Events on their ConfigMaps, owed until they are out.
//!
//! Every replica vets every build and bundle, but only the leader posts Events. A verdict
//! reached while this replica did not lead (a Lease renewal missed under load, then won back a
//! second later), or whose Event the API server refused, used to be lost: the refusal was
//! counted and shown in `/debug/plugins`, and the ConfigMap never said why. Such an Event is now
//! owed: the latest one per ConfigMap is posted once this replica leads and the API answers.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::EventType;
use tokio::sync::Notify;

use crate::leader::Leadership;
use crate::telemetry::events::Publisher;

/// How often owed Events are tried again while this replica leads.
const RETRY: Duration = Duration::from_secs(5);

/// One Event about one ConfigMap.
#[derive(Debug, Clone, PartialEq)]
pub struct Announcement {
    pub reference: ObjectReference,
    pub type_: EventType,
    pub reason: String,
    pub note: String,
}

/// Posts Events from the leader, keeping the latest unposted one per ConfigMap.
pub struct Announcer {
    publisher: Publisher,
    leadership: Leadership,
    /// ConfigMap name → the latest Event about it that is not out yet.
    owed: Mutex<BTreeMap<String, Announcement>>,
    /// Rung when something new is owed, so [`Announcer::run`] tries it without waiting.
    wake: Notify,
}

impl Announcer {
    pub fn new(publisher: Publisher, leadership: Leadership) -> Arc<Self> {
        Arc::new(Self { publisher, leadership, owed: Mutex::default(), wake: Notify::new() })
    }

    /// Posts `announcement` now if this replica leads, else owes it. A newer announcement
    /// about the same ConfigMap replaces an owed older one: the ConfigMap says what is true now.
    pub async fn announce(&self, configmap: &str, announcement: Announcement) {
        if self.leadership.is_leader() && self.post(&announcement).await {
            self.settle(configmap, None);
        } else if let Ok(mut owed) = self.owed.lock() {
            owed.insert(configmap.to_string(), announcement);
            self.wake.notify_one();
        }
    }

    /// Forgets what is owed about a ConfigMap that is gone.
    pub fn forget(&self, configmap: &str) {
        self.settle(configmap, None);
    }

    /// Posts what is owed whenever this replica leads: on winning the Lease and every
    /// [`RETRY`] after a refusal. Runs until the elector stops.
    pub async fn run(self: Arc<Self>) {
        let mut leadership = self.leadership.clone();
        loop {
            if self.leadership.is_leader() {
                let pending: Vec<(String, Announcement)> =
                    self.owed.lock().map(|o| o.clone().into_iter().collect()).unwrap_or_default();
                for (configmap, announcement) in &pending {
                    if self.post(announcement).await {
                        self.settle(configmap, Some(announcement));
                    }
                }
            }
            let owing = self.owed.lock().map(|o| !o.is_empty()).unwrap_or(false);
            tokio::select! {
                changed = leadership.changed() => if changed.is_none() { return },
                () = self.wake.notified() => {}
                () = tokio::time::sleep(RETRY), if owing => {}
            }
        }
    }

    async fn post(&self, a: &Announcement) -> bool {
        self.publisher.publish(&a.reference, a.type_, &a.reason, &a.note, "Reload").await
    }

    /// Drops what is owed about `configmap`; with `only`, only if it is still that announcement
    /// (a newer one that arrived meanwhile stays owed).
    fn settle(&self, configmap: &str, only: Option<&Announcement>) {
        if let Ok(mut owed) = self.owed.lock() {
            if only.is_none_or(|a| owed.get(configmap) == Some(a)) {
                owed.remove(configmap);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::{AtomicUsize, Ordering};

    use http::{Request, Response};
    use http_body_util::BodyExt as _;
    use kube::client::Body;
    use kube::Client;
    use serde_json::Value;

    use super::*;

    /// A mocked API server that refuses the first `refuse` Event posts with a 500 and records
    /// the notes of the ones it accepts.
    fn api(refuse: usize) -> (Client, Arc<Mutex<Vec<String>>>) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let accepted: Arc<Mutex<Vec<String>>> = Arc::default();
        let log = Arc::clone(&accepted);
        let seen = Arc::new(AtomicUsize::new(0));
        tokio::spawn(async move {
            while let Some((request, respond)) = handle.next_request().await {
                let bytes = request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                let (status, reply) = if seen.fetch_add(1, Ordering::SeqCst) < refuse {
                    let failure = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "message": "etcdserver: request timed out", "reason": "InternalError", "code": 500});
                    (500, failure)
                } else {
                    log.lock().unwrap().push(body["note"].as_str().unwrap_or_default().to_string());
                    (201, body)
                };
                let response = Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                    .unwrap();
                respond.send_response(response);
            }
        });
        (Client::new(service, "default"), accepted)
    }

    fn rejected(note: &str) -> Announcement {
        Announcement {
            reference: ObjectReference {
                kind: Some("ConfigMap".into()),
                namespace: Some("stateward-system".into()),
                name: Some("redis-next".into()),
                ..Default::default()
            },
            type_: EventType::Warning,
            reason: "PluginRejected".into(),
            note: note.into(),
        }
    }

    async fn eventually(accepted: &Mutex<Vec<String>>, want: &[&str]) {
        for _ in 0..100 {
            if accepted.lock().unwrap().as_slice() == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(accepted.lock().unwrap().as_slice(), want);
    }

    /// A verdict reached while another replica led is posted once this one wins the Lease;
    /// of two verdicts about one ConfigMap only the newer is.
    #[tokio::test]
    async fn an_event_from_a_standby_is_posted_once_it_leads() {
        let (client, accepted) = api(0);
        let (leadership, lead) = Leadership::fixed(false);
        let announcer = Announcer::new(Publisher::new(client, "test"), leadership);
        tokio::spawn(Arc::clone(&announcer).run());
        announcer.announce("redis-next", rejected("digest_mismatch: …")).await;
        announcer.announce("redis-next", rejected("wit_version: …")).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(accepted.lock().unwrap().is_empty(), "a standby posts nothing");
        lead.send(true).unwrap();
        eventually(&accepted, &["wit_version: …"]).await;
    }

    /// An Event the API server refused is tried again, not dropped as a repeat of itself.
    #[tokio::test(start_paused = true)]
    async fn an_event_the_api_refused_is_posted_again() {
        let (client, accepted) = api(1);
        let (leadership, _lead) = Leadership::fixed(true);
        let announcer = Announcer::new(Publisher::new(client, "test"), leadership);
        tokio::spawn(Arc::clone(&announcer).run());
        announcer.announce("redis-next", rejected("wit_version: …")).await;
        assert!(accepted.lock().unwrap().is_empty(), "the first post was refused");
        tokio::time::sleep(RETRY * 2).await;
        eventually(&accepted, &["wit_version: …"]).await;
    }
}
