//! The share consumer engine against the real broker.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use sharehost::kafka::KafkaClient;
use sharehost::share::consumer::{ShareConsumer, ShareConsumerConfig, ShareRecord};
use sharehost::share::ledger::AckKind;
use sharehost_tests::{client, fresh_group, group_lag, init_logging, topic_with_records};

fn value(r: &ShareRecord) -> String {
    String::from_utf8_lossy(r.record.value.as_deref().unwrap_or_default()).into_owned()
}

/// The next delivery with at least one record, failing the test after 60 s without one.
async fn next_records(consumer: &ShareConsumer) -> Vec<ShareRecord> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no records arrived within 60 s"
        );
        if let Some(d) = consumer.poll(Duration::from_secs(1)).await.expect("poll")
            && !d.records.is_empty()
        {
            return d.records;
        }
    }
}

fn start_config(group: &str, topics: &[&str]) -> ShareConsumerConfig {
    ShareConsumerConfig::new(group, topics)
}

/// Polls and accepts until `want` distinct records arrived; returns what each poll gave.
async fn accept_all(consumer: &ShareConsumer, want: usize, accepted: &mut Vec<String>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while accepted.len() < want {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {want} records arrived",
            accepted.len()
        );
        let Some(d) = consumer.poll(Duration::from_secs(1)).await.expect("poll") else {
            continue;
        };
        assert!(d.poison.is_empty());
        for r in &d.records {
            accepted.push(
                String::from_utf8_lossy(r.record.value.as_deref().unwrap_or_default()).into_owned(),
            );
            assert!(
                consumer.acknowledge(r, AckKind::Accept).expect("ack"),
                "fresh session"
            );
        }
    }
}

#[tokio::test]
async fn one_member_gets_every_record_exactly_once_and_leaves_nothing_in_flight() {
    init_logging();
    let client = Arc::new(client().await);
    let (topic, ids) = topic_with_records(&client, 3, 100).await;
    let group = fresh_group(&client, None).await;
    let consumer =
        ShareConsumer::start(client.clone(), ShareConsumerConfig::new(&group, &[&topic]))
            .await
            .expect("start");
    let mut accepted = Vec::new();
    accept_all(&consumer, ids.len(), &mut accepted).await;
    consumer.close(Duration::from_secs(30)).await;
    let unique: HashSet<String> = accepted.iter().cloned().collect();
    assert_eq!(accepted.len(), unique.len(), "no record delivered twice");
    assert_eq!(unique, ids, "every record delivered");
    assert_eq!(consumer.in_flight(), 0);
    let lag = group_lag(&group);
    assert_eq!(lag.len(), 3, "one row per partition");
    assert!(
        lag.iter().all(|l| *l == 0),
        "nothing left in flight or unconsumed: {lag:?}"
    );
}

#[tokio::test]
async fn two_members_in_one_group_accept_each_record_once_and_miss_none() {
    init_logging();
    let client = Arc::new(client().await);
    let (topic, ids) = topic_with_records(&client, 4, 150).await;
    let group = fresh_group(&client, None).await;
    let a = ShareConsumer::start(client.clone(), ShareConsumerConfig::new(&group, &[&topic]))
        .await
        .expect("a");
    let b = ShareConsumer::start(client.clone(), ShareConsumerConfig::new(&group, &[&topic]))
        .await
        .expect("b");
    let mut got_a = Vec::new();
    let mut got_b = Vec::new();
    let total = ids.len();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while got_a.len() + got_b.len() < total {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {total}",
            got_a.len() + got_b.len()
        );
        for (c, got) in [(&a, &mut got_a), (&b, &mut got_b)] {
            if let Some(d) = c.poll(Duration::from_millis(200)).await.expect("poll") {
                for r in &d.records {
                    got.push(
                        String::from_utf8_lossy(r.record.value.as_deref().unwrap_or_default())
                            .into_owned(),
                    );
                    c.acknowledge(r, AckKind::Accept).expect("ack");
                }
            }
        }
    }
    a.close(Duration::from_secs(30)).await;
    b.close(Duration::from_secs(30)).await;
    let all: Vec<String> = got_a.iter().chain(&got_b).cloned().collect();
    let set: HashSet<String> = all.iter().cloned().collect();
    assert_eq!(all.len(), set.len(), "no record accepted twice");
    assert_eq!(set, ids, "none missing");
}

#[tokio::test]
async fn release_redelivers_with_a_higher_delivery_count_and_reject_archives() {
    init_logging();
    let client = Arc::new(client().await);
    let (topic, _) = topic_with_records(&client, 1, 2).await;
    let group = fresh_group(&client, None).await;
    let c = ShareConsumer::start(client.clone(), start_config(&group, &[&topic]))
        .await
        .expect("start");
    let mut seen: Vec<(String, i16)> = Vec::new();
    // Release record 0-0 once, reject 0-1 at once, accept 0-0 on its second delivery.
    while !seen.iter().any(|(v, n)| v == "0-0" && *n == 2) {
        for r in next_records(&c).await {
            seen.push((value(&r), r.delivery_count));
            let kind = match (value(&r).as_str(), r.delivery_count) {
                ("0-0", 1) => AckKind::Release,
                ("0-0", _) => AckKind::Accept,
                _ => AckKind::Reject,
            };
            assert!(c.acknowledge(&r, kind).expect("ack"));
        }
    }
    assert!(c.flush(Duration::from_secs(30)).await, "verdicts answered");
    let failures: Vec<_> = c
        .take_outcomes()
        .into_iter()
        .filter(|o| o.error.is_some())
        .collect();
    assert!(
        failures.is_empty(),
        "the broker took every verdict: {failures:?}"
    );
    c.close(Duration::from_secs(30)).await;
    assert_eq!(
        seen.iter().filter(|(v, _)| v == "0-1").count(),
        1,
        "a rejected record is never redelivered: {seen:?}"
    );
    assert!(
        seen.contains(&("0-0".into(), 1)) && seen.contains(&("0-0".into(), 2)),
        "{seen:?}"
    );
    assert_eq!(
        group_lag(&group),
        vec![0],
        "both records are done (accepted / archived)"
    );
}

#[tokio::test]
async fn a_record_without_a_verdict_comes_back_after_its_lock_expires() {
    init_logging();
    let client = Arc::new(client().await);
    let (topic, _) = topic_with_records(&client, 1, 1).await;
    let group = fresh_group(&client, Some(1500)).await;
    let c = ShareConsumer::start(client.clone(), start_config(&group, &[&topic]))
        .await
        .expect("start");
    let first = next_records(&c).await;
    assert_eq!(first[0].delivery_count, 1);
    // No verdict: the broker's lock expires and the record is delivered again.
    let again = next_records(&c).await;
    assert_eq!(value(&again[0]), value(&first[0]));
    assert_eq!(again[0].delivery_count, 2, "redelivery counts up");
    assert!(c.acknowledge(&again[0], AckKind::Accept).expect("ack"));
    assert_eq!(
        c.in_flight(),
        0,
        "the record delivered twice was held once, and is judged"
    );
    assert!(
        !c.acknowledge(&first[0], AckKind::Accept).expect("ack"),
        "a verdict for the first copy is moot"
    );
    c.close(Duration::from_secs(30)).await;
    assert_eq!(group_lag(&group), vec![0]);
}

/// Holds a record for three lock durations, renewing it by `renew`, while a second member of the
/// group polls; the second member must never get it, and the final Accept must succeed.
async fn hold_past_the_lock(auto: bool) {
    init_logging();
    let client = Arc::new(client().await);
    let (topic, _) = topic_with_records(&client, 1, 1).await;
    // Long enough that a renewal delayed by a busy machine still lands before the lock ends.
    let lock_ms = 3000;
    let group = fresh_group(&client, Some(lock_ms)).await;
    let mut config = start_config(&group, &[&topic]);
    if auto {
        config.auto_renew_after = Some(0.4);
    }
    let holder = ShareConsumer::start(client.clone(), config)
        .await
        .expect("start");
    let record = next_records(&holder).await.remove(0);
    let other = ShareConsumer::start(client.clone(), start_config(&group, &[&topic]))
        .await
        .expect("second");
    let hold_until = tokio::time::Instant::now() + Duration::from_millis(3 * lock_ms as u64);
    while tokio::time::Instant::now() < hold_until {
        if !auto {
            assert!(holder.acknowledge(&record, AckKind::Renew).expect("renew"));
        }
        // Polling the other member doubles as the pause between renewals.
        if let Some(d) = other
            .poll(Duration::from_millis(lock_ms as u64 / 3))
            .await
            .expect("poll")
        {
            assert!(
                d.records.is_empty(),
                "the renewed record went to another member: {:?}",
                d.records
            );
        }
        // Keep the holder's own delivery queue drained (it must stay empty too).
        if let Some(d) = holder.poll(Duration::from_millis(1)).await.expect("poll") {
            assert!(d.records.is_empty(), "the renewed record was redelivered");
        }
    }
    assert!(
        holder
            .acknowledge(&record, AckKind::Accept)
            .expect("accept")
    );
    assert!(holder.flush(Duration::from_secs(30)).await);
    let outcomes = holder.take_outcomes();
    assert!(
        outcomes.iter().all(|o| o.error.is_none()),
        "renewals and the accept succeeded: {outcomes:?}"
    );
    assert!(
        holder
            .stats()
            .renewed
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 2,
        "renewed more than once"
    );
    holder.close(Duration::from_secs(30)).await;
    other.close(Duration::from_secs(30)).await;
    assert_eq!(group_lag(&group), vec![0]);
}

#[tokio::test]
async fn renew_keeps_a_record_acquired_past_the_lock_duration() {
    hold_past_the_lock(false).await;
}

#[tokio::test]
async fn auto_renew_keeps_a_slow_record_acquired() {
    hold_past_the_lock(true).await;
}

#[tokio::test]
async fn the_delivery_cap_rejects_a_poison_record_before_the_handler_sees_it() {
    init_logging();
    let client = Arc::new(client().await);
    let (topic, _) = topic_with_records(&client, 1, 1).await;
    let group = fresh_group(&client, None).await;
    let mut config = start_config(&group, &[&topic]);
    config.delivery_count_limit = Some(3);
    let c = ShareConsumer::start(client.clone(), config)
        .await
        .expect("start");
    let mut handled = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let poison = loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cap never triggered; handled {handled:?}"
        );
        let Some(d) = c.poll(Duration::from_secs(1)).await.expect("poll") else {
            continue;
        };
        for r in &d.records {
            handled.push(r.delivery_count);
            assert!(c.acknowledge(r, AckKind::Release).expect("release"));
        }
        if let Some(p) = d.poison.into_iter().next() {
            break p;
        }
    };
    assert_eq!(
        handled,
        vec![1, 2],
        "the handler saw the first two deliveries only"
    );
    assert_eq!(poison.delivery_count, 3);
    assert!(c.flush(Duration::from_secs(30)).await);
    let outcomes = c.take_outcomes();
    assert!(outcomes.iter().all(|o| o.error.is_none()), "{outcomes:?}");
    c.close(Duration::from_secs(30)).await;
    assert_eq!(
        group_lag(&group),
        vec![0],
        "the poison record was really rejected (archived)"
    );
}

#[tokio::test]
async fn graceful_close_releases_unjudged_records_at_once() {
    init_logging();
    let client = Arc::new(client().await);
    let (topic, ids) = topic_with_records(&client, 1, 20).await;
    // A one-minute lock: only the close can hand the records over within the test's deadline.
    let group = fresh_group(&client, Some(60_000)).await;
    let a = ShareConsumer::start(client.clone(), start_config(&group, &[&topic]))
        .await
        .expect("a");
    let held = next_records(&a).await;
    assert!(!held.is_empty());
    a.close(Duration::from_secs(30)).await;
    let b = ShareConsumer::start(client.clone(), start_config(&group, &[&topic]))
        .await
        .expect("b");
    let mut got = HashSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while got.len() < ids.len() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "records still locked by the closed member: {}",
            got.len()
        );
        let Some(d) = b.poll(Duration::from_secs(1)).await.expect("poll") else {
            continue;
        };
        for r in &d.records {
            if held.iter().any(|h| h.record.offset == r.record.offset) {
                assert_eq!(r.delivery_count, 2, "released by the close, not expired");
            }
            got.insert(value(r));
            b.acknowledge(r, AckKind::Accept).expect("ack");
        }
    }
    b.close(Duration::from_secs(30)).await;
    assert_eq!(got, ids);
}

#[tokio::test]
async fn a_cut_connection_reopens_the_session_and_loses_nothing() {
    init_logging();
    let client = Arc::new(client().await);
    let (topic, ids) = topic_with_records(&client, 2, 50).await;
    let group = fresh_group(&client, None).await;
    let c = ShareConsumer::start(client.clone(), start_config(&group, &[&topic]))
        .await
        .expect("start");
    let first = next_records(&c).await;
    // Judge half of the first delivery, then lose the connection before those verdicts go out.
    let mut values: std::collections::HashMap<(i32, i64), String> = Default::default();
    for r in first.iter().take(first.len() / 2) {
        values.insert((r.partition.partition, r.record.offset), value(r));
        c.acknowledge(r, AckKind::Accept).expect("ack");
    }
    // The unjudged half is still held; once the session dies, it no longer is.
    let mut unjudged: Vec<_> = first.iter().skip(first.len() / 2).cloned().collect();
    let unjudged_count = unjudged.len();
    assert_eq!(c.retain_held(&mut unjudged), 0, "all held before the cut");
    c.disconnect_for_testing();
    let judged_before: HashSet<(i32, i64)> = values.keys().copied().collect();
    // A record counts as accepted only when the broker confirmed its Accept: verdicts that
    // were pending when the session died come back as failed outcomes; their records are
    // redelivered, and the engine settles them with those verdicts without handing them over.
    let mut delivered_again = Vec::new();
    let mut confirmed = HashSet::new();
    let mut failed_outcomes = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while confirmed.len() < ids.len() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {} confirmed after the cut",
            confirmed.len(),
            ids.len()
        );
        if let Some(d) = c.poll(Duration::from_millis(300)).await.expect("poll") {
            for r in &d.records {
                let key = (r.partition.partition, r.record.offset);
                if judged_before.contains(&key) {
                    delivered_again.push(key);
                }
                values.insert(key, value(r));
                c.acknowledge(r, AckKind::Accept).expect("ack");
            }
        }
        c.flush(Duration::from_secs(10)).await;
        for o in c.take_outcomes() {
            if o.error.is_some() {
                failed_outcomes += 1;
                continue;
            }
            for b in &o.batches {
                for off in b.first_offset..=b.last_offset {
                    if let Some(v) = values.get(&(o.partition, off)) {
                        confirmed.insert(v.clone());
                    }
                }
            }
        }
    }
    assert_eq!(
        c.retain_held(&mut unjudged),
        unjudged_count,
        "records of the dead session are no longer held (the broker released them)"
    );
    let stats = c.stats();
    assert!(
        stats
            .session_resets
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1,
        "the session was re-opened"
    );
    assert!(
        failed_outcomes >= 1,
        "the verdicts lost with the session were reported, not swallowed"
    );
    assert_eq!(
        delivered_again,
        Vec::<(i32, i64)>::new(),
        "a record judged before the cut is not handed over again"
    );
    assert!(
        stats
            .verdicts_replayed
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1,
        "the lost verdicts were applied when their records came back"
    );
    c.close(Duration::from_secs(30)).await;
    assert_eq!(confirmed, ids);
    assert_eq!(group_lag(&group), vec![0, 0], "nothing lost, nothing left");
}

#[tokio::test]
async fn a_member_that_leaves_and_a_new_one_that_joins_share_the_work() {
    init_logging();
    let client = Arc::new(client().await);
    let (topic, ids) = topic_with_records(&client, 2, 60).await;
    let group = fresh_group(&client, None).await;
    let mut accepted = Vec::new();
    let first = ShareConsumer::start(client.clone(), start_config(&group, &[&topic]))
        .await
        .expect("first");
    accept_all(&first, 30, &mut accepted).await;
    assert!(first.flush(Duration::from_secs(30)).await);
    first.close(Duration::from_secs(30)).await;
    let second = ShareConsumer::start(client.clone(), start_config(&group, &[&topic]))
        .await
        .expect("second");
    accept_all(&second, ids.len(), &mut accepted).await;
    second.close(Duration::from_secs(30)).await;
    let set: HashSet<String> = accepted.iter().cloned().collect();
    assert_eq!(
        set, ids,
        "every record accepted once the second member took over"
    );
    assert_eq!(set.len(), accepted.len(), "none twice");
}

/// A member holding records of a partition that moves to a newcomer still judges them: its
/// verdicts reach the broker (they once waited in the ledger for a session that had forgotten
/// the partition, and the records were judged again by the newcomer after their lock ran out).
#[tokio::test]
async fn records_held_when_a_partition_moves_to_a_new_member_are_still_judged_by_the_old_one() {
    init_logging();
    let client = Arc::new(client().await);
    let (topic, ids) = topic_with_records(&client, 2, 30).await;
    let group = fresh_group(&client, None).await;
    let first = ShareConsumer::start(client.clone(), start_config(&group, &[&topic]))
        .await
        .expect("first");
    let mut held: Vec<ShareRecord> = Vec::new();
    while held.len() < ids.len() {
        held.extend(next_records(&first).await);
    }
    let mut assignment = first.assignment();
    let second = ShareConsumer::start(client.clone(), start_config(&group, &[&topic]))
        .await
        .expect("second");
    let kept = tokio::time::timeout(
        Duration::from_secs(60),
        assignment.wait_for(|a| a.len() == 1),
    )
    .await
    .expect("the newcomer takes a partition within 60 s")
    .expect("assignment watch")
    .clone();
    let moved: Vec<&ShareRecord> = held
        .iter()
        .filter(|r| !kept.contains(&r.partition))
        .collect();
    assert_eq!(moved.len(), 30, "the records of the partition that moved");
    // The kept partition's verdicts first: the request carrying them forgets the moved
    // partition from the session, as a busy member's next fetch does.
    for r in held.iter().filter(|r| kept.contains(&r.partition)) {
        assert!(
            first.acknowledge(r, AckKind::Accept).expect("ack"),
            "still held"
        );
    }
    assert!(first.flush(Duration::from_secs(30)).await);
    for r in &moved {
        assert!(
            first.acknowledge(r, AckKind::Accept).expect("ack"),
            "still held after its partition moved"
        );
    }
    assert!(
        first.flush(Duration::from_secs(30)).await,
        "the moved partition's verdicts reached the broker too"
    );
    let refused: Vec<_> = first
        .take_outcomes()
        .into_iter()
        .filter(|o| o.error.is_some())
        .collect();
    assert!(refused.is_empty(), "the broker took them all: {refused:?}");
    assert_eq!(
        first
            .stats()
            .acks_ok
            .load(std::sync::atomic::Ordering::Relaxed),
        60
    );
    first.close(Duration::from_secs(30)).await;
    second.close(Duration::from_secs(30)).await;
    let accepted: HashSet<String> = held.iter().map(value).collect();
    assert_eq!(accepted, ids, "the first member judged every record once");
    sharehost_tests::broker::wait_until_drained(&group);
}

#[tokio::test]
async fn one_consumer_subscribes_to_several_topics() {
    init_logging();
    let client = Arc::new(client().await);
    let (t1, ids1) = topic_with_records(&client, 2, 25).await;
    let (t2, ids2) = topic_with_records(&client, 1, 25).await;
    let group = fresh_group(&client, None).await;
    let c = ShareConsumer::start(client.clone(), start_config(&group, &[&t1, &t2]))
        .await
        .expect("start");
    let mut by_topic: std::collections::HashMap<String, HashSet<String>> = Default::default();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while by_topic.values().map(HashSet::len).sum::<usize>() < ids1.len() + ids2.len() {
        assert!(tokio::time::Instant::now() < deadline, "{by_topic:?}");
        let Some(d) = c.poll(Duration::from_secs(1)).await.expect("poll") else {
            continue;
        };
        for r in &d.records {
            by_topic
                .entry(r.topic.to_string())
                .or_default()
                .insert(value(r));
            c.acknowledge(r, AckKind::Accept).expect("ack");
        }
    }
    c.close(Duration::from_secs(30)).await;
    assert_eq!(by_topic.get(&t1), Some(&ids1));
    assert_eq!(by_topic.get(&t2), Some(&ids2));
}

#[tokio::test]
async fn the_engine_works_over_tls_with_scram() {
    init_logging();
    let s = sharehost_tests::SaslSsl::from_harness();
    let client = Arc::new(
        KafkaClient::connect(
            &s.bootstrap,
            s.config(sharehost::kafka::Mechanism::ScramSha512, &s.password),
        )
        .await
        .expect("SASL_SSL client"),
    );
    let (topic, ids) = topic_with_records(&client, 2, 30).await;
    let group = fresh_group(&client, None).await;
    let c = ShareConsumer::start(client.clone(), start_config(&group, &[&topic]))
        .await
        .expect("start");
    let mut accepted = Vec::new();
    accept_all(&c, ids.len(), &mut accepted).await;
    c.close(Duration::from_secs(30)).await;
    assert_eq!(accepted.into_iter().collect::<HashSet<_>>(), ids);
}

#[tokio::test]
async fn fetching_pauses_at_the_in_flight_bound_and_resumes_as_verdicts_go_out() {
    init_logging();
    let client = Arc::new(client().await);
    let (topic, ids) = topic_with_records(&client, 2, 60).await;
    let group = fresh_group(&client, None).await;
    let mut config = start_config(&group, &[&topic]);
    // Record-limit acquisition makes the bound exact (batch-optimized may overshoot one batch).
    config.acquire_mode = sharehost::share::consumer::AcquireMode::RecordLimit;
    config.max_in_flight = 7;
    let c = ShareConsumer::start(client.clone(), config)
        .await
        .expect("start");
    let mut held: Vec<ShareRecord> = Vec::new();
    let mut accepted = HashSet::new();
    let mut peak = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while accepted.len() < ids.len() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {}",
            accepted.len(),
            ids.len()
        );
        if let Some(d) = c.poll(Duration::from_millis(500)).await.expect("poll") {
            held.extend(d.records);
        }
        peak = peak.max(c.in_flight());
        assert!(
            c.in_flight() <= 7,
            "in flight {} exceeds the bound",
            c.in_flight()
        );
        // Records queued for the next poll count as in flight too.
        assert!(
            c.in_flight() >= held.len(),
            "every record the caller holds is counted as in flight"
        );
        // Judge the oldest few, so fetching must pause and resume many times.
        for r in held.drain(..held.len().min(3)) {
            c.acknowledge(&r, AckKind::Accept).expect("ack");
            accepted.insert(value(&r));
        }
    }
    c.close(Duration::from_secs(30)).await;
    assert_eq!(peak, 7, "the bound was reached");
    assert_eq!(accepted, ids);
}
