//! Fleet mode for a test's hosts: the `[trust]` and `[fleet]` tables a fleet host's manifest
//! starts with, `sharehost fleet` run as an operator would, and waits on what the hosts report.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::host::{HostProcess, PATIENCE, Seen};

/// The `[trust]` and `[fleet]` tables of host `host_id` in fleet `name`, whose topics are
/// named with `prefix` (a test's own, so runs never share a fleet), trusting `key` (a public
/// key line). A status every 500 ms keeps the tests' waits short.
pub fn fleet_tables(key: &str, name: &str, host_id: &str, prefix: &str) -> String {
    format!(
        "[trust]\nkeys = [\"{key}\"]\n\n[fleet]\nname = \"{name}\"\nhost_id = \"{host_id}\"\ntopic_prefix = \"{prefix}\"\nstatus_interval_ms = 500\n\n"
    )
}

/// Runs `bin fleet COMMAND MANIFEST [--pipeline PIPELINE --key KEY] REST...` (status takes no
/// pipeline or key) and returns whether it succeeded, with its stdout and stderr.
pub fn fleet_command(
    bin: &Path,
    manifest: &Path,
    pipeline: &str,
    key: &Path,
    args: &[&str],
) -> (bool, String) {
    let (command, rest) = args.split_first().expect("a fleet command");
    let mut cmd = Command::new(bin);
    cmd.arg("fleet").arg(command).arg(manifest);
    if *command != "status" {
        cmd.arg("--pipeline").arg(pipeline).arg("--key").arg(key);
    }
    let out = cmd.args(rest).output().expect("run sharehost fleet");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The content hash `sharehost` names a component by.
pub fn hash(path: &Path) -> String {
    sharehost::fleet::components::digest(&std::fs::read(path).expect("read component"))
}

/// Polls every host's `GET /pipelines` until `cond` holds for the first pipeline of each
/// (a host has no way to notify a test); fails after a bound with the statuses.
pub fn poll_all(hosts: &[&HostProcess], what: &str, cond: impl Fn(&serde_json::Value) -> bool) {
    let until = Instant::now() + PATIENCE;
    loop {
        let statuses: Vec<serde_json::Value> = hosts.iter().map(|h| h.status()).collect();
        if statuses.iter().all(|s| cond(&s[0])) {
            return;
        }
        assert!(
            Instant::now() < until,
            "timed out waiting for {what}: {statuses:#?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls a host's `GET /fleet` until `cond` holds.
pub fn poll_fleet(
    host: &HostProcess,
    what: &str,
    cond: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let until = Instant::now() + PATIENCE;
    loop {
        let (code, body) = host.http("GET", "/fleet", "");
        assert_eq!(code, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("JSON fleet");
        if cond(&v) {
            return v;
        }
        assert!(
            Instant::now() < until,
            "timed out waiting for {what}: {v:#}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the hosts' ledgers together have judged every id produced so far.
pub fn wait_judged(hosts: &[&HostProcess], n: usize) {
    wait_judged_with(hosts, &[], n);
}

/// [`wait_judged`], counting also what hosts that are gone judged (`before`).
pub fn wait_judged_with(hosts: &[&HostProcess], before: &[Seen], n: usize) {
    let until = Instant::now() + PATIENCE;
    loop {
        let judged: std::collections::HashSet<String> = hosts
            .iter()
            .map(|h| h.seen())
            .chain(before.iter().cloned())
            .flat_map(|s| s.accepted.into_iter().chain(s.rejected))
            .collect();
        if judged.len() >= n {
            return;
        }
        assert!(
            Instant::now() < until,
            "only {} of {n} ids judged",
            judged.len()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
