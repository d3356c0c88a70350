//! Group commit of `status.pendingJobs` writes. A burst of deliveries for one policy (50 jobs
//! queued at once, then their `in_progress`) would otherwise be as many patches of one object,
//! each answered before GitHub's next delivery in that connection. Here the deliveries that
//! arrive while a patch of their policy is in flight are merged into the next one: a burst costs
//! a handful of writes, and every delivery is still answered only once its entry is written.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{Map, Value};
use tokio::sync::oneshot;

use crate::controller::writes::Writer;

/// Why a batched write failed (the API server's error, as text: one error answers every
/// delivery of the batch).
#[derive(Clone, Debug, thiserror::Error)]
#[error("writing status.pendingJobs: {0}")]
pub struct BatchError(String);

type Waiter = oneshot::Sender<Result<(), BatchError>>;

/// One policy's queue: entries waiting for the next patch, and who waits on it.
#[derive(Default)]
struct Queue {
    entries: Map<String, Value>,
    waiters: Vec<Waiter>,
}

#[derive(Default)]
struct PolicyBatch {
    queue: Mutex<Queue>,
    /// Held while a patch of this policy is in flight.
    writing: tokio::sync::Mutex<()>,
}

/// The batchers of every policy a delivery named.
#[derive(Default)]
pub struct LedgerBatches {
    policies: Mutex<HashMap<(String, String), Arc<PolicyBatch>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl LedgerBatches {
    /// Add (a timestamp) or remove (null) entries of a policy's ledger; returns once a patch
    /// holding them has been written. Entries of one batch apply in arrival order.
    pub async fn write(
        &self,
        writer: &Writer,
        namespace: &str,
        name: &str,
        entries: Map<String, Value>,
    ) -> Result<(), BatchError> {
        if entries.is_empty() {
            return Ok(());
        }
        let batch = lock(&self.policies)
            .entry((namespace.to_owned(), name.to_owned()))
            .or_default()
            .clone();
        let (tx, rx) = oneshot::channel();
        {
            let mut q = lock(&batch.queue);
            q.entries.extend(entries);
            q.waiters.push(tx);
        }
        {
            // Whoever holds the writer's turn sends everything queued so far, its own entries
            // included unless an earlier turn already sent them.
            let _turn = batch.writing.lock().await;
            let Queue { entries, waiters } = std::mem::take(&mut *lock(&batch.queue));
            if !waiters.is_empty() {
                let result = writer
                    .pending_jobs(namespace, name, entries)
                    .await
                    .map_err(|e| BatchError(e.to_string()));
                for w in waiters {
                    let _ = w.send(result.clone());
                }
            }
        }
        rx.await
            .unwrap_or_else(|_| Err(BatchError("the batch was dropped".into())))
    }
}

impl std::fmt::Debug for LedgerBatches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LedgerBatches").finish_non_exhaustive()
    }
}
