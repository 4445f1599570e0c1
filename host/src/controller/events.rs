//! Kubernetes Events, deduplicated: the same reason and message for the same object is
//! published at most once per window, so a failing loop cannot flood the API server.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::core::DynamicObject;
use kube::runtime::events::{Event, EventType as KubeEventType, Recorder, Reporter};
use kube::{Client, Resource, ResourceExt};

use crate::runtime::EventType;

const WINDOW: Duration = Duration::from_secs(300);
const MAX_REMEMBERED: usize = 10_000;

pub struct Events {
    recorder: Recorder,
    kind: kube::core::ApiResource,
    recent: Mutex<HashMap<(String, String, String), Instant>>,
}

impl Events {
    pub fn new(client: Client, instance: &str, kind: kube::core::ApiResource) -> Self {
        let reporter = Reporter {
            controller: "stateward".into(),
            instance: Some(instance.to_string()),
        };
        Self {
            recorder: Recorder::new(client, reporter),
            kind,
            recent: Mutex::new(HashMap::new()),
        }
    }

    /// Publishes unless the same event went out for this object within the window.
    pub async fn publish(&self, obj: &DynamicObject, type_: EventType, reason: &str, message: &str) {
        let key = (
            format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any()),
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
            type_: match type_ {
                EventType::Normal => KubeEventType::Normal,
                EventType::Warning => KubeEventType::Warning,
            },
            reason: reason.to_string(),
            note: Some(message.chars().take(1000).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        let reference = obj.object_ref(&self.kind);
        if let Err(err) = self.recorder.publish(&event, &reference).await {
            tracing::warn!(error = %err, reason, "cannot publish event");
        }
    }
}
