//! The pipelines of one host as tenants: each loads, runs and fails on its own. A pipeline whose
//! component cannot be loaded or initialised, or whose run fails, is reported failed (here,
//! in `GET /pipelines`, `/readyz`, a metric and the log) and tried again with backoff while
//! the others run; one tenant's broken configuration never stops another's records.
//!
//! The set of tenants changes while the host runs: a manifest re-read adds and removes
//! pipelines ([`Tenants::add`], [`Tenants::remove`]); how the last re-read went is kept here
//! too ([`ManifestStatus`], `GET /manifest`).

use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Instant;

use sharehost_api::{Failure, ManifestStatus, TenantStatus};

use crate::pipeline::Pipeline;

/// Where one tenant is.
#[derive(Clone)]
enum Slot {
    /// Not loaded yet (the first attempt is under way).
    Loading,
    /// Loaded: running, or being run again after a failure.
    Loaded(Arc<Pipeline>),
    /// The last attempt to load or run it failed; another follows after a backoff.
    Failed(Failed),
}

/// Why a tenant is not running, and since when: shown as a [`Failure`].
#[derive(Debug, Clone)]
struct Failed {
    /// What went wrong the last time.
    error: String,
    /// Attempts so far (to load, or to run once loaded).
    attempts: u32,
    /// When the first failure in a row happened.
    since: Instant,
}

/// Every tenant of the host, by manifest order.
pub struct Tenants {
    slots: Mutex<Vec<(String, Arc<Mutex<Slot>>)>>,
    manifest: Mutex<ManifestStatus>,
}

impl Tenants {
    /// Tenants named `names`, none loaded yet.
    pub fn new(names: impl IntoIterator<Item = String>) -> Tenants {
        Tenants {
            slots: Mutex::new(
                names
                    .into_iter()
                    .map(|n| (n, Arc::new(Mutex::new(Slot::Loading))))
                    .collect(),
            ),
            manifest: Mutex::new(ManifestStatus::default()),
        }
    }

    /// Tenants that are all loaded already (tests, `check`).
    pub fn loaded(pipelines: &[Arc<Pipeline>]) -> Tenants {
        let t = Tenants::new(pipelines.iter().map(|p| p.name().to_owned()));
        for p in pipelines {
            t.set_loaded(p.clone());
        }
        t
    }

    fn slot(&self, name: &str) -> Option<Arc<Mutex<Slot>>> {
        self.slots
            .lock()
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s.clone())
    }

    /// Every slot, in manifest order (a copy: a slot's own lock is never taken under the
    /// list's).
    fn all(&self) -> Vec<(String, Arc<Mutex<Slot>>)> {
        self.slots.lock().clone()
    }

    /// Adds a tenant named `name` (not loaded yet) at the end; one that is there already is
    /// left as it is (loaded at start, say).
    pub fn add(&self, name: &str) {
        let mut slots = self.slots.lock();
        if !slots.iter().any(|(n, _)| n == name) {
            slots.push((name.to_owned(), Arc::new(Mutex::new(Slot::Loading))));
        }
    }

    /// Makes the tenant `name` loading again, its pipeline forgotten (a pipeline restarted
    /// with a changed manifest table: the next load reads the new table).
    pub fn reset(&self, name: &str) {
        if let Some(slot) = self.slot(name) {
            *slot.lock() = Slot::Loading;
        }
    }

    /// Removes the tenant named `name` (a pipeline the manifest no longer has, once it has
    /// drained).
    pub fn remove(&self, name: &str) {
        self.slots.lock().retain(|(n, _)| n != name);
    }

    /// How the manifest was last read.
    pub fn manifest_status(&self) -> ManifestStatus {
        self.manifest.lock().clone()
    }

    /// Changes the manifest's status with `f`.
    pub fn update_manifest_status(&self, f: impl FnOnce(&mut ManifestStatus)) {
        f(&mut self.manifest.lock());
    }

    /// Records that `pipeline` is loaded (it keeps that place until it fails again).
    pub fn set_loaded(&self, pipeline: Arc<Pipeline>) {
        if let Some(slot) = self.slot(pipeline.name()) {
            *slot.lock() = Slot::Loaded(pipeline);
        }
    }

    /// Records a failed attempt to load tenant `name` (`error` says why); returns how many
    /// attempts have failed in a row. (A loaded pipeline whose run fails stays loaded and says
    /// so in its own status while it is run again.)
    pub fn set_failed(&self, name: &str, error: String) -> u32 {
        let Some(slot) = self.slot(name) else {
            return 0;
        };
        let mut slot = slot.lock();
        let (attempts, since) = match &*slot {
            Slot::Failed(f) => (f.attempts + 1, f.since),
            _ => (1, Instant::now()),
        };
        *slot = Slot::Failed(Failed {
            error,
            attempts,
            since,
        });
        attempts
    }

    /// The loaded pipelines.
    pub fn pipelines(&self) -> Vec<Arc<Pipeline>> {
        self.all()
            .iter()
            .filter_map(|(_, s)| match &*s.lock() {
                Slot::Loaded(p) => Some(p.clone()),
                _ => None,
            })
            .collect()
    }

    /// The loaded pipeline named `name`.
    pub fn find(&self, name: &str) -> Option<Arc<Pipeline>> {
        let slot = self.slot(name)?;
        let slot = slot.lock();
        match &*slot {
            Slot::Loaded(p) => Some(p.clone()),
            _ => None,
        }
    }

    /// Every tenant's status, in manifest order (a tenant still loading is left out).
    pub fn status(&self) -> Vec<TenantStatus> {
        self.all()
            .iter()
            .filter_map(|(name, s)| match s.lock().clone() {
                Slot::Loading => None,
                Slot::Loaded(p) => Some(TenantStatus::Pipeline(Box::new(p.status()))),
                Slot::Failed(f) => Some(TenantStatus::Failed(Failure {
                    name: name.clone(),
                    state: "failed".to_owned(),
                    error: f.error,
                    attempts: f.attempts,
                    failing_for_s: f.since.elapsed().as_secs(),
                })),
            })
            .collect()
    }

    /// `Ok` when every tenant is loaded, in its group and able to write (state `running`);
    /// otherwise which are not and why, one line each.
    pub fn ready(&self) -> Result<(), String> {
        let mut not = Vec::new();
        for (name, s) in &self.all() {
            match s.lock().clone() {
                Slot::Loading => not.push(format!("{name}: loading")),
                Slot::Failed(f) => not.push(format!("{name}: failed: {}", f.error)),
                Slot::Loaded(p) => {
                    let status = p.status();
                    if !status.unmapped_outputs.is_empty() {
                        not.push(format!(
                            "{name}: misconfigured: the plugin emits to outputs [pipeline.outputs] does not map: {}",
                            status.unmapped_outputs.join(", ")
                        ));
                    } else if status.state != "running" {
                        let why = status.last_error.map(|e| format!(": {e}"));
                        not.push(format!(
                            "{name}: {}{}",
                            status.state,
                            why.unwrap_or_default()
                        ));
                    }
                }
            }
        }
        if not.is_empty() {
            Ok(())
        } else {
            Err(not.join("\n"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adding_a_tenant_that_is_there_keeps_it_and_a_reset_one_loads_again() {
        let t = Tenants::new(["a".to_owned()]);
        t.set_failed("a", "x".into());
        t.add("a");
        t.add("b");
        let listed = serde_json::to_value(t.status()).expect("json");
        assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
        assert_eq!(listed[0]["state"], "failed", "a kept as it was: {listed}");
        t.reset("a");
        assert!(t.status().is_empty(), "a loading again, b loading");
        t.remove("b");
        assert!(t.ready().expect_err("a loading").contains("a: loading"));
    }

    #[test]
    fn a_failed_tenant_is_listed_with_its_attempts_and_keeps_the_host_unready() {
        let t = Tenants::new(["a".to_owned(), "b".to_owned()]);
        let not = t.ready().expect_err("nothing loaded yet");
        assert!(
            not.contains("a: loading") && not.contains("b: loading"),
            "{not}"
        );
        assert!(
            t.status().is_empty(),
            "a tenant still loading is not listed"
        );
        assert_eq!(t.set_failed("b", "init refused".into()), 1);
        assert_eq!(t.set_failed("b", "init refused again".into()), 2);
        let listed = serde_json::to_value(t.status()).expect("json");
        assert_eq!(listed[0]["name"], "b");
        assert_eq!(listed[0]["state"], "failed");
        assert_eq!(listed[0]["attempts"], 2);
        assert_eq!(listed[0]["error"], "init refused again");
        let not = t.ready().expect_err("b failed");
        assert!(not.contains("b: failed: init refused again"), "{not}");
        assert_eq!(
            t.set_failed("nobody", "x".into()),
            0,
            "an unknown name is ignored"
        );
    }
}
