//! What `GET /pipelines` and `GET /pipelines/NAME/versions` show of a pipeline: the
//! pipeline's state read into the admin API's answers ([`sharehost_api::pipeline`]).

use std::sync::atomic::Ordering;

use sharehost_api::{CanaryState, GrantsStatus, PipelineStatus, VersionInfo, VersionsStatus};

use super::core::Pipeline;
use super::guard::lock;
use super::runs::canary_status;

impl Pipeline {
    /// Status for `GET /pipelines`.
    pub fn status(&self) -> PipelineStatus {
        let active = lock(&self.active).clone();
        let c = &self.counters;
        let waiting = c.writes.waiting.load(Ordering::Relaxed);
        let state = lock(&self.state).clone();
        PipelineStatus {
            name: self.spec.name.clone(),
            state: match state.as_str() {
                "running" if !c.joined.load(Ordering::Relaxed) => "joining".to_owned(),
                "running" if waiting > 0 => "degraded".to_owned(),
                _ => state,
            },
            writes_waiting: waiting as u64,
            in_flight_peak: c.engine.peak.load(Ordering::Relaxed),
            in_flight_limit: c.engine.limit.load(Ordering::Relaxed),
            fetches: c.engine.fetches.load(Ordering::Relaxed),
            acquired: c.engine.acquired.load(Ordering::Relaxed),
            acquired_split: c.engine.acquired_split.load(Ordering::Relaxed),
            write_failures: c.writes.failures.load(Ordering::Relaxed),
            released_unwritten: c.writes.released.load(Ordering::Relaxed),
            dead_letters_shrunk: c.writes.shrunk.load(Ordering::Relaxed),
            active_version: active.hash.clone(),
            component: active.path.display().to_string(),
            versions: c.per_version(),
            dead_lettered: c.dead_lettered.load(Ordering::Relaxed),
            in_flight: c.in_flight.load(Ordering::Relaxed),
            last_error: lock(&self.last_error).clone(),
            start: lock(&self.start).clone(),
            unmapped_outputs: lock(&self.unmapped).iter().cloned().collect(),
            last_swap_error: lock(&self.last_swap_error).clone(),
            last_swap_stall_ms: lock(&c.stall).last.map(|d| d.as_secs_f64() * 1e3),
            signer: active.signer(),
            allocator: active
                .placement
                .as_ref()
                .map_or("native", |p| p.allocator.name())
                .to_owned(),
            allocator_reason: active.placement.as_ref().and_then(|p| p.reason.clone()),
            shadow: lock(&self.shadow)
                .as_ref()
                .map(|s| lock(&s.status).status()),
            canary: match lock(&self.canary).as_ref() {
                Some(c) => Some(canary_status(c, CanaryState::Running, None)),
                None => lock(&self.last_canary).clone(),
            },
            grants: GrantsStatus {
                outputs: self.spec.outputs.clone(),
                allowed_outbound_hosts: self
                    .spec
                    .http
                    .as_ref()
                    .map(|h| h.allowed_outbound_hosts.clone())
                    .unwrap_or_default(),
                secrets: self.grants.secrets.names().map(str::to_owned).collect(),
            },
        }
    }

    /// The active version and the kept ones, for `GET /pipelines/NAME/versions`.
    pub fn versions(&self) -> VersionsStatus {
        let active = lock(&self.active).clone();
        let mut versions = vec![VersionInfo {
            hash: active.hash.clone(),
            path: active.path.display().to_string(),
            loaded_at_ms: active.loaded_at_ms,
            signer: active.signer(),
            active: true,
            counters: self.counters.of(&active.hash),
        }];
        for k in lock(&self.history).iter() {
            versions.push(VersionInfo {
                hash: k.hash.clone(),
                path: k.path.display().to_string(),
                loaded_at_ms: k.loaded_at_ms,
                signer: k.compiled.signer.clone(),
                active: false,
                counters: self.counters.of(&k.hash),
            });
        }
        VersionsStatus {
            active: active.hash.clone(),
            versions,
        }
    }
}
