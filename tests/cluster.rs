//! The share engine on the three-node cluster of `dev/kafka up --brokers 3`: partition
//! leadership moves and a broker goes away (SIGTERM or SIGKILL) in the middle of the stream, and
//! nothing is lost. Its own test binary because it stops the cluster's brokers; the scenarios run
//! one at a time.
//!
//! Each scenario produces records with ids in three waves: before the fault, while it lasts (a
//! node down or a partition newly led elsewhere), and after the node is back. A record counts
//! as accepted only when the broker confirmed its Accept (`take_outcomes`), or, for an Accept
//! whose request died with its broker (so the answer never came), when the record never comes
//! back and the broker's own view (ShareGroupCommand lag) shows nothing left. That lag must be
//! zero at the end in any case.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::ResponseError;
use sharehost::kafka::{Compression, KafkaClient, ProduceRecord};
use sharehost::share::consumer::{ShareConsumer, ShareConsumerConfig, ShareRecord};
use sharehost::share::ledger::AckKind;
use sharehost_tests::cluster::{cluster_bootstrap, cluster_client, cluster_harness};
use sharehost_tests::host::PATIENCE;
use sharehost_tests::ledger::Ledger;
use sharehost_tests::{blocking, fresh_group, group_lag_at, init_logging, unique};
use tokio::sync::watch;

/// The scenarios stop brokers the others would be using: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const PARTITIONS: i32 = 3;
/// Records per partition produced before the consumer starts, and again after recovery.
const WAVE: usize = 500;
/// While the fault runs, a producer writes [`ROUND`] records to every partition each
/// [`ROUND_EVERY`] (a steady stream, not a flood), never more than [`BACKLOG`] ahead of what
/// is confirmed.
const ROUND: usize = 10;
const ROUND_EVERY: Duration = Duration::from_millis(100);
const BACKLOG: usize = 600;
/// Records of the partitions the fault hits that get their verdict only after the fault (a
/// slow handler); the rest of them flow on.
const HOLD: usize = 50;

/// What goes wrong mid-stream.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Partition 0's leadership moves to another in-sync replica; every broker stays up.
    MoveLeader,
    /// The node that coordinates the group and leads a partition of the topic is stopped
    /// with this `dev/kafka` command ("stop-broker" = SIGTERM, "kill-broker" = SIGKILL), then
    /// restarted.
    StopCoordinator(&'static str),
}

/// Produces the records `range` of `wave` to partition `p`; ids are `wave-partition-index`.
async fn produce_to(
    client: &KafkaClient,
    topic: &str,
    wave: &str,
    p: i32,
    range: std::ops::Range<usize>,
) -> Vec<String> {
    let ids: Vec<String> = range.map(|i| format!("{wave}-{p}-{i}")).collect();
    let records: Vec<ProduceRecord> = ids
        .iter()
        .map(|id| ProduceRecord {
            value: Some(Bytes::from(id.clone())),
            ..Default::default()
        })
        .collect();
    client
        .produce(topic, p, &records, Compression::Lz4)
        .await
        .unwrap_or_else(|e| panic!("produce {wave} to partition {p}: {e}"));
    ids
}

/// Produces the records `range` of `wave` to every partition.
async fn produce(
    client: &KafkaClient,
    topic: &str,
    wave: &str,
    range: std::ops::Range<usize>,
) -> Vec<String> {
    let mut ids = Vec::new();
    for p in 0..PARTITIONS {
        ids.extend(produce_to(client, topic, wave, p, range.clone()).await);
    }
    ids
}

/// Produces a round to partition `p` each [`ROUND_EVERY`] until `stop` says so, keeping the
/// stream at most [`BACKLOG`] records ahead of the confirmed count, so records flow for exactly
/// as long as the fault lasts; returns the ids. One task per partition, so a partition without
/// a leader for a while does not hold up the others.
fn spawn_stream(
    client: Arc<KafkaClient>,
    topic: String,
    p: i32,
    mut confirmed: watch::Receiver<usize>,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Vec<String>> {
    tokio::spawn(async move {
        let mut ids = Vec::new();
        let start = *confirmed.borrow();
        let mut round = 0;
        let mut every = tokio::time::interval(ROUND_EVERY);
        let partitions = PARTITIONS as usize;
        loop {
            tokio::select! {
                _ = every.tick() => {}
                _ = stop.wait_for(|s| *s) => return ids,
            }
            tokio::select! {
                r = confirmed.wait_for(|c| ids.len() * partitions < c.saturating_sub(start) + BACKLOG) => {
                    if r.is_err() {
                        return ids;
                    }
                }
                _ = stop.wait_for(|s| *s) => return ids,
            }
            if *stop.borrow() {
                return ids;
            }
            let range = round * ROUND..(round + 1) * ROUND;
            ids.extend(produce_to(&client, &topic, "stream", p, range).await);
            round += 1;
        }
    })
}

/// The partitions the fault hits, and its steps, run one after another on a blocking thread
/// while the consumer keeps going: (description, dev/kafka arguments).
fn fault_steps(
    fault: Fault,
    topic: &str,
    client: &KafkaClient,
    coordinator: i32,
) -> (Vec<i32>, Vec<(String, Vec<String>)>) {
    let leader = |p: i32| {
        client
            .leader(topic, p)
            .unwrap_or_else(|| panic!("partition {p} of {topic} has no leader"))
    };
    match fault {
        Fault::MoveLeader => {
            let from = leader(0);
            let to = from % 3 + 1;
            let steps = vec![(
                format!("move the leadership of partition 0 from node {from} to node {to}"),
                vec![
                    "move-leader".into(),
                    topic.into(),
                    "0".into(),
                    to.to_string(),
                ],
            )];
            (vec![0], steps)
        }
        Fault::StopCoordinator(how) => {
            let leads: Vec<i32> = (0..PARTITIONS)
                .filter(|p| leader(*p) == coordinator)
                .collect();
            // Three partitions over three nodes: every node leads one (replica placement
            // rotates), so the coordinator is a partition leader too.
            assert!(
                !leads.is_empty(),
                "node {coordinator} coordinates the group but leads no partition of {topic}"
            );
            let steps = vec![
                (
                    format!(
                        "{how} node {coordinator} (group coordinator, leader of partitions {leads:?})"
                    ),
                    vec![how.into(), coordinator.to_string()],
                ),
                (
                    format!("restart node {coordinator}"),
                    vec!["start-broker".into(), coordinator.to_string()],
                ),
            ];
            (leads, steps)
        }
    }
}

/// Runs `steps` on a blocking thread (the consumer keeps polling meanwhile).
fn spawn_steps(steps: Vec<(String, Vec<String>)>) -> tokio::task::JoinHandle<()> {
    tokio::task::spawn_blocking(move || {
        for (what, args) in steps {
            println!("fault: {what}");
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            cluster_harness(&args);
        }
    })
}

/// Where the scenario stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The first records flow; the fault starts at a quarter of them.
    BeforeFault,
    /// The fault's steps run while a producer keeps records flowing.
    Faulting,
    /// Every step done, the last records produced: drain.
    Draining,
}

async fn scenario(name: &str, fault: Fault) {
    init_logging();
    let _serial = SERIAL.lock().await;
    let bootstrap = cluster_bootstrap();
    let client = Arc::new(cluster_client().await);
    let topic = unique("cluster");
    client
        .create_topic(&topic, PARTITIONS, 3, &[])
        .await
        .expect("create a topic with replication 3");
    let mut produced = produce(&client, &topic, "before", 0..WAVE).await;
    let group = fresh_group(&client, None).await;
    let coordinator = client
        .find_coordinator(&group)
        .await
        .expect("find the group coordinator");
    let mut config = ShareConsumerConfig::new(&group, &[&topic]);
    // Small fetches: many requests in flight around the fault.
    config.max_records = 50;
    config.batch_size = 50;
    let c = ShareConsumer::start(client.clone(), config)
        .await
        .expect("start");

    let mut accepts: Vec<String> = Vec::new();
    // Offsets whose Accept the broker confirmed, to tell a record accepted twice from an id
    // written twice (a produce retried after its answer was lost stores a second copy).
    let mut accepted_offsets: HashSet<(i32, i64)> = HashSet::new();
    let mut accepted_twice = 0usize;
    let mut values: HashMap<(i32, i64), String> = HashMap::new();
    let mut confirmed: HashSet<String> = HashSet::new();
    let (confirmed_tx, confirmed_rx) = watch::channel(0usize);
    let (mut deliveries, mut moot, mut refused) = (0usize, 0usize, 0u64);
    let mut phase = Phase::BeforeFault;
    // The first records of the partitions the fault hits delivered while it runs get their
    // verdict only after it (a slow handler): by then their session or leader is gone.
    let mut affected: Vec<i32> = Vec::new();
    let mut held: Vec<ShareRecord> = Vec::new();
    let mut steps: Option<tokio::task::JoinHandle<()>> = None;
    // The producer tasks during the fault, and what stops them.
    let (stop_streams, stop_rx) = watch::channel(false);
    let mut streams: Vec<tokio::task::JoinHandle<Vec<String>>> = Vec::new();
    // Accepts whose request died with its broker: it may have applied them (then the records
    // never come back) or not (then they are delivered again). Only the broker can settle them.
    let mut in_doubt: HashSet<String> = HashSet::new();
    let mut settled: Vec<String> = Vec::new();
    let mut lag_check: Option<tokio::task::JoinHandle<Vec<i64>>> = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name}: only {} of {} records confirmed in phase {phase:?} ({} accepts in doubt)",
            confirmed.len(),
            produced.len(),
            in_doubt.len()
        );
        if let Some(d) = c
            .poll(Duration::from_millis(200))
            .await
            .expect("poll (the engine must not give up)")
        {
            assert!(d.poison.is_empty(), "no delivery cap is set");
            for r in &d.records {
                deliveries += 1;
                let id = String::from_utf8_lossy(r.record.value.as_deref().unwrap_or_default())
                    .into_owned();
                values.insert((r.partition.partition, r.record.offset), id);
                if phase == Phase::Faulting
                    && held.len() < HOLD
                    && affected.contains(&r.partition.partition)
                {
                    held.push(r.clone());
                    continue;
                }
                if !c.acknowledge(r, AckKind::Accept).expect("ack") {
                    // Its session ended: the broker released it and delivers it again.
                    moot += 1;
                }
            }
        }
        // Only what the broker confirmed counts as accepted.
        for o in c.take_outcomes() {
            if let Some((e, _)) = &o.error {
                refused += o.offsets();
                if *e == ResponseError::NetworkException {
                    for b in &o.batches {
                        for off in b.first_offset..=b.last_offset {
                            if let Some(id) = values.get(&(o.partition, off)) {
                                in_doubt.insert(id.clone());
                            }
                        }
                    }
                }
                continue;
            }
            for b in &o.batches {
                for off in b.first_offset..=b.last_offset {
                    let id = values.get(&(o.partition, off)).unwrap_or_else(|| {
                        panic!(
                            "{name}: offset {off} of partition {} confirmed but never delivered",
                            o.partition
                        )
                    });
                    accepts.push(id.clone());
                    confirmed.insert(id.clone());
                    if !accepted_offsets.insert((o.partition, off)) {
                        accepted_twice += 1;
                    }
                }
            }
        }
        confirmed_tx.send_replace(confirmed.len());
        if steps.as_ref().is_some_and(|h| h.is_finished())
            && let Some(h) = steps.take()
        {
            h.await.expect("the fault's harness steps");
        }
        if lag_check.as_ref().is_some_and(|h| h.is_finished())
            && let Some(h) = lag_check.take()
        {
            let lag = h.await.expect("ShareGroupCommand");
            let open: Vec<String> = produced
                .iter()
                .filter(|id| !confirmed.contains(*id))
                .cloned()
                .collect();
            if lag.len() == PARTITIONS as usize
                && lag.iter().all(|l| *l == 0)
                && open.iter().all(|id| in_doubt.contains(id))
            {
                // Nothing is left at the broker, and it only ever got Accept from us.
                settled = open;
                break;
            }
        }
        match phase {
            Phase::BeforeFault if confirmed.len() >= produced.len() / 4 => {
                client
                    .refresh_metadata(std::slice::from_ref(&topic))
                    .await
                    .expect("metadata");
                streams = (0..PARTITIONS)
                    .map(|p| {
                        let (c, t) = (client.clone(), topic.clone());
                        spawn_stream(c, t, p, confirmed_rx.clone(), stop_rx.clone())
                    })
                    .collect();
                let (hit, fault_steps) = fault_steps(fault, &topic, &client, coordinator);
                affected = hit;
                steps = Some(spawn_steps(fault_steps));
                phase = Phase::Faulting;
            }
            Phase::Faulting if steps.is_none() => {
                for r in held.drain(..) {
                    if !c.acknowledge(&r, AckKind::Accept).expect("ack") {
                        moot += 1;
                    }
                }
                stop_streams.send_replace(true);
                let mut during = Vec::new();
                for h in streams.drain(..) {
                    during.extend(h.await.expect("the producer during the fault"));
                }
                assert!(
                    !during.is_empty(),
                    "{name}: records flowed during the fault"
                );
                println!("{name}: {} records produced during the fault", during.len());
                produced.extend(during);
                produced.extend(produce(&client, &topic, "after", 0..WAVE).await);
                phase = Phase::Draining;
            }
            Phase::Draining if confirmed.len() >= produced.len() => break,
            Phase::Draining
                if lag_check.is_none()
                    && produced
                        .iter()
                        .all(|id| confirmed.contains(id) || in_doubt.contains(id)) =>
            {
                let (b, g) = (bootstrap.clone(), group.clone());
                lag_check = Some(tokio::task::spawn_blocking(move || group_lag_at(&b, &g)));
            }
            _ => {}
        }
    }
    // Every id is confirmed accepted, but records may still come: the second copy of an id a
    // retried produce stored twice, a record whose Accept died with its request. Accept
    // whatever comes until the broker says nothing is left for the group (lag 0 on every
    // partition): then this member holds nothing acquired, and nothing may be left counted
    // in flight.
    let drained_by = tokio::time::Instant::now() + PATIENCE;
    loop {
        while let Some(d) = c.poll(Duration::from_millis(200)).await.expect("poll") {
            for r in &d.records {
                deliveries += 1;
                c.acknowledge(r, AckKind::Accept).expect("ack");
            }
        }
        assert!(
            c.flush(Duration::from_secs(60)).await,
            "{name}: verdicts answered"
        );
        let (b, g) = (bootstrap.clone(), group.clone());
        let lag = blocking(move || group_lag_at(&b, &g)).await;
        if lag.len() == PARTITIONS as usize && lag.iter().all(|l| *l == 0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < drained_by,
            "{name}: the broker still holds records back {PATIENCE:?} after every id was \
             accepted: lag {lag:?}, {} counted in flight",
            c.in_flight()
        );
    }
    let in_flight = c.in_flight();
    let stats = c.stats();
    println!(
        "{name}: deliveries {deliveries}, moot verdicts {moot}, refused ack offsets {refused}, \
         session resets {}, released by the broker {}, assignment changes {}",
        stats.session_resets.load(Ordering::Relaxed),
        stats.released_by_broker.load(Ordering::Relaxed),
        stats.assignment_changes.load(Ordering::Relaxed),
    );
    c.close(Duration::from_secs(30)).await;
    println!(
        "{name}: {} accepts in doubt (their request died with the broker), {} of them never \
         came back and are settled by the broker (lag 0: it applied them)",
        in_doubt.len(),
        settled.len()
    );
    let mut offsets_of: HashMap<&String, usize> = HashMap::new();
    for id in values.values() {
        *offsets_of.entry(id).or_default() += 1;
    }
    println!(
        "{name}: {} ids stored at two offsets by a retried produce (each copy a record of its \
         own), {accepted_twice} offsets confirmed accepted twice",
        offsets_of.values().filter(|n| **n > 1).count()
    );
    let mut ledger = Ledger::new(name, produced);
    for id in accepts.into_iter().chain(settled) {
        ledger.accepted(id);
    }
    ledger.check();
    assert_eq!(
        in_flight, 0,
        "{name}: every delivered record was judged, none is left counted in flight"
    );
    let lag = group_lag_at(&bootstrap, &group);
    assert_eq!(
        lag.len(),
        PARTITIONS as usize,
        "{name}: one row per partition: {lag:?}"
    );
    assert!(
        lag.iter().all(|l| *l == 0),
        "{name}: the broker holds nothing back: lag {lag:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_follows_a_leader_move_and_loses_nothing() {
    scenario("leader move", Fault::MoveLeader).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_coordinator_and_partition_leader_mid_stream_loses_nothing() {
    scenario(
        "coordinator+leader stopped",
        Fault::StopCoordinator("stop-broker"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_coordinator_and_partition_leader_mid_stream_loses_nothing() {
    scenario(
        "coordinator+leader killed",
        Fault::StopCoordinator("kill-broker"),
    )
    .await;
}
