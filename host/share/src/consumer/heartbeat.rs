//! The membership task: heartbeats the group coordinator on the [`Membership`] state machine's
//! schedule, finds the coordinator again when it moves, publishes each new assignment to the
//! supervisor, and leaves the group when the caller closes the consumer.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use sharehost_kafka::backoff::{Backoff, BackoffConfig};
use sharehost_kafka::{BrokerConnection, ErrorClass};

use super::shared::Shared;
use crate::ledger::TopicIdPartition;
use crate::membership::{HeartbeatAction, MemberState, Membership};

/// Runs one member's heartbeats until it has left (or the group refused it for good), so the
/// member stays in the group and its assignment reaches the supervisor through `assign_tx`
/// (an empty one once it has left).
pub(super) async fn heartbeat_loop(
    shared: Arc<Shared>,
    mut membership: Membership,
    assign_tx: watch::Sender<BTreeSet<TopicIdPartition>>,
    leave: CancellationToken,
) {
    let client = &shared.client;
    let mut backoff = Backoff::new(BackoffConfig::default());
    let mut coordinator: Option<Arc<BrokerConnection>> = None;
    loop {
        if leave.is_cancelled() {
            membership.leave();
        }
        let Some(req) = membership.heartbeat() else {
            break;
        };
        let conn = match &coordinator {
            Some(c) if !c.is_dead() => c.clone(),
            _ => match async {
                client
                    .connection(client.find_coordinator(membership.group()).await?)
                    .await
            }
            .await
            {
                Ok(c) => {
                    coordinator = Some(c.clone());
                    c
                }
                Err(e) if e.class() == ErrorClass::Fatal => {
                    shared.set_fatal(format!(
                        "group {}: cannot reach the coordinator: {e}",
                        membership.group()
                    ));
                    break;
                }
                Err(e) => {
                    tracing::warn!(group = membership.group(), "finding the coordinator: {e}");
                    if leave.is_cancelled() || !backoff.wait().await {
                        break;
                    }
                    continue;
                }
            },
        };
        let sent = tokio::time::Instant::now();
        let action = match conn.send(&req).await {
            Ok(resp) => {
                match kafka_protocol::ResponseError::try_from_code(resp.error_code) {
                    None if resp.member_epoch > 0 => shared.liveness.lock().ok_sent = Some(sent),
                    Some(
                        kafka_protocol::ResponseError::UnknownMemberId
                        | kafka_protocol::ResponseError::FencedMemberEpoch,
                    ) => {
                        tracing::warn!(
                            group = membership.group(),
                            "this member was fenced (removed from the group): the records it held were released; it rejoins"
                        );
                        shared.liveness.lock().fenced_at = Some(tokio::time::Instant::now());
                    }
                    _ => {}
                }
                membership.on_response(&resp)
            }
            Err(e) => {
                tracing::warn!(group = membership.group(), "heartbeat failed: {e}");
                membership.on_transport_error()
            }
        };
        if *assign_tx.borrow() != *membership.assignment() {
            shared
                .stats
                .assignment_changes
                .fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                group = membership.group(),
                partitions = membership.assignment().len(),
                "assignment changed"
            );
            let _ = assign_tx.send(membership.assignment().clone());
        }
        shared.joined.store(
            matches!(action, HeartbeatAction::Wait(_)) && membership.epoch() > 0,
            Ordering::Relaxed,
        );
        if let MemberState::Fatal(why) = membership.state() {
            shared.set_fatal(why.clone());
            break;
        }
        match action {
            HeartbeatAction::Stop => break,
            HeartbeatAction::Now => backoff.reset(),
            HeartbeatAction::Wait(d) => {
                backoff.reset();
                tokio::select! {
                    _ = tokio::time::sleep(d) => {}
                    _ = leave.cancelled() => {}
                }
            }
            HeartbeatAction::Backoff => {
                backoff.wait().await;
            }
            HeartbeatAction::RefindCoordinator => {
                coordinator = None;
                backoff.wait().await;
            }
        }
    }
    shared.joined.store(false, Ordering::Relaxed);
    let _ = assign_tx.send(BTreeSet::new());
}
