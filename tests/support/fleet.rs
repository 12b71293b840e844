//! Fleet mode for a test's hosts: the `[trust]` and `[fleet]` tables a fleet host's manifest
//! starts with, and `sharehost fleet` run as an operator would.

use std::path::Path;
use std::process::Command;

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
