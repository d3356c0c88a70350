//! The OCI provider (DESIGN §6 "OCI provider", §12 "Provider seam"): the attempt's runner is a
//! Pod on the agent's own node, which the agent orders from the operator (issue 28: the agent
//! holds no pod write right; the broker builds the pod with `runner_manager_crds::pods`), from
//! the attempt's image pinned by digest, with the attempt's runtime directory (the
//! materialized, verified runner package, as native) mounted from the host. The pod's container runs the entry helper, which waits for the same
//! restrictive handoff file native runners use, reads and deletes it, and execs the listener
//! with the JIT in the listener's environment only.
//!
//! - `prepare` orders the pod (the caller journalled `Preparing` first) and waits until its
//!   container runs, bounded: an image that cannot be pulled or a pod the kubelet never starts
//!   ends the launch before any JIT exists.
//! - `start` writes the handoff (the caller's [`RestrictiveHandoff`]) and a pointer naming it,
//!   then waits until the helper left the "taken" marker and the handoff is gone.
//! - `inspect` reads the pod into a closed [`PodObservation`].
//!
//! Pods are read from the agent's watch of its node's pods ([`crate::pod_watch`]) and waited
//! for on its events, not polled: a pod the watch does not hold is read once from the API
//! server before its absence means anything. Only the helper's marker in the runtime (a file,
//! no event) is looked for at a short interval while the handoff is offered.
//! - `stop` and `destroy` order the pod's removal (uid precondition: never a pod of another
//!   generation) and prove it gone by reading again.
//!
//! I/O goes through [`PodApi`] ([`KubePods`] in the agent: reads from the agent's watch, writes
//! through the broker). The provider never falls back to native.

pub mod observe;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use runner_manager_crds::attempt::EnvironmentIdentity;
use runner_manager_crds::broker::{OrderedPod, PodOrder};
use runner_manager_crds::pods::{self, BuildRefusal, PodRole};

use super::launcher::Stopped;
use crate::account::RunnerAccount;
use crate::broker_client::{BrokerClient, PodOrderError};
use crate::handoff::RestrictiveHandoff;
pub use observe::{Ended, PodObservation, Waiting};

// The runtime's handoff pointer and taken marker are the entry helper's protocol: it defines them.
pub use crate::entry::{HANDOFF_POINTER, TAKEN_MARKER};
/// Without a running pod watch (an agent that makes no pods supervising what an earlier run
/// left): how often a pod is read while the provider waits.
const POLL: Duration = Duration::from_millis(200);
/// With the watch: the longest a wait goes without looking again (the watch's events wake it
/// sooner; this only bounds a watch that reconnects).
const BACKSTOP: Duration = Duration::from_secs(2);
/// How often the runtime is looked at for the helper's marker while the handoff is offered: a
/// `stat` of a local file, no API request.
const MARKER_POLL: Duration = Duration::from_millis(5);

/// Wakes a wait of the provider: on the pod watch's next event, or after [`POLL`] without one.
#[derive(Debug)]
pub struct Changes(Option<tokio::sync::watch::Receiver<u64>>);

impl Changes {
    /// No watch: wake after [`POLL`].
    pub fn polling() -> Self {
        Self(None)
    }

    /// Whether the pod watch wakes it (its reads are the store's, not requests).
    pub fn is_watched(&self) -> bool {
        self.0.is_some()
    }

    pub async fn next(&mut self) {
        match self.0.as_mut() {
            Some(rx) => crate::pod_watch::PodWatch::next_change(rx, BACKSTOP).await,
            None => tokio::time::sleep(POLL).await,
        }
    }
}

/// The pods the provider manages, by namespace. Small on purpose: the unit tests of the
/// provider's decisions use a double, the agent uses [`KubePods`].
pub trait PodApi: Send + Sync {
    /// Orders the pod of attempt `ns/attempt` (made by the operator); the pod as stored.
    fn create(
        &self,
        ns: &str,
        attempt: &str,
        order: &PodOrder,
    ) -> impl Future<Output = Result<Pod, PodApiError>> + Send;
    fn get(
        &self,
        ns: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Pod>, PodApiError>> + Send;
    /// The pods of `ns` matching the label `selector` that are bound to `node`.
    fn list(
        &self,
        ns: &str,
        selector: &str,
        node: &str,
    ) -> impl Future<Output = Result<Vec<Pod>, PodApiError>> + Send;
    /// Subscribed before a look, woken after it by the next change (see [`Changes`]).
    fn changes(&self) -> Changes;
    /// Removes the pod with this uid (a precondition: never another generation's pod that
    /// took the name). Gone already is fine.
    fn delete(
        &self,
        ns: &str,
        name: &str,
        uid: &str,
    ) -> impl Future<Output = Result<(), PodApiError>> + Send;
}

/// A pod API call that failed. Closed: reaches logs as a kind and an HTTP code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PodApiError {
    #[error("a pod of that name exists")]
    AlreadyExists,
    #[error("the API server refused the pod ({0})")]
    Refused(u16),
    #[error("the API server could not be reached")]
    Unreachable,
}

impl From<PodOrderError> for PodApiError {
    fn from(e: PodOrderError) -> Self {
        match e {
            PodOrderError::Conflict => Self::AlreadyExists,
            PodOrderError::Refused(code) => Self::Refused(code),
            PodOrderError::Unreachable => Self::Unreachable,
        }
    }
}

impl From<kube::Error> for PodApiError {
    fn from(e: kube::Error) -> Self {
        match e {
            kube::Error::Api(s) if s.code == 409 => Self::AlreadyExists,
            kube::Error::Api(s) => Self::Refused(s.code),
            _ => Self::Unreachable,
        }
    }
}

/// [`PodApi`] over the agent's client, its pod watch and the broker: reads come from the
/// watch's store, and only a pod the store does not hold is read from the API server; orders
/// and removals go to the broker (the agent has no pod write right).
#[derive(Clone)]
pub struct KubePods {
    pub client: kube::Client,
    pub watch: Arc<crate::pod_watch::PodWatch>,
    pub broker: Arc<BrokerClient>,
}

impl std::fmt::Debug for KubePods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubePods")
    }
}

impl PodApi for KubePods {
    async fn create(&self, ns: &str, attempt: &str, order: &PodOrder) -> Result<Pod, PodApiError> {
        Ok(self.broker.order_pod(ns, attempt, order).await?.pod())
    }

    async fn get(&self, ns: &str, name: &str) -> Result<Option<Pod>, PodApiError> {
        if let Some(p) = self.watch.get(ns, name) {
            return Ok(Some((*p).clone()));
        }
        // Not held: created a moment ago and not shown yet, or gone. Asked once.
        Ok(Api::<Pod>::namespaced(self.client.clone(), ns)
            .get_opt(name)
            .await?)
    }

    async fn list(&self, ns: &str, selector: &str, node: &str) -> Result<Vec<Pod>, PodApiError> {
        let params = ListParams::default()
            .labels(selector)
            .fields(&format!("spec.nodeName={node}"));
        Ok(Api::<Pod>::namespaced(self.client.clone(), ns)
            .list(&params)
            .await?
            .items)
    }

    fn changes(&self) -> Changes {
        if self.watch.is_running() {
            Changes(Some(self.watch.changed()))
        } else {
            Changes::polling()
        }
    }

    async fn delete(&self, ns: &str, name: &str, uid: &str) -> Result<(), PodApiError> {
        Ok(self.broker.remove_pod(ns, name, uid).await?)
    }
}

/// Why a pod step did not succeed. Closed; each maps to one outcome in the launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PodFailure {
    #[error("the pod cannot be ordered: {0}")]
    Spec(#[from] BuildRefusal),
    #[error("the pod API: {0}")]
    Api(#[from] PodApiError),
    #[error("a pod with the runner's name is not this attempt's")]
    NotOurs,
    #[error("the pod's image could not be pulled in time")]
    ImageUnavailable,
    #[error("the pod did not start in time ({0:?})")]
    NotStarted(Waiting),
    #[error("the pod ended before the runner started ({0:?})")]
    Ended(Ended),
    #[error("the entry helper did not take the handoff in time")]
    HandoffNotTaken,
    #[error("the handoff could not be offered ({0:?})")]
    Pointer(std::io::ErrorKind),
    #[error("the pod is still there after its deletion")]
    StillThere,
    #[error("a second runner pod claims the attempt; left for a person")]
    Duplicate,
}

/// The OCI provider of one agent.
#[derive(Clone, Debug)]
pub struct OciProvider<P: PodApi> {
    pub pods: P,
    pub node: String,
    /// How long a created pod may take to run its container (image pull included).
    pub start_deadline: Duration,
    /// How long the helper in a running pod may take to take the handoff.
    pub handoff_deadline: Duration,
}

/// What `prepare` needs.
#[derive(Debug)]
pub struct PrepareRequest<'a> {
    pub attempt: &'a runner_manager_crds::attempt::RunnerAttempt,
    /// The runner pod's node-local inputs ([`OrderedPod::Runner`]).
    pub pod: OrderedPod,
    /// The runner account (the order's `runAsUser`/`runAsGroup`): the handoff pointer is its.
    pub account: RunnerAccount,
    /// The runtime as the agent sees it (the pod mounts the order's `hostRuntime`, the same
    /// directory as the host names it).
    pub runtime: &'a Path,
}

/// A prepared pod: running its entry helper, waiting for the handoff.
#[derive(Debug)]
pub struct PreparedPod<'a> {
    pub pod: PodRef,
    pub runtime: &'a Path,
    pub account: RunnerAccount,
}

/// A runner pod: its namespace and journalled identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub identity: EnvironmentIdentity,
}

impl<P: PodApi> OciProvider<P> {
    /// Orders the attempt's pod (or meets the one a previous try made: the broker answers an
    /// order repeated with the pod of the derived name when it is provably this generation's)
    /// and waits until its container runs. Returns the identity to journal with `Prepared`. On
    /// failure the pod may exist: the caller's cleanup destroys it.
    pub async fn prepare_pod<'a>(
        &self,
        req: PrepareRequest<'a>,
    ) -> Result<PreparedPod<'a>, PodFailure> {
        let (attempt, ns, generation) = ids(req.attempt)?;
        let name = pods::pod_name(attempt, PodRole::Runner);
        let order = PodOrder {
            attempt_uid: generation.clone(),
            pod: req.pod,
        };
        let created = match self.pods.create(&ns, attempt, &order).await {
            // The broker's answer, checked again: a pod that is not this generation's runner
            // is never adopted.
            Ok(p) if pods::is_ours(&p, attempt, &generation, PodRole::Runner) => p,
            Ok(_) | Err(PodApiError::AlreadyExists) => return Err(PodFailure::NotOurs),
            Err(e) => return Err(e.into()),
        };
        let uid = created.metadata.uid.clone().unwrap_or_default();
        let identity = EnvironmentIdentity {
            pod_name: name,
            uid,
            generation,
        };
        let prepared = PreparedPod {
            pod: PodRef {
                namespace: ns,
                identity,
            },
            runtime: req.runtime,
            account: req.account,
        };
        let deadline = tokio::time::Instant::now() + self.start_deadline;
        let mut last = PodObservation::Waiting(Waiting::NotStarted);
        let mut changes = self.pods.changes();
        while tokio::time::Instant::now() < deadline {
            last = self.inspect_pod(&prepared.pod).await?;
            match last {
                PodObservation::Running => return Ok(prepared),
                PodObservation::Ended(e) => return Err(PodFailure::Ended(e)),
                PodObservation::Waiting(_) => {
                    let _ = tokio::time::timeout_at(deadline, changes.next()).await;
                }
            }
        }
        Err(match last {
            PodObservation::Waiting(Waiting::ImagePull) => PodFailure::ImageUnavailable,
            PodObservation::Waiting(w) => PodFailure::NotStarted(w),
            _ => PodFailure::NotStarted(Waiting::NotStarted),
        })
    }

    /// Offers `handoff` to the helper in the running pod and waits until it was taken: the
    /// marker is there and the handoff file gone. `handoff` is dropped (deleted) on every path.
    pub async fn start_pod(
        &self,
        prepared: &PreparedPod<'_>,
        handoff: RestrictiveHandoff,
    ) -> Result<PodRef, PodFailure> {
        let runtime = prepared.runtime;
        crate::handoff::offer(runtime, prepared.account, handoff.name())
            .map_err(|e| PodFailure::Pointer(e.kind()))?;
        let deadline = Instant::now() + self.handoff_deadline;
        // Watched, the pod's state is a read of the store: looked at with every marker look.
        // Without the watch, every read is a request: at most every [`POLL`].
        let look_every = if self.pods.changes().is_watched() {
            Duration::ZERO
        } else {
            POLL
        };
        let mut next_look = Instant::now();
        loop {
            let taken = std::fs::symlink_metadata(runtime.join(TAKEN_MARKER)).is_ok();
            if taken && !handoff.exists().unwrap_or(true) {
                return Ok(prepared.pod.clone());
            }
            if Instant::now() >= next_look {
                if let PodObservation::Ended(e) = self.inspect_pod(&prepared.pod).await? {
                    return Err(PodFailure::Ended(e));
                }
                next_look = Instant::now() + look_every;
            }
            if Instant::now() >= deadline {
                return Err(PodFailure::HandoffNotTaken);
            }
            // The pod's state comes from the watch's store (no request); the marker is a file.
            tokio::time::sleep(MARKER_POLL).await;
        }
    }

    /// The pod as it is now. A pod with the name but another uid is not ours: ours is gone.
    pub async fn inspect_pod(&self, pod: &PodRef) -> Result<PodObservation, PodFailure> {
        let identity = &pod.identity;
        let found = self.pods.get(&pod.namespace, &identity.pod_name).await?;
        let ours = found
            .as_ref()
            .filter(|p| p.metadata.uid.as_deref() == Some(identity.uid.as_str()));
        Ok(observe::observe(ours))
    }

    /// Stops the runner: deletes its pod and proves it gone.
    pub async fn stop_pod(&self, pod: &PodRef) -> Result<Stopped, PodFailure> {
        let identity = &pod.identity;
        let ns = pod.namespace.as_str();
        if self.inspect_pod(pod).await? == PodObservation::Ended(Ended::Deleted) {
            return Ok(Stopped::AlreadyGone);
        }
        self.pods
            .delete(ns, &identity.pod_name, &identity.uid)
            .await?;
        self.gone_within(ns, identity, Duration::from_secs(30))
            .await?;
        Ok(Stopped::Stopped)
    }

    /// Destroys every runner pod of the attempt's generation on this node (the journalled one,
    /// and any an interrupted preparation created before its identity was journalled) and
    /// proves each gone. Only pods whose controller owner is a RunnerAttempt count (what the
    /// agent creates; [`claim_of`]): one owned by an attempt of this name but another uid is
    /// another generation's (an earlier attempt of the same name), never touched, and while it
    /// is there the destruction is not done: `NotOurs`, so cleanup stays `CleanupDeferred` and
    /// tries again with backoff (parity row 15; its owner's garbage collection removes it). A
    /// pod owned by this attempt's uid that is not the journalled one (another name than the
    /// derived one, another uid than `journalled`'s when one was journalled, or another owner
    /// name or generation label) is a duplicate: quarantined, neither adopted nor deleted, and
    /// the destruction is not done (`Duplicate`) until a person removes it (parity row 17).
    /// A pod that only carries the attempt's labels (no RunnerAttempt controls it, or another
    /// attempt does) is logged and ignored: anyone who may create pods in the namespace can
    /// label one, and it must not hold the attempt's capacity and runtime forever. Returns how
    /// many were destroyed.
    pub async fn destroy_generation(
        &self,
        ns: &str,
        attempt: &str,
        journalled: &EnvironmentIdentity,
    ) -> Result<usize, PodFailure> {
        let pods = self
            .pods
            .list(ns, &pods::runner_selector(attempt), &self.node)
            .await?;
        let mut ours = Vec::new();
        let (mut other_generation, mut duplicate) = (false, false);
        for p in &pods {
            match claim_of(p, attempt, journalled) {
                Claim::Ours => {
                    ours.extend(p.metadata.name.clone().zip(p.metadata.uid.clone()).map(
                        |(pod_name, uid)| EnvironmentIdentity {
                            pod_name,
                            uid,
                            generation: journalled.generation.clone(),
                        },
                    ))
                }
                Claim::OtherGeneration => other_generation = true,
                Claim::Duplicate => duplicate = true,
                Claim::LabelsOnly => tracing::warn!(
                    attempt,
                    pod = p.metadata.name.as_deref().unwrap_or_default(),
                    "a pod carries the attempt's runner labels but no RunnerAttempt of this \
                     name controls it; ignored"
                ),
            }
        }
        for identity in &ours {
            self.pods
                .delete(ns, &identity.pod_name, &identity.uid)
                .await?;
        }
        for identity in &ours {
            self.gone_within(ns, identity, Duration::from_secs(30))
                .await?;
        }
        if other_generation {
            return Err(PodFailure::NotOurs);
        }
        if duplicate {
            return Err(PodFailure::Duplicate);
        }
        Ok(ours.len())
    }

    async fn gone_within(
        &self,
        ns: &str,
        identity: &EnvironmentIdentity,
        within: Duration,
    ) -> Result<(), PodFailure> {
        let deadline = tokio::time::Instant::now() + within;
        let mut changes = self.pods.changes();
        loop {
            let found = self.pods.get(ns, &identity.pod_name).await?;
            if found.is_none_or(|p| p.metadata.uid.as_deref() != Some(identity.uid.as_str())) {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(PodFailure::StillThere);
            }
            let _ = tokio::time::timeout_at(deadline, changes.next()).await;
        }
    }
}

/// Whether `p` claims the attempt but is not the runner pod it journalled: its name is not the
/// one derived from the attempt (the agent creates no other), or a pod was journalled and `p`
/// has another uid. Pure.
pub fn is_duplicate(p: &Pod, attempt: &str, journalled: &EnvironmentIdentity) -> bool {
    let derived = pods::pod_name(attempt, PodRole::Runner);
    let name = p.metadata.name.as_deref();
    let uid = p.metadata.uid.as_deref();
    pods::is_ours(p, attempt, &journalled.generation, PodRole::Runner)
        && (name != Some(derived.as_str())
            || (!journalled.uid.is_empty() && uid != Some(journalled.uid.as_str())))
}

/// What a pod carrying an attempt's runner labels is to that attempt's cleanup. Closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The attempt's runner pod of its generation: destroyed.
    Ours,
    /// Controlled by a RunnerAttempt of this name with another uid: an earlier attempt's,
    /// left to its garbage collection, holding the cleanup while it is there.
    OtherGeneration,
    /// Controlled by this attempt's uid but not the journalled pod: quarantined.
    Duplicate,
    /// No RunnerAttempt of this name or uid controls it: only labelled; ignored.
    LabelsOnly,
}

/// How `p` (listed by `attempt`'s runner labels) stands to `attempt` of `journalled`'s
/// generation, by its controller owner first: labels alone prove nothing. Pure.
pub fn claim_of(p: &Pod, attempt: &str, journalled: &EnvironmentIdentity) -> Claim {
    let generation = journalled.generation.as_str();
    match pods::owner_attempt(&p.metadata) {
        Some((_, uid)) if uid == generation => {
            if pods::is_ours(p, attempt, generation, PodRole::Runner)
                && !is_duplicate(p, attempt, journalled)
            {
                Claim::Ours
            } else {
                Claim::Duplicate
            }
        }
        Some((name, _)) if name == attempt => Claim::OtherGeneration,
        _ => Claim::LabelsOnly,
    }
}

/// The attempt's name, namespace and generation (its uid).
fn ids(
    a: &runner_manager_crds::attempt::RunnerAttempt,
) -> Result<(&str, String, String), PodFailure> {
    match (
        a.metadata.name.as_deref(),
        a.metadata.namespace.clone(),
        a.metadata.uid.clone(),
    ) {
        (Some(n), Some(ns), Some(g)) => Ok((n, ns, g)),
        _ => Err(PodFailure::Spec(BuildRefusal::AttemptUnnamed)),
    }
}

#[cfg(test)]
mod duplicate_tests {
    use super::*;

    /// A runner pod claiming attempt `a` of generation `g`, as the agent's own would.
    fn claiming(name: &str, uid: &str, a: &str, g: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name, "namespace": "team", "uid": uid,
                "labels": {
                    (crate::pods::ATTEMPT_LABEL): a, (crate::pods::GENERATION_LABEL): g,
                    (crate::pods::ROLE_LABEL): "runner"
                },
                "ownerReferences": [{
                    "apiVersion": "runner-manager.dev/v1alpha1", "kind": "RunnerAttempt",
                    "name": a, "uid": g, "controller": true
                }]
            }
        }))
        .expect("a pod")
    }

    fn journalled(uid: &str) -> EnvironmentIdentity {
        EnvironmentIdentity {
            pod_name: "a1-runner".to_owned(),
            uid: uid.to_owned(),
            generation: "g1".to_owned(),
        }
    }

    /// Parity row 17: only the journalled pod (or, with none journalled, the one of the derived
    /// name) is the attempt's; another pod claiming the same attempt and generation is a
    /// duplicate, and a pod of another generation is neither.
    #[test]
    fn a_second_pod_claiming_the_attempt_is_a_duplicate_and_the_journalled_one_is_not() {
        let own = claiming("a1-runner", "p1", "a1", "g1");
        assert!(!is_duplicate(&own, "a1", &journalled("p1")));
        assert!(
            !is_duplicate(&own, "a1", &journalled("")),
            "an interrupted preparation's pod, before its uid was journalled"
        );
        assert!(
            is_duplicate(&own, "a1", &journalled("p0")),
            "the derived name with another uid than the journalled one"
        );
        let other_name = claiming("a1-runner-2", "p2", "a1", "g1");
        assert!(is_duplicate(&other_name, "a1", &journalled("p1")));
        assert!(is_duplicate(&other_name, "a1", &journalled("")));
        let other_generation = claiming("a1-runner-2", "p3", "a1", "g0");
        assert!(
            !is_duplicate(&other_generation, "a1", &journalled("p1")),
            "another generation is not ours at all (row 15)"
        );
    }

    /// Parity row 15 and the review's finding: only the controller owner makes a labelled pod
    /// hold the cleanup. Another uid under this attempt's name is another generation; this
    /// attempt's uid on a pod that is not the journalled one is a duplicate; a pod with the
    /// labels and no such owner (a namespace user's) is ignored. Before: every labelled pod not
    /// of the generation was `NotOurs`, forever for an unowned one.
    #[test]
    fn only_a_runner_attempt_controller_makes_a_labelled_pod_hold_cleanup() {
        let j = journalled("p1");
        assert_eq!(
            claim_of(&claiming("a1-runner", "p1", "a1", "g1"), "a1", &j),
            Claim::Ours
        );
        assert_eq!(
            claim_of(&claiming("a1-runner-2", "p2", "a1", "g1"), "a1", &j),
            Claim::Duplicate
        );
        assert_eq!(
            claim_of(&claiming("a1-earlier", "p0", "a1", "g0"), "a1", &j),
            Claim::OtherGeneration
        );
        let mut unowned = claiming("a1-labelled", "p4", "a1", "g0");
        unowned.metadata.owner_references = None;
        assert_eq!(claim_of(&unowned, "a1", &j), Claim::LabelsOnly);
        let mut labelled_generation = claiming("a1-labelled", "p5", "a1", "g1");
        labelled_generation.metadata.owner_references = None;
        assert_eq!(
            claim_of(&labelled_generation, "a1", &j),
            Claim::LabelsOnly,
            "the generation label alone proves nothing"
        );
        let mut not_controller = claiming("a1-labelled", "p6", "a1", "g0");
        not_controller.metadata.owner_references.as_mut().unwrap()[0].controller = None;
        assert_eq!(claim_of(&not_controller, "a1", &j), Claim::LabelsOnly);
        let another_attempt = claiming("a1-labelled", "p7", "a2", "g2");
        assert_eq!(claim_of(&another_attempt, "a1", &j), Claim::LabelsOnly);
    }
}
