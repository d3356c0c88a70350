//! The host allocation lock: slot choice, lease recording and package pruning happen under it,
//! so a prune never removes a version an allocation is about to lease.

use tokio::sync::{Mutex, MutexGuard};

/// One per agent.
#[derive(Debug, Default)]
pub struct AllocationLock {
    inner: Mutex<()>,
}

/// Proof that the allocation lock is held; functions that must run under it take one.
#[derive(Debug)]
pub struct AllocationGuard<'a> {
    _held: MutexGuard<'a, ()>,
}

impl AllocationLock {
    pub async fn lock(&self) -> AllocationGuard<'_> {
        AllocationGuard {
            _held: self.inner.lock().await,
        }
    }
}
