//! Unchanged repetitions of a guardrails decision, counted instead of written again.
//!
//! A converged resource is planned again on every wake, and its plan's actions are decided
//! again with the same input, bundle and result. The audit chain records such a decision once
//! in full; what follows is counted here, keyed by a digest of everything the record would
//! say but its time, ids and evaluation time, and written once a period as one chained record
//! per decision point, requester and bundle ([`Repetition`]): a table with a row per decision
//! repeated, naming the original by its `seq` and the first 16 hex digits of its `hash`, with
//! the count and the first and last time (Unix seconds). A different input, bundle, requester
//! or result has another key: it is never counted as a repetition. Bounded: past
//! [`MAX_TRACKED`] decisions a new one is simply written in full each time.

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
    count: u64,
    first: Option<jiff::Timestamp>,
    last: Option<jiff::Timestamp>,
    /// Flushes in a row that found no repetition: forgotten at two.
    idle_flushes: u8,
}

/// One record's worth of repetitions (one decision point, requester and bundle), as
/// [`Repeats::take`] hands them out to be written.
#[derive(Debug, Clone)]
pub struct Repetition {
    pub point: DecisionPoint,
    pub requested_by: String,
    pub bundle: String,
    /// The record's `input`: the decisions repeated, a row each.
    pub input: Value,
    /// The record's `result`: how many decisions, how many repetitions in all.
    pub result: Value,
}

/// The columns of a row of [`Repetition::input`].
pub const ROW_FIELDS: [&str; 5] = ["seq", "hash", "count", "first", "last"];

/// The repetition counters of one audit log.
#[derive(Debug, Default)]
pub struct Repeats {
    entries: HashMap<[u8; 32], Entry>,
}

/// The key of a record: everything the record says about the decision (point, requester,
/// bundle, input, result, error), not when or under which ids.
pub fn key(rec: &DecisionRecord<'_>) -> [u8; 32] {
    let input = Sha256::digest(rec.input.to_string().as_bytes());
    let mut h = Sha256::new();
    for part in [rec.point.name(), rec.requested_by, rec.bundle_digest, rec.error.unwrap_or("")] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    h.update(input);
    h.update(rec.result.to_string().as_bytes());
    h.finalize().into()
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
    pub fn remember(&mut self, key: [u8; 32], rec: &DecisionRecord<'_>, original: Original) {
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
                count: 0,
                first: None,
                last: None,
                idle_flushes: 0,
            },
        );
    }

    /// The repetitions counted since the last call, one record per decision point, requester
    /// and bundle, its rows in the order the repeated records were written; counters reset. A
    /// decision not repeated for two periods is forgotten (written in full if it comes back).
    pub fn take(&mut self) -> Vec<Repetition> {
        type Group = (DecisionPoint, String, String);
        let mut groups: std::collections::BTreeMap<Group, Vec<(u64, Value, u64)>> = Default::default();
        self.entries.retain(|_, e| {
            if e.count == 0 {
                e.idle_flushes += 1;
                return e.idle_flushes < 2;
            }
            let secs = |t: Option<jiff::Timestamp>| t.map_or(0, |t| t.as_second());
            let hash = e.original.hash.get(..16).unwrap_or(&e.original.hash);
            let row = json!([e.original.seq, hash, e.count, secs(e.first), secs(e.last)]);
            groups.entry((e.point, e.requested_by.clone(), e.bundle.clone())).or_default().push((
                e.original.seq,
                row,
                e.count,
            ));
            (e.count, e.first, e.last, e.idle_flushes) = (0, None, None, 0);
            true
        });
        let mut out: Vec<Repetition> = groups
            .into_iter()
            .map(|((point, requested_by, bundle), mut rows)| {
                rows.sort_by_key(|(seq, _, _)| *seq);
                let total: u64 = rows.iter().map(|(_, _, n)| n).sum();
                let decisions = rows.len();
                Repetition {
                    point,
                    requested_by,
                    bundle,
                    input: json!({ "repeated": { "fields": ROW_FIELDS, "rows": rows.into_iter().map(|(_, r, _)| r).collect::<Vec<_>>() } }),
                    result: json!({ "decisions": decisions, "repetitions": total }),
                }
            })
            .collect();
        // In the order of the first record each repeats.
        out.sort_by_key(|r| r.input.pointer("/repeated/rows/0/0").and_then(Value::as_u64));
        out
    }

    /// Decisions tracked now.
    pub fn tracked(&self) -> usize {
        self.entries.len()
    }
}
