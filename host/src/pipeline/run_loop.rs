//! The run loop of a pipeline: what it checks before it joins (the topics it writes, the group's
//! delivery limit, the broker's dead-letter setup, the member id kept across restarts), then
//! fetching and handing batches to judging, and the drain that judges what it holds before it
//! releases the rest.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::act::{BatchContext, release_all};
use super::handle::Pipeline;
use super::plan::{Rules, plan};
use crate::kafka::KafkaClient;
use crate::kafka::records::Header;
use crate::metrics::Metrics;
use crate::persisted::{MemberChoice, MemberIdentity, MemberName, MemberNameError};
use crate::runtime::{Emit, Header as RuntimeHeader, Record, Verdict};
use crate::share::consumer::{
    AcquireMode, RoundTrip, RoundTrips, ShareConsumer, ShareConsumerConfig, ShareRecord,
};
use crate::share::membership::fresh_member_id;

/// How long running batches may take to finish once shutdown starts.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a drain goes on judging the records it holds before it releases the rest: within
/// a 30 s grace period (Kubernetes' default), with time left to flush and close.
const DRAIN_JUDGING: Duration = Duration::from_secs(20);
/// A pipeline acquires no more records than its plugin judges in this long (at its measured
/// rate), so a drain judges what it holds within [`DRAIN_JUDGING`] and a crash hands little
/// back. Half the lock duration when that is shorter.
const PACE_WITHIN: Duration = Duration::from_secs(10);
/// How often a pipeline asks the group coordinator for its share group's lag.
const LAG_INTERVAL: Duration = Duration::from_secs(10);

/// Keeps the engine's request latencies (`sharehost_request_seconds`) for one pipeline.
struct RequestTimes {
    metrics: Arc<Metrics>,
    pipeline: String,
}

impl RoundTrips for RequestTimes {
    fn took(&self, kind: RoundTrip, took: Duration) {
        let request = match kind {
            RoundTrip::Fetch => "fetch",
            RoundTrip::Acknowledge => "acknowledge",
        };
        self.metrics
            .request_seconds
            .get_or_create(&vec![
                ("pipeline", self.pipeline.clone()),
                ("request", request.to_owned()),
            ])
            .observe(took.as_secs_f64());
    }
}

/// Aborts a spawned task when dropped: a helper task lives exactly as long as its run.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Pipeline {
    /// One run of the pipeline (see [`Pipeline::run`]).
    pub(super) async fn serve(
        self: Arc<Self>,
        client: Arc<KafkaClient>,
        shutdown: CancellationToken,
    ) -> Result<(), String> {
        self.topics_exist(&client).await?;
        let delivery_limit = self.delivery_limit(&client).await?;
        self.broker_dead_letters(&client).await?;
        self.start_position(&client).await?;
        let settled = self.settled_log(&client).await?;
        let spec = &self.spec;
        let mut cfg = ShareConsumerConfig::new(
            &spec.group,
            &spec.topics.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        cfg.max_in_flight = spec.max_in_flight;
        cfg.max_records = i32::try_from(spec.max_in_flight.min(10_000)).unwrap_or(500);
        cfg.batch_size = i32::try_from(spec.batch_size).unwrap_or(500);
        cfg.delivery_count_limit = spec.delivery_cap;
        cfg.archive_at = delivery_limit;
        // With a dead-letter topic, capped records come to us still acquired, so they can be
        // dead-lettered before their Reject goes out.
        cfg.reject_poison = spec.dead_letter_topic.is_none();
        cfg.auto_renew_after = Some(spec.auto_renew_after);
        cfg.pace_within = Some(PACE_WITHIN);
        cfg.member_session_timeout = settled.as_ref().map(|(_, _, session)| *session);
        // Whole producer batches while the room holds the largest one seen (a batch the broker
        // splits costs it a lock timer per record), at most MaxRecords per request otherwise:
        // `max_in_flight` holds unless a batch larger than any seen before arrives.
        cfg.acquire_mode = AcquireMode::Fitted;
        cfg.min_in_flight = spec.batch_size.saturating_mul(spec.concurrency);
        // Held (locked) for as long as the pipeline runs: see `MemberIdentity`. A name that
        // cannot be used fails the run (retried): joining under a random id instead would
        // quietly bring back the session-timeout wait the name is there to avoid.
        let identity = self
            .member_identity()
            .map_err(|e| format!("pipeline {}: {e}", spec.name))?;
        cfg.member_id = identity.as_ref().map(|i| i.id().to_owned());
        cfg.observer = Some(Arc::new(RequestTimes {
            metrics: self.metrics.clone(),
            pipeline: spec.name.clone(),
        }));
        let consumer = Arc::new(
            ShareConsumer::start(client.clone(), cfg)
                .await
                .map_err(|e| format!("pipeline {}: {e}", spec.name))?,
        );
        let exactly_once = settled.map(|(topic, lock, _)| {
            let eo = super::transact::exactly_once(
                &client,
                &consumer,
                &spec.group,
                &spec.topics,
                consumer.member_id(),
                &topic,
                lock,
            );
            tracing::info!(pipeline = %spec.name, settled_log = %topic, transactional_id = eo.producer.id(), "exactly-once: each batch's writes commit in one transaction with what it settles");
            Arc::new(eo)
        });
        self.set_state("running");
        *self.last_error.lock() = None;
        tracing::info!(pipeline = %spec.name, group = %spec.group, topics = ?spec.topics, member = consumer.member_id(), "pipeline running");
        let permits = Arc::new(Semaphore::new(spec.concurrency));
        let mut running = JoinSet::new();
        // Records acquired (or renewed: the engine delivers those again) and not yet judged.
        let mut backlog: VecDeque<ShareRecord> = VecDeque::new();
        let mut failure = None;
        let ctx = BatchContext {
            consumer: consumer.clone(),
            client: client.clone(),
            stop: shutdown.clone(),
            exactly_once,
        };
        let lag_watch = {
            let (this, client, stop) = (self.clone(), client.clone(), shutdown.clone());
            tokio::spawn(async move { this.watch_lag(&client, &stop).await })
        };
        let _lag_watch = AbortOnDrop(lag_watch);
        loop {
            if backlog.is_empty() {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    r = consumer.poll(Duration::from_millis(500)) => match r {
                        Ok(Some(d)) => {
                            if !d.poison.is_empty() {
                                let (this, ctx) = (self.clone(), ctx.clone());
                                running.spawn(async move { this.handle_poison(&ctx, d.poison).await });
                            }
                            // The backlog is empty here: it takes the delivery's own vector
                            // rather than a copy of its records.
                            backlog = VecDeque::from(d.records);
                        }
                        Ok(None) => {}
                        Err(e) => {
                            failure = Some(format!("pipeline {}: {e}", spec.name));
                            break;
                        }
                    },
                }
            }
            self.publish_engine_stats(&consumer);
            while let Some(Ok(())) = running.try_join_next() {}
            if backlog.is_empty() {
                continue;
            }
            let permit = tokio::select! {
                _ = shutdown.cancelled() => break,
                p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            };
            self.start_batch(&ctx, &mut backlog, permit, &mut running);
        }
        // Drain: no more records are acquired; what is held is judged while time allows (the
        // engine acquires only what the plugin judges within `PACE_WITHIN`, so usually all of
        // it), and only what is left then is released: each release spends a delivery.
        self.set_state("draining");
        consumer.stop_acquiring();
        tracing::info!(pipeline = %spec.name, running = running.len(), unjudged = backlog.len(), "draining");
        let drain_started = Instant::now();
        if failure.is_none() {
            let judge_until = tokio::time::Instant::now() + DRAIN_JUDGING;
            loop {
                // Deliveries already acquired (or renewed) and queued in the engine.
                while let Ok(Some(d)) = consumer.poll(Duration::ZERO).await {
                    if !d.poison.is_empty() {
                        let (this, ctx) = (self.clone(), ctx.clone());
                        running.spawn(async move { this.handle_poison(&ctx, d.poison).await });
                    }
                    backlog.extend(d.records);
                }
                if backlog.is_empty() {
                    if running.is_empty() {
                        break;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep_until(judge_until) => break,
                        _ = running.join_next() => {}
                    }
                    continue;
                }
                let permit = tokio::select! {
                    _ = tokio::time::sleep_until(judge_until) => break,
                    p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
                };
                self.start_batch(&ctx, &mut backlog, permit, &mut running);
            }
        }
        if !backlog.is_empty() {
            tracing::warn!(pipeline = %spec.name, records = backlog.len(), "not judged before the drain's end: released");
        }
        release_all(&consumer, &backlog);
        backlog.clear();
        let left = DRAIN_TIMEOUT.saturating_sub(drain_started.elapsed());
        if tokio::time::timeout(left, async { while running.join_next().await.is_some() {} })
            .await
            .is_err()
        {
            tracing::warn!(pipeline = %spec.name, "batches still running after {DRAIN_TIMEOUT:?}; their records are released");
            running.abort_all();
        }
        // Renewed records delivered again after the judging ended go back unjudged.
        while let Ok(Some(d)) = consumer.poll(Duration::ZERO).await {
            release_all(&consumer, &d.records);
        }
        // Held records are released now, not at their due time: their delay was a plugin's
        // wish, and the next member honours it no less than a redelivery does.
        consumer.release_holds();
        if !consumer.flush(Duration::from_secs(30)).await {
            tracing::warn!(pipeline = %spec.name, "not every verdict was confirmed before close");
        }
        consumer.close(Duration::from_secs(30)).await;
        self.publish_engine_stats(&consumer);
        self.set_state(if failure.is_some() {
            "failed"
        } else {
            "stopped"
        });
        drop(identity);
        tracing::info!(pipeline = %spec.name, "pipeline stopped");
        match failure {
            Some(f) => Err(f),
            None => Ok(()),
        }
    }

    /// Checks that the topics the pipeline writes to exist before it acquires anything: a
    /// record it could never write would only be held. Names the manifest key of each that
    /// is missing; the host runs the pipeline again (with backoff) until they exist.
    async fn topics_exist(&self, client: &KafkaClient) -> Result<(), String> {
        let spec = &self.spec;
        let mut needed: Vec<(String, &String)> = spec
            .outputs
            .iter()
            .map(|(name, topic)| (format!("pipeline.outputs.{name}"), topic))
            .collect();
        if let Some(dlq) = &spec.dead_letter_topic {
            needed.push(("dead_letter_topic".to_owned(), dlq));
        }
        if needed.is_empty() {
            return Ok(());
        }
        let topics: Vec<String> = needed.iter().map(|(_, t)| (*t).clone()).collect();
        client
            .refresh_metadata(&topics)
            .await
            .map_err(|e| format!("pipeline {}: {e}", spec.name))?;
        let missing: Vec<String> = needed
            .iter()
            .filter(|(_, t)| client.topic(t).is_none())
            .map(|(key, t)| format!("{key} names topic {t:?}, which does not exist"))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(format!(
            "pipeline {}: {}; it waits for them before it acquires a record (create them)",
            spec.name,
            missing.join("; ")
        ))
    }

    /// Checks `delivery_cap` against the group's delivery limit (`share.delivery.count.limit`,
    /// the group's own or the broker's): above it, the broker archives a record at its last
    /// delivery before the host's cap is ever reached, without a dead letter.
    /// Sets up, or notices, the group's broker-side dead-letter topic (KIP-1191, `share.version`
    /// 2 and up), which receives what the broker archives at the delivery limit: records whose
    /// last delivery the host never finished (it crashed, was killed, or lost the broker), and
    /// with it the Rejects. With `broker_dead_letter_topic` the host configures it (topic and
    /// group configs), after checking what the broker would otherwise refuse at write time,
    /// silently; without, a group configured so by someone else is noticed. Either way the
    /// host's own dead letters are then acknowledged as done (see [`Pipeline::reject`]).
    async fn broker_dead_letters(&self, client: &KafkaClient) -> Result<(), String> {
        let spec = &self.spec;
        let level = client.feature_level("share.version").await;
        let Some(topic) = &spec.broker_dead_letter_topic else {
            // Only noticed, so a broker that will not say is taken for one without it.
            let level = level.ok().flatten().unwrap_or(0);
            let configured = client
                .group_config(&spec.group, "errors.deadletterqueue.topic.name")
                .await
                .ok()
                .flatten()
                .filter(|t| !t.trim().is_empty());
            let active = level >= 2 && configured.is_some();
            if active {
                tracing::info!(pipeline = %spec.name, group = %spec.group, topic = ?configured, "the group has a broker dead-letter topic: records the host dead-letters itself are acknowledged as done, so the broker writes no second copy");
            }
            self.broker_dlq.store(active, Ordering::Relaxed);
            return Ok(());
        };
        let fail = |why: String| {
            format!(
                "pipeline {}: broker_dead_letter_topic {topic}: {why}",
                spec.name
            )
        };
        let level = level
            .map_err(|e| fail(format!("cannot read the cluster's share.version: {e}")))?
            .unwrap_or(0);
        if level < 2 {
            return Err(fail(format!(
                "the cluster's share.version is {level}; broker dead-letter topics need share.version 2 (Kafka 4.4: kafka-features upgrade --feature share.version=2)"
            )));
        }
        let prefix = client
            .broker_config("errors.deadletterqueue.topic.name.prefix")
            .await
            .map_err(|e| fail(format!("cannot read the broker's dead-letter prefix: {e}")))?
            .unwrap_or_default();
        if !topic.starts_with(&prefix) {
            return Err(fail(format!(
                "the broker takes only dead-letter topics whose name starts with \"{prefix}\" (errors.deadletterqueue.topic.name.prefix) and would archive without writing"
            )));
        }
        client
            .alter_topic_configs(
                topic,
                &[("errors.deadletterqueue.group.enable", Some("true"))],
            )
            .await
            .map_err(|e| {
                fail(format!(
                    "cannot enable it as a group dead-letter topic: {e}"
                ))
            })?;
        client
            .alter_group_configs(
                &spec.group,
                &[
                    ("errors.deadletterqueue.topic.name", topic.as_str()),
                    ("errors.deadletterqueue.copy.record.enable", "true"),
                ],
            )
            .await
            .map_err(|e| fail(format!("cannot set it on group {}: {e}", spec.group)))?;
        tracing::info!(pipeline = %spec.name, group = %spec.group, %topic, "the broker dead-letters what it archives at the delivery limit into the broker dead-letter topic");
        self.broker_dlq.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// For an exactly-once pipeline: the settled log's topic (created with its configs, or
    /// refused naming the one that is wrong), the group set to read committed records only (so
    /// a pipeline reading another's outputs never sees an aborted one), and the lock duration
    /// the transactions are timed by, and the member session timeout the renewals are proven
    /// with. `None` for an at-least-once pipeline.
    async fn settled_log(
        &self,
        client: &KafkaClient,
    ) -> Result<Option<(String, Duration, Duration)>, String> {
        let spec = &self.spec;
        if spec.guarantee != crate::manifest::Guarantee::ExactlyOnce {
            return Ok(None);
        }
        let fail = |m: String| format!("pipeline {}: guarantee = \"exactly-once\": {m}", spec.name);
        let topic = super::settled_topic(&spec.group).ok_or_else(|| {
            fail(format!(
                "group {:?} cannot name the settled log's topic",
                spec.group
            ))
        })?;
        let retention = super::settled::SETTLED_RETENTION.as_millis().to_string();
        match client
            .create_topic(
                &topic,
                1,
                -1,
                &[("cleanup.policy", "delete"), ("retention.ms", &retention)],
            )
            .await
        {
            Ok(_) => {
                tracing::info!(pipeline = %spec.name, %topic, "created the settled log's topic");
            }
            Err(e) if crate::kafka::client::is_topic_exists(&e) => {
                let policy = client
                    .topic_config(&topic, "cleanup.policy")
                    .await
                    .map_err(|e| fail(format!("cannot read {topic}'s cleanup.policy: {e}")))?;
                if policy.as_deref() != Some("delete") {
                    return Err(fail(format!(
                        "topic {topic} has cleanup.policy {policy:?}; the settled log needs \"delete\" (compaction would drop what a transaction settled)"
                    )));
                }
            }
            Err(e) => return Err(fail(format!("cannot create topic {topic}: {e}"))),
        }
        const ISOLATION: &str = "share.isolation.level";
        let now = client
            .group_config(&spec.group, ISOLATION)
            .await
            .ok()
            .flatten();
        if now.as_deref() != Some("read_committed") {
            client
                .alter_group_configs(&spec.group, &[(ISOLATION, "read_committed")])
                .await
                .map_err(|e| {
                    fail(format!(
                        "cannot set group {}'s {ISOLATION} to read_committed: {e}",
                        spec.group
                    ))
                })?;
        }
        let lock = group_ms(
            client,
            &spec.group,
            "share.record.lock.duration.ms",
            Duration::from_secs(30),
        )
        .await;
        // A batch joins a transaction only with more than two margins left on its locks (the
        // writes' and the commit's round trips): a lock of three margins leaves one to judge in.
        let least = crate::share::consumer::LOCK_MARGIN * 3;
        if lock < least {
            return Err(fail(format!(
                "group {}'s share.record.lock.duration.ms is {} ms; exactly-once needs at least {} ms (a batch commits only with more than {} ms left on its records' locks, so shorter locks would send every record back until its delivery cap)",
                spec.group,
                lock.as_millis(),
                least.as_millis(),
                (crate::share::consumer::LOCK_MARGIN * 2).as_millis(),
            )));
        }
        // How long the group keeps a member whose heartbeats stop: a renewal confirms a hold
        // only while the membership provably lasts (the broker releases a removed member's
        // records). Kafka's default when the group will not say.
        let session = group_ms(
            client,
            &spec.group,
            "share.session.timeout.ms",
            Duration::from_secs(45),
        )
        .await;
        Ok(Some((topic, lock, session)))
    }

    /// Sets the group's `share.auto.offset.reset` to the manifest's `start` before the join
    /// (the broker reads it when it first initialises a partition's share state), or only
    /// reads it when the manifest leaves it out; either way it is shown in `/pipelines`. A
    /// group that has read a partition keeps its place there: moving it is a reset of the
    /// group's offsets (docs/operations.md).
    async fn start_position(&self, client: &KafkaClient) -> Result<(), String> {
        const KEY: &str = "share.auto.offset.reset";
        let spec = &self.spec;
        let now = client.group_config(&spec.group, KEY).await;
        let Some(start) = &spec.start else {
            *self.start.lock() = now.ok().flatten();
            return Ok(());
        };
        let want = start.config_value();
        if now.as_ref().ok().and_then(|v| v.as_deref()) != Some(want.as_str()) {
            client
                .alter_group_configs(&spec.group, &[(KEY, &want)])
                .await
                .map_err(|e| {
                    format!(
                        "pipeline {}: start: cannot set group {}'s {KEY} to {want}: {e}",
                        spec.name, spec.group
                    )
                })?;
            tracing::info!(pipeline = %spec.name, group = %spec.group, was = ?now.ok().flatten(), start = %want, "the group starts on partitions it has not read yet at the manifest's start position");
        }
        *self.start.lock() = Some(want);
        Ok(())
    }

    /// The group's effective delivery limit (`None` when the broker would not say), checked
    /// against `delivery_cap`: a cap above it is refused, since the broker would archive a
    /// record before the cap saw it.
    async fn delivery_limit(&self, client: &KafkaClient) -> Result<Option<i16>, String> {
        let spec = &self.spec;
        let limit = match client
            .group_config(&spec.group, "share.delivery.count.limit")
            .await
        {
            Ok(v) => v.and_then(|v| v.parse::<i16>().ok()),
            Err(e) => {
                tracing::warn!(pipeline = %spec.name, group = %spec.group, "cannot read the group's delivery limit (to check delivery_cap against it and count what the broker archives): {e}");
                None
            }
        };
        match (spec.delivery_cap, limit) {
            (Some(cap), Some(limit)) if cap > limit => Err(format!(
                "pipeline {}: delivery_cap {cap} is above group {}'s delivery limit {limit} (share.delivery.count.limit): the broker would archive a record at its delivery {limit}, before the cap, without a dead letter; set delivery_cap to at most {limit}",
                spec.name, spec.group
            )),
            _ => Ok(limit),
        }
    }

    /// The member id this pipeline joins with (`persisted::choose_member`): the one kept
    /// beside its state file from an earlier run, claimed for this process; else the one
    /// derived from the host's name (`SHAREHOST_MEMBER_NAME`), so that a replaced pod whose
    /// state directory is new rejoins as the member it was; else a fresh one, kept for the next
    /// restart. `None` (join with a fresh id, kept nowhere) when another live process holds it
    /// or, without a name, when the state file cannot be used. An invalid name is an error.
    fn member_identity(&self) -> Result<Option<MemberIdentity>, MemberNameError> {
        let name = MemberName::from_env()?;
        let spec = &self.spec;
        let choice = crate::persisted::choose_member(
            self.versions.state_file(),
            name.as_ref(),
            &spec.name,
            &spec.group,
            fresh_member_id,
        );
        let host = name.as_ref().map(MemberName::as_str);
        match &choice {
            MemberChoice::Kept { identity, reused } => {
                if *reused {
                    tracing::info!(pipeline = %spec.name, member = identity.id(), name = host, "rejoining the group as the member this pipeline was before the restart");
                } else if let Some(host) = host {
                    tracing::info!(pipeline = %spec.name, member = identity.id(), name = host, "joining the group as the member derived from this host's name");
                }
            }
            MemberChoice::Named { identity, unusable } => {
                if let Some(e) = unusable {
                    tracing::warn!(pipeline = %spec.name, "cannot keep the member id in the state directory: {e}");
                }
                tracing::info!(pipeline = %spec.name, member = identity.id(), name = host, "joining the group as the member derived from this host's name");
            }
            MemberChoice::Taken { file } => {
                if let Some(host) = host {
                    tracing::warn!(pipeline = %spec.name, name = host, file = %file.display(), "another live process on this state directory runs this pipeline under the same name: joining as a new member (give every host a name of its own)");
                } else {
                    tracing::info!(pipeline = %spec.name, file = %file.display(), "another live process runs this pipeline with its kept member id: joining as a new member");
                }
            }
            MemberChoice::Fresh {
                unusable: Some((file, e)),
            } => {
                tracing::warn!(pipeline = %spec.name, file = %file.display(), "cannot keep the member id across restarts: {e}");
            }
            MemberChoice::Fresh { unusable: None } => {}
        }
        Ok(choice.into_identity())
    }

    /// Hands the next batch of `backlog` to a plugin instance, on a task of `running`.
    fn start_batch(
        self: &Arc<Self>,
        ctx: &BatchContext,
        backlog: &mut VecDeque<ShareRecord>,
        permit: OwnedSemaphorePermit,
        running: &mut JoinSet<()>,
    ) {
        let take = backlog.len().min(self.spec.batch_size);
        let mut batch: Vec<ShareRecord> = backlog.drain(..take).collect();
        // Records whose session died while they waited (a lost connection, a restarted
        // broker) are back with the broker already: judging them would only make duplicates.
        let stale = ctx.consumer.retain_held(&mut batch);
        if stale > 0 {
            tracing::debug!(pipeline = %self.spec.name, records = stale, "skipped records released with their share session");
        }
        if batch.is_empty() {
            return;
        }
        let (this, ctx) = (self.clone(), ctx.clone());
        // Boxed: a batch's future is about 9 KiB, and a task moves its future into its cell
        // and its output out of it, each a copy of the whole; boxed, those copy a pointer.
        running.spawn(Box::pin(async move {
            this.judge_and_act(&ctx, batch, permit).await
        }));
    }

    /// One batch: judged, planned, acted on. `permit` (one of the pipeline's `concurrency`) is
    /// held while the batch is judged and its writes first tried.
    async fn judge_and_act(
        &self,
        ctx: &BatchContext,
        batch: Vec<ShareRecord>,
        permit: OwnedSemaphorePermit,
    ) {
        // Exactly-once: what a committed transaction settled before is acknowledged as then.
        let batch = match &ctx.exactly_once {
            Some(eo) => self.settled_earlier(ctx, eo, batch, false).await,
            None => batch,
        };
        if batch.is_empty() {
            return;
        }
        let mut batch = batch;
        // Traced only when [telemetry] is on: otherwise this is the batch's whole cost of it.
        let trace = crate::telemetry::current()
            .map(|t| super::traced::BatchTrace::start(t, &self.spec.name, &batch));
        let mut records: Arc<[Record]> = batch.iter_mut().map(plugin_record).collect();
        let schemas = self.grants.schemas.clone();
        let decoded = match schemas.as_deref().filter(|s| s.decodes()) {
            Some(s) => match Arc::get_mut(&mut records) {
                Some(own) => {
                    let mut wait = RegistryWait::new(self);
                    let decoded = loop {
                        match s.decode(own).await {
                            Ok(d) => break Some(d),
                            Err(e) => {
                                if !wait.failed(ctx, &e).await {
                                    break None;
                                }
                            }
                        }
                    };
                    drop(wait);
                    let Some(d) = decoded else {
                        give_back(&mut batch, &mut records);
                        release_all(&ctx.consumer, &batch);
                        return;
                    };
                    Some(d)
                }
                None => None,
            },
            None => None,
        };
        // The plugin's outbound requests continue the batch's span.
        let traceparent = trace.as_ref().and_then(|t| t.batch_traceparent());
        let faults: Vec<Option<String>> = decoded
            .as_ref()
            .filter(|d| d.fault_count() > 0)
            .map(|d| d.faults.clone())
            .unwrap_or_default();
        let judged = if faults.is_empty() {
            let j = self.judge(&batch, &records, traceparent.as_deref()).await;
            if let Some(j) = &j {
                self.note(&batch, &records, j);
            }
            j.map(|j| (j.version.hash.clone(), j.judged.verdicts, j.judged.emits))
        } else {
            self.judge_decodable(&batch, &records, &faults, traceparent.as_deref())
                .await
        };
        give_back(&mut batch, &mut records);
        if let Some(d) = decoded {
            for (s, original) in batch.iter_mut().zip(d.into_originals()) {
                if let Some((key, value)) = original {
                    s.record.key = key;
                    s.record.value = value;
                }
            }
        }
        let Some((hash, mut verdicts, mut emits)) = judged else {
            release_all(&ctx.consumer, &batch);
            return;
        };
        if let Some(s) = schemas.as_deref()
            && !emits.is_empty()
            && !self.encode_emits(ctx, s, &mut verdicts, &mut emits).await
        {
            release_all(&ctx.consumer, &batch);
            return;
        }
        if let Some(t) = &trace {
            t.judged(&verdicts);
            t.stamp(&mut emits);
        }
        let rules = Rules {
            outputs: &self.spec.outputs,
            max_renewals: self.spec.max_renewals,
            max_retry_delay: self.spec.max_retry_delay,
        };
        let p = plan(verdicts, emits, rules);
        self.act(ctx, &batch, p, &hash, permit).await;
        if let Some(t) = trace {
            t.end();
        }
    }

    /// Judges the records of `batch` that decoded (the plugin never sees the others) and gives
    /// each of the others a reject with its reason: the verdicts and emits of the whole batch,
    /// in its order.
    async fn judge_decodable(
        &self,
        batch: &[ShareRecord],
        records: &Arc<[Record]>,
        faults: &[Option<String>],
        traceparent: Option<&str>,
    ) -> Option<(String, Vec<Verdict>, Vec<Emit>)> {
        let good: Vec<usize> = (0..batch.len())
            .filter(|i| faults.get(*i).is_none_or(Option::is_none))
            .collect();
        for (i, why) in faults.iter().enumerate() {
            if let (Some(why), Some(r)) = (why, batch.get(i)) {
                tracing::warn!(pipeline = %self.spec.name, topic = %r.topic, partition = r.partition.partition, offset = r.record.offset, "record not decoded, rejected: {why}");
            }
        }
        let mut verdicts: Vec<Verdict> = faults
            .iter()
            .map(|f| match f {
                Some(why) => Verdict::Reject(Some(why.clone())),
                None => Verdict::Release,
            })
            .collect();
        if good.is_empty() {
            let hash = self.versions.active().hash.clone();
            return Some((hash, verdicts, Vec::new()));
        }
        let sub_batch: Vec<ShareRecord> =
            good.iter().filter_map(|&i| batch.get(i).cloned()).collect();
        let sub_records: Arc<[Record]> = good
            .iter()
            .filter_map(|&i| records.get(i).cloned())
            .collect();
        let j = self.judge(&sub_batch, &sub_records, traceparent).await?;
        self.note(&sub_batch, &sub_records, &j);
        for (k, v) in j.judged.verdicts.into_iter().enumerate() {
            if let Some(slot) = good.get(k).and_then(|&i| verdicts.get_mut(i)) {
                *slot = v;
            }
        }
        let emits = j
            .judged
            .emits
            .into_iter()
            .filter_map(|mut e| {
                e.record = *good.get(e.record)?;
                Some(e)
            })
            .collect();
        Some((j.version.hash.clone(), verdicts, emits))
    }

    /// Encodes each emit of an accepted record to an output with a schema (the others' emits
    /// are never produced); a record whose emit does not conform is rejected with the reason
    /// (its emits dropped). Waits while the registry cannot be reached; `false` when the
    /// pipeline stopped meanwhile.
    async fn encode_emits(
        &self,
        ctx: &BatchContext,
        schemas: &crate::schema::Schemas,
        verdicts: &mut [Verdict],
        emits: &mut Vec<Emit>,
    ) -> bool {
        let mut refused: Vec<(usize, String)> = Vec::new();
        let mut wait = RegistryWait::new(self);
        for e in emits.iter_mut() {
            let accepted = matches!(verdicts.get(e.record), Some(Verdict::Accept));
            if !accepted || refused.iter().any(|(r, _)| *r == e.record) {
                continue;
            }
            let answer = loop {
                match schemas.encode(&e.output, e.value.as_deref()).await {
                    Ok(a) => break a,
                    Err(err) => {
                        if !wait.failed(ctx, &err).await {
                            return false;
                        }
                    }
                }
            };
            match answer {
                None => {}
                Some(Ok(encoded)) => e.value = encoded,
                Some(Err(why)) => refused.push((e.record, why)),
            }
        }
        for (record, why) in &refused {
            if let Some(v) = verdicts.get_mut(*record) {
                tracing::warn!(pipeline = %self.spec.name, "emit not encoded, its record rejected: {why}");
                *v = Verdict::Reject(Some(why.clone()));
            }
        }
        emits.retain(|e| !refused.iter().any(|(r, _)| *r == e.record));
        true
    }

    /// Publishes what the engine counted (see [`super::counters::Counters::publish_engine`]).
    fn publish_engine_stats(&self, consumer: &ShareConsumer) {
        let running = self.state.lock().as_str() == "running";
        self.counters
            .publish_engine(consumer, running, self.grants.http.as_deref());
    }

    /// Keeps `sharehost_share_group_lag` current: the group coordinator's lag per partition,
    /// asked every [`LAG_INTERVAL`] until `stop`. A failed ask keeps the last values (logged at
    /// debug: the run loop reports a coordinator that is really gone).
    async fn watch_lag(&self, client: &KafkaClient, stop: &CancellationToken) {
        loop {
            match crate::kafka::protocol::share_offsets::share_group_offsets(
                client,
                &self.spec.group,
            )
            .await
            {
                Ok(partitions) => {
                    for p in partitions
                        .iter()
                        .filter(|p| p.error_code == 0 && p.lag >= 0)
                    {
                        self.metrics
                            .share_group_lag
                            .get_or_create(&vec![
                                ("pipeline", self.spec.name.clone()),
                                ("topic", p.topic.clone()),
                                ("partition", p.partition.to_string()),
                            ])
                            .set(p.lag);
                    }
                }
                Err(e) => {
                    tracing::debug!(pipeline = %self.spec.name, group = %self.spec.group, "cannot read the group's lag: {e}");
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(LAG_INTERVAL) => {}
            }
        }
    }
}

/// A batch waiting for the schema registry (to decode its records or encode its emits): while
/// it cannot be reached the pipeline shows degraded, the error is its last error (logged once
/// per outage) and the batch waits, holding its records (nothing released, nothing lost).
struct RegistryWait<'a> {
    pipeline: &'a Pipeline,
    waiting: bool,
    backoff: Duration,
}

impl<'a> RegistryWait<'a> {
    fn new(pipeline: &'a Pipeline) -> Self {
        Self {
            pipeline,
            waiting: false,
            backoff: Duration::from_millis(200),
        }
    }

    /// Notes `e` and waits before the next ask (200 ms, doubling to 5 s); `false` when the
    /// pipeline stops meanwhile.
    async fn failed(&mut self, ctx: &BatchContext, e: &crate::schema::Unreachable) -> bool {
        let p = self.pipeline;
        if !self.waiting {
            self.waiting = true;
            p.counters.schema_waiting.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(pipeline = %p.spec.name, "{e}; the batch waits for it, holding its records");
            *p.last_error.lock() = Some(e.to_string());
        }
        let backoff = self.backoff;
        self.backoff = (backoff * 2).min(Duration::from_secs(5));
        tokio::select! {
            _ = ctx.stop.cancelled() => false,
            _ = tokio::time::sleep(backoff) => true,
        }
    }
}

impl Drop for RegistryWait<'_> {
    fn drop(&mut self) {
        if self.waiting {
            let p = self.pipeline;
            p.counters.schema_waiting.fetch_sub(1, Ordering::Relaxed);
            tracing::info!(pipeline = %p.spec.name, "the schema registry answers again, or the batch gave up waiting");
        }
    }
}

/// What the plugin judges of `r`: the runtime's own record, with `r`'s key, value and headers
/// moved into it until [`give_back`]. Moved, not shared: every record of a fetch is a view of
/// the fetch's one buffer, and a clone and a drop per record on its one reference count, from
/// two threads, were about a tenth of the host's CPU at 100-byte records. A negative delivery
/// count, never sent by a correct broker, reads as 0.
fn plugin_record(r: &mut ShareRecord) -> Record {
    let c = &mut r.record;
    Record {
        topic: r.topic.clone(),
        partition: r.partition.partition,
        offset: c.offset,
        timestamp: c.timestamp,
        delivery_count: u16::try_from(r.delivery_count).unwrap_or(0),
        key: c.key.take(),
        value: c.value.take(),
        headers: std::mem::take(&mut c.headers)
            .into_iter()
            .map(|h| RuntimeHeader {
                key: h.key,
                value: h.value,
            })
            .collect(),
    }
}

/// Gives the batch's records back what [`plugin_record`] moved out of them, before anything
/// writes one out (a dead letter carries the record's own bytes): moved back when nobody else
/// holds the plugin's records any more, copied back (reference-counted) when someone still
/// does (a shadow version judging them, a guest call that outlived its deadline).
fn give_back(batch: &mut [ShareRecord], records: &mut Arc<[Record]>) {
    let back = |s: &mut ShareRecord, key, value, headers: Vec<RuntimeHeader>| {
        s.record.key = key;
        s.record.value = value;
        s.record.headers = headers
            .into_iter()
            .map(|h| Header {
                key: h.key,
                value: h.value,
            })
            .collect();
    };
    match Arc::get_mut(records) {
        Some(own) => {
            for (s, r) in batch.iter_mut().zip(own.iter_mut()) {
                back(
                    s,
                    r.key.take(),
                    r.value.take(),
                    std::mem::take(&mut r.headers),
                );
            }
        }
        None => {
            for (s, r) in batch.iter_mut().zip(records.iter()) {
                back(s, r.key.clone(), r.value.clone(), r.headers.clone());
            }
        }
    }
}

/// A group config in milliseconds (the group's own or the broker's), `default` (Kafka's) when
/// it cannot be read.
async fn group_ms(client: &KafkaClient, group: &str, key: &str, default: Duration) -> Duration {
    client
        .group_config(group, key)
        .await
        .ok()
        .flatten()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(default, Duration::from_millis)
}
