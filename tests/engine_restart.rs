//! The share engine survives a broker restart mid-stream without the caller's help, and loses
//! nothing: records whose session died with the broker come back and are accepted. Its own test
//! binary because it stops the shared test broker.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sharehost::share::consumer::{ShareConsumer, ShareConsumerConfig};
use sharehost::share::ledger::AckKind;
use sharehost_tests::{client, fresh_group, harness, init_logging, topic_with_records};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_survives_a_broker_restart_and_loses_nothing() {
    init_logging();
    let client = Arc::new(client().await);
    let (topic, ids) = topic_with_records(&client, 2, 100).await;
    let group = fresh_group(&client, None).await;
    let mut config = ShareConsumerConfig::new(&group, &[&topic]);
    config.max_records = 20;
    config.batch_size = 20;
    let c = ShareConsumer::start(client.clone(), config)
        .await
        .expect("start");

    let mut accepted = HashSet::new();
    let mut deliveries = 0usize;
    let mut restarted = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while accepted.len() < ids.len() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {} after the restart",
            accepted.len(),
            ids.len()
        );
        let Some(d) = c
            .poll(Duration::from_secs(1))
            .await
            .expect("poll (the engine must not give up)")
        else {
            continue;
        };
        for r in &d.records {
            deliveries += 1;
            if c.acknowledge(r, AckKind::Accept).expect("ack") {
                accepted.insert(
                    String::from_utf8_lossy(r.record.value.as_deref().unwrap_or_default())
                        .into_owned(),
                );
            }
        }
        if !restarted && accepted.len() >= ids.len() / 4 {
            // Mid-stream: verdicts are pending, records are held, the broker goes away.
            tokio::task::spawn_blocking(|| {
                harness("stop-broker");
                harness("start-broker");
            })
            .await
            .expect("join");
            restarted = true;
        }
    }
    assert!(restarted);
    assert!(
        c.flush(Duration::from_secs(60)).await,
        "verdicts answered after the restart"
    );
    let stats = c.stats();
    assert!(
        stats.session_resets.load(Ordering::Relaxed) >= 1,
        "the session was re-opened"
    );
    c.close(Duration::from_secs(30)).await;
    println!(
        "ledger: produced {}, accepted {}, deliveries {}, duplicates {}, released by the broker {}",
        ids.len(),
        accepted.len(),
        deliveries,
        deliveries - accepted.len(),
        stats.released_by_broker.load(Ordering::Relaxed)
    );
    assert_eq!(accepted, ids, "no record lost");
}
