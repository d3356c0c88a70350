//! One attempt as the agent's watch shows it: what an attempt's task reads instead of asking the
//! API server. The watcher keeps a reflector store of the node's attempts and wakes the task of
//! an attempt whose object changed, so supervision costs no API read per attempt: a task steps
//! when its object changes, and otherwise once per poll interval (the runner's process and files
//! are what it then looks at, not the API).

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::reflector::{ObjectRef, Store};
use runner_manager_crds::attempt::RunnerAttempt;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How long a task that just wrote waits for the watch to show its write before it steps on the
/// object it has (a write it made is normally seen within milliseconds; this bounds a stalled
/// watch, after which the journal's compare-and-swap refuses a decision on the stale copy).
const WRITE_SEEN_WITHIN: Duration = Duration::from_secs(10);

/// The watched attempt of one task.
#[derive(Debug)]
pub struct Watched {
    store: Store<RunnerAttempt>,
    key: ObjectRef<RunnerAttempt>,
    uid: String,
    changed: Arc<Notify>,
    poll: Duration,
    /// The resourceVersion last handed out and when.
    last: Option<(Option<String>, Instant)>,
    /// The last step wrote: wait for a newer object than the one it stepped on.
    wrote: bool,
    /// The agent's last write of this attempt (`journal::last_written`) once the store showed it.
    caught_up: Option<String>,
}

impl Watched {
    /// The attempt `namespace/name` with `uid` in `store`; `changed` is notified by the watcher
    /// whenever that object changes.
    pub fn new(
        store: Store<RunnerAttempt>,
        namespace: &str,
        name: &str,
        uid: &str,
        changed: Arc<Notify>,
        poll: Duration,
    ) -> Self {
        Self {
            store,
            key: ObjectRef::new(name).within(namespace),
            uid: uid.to_owned(),
            changed,
            poll,
            last: None,
            wrote: false,
            caught_up: None,
        }
    }

    /// The last step wrote the journal: the next read waits until the watch shows the write.
    pub fn wrote(&mut self) {
        self.wrote = true;
    }

    /// The attempt now, or `None` once it is gone (deleted, or replaced by a new object of the
    /// same name).
    fn current(&self) -> Option<Arc<RunnerAttempt>> {
        self.store
            .get(&self.key)
            .filter(|a| a.metadata.uid.as_deref() == Some(self.uid.as_str()))
    }

    /// The attempt to step on next: at once when it changed since the last read; after a write,
    /// once the watch shows a change (at most [`WRITE_SEEN_WITHIN`]); otherwise when it changes
    /// or a poll interval after the last read. `None` once it is gone.
    pub async fn next(&mut self) -> Option<Arc<RunnerAttempt>> {
        let asked = Instant::now();
        loop {
            let current = self.current()?;
            let version = current.metadata.resource_version.clone();
            // Never a copy from before the agent's own last write of it: the watch shows every
            // version in order, so once it showed that one, whatever it shows next is newer.
            if let Some(written) = crate::journal::last_written(&self.uid)
                && self.caught_up.as_ref() != Some(&written)
            {
                if version.as_ref() != Some(&written)
                    && asked.elapsed() < WRITE_SEEN_WITHIN
                    && tokio::time::timeout_at(asked + WRITE_SEEN_WITHIN, self.changed.notified())
                        .await
                        .is_ok()
                {
                    continue;
                }
                // Shown, or skipped by a re-list of the watch (then the CAS still refuses a
                // write decided on a stale copy).
                self.caught_up = Some(written);
            }
            if let Some((last, at)) = &self.last
                && *last == version
            {
                let due = *at
                    + if self.wrote {
                        WRITE_SEEN_WITHIN
                    } else {
                        self.poll
                    };
                if Instant::now() < due
                    && tokio::time::timeout_at(due, self.changed.notified())
                        .await
                        .is_ok()
                {
                    continue;
                }
            }
            self.wrote = false;
            self.last = Some((version, Instant::now()));
            return Some(current);
        }
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        crate::journal::forget_written(&self.uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher::Event;

    fn attempt(version: &str, uid: &str) -> RunnerAttempt {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "runner-manager.dev/v1alpha1", "kind": "RunnerAttempt",
            "metadata": {"name": "web-1", "namespace": "team", "uid": uid, "resourceVersion": version},
            "spec": {"id": "00000000-0000-4000-8000-000000000001", "policy": "web", "nodeName": "n",
                     "snapshot": {"policyUid": "u", "target": {"url": "https://github.com/a/b", "scope": "Repository"},
                                  "labels": ["x"], "runnerGroupId": 1, "workspace": "Ephemeral", "maxSlots": 1,
                                  "execution": {"mode": "Native"},
                                  "runner": {"version": "2.330.0", "url": "https://x/y.tar.gz", "sha256": "a".repeat(64)},
                                  "timeouts": {"registration": "5m", "idle": "10m", "jitHandoff": "2m"}}}
        }))
        .unwrap()
    }

    fn setup(
        poll: Duration,
    ) -> (
        kube::runtime::reflector::store::Writer<RunnerAttempt>,
        Watched,
        Arc<Notify>,
    ) {
        let (store, writer) = kube::runtime::reflector::store();
        let changed = Arc::new(Notify::new());
        let watched = Watched::new(store, "team", "web-1", "u1", Arc::clone(&changed), poll);
        (writer, watched, changed)
    }

    #[tokio::test]
    async fn an_unchanged_attempt_is_stepped_on_once_per_poll() {
        let poll = Duration::from_millis(200);
        let (mut writer, mut watched, _) = setup(poll);
        writer.apply_watcher_event(&Event::Apply(attempt("1", "u1")));
        let start = Instant::now();
        assert!(watched.next().await.is_some());
        assert!(start.elapsed() < poll, "the first read is at once");
        assert!(watched.next().await.is_some());
        assert!(start.elapsed() >= poll, "then once per poll interval");
    }

    #[tokio::test]
    async fn a_change_wakes_the_task_before_the_poll_interval_ends() {
        let (mut writer, mut watched, changed) = setup(Duration::from_secs(600));
        writer.apply_watcher_event(&Event::Apply(attempt("1", "u1")));
        watched.next().await.unwrap();
        let woke = tokio::spawn(async move { watched.next().await.unwrap() });
        writer.apply_watcher_event(&Event::Apply(attempt("2", "u1")));
        changed.notify_one();
        let a = tokio::time::timeout(Duration::from_secs(30), woke)
            .await
            .expect("woken by the change, not the 600 s interval")
            .unwrap();
        assert_eq!(a.metadata.resource_version.as_deref(), Some("2"));
    }

    #[tokio::test]
    async fn after_a_write_the_task_waits_for_the_watch_to_show_it() {
        let poll = Duration::from_millis(20);
        let (mut writer, mut watched, changed) = setup(poll);
        writer.apply_watcher_event(&Event::Apply(attempt("1", "u1")));
        watched.next().await.unwrap();
        watched.wrote();
        let seen = tokio::spawn(async move { watched.next().await.unwrap() });
        // Many poll intervals pass: the copy the write made stale is not handed out.
        tokio::time::sleep(poll * 15).await;
        assert!(!seen.is_finished());
        writer.apply_watcher_event(&Event::Apply(attempt("2", "u1")));
        changed.notify_one();
        let a = tokio::time::timeout(Duration::from_secs(30), seen)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(a.metadata.resource_version.as_deref(), Some("2"));
    }

    #[tokio::test]
    async fn a_copy_from_before_the_agents_own_last_write_is_not_handed_out() {
        let (store, mut writer) = kube::runtime::reflector::store();
        let changed = Arc::new(Notify::new());
        let uid = "u-own-write";
        let mut watched = Watched::new(
            store,
            "team",
            "web-1",
            uid,
            Arc::clone(&changed),
            Duration::from_millis(10),
        );
        writer.apply_watcher_event(&Event::Apply(attempt("1", uid)));
        watched.next().await.unwrap();
        // The launch wrote three versions; the watch has shown only the first of them.
        crate::journal::record_written(&attempt("4", uid));
        writer.apply_watcher_event(&Event::Apply(attempt("2", uid)));
        let seen = tokio::spawn(async move {
            let a = watched.next().await.unwrap();
            (a.metadata.resource_version.clone(), watched)
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!seen.is_finished(), "version 2 predates the agent's write");
        writer.apply_watcher_event(&Event::Apply(attempt("3", uid)));
        changed.notify_one();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!seen.is_finished(), "so does version 3");
        writer.apply_watcher_event(&Event::Apply(attempt("4", uid)));
        changed.notify_one();
        let (version, watched) = tokio::time::timeout(Duration::from_secs(30), seen)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(version.as_deref(), Some("4"));
        drop(watched);
        assert_eq!(
            crate::journal::last_written(uid),
            None,
            "forgotten with the task"
        );
    }

    #[tokio::test]
    async fn a_deleted_or_replaced_attempt_is_gone() {
        let (mut writer, mut watched, _) = setup(Duration::from_millis(10));
        writer.apply_watcher_event(&Event::Apply(attempt("1", "u1")));
        assert!(watched.next().await.is_some());
        // Replaced by a new object of the same name.
        writer.apply_watcher_event(&Event::Apply(attempt("2", "u2")));
        assert!(watched.next().await.is_none());
        writer.apply_watcher_event(&Event::Delete(attempt("2", "u2")));
        assert!(watched.next().await.is_none());
    }
}
