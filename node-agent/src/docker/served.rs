//! The job sockets an agent serves ([`super::proxy`]), by attempt: what the agent's launch,
//! supervision and clean-up share.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

/// The sockets served to live runners, by attempt name (12 hex).
pub struct DockerJobs {
    podman: PathBuf,
    served: Mutex<BTreeMap<String, tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for DockerJobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerJobs")
            .field("podman", &self.podman)
            .finish_non_exhaustive()
    }
}

impl DockerJobs {
    pub fn new(podman: PathBuf) -> Self {
        Self {
            podman,
            served: Mutex::new(BTreeMap::new()),
        }
    }

    fn served(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, tokio::task::JoinHandle<()>>> {
        self.served
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Serves `short`'s socket with `handle`, ending any earlier one.
    pub fn insert(&self, short: &str, handle: tokio::task::JoinHandle<()>) {
        if let Some(old) = self.served().insert(short.to_owned(), handle) {
            old.abort();
        }
    }

    /// Where the node's systemd finds Podman.
    pub fn podman(&self) -> &std::path::Path {
        &self.podman
    }

    pub fn is_served(&self, short: &str) -> bool {
        self.served().get(short).is_some_and(|h| !h.is_finished())
    }

    /// Stops serving `short`'s socket (every open connection with it).
    pub fn close(&self, short: &str) {
        if let Some(handle) = self.served().remove(short) {
            handle.abort();
        }
    }
}
