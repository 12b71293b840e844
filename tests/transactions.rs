//! The transactional producer and the settled log's index against the real broker: what a
//! `read_committed` reader sees of committed, aborted and open transactions, how a new holder
//! of a transactional id fences the old one, and that a lookup answers only once every
//! transaction that could hold a record is decided.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sharehost::kafka::{Compression, KafkaClient, ProduceRecord, TransactionalProducer, TxnError};
use sharehost::pipeline::settled::{SettledIndex, settled_records};
use sharehost::share::ledger::AckKind;
use sharehost_tests::{client, committed_records, topic_records, unique};

fn records(values: &[&str]) -> Vec<ProduceRecord> {
    values
        .iter()
        .map(|v| ProduceRecord {
            value: Some(Bytes::from(v.to_string())),
            ..Default::default()
        })
        .collect()
}

async fn values(client: &KafkaClient, topic: &str, committed: bool) -> Vec<String> {
    let rs = if committed {
        committed_records(client, topic, 2).await
    } else {
        topic_records(client, topic, 2).await
    };
    let mut v: Vec<String> = rs
        .iter()
        .map(|(_, r)| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
        .collect();
    v.sort();
    v
}

async fn topic(client: &KafkaClient) -> String {
    let t = unique("txn");
    client.create_topic(&t, 2, 1, &[]).await.expect("create");
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_transaction_is_read_whole_and_an_aborted_one_never() {
    let client = Arc::new(client().await);
    let t = topic(&client).await;
    let p = TransactionalProducer::new(client.clone(), &unique("tid"), Duration::from_secs(30));
    let mut txn = p.begin().await.expect("begin");
    txn.send(&t, 0, &records(&["a0", "a1"]), Compression::Lz4)
        .await
        .expect("send");
    txn.send(&t, 1, &records(&["a2"]), Compression::Lz4)
        .await
        .expect("send");
    txn.commit().await.expect("commit");
    let mut txn = p.begin().await.expect("begin");
    txn.send(&t, 0, &records(&["b0"]), Compression::Lz4)
        .await
        .expect("send");
    txn.send(&t, 1, &records(&["b1"]), Compression::Lz4)
        .await
        .expect("send");
    txn.abort().await.expect("abort");
    // The next transaction of the same producer (a new epoch after the abort) commits.
    let mut txn = p.begin().await.expect("begin");
    txn.send(&t, 1, &records(&["c0"]), Compression::Lz4)
        .await
        .expect("send");
    txn.commit().await.expect("commit");
    assert_eq!(values(&client, &t, true).await, ["a0", "a1", "a2", "c0"]);
    // The aborted records are in the log all the same: only a committed reader skips them.
    assert_eq!(
        values(&client, &t, false).await,
        ["a0", "a1", "a2", "b0", "b1", "c0"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_holder_of_the_id_fences_the_old_one_and_aborts_what_it_left_open() {
    let client = Arc::new(client().await);
    let t = topic(&client).await;
    let id = unique("tid");
    let old = TransactionalProducer::new(client.clone(), &id, Duration::from_secs(30));
    let mut open = old.begin().await.expect("begin");
    open.send(&t, 0, &records(&["left-open"]), Compression::Lz4)
        .await
        .expect("send");
    // A restarted host with the same id: its InitProducerId aborts the open transaction.
    let new = TransactionalProducer::new(client.clone(), &id, Duration::from_secs(30));
    let mut txn = new.begin().await.expect("begin");
    txn.send(&t, 1, &records(&["new"]), Compression::Lz4)
        .await
        .expect("send");
    txn.commit().await.expect("commit");
    match open.commit().await {
        Err(TxnError::Fenced { .. }) => {}
        other => panic!("the old producer's commit must be refused as fenced: {other:?}"),
    }
    assert_eq!(values(&client, &t, true).await, ["new"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_finds_what_committed_transactions_settled_and_waits_for_an_open_one() {
    let client = Arc::new(client().await);
    let source = unique("source");
    client
        .create_topic(&source, 1, 1, &[])
        .await
        .expect("create");
    let log = unique("settled");
    client.create_topic(&log, 1, 1, &[]).await.expect("create");
    let settled = |offset: i64, kind: AckKind| {
        settled_records(&[(source.as_str(), 0, offset, kind)])
            .iter()
            .map(|r| r.produce())
            .collect::<Vec<_>>()
    };
    let p = TransactionalProducer::new(client.clone(), &unique("tid"), Duration::from_secs(30));
    // Committed: offset 5 accepted. Aborted: offset 6. Open while the lookup runs: offset 7.
    let mut txn = p.begin().await.expect("begin");
    txn.send(&log, 0, &settled(5, AckKind::Accept), Compression::Lz4)
        .await
        .expect("send");
    txn.commit().await.expect("commit");
    let mut txn = p.begin().await.expect("begin");
    txn.send(&log, 0, &settled(6, AckKind::Accept), Compression::Lz4)
        .await
        .expect("send");
    txn.abort().await.expect("abort");
    let mut open = p.begin().await.expect("begin");
    open.send(&log, 0, &settled(7, AckKind::Reject), Compression::Lz4)
        .await
        .expect("send");
    let index = Arc::new(SettledIndex::new(
        &log,
        &unique("group"),
        std::slice::from_ref(&source),
        Duration::from_secs(60),
    ));
    let lookup = {
        let (index, client, source) = (index.clone(), client.clone(), source.clone());
        tokio::spawn(async move {
            index
                .lookup(
                    &client,
                    &[(&source, 0, 5), (&source, 0, 6), (&source, 0, 7)],
                )
                .await
        })
    };
    // The open transaction holds the last stable offset back: the lookup cannot answer for
    // offset 7 before it is decided, whichever way; committed, it is found.
    open.commit().await.expect("commit");
    let found = lookup.await.expect("join").expect("lookup");
    assert_eq!(
        found,
        vec![Some(AckKind::Accept), None, Some(AckKind::Reject)]
    );
    assert_eq!(index.verdicts_held().await, 2);
}
