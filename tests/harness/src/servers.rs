//! Real PostgreSQL and Redis servers on loopback, from Debian's packages (scripts/setup), for
//! tests that run the generated configurations or real clients against real servers.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A free loopback port (the OS picks it).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(0)
}

/// A server process, killed when the test ends, however it ends.
pub struct Server(pub Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How a wait for a server ended other than with the server ready.
#[derive(Debug)]
pub enum NotServing {
    /// The process exited; its log.
    Exited(String),
    /// Still running but not ready in time; its log.
    TimedOut(String),
}

impl NotServing {
    /// Another process took a port between [`free_port`] and the server's bind: start it again
    /// on other ports.
    pub fn port_taken(&self) -> bool {
        matches!(self, NotServing::Exited(log) if log.contains("in use"))
    }
}

/// Waits until `ready` answers true, asking every 200 ms. A server that exits meanwhile ends
/// the wait at once: both failures carry the last 4 KB of its `log` (where its output went),
/// so a test names why a server never served.
pub fn wait_serving(
    server: &mut Server,
    log: &Path,
    limit: Duration,
    mut ready: impl FnMut() -> bool,
) -> Result<(), NotServing> {
    let tail = || {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let start = text.len().saturating_sub(4096);
        text.get(start..).unwrap_or(&text).to_string()
    };
    let started = Instant::now();
    loop {
        if ready() {
            return Ok(());
        }
        if let Ok(Some(_)) = server.0.try_wait() {
            return Err(NotServing::Exited(tail()));
        }
        if started.elapsed() > limit {
            return Err(NotServing::TimedOut(tail()));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Whether the tests run as root (CI does).
pub fn is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| o.stdout.starts_with(b"0\n")).unwrap_or(false)
}

/// PostgreSQL refuses to run as root: as root, run `program` as the package's `postgres` user.
pub fn as_postgres(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// A program of the newest PostgreSQL installed (`initdb`, `postgres`, `psql`).
///
/// # Panics
/// When none is installed (scripts/setup installs it).
#[allow(clippy::panic)]
pub fn postgres_bin(name: &str) -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin").join(name))
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found.pop().unwrap_or_else(|| {
        panic!("PostgreSQL's {name} not found under /usr/lib/postgresql: run scripts/setup")
    })
}
