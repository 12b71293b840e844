//! The `sharehost` subcommands, one file each, where a newcomer looks for them: `run` (and
//! `check`), `test-plugin`, `probe`, `ctl`, `fleet`, `new`, `build` (and `dev`), and `create-topics`, `produce`
//! and `consume` (`topics.rs`). `dlq`'s arguments and printing
//! live in the library beside its typed reading ([`sharehost::dlq`]), which the console calls too.

pub(crate) mod build;
pub(crate) mod ctl;
pub(crate) mod fleet;
pub(crate) mod new;
pub(crate) mod probe;
pub(crate) mod run;
pub(crate) mod test_plugin;
pub(crate) mod topics;
