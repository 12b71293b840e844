//! What `GET /pipelines` and `GET /pipelines/NAME/versions` show of a pipeline: the
//! pipeline's state read into the admin API's answers ([`sharehost_api::pipeline`]).

use std::sync::atomic::Ordering;

use sharehost_api::{GrantsStatus, PipelineStatus, VersionsStatus};

use super::handle::Pipeline;

impl Pipeline {
    /// Status for `GET /pipelines`.
    pub fn status(&self) -> PipelineStatus {
        let active = self.versions.active();
        let c = &self.counters;
        let waiting = c.writes.waiting.load(Ordering::Relaxed);
        let state = self.state.lock().clone();
        PipelineStatus {
            name: self.spec.name.clone(),
            state: match state.as_str() {
                "running" if !c.joined.load(Ordering::Relaxed) => "joining".to_owned(),
                "running" if waiting > 0 || c.schema_waiting.load(Ordering::Relaxed) > 0 => {
                    "degraded".to_owned()
                }
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
            last_error: self.last_error.lock().clone(),
            start: self.start.lock().clone(),
            unmapped_outputs: self.unmapped.lock().iter().cloned().collect(),
            last_swap_error: self.last_swap_error.lock().clone(),
            last_swap_stall_ms: c.stall.lock().last.map(|d| d.as_secs_f64() * 1e3),
            signer: active.signer(),
            allocator: active
                .placement
                .as_ref()
                .map_or("native", |p| p.allocator.name())
                .to_owned(),
            allocator_reason: active.placement.as_ref().and_then(|p| p.reason.clone()),
            shadow: self.rollouts.shadow_status(),
            canary: self.rollouts.canary_status(),
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
        self.versions.status(&self.counters)
    }
}
