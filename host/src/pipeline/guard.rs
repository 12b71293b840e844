//! Locks of the pipeline's plain bookkeeping.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, also when poisoned: a poisoned lock only means a task panicked mid-update of
/// plain bookkeeping, and the numbers are still worth more than a second panic.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
