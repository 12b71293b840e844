//! Fleet mode for a test's hosts: the `[trust]` and `[fleet]` tables a fleet host's manifest
//! starts with, an operator's kit (key, signed versions, host manifests), `sharehost fleet` run
//! as an operator would, and waits on what the hosts report.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::host::{HostProcess, PATIENCE, Seen};
use crate::ledger::Ledger;
use crate::signing::Signer;
use crate::{guest, new_version, unique};

/// A test's fleet as its operator holds it: a fresh key pair (its secret key file for
/// `sharehost fleet --key`), the ledger plugin signed with it (`v1`, every host's manifest
/// component), fleet topics of the test's own (a unique prefix) and a scratch directory for
/// manifests, versions and state.
pub struct FleetKit {
    /// The fleet's name.
    pub name: String,
    /// Where its files go.
    pub dir: PathBuf,
    /// The operator's key pair, which every host trusts.
    pub operator: Signer,
    /// The operator's secret key file.
    pub key: PathBuf,
    /// The ledger plugin, signed.
    pub v1: PathBuf,
    /// The prefix of the fleet's topics.
    pub prefix: String,
    /// More public key lines every host trusts beside the operator's.
    pub also_trusted: Vec<String>,
}

impl FleetKit {
    /// A fleet named `name` with everything fresh.
    pub fn new(name: &str) -> FleetKit {
        let dir = std::env::temp_dir().join(unique(&format!("sharehost-fleet-{name}")));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let operator = Signer::new();
        let key = dir.join("operator.key");
        operator.write_key(&key);
        let v1 = dir.join("v1.wasm");
        std::fs::copy(guest("fixture_ledger"), &v1).expect("copy v1");
        operator.sign(&v1);
        FleetKit {
            name: name.to_owned(),
            dir,
            operator,
            key,
            v1,
            prefix: format!("{}.", unique("fleet")),
            also_trusted: Vec::new(),
        }
    }

    /// A signed copy of `component` with a new hash (`tag` names it).
    pub fn version(&self, component: &Path, tag: &str) -> PathBuf {
        let path = self.dir.join(format!("{tag}.wasm"));
        std::fs::write(&path, new_version(component, tag)).expect("write version");
        self.operator.sign(&path);
        path
    }

    /// Writes host `id`'s manifest: the fleet's tables, `fleet_extra` lines in `[fleet]`, then
    /// `rest` (the cluster, admin and pipelines, e.g. a `ledger_manifest`).
    pub fn manifest(&self, id: &str, fleet_extra: &str, rest: &str) -> PathBuf {
        let path = self.dir.join(format!("{id}.toml"));
        let keys: Vec<String> = std::iter::once(self.operator.public())
            .chain(self.also_trusted.iter().cloned())
            .collect();
        let text = format!(
            "{}{fleet_extra}{rest}",
            fleet_tables(&keys.join("\", \""), &self.name, id, &self.prefix)
        );
        std::fs::write(&path, text).expect("write manifest");
        path
    }

    /// Host `id`'s state directory (kept across its restarts).
    pub fn state(&self, id: &str) -> PathBuf {
        self.dir.join(format!("state-{id}"))
    }

    /// Starts `bin run MANIFEST` as host `id`, with its own state directory.
    pub fn start(&self, bin: &Path, manifest: &Path, id: &str) -> HostProcess {
        let state = self.state(id);
        HostProcess::start_with_env(
            bin,
            manifest,
            id,
            &[("SHAREHOST_STATE_DIR", state.to_str().expect("utf-8 path"))],
        )
    }

    /// `bin fleet ARGS` on the pipeline `ledger` as this fleet's operator, with `manifest`;
    /// whether it succeeded, and what it printed.
    pub fn try_fleet(&self, bin: &Path, manifest: &Path, args: &[&str]) -> (bool, String) {
        fleet_command(bin, manifest, "ledger", &self.key, args)
    }

    /// [`FleetKit::try_fleet`], failing the test when the command fails.
    pub fn fleet(&self, bin: &Path, manifest: &Path, args: &[&str]) -> String {
        let (ok, out) = self.try_fleet(bin, manifest, args);
        assert!(ok, "sharehost fleet {args:?}: {out}");
        out
    }
}

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

/// Prints, for a ledger with duplicates, which hosts judged the first duplicated ids and each
/// host's warnings and errors: a duplicate on a busy CI machine is then explained by its own
/// run's output (the planned traps of a canary left out).
pub fn explain_duplicates(ledger: &Ledger, hosts: &[(&str, &Seen, &[String])]) {
    if ledger.duplicates() == 0 {
        return;
    }
    for (id, times) in ledger.duplicated_ids(10) {
        let by: Vec<String> = hosts
            .iter()
            .map(|(name, seen, _)| {
                let n = seen
                    .accepted
                    .iter()
                    .chain(&seen.rejected)
                    .filter(|i| *i == id)
                    .count();
                format!("{name}×{n}")
            })
            .collect();
        println!("duplicate {id}: judged {times} times ({})", by.join(", "));
    }
    for (name, _, lines) in hosts {
        for line in lines
            .iter()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .filter(|l| !l.contains("planned trap") && !l.contains("sharehost_runtime::log"))
            .take(40)
        {
            println!("[{name}] {line}");
        }
    }
}
