//! The one place a capability plugs into: the [`Capability`] trait, in the shape of Spin's
//! factors and of wasmtime's capability crates. Each thing a guest can reach (WASI's empty
//! context, `log`, `emit`, outbound HTTP) is one module whose store state implements it: how
//! the state is made from what the pipeline grants ([`Capability::new`]), which imports it
//! defines ([`Capability::add_to_linker`], through the `Host` traits `bindgen!` generates
//! where the bounded lift allows), what it does when a call into the guest starts and ends,
//! and which of the plugin's counters its report adds to ([`Capability::count`]).
//!
//! The store composes them: the `capabilities!` list in `store.rs` names each once, and the
//! macro below makes from it the store's [`Capabilities`], their linking, their per-call
//! hooks and the [`Ended`] reports of a call. Adding a capability is a module implementing
//! the trait and one line in that list (docs/wit.md, "Adding a capability").

use std::sync::Arc;

use wasmtime::component::Linker;

use crate::config::PluginLimits;
use crate::log::Stdio;
use crate::meter::CpuMeter;
use crate::plugin::PluginStats;
use crate::secrets::Secrets;
use crate::store::StoreState;

/// What a capability's store state is made from: one instance of one plugin.
pub(crate) struct Setup<'a> {
    /// The plugin's name (its file's), on every line a capability logs.
    pub(crate) plugin: &'a Arc<str>,
    /// The pipeline running it (`None` outside one), on those lines too.
    pub(crate) pipeline: &'a Option<Arc<str>>,
    /// The plugin's budgets and every grant of its pipeline (outputs, HTTP, ...).
    pub(crate) limits: &'a PluginLimits,
    /// The pipeline's secrets, redacted from everything a capability shows.
    pub(crate) secrets: &'a Arc<Secrets>,
    /// The guest's stdout and stderr: WASI writes to them, the log drains them.
    pub(crate) stdio: &'a Stdio,
}

/// A call into the guest that is about to start.
pub(crate) struct Call<'a> {
    /// Records of the batch a `handle` call judges; `None` for `init`.
    pub(crate) records: Option<u32>,
    /// The call's CPU meter: host work done for the call on other tasks is charged to it.
    pub(crate) meter: &'a Arc<CpuMeter>,
    /// The trace context the host judges this batch in (a W3C `traceparent`), handed on to
    /// the outbound requests the call makes; `None` when the host does not trace it.
    pub(crate) traceparent: Option<&'a http::HeaderValue>,
}

/// How a call ended, for the counters a capability keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// `init` ran (or failed) on a fresh instance.
    Init,
    /// `handle` returned verdicts.
    Judged,
    /// `handle` faulted: what it did is discarded.
    Faulted,
}

/// One capability of a plugin's store: its state, its imports, its per-call hooks and its
/// counters.
pub(crate) trait Capability: Sized + Send + 'static {
    /// What one call leaves behind: what the plugin hands on (emits, stderr) and counts.
    type Report;

    /// Its state for one instance, from what the pipeline grants. A capability the pipeline
    /// does not grant is still made: it refuses in the host (a value the guest sees), and
    /// whether a component may import it at all is decided at load (`validate.rs`).
    fn new(setup: &Setup<'_>) -> Self;

    /// Defines the imports it serves in the runtime's linker (once per engine).
    fn add_to_linker(linker: &mut Linker<StoreState>) -> wasmtime::Result<()>;

    /// A call into the guest starts: budgets of the call are full again.
    fn begin_call(&mut self, _call: &Call<'_>) {}

    /// The call ended (or was abandoned): what it left behind.
    fn end_call(&mut self) -> Self::Report;

    /// Adds what a call left behind to the plugin's counters.
    fn count(_report: &Self::Report, _outcome: Outcome, _stats: &mut PluginStats) {}
}

/// Makes, from the list of capabilities a store holds (`name: Type`, each `Type` a
/// [`Capability`]), the [`Capabilities`] struct with one field per capability, the [`Ended`]
/// struct with one report per capability, and the loops over them. Capabilities are made,
/// linked, begun and ended in the list's order.
macro_rules! capabilities {
    ($($(#[$doc:meta])* $name:ident: $ty:ty,)+) => {
        /// The state of every capability of one store, one field each.
        pub(crate) struct Capabilities {
            $($(#[$doc])* pub(crate) $name: $ty,)+
        }

        /// What a call left behind, one report per capability.
        pub(crate) struct Ended {
            $($(#[$doc])* pub(crate) $name: <$ty as $crate::capability::Capability>::Report,)+
        }

        impl Capabilities {
            /// Every capability's state for one instance.
            fn new(setup: &$crate::capability::Setup<'_>) -> Self {
                Self {
                    $($name: <$ty as $crate::capability::Capability>::new(setup),)+
                }
            }

            /// Defines every capability's imports in `linker`.
            fn add_to_linker(
                linker: &mut ::wasmtime::component::Linker<StoreState>,
            ) -> ::wasmtime::Result<()> {
                $(<$ty as $crate::capability::Capability>::add_to_linker(linker)?;)+
                Ok(())
            }

            /// A call into the guest starts.
            fn begin_call(&mut self, call: &$crate::capability::Call<'_>) {
                $($crate::capability::Capability::begin_call(&mut self.$name, call);)+
            }

            /// The call ended: every capability's report.
            fn end_call(&mut self) -> Ended {
                Ended {
                    $($name: $crate::capability::Capability::end_call(&mut self.$name),)+
                }
            }
        }

        impl Ended {
            /// Adds every report to the plugin's counters.
            pub(crate) fn count(
                &self,
                outcome: $crate::capability::Outcome,
                stats: &mut $crate::plugin::PluginStats,
            ) {
                $(<$ty as $crate::capability::Capability>::count(&self.$name, outcome, stats);)+
            }
        }
    };
}

pub(crate) use capabilities;
