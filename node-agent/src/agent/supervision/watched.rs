//! Whether the copy of an attempt a reconcile got from the watch's store is recent enough to act
//! on. The agent reads attempts only from its watch (no API read per attempt), and the watch
//! lags behind the agent's own writes: under load a launch's `MarkPrepared` was once decided on
//! a copy still `Pending` and skipped. So a reconcile never steps on a copy older than the
//! agent's own last write of that attempt (`Journal::last_written`).
//!
//! resourceVersions are opaque: only the order in which the watch shows them says which copy is
//! newer. [`Freshness`] remembers, per attempt, the last versions the watch showed (in order,
//! fed by the controller's stream before the reconcile each event triggers), so a copy is
//! current when it is the agent's write or was shown after it — also when another writer (the
//! operator's facts) moved the object on at once. A write the watch never shows (a re-list can
//! skip versions) is waited for at most [`WRITE_SEEN_WITHIN`]; after that the journal's
//! compare-and-swap still refuses a write decided on a stale copy.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How long a reconcile waits for the watch to show the agent's last write of an attempt
/// before it steps on the copy it has (a write is normally seen within milliseconds).
pub const WRITE_SEEN_WITHIN: Duration = Duration::from_secs(10);

/// How many of the versions the watch showed are remembered per attempt: more than the writes
/// one launch makes, so the agent's write is still remembered when the next reconcile runs.
const REMEMBERED: usize = 32;

/// What a reconcile may do with the copy it got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Step on it.
    Current,
    /// It predates the agent's own last write: wait at most this long for the watch (the event
    /// that shows the write triggers the next reconcile sooner).
    Behind(Duration),
}

/// The versions the watch showed, per attempt uid.
#[derive(Debug, Default)]
pub struct Freshness {
    by_uid: Mutex<HashMap<String, Shown>>,
}

#[derive(Debug, Default)]
struct Shown {
    /// In the order the watch showed them, the newest last.
    versions: VecDeque<String>,
    /// The agent's last write the checks know of, and when they first did.
    written: Option<(String, Instant)>,
}

impl Freshness {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Shown>> {
        // One insert or remove per use: a panic elsewhere leaves it consistent.
        self.by_uid
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The watch showed the attempt `uid` at `version`.
    pub fn shown(&self, uid: &str, version: &str) {
        let mut map = self.lock();
        let shown = map.entry(uid.to_owned()).or_default();
        if shown.versions.back().map(String::as_str) == Some(version) {
            return;
        }
        if shown.versions.len() == REMEMBERED {
            shown.versions.pop_front();
        }
        shown.versions.push_back(version.to_owned());
    }

    /// Whether a copy of `uid` at `copy` may be stepped on at `now`, given `written`, the
    /// version of the agent's own last write of it.
    pub fn check(
        &self,
        uid: &str,
        copy: Option<&str>,
        written: Option<&str>,
        now: Instant,
    ) -> Verdict {
        let Some(written) = written else {
            return Verdict::Current;
        };
        if copy == Some(written) {
            return Verdict::Current;
        }
        let mut map = self.lock();
        let shown = map.entry(uid.to_owned()).or_default();
        let at = |v: &str| shown.versions.iter().rposition(|x| x == v);
        if let (Some(w), Some(c)) = (at(written), copy.and_then(at))
            && c > w
        {
            return Verdict::Current;
        }
        // Not shown yet (or this copy is from before it): the clock runs from the first check
        // that knew of the write.
        let since = match &shown.written {
            Some((v, since)) if v == written => *since,
            _ => {
                shown.written = Some((written.to_owned(), now));
                now
            }
        };
        let waited = now.saturating_duration_since(since);
        if waited >= WRITE_SEEN_WITHIN {
            Verdict::Current
        } else {
            Verdict::Behind(WRITE_SEEN_WITHIN - waited)
        }
    }

    /// The attempt `uid` is gone.
    pub fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the watch's copy at version `seen` is behind the agent's own write of `written`
    /// at `at` (attempt `u`).
    fn behind(f: &Freshness, seen: &str, written: &str, at: Instant) -> bool {
        matches!(
            f.check("u", Some(seen), Some(written), at),
            Verdict::Behind(_)
        )
    }

    /// A tracker whose watch has shown version 1 of attempt `u`, and the time.
    fn shown_once() -> (Freshness, Instant) {
        let f = Freshness::default();
        f.shown("u", "1");
        (f, Instant::now())
    }

    #[test]
    fn without_a_write_of_its_own_any_copy_is_current() {
        let f = Freshness::default();
        assert_eq!(
            f.check("u", Some("1"), None, Instant::now()),
            Verdict::Current
        );
    }

    #[test]
    fn a_copy_from_before_the_agents_own_last_write_is_not_stepped_on() {
        let (f, now) = shown_once();
        // The launch wrote versions 2 to 4; the watch has shown only 2 so far.
        f.shown("u", "2");
        assert_eq!(
            f.check("u", Some("2"), Some("4"), now),
            Verdict::Behind(WRITE_SEEN_WITHIN)
        );
        f.shown("u", "3");
        assert!(matches!(
            f.check("u", Some("3"), Some("4"), now + Duration::from_secs(1)),
            Verdict::Behind(d) if d == WRITE_SEEN_WITHIN - Duration::from_secs(1)
        ));
        f.shown("u", "4");
        assert_eq!(
            f.check("u", Some("4"), Some("4"), now + Duration::from_secs(1)),
            Verdict::Current
        );
    }

    #[test]
    fn a_copy_shown_after_the_write_is_current_though_another_writer_moved_it_on() {
        let f = Freshness::default();
        f.shown("u", "4");
        // The operator wrote facts right after the agent's write: the store holds 5.
        f.shown("u", "5");
        assert_eq!(
            f.check("u", Some("5"), Some("4"), Instant::now()),
            Verdict::Current
        );
        // A copy the watch showed before the write is not.
        f.shown("u", "6");
        assert!(behind(&f, "5", "6", Instant::now()));
    }

    #[test]
    fn a_write_the_watch_never_shows_is_waited_for_at_most_the_bound() {
        let (f, now) = shown_once();
        assert!(behind(&f, "1", "2", now));
        // A re-list skipped version 2 and showed 7.
        f.shown("u", "7");
        assert!(behind(&f, "7", "2", now + WRITE_SEEN_WITHIN / 2));
        assert_eq!(
            f.check("u", Some("7"), Some("2"), now + WRITE_SEEN_WITHIN),
            Verdict::Current
        );
    }

    #[test]
    fn a_forgotten_attempt_starts_afresh() {
        let (f, now) = shown_once();
        assert!(behind(&f, "1", "2", now));
        f.forget("u");
        assert!(f.lock().is_empty());
    }
}
