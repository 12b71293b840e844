//! Safe rollout of a new plugin version beside the active one: a **shadow** judges copies of
//! batches and is only compared, a **canary** judges a share of batches for real and is
//! promoted or rolled back by the numbers, and the **state file** brings a restarted host back
//! on the version that was active. The pipeline (`crate::pipeline`) owns the versions and
//! calls in here to decide and to count; nothing here touches Kafka.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sharehost_api::{CanaryBody, Disagreement, ShadowBody, ShadowStatus, Tally};
pub use sharehost_api::{PromoteAfter, RollbackIf};

use crate::runtime::Verdict;

/// Disagreements kept with their record coordinates, per shadow: enough to look at, bounded.
pub const KEPT_DISAGREEMENTS: usize = 20;
/// Shadow batches that may wait for the candidate; beyond them a batch is dropped (counted),
/// so a slow candidate falls behind instead of holding records or the active path.
pub const SHADOW_QUEUE: usize = 8;
/// Records a canary must have judged before it is rolled back for its reject or release rate
/// while it runs (at promotion its rates are compared whatever the sample, by the same
/// confidence bounds, which are wide on few records).
pub const MIN_CANARY_RECORDS_FOR_RATES: u64 = 100;
/// The z of the Wilson bounds a canary's rates are compared by: about 99.87 % one-sided
/// each. A rate counts as worse only when even the low end of the candidate's interval is
/// above the high end of the active version's by more than the bound. The rule runs after
/// every canary batch, so each check must be strict: an identical candidate, tried thousands
/// of times, is never rolled back, while one rejecting everything still is at the minimum
/// sample (unit tests below).
pub const CANARY_CONFIDENCE_Z: f64 = 3.0;

/// A shadow's request: which candidate, and what fraction of batches it sees (sent as a
/// [`ShadowBody`]).
#[derive(Debug, Clone)]
pub struct ShadowRequest {
    /// The candidate component.
    pub path: PathBuf,
    /// Fraction of batches copied to the candidate (0 < sample ≤ 1).
    pub sample: f64,
}

impl From<&ShadowBody> for ShadowRequest {
    /// The request the host acts on, defaults filled in.
    fn from(body: &ShadowBody) -> Self {
        ShadowRequest {
            path: body.path.clone(),
            sample: body.sample.unwrap_or(1.0),
        }
    }
}

impl ShadowRequest {
    /// Refuses a sample that makes no shadow, naming the field (the host and `sharehost ctl`
    /// both check with this).
    pub fn validate(&self) -> Result<(), String> {
        if self.sample > 0.0 && self.sample <= 1.0 {
            Ok(())
        } else {
            Err(format!("sample must be in (0, 1], got {}", self.sample))
        }
    }
}

/// What a shadow has seen so far: its status as `GET /pipelines` shows it, and the time the
/// candidate took on the records compared (from which the status's time per record is
/// derived).
#[derive(Debug, Clone, Default)]
pub struct ShadowComparison {
    /// The counts shown.
    status: ShadowStatus,
    /// The candidate's time on every compared record, summed.
    nanos: u128,
}

impl From<ShadowStatus> for ShadowComparison {
    /// A comparison that starts from `status` (its candidate, path and sample).
    fn from(status: ShadowStatus) -> Self {
        ShadowComparison { status, nanos: 0 }
    }
}
impl ShadowComparison {
    /// Its status as `GET /pipelines` and a stopped shadow show it.
    pub fn status(&self) -> ShadowStatus {
        self.status.clone()
    }

    /// Counts a batch of `records` not copied because the candidate was behind.
    pub fn dropped(&mut self, records: usize) {
        self.status.dropped_batches += 1;
        self.status.dropped_records += records as u64;
    }

    /// Counts `faults` of the candidate on a batch (not compared).
    pub fn faulted(&mut self, faults: usize) {
        self.status.faults += faults as u64;
    }

    /// Compares one batch: `active` and `candidate` verdicts of the same records, in order.
    pub fn compare(
        &mut self,
        coordinates: &[(String, i32, i64)],
        active: &[Verdict],
        candidate: &[Verdict],
        elapsed: Duration,
    ) {
        self.nanos += elapsed.as_nanos();
        let s = &mut self.status;
        s.batches += 1;
        s.records += active.len() as u64;
        if s.records > 0 {
            s.us_per_record = (self.nanos as f64 / s.records as f64 / 1e3 * 10.0).round() / 10.0;
        }
        for ((a, c), (topic, partition, offset)) in active.iter().zip(candidate).zip(coordinates) {
            // Agreement is by kind: two rejects with different reasons agree.
            if a.kind() == c.kind() {
                *s.agreed.entry(a.kind().to_owned()).or_default() += 1;
                continue;
            }
            *s.disagreed
                .entry(format!("{}→{}", a.kind(), c.kind()))
                .or_default() += 1;
            if s.first_disagreements.len() < KEPT_DISAGREEMENTS {
                s.first_disagreements.push(Disagreement {
                    topic: topic.clone(),
                    partition: *partition,
                    offset: *offset,
                    active: describe(a),
                    candidate: describe(c),
                });
            }
        }
    }
}

/// A verdict with its detail, for a disagreement.
fn describe(v: &Verdict) -> String {
    match v {
        Verdict::Reject(Some(reason)) => format!("reject: {reason}"),
        Verdict::Retry(ms) => format!("retry after {ms} ms"),
        other => other.kind().to_owned(),
    }
}

/// A canary's request (sent as a [`CanaryBody`], whose defaults the host fills in).
#[derive(Debug, Clone)]
pub struct CanaryRequest {
    /// The candidate component.
    pub path: PathBuf,
    /// Share of batches the candidate judges for real (0 < percent ≤ 100).
    pub percent: f64,
    /// When it is promoted.
    pub promote_after: PromoteAfter,
    /// When it is rolled back.
    pub rollback_if: RollbackIf,
}

impl From<&CanaryBody> for CanaryRequest {
    /// The request the host acts on, defaults filled in.
    fn from(body: &CanaryBody) -> Self {
        let (promote_after, rollback_if) = body.bounds();
        CanaryRequest {
            path: body.path.clone(),
            percent: body.percent,
            promote_after,
            rollback_if,
        }
    }
}

impl CanaryRequest {
    /// Refuses numbers that make no canary, naming the field (the host and `sharehost ctl`
    /// both check with this).
    pub fn validate(&self) -> Result<(), String> {
        if !(self.percent > 0.0 && self.percent <= 100.0) {
            return Err(format!("percent must be in (0, 100], got {}", self.percent));
        }
        if self.promote_after.batches.is_none() && self.promote_after.seconds.is_none() {
            return Err("promote_after needs `batches` or `seconds`".into());
        }
        let r = &self.rollback_if;
        for (name, v) in [
            ("rollback_if.max_fault_rate", r.max_fault_rate),
            (
                "rollback_if.max_reject_rate_increase",
                r.max_reject_rate_increase,
            ),
            (
                "rollback_if.max_release_rate_increase",
                r.max_release_rate_increase,
            ),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("{name} must be in [0, 1], got {v}"));
            }
        }
        Ok(())
    }
}

/// Verdict counts of one side of a canary, over the same period, as the rollout counts and
/// sums them; shown as a [`Tally`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct VerdictTally {
    /// Batches judged.
    pub batches: u64,
    /// Batches that faulted.
    pub faulted_batches: u64,
    /// Records judged.
    pub records: u64,
    /// Records rejected.
    pub rejected: u64,
    /// Records released.
    pub released: u64,
}

impl VerdictTally {
    /// Adds one batch's verdicts.
    pub fn add(&mut self, verdicts: &[Verdict], faulted: bool) {
        self.batches += 1;
        self.faulted_batches += u64::from(faulted);
        self.records += verdicts.len() as u64;
        for v in verdicts {
            match v {
                Verdict::Reject(_) => self.rejected += 1,
                Verdict::Release => self.released += 1,
                _ => {}
            }
        }
    }

    /// The sum of two tallies (a fleet's canary decides on every host's).
    pub fn plus(self, o: VerdictTally) -> VerdictTally {
        VerdictTally {
            batches: self.batches + o.batches,
            faulted_batches: self.faulted_batches + o.faulted_batches,
            records: self.records + o.records,
            rejected: self.rejected + o.rejected,
            released: self.released + o.released,
        }
    }

    /// Adds a batch the candidate faulted on: none of its verdicts counted (the active
    /// version judged the records).
    pub fn add_faulted(&mut self) {
        self.batches += 1;
        self.faulted_batches += 1;
    }

    fn rate(n: u64, of: u64) -> f64 {
        if of == 0 { 0.0 } else { n as f64 / of as f64 }
    }
}

impl From<VerdictTally> for Tally {
    fn from(t: VerdictTally) -> Tally {
        Tally {
            batches: t.batches,
            faulted_batches: t.faulted_batches,
            records: t.records,
            rejected: t.rejected,
            released: t.released,
        }
    }
}

impl From<Tally> for VerdictTally {
    /// A tally as another host reported it, to be summed with this host's.
    fn from(t: Tally) -> VerdictTally {
        VerdictTally {
            batches: t.batches,
            faulted_batches: t.faulted_batches,
            records: t.records,
            rejected: t.rejected,
            released: t.released,
        }
    }
}

/// The decision after a canary batch.
#[derive(Debug, Clone, PartialEq)]
pub enum CanaryDecision {
    /// Keep going.
    Continue,
    /// Promote it, with the reason.
    Promote(String),
    /// Roll it back, with the reason.
    RollBack(String),
}

/// A running canary's bookkeeping: which batches it takes and when it is decided.
#[derive(Debug)]
pub struct CanaryPlan {
    /// The request it was started with.
    pub request: CanaryRequest,
    /// When it started.
    pub started: Instant,
    /// Batches offered so far (canary's and active's), to spread the percent evenly.
    offered: u64,
    /// The candidate's tally.
    pub candidate: VerdictTally,
    /// The active version's tally since the canary started.
    pub active: VerdictTally,
}

impl CanaryPlan {
    /// A plan for `request` (validated).
    pub fn new(request: CanaryRequest) -> Self {
        Self {
            request,
            started: Instant::now(),
            offered: 0,
            candidate: VerdictTally::default(),
            active: VerdictTally::default(),
        }
    }

    /// Whether the next batch goes to the candidate: exactly `percent` of batches, spread
    /// evenly (batch n goes to it when ⌊n·p⌋ grows), not by chance, so a small test run sees
    /// its share.
    pub fn takes_next(&mut self) -> bool {
        let p = self.request.percent / 100.0;
        let before = (self.offered as f64 * p).floor();
        self.offered += 1;
        (self.offered as f64 * p).floor() > before
    }

    /// The decision after the candidate judged a batch (its tallies already count it).
    pub fn after_candidate_batch(&mut self) -> CanaryDecision {
        decide(
            &self.request.promote_after,
            &self.request.rollback_if,
            self.candidate,
            self.active,
            self.started.elapsed(),
        )
    }
}

/// The canary rules on tallies: rolled back at once when the candidate faults more than
/// `rollback_if` allows or (on enough records) rejects or releases more than the active version
/// by more than its bounds; promoted after `promote_after` when within them; otherwise it goes
/// on. Pure, so one host's canary and a fleet's (on the sum of every host's tallies) decide by
/// the same rules.
pub fn decide(
    promote_after: &PromoteAfter,
    rollback_if: &RollbackIf,
    candidate: VerdictTally,
    active: VerdictTally,
    elapsed: Duration,
) -> CanaryDecision {
    let r = rollback_if;
    let c = candidate;
    let fault_rate = VerdictTally::rate(c.faulted_batches, c.batches);
    if c.faulted_batches > 0 && fault_rate > r.max_fault_rate {
        return CanaryDecision::RollBack(format!(
            "fault rate {:.3} ({} of {} batches) above rollback_if.max_fault_rate {}",
            fault_rate, c.faulted_batches, c.batches, r.max_fault_rate
        ));
    }
    if c.records >= MIN_CANARY_RECORDS_FOR_RATES
        && let Some(reason) = rate_breach(r, candidate, active)
    {
        return CanaryDecision::RollBack(reason);
    }
    let after = promote_after;
    let by_batches = after.batches.is_some_and(|n| c.batches >= n);
    let by_time = after
        .seconds
        .is_some_and(|s| elapsed >= Duration::from_secs(s));
    if by_batches || by_time {
        // At promotion the rates are compared whatever the sample size: a canary promoted
        // early on few records still had to stay within its bounds on them, by bounds as
        // wide as so few records leave.
        if let Some(reason) = rate_breach(r, candidate, active) {
            return CanaryDecision::RollBack(reason);
        }
        return CanaryDecision::Promote(format!(
            "{} batches ({} records) within bounds: fault rate {:.3}, reject rate {:.3} vs {:.3}, release rate {:.3} vs {:.3}",
            c.batches,
            c.records,
            fault_rate,
            VerdictTally::rate(c.rejected, c.records),
            VerdictTally::rate(active.rejected, active.records),
            VerdictTally::rate(c.released, c.records),
            VerdictTally::rate(active.released, active.records),
        ));
    }
    CanaryDecision::Continue
}

/// The Wilson score interval of `k` in `n` at `z` (`(0, 1)` with no records): unlike `k/n ±`
/// a normal margin, it stays inside [0, 1] and is honest at 0 of 20 or 20 of 20.
pub fn wilson(k: u64, n: u64, z: f64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let n = n as f64;
    let p = k as f64 / n;
    let z2 = z * z;
    let denom = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denom;
    let half = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / denom;
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// Which rate of the candidate, if any, is worse than the active version's by more than its
/// bound with confidence: the low end of the candidate's Wilson interval against the high end
/// of the active version's (taken as 0 when the active version judged nothing, at 100 %).
fn rate_breach(r: &RollbackIf, c: VerdictTally, a: VerdictTally) -> Option<String> {
    for (what, cn, an, bound) in [
        ("reject", c.rejected, a.rejected, r.max_reject_rate_increase),
        (
            "release",
            c.released,
            a.released,
            r.max_release_rate_increase,
        ),
    ] {
        let (cr, ar) = (
            VerdictTally::rate(cn, c.records),
            VerdictTally::rate(an, a.records),
        );
        let low = wilson(cn, c.records, CANARY_CONFIDENCE_Z).0;
        let high = if a.records == 0 {
            0.0
        } else {
            wilson(an, a.records, CANARY_CONFIDENCE_Z).1
        };
        if low - high > bound {
            return Some(format!(
                "{what} rate {cr:.3} ({cn} of {} records, at least {low:.3} with confidence) exceeds the active version's {ar:.3} ({an} of {}, at most {high:.3}) by more than rollback_if.max_{what}_rate_increase {bound}",
                c.records, a.records
            ));
        }
    }
    None
}

/// What a restarted host reads to come back on the version that was active: written on every
/// change of the active version (swap, rollback, promotion).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ActiveState {
    /// The pipeline.
    pub pipeline: String,
    /// Its share group.
    pub group: String,
    /// Content hash of the active version.
    pub active_hash: String,
    /// Its component path.
    pub active_path: PathBuf,
    /// Content hash of the manifest's component when this was written: if the manifest's
    /// component has changed since, the manifest wins at the next start.
    pub manifest_hash: String,
    /// The canary running when this was written, if any: a restart ends it (its tallies are
    /// gone with the process) and says so, rather than drop it without a word.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanaryNote>,
}

/// A running canary as the state file remembers it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CanaryNote {
    /// The candidate's content hash.
    pub candidate: String,
    /// Its component path.
    pub path: PathBuf,
    /// The share of batches it judged.
    pub percent: f64,
}

impl ActiveState {
    /// Where the state of `pipeline` in `group` lives under `dir`: one file per pipeline and
    /// group, so two manifests (or tests) that reuse a pipeline name never read each other's.
    pub fn file(dir: &Path, pipeline: &str, group: &str) -> PathBuf {
        let clean = crate::persisted::file_name_part;
        dir.join("pipelines")
            .join(format!("{}.{}.json", clean(pipeline), clean(group)))
    }

    /// [`ActiveState::file`], after moving the files an older sharehost kept for this pipeline
    /// and group under the name it made of them (every character but letters, digits, `-` and
    /// `_` as `_`, so a group `a.b` was `a_b`): the state file and the member id beside it, so a
    /// pipeline of a dotted group still comes back on its version and as its member.
    pub fn file_moving_older(dir: &Path, pipeline: &str, group: &str) -> PathBuf {
        let file = ActiveState::file(dir, pipeline, group);
        let older = |s: &str| -> String {
            s.chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || matches!(c, '-' | '_') {
                        c
                    } else {
                        '_'
                    }
                })
                .collect()
        };
        let old = dir
            .join("pipelines")
            .join(format!("{}.{}.json", older(pipeline), older(group)));
        if old != file && !file.exists() && old.exists() {
            for ext in ["json", "member"] {
                let (from, to) = (old.with_extension(ext), file.with_extension(ext));
                if from.exists()
                    && let Err(e) = std::fs::rename(&from, &to)
                {
                    tracing::warn!(
                        pipeline,
                        "cannot move the older state file {} to {}: {e}",
                        from.display(),
                        to.display()
                    );
                }
            }
        }
        file
    }

    /// Reads a state file; a missing one is `None`, a damaged one an error to log.
    pub fn read(path: &Path) -> Result<Option<ActiveState>, String> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| format!("{}: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }

    /// Writes it atomically.
    pub fn write(&self, path: &Path) -> Result<(), String> {
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| e.to_string())?;
        crate::persisted::write_atomically(path, &bytes)
            .map_err(|e| format!("{}: {e}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_files_an_older_sharehost_named_for_a_dotted_group_are_moved_to_their_new_name() {
        let dir = std::env::temp_dir().join(format!("sharehost-older-{}", std::process::id()));
        let pipelines = dir.join("pipelines");
        std::fs::create_dir_all(&pipelines).expect("dir");
        std::fs::write(pipelines.join("p.g_1.json"), "{}").expect("old state");
        std::fs::write(pipelines.join("p.g_1.member"), "m").expect("old member");
        let file = ActiveState::file_moving_older(&dir, "p", "g.1");
        assert_eq!(file, pipelines.join("p.g.1.json"));
        assert_eq!(std::fs::read_to_string(&file).ok().as_deref(), Some("{}"));
        assert_eq!(
            std::fs::read_to_string(file.with_extension("member"))
                .ok()
                .as_deref(),
            Some("m")
        );
        assert!(!pipelines.join("p.g_1.json").exists());
        // A group without a dot keeps its one name.
        assert_eq!(
            ActiveState::file_moving_older(&dir, "p", "g-2"),
            pipelines.join("p.g-2.json")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn canary(percent: f64, batches: u64) -> CanaryPlan {
        CanaryPlan::new(CanaryRequest {
            path: "c.wasm".into(),
            percent,
            promote_after: PromoteAfter {
                batches: Some(batches),
                seconds: None,
            },
            rollback_if: RollbackIf::default(),
        })
    }

    #[test]
    fn a_canary_takes_exactly_its_share_of_batches_spread_evenly() {
        let mut c = canary(25.0, 10);
        let taken: Vec<bool> = (0..8).map(|_| c.takes_next()).collect();
        assert_eq!(
            taken,
            [false, false, false, true, false, false, false, true]
        );
        let mut c = canary(100.0, 10);
        assert!((0..5).all(|_| c.takes_next()));
    }

    #[test]
    fn a_fault_rolls_back_at_once_and_clean_batches_promote() {
        let mut c = canary(50.0, 3);
        c.candidate.add(&vec![Verdict::Accept; 10], false);
        assert_eq!(c.after_candidate_batch(), CanaryDecision::Continue);
        c.candidate.add(&vec![Verdict::Accept; 10], true);
        assert!(
            matches!(c.after_candidate_batch(), CanaryDecision::RollBack(r) if r.contains("fault rate"))
        );
        let mut c = canary(50.0, 2);
        c.candidate.add(&vec![Verdict::Accept; 10], false);
        c.candidate.add(&vec![Verdict::Accept; 10], false);
        assert!(matches!(
            c.after_candidate_batch(),
            CanaryDecision::Promote(_)
        ));
    }

    #[test]
    fn a_canary_that_rejects_more_than_the_active_version_is_rolled_back() {
        let mut c = canary(50.0, 1000);
        c.active.add(&vec![Verdict::Accept; 300], false);
        // 20 % rejects against 0 %: beyond the default 5 points even at the low end of its
        // interval, once enough records are in.
        let mut v = vec![Verdict::Accept; 160];
        v.extend(vec![Verdict::Reject(None); 40]);
        c.candidate.add(&v, false);
        assert!(
            matches!(c.after_candidate_batch(), CanaryDecision::RollBack(r) if r.contains("reject rate"))
        );
    }

    #[test]
    fn wilson_bounds_hold_the_rate_and_narrow_with_the_sample() {
        let (lo, hi) = wilson(0, 20, CANARY_CONFIDENCE_Z);
        assert!(lo.abs() < 1e-12, "{lo}");
        assert!((hi - 9.0 / 29.0).abs() < 1e-9, "{hi}");
        let (lo, hi) = wilson(20, 20, CANARY_CONFIDENCE_Z);
        assert!((lo - 20.0 / 29.0).abs() < 1e-9 && hi == 1.0, "{lo} {hi}");
        let narrow = wilson(300, 1000, CANARY_CONFIDENCE_Z);
        let wide = wilson(6, 20, CANARY_CONFIDENCE_Z);
        assert!(narrow.0 < 0.3 && 0.3 < narrow.1 && wide.0 < narrow.0 && narrow.1 < wide.1);
        assert_eq!(wilson(0, 0, CANARY_CONFIDENCE_Z), (0.0, 1.0));
    }

    /// One batch of `n` verdicts from a plugin that rejects with `reject` and releases with
    /// `release` probability.
    fn batch(rng: &mut rand::rngs::StdRng, n: usize, reject: f64, release: f64) -> Vec<Verdict> {
        use rand::Rng;
        (0..n)
            .map(|_| {
                let x: f64 = rng.random();
                if x < reject {
                    Verdict::Reject(None)
                } else if x < reject + release {
                    Verdict::Release
                } else {
                    Verdict::Accept
                }
            })
            .collect()
    }

    /// Runs a 50 % canary of batches of `size` until it is decided or `max_batches` batches
    /// were offered; the candidate and active plugins reject and release at their rates.
    fn run_canary(
        rng: &mut rand::rngs::StdRng,
        promote_after: u64,
        size: usize,
        candidate: (f64, f64),
        active: (f64, f64),
        max_batches: u64,
    ) -> (CanaryDecision, VerdictTally) {
        let mut c = canary(50.0, promote_after);
        for _ in 0..max_batches {
            if c.takes_next() {
                let v = batch(rng, size, candidate.0, candidate.1);
                c.candidate.add(&v, false);
                match c.after_candidate_batch() {
                    CanaryDecision::Continue => {}
                    decided => return (decided, c.candidate),
                }
            } else {
                let v = batch(rng, size, active.0, active.1);
                c.active.add(&v, false);
            }
        }
        (CanaryDecision::Continue, c.candidate)
    }

    #[test]
    fn an_identical_candidate_is_never_rolled_back_by_chance() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(932);
        // The noisy case: promotion after 2 batches of 10 (20 records), a plugin that releases
        // 30 % and rejects 10 % of its records; then long canaries, checked after every batch.
        for (trials, promote_after, size) in [(3_000, 2, 10), (300, 100, 10), (300, 50, 100)] {
            for t in 0..trials {
                let (d, tally) = run_canary(
                    &mut rng,
                    promote_after,
                    size,
                    (0.1, 0.3),
                    (0.1, 0.3),
                    1_000_000,
                );
                assert!(
                    matches!(d, CanaryDecision::Promote(_)),
                    "trial {t} (promote after {promote_after} batches of {size}): {d:?} after {tally:?}"
                );
            }
        }
    }

    #[test]
    fn a_candidate_rejecting_everything_is_rolled_back_within_its_minimum_sample() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(14);
        for size in [1, 10, 100] {
            for _ in 0..200 {
                // Never promoted by batches: only the rate rule can end it.
                let (d, tally) =
                    run_canary(&mut rng, u64::MAX, size, (1.0, 0.0), (0.1, 0.3), 100_000);
                assert!(
                    matches!(&d, CanaryDecision::RollBack(r) if r.contains("reject rate")),
                    "{d:?}"
                );
                assert!(
                    tally.records < MIN_CANARY_RECORDS_FOR_RATES + size as u64,
                    "rolled back after {} records (batches of {size})",
                    tally.records
                );
            }
        }
        // Promoted early on a small sample, it is still rolled back at promotion.
        let (d, _) = run_canary(&mut rng, 2, 10, (1.0, 0.0), (0.1, 0.3), 1_000);
        assert!(
            matches!(&d, CanaryDecision::RollBack(r) if r.contains("reject rate")),
            "{d:?}"
        );
    }

    #[test]
    fn shadow_comparison_counts_by_kind_and_keeps_coordinates() {
        let mut s = ShadowComparison::default();
        let coords = vec![
            ("t".to_owned(), 0, 1),
            ("t".to_owned(), 0, 2),
            ("t".to_owned(), 0, 3),
        ];
        s.compare(
            &coords,
            &[Verdict::Accept, Verdict::Accept, Verdict::Reject(None)],
            &[
                Verdict::Accept,
                Verdict::Reject(Some("no".into())),
                Verdict::Reject(None),
            ],
            Duration::from_micros(30),
        );
        let s = &s.status;
        assert_eq!(s.agreed.get("accept"), Some(&1));
        assert_eq!(s.agreed.get("reject"), Some(&1));
        assert_eq!(s.disagreed.get("accept→reject"), Some(&1));
        assert_eq!(s.first_disagreements[0].offset, 2);
        assert_eq!(s.first_disagreements[0].candidate, "reject: no");
        assert_eq!(s.us_per_record, 10.0);
    }

    #[test]
    fn a_bad_canary_request_names_the_field() {
        let mut r = canary(0.0, 1).request;
        assert!(r.validate().is_err_and(|e| e.contains("percent")));
        r.percent = 10.0;
        r.promote_after = PromoteAfter::default();
        assert!(r.validate().is_err_and(|e| e.contains("promote_after")));
    }
}
