//! Every policy evaluation is bounded (tests/fixtures/policy-bombs): a bundle that breaks a
//! bound on its first evaluation or in its tests is refused like a broken bundle, and a rule
//! that runs away for one input fails that decision closed, in bounded time.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use stateward::policy::engine::EVAL_TIME_LIMIT;
use stateward::policy::{Bundle, DecisionPoint, PolicyEngine, PolicyError};
use stateward::reload::policy::vet;

fn bomb(name: &str) -> Bundle {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/policy-bombs").join(name);
    Bundle::from_dir(&dir).expect("read the fixture bundle")
}

/// Slack over the per-evaluation limit for compiling, data loading and a busy machine.
const SLACK: Duration = Duration::from_secs(10);

/// `count(numbers.range(0, 1e12))`: before the bound, the first evaluation aborted the process
/// asking for 24 TB. Now the bundle is refused before anything evaluates, naming the builtin.
#[test]
fn a_numbers_range_bomb_is_refused_like_a_broken_bundle() {
    let started = Instant::now();
    let rejection = vet(&bomb("range")).map(|_| ()).expect_err("the bomb must be refused");
    println!("range bomb refused in {:?}: {}", started.elapsed(), rejection.message);
    assert_eq!(rejection.reason, "bound_exceeded");
    assert!(rejection.message.contains("numbers.range"), "{}", rejection.message);
    let err = PolicyEngine::compile(&bomb("range")).map(|_| ()).expect_err("compile refuses it too");
    assert!(matches!(err, PolicyError::Bound(_)), "{err}");
    assert_eq!(err.label(), "bound");
}

/// [hardening-2] 5: one builtin call that allocates by its argument. `sprintf("%4000000000d",
/// [1])` aborted the process ("memory allocation of 3999999999 bytes failed"), `bits.lsh(1, 4e9)`
/// took 500 MB in one call; both bundles are refused before anything evaluates, naming why.
#[test]
fn builtin_calls_that_allocate_by_their_arguments_are_refused() {
    for (name, names) in [("sprintf-width", "a width of 4000000000 is over 999"), ("lsh", "bits.lsh")] {
        let rejection = vet(&bomb(name)).map(|_| ()).expect_err("the bomb must be refused");
        assert_eq!(rejection.reason, "bound_exceeded", "{name}");
        assert!(rejection.message.contains(names), "{name}: {}", rejection.message);
    }
}

/// A `test_*` rule that would run for hours: the bundle's tests are bounded too.
#[test]
fn a_bundle_whose_tests_run_away_is_refused_in_bounded_time() {
    let started = Instant::now();
    let rejection = vet(&bomb("slow")).map(|_| ()).expect_err("must be refused");
    let took = started.elapsed();
    println!("slow tests refused in {took:?}: {}", rejection.message);
    assert_eq!(rejection.reason, "bound_exceeded");
    assert!(rejection.message.contains("test_slow"), "{}", rejection.message);
    assert!(took < EVAL_TIME_LIMIT + SLACK, "took {took:?}");
}

/// A rule that runs away for one input passes the first evaluation, but that decision fails
/// closed (an error, treated as a deny) within the bound, and the next decision is unaffected.
#[test]
fn a_decision_that_runs_away_fails_closed_in_bounded_time() {
    let engine = PolicyEngine::compile(&bomb("slow-input")).expect("quick on an empty input");
    let input = |verb: &str| serde_json::json!({"action": {"verb": verb, "object": {}}});
    let started = Instant::now();
    let slow = engine.evaluate(DecisionPoint::Guardrails, &input("slow"));
    let took = started.elapsed();
    println!("runaway decision stopped in {took:?}: {:?}", slow.error);
    let error = slow.error.expect("a runaway decision is an error");
    assert!(error.contains("limit"), "{error}");
    assert!(took < EVAL_TIME_LIMIT + SLACK, "took {took:?}");
    let quick = engine.evaluate(DecisionPoint::Guardrails, &input("apply"));
    assert_eq!((quick.error, quick.deny), (None, Vec::<String>::new()));
}

/// The interpreter path (tests, queries, decision points the RVM cannot compile) is bounded by
/// the same timer as the RVM fast path.
#[test]
fn a_query_that_runs_away_is_stopped() {
    let engine = PolicyEngine::compile(&bomb("slow-input")).expect("compiles");
    let started = Instant::now();
    let err = engine
        .query("data.stateward.guardrails.deny", &serde_json::json!({"action": {"verb": "slow"}}))
        .expect_err("a runaway query is an error");
    let took = started.elapsed();
    println!("runaway query stopped in {took:?}: {err}");
    assert!(err.to_string().contains("time limit"), "{err}");
    assert!(took < EVAL_TIME_LIMIT + SLACK, "took {took:?}");
}
