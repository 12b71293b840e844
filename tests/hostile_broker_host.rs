//! The malicious-broker test at the level of the `sharehost` binary: `sharehost run` against the
//! fake broker of `support::fake_broker`, which lies about an array length in its first
//! ShareGroupHeartbeat answer and acquires `0..=i64::MAX` in its first ShareFetch answer. The
//! process must drop the connection that lied, join on a new one, judge the three records the
//! fetch carried, and keep running until it is told to stop. (`tests/hostile_broker.rs` covers
//! each lying response against the library, with the log line checked.)
//!
//! Part of the host package's tests (it needs the `sharehost` binary Cargo builds for them),
//! kept here with the other broker tests.

use kafka_protocol::messages::ApiKey;
use sharehost_tests::fake_broker::{FakeBroker, TOPIC, lying_share_member};
use sharehost_tests::host::HostProcess;
use sharehost_tests::sharehost_bin;
use sharehost_tests::{guest, ledger_manifest, repo_root, unique};

#[test]
fn sharehost_run_survives_a_lying_heartbeat_and_a_huge_acquired_range() {
    let broker = FakeBroker::start(lying_share_member(&["1", "2", "3"]));

    let dir = repo_root().join("target/hostile-broker-host");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let manifest = dir.join(format!("{}.toml", unique("manifest")));
    std::fs::write(
        &manifest,
        ledger_manifest(
            &broker.addr(),
            TOPIC,
            &unique("lying-group"),
            &guest("fixture_ledger"),
            r#"reject-every = "7""#,
            "",
        ),
    )
    .expect("write manifest");

    let host = HostProcess::start(sharehost_bin!(), &manifest, "host");
    // The three records of the huge range are judged: the host joined after the lie, on a new
    // connection, and did not walk 2^63 offsets.
    let seen = host.wait_for("the three records judged", |s| s.accepted.len() >= 3);
    assert_eq!(
        seen.distinct(),
        ["1", "2", "3"].into_iter().collect(),
        "the plugin judged exactly the records the fetch carried"
    );
    broker.wait_until(
        "the connection that lied dropped and a new one opened",
        |requests, connections, closed| {
            let lied_on = requests
                .iter()
                .find(|r| r.api == ApiKey::ShareGroupHeartbeat && r.nth == 0)
                .map(|r| r.connection);
            lied_on.is_some_and(|c| closed.contains(&c))
                && requests
                    .iter()
                    .any(|r| r.api == ApiKey::ShareGroupHeartbeat && r.nth > 0)
                && connections >= 2
        },
    );
    // Still running: it answers on its admin endpoint and drains on SIGTERM with exit 0.
    let (code, _) = host.http("GET", "/pipelines", "");
    assert_eq!(code, 200, "the host still serves its admin endpoint");
    let (summary, _) = host.stop();
    assert!(
        summary.contains("pipeline ledger"),
        "the run summary after SIGTERM: {summary}"
    );
}
