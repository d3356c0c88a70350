//! The controllers' writes to the API server, each a merge patch of the writer's own fields (or a
//! create/delete), counted by kind so the writes per attempt can be measured (DESIGN §10).

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use runner_manager_crds::attempt::{AttemptFacts, RunnerAttempt, TerminationReason};
use runner_manager_crds::patch::facts_patch;
use runner_manager_crds::policy::ScalePolicy;
use serde_json::json;

use crate::metrics::Metrics;

pub const FIELD_MANAGER: &str = "runner-manager-operator";

/// Closed vocabulary of write kinds (the `kind` label of `runner_manager_api_writes_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteKind {
    AttemptCreate,
    AttemptFacts,
    AttemptTermination,
    AttemptEdge,
    AttemptFinalizer,
    AttemptDelete,
    PolicyStatus,
    PolicyFinalizer,
    PolicyAnnotations,
    PendingJobs,
    Event,
}

impl WriteKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AttemptCreate => "attempt_create",
            Self::AttemptFacts => "attempt_facts",
            Self::AttemptTermination => "attempt_termination",
            Self::AttemptEdge => "attempt_edge",
            Self::AttemptFinalizer => "attempt_finalizer",
            Self::AttemptDelete => "attempt_delete",
            Self::PolicyStatus => "policy_status",
            Self::PolicyFinalizer => "policy_finalizer",
            Self::PolicyAnnotations => "policy_annotations",
            Self::PendingJobs => "pending_jobs",
            Self::Event => "event",
        }
    }
}

/// The writer: a client and where writes are counted.
#[derive(Clone)]
pub struct Writer {
    pub kube: kube::Client,
    pub metrics: std::sync::Arc<Metrics>,
    /// The policy versions this process's own finalizer and status writes produced.
    pub echoes: std::sync::Arc<Echoes>,
}

/// What this process's own policy finalizer and status writes produced, until the watch shows
/// it: the versions they returned (echoes) and the newest object they returned (read-your-writes).
///
/// **Echoes.** The writer knew the object it wrote: reconciling the policy again for it is work
/// for nothing (a fresh install's first round reconciled each policy three times, once for its
/// own finalizer write and once for its own status write). Any other change to the policy (a
/// spec edit, a webhook's `pendingJobs` entry, another writer) has a version of its own and still
/// triggers. A version the watch never shows (a relist skipped it) is dropped once newer ones
/// pushed it out. The writes are merge patches: the version one returns can hold another
/// writer's change the cache has not shown (a webhook's `pendingJobs` entry written just before;
/// a no-op write returns the current version). So a version is recorded as an echo only when the
/// returned object holds nothing the reconcile did not read ([`only_ours`]); otherwise its event
/// triggers as usual.
///
/// **Read-your-writes.** A reconcile of the same policy can start before the reflector has
/// shown the previous reconcile's writes (a resync round, an attempt or a Lease mapped to it):
/// from the store's copy it would send the finalizer's compare-and-swap on the version the last
/// write replaced (409, a failed reconcile, a backoff) or the same status again. So the object
/// each successful write returned is kept with the versions it supersedes (the one the write
/// was decided on, and those the same process's earlier writes replaced), and a reconcile that
/// finds the store still at one of those versions works from the written object instead
/// ([`Echoes::fresher`]). resourceVersions are opaque: only equality is used. The written
/// object is newer than each version it supersedes (a compare-and-swap was applied on that
/// version, a merge patch on it or on a later one), so it is never older than the store's copy
/// it replaces; a store at any other version (the written one, or someone else's newer one) is
/// the store caught up, and the entry is dropped.
#[derive(Debug, Default)]
pub struct Echoes(std::sync::Mutex<std::collections::HashMap<String, Mine>>);

/// One policy's entry (`namespace/name`).
#[derive(Debug, Default)]
struct Mine {
    /// Versions our own writes returned that no reconcile needs to see.
    echoes: Vec<String>,
    latest: Option<Latest>,
}

/// The newest object this process's writes of one policy returned.
#[derive(Debug)]
struct Latest {
    /// The written object's uid: a policy deleted and created again under its name is another.
    uid: String,
    /// The versions the written object supersedes (bounded by [`SUPERSEDED_PER_POLICY`]).
    supersedes: Vec<String>,
    written: std::sync::Arc<ScalePolicy>,
}

/// Versions kept per policy: a reconcile writes at most a finalizer and a status.
const ECHOES_PER_POLICY: usize = 4;

/// Superseded versions kept per policy. A store lagging by more of our writes than this shows
/// the oldest as it is, as before read-your-writes: a spurious write, never a wrong decision.
const SUPERSEDED_PER_POLICY: usize = 8;

/// Whether `written` (a write's response) holds what the reconcile read in `read` and nothing
/// else that a reconcile acts on, `finalizers` being the list the write left (the read one for
/// a status write). Status fields other than `pendingJobs` are the leader's own.
fn only_ours(read: &ScalePolicy, finalizers: Option<&[String]>, written: &ScalePolicy) -> bool {
    let (r, w) = (&read.metadata, &written.metadata);
    let pending = |p: &ScalePolicy| p.status.as_ref().map(|s| s.pending_jobs.clone());
    r.generation == w.generation
        && r.deletion_timestamp == w.deletion_timestamp
        && r.annotations == w.annotations
        && finalizers.unwrap_or(r.finalizers.as_deref().unwrap_or_default())
            == w.finalizers.as_deref().unwrap_or_default()
        && pending(read).unwrap_or_default() == pending(written).unwrap_or_default()
}

fn key_of(p: &ScalePolicy) -> Option<String> {
    Some(format!(
        "{}/{}",
        p.metadata.namespace.as_deref()?,
        p.metadata.name.as_deref()?
    ))
}

impl Echoes {
    /// Record `written`, the response to a write decided on `read`: as the policy's newest
    /// object, and its version as an echo if it is only that write (see [`only_ours`]).
    fn record_written(
        &self,
        read: &ScalePolicy,
        finalizers: Option<&[String]>,
        written: Option<ScalePolicy>,
    ) {
        let Some(written) = written else { return };
        if only_ours(read, finalizers, &written)
            && let Some(k) = key_of(read)
        {
            self.record_key(&k, written.metadata.resource_version.clone());
        }
        self.wrote(read, written);
    }

    /// Keep `written` (a successful write's response, decided on `read`) as the policy's newest
    /// object: it supersedes `read`'s version and whatever the entry it replaces superseded.
    /// Only the policy's reconcile records here, and the Controller runs one reconcile of a
    /// policy at a time, whose writes are sequential: so each recorded object is newer than the
    /// one before. (The scale-set listener's finalizer writes, concurrent with the reconcile,
    /// are not recorded: an older response recorded after a newer one would be taken for it.)
    fn wrote(&self, read: &ScalePolicy, mut written: ScalePolicy) {
        let (Some(k), Some(uid), Some(read_version)) = (
            key_of(read),
            written.metadata.uid.clone(),
            read.metadata.resource_version.clone(),
        ) else {
            return;
        };
        if written.metadata.resource_version.is_none() || read.metadata.uid.as_ref() != Some(&uid) {
            return;
        }
        // As the reflector keeps it (`cache::reflect`).
        written.metadata.managed_fields = None;
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mine = all.entry(k).or_default();
        let mut supersedes = match mine.latest.take() {
            Some(before) if before.uid == uid => {
                let mut v = before.supersedes;
                v.extend(before.written.metadata.resource_version.clone());
                v
            }
            _ => Vec::new(),
        };
        supersedes.push(read_version);
        supersedes.dedup();
        if let Some(own) = &written.metadata.resource_version {
            // A no-op write returns the version it was sent on: that is the store caught up.
            supersedes.retain(|v| v != own);
        }
        let extra = supersedes.len().saturating_sub(SUPERSEDED_PER_POLICY);
        supersedes.drain(..extra);
        mine.latest = Some(Latest {
            uid,
            supersedes,
            written: std::sync::Arc::new(written),
        });
    }

    /// The object a reconcile should work from: `cached` (the store's copy), or the newer one
    /// this process wrote when the store still shows a version that write superseded. An entry
    /// the store has caught up with is dropped.
    pub fn fresher(&self, cached: std::sync::Arc<ScalePolicy>) -> std::sync::Arc<ScalePolicy> {
        let Some(k) = key_of(&cached) else {
            return cached;
        };
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let Some(mine) = all.get_mut(&k) else {
            return cached;
        };
        let Some(latest) = &mine.latest else {
            return cached;
        };
        let behind = cached.metadata.uid.as_ref() == Some(&latest.uid)
            && cached
                .metadata
                .resource_version
                .as_ref()
                .is_some_and(|v| latest.supersedes.contains(v));
        if behind {
            return latest.written.clone();
        }
        mine.latest = None;
        if mine.echoes.is_empty() {
            all.remove(&k);
        }
        cached
    }

    #[cfg(test)]
    fn record(&self, namespace: &str, name: &str, version: Option<String>) {
        self.record_key(&format!("{namespace}/{name}"), version);
    }

    fn record_key(&self, k: &str, version: Option<String>) {
        let Some(version) = version else { return };
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mine = all.entry(k.to_owned()).or_default();
        if mine.echoes.len() >= ECHOES_PER_POLICY {
            mine.echoes.remove(0);
        }
        mine.echoes.push(version);
    }

    /// Whether `p` as observed is exactly an object this process wrote (forgotten once asked).
    pub fn is_echo(&self, p: &ScalePolicy) -> bool {
        let (Some(k), Some(version)) = (key_of(p), p.metadata.resource_version.as_deref()) else {
            return false;
        };
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let Some(mine) = all.get_mut(&k) else {
            return false;
        };
        let Some(at) = mine.echoes.iter().position(|v| v == version) else {
            return false;
        };
        // Older versions than this one will not be shown any more.
        mine.echoes.drain(..=at);
        // The store shows the newest object we wrote: nothing to read around any more.
        if mine
            .latest
            .as_ref()
            .is_some_and(|l| l.written.metadata.resource_version.as_deref() == Some(version))
        {
            mine.latest = None;
        }
        if mine.echoes.is_empty() && mine.latest.is_none() {
            all.remove(&k);
        }
        true
    }

    /// Forget the policies that are gone (`live`: `namespace/name` of those cached).
    pub fn retain(&self, live: &std::collections::HashSet<String>) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| live.contains(k));
    }
}

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    }
}

/// The written policy's resourceVersion; a policy already gone is no error.
fn written(r: Result<ScalePolicy, kube::Error>) -> Result<Option<ScalePolicy>, kube::Error> {
    match r {
        Ok(p) => Ok(Some(p)),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

/// What a compare-and-swap write found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cas {
    Written,
    /// The object is gone: nothing to write.
    Gone,
    /// The object changed since the version the write was decided on.
    Conflict,
}

fn ignore_gone<T>(r: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

impl Writer {
    fn count(&self, kind: WriteKind) {
        self.metrics.api_write(kind.as_str());
    }

    pub fn attempts(&self, namespace: &str) -> Api<RunnerAttempt> {
        Api::namespaced(self.kube.clone(), namespace)
    }

    pub fn policies(&self, namespace: &str) -> Api<ScalePolicy> {
        Api::namespaced(self.kube.clone(), namespace)
    }

    /// Creates an attempt in its runner's trace: a span `runner.create` (linked to the reconcile
    /// that decided it) whose `traceparent` the attempt carries, so the agent's launch spans join
    /// it. Its parent is the webhook delivery that recorded the policy's oldest unserved job, or
    /// a link to the poll that found it (`telemetry::origin`); without either it is the root.
    /// Without OpenTelemetry the attempt carries no annotation.
    pub async fn create_attempt(&self, a: &RunnerAttempt) -> Result<RunnerAttempt, kube::Error> {
        use tracing::Instrument;
        self.count(WriteKind::AttemptCreate);
        let ns = a.metadata.namespace.as_deref().unwrap_or_default();
        let span = tracing::info_span!(
            parent: None,
            "runner.create",
            attempt.namespace = ns,
            attempt.name = a.metadata.name.as_deref().unwrap_or_default(),
            node = a.spec.node_name.as_str(),
        );
        // The demand's origin: the webhook delivery (parent) or the poll (link) that saw it.
        if let Some(origin) = crate::telemetry::origin::origins().take(ns, &a.spec.policy) {
            crate::telemetry::origin::attach(&span, &origin);
        }
        span.follows_from(tracing::Span::current());
        let traced = span
            .in_scope(crate::telemetry::current_traceparent)
            .map(|tp| {
                let mut a = a.clone();
                a.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(crate::telemetry::TRACEPARENT_ANNOTATION.to_owned(), tp);
                a
            });
        self.attempts(ns)
            .create(&PostParams::default(), traced.as_ref().unwrap_or(a))
            .instrument(span)
            .await
    }

    /// The operator's facts (`status.github`, `status.job`) in one write, a compare-and-swap on
    /// `resource_version`, the version they were decided on: a fact is worth writing only while
    /// the attempt is live (the agent turns facts into edges), and only the version decided on
    /// says it still is (`supervisor::write_facts` re-reads and decides again on a conflict).
    pub async fn facts(
        &self,
        namespace: &str,
        name: &str,
        facts: &AttemptFacts,
        resource_version: &str,
    ) -> Result<Cas, kube::Error> {
        let mut body = facts_patch(facts).map_err(|e| kube::Error::Service(Box::new(e)))?;
        body["metadata"] = json!({ "resourceVersion": resource_version });
        let written = self
            .attempts(namespace)
            .patch_status(name, &params(), &Patch::Merge(body))
            .await;
        match written {
            Ok(_) => {
                self.count(WriteKind::AttemptFacts);
                Ok(Cas::Written)
            }
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(Cas::Gone),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Cas::Conflict),
            Err(e) => Err(e),
        }
    }

    /// `spec.termination`: the one mutable spec field, a request to the agent.
    pub async fn terminate(
        &self,
        namespace: &str,
        name: &str,
        reason: TerminationReason,
        deregistered: bool,
        now: Timestamp,
    ) -> Result<(), kube::Error> {
        self.count(WriteKind::AttemptTermination);
        let body = json!({"spec": {"termination": {
            "reason": reason,
            "requestedAt": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
            "deregistered": deregistered,
        }}});
        ignore_gone(
            self.attempts(namespace)
                .patch(name, &params(), &Patch::Merge(body))
                .await,
        )
    }

    /// Drop `finalizer` from an object's list (CAS on the resourceVersion we decided on).
    pub async fn attempt_finalizers(
        &self,
        a: &RunnerAttempt,
        finalizers: Vec<String>,
    ) -> Result<(), kube::Error> {
        self.count(WriteKind::AttemptFinalizer);
        let ns = a.metadata.namespace.as_deref().unwrap_or_default();
        let name = a.metadata.name.as_deref().unwrap_or_default();
        let body = json!({"metadata": {
            "finalizers": finalizers, "resourceVersion": a.metadata.resource_version,
        }});
        ignore_gone(
            self.attempts(ns)
                .patch(name, &params(), &Patch::Merge(body))
                .await,
        )
    }

    pub async fn delete_attempt(&self, namespace: &str, name: &str) -> Result<(), kube::Error> {
        self.count(WriteKind::AttemptDelete);
        ignore_gone(
            self.attempts(namespace)
                .delete(name, &DeleteParams::default())
                .await,
        )
    }

    /// Set a policy's finalizers (CAS on the resourceVersion `p` was read at). Its event
    /// triggers a reconcile: the scale-set listener writes through this, and the policy's
    /// reconcile must see the listener's finalizer come and go.
    pub async fn policy_finalizers(
        &self,
        p: &ScalePolicy,
        finalizers: Vec<String>,
    ) -> Result<(), kube::Error> {
        self.write_policy_finalizers(p, finalizers).await.map(drop)
    }

    /// [`Self::policy_finalizers`] from the policy's own reconcile, which knew the object it
    /// wrote: the returned version is an echo (when it holds nothing else).
    pub async fn policy_finalizers_echoed(
        &self,
        p: &ScalePolicy,
        finalizers: Vec<String>,
    ) -> Result<(), kube::Error> {
        let written = self.write_policy_finalizers(p, finalizers.clone()).await?;
        self.echoes.record_written(p, Some(&finalizers), written);
        Ok(())
    }

    async fn write_policy_finalizers(
        &self,
        p: &ScalePolicy,
        finalizers: Vec<String>,
    ) -> Result<Option<ScalePolicy>, kube::Error> {
        self.count(WriteKind::PolicyFinalizer);
        let ns = p.metadata.namespace.as_deref().unwrap_or_default();
        let name = p.metadata.name.as_deref().unwrap_or_default();
        let body = json!({"metadata": {
            "finalizers": finalizers, "resourceVersion": p.metadata.resource_version,
        }});
        written(
            self.policies(ns)
                .patch(name, &params(), &Patch::Merge(body))
                .await,
        )
    }

    /// A merge patch of the leader's own status fields (never `pendingJobs`, which every
    /// replica's webhook receiver writes), decided on `read`; `finalizers` when the same
    /// reconcile set them just before (else those read).
    pub async fn policy_status(
        &self,
        read: &ScalePolicy,
        finalizers: Option<&[String]>,
        status: serde_json::Value,
    ) -> Result<(), kube::Error> {
        self.count(WriteKind::PolicyStatus);
        let namespace = read.metadata.namespace.as_deref().unwrap_or_default();
        let name = read.metadata.name.as_deref().unwrap_or_default();
        let written = written(
            self.policies(namespace)
                .patch_status(name, &params(), &Patch::Merge(json!({"status": status})))
                .await,
        )?;
        self.echoes.record_written(read, finalizers, written);
        Ok(())
    }

    /// Add or remove (`None`) entries of `status.pendingJobs`.
    pub async fn pending_jobs(
        &self,
        namespace: &str,
        name: &str,
        entries: serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), kube::Error> {
        if entries.is_empty() {
            return Ok(());
        }
        self.count(WriteKind::PendingJobs);
        let body = json!({"status": {"pendingJobs": entries}});
        ignore_gone(
            self.policies(namespace)
                .patch_status(name, &params(), &Patch::Merge(body))
                .await,
        )
    }

    /// Set or remove (`None`) annotations of a policy: the scale-set source's session and set
    /// id, which a new leader reads back. A merge patch of the metadata only; a policy already
    /// gone is no error.
    pub async fn policy_annotations(
        &self,
        namespace: &str,
        name: &str,
        entries: &[(&str, Option<&str>)],
    ) -> Result<(), kube::Error> {
        self.count(WriteKind::PolicyAnnotations);
        let annotations: serde_json::Map<String, serde_json::Value> = entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), json!(v)))
            .collect();
        let body = json!({"metadata": {"annotations": annotations}});
        ignore_gone(
            self.policies(namespace)
                .patch(name, &params(), &Patch::Merge(body))
                .await,
        )
    }

    pub fn counted_event(&self) {
        self.count(WriteKind::Event);
    }

    pub fn dropped_event(&self) {
        self.metrics.event_dropped();
    }
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn seen(name: &str, version: &str) -> ScalePolicy {
        let mut p: ScalePolicy = serde_json::from_value(json!({
            "apiVersion": "runner-manager.dev/v1alpha1", "kind": "ScalePolicy",
            "metadata": {"name": name, "namespace": "team"},
            "spec": {"github": {"url": "https://github.com/a/b", "credentialsSecretRef": {"name": "s"}},
                "labels": ["x"], "maxRunners": 1}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        p.metadata.resource_version = Some(version.to_owned());
        p
    }

    #[test]
    fn only_the_versions_this_process_wrote_are_echoes_and_each_once() {
        let echoes = Echoes::default();
        echoes.record("team", "web", Some("10".into()));
        echoes.record("team", "web", Some("12".into()));
        // Someone else's write in between (a webhook's pendingJobs entry): it triggers.
        assert!(!echoes.is_echo(&seen("web", "11")));
        assert!(
            !echoes.is_echo(&seen("api", "10")),
            "another policy's version"
        );
        assert!(echoes.is_echo(&seen("web", "12")));
        // 12 was shown, so 10 never will be; nor is 12 an echo twice (a relist shows it again).
        assert!(!echoes.is_echo(&seen("web", "10")));
        assert!(!echoes.is_echo(&seen("web", "12")));
        for v in 0..10 {
            echoes.record("team", "web", Some(v.to_string()));
        }
        assert!(!echoes.is_echo(&seen("web", "0")), "bounded per policy");
        assert!(echoes.is_echo(&seen("web", "9")));
        echoes.record("team", "web", Some("20".into()));
        echoes.retain(&std::collections::HashSet::new());
        assert!(
            !echoes.is_echo(&seen("web", "20")),
            "forgotten with the policy"
        );
    }

    #[test]
    fn a_returned_object_holding_another_writers_change_is_not_an_echo() {
        let echoes = Echoes::default();
        let read = seen("web", "10");
        let mut written = seen("web", "12");
        // A status write of ours: the response is what was read plus our fields.
        echoes.record_written(&read, None, Some(written.clone()));
        assert!(echoes.is_echo(&written));
        // A webhook's pendingJobs entry landed before our merge patch (version 11, which a
        // relist may never show): the response carries it, so it must trigger.
        written.metadata.resource_version = Some("14".into());
        written.status.get_or_insert_default().pending_jobs.insert(
            "42".into(),
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        );
        echoes.record_written(&read, None, Some(written.clone()));
        assert!(!echoes.is_echo(&written), "pendingJobs differ");
        // Likewise a spec edit, a deletion or someone else's finalizer.
        for change in [
            |p: &mut ScalePolicy| p.metadata.generation = Some(2),
            |p: &mut ScalePolicy| {
                p.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                    ))
            },
            |p: &mut ScalePolicy| p.metadata.finalizers = Some(vec!["someone/else".into()]),
        ] {
            let mut w = seen("web", "16");
            change(&mut w);
            echoes.record_written(&read, None, Some(w.clone()));
            assert!(!echoes.is_echo(&w));
        }
        // Our own finalizer write: the finalizers it set are ours.
        let ours = vec!["runner-manager.dev/cleanup".to_owned()];
        let mut w = seen("web", "18");
        w.metadata.finalizers = Some(ours.clone());
        echoes.record_written(&read, Some(&ours), Some(w.clone()));
        assert!(echoes.is_echo(&w));
    }

    fn of(uid: &str, version: &str) -> ScalePolicy {
        let mut p = seen("web", version);
        p.metadata.uid = Some(uid.to_owned());
        p
    }

    fn version(p: &ScalePolicy) -> &str {
        p.metadata.resource_version.as_deref().unwrap_or_default()
    }

    #[test]
    fn a_reconcile_works_from_what_its_last_writes_returned_while_the_store_lags() {
        let echoes = Echoes::default();
        let cached = Arc::new(of("u1", "10"));
        // Nothing written: the store's copy.
        assert_eq!(version(&echoes.fresher(cached.clone())), "10");
        // The finalizer's compare-and-swap on 10 returned 11; the status write, decided on the
        // same read (10), returned 12.
        let ours = vec!["runner-manager.dev/cleanup".to_owned()];
        let mut finalized = of("u1", "11");
        finalized.metadata.finalizers = Some(ours.clone());
        finalized.metadata.managed_fields = Some(vec![Default::default()]);
        echoes.record_written(&cached, Some(&ours), Some(finalized));
        let from = echoes.fresher(cached.clone());
        assert_eq!(version(&from), "11");
        assert_eq!(from.metadata.finalizers.as_deref(), Some(&ours[..]));
        assert!(
            from.metadata.managed_fields.is_none(),
            "kept as the reflector keeps it"
        );
        let mut statused = of("u1", "12");
        statused.metadata.finalizers = Some(ours.clone());
        echoes.record_written(&cached, Some(&ours), Some(statused));
        // The store at the read version, or at the finalizer write's: both superseded by 12.
        assert_eq!(version(&echoes.fresher(cached.clone())), "12");
        assert_eq!(version(&echoes.fresher(Arc::new(of("u1", "11")))), "12");
        // The store caught up: its own copy, and the entry is gone.
        assert_eq!(version(&echoes.fresher(Arc::new(of("u1", "12")))), "12");
        assert_eq!(
            version(&echoes.fresher(cached.clone())),
            "10",
            "dropped once caught up"
        );
    }

    #[test]
    fn a_version_the_writes_did_not_supersede_is_the_stores_own() {
        let echoes = Echoes::default();
        let cached = Arc::new(of("u1", "10"));
        echoes.record_written(&cached, None, Some(of("u1", "12")));
        // Someone else's version (a webhook's pendingJobs entry, a spec edit): its copy is the
        // one to act on, whatever the number says (versions are opaque) and the entry goes.
        assert_eq!(version(&echoes.fresher(Arc::new(of("u1", "99")))), "99");
        assert_eq!(version(&echoes.fresher(cached.clone())), "10");
        // A policy deleted and created again under its name is another object.
        echoes.record_written(&cached, None, Some(of("u1", "14")));
        assert_eq!(version(&echoes.fresher(Arc::new(of("u2", "10")))), "10");
        // A write of a policy already gone returned nothing: nothing is kept.
        let echoes = Echoes::default();
        echoes.record_written(&cached, None, None);
        assert_eq!(version(&echoes.fresher(cached.clone())), "10");
        // A no-op write returns the version it was sent on: not superseded by itself, so the
        // store's copy is the one worked from (the response is marked to tell them apart: with
        // the version kept among those superseded, the marked response would come back).
        let mut noop = of("u1", "10");
        noop.metadata.labels = Some([("response".to_owned(), "kept".to_owned())].into());
        echoes.record_written(&cached, None, Some(noop));
        assert!(echoes.fresher(cached.clone()).metadata.labels.is_none());
    }

    #[test]
    fn the_watch_showing_the_written_version_ends_the_read_around() {
        let echoes = Echoes::default();
        let cached = Arc::new(of("u1", "10"));
        let written = of("u1", "12");
        echoes.record_written(&cached, None, Some(written.clone()));
        assert!(echoes.is_echo(&written));
        // The store holds 12 now; a relist would never show 10 again, but if it did the
        // entry is already gone.
        assert_eq!(version(&echoes.fresher(cached)), "10");
        assert!(
            echoes
                .0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty()
        );
    }

    #[test]
    fn superseded_versions_are_bounded_per_policy() {
        let echoes = Echoes::default();
        for v in 0..(SUPERSEDED_PER_POLICY as u32 + 4) {
            echoes.record_written(
                &of("u1", &v.to_string()),
                None,
                Some(of("u1", &(v + 1).to_string())),
            );
        }
        let last = (SUPERSEDED_PER_POLICY + 4).to_string();
        let recent = (SUPERSEDED_PER_POLICY + 2).to_string();
        assert_eq!(version(&echoes.fresher(Arc::new(of("u1", &recent)))), last);
        assert_eq!(
            version(&echoes.fresher(Arc::new(of("u1", "0")))),
            "0",
            "the oldest fell out"
        );
    }
}
