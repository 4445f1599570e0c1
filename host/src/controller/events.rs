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
pub struct Publisher {
    recorder: Recorder,
    recent: Mutex<HashMap<(String, String, String), Instant>>,
}

impl Publisher {
    pub fn new(client: Client, instance: &str) -> Self {
        let reporter = Reporter {
            controller: "stateward".into(),
            instance: Some(instance.to_string()),
        };
        Self {
            recorder: Recorder::new(client, reporter),
            recent: Mutex::new(HashMap::new()),
        }
    }

    /// Publishes unless the same event went out for this object within the window.
    pub async fn publish(
        &self,
        reference: &ObjectReference,
        type_: KubeEventType,
        reason: &str,
        message: &str,
        action: &str,
    ) {
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
            let Ok(mut recent) = self.recent.lock() else { return };
            let now = Instant::now();
            if recent.get(&key).is_some_and(|at| now.duration_since(*at) < WINDOW) {
                return;
            }
            if recent.len() >= MAX_REMEMBERED {
                recent.retain(|_, at| now.duration_since(*at) < WINDOW);
            }
            recent.insert(key, now);
        }
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(message.chars().take(1000).collect()),
            action: action.into(),
            secondary: None,
        };
        if let Err(err) = self.recorder.publish(&event, reference).await {
            tracing::warn!(error = %err, reason, "cannot publish event");
        }
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
