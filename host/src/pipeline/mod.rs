//! The one place where Kafka and Wasm meet: the share engine's records go to plugin instances in
//! batches, verdicts come back, and the pipeline decides what to acknowledge, what to write and
//! what to present again. A batch is judged, its verdicts become a [`plan::Plan`] (a plain
//! value), and one step acts on the plan.
//!
//! The rooms. Those that hold state are types that own it, behind methods (`Versions`,
//! `Rollouts`, `Counters`); [`Pipeline`] holds one of each and makes the changes that touch
//! two (a promoted canary becomes the active version). The steps of a batch (judge, plan, act),
//! the run loop and the status are impl blocks of `Pipeline` or plain functions that go through
//! those methods; only the counters' atomics are read and bumped directly.
//! - `handle`: [`Pipeline`], the handle the host and the admin API hold: the spec, the grants,
//!   the rooms below, its state (starting, running, draining, ...), and the admin operations
//!   (swap, rollback, shadow, canary).
//! - `handler`: what judges a batch: a plugin instance or a trusted [`NativeHandler`].
//! - `versions`: the versions room, `Versions`: the active version, the kept ones for
//!   rollback, and the state file that brings a restart back on the active version; and how a
//!   component is loaded into a version.
//! - `rollouts`: the rollout room, `Rollouts`: the shadow and canary runs of a candidate beside
//!   the active version, and how the last canary ended.
//! - `judge`: one batch to the version that judges it, and what the judging tells the counters.
//! - `plan`: verdicts and emits to a [`plan::Plan`]: what the engine settles now, which outputs
//!   and dead letters are written first. Pure, with tests of its own.
//! - `act`: executes a plan as one `Acting` per batch: outputs and dead letters written side
//!   by side, and each verdict handed to the engine in the one `settle` call of the moment it
//!   became final (with no writes, one call per batch); `release_all`, the one way records go
//!   back unjudged.
//! - `transact`: the exactly-once form of `act`: a batch's outputs, dead letters and settled
//!   record in one Kafka transaction, committed while the batch's locks certainly hold, then
//!   acknowledged; and the lookup of a record delivered again.
//! - `settled`: the settled log of an exactly-once pipeline (a topic per share group) and the
//!   bounded index a host reads it into.
//! - `run_loop`: the run loop: checks before joining, fetching and dispatching batches, the
//!   drain.
//! - `counters`: `Counters`, what the pipeline counts (per version, engine, writes, swap stall,
//!   faults).
//! - `status`: what `GET /pipelines` and `GET /pipelines/NAME/versions` show, read from the
//!   rooms.
//!
//! The bookkeeping locks are `parking_lot`'s, which do not poison: a task that panicked
//! mid-update leaves plain numbers that are still worth more than a second panic.

mod act;
mod counters;
mod handle;
mod handler;
mod judge;
mod plan;
mod rollouts;
mod run_loop;
pub mod settled;
mod status;
mod traced;
mod transact;
mod versions;

use std::sync::Arc;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::kafka::KafkaClient;

pub use handle::Pipeline;
pub use handler::{MAX_ISOLATION_CALLS, NativeHandler};
pub use settled::settled_topic;
pub use sharehost_api::{
    GrantsStatus, PipelineStatus, VersionCounters, VersionInfo, VersionsStatus,
};
pub use versions::{SwapError, plugin_setup, short};

/// Runs every pipeline until `shutdown`, as one host: the first pipeline to fail (or panic)
/// cancels `shutdown`, so the others drain too. Returns the failures, empty when every pipeline
/// drained cleanly.
pub async fn run_all(
    pipelines: &[Arc<Pipeline>],
    client: Arc<KafkaClient>,
    shutdown: CancellationToken,
) -> Vec<String> {
    let mut tasks = JoinSet::new();
    for p in pipelines {
        tasks.spawn(p.clone().run(client.clone(), shutdown.clone()));
    }
    join_failures(tasks, &shutdown).await
}

/// Waits for every pipeline task of `tasks`; the first to fail (or panic) cancels `shutdown`,
/// so the others drain too. Returns the failures, logged.
pub async fn join_failures(
    mut tasks: JoinSet<Result<(), String>>,
    shutdown: &CancellationToken,
) -> Vec<String> {
    let mut failures = Vec::new();
    while let Some(r) = tasks.join_next().await {
        let failure = match r {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => e,
            Err(e) => format!("pipeline task panicked: {e}"),
        };
        tracing::error!("{failure}");
        failures.push(failure);
        shutdown.cancel();
    }
    failures
}
