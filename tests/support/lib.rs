//! Support for the integration tests in `tests/*.rs`, by subject; the helpers every test
//! uses are re-exported here, so a test imports `sharehost_tests::{bootstrap, guest, ...}`.
//!
//! A test that needs the broker and cannot reach it FAILS with instructions; it never skips.

use std::path::PathBuf;

pub mod broker;
pub mod cluster;
pub mod fake_broker;
pub mod fleet;
pub mod guests;
pub mod host;
pub mod http;
pub mod ledger;
pub mod manifests;
pub mod pods;
pub mod proxy;
pub mod signing;
pub mod topics;

pub use broker::*;
pub use guests::*;
pub use http::*;
pub use manifests::*;
pub use topics::*;

/// The repository root (this library is `tests/support` in it).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(PathBuf::from)
        .unwrap_or_default()
}

/// A name no other test run uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// Installs a test log subscriber once (RUST_LOG-style filter from `SHAREHOST_LOG`).
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SHAREHOST_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

/// Runs blocking work (a child process, a tool) off the test's async workers.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("join")
}

/// A `tracing` writer that keeps everything in memory, so a test can read what was logged.
#[derive(Clone, Default)]
pub struct CapturedLog(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl CapturedLog {
    /// Everything written so far, as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
}

impl std::io::Write for CapturedLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
