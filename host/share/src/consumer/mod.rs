//! The share consumer: thin I/O loops around the pure state machines. One task heartbeats
//! (membership), one task per partition leader owns a dedicated connection and its share session
//! (ShareFetch with piggybacked acknowledgements, renew requests, the closing request), and the
//! caller polls deliveries and records verdicts from any task.
//!
//! Delivery is at-least-once. Every acquired offset ends in exactly one of: handed to the caller
//! (who gives it a verdict), acknowledged as Gap (no record at that offset), rejected by the
//! delivery cap (and reported as poison), or released by the broker when its session or lock
//! ends (counted in [`ConsumerStats::released_by_broker`]).
//!
//! The rooms, each using only the rooms listed after it (no import circles):
//!
//! - `share_consumer`: [`ShareConsumer`], the caller's API: start, poll, acknowledge, settle, release
//!   holds, flush, close. It starts the tasks below; none of them knows it.
//! - `supervisor`: maps the assignment to partition leaders and keeps one leader task each.
//! - `heartbeat`: the membership task (ShareGroupHeartbeat), which publishes the assignment.
//! - `leader`: one leader's task: its connection, its share session, fetching, acknowledging,
//!   renewing, releasing due holds and closing the session.
//! - `shared`: what the caller and the tasks share: the ledger, the per-leader records held,
//!   the in-flight count, pacing, outcomes.
//! - `outstanding`: the records a leader delivered and has no final verdict for, per partition
//!   in offset order, with what is kept of each (lock time, deliveries, renewals, release time).
//! - `remembered`: final verdicts the broker never applied, kept (bounded) for the records'
//!   next delivery here, so a cut connection does not make the caller judge them twice.
//! - `decisions`: pure decisions with their tests: what a fetch asks for, which acquired offsets
//!   without a record are Gap or released, which partitions a leader serves, what moved.
//! - `count_guard`: the guard that brings a raised count back down however its scope ends.
//! - `types`: the public values: configuration, records, deliveries, verdict decisions and
//!   their results, outcomes, counters, errors.

mod count_guard;
mod decisions;
mod heartbeat;
mod leader;
mod outstanding;
mod remembered;
mod share_consumer;
mod shared;
mod supervisor;
mod types;

pub use decisions::MAX_UNRECORDED_OFFSETS;
pub use share_consumer::ShareConsumer;
pub use types::{
    AckOutcome, AcquireMode, ConsumerStats, Delivery, LOCK_MARGIN, RoundTrip, RoundTrips, Settle,
    Settled, ShareConsumerConfig, ShareError, ShareRecord,
};
