//! Requests to the running service on real pods, beyond the plugins' own polls: faults that
//! must each come back as an answer with an error while the operator's other resources keep
//! their reconcile latency, and the exec round trip measured against a plain `kubectl exec`.
//! Both use the hostile test fixture (`spec.mode` `faults`, `bench`, `idle`), which asks for
//! what the test needs and shows every answer in its status.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{AttachParams, Patch, PatchParams};
use kube::Api;
use serde_json::{json, Value};
use stateward_testkit::real::{RealPods, Weight};
use stateward_testkit::TestEnv;

use super::e2e::{self, get_cr, summary, wait_for, Operator};
use super::{
    apply_hostile, apply_json, hostile_api, hostile_setup, kubectl_in, kubectl_ok, pod_ready, PG_IMAGE,
};

/// A pod of instance `h` running `command` in its container `main`.
fn pod(name: &str, command: &[&str], ports: &[u16]) -> Value {
    let ports: Vec<Value> = ports.iter().map(|p| json!({"containerPort": p})).collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"stateward.dev/instance": "h"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": PG_IMAGE, "imagePullPolicy": "Never", "command": command, "ports": ports}],
        },
    })
}

/// The operator with the hostile fixture as its plugin (and its webhooks, so the certificate
/// keeper issues the service certificates), with `args` added to `stateward run`'s.
fn start_operator(
    env: &TestEnv,
    name: &str,
    plugins: &std::path::Path,
    policies: &std::path::Path,
    args: &[&str],
) -> Operator {
    super::start_operator_with(env, name, Some(plugins.to_path_buf()), Some(policies.to_path_buf()), args)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// CPU seconds (user + system) the process `pid` has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/<pid>/stat");
    // Fields after the command name (in parentheses): state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
    // In clock ticks: USER_HZ, 100 on Linux.
    ticks / 100.0
}

/// `VmRSS` of `pid` in KiB, and how many files it has open.
fn rss_and_fds(pid: u32) -> (u64, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0);
    (rss, fds)
}

/// A HostileThing in mode `idle` (a plan of nothing): one of the operator's other resources.
fn idle(env: &TestEnv, name: &str) {
    apply_hostile(env, name, json!({"mode": "idle", "tag": 0}));
}

/// One round over the idle resources: each spec changed through the API, then the time until
/// its status shows that generation (a whole reconcile: plugin, policy, status write).
async fn latency_round(api: &Api<kube::core::DynamicObject>, names: &[String], tag: u32) -> Vec<Duration> {
    let mut patched = Vec::new();
    for name in names {
        let body = json!({"spec": {"tag": tag}});
        let cr = api.patch(name, &PatchParams::default(), &Patch::Merge(&body)).await.expect("patch");
        patched.push((name.clone(), cr.metadata.generation, Instant::now()));
    }
    let mut took = Vec::new();
    for (name, generation, at) in patched {
        loop {
            let cr = get_cr(api, &name).await.expect("CR");
            if cr["status"]["observedGeneration"].as_i64() >= generation {
                took.push(at.elapsed());
                break;
            }
            assert!(at.elapsed() < Duration::from_secs(60), "{name} never caught up: {}", cr["status"]);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    took
}

async fn latency_rounds(
    api: &Api<kube::core::DynamicObject>,
    names: &[String],
    tags: std::ops::Range<u32>,
) -> Vec<Duration> {
    let mut all = Vec::new();
    for tag in tags {
        all.extend(latency_round(api, names, tag).await);
    }
    all.sort();
    all
}

/// Waits until the answer `id` is one `ok` accepts; says how long it took.
async fn expect_answer(
    api: &Api<kube::core::DynamicObject>,
    id: &'static str,
    what: &'static str,
    ok: fn(&Value) -> bool,
) -> Value {
    let (a, took) = wait_for(&format!("answer {id}: {what}"), Duration::from_secs(120), || async move {
        let a = answer(api, id).await.ok_or_else(|| "no answer yet".to_string())?;
        if ok(&a) {
            Ok(a)
        } else {
            Err(a.to_string())
        }
    })
    .await;
    eprintln!("realpods: request {id} ({what}) answered {took:.1?} into the wait: {a}");
    a
}

/// The answer `id` as the fixture shows it in `status.answers`.
async fn answer(api: &Api<kube::core::DynamicObject>, id: &str) -> Option<Value> {
    let cr = get_cr(api, "h").await?;
    cr.pointer(&format!("/status/answers/{id}")).cloned()
}

/// The fixture's requests that go wrong (a container not running, a command past its timeout,
/// 50 MB of output, output without end, a server that never answers, a pod deleted while its
/// command runs) each come back to the plugin as an answer with an error or cut output, again
/// and again, never a stuck reconcile or a crash; the other resources' reconciles keep their
/// latency; a hanging poll backs off, so it leaves few processes behind in its container.
#[tokio::test]
async fn faulty_requests_become_answers_with_errors_and_other_resources_keep_their_latency() {
    let Some(env) = RealPods::enter(Weight::Medium, "rp-faults").await.expect("real-pods cluster") else {
        return;
    };
    let (plugins, policies) = hostile_setup(&env, &["echo", "true", "sleep", "head", "cat"]);
    // h-0 runs `sleep 86400`, so the `sleep 3600` the hanging request leaves are told apart.
    let silent = "use IO::Socket::INET; my $s = IO::Socket::INET->new(LocalPort => 8080, Listen => 64, ReuseAddr => 1) or die $!; my @held; while (my $c = $s->accept) { push @held, $c }";
    let mut stopped = pod("h-stopped", &["sh", "-c", "exit 3"], &[]);
    stopped["spec"]["restartPolicy"] = json!("Never");
    apply_json(
        &env,
        &[
            pod("h-0", &["sleep", "86400"], &[]),
            pod("h-victim", &["sleep", "86400"], &[]),
            pod("h-silent", &["perl", "-e", silent], &[8080]),
            stopped,
        ],
    );
    for p in ["h-0", "h-victim", "h-silent"] {
        pod_ready(&env, p, Duration::from_secs(120)).await;
    }
    let pods: Api<Pod> = env.api();
    wait_for("h-stopped's container exited", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move {
            let p = pods.get("h-stopped").await.map_err(|e| e.to_string())?;
            let st = p.status.unwrap_or_default();
            let exited = st
                .container_statuses
                .unwrap_or_default()
                .iter()
                .any(|c| c.state.as_ref().and_then(|s| s.terminated.as_ref()).is_some());
            if exited {
                Ok(())
            } else {
                Err(format!("phase {:?}", st.phase))
            }
        }
    })
    .await;

    let mut op = start_operator(&env, "faults", &plugins.0, &policies, &["--audit-repeat-interval", "1"]);
    op.wait_ready(Duration::from_secs(60)).await;
    let pid = op.pid().expect("operator pid");
    let api = hostile_api(&env);
    let others: Vec<String> = (0..4).map(|i| format!("o{i}")).collect();
    for o in &others {
        idle(&env, o);
    }
    let _ = latency_rounds(&api, &others, 1..2).await;
    let before = latency_rounds(&api, &others, 2..7).await;
    let (rss0, fds0) = rss_and_fds(pid);

    // Every fault at once, from one resource.
    let faults = "ok stopped hang huge endless silent victim";
    let started = Instant::now();
    let cpu0 = cpu_seconds(pid);
    apply_hostile(&env, "h", json!({"mode": "faults", "faults": faults}));
    let during = latency_rounds(&api, &others, 7..12).await;

    let expect =
        |id: &'static str, what: &'static str, ok: fn(&Value) -> bool| expect_answer(&api, id, what, ok);
    let error_has = |a: &Value, text: &str| a["error"].as_str().is_some_and(|e| e.contains(text));
    expect("ok", "exit 0", |a| a["code"] == 0 && a["stdoutBytes"] == 3).await;
    expect("stopped", "not running", |a| {
        a["code"].is_null() && a["error"].as_str().is_some_and(|e| e.contains("is not running"))
    })
    .await;
    let hang = expect("hang", "timed out", |a| {
        a["code"].is_null()
            && a["error"].as_str().is_some_and(|e| e.contains("within the timeout of 2000 ms"))
    })
    .await;
    assert!(error_has(&hang, "timeout"));
    // Output past the cap is not read: the answer comes with the first 64 KiB, long before the
    // command could have written the rest (or, for the endless one, its timeout).
    for id in ["huge", "endless"] {
        let a = expect(id, "cut at the cap", |a| {
            a["code"].is_null()
                && a["truncated"] == true
                && a["stdoutBytes"] == 65536
                && a["error"].as_str().is_some_and(|e| e.contains("output past the cap of 65536 bytes"))
        })
        .await;
        assert!(a["durationMs"].as_u64() < Some(2000), "{id}: {a}");
    }
    expect("silent", "timed out", |a| {
        a["code"].is_null()
            && a["error"].as_str().is_some_and(|e| e.contains("within the timeout of 2000 ms"))
    })
    .await;

    // A pod deleted while its command runs (`sleep 280` of a 290 s timeout): the answer comes
    // when the pod goes, not when the timeout passes.
    wait_for("the victim's command running", Duration::from_secs(60), || {
        let out = kubectl_in(
            &env,
            &["exec", "h-victim", "--", "sh", "-c", "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 280 $' || true"],
        );
        let n = String::from_utf8_lossy(&out.stdout).trim().to_string();
        async move {
            if n == "1" {
                Ok(())
            } else {
                Err(format!("{n} running"))
            }
        }
    })
    .await;
    assert!(answer(&api, "victim").await.is_none(), "the victim's command is still running");
    let deleted = Instant::now();
    kubectl_ok(&env, &["delete", "pod", "h-victim", "--grace-period=1", "--wait=false"]);
    let victim = expect("victim", "ended with its pod", |a| a["code"] != 0 || !a["error"].is_null()).await;
    let victim_took = deleted.elapsed();
    assert!(
        victim_took < Duration::from_secs(60),
        "the answer waited for more than its pod: {victim_took:?}"
    );

    // Still answering: the failing polls are sent again (backing off), and the resource is
    // neither degraded nor stuck.
    let first_hang = hang["startedAtMs"].as_u64().expect("startedAtMs");
    let (later, _) = wait_for("the hanging poll sent again", Duration::from_secs(60), || {
        let api = api.clone();
        async move {
            let a = answer(&api, "hang").await.ok_or("no answer")?;
            if a["startedAtMs"].as_u64() > Some(first_hang) {
                Ok(a)
            } else {
                Err(a.to_string())
            }
        }
    })
    .await;
    let cr = get_cr(&api, "h").await.expect("CR");
    assert_ne!(e2e::condition(&cr, "Degraded"), Some("True"), "{}", summary(&cr));
    assert!(op.exited().is_none(), "the operator is still running");
    // A minute and more of the faults going on (the huge output every 5 s, the endless one and
    // the hanging ones backing off): the other resources' latency all along.
    let mut after = Vec::new();
    let mut tag = 12;
    while started.elapsed() < Duration::from_secs(90) {
        after.extend(latency_round(&api, &others, tag).await);
        tag += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    after.sort();
    let cr = get_cr(&api, "h").await.expect("CR");
    assert_ne!(e2e::condition(&cr, "Degraded"), Some("True"), "{}", summary(&cr));
    let huge = answer(&api, "huge").await.expect("huge");
    assert!(
        huge["startedAtMs"].as_u64() > Some(first_hang + 20_000),
        "the huge output is still asked for: {huge}"
    );
    let (rss1, fds1) = rss_and_fds(pid);
    let cpu_rate = (cpu_seconds(pid) - cpu0) / started.elapsed().as_secs_f64();

    // What the hanging poll left behind in its container: one `sleep 3600` per send (the API
    // server's exec cannot signal a command), sent less and less often.
    let elapsed = started.elapsed();
    let out = kubectl_in(
        &env,
        &["exec", "h-0", "--", "sh", "-c", "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 3600 $' || true"],
    );
    let left: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0);
    // Each answer is audited, those never sent too: a poll's first answer of each kind in
    // full, the later ones that ended the same way as counted repetitions of it (written with
    // the period's flush: every second for this operator).
    let audit = std::fs::read_to_string(&op.audit).expect("audit log");
    let records: Vec<Value> = audit.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).collect();
    let outcomes: Vec<&Value> = records.iter().filter(|r| r.pointer("/result/outcome").is_some()).collect();
    let repeated_rows: Vec<&Value> = records
        .iter()
        .filter_map(|r| r.pointer("/input/repeated/rows").and_then(Value::as_array))
        .flatten()
        .collect();
    let count = |id: &str, sent: bool| {
        let full: Vec<u64> = outcomes
            .iter()
            .filter(|r| r["result"]["outcome"]["id"] == id && r["result"]["outcome"]["sent"] == sent)
            .filter_map(|r| r["seq"].as_u64())
            .collect();
        let counted: u64 = repeated_rows
            .iter()
            .filter(|row| row[0].as_u64().is_some_and(|seq| full.contains(&seq)))
            .filter_map(|row| row[2].as_u64())
            .sum();
        full.len() + counted as usize
    };
    let (_, metrics) = op.get("/metrics").expect("metrics");
    let failed = e2e::sum_metric(&metrics, "stateward_reconcile_total", &["result=\"panicked\""]);

    eprintln!(
        "realpods: other resources' spec change → observedGeneration: before ({}) p50 {:.0} ms max {:.0} ms; \
         while the faults start ({}) p50 {:.0} ms max {:.0} ms; the faults going on to 90 s ({}) p50 {:.0} ms max {:.0} ms",
        before.len(),
        ms(percentile(&before, 0.5)),
        ms(before[before.len() - 1]),
        during.len(),
        ms(percentile(&during, 0.5)),
        ms(during[during.len() - 1]),
        after.len(),
        ms(percentile(&after, 0.5)),
        ms(after[after.len() - 1]),
    );
    eprintln!(
        "realpods: victim answered {victim_took:.1?} after its pod was deleted: {victim}; hang sent again at +{} ms: {later}",
        later["startedAtMs"].as_u64().unwrap_or(0).saturating_sub(first_hang)
    );
    eprintln!(
        "realpods: over {elapsed:.0?}: hang sent {} times, {left} `sleep 3600` left in h-0; audited outcomes: {} in all \
         (stopped, never sent: {}); operator RSS {rss0} → {rss1} KiB, open files {fds0} → {fds1}, CPU {:.0} ms/s",
        count("hang", true),
        outcomes.len(),
        count("stopped", false),
        cpu_rate * 1000.0,
    );
    assert_eq!(failed, 0.0, "no reconcile panicked");
    assert!(
        count("stopped", false) >= 1 && count("hang", true) >= 2 && count("silent", true) >= 2,
        "outcomes audited"
    );
    assert!(
        count("hang", true) <= 10,
        "a hanging poll backs off: sent {} times in {elapsed:?}",
        count("hang", true)
    );
    assert!(left as usize <= count("hang", true), "{left} sleeps left by {} sends", count("hang", true));
    assert!(fds1 <= fds0 + 32, "open files grew from {fds0} to {fds1}");
    // The faults run off the reconcile path: other resources wait for CPU, never for a request.
    // Their p50 against the quiet one is a figure (target: within twice it and 1 s); the
    // ceiling is liveness: a reconcile that waited for every hanging request would be held for
    // their timeouts again and again.
    let (quiet, busy, later) = (percentile(&before, 0.5), percentile(&during, 0.5), percentile(&after, 0.5));
    for (when, figure, p50) in
        [("while the faults start", "starting", busy), ("while they go on", "going_on", later)]
    {
        let excess = p50.saturating_sub(quiet * 2).as_millis() as u64;
        stateward_testkit::report::millis(
            &format!("requests.faults_{figure}.other_p50_over_2x_quiet"),
            excess,
            1_000,
        );
        assert!(
            p50 <= quiet * 3 + Duration::from_secs(6),
            "other resources' p50 {quiet:?} before, {p50:?} {when}: {during:?} / {after:?}"
        );
    }
    drop(op);
}

/// The exec round trip, from the reconcile that plans a request to the reconcile that observes
/// its answer, against a plain `kubectl exec` of the same command and the same exec made
/// directly through the API (kube's client, as the operator makes it), all in this run; and the
/// operator's CPU per request, from /proc. Prints the figures; the bounds are loose.
#[tokio::test]
async fn bench_exec_round_trip_against_kubectl_exec() {
    let Some(env) = RealPods::enter(Weight::Medium, "rp-bench").await.expect("real-pods cluster") else {
        return;
    };
    let rounds: usize =
        std::env::var("STATEWARD_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(60);
    const WARMUP: usize = 5;
    let (plugins, policies) = hostile_setup(&env, &["echo"]);
    apply_json(&env, &[pod("h-0", &["sleep", "86400"], &[])]);
    pod_ready(&env, "h-0", Duration::from_secs(120)).await;
    let mut op = start_operator(&env, "bench", &plugins.0, &policies, &[]);
    op.wait_ready(Duration::from_secs(60)).await;
    let pid = op.pid().expect("operator pid");
    let api = hostile_api(&env);

    // The operator idle (one resource that plans nothing), for its CPU at rest.
    idle(&env, "o0");
    let _ = latency_rounds(&api, &["o0".to_string()], 1..2).await;
    let (cpu0, t0) = (cpu_seconds(pid), Instant::now());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle_rate = (cpu_seconds(pid) - cpu0) / t0.elapsed().as_secs_f64();

    // The operator's round trips.
    let (_, metrics) = op.get("/metrics").expect("metrics");
    let sent0 = e2e::sum_metric(&metrics, "stateward_requests_total", &["verb=\"exec\""]);
    let (cpu1, t1) = (cpu_seconds(pid), Instant::now());
    apply_hostile(&env, "h", json!({"mode": "bench", "rounds": rounds + WARMUP}));
    let (status, _) = wait_for("every round answered", Duration::from_secs(60 + 5 * rounds as u64), || {
        let api = api.clone();
        async move {
            let cr = get_cr(&api, "h").await.ok_or("CR not found")?;
            let done = cr.pointer("/status/benchDone").and_then(Value::as_u64).unwrap_or(0);
            if done as usize >= rounds + WARMUP {
                Ok(cr["status"].clone())
            } else {
                Err(format!("{done} rounds: {}", summary(&cr)))
            }
        }
    })
    .await;
    let busy = t1.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid) - cpu1;
    let (_, metrics) = op.get("/metrics").expect("metrics");
    let sent = e2e::sum_metric(&metrics, "stateward_requests_total", &["verb=\"exec\""]) - sent0;
    let lat: Vec<i64> = status["benchLat"]
        .as_str()
        .expect("benchLat")
        .split(' ')
        .map(|l| l.parse().expect("a number"))
        .collect();
    assert_eq!(status["benchFailed"], 0, "every round answered `stateward`: {status}");
    let mut operator: Vec<Duration> = lat[WARMUP..]
        .iter()
        .map(|&l| Duration::from_millis(u64::try_from(l).expect("a round trip")))
        .collect();
    operator.sort();

    // The same command by kubectl, one after another.
    let mut kubectl = Vec::new();
    for _ in 0..rounds {
        let at = Instant::now();
        let out = kubectl_in(&env, &["exec", "h-0", "-c", "main", "--", "echo", "stateward"]);
        kubectl.push(at.elapsed());
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "stateward");
    }
    kubectl.sort();
    // And through the API with kube's client, as the operator sends it, without a reconcile.
    let pods: Api<Pod> = env.api();
    let mut direct = Vec::new();
    for _ in 0..rounds {
        let at = Instant::now();
        let params = AttachParams::default().container("main").stdin(false).stdout(true).stderr(true);
        let mut process = pods.exec("h-0", ["echo", "stateward"], &params).await.expect("exec");
        let status = process.take_status().expect("status");
        let mut stdout = process.stdout().expect("stdout");
        let mut text = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut stdout, &mut text).await.expect("read");
        let _ = status.await;
        process.join().await.expect("join");
        direct.push(at.elapsed());
        assert_eq!(text.trim(), "stateward");
    }
    direct.sort();

    let per_request = (cpu - idle_rate * busy) / sent;
    let (p50, p99) = (percentile(&operator, 0.5), percentile(&operator, 0.99));
    let (k50, k99) = (percentile(&kubectl, 0.5), percentile(&kubectl, 0.99));
    let (d50, d99) = (percentile(&direct, 0.5), percentile(&direct, 0.99));
    eprintln!(
        "realpods bench: exec `echo stateward` round trip, {rounds} rounds each (after {WARMUP} warm-up rounds of the operator):\n\
         | path | p50 ms | p99 ms |\n|---|---|---|\n\
         | operator: planned → answer in the next observed | {:.1} | {:.1} |\n\
         | kubectl exec (a process each) | {:.1} | {:.1} |\n\
         | kube client exec (no reconcile) | {:.1} | {:.1} |\n\
         operator / kubectl: p50 {:.2}, p99 {:.2}; operator / kube client: p50 {:.2}\n\
         operator CPU: {:.2} s over {busy:.1} s for {sent} requests sent ({:.1} ms each); idle {:.1} ms/s; \
         per request less idle {:.1} ms",
        ms(p50),
        ms(p99),
        ms(k50),
        ms(k99),
        ms(d50),
        ms(d99),
        p50.as_secs_f64() / k50.as_secs_f64(),
        p99.as_secs_f64() / k99.as_secs_f64(),
        p50.as_secs_f64() / d50.as_secs_f64(),
        cpu,
        cpu / sent * 1000.0,
        idle_rate * 1000.0,
        per_request * 1000.0,
    );
    assert!(sent >= rounds as f64, "{sent} exec requests sent for {rounds} rounds");
    assert!(
        sent <= (rounds + WARMUP) as f64 * 1.1,
        "{sent} exec requests sent for {} rounds: some twice",
        rounds + WARMUP
    );
    // Figures against a baseline of the same run: a round trip through the operator costs no
    // more than twice a kubectl exec (which starts a process), and well under 100 ms of
    // operator CPU. The ceilings are 3 times those.
    use stateward_testkit::report::{figure, Target};
    figure("exec.round_trip.p50", ms(p50), "ms", Target::None);
    figure("exec.round_trip.p99", ms(p99), "ms", Target::None);
    figure(
        "exec.round_trip.p50_over_kubectl_exec",
        p50.as_secs_f64() / k50.as_secs_f64(),
        "x",
        Target::AtMost(2.0),
    );
    figure("exec.operator_cpu_per_request", per_request * 1000.0, "ms", Target::AtMost(100.0));
    assert!(p50 <= k50 * 6, "operator p50 {p50:?} against kubectl exec p50 {k50:?}");
    assert!(per_request < 0.3, "operator CPU per request {:.1} ms", per_request * 1000.0);
    drop(op);
}

/// A key of a Secret of the test's namespace, as text.
async fn secret_key(env: &TestEnv, name: &str, key: &str) -> Option<String> {
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = env.api();
    let secret = secrets.get_opt(name).await.ok()??;
    let value = secret.data?.get(key)?.0.clone();
    String::from_utf8(value).ok()
}

/// What a plugin does with its running service besides exec, live: a role label set on a pod
/// of a StatefulSet (which stays its controller) that a Service selects on; https to that
/// Service verified against the operator's service CA (and refused for a wrong server name);
/// basic auth that the host reads from the instance's Secret (and a 401 without it); and the
/// Secret's derived keys (a user name, and a URI with the password the plugin never sees)
/// filled by the host, and refilled when the password changes.
#[tokio::test]
async fn label_pod_tls_basic_auth_and_derived_keys_on_a_running_pod() {
    let Some(env) = RealPods::enter(Weight::Light, "rp-features").await.expect("real-pods cluster") else {
        return;
    };
    let (plugins, policies) = hostile_setup(&env, &[]);
    let mut op = start_operator(&env, "features", &plugins.0, &policies, &[]);
    op.wait_ready(Duration::from_secs(60)).await;
    let api = hostile_api(&env);
    let ns = env.namespace.clone();
    let created = Instant::now();
    apply_hostile(&env, "h", json!({"mode": "features", "ns": ns}));

    // The host made the credentials, the derived keys included, and the keeper the certificate.
    let (password, took) = wait_for("h-auth with its derived keys", Duration::from_secs(60), || async {
        let password = secret_key(&env, "h-auth", "password").await.ok_or("no password")?;
        let user = secret_key(&env, "h-auth", "username").await.ok_or("no username")?;
        let uri = secret_key(&env, "h-auth", "uri").await.ok_or("no uri")?;
        let want = format!("https://stateward:{password}@h-primary.{}.svc:8443/", env.namespace);
        if user == "stateward" && uri == want && password.len() == 16 {
            Ok(password)
        } else {
            Err(format!("username {user}, uri {uri}"))
        }
    })
    .await;
    eprintln!("realpods: h-auth with username and uri filled by the host {took:.1?} after create");
    let (_, took) = wait_for("h-tls issued from the service CA", Duration::from_secs(60), || async {
        let crt = secret_key(&env, "h-tls", "tls.crt").await.unwrap_or_default();
        let ca = secret_key(&env, "h-tls", "ca.crt").await.unwrap_or_default();
        if crt.starts_with("-----BEGIN CERTIFICATE-----") && ca.starts_with("-----BEGIN CERTIFICATE-----") {
            Ok(())
        } else {
            Err("placeholders".to_string())
        }
    })
    .await;
    eprintln!("realpods: h-tls certificate issued {took:.1?} into the wait");

    // The service, as a StatefulSet of the instance: openssl serving https with that
    // certificate, and a server checking basic auth against the Secret's keys.
    let auth_server = r#"use IO::Socket::INET; use MIME::Base64;
my $want = "Basic " . encode_base64("$ENV{AUTH_USER}:$ENV{AUTH_PASSWORD}", "");
my $s = IO::Socket::INET->new(LocalPort => 8080, Listen => 16, ReuseAddr => 1) or die $!;
while (my $c = $s->accept) {
  my $auth = "";
  while (my $l = <$c>) { $l =~ s/\r?\n$//; last if $l eq ""; $auth = $1 if $l =~ /^Authorization:\s*(.*)$/i; }
  my ($code, $body) = $auth eq $want ? ("200 OK", "welcome") : ("401 Unauthorized", "who are you");
  print $c "HTTP/1.1 $code\r\nContent-Length: " . length($body) . "\r\nConnection: close\r\n\r\n$body";
  close $c;
}"#;
    let secret_env = |var: &str, key: &str| json!({"name": var, "valueFrom": {"secretKeyRef": {"name": "h-auth", "key": key}}});
    let security = json!({"runAsNonRoot": true, "runAsUser": 999, "allowPrivilegeEscalation": false});
    apply_json(
        &env,
        &[json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "h", "labels": {"stateward.dev/instance": "h"}},
            "spec": {
                "serviceName": "h-primary", "replicas": 1,
                "selector": {"matchLabels": {"app": "h-server"}},
                "template": {
                    "metadata": {"labels": {"app": "h-server", "stateward.dev/instance": "h"}},
                    "spec": {
                        "terminationGracePeriodSeconds": 1,
                        "containers": [
                            {
                                "name": "tls", "image": PG_IMAGE, "imagePullPolicy": "Never",
                                "securityContext": security,
                                "command": ["sh", "-c", "mkdir -p /tmp/www && cd /tmp/www && echo ok > ok.txt && exec openssl s_server -accept 8443 -cert /tls/tls.crt -key /tls/tls.key -WWW"],
                                "ports": [{"containerPort": 8443}],
                                "volumeMounts": [{"name": "tls", "mountPath": "/tls", "readOnly": true}],
                            },
                            {
                                "name": "auth", "image": PG_IMAGE, "imagePullPolicy": "Never",
                                "securityContext": security,
                                "command": ["perl", "-e", auth_server],
                                "env": [secret_env("AUTH_USER", "username"), secret_env("AUTH_PASSWORD", "password")],
                                "ports": [{"containerPort": 8080}],
                            },
                        ],
                        "volumes": [{"name": "tls", "secret": {"secretName": "h-tls"}}],
                    },
                },
            },
        })],
    );

    // The role label lands on the pod; the StatefulSet stays its controller.
    let pods: Api<Pod> = env.api();
    let (owner, took) = wait_for("h-0 labelled role=primary", Duration::from_secs(180), || {
        let pods = pods.clone();
        async move {
            let p = pods.get_opt("h-0").await.map_err(|e| e.to_string())?.ok_or("no pod h-0")?;
            let role = p.metadata.labels.as_ref().and_then(|l| l.get("stateward.dev/role")).cloned();
            let controller = p
                .metadata
                .owner_references
                .unwrap_or_default()
                .into_iter()
                .find(|r| r.controller == Some(true))
                .map(|r| format!("{}/{}", r.kind, r.name));
            if role.as_deref() == Some("primary") {
                Ok(controller)
            } else {
                Err(format!("role {role:?}, controller {controller:?}"))
            }
        }
    })
    .await;
    assert_eq!(owner.as_deref(), Some("StatefulSet/h"), "the StatefulSet stays the pod's controller");
    eprintln!("realpods: role label on h-0 {took:.1?} into the wait (controller {owner:?})");

    let expect =
        |id: &'static str, what: &'static str, ok: fn(&Value) -> bool| expect_answer(&api, id, what, ok);
    // Through the Service that selects the role label, so also proof that the label is used.
    expect("tls", "200 over TLS verified against the service CA", |a| {
        a["code"] == 200 && a["body"] == "ok\n"
    })
    .await;
    expect("tls-wrong-name", "refused: the certificate does not name it", |a| {
        a["code"].is_null()
            && a["error"].as_str().is_some_and(|e| e.contains("TLS") && e.contains("not valid for name"))
    })
    .await;
    expect("auth", "200 with the Secret's credentials", |a| a["code"] == 200 && a["body"] == "welcome").await;
    expect("noauth", "401 without", |a| a["code"] == 401).await;

    // The password reached the server from the Secret, never through the plugin or the audit.
    let cr = get_cr(&api, "h").await.expect("CR");
    assert!(!cr.to_string().contains(&password), "the password is in the resource: {}", cr["status"]);
    let audit = std::fs::read_to_string(&op.audit).expect("audit log");
    assert!(!audit.contains(&password), "the password is in the audit log");
    let (_, metrics) = op.get("/metrics").expect("metrics");
    let http_ok = e2e::sum_metric(&metrics, "stateward_requests_total", &["verb=\"http\"", "result=\"ok\""]);
    assert!(http_ok >= 3.0, "http answers counted: {http_ok}");

    // A changed password: the host rewrites the URI (the other keys stay).
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = env.api();
    let rotated = "rotated-password";
    let patch = json!({"stringData": {"password": rotated}});
    secrets.patch("h-auth", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch password");
    let (_, took) = wait_for("uri refilled with the new password", Duration::from_secs(60), || async {
        let uri = secret_key(&env, "h-auth", "uri").await.unwrap_or_default();
        if uri == format!("https://stateward:{rotated}@h-primary.{}.svc:8443/", env.namespace) {
            Ok(())
        } else {
            Err(uri)
        }
    })
    .await;
    eprintln!(
        "realpods: uri refilled {took:.1?} after the password changed ({:.1?} since create)",
        created.elapsed()
    );
    let cr = get_cr(&api, "h").await.expect("CR");
    assert_ne!(e2e::condition(&cr, "Degraded"), Some("True"), "{}", summary(&cr));
    drop(op);
}
