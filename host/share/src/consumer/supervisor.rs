//! The supervisor task: maps the assignment to partition leaders (the route verdicts follow),
//! tells each leader task what to serve, starts one for a new leader, and reports partitions
//! whose leadership moved so the records held from the old leader leave the in-flight count.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::decisions::moved_away;
use super::leader::leader_loop;
use super::shared::Shared;
use super::types::Delivery;
use crate::ledger::TopicIdPartition;

/// Maps the assignment to partition leaders and keeps one task per leader.
pub(super) async fn fetch_supervisor(
    shared: Arc<Shared>,
    mut assign_rx: watch::Receiver<BTreeSet<TopicIdPartition>>,
    tx: mpsc::Sender<Delivery>,
    stop: CancellationToken,
) {
    let mut leaders: HashMap<i32, watch::Sender<BTreeSet<TopicIdPartition>>> = HashMap::new();
    let mut tasks = JoinSet::new();
    let mut periodic = tokio::time::interval(Duration::from_secs(30));
    periodic.tick().await;
    loop {
        let assignment = assign_rx.borrow_and_update().clone();
        let mut by_leader: BTreeMap<i32, BTreeSet<TopicIdPartition>> = BTreeMap::new();
        let mut unresolved = false;
        for tp in &assignment {
            let leader = shared
                .client
                .topic_name(tp.topic_id)
                .and_then(|n| shared.client.leader(&n, tp.partition));
            match leader {
                Some(l) => {
                    by_leader.entry(l).or_default().insert(*tp);
                }
                None => unresolved = true,
            }
        }
        shared
            .active_leaders
            .store(by_leader.len().max(1), Ordering::Relaxed);
        if unresolved {
            // An id we cannot name (a topic created after our metadata) or a leaderless
            // partition: refresh, and look again shortly.
            let _ = shared.client.refresh_metadata(&shared.config.topics).await;
        }
        let moved = {
            let mut route = shared.route.lock();
            let moved = moved_away(&route, &by_leader);
            for (l, set) in &by_leader {
                for tp in set {
                    route.insert(*tp, *l);
                }
            }
            moved
        };
        for (old, partitions) in &moved {
            shared.partitions_moved(*old, partitions);
        }
        for (leader, set) in &by_leader {
            match leaders.get(leader) {
                Some(w) => {
                    w.send_replace(set.clone());
                }
                None => {
                    let (w, r) = watch::channel(set.clone());
                    leaders.insert(*leader, w);
                    tasks.spawn(leader_loop(
                        shared.clone(),
                        *leader,
                        r,
                        tx.clone(),
                        stop.clone(),
                    ));
                }
            }
        }
        for (leader, w) in &leaders {
            if !by_leader.contains_key(leader) {
                w.send_replace(BTreeSet::new());
            }
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            r = assign_rx.changed() => if r.is_err() { break },
            _ = shared.remap.notified() => {
                let _ = shared.client.refresh_metadata(&shared.config.topics).await;
            }
            _ = periodic.tick() => {
                let _ = shared.client.refresh_metadata(&shared.config.topics).await;
            }
            _ = tokio::time::sleep(Duration::from_millis(250)), if unresolved => {}
        }
    }
    while tasks.join_next().await.is_some() {}
}
