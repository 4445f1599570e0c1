//! Kubernetes Events, deduplicated: the same reason and message for the same object is
//! published at most once per window, so a failing loop cannot flood the API server.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::core::DynamicObject;
use kube::runtime::events::{Event, EventType as KubeEventType, Recorder, Reporter};
use kube::{Client, Resource};

use crate::runtime::EventType;

const WINDOW: Duration = Duration::from_secs(300);
const MAX_REMEMBERED: usize = 10_000;

/// Publishes Events to any object, deduplicated by (object, reason, message) within the window:
/// the custom resources' [`Events`] and the reloader's Events on ConfigMaps share it.
///
/// Each Event is written new. kube's `Recorder` counts an event with the object and reason of an
/// earlier one as a repeat of it, whatever its message, so a second refusal with another reason
/// (a switchover to another standby) only raised the first Event's count and its own message
/// was never shown. Exact repeats are dropped here instead.
pub struct Publisher {
    client: Client,
    reporter: Reporter,
    recent: Mutex<HashMap<(String, String, String), Instant>>,
}

impl Publisher {
    pub fn new(client: Client, instance: &str) -> Self {
        let reporter = Reporter { controller: "stateward".into(), instance: Some(instance.to_string()) };
        Self { client, reporter, recent: Mutex::new(HashMap::new()) }
    }

    /// Publishes unless the same event went out for this object within the window. False when
    /// the API server refused it: it is then not remembered, so posting it again is tried.
    pub async fn publish(
        &self,
        reference: &ObjectReference,
        type_: KubeEventType,
        reason: &str,
        message: &str,
        action: &str,
    ) -> bool {
        let key = (
            format!(
                "{}/{}/{}",
                reference.kind.as_deref().unwrap_or_default(),
                reference.namespace.as_deref().unwrap_or_default(),
                reference.name.as_deref().unwrap_or_default()
            ),
            reason.to_string(),
            message.to_string(),
        );
        {
            let Ok(mut recent) = self.recent.lock() else { return false };
            let now = Instant::now();
            if recent.get(&key).is_some_and(|at| now.duration_since(*at) < WINDOW) {
                return true;
            }
            if recent.len() >= MAX_REMEMBERED {
                recent.retain(|_, at| now.duration_since(*at) < WINDOW);
            }
            recent.insert(key.clone(), now);
        }
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(message.chars().take(1000).collect()),
            action: action.into(),
            secondary: None,
        };
        // A recorder of its own: nothing earlier for it to count this event as a repeat of.
        let recorder = Recorder::new(self.client.clone(), self.reporter.clone());
        if let Err(err) = recorder.publish(&event, reference).await {
            tracing::warn!(error = %err, reason, "cannot publish event");
            if let Ok(mut recent) = self.recent.lock() {
                recent.remove(&key);
            }
            return false;
        }
        true
    }
}

/// Events on the custom resources of one kind.
pub struct Events {
    publisher: Publisher,
    kind: kube::core::ApiResource,
}

impl Events {
    pub fn new(client: Client, instance: &str, kind: kube::core::ApiResource) -> Self {
        Self { publisher: Publisher::new(client, instance), kind }
    }

    /// Publishes unless the same event went out for this object within the window.
    pub async fn publish(&self, obj: &DynamicObject, type_: EventType, reason: &str, message: &str) {
        let type_ = match type_ {
            EventType::Normal => KubeEventType::Normal,
            EventType::Warning => KubeEventType::Warning,
        };
        let reference = obj.object_ref(&self.kind);
        self.publisher.publish(&reference, type_, reason, message, "Reconcile").await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::{Arc, Mutex};

    use http::{Method, Request, Response};
    use http_body_util::BodyExt as _;
    use kube::client::Body;
    use serde_json::Value;

    use super::*;

    /// Two events with one reason and different messages are two Events, each with its message
    /// (kube's recorder made the second a count on the first, message and all).
    #[tokio::test]
    async fn the_same_reason_with_another_message_is_an_event_of_its_own() {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let seen: Arc<Mutex<Vec<(Method, Value)>>> = Arc::default();
        let log = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Some((request, respond)) = handle.next_request().await {
                let (parts, body) = request.into_parts();
                let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                log.lock().unwrap().push((parts.method, body.clone()));
                let reply = Response::builder()
                    .status(201)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&body).unwrap()))
                    .unwrap();
                respond.send_response(reply);
            }
        });
        let publisher = Publisher::new(Client::new(service, "default"), "test");
        let reference = ObjectReference {
            kind: Some("PostgresCluster".into()),
            namespace: Some("ns".into()),
            name: Some("db".into()),
            ..Default::default()
        };
        for message in ["pg-1 is not streaming", "pg-2 is 40 MB behind", "pg-2 is 40 MB behind"] {
            publisher
                .publish(&reference, KubeEventType::Warning, "SwitchoverRefused", message, "Reconcile")
                .await;
        }
        let seen = seen.lock().unwrap().clone();
        let notes: Vec<(&Method, &str)> =
            seen.iter().map(|(m, b)| (m, b["note"].as_str().unwrap_or_default())).collect();
        assert_eq!(
            notes,
            vec![(&Method::POST, "pg-1 is not streaming"), (&Method::POST, "pg-2 is 40 MB behind")],
            "each distinct message once, as an Event of its own"
        );
    }
}
