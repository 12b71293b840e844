//! The admin API's contract, written once: the routes, the bodies a request carries and the
//! answers the host gives, of the admin listener (`GET /pipelines`, the rollout actions, the
//! console's read endpoints, the dead letters) and of the fleet view (`GET /fleet`,
//! `sharehost fleet status`). The server and the console serve these paths and read these
//! bodies; `sharehost ctl` builds its requests from them and renders the answers as these
//! types; the tests call the same paths. Every type is plain data with serde, and its JSON is
//! the wire format the console's script reads, so a field is renamed here or nowhere.
//!
//! This crate depends on serde alone: the host computes these answers (its pipelines, rollout,
//! tenants, fleet and dead-letter reader keep their own state and build these types at the
//! edge), so a change inside the host cannot change an answer without a change here.
//!
//! Answer types with two fields are declared in the alphabetical order of their keys: the JSON
//! the host wrote before these types existed came from `serde_json::json!`, whose objects are
//! sorted, and the bytes stay the same.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub mod console;
pub mod dead_letters;
pub mod fleet;
pub mod pipeline;
pub mod rollout;
pub mod tenants;

pub use console::{FaultRole, FaultsView, HostInfo, RecentFault};
pub use dead_letters::{DeadLetterView, Group, Span, Summary};
pub use fleet::{
    CanaryOutcome, CanaryReport, CanaryRules, ComponentRef, Conflict, Desired, FleetCanary,
    FleetView, HostStatus, HostView, PipelineReport,
};
pub use pipeline::{GrantsStatus, PipelineStatus, VersionCounters, VersionInfo, VersionsStatus};
pub use rollout::{
    CanaryState, CanaryStatus, Disagreement, PromoteAfter, RollbackIf, ShadowStatus, Tally,
};
pub use tenants::{Failure, ManifestStatus, TenantStatus};

/// Prometheus text exposition of every metric.
pub const METRICS: &str = "/metrics";
/// Liveness: `ok` while the process serves HTTP.
pub const HEALTHZ: &str = "/healthz";
/// Readiness: 200 once every pipeline runs, else 503 with the reasons.
pub const READYZ: &str = "/readyz";
/// `GET`: every pipeline's status, a list of [`TenantStatus`].
pub const PIPELINES: &str = "/pipelines";
/// The console's page; `/` redirects to it.
pub const CONSOLE: &str = "/console";
/// The console's script.
pub const CONSOLE_JS: &str = "/console/console.js";
/// The console's style sheet.
pub const CONSOLE_CSS: &str = "/console/console.css";
/// `GET`: the host as the console's header shows it ([`HostInfo`]).
pub const HOST: &str = "/host";
/// `GET`: the recent faults of every pipeline ([`FaultsView`]).
pub const FAULTS: &str = "/faults";
/// The fleet as this host sees it ([`FleetView`]; 404 on a host without `[fleet]`).
pub const FLEET: &str = "/fleet";
/// How the host's manifest was last read ([`ManifestStatus`]).
pub const MANIFEST: &str = "/manifest";

/// What a request can do to one pipeline: each is a path under `/pipelines/NAME`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PipelineRoute {
    /// `GET`: the versions kept ready ([`VersionsStatus`]).
    Versions,
    /// `POST` [`SwapRequest`]: load a component and make it active ([`VersionChanged`]).
    Swap,
    /// `POST` [`RollbackRequest`]: back to a kept version ([`VersionChanged`]).
    Rollback,
    /// `POST` [`ShadowBody`]: start a shadow ([`CandidateStarted`]); `DELETE`: stop it
    /// ([`ShadowStopped`]).
    Shadow,
    /// `POST` [`CanaryBody`]: start a canary ([`CandidateStarted`]); `DELETE`: roll it back
    /// ([`VersionChanged`]).
    Canary,
    /// `POST`: promote the canary now ([`VersionChanged`]).
    Promote,
    /// `GET`: the pipeline's dead letters grouped by reason ([`DeadLetterView`]).
    DeadLetters,
    /// `POST` [`ReplayRequest`]: replay chosen dead letters once ([`Replayed`]).
    DeadLettersReplay,
}

impl PipelineRoute {
    /// The route as the admin router declares it, with `{name}` for the pipeline.
    pub const fn pattern(self) -> &'static str {
        match self {
            PipelineRoute::Versions => "/pipelines/{name}/versions",
            PipelineRoute::Swap => "/pipelines/{name}/swap",
            PipelineRoute::Rollback => "/pipelines/{name}/rollback",
            PipelineRoute::Shadow => "/pipelines/{name}/shadow",
            PipelineRoute::Canary => "/pipelines/{name}/canary",
            PipelineRoute::Promote => "/pipelines/{name}/promote",
            PipelineRoute::DeadLetters => "/pipelines/{name}/dead-letters",
            PipelineRoute::DeadLettersReplay => "/pipelines/{name}/dead-letters/replay",
        }
    }

    /// The path for pipeline `name` (one percent-encoded segment).
    pub fn path(self, name: &str) -> String {
        self.pattern().replace("{name}", &segment(name))
    }
}

/// A pipeline name as one URL path segment (percent-encoded beyond unreserved characters).
pub fn segment(name: &str) -> String {
    let mut out = String::new();
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The one content type a state-changing request may carry. A page on another origin can send
/// a form or a `no-cors` fetch only as `text/plain`, `application/x-www-form-urlencoded` or
/// `multipart/form-data`; anything else makes the browser ask the listener first (a CORS
/// preflight), which it never grants.
pub const JSON_CONTENT_TYPE: &str = "application/json";

/// A request refused before it reached a pipeline (403 for a foreign `Host` or `Origin`, 415
/// for a body that is not JSON): why, and what the listener expects instead.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Denied {
    /// What was wrong and what is expected.
    pub error: String,
}

/// The body of a swap.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SwapRequest {
    /// The component, as a path on the host's machine.
    pub path: PathBuf,
}

/// The body of a rollback (empty: the newest other kept version).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RollbackRequest {
    /// A kept version's hash or a prefix of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
}

/// The body of a shadow as sent: what is left out takes the host's default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShadowBody {
    /// The candidate component.
    pub path: PathBuf,
    /// Fraction of batches copied to the candidate (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample: Option<f64>,
}

/// The body of a canary as sent: what is left out takes the host's default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CanaryBody {
    /// The candidate component.
    pub path: PathBuf,
    /// Share of batches the candidate judges for real (0 < percent ≤ 100).
    pub percent: f64,
    /// When it is promoted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promote_after: Option<PromoteAfterBody>,
    /// When it is rolled back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_if: Option<RollbackIfBody>,
}

/// [`PromoteAfter`] as sent: only the bounds given.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PromoteAfterBody {
    /// Canary batches judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batches: Option<u64>,
    /// Seconds since the canary started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<u64>,
}

/// [`RollbackIf`] as sent: only the bounds given, the rest the host's defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RollbackIfBody {
    /// Largest share of the canary's batches that may fault (default 0: any fault).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_fault_rate: Option<f64>,
    /// Largest increase of the reject rate over the active version's (default 0.05).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_reject_rate_increase: Option<f64>,
    /// The same for releases (default 0.05).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_release_rate_increase: Option<f64>,
}

impl CanaryBody {
    /// The bounds the host acts on: what the body gives, the defaults of [`PromoteAfter`] and
    /// [`RollbackIf`] for the rest.
    pub fn bounds(&self) -> (PromoteAfter, RollbackIf) {
        let promote = self.promote_after.clone().unwrap_or_default();
        let bounds = self.rollback_if.clone().unwrap_or_default();
        let defaults = RollbackIf::default();
        (
            PromoteAfter {
                batches: promote.batches,
                seconds: promote.seconds,
            },
            RollbackIf {
                max_fault_rate: bounds.max_fault_rate.unwrap_or(defaults.max_fault_rate),
                max_reject_rate_increase: bounds
                    .max_reject_rate_increase
                    .unwrap_or(defaults.max_reject_rate_increase),
                max_release_rate_increase: bounds
                    .max_release_rate_increase
                    .unwrap_or(defaults.max_release_rate_increase),
            },
        )
    }
}

/// The answer to a swap, rollback, promotion or stopped canary: the version now active.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VersionChanged {
    /// Its content hash.
    pub active_version: String,
    /// The pipeline.
    pub pipeline: String,
}

/// The answer to a started shadow or canary: the candidate's hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateStarted {
    /// Its content hash.
    pub candidate: String,
    /// The pipeline.
    pub pipeline: String,
}

/// The answer to a stopped shadow: what it saw.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShadowStopped {
    /// The pipeline.
    pub pipeline: String,
    /// The shadow's last status.
    pub shadow: ShadowStatus,
}

/// A request the pipeline refused (422), or one the console could not serve: why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Refused {
    /// What went wrong.
    pub error: String,
    /// The pipeline.
    pub pipeline: String,
}

/// The body of a dead-letter replay: which dead letters, as `sharehost dlq`'s options.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayRequest {
    /// Reasons matching this regular expression (a group's `reason_regex`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Dead-letter topic offsets, `A..B` and the other forms of `--offsets`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offsets: Option<String>,
    /// One partition of the dead-letter topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<i32>,
    /// Say what would be replayed; produce and remember nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// The answer to a replay: what it did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Replayed {
    /// The pipeline.
    pub pipeline: String,
    /// What the replay read, replayed and skipped.
    pub summary: Summary,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_one_path_segment() {
        assert_eq!(segment("orders-v2.eu"), "orders-v2.eu");
        assert_eq!(segment("a/b c"), "a%2Fb%20c");
        assert_eq!(
            PipelineRoute::DeadLettersReplay.path("a b"),
            "/pipelines/a%20b/dead-letters/replay"
        );
    }

    #[test]
    fn answers_keep_the_bytes_the_host_wrote_with_json_macros() {
        let changed = VersionChanged {
            active_version: "ab".into(),
            pipeline: "p".into(),
        };
        assert_eq!(
            serde_json::to_string(&changed).expect("json"),
            serde_json::json!({ "pipeline": "p", "active_version": "ab" }).to_string()
        );
        let refused = Refused {
            error: "no".into(),
            pipeline: "p".into(),
        };
        assert_eq!(
            serde_json::to_string(&refused).expect("json"),
            serde_json::json!({ "pipeline": "p", "error": "no" }).to_string()
        );
    }

    /// The contract pinned: the keys of the main answers, in the order the host writes them
    /// (the console's script and `sharehost ctl` read them by name; a change here is a change
    /// of the API).
    #[test]
    fn answers_keep_their_keys_and_order() {
        fn json<T: Serialize>(answer: &T) -> String {
            serde_json::to_string(answer).expect("json")
        }
        assert_eq!(
            json(&PipelineStatus::default()),
            r#"{"name":"","state":"","active_version":"","component":"","versions":{},"dead_lettered":0,"in_flight":0,"in_flight_peak":0,"in_flight_limit":0,"fetches":0,"acquired":0,"acquired_split":0,"writes_waiting":0,"write_failures":0,"released_unwritten":0,"dead_letters_shrunk":0,"unmapped_outputs":[],"last_error":null,"start":null,"last_swap_error":null,"last_swap_stall_ms":null,"grants":{"outputs":{},"allowed_outbound_hosts":[],"secrets":[]},"signer":null,"allocator":"","allocator_reason":null,"shadow":null,"canary":null}"#
        );
        assert_eq!(
            json(&TenantStatus::Failed(Failure {
                name: "p".into(),
                state: "failed".into(),
                error: "e".into(),
                attempts: 2,
                failing_for_s: 3,
            })),
            r#"{"name":"p","state":"failed","error":"e","attempts":2,"failing_for_s":3}"#
        );
        assert_eq!(
            json(&Summary::default()),
            r#"{"read":0,"selected":0,"replayed":0,"already_replayed":0,"recovered":0,"other_pipeline":0,"not_dead_letters":0,"original_topic_missing":0,"dry_run":false}"#
        );
        assert_eq!(
            json(&CanaryStatus {
                candidate: "c".into(),
                path: "/c.wasm".into(),
                percent: 5.0,
                state: CanaryState::RolledBack,
                reason: None,
                candidate_tally: Tally::default(),
                active_tally: Tally::default(),
                seconds: 1,
                promote_after: PromoteAfter::default(),
                rollback_if: RollbackIf::default(),
            }),
            r#"{"candidate":"c","path":"/c.wasm","percent":5.0,"state":"rolled_back","reason":null,"candidate_tally":{"batches":0,"faulted_batches":0,"records":0,"rejected":0,"released":0},"active_tally":{"batches":0,"faulted_batches":0,"records":0,"rejected":0,"released":0},"seconds":1,"promote_after":{"batches":null,"seconds":null},"rollback_if":{"max_fault_rate":0.0,"max_reject_rate_increase":0.05,"max_release_rate_increase":0.05}}"#
        );
        let host = HostView {
            status: HostStatus {
                host: "h".into(),
                instance: "i".into(),
                at_ms: 1,
                version: "0.1.0".into(),
                pipelines: Vec::new(),
            },
            age_ms: 2,
            stale: false,
            conflict: None,
        };
        assert_eq!(
            json(&host),
            r#"{"host":"h","instance":"i","at_ms":1,"version":"0.1.0","pipelines":[],"age_ms":2,"stale":false,"conflict":null}"#
        );
    }

    #[test]
    fn bodies_leave_out_what_was_not_given_and_the_host_fills_its_defaults() {
        let body = CanaryBody {
            path: "/c.wasm".into(),
            percent: 5.0,
            promote_after: Some(PromoteAfterBody {
                seconds: Some(600),
                ..Default::default()
            }),
            rollback_if: None,
        };
        assert_eq!(
            serde_json::to_value(&body).expect("json"),
            serde_json::json!({ "path": "/c.wasm", "percent": 5.0, "promote_after": { "seconds": 600 } })
        );
        let (promote_after, rollback_if) = body.bounds();
        assert_eq!(rollback_if.max_reject_rate_increase, 0.05);
        assert_eq!(promote_after.batches, None);
        assert_eq!(
            serde_json::to_value(RollbackRequest::default()).expect("json"),
            serde_json::json!({})
        );
    }
}
