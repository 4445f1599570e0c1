//! Unchanged repetitions of a guardrails decision, counted instead of written again.
//!
//! A converged resource is planned again on every wake, and its plan's actions are decided
//! again with the same input, bundle and result. The audit chain records such a decision once
//! in full; what follows is counted here, keyed by a digest of everything the record would
//! say but its time, ids and evaluation time, and written as one chained record per decision
//! and period ([`Repetition`]) naming the original's `decision_id`, `seq` and `hash`, the input
//! digest, the first and last time and the count. A different input, bundle, requester or
//! result has another key: it is never counted as a repetition. Bounded: past [`MAX_TRACKED`]
//! decisions a new one is simply written in full each time.

use std::collections::HashMap;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::audit::DecisionRecord;
use super::engine::DecisionPoint;

/// Decisions tracked at once (about 300 bytes each).
pub const MAX_TRACKED: usize = 20_000;

/// The record a repetition repeats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Original {
    pub decision_id: String,
    pub seq: u64,
    pub hash: String,
}

/// What one tracked decision was written as, and how often it came again since the last flush.
#[derive(Debug, Clone)]
struct Entry {
    original: Original,
    point: DecisionPoint,
    requested_by: String,
    bundle: String,
    input_sha256: String,
    count: u64,
    first: Option<jiff::Timestamp>,
    last: Option<jiff::Timestamp>,
    /// Flushes in a row that found no repetition: forgotten at two.
    idle_flushes: u8,
}

/// One record's worth of repetitions, as [`Repeats::take`] hands them out to be written.
#[derive(Debug, Clone)]
pub struct Repetition {
    pub point: DecisionPoint,
    pub requested_by: String,
    pub bundle: String,
    /// The record's `input`: whose repetitions these are.
    pub input: Value,
    /// The record's `result`: how many, first and last.
    pub result: Value,
}

/// The repetition counters of one audit log.
#[derive(Debug, Default)]
pub struct Repeats {
    entries: HashMap<[u8; 32], Entry>,
}

/// The key of a record and the digest of its input: everything the record says about the
/// decision (point, requester, bundle, input, result, error), not when or under which ids.
pub fn key(rec: &DecisionRecord<'_>) -> ([u8; 32], String) {
    let input = Sha256::digest(rec.input.to_string().as_bytes());
    let mut h = Sha256::new();
    for part in [rec.point.name(), rec.requested_by, rec.bundle_digest, rec.error.unwrap_or("")] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    h.update(input);
    h.update(rec.result.to_string().as_bytes());
    (h.finalize().into(), hex::encode(input))
}

impl Repeats {
    /// Counts a repetition of the decision with `key`, if it is tracked: then the record it
    /// repeats, and nothing is to be written.
    pub fn repeat(&mut self, key: &[u8; 32], now: jiff::Timestamp) -> Option<Original> {
        let e = self.entries.get_mut(key)?;
        e.count += 1;
        e.first.get_or_insert(now);
        e.last = Some(now);
        Some(e.original.clone())
    }

    /// Tracks a decision just written in full as `original` (unless full).
    pub fn remember(
        &mut self,
        key: [u8; 32],
        input_sha256: String,
        rec: &DecisionRecord<'_>,
        original: Original,
    ) {
        if self.entries.len() >= MAX_TRACKED {
            return;
        }
        self.entries.insert(
            key,
            Entry {
                original,
                point: rec.point,
                requested_by: rec.requested_by.to_string(),
                bundle: rec.bundle_digest.to_string(),
                input_sha256,
                count: 0,
                first: None,
                last: None,
                idle_flushes: 0,
            },
        );
    }

    /// The repetitions counted since the last call, one per decision, counters reset; a
    /// decision not repeated for two periods is forgotten (written in full if it comes back).
    pub fn take(&mut self) -> Vec<Repetition> {
        let mut out = Vec::new();
        self.entries.retain(|_, e| {
            if e.count == 0 {
                e.idle_flushes += 1;
                return e.idle_flushes < 2;
            }
            let ts = |t: Option<jiff::Timestamp>| t.map(|t| t.to_string());
            out.push(Repetition {
                point: e.point,
                requested_by: e.requested_by.clone(),
                bundle: e.bundle.clone(),
                input: json!({
                    "repetition_of": {
                        "decision_id": e.original.decision_id,
                        "seq": e.original.seq,
                        "hash": e.original.hash,
                    },
                    "input_sha256": e.input_sha256,
                }),
                result: json!({ "count": e.count, "first": ts(e.first), "last": ts(e.last) }),
            });
            (e.count, e.first, e.last, e.idle_flushes) = (0, None, None, 0);
            true
        });
        // In the order the repeated records were written.
        out.sort_by_key(|r| r.input.pointer("/repetition_of/seq").and_then(Value::as_u64));
        out
    }

    /// Decisions tracked now.
    pub fn tracked(&self) -> usize {
        self.entries.len()
    }
}
