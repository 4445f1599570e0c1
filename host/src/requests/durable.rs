//! The durable record of one-shot requests: `status.requests.<id>` of the resource.
//!
//! Before a one-shot request is sent, the host writes `{state: Sent}` for its id with the
//! resourceVersion it observed as a precondition, and sends only when the API server stored
//! it: two writers racing from the same observation (an old and a new leader) cannot both
//! succeed, and one that crashed after writing leaves a record the next leader reads and
//! honours. The answer is added when it comes (`state: Answered`); one lost with a crash comes
//! back to the plugin as an error saying the outcome is unknown.

use kube::api::{Patch, PatchParams};
use kube::core::DynamicObject;
use kube::Api;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::runtime::Response;

/// One-shot records kept in a resource's status; the oldest answered ones go first.
pub const MAX_RECORDS: usize = 32;

/// `status.requests.<id>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    #[serde(skip)]
    pub id: String,
    /// `Sent` or `Answered`.
    pub state: String,
    pub sent_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default)]
    pub duration_ms: u64,
}

impl Record {
    /// The response a plugin gets from the record alone (no output: that stays in memory).
    pub fn response(&self) -> Response {
        let error = match self.state.as_str() {
            "Answered" => self.error.clone(),
            _ => Some(format!(
                "outcome unknown: this one-shot request was sent at {} ms by an operator process that \
                 stopped before recording its answer; it is never sent again",
                self.sent_at_ms
            )),
        };
        Response {
            id: self.id.clone(),
            code: if self.state == "Answered" { self.code } else { None },
            error,
            started_at_ms: self.sent_at_ms,
            duration_ms: self.duration_ms,
            ..Response::default()
        }
    }
}

/// The one-shot records in `resource`'s status.
pub fn records(resource: &Value) -> Vec<Record> {
    let Some(map) = resource.pointer("/status/requests").and_then(Value::as_object) else {
        return Vec::new();
    };
    map.iter()
        .filter_map(|(id, v)| {
            let mut record: Record = serde_json::from_value(v.clone()).ok()?;
            record.id = id.clone();
            Some(record)
        })
        .collect()
}

/// Where one one-shot request's answer goes.
pub struct Ledger {
    api: Api<DynamicObject>,
    name: String,
    id: String,
}

impl Ledger {
    /// Records request `id` of `resource` as sent. Succeeds only when the API server stored
    /// the record on the resource as observed (its resourceVersion) and kept it (a status
    /// schema without `requests` would prune it): only then may the request be sent. Returns
    /// the resource as stored, for the next record of the same plan to be made over.
    pub async fn sent(
        api: Api<DynamicObject>,
        resource: &Value,
        id: &str,
        now_ms: u64,
    ) -> Result<(Self, Value), String> {
        let name = resource.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
        let version = resource.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null);
        let mut requests = Map::new();
        let existing = records(resource);
        // Room for this one: the oldest answered records go (a `Sent` one never does).
        let drop = (existing.len() + 1).saturating_sub(MAX_RECORDS);
        let mut answered: Vec<&Record> = existing.iter().filter(|r| r.state == "Answered").collect();
        answered.sort_by_key(|r| r.sent_at_ms);
        for old in answered.into_iter().take(drop) {
            requests.insert(old.id.clone(), Value::Null);
        }
        requests.insert(id.to_string(), json!({ "state": "Sent", "sentAtMs": now_ms }));
        let patch = json!({ "metadata": { "resourceVersion": version }, "status": { "requests": requests } });
        let stored = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| format!("recording one-shot request {id} before sending it: {e}"))?;
        let stored = serde_json::to_value(stored).map_err(|e| format!("one-shot request {id}: {e}"))?;
        if stored.pointer(&format!("/status/requests/{}/state", escape(id))) != Some(&json!("Sent")) {
            return Err(format!(
                "one-shot request {id} was not sent: the status of {name} does not keep `requests` \
                 (its plugin's status schema must declare it)"
            ));
        }
        Ok((Self { api, name, id: id.to_string() }, stored))
    }

    /// Adds the answer to the record; a failure leaves `Sent`, which reads as an unknown
    /// outcome, never as a reason to send again.
    pub async fn answered(&self, response: &Response) {
        let record = json!({
            "state": "Answered",
            "code": response.code,
            "error": response.error,
            "durationMs": response.duration_ms,
        });
        let patch = json!({ "status": { "requests": { &self.id: record } } });
        if let Err(e) =
            self.api.patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&patch)).await
        {
            tracing::warn!(name = %self.name, id = %self.id, error = %e, "cannot record a one-shot request's answer");
        }
    }
}

/// A JSON pointer token.
fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn a_record_without_an_answer_reads_as_an_unknown_outcome() {
        let resource = json!({"status": {"requests": {
            "promote-1": {"state": "Sent", "sentAtMs": 5},
            "promote-0": {"state": "Answered", "sentAtMs": 1, "code": 0, "durationMs": 40},
        }}});
        let mut all = records(&resource);
        all.sort_by(|a, b| a.id.cmp(&b.id));
        let answered = all[0].response();
        assert_eq!(
            (answered.id.as_str(), answered.code, answered.error.as_deref()),
            ("promote-0", Some(0), None)
        );
        let unknown = all[1].response();
        assert_eq!(unknown.code, None);
        assert!(unknown.error.as_deref().is_some_and(|e| e.contains("outcome unknown")), "{unknown:?}");
    }
}
