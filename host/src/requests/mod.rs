//! Requests to the running service (WIT 0.2 `exec` and `http` actions): sent off the reconcile
//! path, answered into the next `observed.responses`.
//!
//! A reconcile hands the requests its plan holds (after the guardrails allowed them) to
//! [`Requests::submit`]; a request that is due is started in a task of its own, bounded per
//! resource and in total, and never blocks a reconcile. Its answer is kept here until the plugin
//! stops asking for it, and a finished request wakes its resource at once ([`Requests::woken`]).
//! A one-shot request is recorded durably in the resource's status before it is sent
//! ([`durable`]), so that neither a restart nor a new leader ever sends it twice.

mod durable;
mod exec;
mod http;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kube::Client;
use serde_json::Value;
use tokio::sync::{broadcast, Semaphore};

pub use durable::{records, Ledger, Record};
pub use exec::Exec;
pub use http::{Http, HttpAuth};

use crate::runtime::{RequestMode, Response};

/// The resource a request belongs to.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Owner {
    /// The custom resource's kind (its controller picks its own wakes by it).
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

/// How much the host runs and keeps.
#[derive(Clone, Debug)]
pub struct RequestSettings {
    /// Polls of one resource running at once, and one-shot requests of one resource running at
    /// once (each kind its own budget: polls never hold back a failover's steps); more wait
    /// for a later reconcile.
    pub per_resource: usize,
    /// Requests running at once in the whole operator.
    pub total: usize,
    /// Bytes of stdout (or an http body) and of stderr kept per answer.
    pub output_bytes: usize,
}

impl Default for RequestSettings {
    fn default() -> Self {
        Self { per_resource: 4, total: 64, output_bytes: 64 * 1024 }
    }
}

/// What to send, resolved by the reconcile from its caches (pod names checked, addresses and
/// credentials looked up).
pub enum Prepared {
    Exec(Exec),
    Http(Http),
}

/// One request as the reconcile submits it.
pub struct Submission {
    pub id: String,
    pub mode: RequestMode,
    pub timeout: Duration,
    pub prepared: Prepared,
    /// `plugin/<name>`, for the audit record of the outcome.
    pub requested_by: String,
    /// Where a one-shot request's answer is recorded.
    pub ledger: Option<Ledger>,
    /// The target, as the audit record names it (never stdin, bodies or credentials).
    pub audit: Value,
}

#[derive(Default)]
struct Entry {
    running: bool,
    /// A one-shot request (counted in its own per-resource budget).
    once: bool,
    answer: Option<Response>,
    answered_at: Option<Instant>,
    /// Sent answers in a row that came back with an error (a poll backs off on them).
    failures: u32,
}

/// The longest a failing poll waits between tries (unless its own interval is longer).
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// How long after its last answer a poll is due again: its interval; after `failures` sent
/// tries in a row that failed (timed out, could not connect), twice as long per failure from
/// at least a second, up to [`MAX_BACKOFF`]. The host cannot stop a command that outlived its
/// timeout (the API server's exec has no signal), so a poll that hangs would otherwise leave
/// one more process in the container every interval.
pub fn poll_wait(interval: Duration, failures: u32) -> Duration {
    if failures == 0 {
        return interval;
    }
    let doubled = interval.max(Duration::from_secs(1)).saturating_mul(1u32 << failures.min(16));
    doubled.min(MAX_BACKOFF.max(interval))
}

/// The requests of every resource, and the answers not yet dropped.
pub struct Requests {
    client: Client,
    settings: RequestSettings,
    total: Arc<Semaphore>,
    book: Mutex<HashMap<Owner, HashMap<String, Entry>>>,
    woken: broadcast::Sender<Owner>,
    outcomes: Outcomes,
}

/// One answer, as the operator audits and counts it.
pub struct Outcome<'a> {
    /// `plugin/<name>`.
    pub requested_by: &'a str,
    /// The target as the audit names it (never stdin, bodies or credentials).
    pub audit: &'a Value,
    pub response: &'a Response,
    /// False when the target could not be resolved and nothing was sent.
    pub sent: bool,
    /// A poll's answer (asked again every interval), not a one-shot request's.
    pub poll: bool,
}

impl Outcome<'_> {
    /// How the request ended, as the audit records it: exit code or status, error, the sizes
    /// and a digest of its output (never the output itself), when and how long.
    pub fn audited(&self) -> Value {
        use sha2::Digest as _;
        let r = self.response;
        serde_json::json!({
            "id": r.id,
            "sent": self.sent,
            "code": r.code,
            "error": r.error,
            "stdoutBytes": r.stdout.len(),
            "stdoutSha256": hex::encode(sha2::Sha256::digest(r.stdout.as_bytes())),
            "stderrBytes": r.stderr.len(),
            "truncated": r.truncated,
            "startedAtMs": r.started_at_ms,
            "durationMs": r.duration_ms,
        })
    }

    /// A poll's answers repeat while nothing changes: what must change for one to be written
    /// again (how it ended, not its output, timings or sizes). None for a one-shot request,
    /// every answer of which is written.
    pub fn class(&self) -> Option<Value> {
        let r = self.response;
        self.poll.then(|| {
            serde_json::json!({ "id": r.id, "sent": self.sent, "code": r.code, "error": r.error, "truncated": r.truncated })
        })
    }
}

/// What is done with every answer, sent or not (the operator audits it and counts it).
pub type Outcomes = Arc<dyn Fn(&Outcome<'_>) + Send + Sync>;

impl Requests {
    /// `outcomes` records every finished request (the audit log and metrics).
    pub fn new(client: Client, settings: RequestSettings, outcomes: Outcomes) -> Arc<Self> {
        let (woken, _) = broadcast::channel(1024);
        Arc::new(Self {
            client,
            total: Arc::new(Semaphore::new(settings.total.max(1))),
            settings,
            book: Mutex::new(HashMap::new()),
            woken,
            outcomes,
        })
    }

    /// Every resource whose request just finished; a listener that fell behind misses wakes
    /// (the resync still comes).
    pub fn woken(&self) -> impl futures::Stream<Item = Owner> + Send + 'static {
        futures::stream::unfold(self.woken.subscribe(), |mut rx| async move {
            loop {
                match rx.recv().await {
                    Ok(owner) => return Some((owner, rx)),
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
    }

    /// The answers the plugin gets in `observed.responses`: those in memory, then the durable
    /// records of one-shot requests this process has no answer for.
    pub fn responses(&self, owner: &Owner, ledger: &[Record]) -> Vec<Response> {
        let book = self.book.lock().unwrap_or_else(PoisonError::into_inner);
        let entries = book.get(owner);
        let mut out: Vec<Response> =
            entries.into_iter().flatten().filter_map(|(_, e)| e.answer.clone()).collect();
        for record in ledger {
            let known = entries.and_then(|e| e.get(&record.id));
            if known.is_none_or(|e| e.answer.is_none() && !e.running) {
                out.push(record.response());
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// Whether a request of this id should be sent now: a poll when none is running and its
    /// last answer is older than its interval; a one-shot request when this process never
    /// sent it (the caller also checks the durable record). Either only while fewer than
    /// `per_resource` requests of its kind run for `owner`.
    pub fn due(&self, owner: &Owner, id: &str, mode: RequestMode) -> bool {
        let book = self.book.lock().unwrap_or_else(PoisonError::into_inner);
        let once = mode == RequestMode::Once;
        let free = self.running(&book, owner, once) < self.settings.per_resource;
        let Some(entry) = book.get(owner).and_then(|e| e.get(id)) else {
            return free;
        };
        match mode {
            RequestMode::Once => false,
            RequestMode::Every(interval) => {
                let wait = poll_wait(interval, entry.failures);
                free && !entry.running && entry.answered_at.is_none_or(|at| at.elapsed() >= wait)
            }
        }
    }

    /// Requests of `owner` running now, one-shot ones or polls.
    fn running(&self, book: &HashMap<Owner, HashMap<String, Entry>>, owner: &Owner, once: bool) -> usize {
        book.get(owner).map_or(0, |e| e.values().filter(|e| e.running && e.once == once).count())
    }

    /// Starts `submission` in a task of its own; its answer lands here and wakes `owner`.
    pub fn start(self: &Arc<Self>, owner: Owner, submission: Submission) {
        {
            let mut book = self.book.lock().unwrap_or_else(PoisonError::into_inner);
            let entry = book.entry(owner.clone()).or_default().entry(submission.id.clone()).or_default();
            entry.running = true;
            entry.once = submission.mode == RequestMode::Once;
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let response = this.run(&submission).await;
            (this.outcomes)(&Outcome {
                requested_by: &submission.requested_by,
                audit: &submission.audit,
                response: &response,
                sent: true,
                poll: submission.mode != RequestMode::Once,
            });
            if let Some(ledger) = &submission.ledger {
                ledger.answered(&response).await;
            }
            {
                let mut book = this.book.lock().unwrap_or_else(PoisonError::into_inner);
                let entry = book.entry(owner.clone()).or_default().entry(submission.id.clone()).or_default();
                entry.running = false;
                entry.failures = if response.error.is_some() { entry.failures.saturating_add(1) } else { 0 };
                entry.answer = Some(response);
                entry.answered_at = Some(Instant::now());
            }
            // Nobody listening (no controller running) loses nothing: the resync comes.
            drop(this.woken.send(owner));
        });
    }

    /// Runs one request. Its timeout counts from here, the wait for one of the operator's
    /// `total` slots included: requests of other resources that hang hold this one's answer
    /// back by at most its own timeout.
    async fn run(&self, submission: &Submission) -> Response {
        let started_at_ms = now_ms();
        let started = Instant::now();
        let cap = self.settings.output_bytes;
        let work = async {
            let _permit =
                self.total.acquire().await.map_err(|_| "the operator is shutting down".to_string())?;
            match &submission.prepared {
                Prepared::Exec(e) => e.run(&self.client, cap).await,
                Prepared::Http(h) => h.run(cap).await,
            }
        };
        let result = match tokio::time::timeout(submission.timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(format!("no answer within the timeout of {} ms", submission.timeout.as_millis())),
        };
        let mut response = match result {
            Ok(answer) => answer,
            Err(error) => Response { error: Some(error), ..Response::default() },
        };
        response.id = submission.id.clone();
        response.started_at_ms = started_at_ms;
        response.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        response
    }

    /// Records an answer without sending anything (the target could not be resolved); it is
    /// audited like the answer of a request that was sent. `poll`: see [`Outcome::poll`].
    pub fn answer_now(
        &self,
        owner: &Owner,
        requested_by: &str,
        audit: &Value,
        response: Response,
        poll: bool,
    ) {
        (self.outcomes)(&Outcome { requested_by, audit, response: &response, sent: false, poll });
        let mut book = self.book.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = book.entry(owner.clone()).or_default().entry(response.id.clone()).or_default();
        entry.answer = Some(response);
        entry.answered_at = Some(Instant::now());
    }

    /// Forgets the answers of requests the plugin no longer plans (`planned` holds the ids of
    /// its latest plan); running requests are kept until they end.
    pub fn retain(&self, owner: &Owner, planned: &HashSet<&str>) {
        let mut book = self.book.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entries) = book.get_mut(owner) {
            entries.retain(|id, e| e.running || planned.contains(id.as_str()));
            if entries.is_empty() {
                book.remove(owner);
            }
        }
    }
}

/// Output of a request, cut at the cap.
pub(crate) struct Capped {
    pub bytes: Vec<u8>,
    pub truncated: bool,
    cap: usize,
}

impl Capped {
    pub fn new(cap: usize) -> Self {
        Self { bytes: Vec::new(), truncated: false, cap }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        let room = self.cap.saturating_sub(self.bytes.len());
        if chunk.len() > room {
            self.truncated = true;
        }
        self.bytes.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    fn requests(per_resource: usize) -> Arc<Requests> {
        // Nothing listens on port 9: every request fails fast with a connection error.
        let client =
            Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().expect("url"))).expect("client");
        Requests::new(
            client,
            RequestSettings { per_resource, total: 8, output_bytes: 1024 },
            Arc::new(|_| {}),
        )
    }

    fn owner() -> Owner {
        Owner { kind: "PostgresCluster".into(), namespace: "db".into(), name: "main".into() }
    }

    fn refused_http(id: &str) -> Submission {
        Submission {
            id: id.into(),
            mode: RequestMode::Every(Duration::from_secs(60)),
            timeout: Duration::from_secs(5),
            prepared: Prepared::Http(Http {
                address: "127.0.0.1:9".parse().expect("addr"),
                tls: None,
                method: "GET".into(),
                path: "/".into(),
                headers: Vec::new(),
                body: None,
                auth: None,
            }),
            requested_by: "plugin/test".into(),
            ledger: None,
            audit: Value::Null,
        }
    }

    #[tokio::test]
    async fn a_poll_waits_for_its_interval_and_a_one_shot_request_is_never_due_twice() {
        let r = requests(4);
        let every = RequestMode::Every(Duration::from_millis(200));
        assert!(r.due(&owner(), "poll", every));
        r.answer_now(
            &owner(),
            "plugin/test",
            &Value::Null,
            Response { id: "poll".into(), code: Some(0), ..Response::default() },
            true,
        );
        assert!(!r.due(&owner(), "poll", every), "answered within its interval");
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(r.due(&owner(), "poll", every), "due again after the interval");

        assert!(r.due(&owner(), "promote", RequestMode::Once));
        r.start(owner(), Submission { mode: RequestMode::Once, ..refused_http("promote") });
        assert!(!r.due(&owner(), "promote", RequestMode::Once), "running");
        let woken = r.woken();
        tokio::pin!(woken);
        tokio::time::timeout(Duration::from_secs(10), futures::StreamExt::next(&mut woken))
            .await
            .expect("woken");
        assert!(!r.due(&owner(), "promote", RequestMode::Once), "answered: never again");
        let answers = r.responses(&owner(), &[]);
        let promote = answers.iter().find(|a| a.id == "promote").expect("answer");
        assert!(promote.error.as_deref().is_some_and(|e| e.contains("connecting")), "{promote:?}");
    }

    #[tokio::test]
    async fn requests_of_one_resource_run_at_most_per_resource_at_once() {
        let r = requests(2);
        r.start(owner(), refused_http("a"));
        r.start(owner(), refused_http("b"));
        assert!(!r.due(&owner(), "c", RequestMode::Every(Duration::ZERO)), "two running: the third waits");
        let other = Owner { name: "other".into(), ..owner() };
        assert!(r.due(&other, "c", RequestMode::Every(Duration::ZERO)), "another resource is not held back");
    }

    /// A plugin's polls took every slot of a busy resource, and its switchover's next step
    /// waited behind them until the switchover timed out: one-shot requests have their own.
    #[tokio::test]
    async fn polls_in_every_slot_do_not_hold_back_a_one_shot_request() {
        let r = requests(1);
        r.start(owner(), refused_http("poll"));
        assert!(
            !r.due(&owner(), "another-poll", RequestMode::Every(Duration::ZERO)),
            "the poll slot is taken"
        );
        assert!(r.due(&owner(), "pause", RequestMode::Once), "a one-shot request has a slot of its own");
        r.start(owner(), Submission { mode: RequestMode::Once, ..refused_http("pause") });
        assert!(!r.due(&owner(), "promote", RequestMode::Once), "one-shot requests are bounded too");
    }

    /// The operator's slots all held by a request to a server that never answers: another
    /// resource's request still answers within its own timeout, not after the other's.
    #[tokio::test]
    async fn a_request_waiting_for_a_slot_still_answers_within_its_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("addr");
        let _server = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let client =
            Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().expect("url"))).expect("client");
        let r = Requests::new(
            client,
            RequestSettings { per_resource: 4, total: 1, output_bytes: 1024 },
            Arc::new(|_| {}),
        );
        let silent = |id: &str, timeout: Duration| {
            let mut s = refused_http(id);
            s.timeout = timeout;
            if let Prepared::Http(h) = &mut s.prepared {
                h.address = address;
            }
            s
        };
        let woken = r.woken();
        tokio::pin!(woken);
        r.start(owner(), silent("hangs", Duration::from_secs(60)));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let other = Owner { name: "other".into(), ..owner() };
        let asked = Instant::now();
        r.start(other.clone(), silent("health", Duration::from_millis(300)));
        let who = tokio::time::timeout(Duration::from_secs(10), futures::StreamExt::next(&mut woken))
            .await
            .expect("an answer within 10 s, not after the other request's 60 s");
        assert_eq!(who, Some(other.clone()));
        let answers = r.responses(&other, &[]);
        let health = answers.iter().find(|a| a.id == "health").expect("answer");
        assert!(health.error.as_deref().is_some_and(|e| e.contains("timeout of 300 ms")), "{health:?}");
        assert!(asked.elapsed() < Duration::from_secs(5), "answered after {:?}", asked.elapsed());
    }

    #[tokio::test]
    async fn answers_the_plugin_stopped_asking_for_are_forgotten() {
        let r = requests(4);
        r.answer_now(
            &owner(),
            "plugin/test",
            &Value::Null,
            Response { id: "old".into(), ..Response::default() },
            true,
        );
        r.answer_now(
            &owner(),
            "plugin/test",
            &Value::Null,
            Response { id: "kept".into(), ..Response::default() },
            true,
        );
        r.retain(&owner(), &["kept"].into_iter().collect());
        let ids: Vec<String> = r.responses(&owner(), &[]).into_iter().map(|a| a.id).collect();
        assert_eq!(ids, ["kept"]);
    }

    #[test]
    fn a_failing_poll_waits_twice_as_long_per_failure_up_to_a_cap() {
        let s = Duration::from_secs;
        assert_eq!(poll_wait(s(10), 0), s(10));
        assert_eq!(poll_wait(s(10), 1), s(20));
        assert_eq!(poll_wait(s(10), 3), s(80));
        assert_eq!(poll_wait(s(10), 9), MAX_BACKOFF);
        assert_eq!(poll_wait(s(10), u32::MAX), MAX_BACKOFF);
        assert_eq!(poll_wait(Duration::ZERO, 0), Duration::ZERO);
        assert_eq!(poll_wait(Duration::ZERO, 1), s(2), "from at least a second");
        assert_eq!(poll_wait(s(600), 4), s(600), "a longer interval is its own cap");
    }

    #[tokio::test]
    async fn a_poll_whose_sends_fail_backs_off_and_one_answered_does_not() {
        let r = requests(4);
        let every = RequestMode::Every(Duration::from_millis(100));
        let woken = r.woken();
        tokio::pin!(woken);
        r.start(owner(), refused_http("failing"));
        tokio::time::timeout(Duration::from_secs(10), futures::StreamExt::next(&mut woken))
            .await
            .expect("woken");
        r.answer_now(
            &owner(),
            "plugin/test",
            &Value::Null,
            Response { id: "fine".into(), code: Some(0), ..Response::default() },
            true,
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(r.due(&owner(), "fine", every), "answered: due after its interval");
        assert!(!r.due(&owner(), "failing", every), "failed once: waits 2 s, not 100 ms");
    }

    #[test]
    fn output_is_cut_at_the_cap_and_says_so() {
        let mut out = Capped::new(5);
        out.push(b"abc");
        assert!(!out.truncated);
        out.push(b"defgh");
        out.push(b"ijk");
        assert_eq!(out.text(), "abcde");
        assert!(out.truncated);
    }
}
