//! The run's figures: what a test measured (a write gap, a swap time, a latency), kept apart
//! from its verdict.
//!
//! A test asserts what must always hold (nothing lost, the order of a roll) and a liveness
//! ceiling well above its target (a failover that never comes fails); how fast it went is a
//! figure, recorded here with the target it is compared against. A figure over its target is
//! shown in the run's table (`stateward-report`, printed near the end of `scripts/test`), never
//! a failure: timings on a shared 2-core machine are evidence, not verdicts.
//!
//! Figures are appended, one JSON object a line, to the file `$STATEWARD_REPORT` names (the
//! re-executed real-pods children inherit it); without it they are only printed.
//!
//! ```no_run
//! use stateward_testkit::report::{self, Target};
//! report::figure("pg.switchover.write_gap", 3_200.0, "ms", Target::AtMost(5_000.0));
//! ```

use std::io::Write as _;
use std::time::Duration;

use serde_json::{json, Value};

/// The file the figures go to, set by `scripts/test`.
pub const REPORT_ENV: &str = "STATEWARD_REPORT";
/// The last run's report (`stateward-report.json`), for the real-pods tests' durations.
pub const PREVIOUS_ENV: &str = "STATEWARD_REPORT_PREVIOUS";

/// What a figure is compared against.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Target {
    /// Met when the figure is at most this.
    AtMost(f64),
    /// Met when the figure is at least this.
    AtLeast(f64),
    /// Recorded for the record (a duration, a count); nothing to meet.
    None,
}

impl Target {
    /// Whether `value` meets the target.
    pub fn met(self, value: f64) -> bool {
        match self {
            Target::AtMost(t) => value <= t,
            Target::AtLeast(t) => value >= t,
            Target::None => true,
        }
    }

    fn to_json(self) -> Value {
        match self {
            Target::AtMost(t) => json!({ "op": "<=", "value": t }),
            Target::AtLeast(t) => json!({ "op": ">=", "value": t }),
            Target::None => Value::Null,
        }
    }
}

/// Records the figure `name` (dotted, e.g. `pg.failover.write_gap`) of the running test.
pub fn figure(name: &str, value: f64, unit: &str, target: Target) {
    let test = std::thread::current().name().unwrap_or("").to_owned();
    let line = json!({
        "test": test,
        "figure": name,
        "value": value,
        "unit": unit,
        "target": target.to_json(),
        "met": target.met(value),
    });
    let missed = if target.met(value) { "" } else { " (over its target: reported, not failed)" };
    eprintln!("figure: {name} = {value} {unit}{missed}");
    append(&line);
}

/// Records a duration in seconds, with an optional target.
pub fn seconds(name: &str, took: Duration, at_most: Option<Duration>) {
    let target = at_most.map_or(Target::None, |t| Target::AtMost(t.as_secs_f64()));
    figure(name, (took.as_secs_f64() * 1000.0).round() / 1000.0, "s", target);
}

/// Records a duration in milliseconds against a target in milliseconds.
pub fn millis(name: &str, ms: u64, at_most: u64) {
    figure(name, ms as f64, "ms", Target::AtMost(at_most as f64));
}

/// How many times its target a timing may reach before its test fails: a liveness ceiling
/// (what never comes fails), never a performance claim (a slow one is reported).
pub const LIVENESS_FACTOR: u64 = 3;

/// Records a duration in milliseconds against its target, and fails the test only past
/// [`LIVENESS_FACTOR`] times the target.
pub fn millis_within_liveness(name: &str, ms: u64, target: u64) {
    millis(name, ms, target);
    let ceiling = target.saturating_mul(LIVENESS_FACTOR);
    assert!(
        ms <= ceiling,
        "{name}: {ms} ms, past the liveness ceiling of {ceiling} ms ({LIVENESS_FACTOR}x the target of {target} ms)"
    );
}

/// Records how long the test `test` took, as run by its harness (the real-pods re-execution).
pub fn test_duration(test: &str, took: Duration, outcome: &str) {
    let line = json!({
        "test": test,
        "duration_s": (took.as_secs_f64() * 10.0).round() / 10.0,
        "outcome": outcome,
    });
    append(&line);
}

fn append(line: &Value) {
    let Some(path) = std::env::var_os(REPORT_ENV) else { return };
    let mut text = line.to_string();
    text.push('\n');
    // One write of a whole line with O_APPEND: lines of tests running at once do not interleave.
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(text.as_bytes()));
    if let Err(e) = written {
        eprintln!("report: could not append to {}: {e}", std::path::Path::new(&path).display());
    }
}

/// The run's report: every figure and every measured test duration of the lines in `jsonl`,
/// as one JSON document, and the table printed at the end of the run.
pub fn summarize(jsonl: &str) -> (Value, String) {
    let mut figures = Vec::new();
    let mut tests = Vec::new();
    for line in jsonl.lines().filter(|l| !l.trim().is_empty()) {
        match serde_json::from_str::<Value>(line) {
            Ok(v) if v.get("figure").is_some() => figures.push(v),
            Ok(v) if v.get("duration_s").is_some() => tests.push(v),
            _ => {}
        }
    }
    tests.sort_by(|a, b| {
        b["duration_s"].as_f64().unwrap_or(0.0).total_cmp(&a["duration_s"].as_f64().unwrap_or(0.0))
    });
    // One row per figure: its value, or min/median/max when it was measured more than once
    // (scripts/bench runs the scenarios several times). A row misses when its median does.
    let mut groups: std::collections::BTreeMap<&str, Vec<&Value>> = std::collections::BTreeMap::new();
    for f in &figures {
        groups.entry(f["figure"].as_str().unwrap_or("")).or_default().push(f);
    }
    let mut rows = Vec::new();
    for (name, measured) in &groups {
        let mut values: Vec<f64> = measured.iter().filter_map(|f| f["value"].as_f64()).collect();
        values.sort_by(f64::total_cmp);
        let (Some(min), Some(max)) = (values.first().copied(), values.last().copied()) else { continue };
        let median = values[values.len() / 2];
        let first = measured[0];
        let target = match (first["target"]["op"].as_str(), first["target"]["value"].as_f64()) {
            (Some("<="), Some(t)) => Target::AtMost(t),
            (Some(">="), Some(t)) => Target::AtLeast(t),
            _ => Target::None,
        };
        rows.push(json!({
            "figure": name, "unit": first["unit"], "n": values.len(),
            "min": min, "median": median, "max": max,
            "target": target.to_json(), "met": target.met(median),
            "test": first["test"],
        }));
    }
    let missed = rows.iter().filter(|r| r["met"] == false).count();

    let mut table = format!(
        "figures of this run: {} measured, {missed} over target (reported, not failed)\n",
        rows.len()
    );
    let width = rows.iter().filter_map(|f| f["figure"].as_str()).map(str::len).max().unwrap_or(6).max(6);
    table.push_str(&format!(
        "  {:width$}  {:>22}  {:>12}  {}\n",
        "figure", "value (min/median/max)", "target", "test"
    ));
    for r in &rows {
        let unit = r["unit"].as_str().unwrap_or("");
        let value = if r["n"] == 1 {
            format!("{} {unit}", number(&r["median"]))
        } else {
            format!("{}/{}/{} {unit}", number(&r["min"]), number(&r["median"]), number(&r["max"]))
        };
        let target = match (r["target"]["op"].as_str(), r["target"].get("value")) {
            (Some(op), Some(t)) => format!("{op} {} {unit}", number(t)),
            _ => "-".to_owned(),
        };
        let mark = if r["met"] == false { "  MISSED" } else { "" };
        let test = r["test"].as_str().unwrap_or("").rsplit("::").next().unwrap_or("");
        table.push_str(&format!(
            "  {:width$}  {value:>22}  {target:>12}  {test}{mark}\n",
            r["figure"].as_str().unwrap_or("")
        ));
    }
    if !tests.is_empty() {
        let total: f64 = tests.iter().filter_map(|t| t["duration_s"].as_f64()).sum();
        table.push_str(&format!(
            "real-pods tests, longest first ({} tests, {total:.0} s in all):\n",
            tests.len()
        ));
        for t in &tests {
            table.push_str(&format!(
                "  {:>7.1} s  {:7}  {}\n",
                t["duration_s"].as_f64().unwrap_or(0.0),
                t["outcome"].as_str().unwrap_or(""),
                t["test"].as_str().unwrap_or("")
            ));
        }
    }
    let report = json!({ "summary": rows, "missed": missed, "figures": figures, "tests": tests });
    (report, table)
}

/// Each test's duration in seconds from a report [`summarize`] wrote.
pub fn durations(report_json: &str) -> std::collections::HashMap<String, f64> {
    let report: Value = serde_json::from_str(report_json).unwrap_or(Value::Null);
    report["tests"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| Some((t["test"].as_str()?.to_owned(), t["duration_s"].as_f64()?)))
        .collect()
}

fn number(v: &Value) -> String {
    match v.as_f64() {
        Some(x) if x.fract() == 0.0 => format!("{x:.0}"),
        Some(x) => format!("{x:.2}"),
        None => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_figure_over_its_target_is_marked_missed_and_durations_are_longest_first() {
        let lines = [
            json!({"test": "pg_ha::failover", "figure": "pg.failover.write_gap", "value": 7000.0, "unit": "ms", "target": {"op": "<=", "value": 5000.0}, "met": false}),
            json!({"test": "pg_ha::switchover", "figure": "pg.switchover.write_gap", "value": 1200.0, "unit": "ms", "target": {"op": "<=", "value": 5000.0}, "met": true}),
            json!({"test": "a", "duration_s": 12.0, "outcome": "passed"}),
            json!({"test": "b", "duration_s": 90.5, "outcome": "failed"}),
        ]
        .map(|v| v.to_string())
        .join("\n");
        let (report, table) = summarize(&format!("{lines}\nnot json\n"));
        assert_eq!(report["missed"], 1);
        assert_eq!(report["figures"].as_array().map(Vec::len), Some(2));
        assert_eq!(report["summary"].as_array().map(Vec::len), Some(2));
        assert_eq!(report["tests"][0]["test"], "b", "longest first");
        let failover = table.lines().find(|l| l.contains("pg.failover.write_gap")).unwrap_or_default();
        assert!(
            failover.contains("7000 ms") && failover.contains("<= 5000 ms") && failover.ends_with("MISSED")
        );
        let switchover = table.lines().find(|l| l.contains("pg.switchover.write_gap")).unwrap_or_default();
        assert!(!switchover.contains("MISSED"), "{switchover}");
    }

    #[test]
    fn a_figure_measured_several_times_shows_min_median_max_and_misses_by_its_median() {
        let lines: Vec<String> = [900.0, 7000.0, 1200.0]
            .iter()
            .map(|v| json!({"test": "t", "figure": "gap", "value": v, "unit": "ms", "target": {"op": "<=", "value": 5000.0}, "met": *v <= 5000.0}).to_string())
            .collect();
        let (report, table) = summarize(&lines.join("\n"));
        assert_eq!(report["summary"][0]["median"], 1200.0);
        assert_eq!(report["missed"], 0, "the median meets the target");
        assert!(table.contains("900/1200/7000 ms"), "{table}");
    }

    #[test]
    fn targets_compare_both_ways() {
        assert!(Target::AtMost(5.0).met(5.0) && !Target::AtMost(5.0).met(5.1));
        assert!(Target::AtLeast(2.0).met(2.0) && !Target::AtLeast(2.0).met(1.9));
        assert!(Target::None.met(f64::MAX));
    }
}
