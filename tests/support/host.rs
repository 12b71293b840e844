//! A `sharehost run` child process for the end-to-end and fault-injection tests: started with a
//! manifest, watched through its log (admin address, and the ids the ledger plugin reports), and
//! ended the way the test needs (SIGTERM drains, SIGKILL is a crash).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use crate::http::http_request;
use crate::ledger::Ledger;
use sharehost::api::{self, TenantStatus};

/// The `sharehost` binary cargo built for this test run, as a `&'static Path`. A macro: cargo
/// tells only the integration tests of the host package where the binary is
/// (`CARGO_BIN_EXE_sharehost`, at their compile time), never this library.
#[macro_export]
macro_rules! sharehost_bin {
    () => {
        ::std::path::Path::new(env!("CARGO_BIN_EXE_sharehost"))
    };
}

/// How long a test waits for something a host should do before failing (a hang guard, not a
/// speed check: every wait ends as soon as its condition holds).
pub const PATIENCE: Duration = Duration::from_secs(180);

/// What a host's log has shown so far.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Ids the ledger plugin accepted, one entry per verdict (a redelivered id repeats).
    pub accepted: Vec<String>,
    /// Ids the ledger plugin rejected, one entry per verdict.
    pub rejected: Vec<String>,
    /// Plugin calls the ledger plugin started (`ledger begin`).
    pub calls: u64,
    /// The log has ended: the process exited or was killed.
    pub ended: bool,
}

impl Seen {
    /// Verdicts seen, accepted or rejected.
    pub fn judged(&self) -> usize {
        self.accepted.len() + self.rejected.len()
    }

    /// The distinct ids judged (accepted or rejected).
    pub fn distinct(&self) -> std::collections::HashSet<&str> {
        self.accepted
            .iter()
            .chain(&self.rejected)
            .map(String::as_str)
            .collect()
    }

    /// Adds these verdicts to `ledger`.
    pub fn record(&self, ledger: &mut Ledger) {
        for id in &self.accepted {
            ledger.accepted(id.clone());
        }
        for id in &self.rejected {
            ledger.rejected(id.clone());
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Wakes tests waiting on what one or several hosts report: every ledger report of every host
/// started with the same `Watch` bumps it, so a test can wait for a condition over all of them
/// without polling.
#[derive(Debug, Clone, Default)]
pub struct Watch(Arc<(Mutex<u64>, Condvar)>);

impl Watch {
    /// Wakes every [`Watch::wait_until`] to check its condition again: each report of a host
    /// started with this `Watch` does, and so may anything else a test waits on (records it
    /// reads back, say).
    pub fn bump(&self) {
        *lock(&self.0.0) += 1;
        self.0.1.notify_all();
    }

    /// Blocks until `cond` holds, re-checking after every report; fails the test, saying `what`
    /// was awaited, after [`PATIENCE`]. `cond` may also fail the test itself (e.g. when a host
    /// it depends on has ended).
    pub fn wait_until(&self, what: &str, cond: impl Fn() -> bool) {
        let deadline = Instant::now() + PATIENCE;
        let mut reports = lock(&self.0.0);
        loop {
            // Checked while holding the counter: a report that lands after the check bumps it,
            // so the wait below returns at once instead of missing it.
            if cond() {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "gave up waiting for {what}");
            let seen_so_far = *reports;
            reports = self
                .0
                .1
                .wait_timeout_while(reports, left, |n| *n == seen_so_far)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// Reads `ledger accepted=1,2,3`-style lists out of one log line.
fn ids_after<'a>(line: &'a str, marker: &str) -> impl Iterator<Item = &'a str> {
    line.split_once(marker)
        .map(|(_, rest)| {
            let end = rest
                .find(|c: char| !(c.is_ascii_digit() || c == ','))
                .unwrap_or(rest.len());
            rest.split_at(end).0 // `end` is where a character begins
        })
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
}

/// Reads a host's log from `stream` on a thread of its own: ledger reports go into `seen` (and
/// wake `watch`), every other line is echoed tagged with `tag` and kept in `log`, and the admin
/// address the host announces is sent once on `admin`. `seen.ended` is set when the log ends.
pub(crate) fn follow_log(
    stream: impl Read + Send + 'static,
    tag: &str,
    seen: &Arc<Mutex<Seen>>,
    watch: &Watch,
    log: &Arc<Mutex<Vec<String>>>,
    admin: std::sync::mpsc::Sender<String>,
) -> std::thread::JoinHandle<()> {
    let (shared, bell, tag, kept) = (seen.clone(), watch.clone(), tag.to_owned(), log.clone());
    std::thread::spawn(move || {
        let mut announced = false;
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            let ledger_line = ["ledger begin", "ledger accepted=", "ledger rejected="]
                .iter()
                .any(|m| line.contains(m));
            if !ledger_line {
                eprintln!("[{tag}] {line}");
                lock(&kept).push(line.clone());
            }
            if !announced && let Some(addr) = line.split("admin endpoints on http://").nth(1) {
                // Plain text ends the line with the address; a JSON log closes it with a quote.
                let addr = addr.split(['"', ' ']).next().unwrap_or_default();
                let _ = admin.send(addr.trim().to_owned());
                announced = true;
            }
            if ledger_line {
                let mut s = lock(&shared);
                if line.contains("ledger begin") {
                    s.calls += 1;
                }
                s.accepted
                    .extend(ids_after(&line, "ledger accepted=").map(str::to_owned));
                s.rejected
                    .extend(ids_after(&line, "ledger rejected=").map(str::to_owned));
                drop(s);
                bell.bump();
            }
        }
        lock(&shared).ended = true;
        bell.bump();
    })
}

/// A running `sharehost run MANIFEST`.
pub struct HostProcess {
    name: String,
    child: Child,
    admin: String,
    seen: Arc<Mutex<Seen>>,
    watch: Watch,
    stdout: Arc<Mutex<String>>,
    /// Every log line that is not a ledger report, in order.
    log: Arc<Mutex<Vec<String>>>,
    stdout_reader: Option<std::thread::JoinHandle<()>>,
    log_reader: Option<std::thread::JoinHandle<()>>,
}

impl HostProcess {
    /// Starts `bin run manifest` (log level info) and waits until it announces its admin
    /// address. `name` tags its log lines in the test output.
    pub fn start(bin: &Path, manifest: &Path, name: &str) -> HostProcess {
        HostProcess::start_watched(bin, manifest, name, &Watch::default())
    }

    /// [`HostProcess::start`], with its ledger reports also waking `watch`.
    pub fn start_watched(bin: &Path, manifest: &Path, name: &str, watch: &Watch) -> HostProcess {
        HostProcess::start_with(bin, manifest, name, watch, &[])
    }

    /// [`HostProcess::start`] with more environment variables (an admin token, a state
    /// directory of the test's own).
    pub fn start_with_env(
        bin: &Path,
        manifest: &Path,
        name: &str,
        env: &[(&str, &str)],
    ) -> HostProcess {
        HostProcess::start_with(bin, manifest, name, &Watch::default(), env)
    }

    /// [`HostProcess::start_watched`] with more environment variables.
    pub fn start_watched_with_env(
        bin: &Path,
        manifest: &Path,
        name: &str,
        watch: &Watch,
        env: &[(&str, &str)],
    ) -> HostProcess {
        HostProcess::start_with(bin, manifest, name, watch, env)
    }

    fn start_with(
        bin: &Path,
        manifest: &Path,
        name: &str,
        watch: &Watch,
        env: &[(&str, &str)],
    ) -> HostProcess {
        let mut child = Command::new(bin)
            .arg("run")
            .arg(manifest)
            .env("SHAREHOST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let log_reader = follow_log(stderr, name, &seen, watch, &log, tx);
        let stdout = child.stdout.take().expect("piped stdout");
        let out = Arc::new(Mutex::new(String::new()));
        let sink = out.clone();
        let stdout_reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = BufReader::new(stdout).read_to_string(&mut s);
            sink.lock().unwrap_or_else(|p| p.into_inner()).push_str(&s);
        });
        let admin = match rx.recv_timeout(PATIENCE) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                panic!("{name} did not announce its admin address (see its log above)");
            }
        };
        HostProcess {
            name: name.to_owned(),
            child,
            admin,
            seen,
            watch: watch.clone(),
            stdout: out,
            log,
            stdout_reader: Some(stdout_reader),
            log_reader: Some(log_reader),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The admin listener's address (`127.0.0.1:PORT`).
    pub fn admin(&self) -> &str {
        &self.admin
    }

    /// One HTTP/1.1 request to the admin listener; returns status code and body.
    pub fn http(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        self.request(method, path, &[("Content-Type", "application/json")], body)
    }

    /// [`HostProcess::http`] with the request's headers chosen (a bearer token, another
    /// content type, another `Host` than the listener's address).
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (u16, String) {
        let mut s = TcpStream::connect(&self.admin)
            .unwrap_or_else(|e| panic!("{}: admin connect {}: {e}", self.name, self.admin));
        // The listener's own address as the Host, as a client that dials it sends, unless the
        // test chose another.
        let own_host = if headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            String::new()
        } else {
            format!("Host: {}\r\n", self.admin)
        };
        let headers: String = headers
            .iter()
            .map(|(k, v)| format!("{k}: {v}\r\n"))
            .collect();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\n{own_host}Connection: close\r\n{headers}Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("write admin request");
        let mut resp = String::new();
        s.read_to_string(&mut resp).expect("read admin response");
        crate::http::parse_response(&resp)
    }

    /// `GET /pipelines`.
    pub fn status(&self) -> serde_json::Value {
        let (code, body) = self.http("GET", api::PIPELINES, "");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).expect("JSON status")
    }

    /// `GET /pipelines` as the api's types.
    pub fn pipelines(&self) -> Vec<TenantStatus> {
        serde_json::from_value(self.status()).expect("the status of every pipeline")
    }

    /// Records judged (accepted + rejected) by the first pipeline, summed over versions.
    pub fn judged(&self) -> u64 {
        match self.pipelines().first() {
            Some(TenantStatus::Pipeline(p)) => {
                p.versions.values().map(|c| c.accepted + c.rejected).sum()
            }
            _ => 0,
        }
    }

    /// Waits until the admin counters show `at_least` judged records (for plugins other than
    /// the ledger, which report nothing in the log).
    pub fn wait_judged(&self, at_least: u64) {
        let deadline = Instant::now() + PATIENCE;
        while self.judged() < at_least {
            assert!(
                Instant::now() < deadline,
                "{}: only {} of {at_least} judged: {}",
                self.name,
                self.judged(),
                self.status()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// What the ledger plugin has reported so far.
    pub fn seen(&self) -> Seen {
        lock(&self.seen).clone()
    }

    /// Blocks until the ledger plugin's reports satisfy `cond` (woken by every report); fails
    /// the test, saying `what` was awaited, if the host's log ends or it hangs first.
    pub fn wait_for(&self, what: &str, cond: impl Fn(&Seen) -> bool) -> Seen {
        self.watch.wait_until(what, || {
            let s = self.seen();
            assert!(
                cond(&s) || !s.ended,
                "{}: the host's log ended while waiting for {what}",
                self.name
            );
            cond(&s)
        });
        self.seen()
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill {sig} {}", self.child.id());
    }

    fn finish(&mut self) -> Seen {
        if let Some(r) = self.log_reader.take() {
            let _ = r.join();
        }
        if let Some(r) = self.stdout_reader.take() {
            let _ = r.join();
        }
        self.seen()
    }

    /// SIGTERM (drain), then waits for a clean exit; returns stdout (the run summary) and the
    /// final ledger reports.
    pub fn stop(mut self) -> (String, Seen) {
        self.signal("-TERM");
        let status = self.child.wait().expect("wait for sharehost");
        assert!(
            status.success(),
            "{}: sharehost exits 0 after SIGTERM, got {status}",
            self.name
        );
        let seen = self.finish();
        let out = self
            .stdout
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        (out, seen)
    }

    /// The host's log lines so far (ledger reports excepted). A thread of its own reads them, so
    /// a line the host wrote before an answer the test saw may not be here yet: to find one,
    /// [`HostProcess::wait_for_log`]; to count them, [`HostProcess::stop_with_log`].
    pub fn log_lines(&self) -> Vec<String> {
        lock(&self.log).clone()
    }

    /// The member id its pipeline logs when it starts running (`member="..."`), once logged:
    /// an exactly-once pipeline's transactional id is `sharehost.<group>.<member id>`.
    pub fn member_id(&self) -> String {
        self.wait_for_log("pipeline running")
            .iter()
            .find(|l| l.contains("pipeline running"))
            .and_then(|l| l.split("member=\"").nth(1))
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_else(|| panic!("{}: no member id in the log", self.name))
            .to_owned()
    }

    /// Stops the broker of the default harness (`dev/kafka stop-broker`) once this host has
    /// judged a quarter of `n` ids, starts it again, and waits until the host has judged all
    /// `n` after it.
    pub fn restart_broker_mid_stream(&self, n: usize) {
        self.wait_for("a quarter judged", |seen| seen.judged() >= n / 4);
        crate::harness("stop-broker");
        crate::harness("start-broker");
        self.wait_for("every id judged after the restart", |seen| {
            seen.distinct().len() >= n
        });
    }

    /// Waits until a log line contains `text` (at most [`PATIENCE`], then fails the test with
    /// the log), and returns the lines read so far.
    pub fn wait_for_log(&self, text: &str) -> Vec<String> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let lines = self.log_lines();
            if lines.iter().any(|l| l.contains(text)) {
                return lines;
            }
            assert!(
                Instant::now() < deadline,
                "{}: no log line with {text:?} after {PATIENCE:?}: {lines:#?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// [`HostProcess::stop`], and every line the host logged, read to the end.
    pub fn stop_with_log(self) -> (String, Seen, Vec<String>) {
        let log = self.log.clone();
        let (out, seen) = self.stop();
        let lines = lock(&log).clone();
        (out, seen, lines)
    }

    /// SIGKILL: a crash, no draining; returns what the plugin had reported up to then.
    pub fn kill(mut self) -> Seen {
        self.signal("-KILL");
        let _ = self.child.wait();
        self.finish()
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        // A failing test must not leave a host consuming behind it.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs one host of `bin` on `manifest` until the ledger plugin has judged `ids` distinct ids
/// and the broker has nothing left for `group`, then stops it (SIGTERM); returns the host's
/// `/pipelines` status taken before the stop and what the plugin reported. Every id judged is
/// not enough: a verdict whose acknowledgement a fault cut off leaves its record to be
/// delivered again, and only a host still running takes it.
pub async fn run_until_judged(
    bin: &'static Path,
    manifest: PathBuf,
    ids: usize,
    group: &str,
) -> (serde_json::Value, Seen) {
    let host = Arc::new(crate::blocking(move || HostProcess::start(bin, &manifest, "host")).await);
    let h = host.clone();
    crate::blocking(move || h.wait_for("every id judged", |seen| seen.distinct().len() >= ids))
        .await;
    let group = group.to_owned();
    crate::blocking(move || crate::broker::wait_until_drained(&group)).await;
    let status = host.status();
    let Ok(host) = Arc::try_unwrap(host) else {
        panic!("the host has no other owner once its wait is done")
    };
    let (_, seen) = crate::blocking(move || host.stop()).await;
    (status, seen)
}

#[cfg(test)]
mod tests {
    use super::ids_after;

    #[test]
    fn reads_id_lists_out_of_log_lines() {
        let line = r#"2026-11-30T10:00:00Z  INFO sharehost::runtime::host: ledger accepted=1,20,300 plugin="p""#;
        assert_eq!(
            ids_after(line, "ledger accepted=").collect::<Vec<_>>(),
            ["1", "20", "300"]
        );
        assert_eq!(ids_after(line, "ledger rejected=").count(), 0);
    }
}
