//! The share engine survives a broker restart mid-stream without the caller's help, and loses
//! nothing: records whose session died with the broker come back and are accepted. Its own test
//! binary because it stops the shared test broker.
//!
//! The ledger is the broker's, read by Apache's own ShareGroupCommand: the test ends when every
//! record was accepted here and the broker has nothing left for the group, so a verdict the
//! engine took but never delivered cannot pass for an accepted record.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sharehost::share::consumer::{ShareConsumer, ShareConsumerConfig};
use sharehost::share::ledger::AckKind;
use sharehost_tests::host::PATIENCE;
use sharehost_tests::{
    blocking, client, fresh_group, group_lag, harness, init_logging, topic_with_records,
};

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

    let began = Instant::now();
    let mut accepted = HashSet::new();
    let mut deliveries = 0usize;
    let mut stale = 0usize;
    let mut restarted: Option<Duration> = None;
    let mut broker_lag: Option<Vec<i64>> = None;
    // A hang guard, not a speed check: it fails only when nothing at all happens for PATIENCE
    // (no record accepted, no change in what the broker has left), however slow the machine.
    let mut last_progress = Instant::now();
    loop {
        if accepted.len() == ids.len() {
            // Everything was judged here; the broker says whether every verdict reached it. What
            // it still holds comes back (or is settled by the engine from the verdict it kept)
            // as the polling below goes on.
            assert!(
                c.flush(PATIENCE).await,
                "verdicts answered after the restart"
            );
            let g = group.clone();
            let lag = blocking(move || group_lag(&g)).await;
            if !lag.is_empty() && lag.iter().all(|l| *l == 0) {
                break;
            }
            if broker_lag.as_ref() != Some(&lag) {
                last_progress = Instant::now();
            }
            broker_lag = Some(lag);
        }
        assert!(
            last_progress.elapsed() < PATIENCE,
            "no progress for {PATIENCE:?}: {} of {} accepted here, the broker's lag {broker_lag:?}, \
             the broker restarted {restarted:?} after the start ({:?} ago)",
            accepted.len(),
            ids.len(),
            began.elapsed()
        );
        let Some(mut d) = c
            .poll(Duration::from_secs(1))
            .await
            .expect("poll (the engine must not give up)")
        else {
            continue;
        };
        // As a pipeline does before judging: records queued before their session ended are
        // back with the broker, and a verdict on them would be moot.
        stale += c.retain_held(&mut d.records);
        for r in &d.records {
            deliveries += 1;
            if c.acknowledge(r, AckKind::Accept).expect("ack")
                && accepted.insert(
                    String::from_utf8_lossy(r.record.value.as_deref().unwrap_or_default())
                        .into_owned(),
                )
            {
                last_progress = Instant::now();
            }
        }
        if restarted.is_none() && accepted.len() >= ids.len() / 4 {
            // Mid-stream: verdicts are pending, records are held, the broker goes away.
            blocking(|| {
                harness("stop-broker");
                harness("start-broker");
            })
            .await;
            restarted = Some(began.elapsed());
            last_progress = Instant::now();
        }
    }
    assert!(restarted.is_some(), "the broker was restarted");
    let stats = c.stats();
    assert!(
        stats.session_resets.load(Ordering::Relaxed) >= 1,
        "the session was re-opened"
    );
    c.close(PATIENCE).await;
    println!(
        "ledger: produced {}, accepted {}, deliveries {}, duplicates {}, released by the broker {}, \
         dropped as stale {stale}, verdicts replayed {}; broker restarted {restarted:?} after the start, all settled at the \
         broker after {:?}",
        ids.len(),
        accepted.len(),
        deliveries,
        deliveries - accepted.len(),
        stats.released_by_broker.load(Ordering::Relaxed),
        stats.verdicts_replayed.load(Ordering::Relaxed),
        began.elapsed()
    );
    assert_eq!(accepted, ids, "no record lost");
}
