//! The provider seam (DESIGN §12 "Provider seam"): how one attempt's runner is prepared,
//! started, inspected, stopped and destroyed, whatever it is. Native runners (a host process,
//! through the direct or systemd [`RunnerLauncher`]) and OCI runners (a pod,
//! [`super::oci::OciProvider`]) are both behind it; the launch pipeline, supervision and cleanup
//! pick the attempt's provider from its snapshot's execution mode and never fall back from one to
//! the other.

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use runner_manager_crds::attempt::ProcessIdentity;

use super::launcher::{LaunchSpec, RunnerLauncher, StartError, StopError, Stopped};
use super::oci::{
    OciProvider, PodApi, PodFailure, PodObservation, PodRef, PrepareRequest, PreparedPod,
};
use crate::handoff::RestrictiveHandoff;
use crate::process::Inspection;

/// What supervision reads of one look at a started runner, whichever provider runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    pub alive: bool,
    /// The exit status, when the provider knows it (the direct launcher's own child; a pod's
    /// terminated container).
    pub exit: Option<ExitStatus>,
}

/// One kind of runner. Each step's failure is the provider's own closed error; the launch turns
/// it into the attempt's outcome in one place.
pub trait RunnerProvider: Send + Sync {
    /// What `prepare` needs.
    type Request<'a>
    where
        Self: 'a;
    /// What `prepare` made and `start` uses.
    type Prepared<'a>: Send + Sync;
    /// What was started: journalled with `Starting`.
    type Identity;
    /// What `inspect` reads.
    type Observation;
    /// Why a step failed. A failed stop or look during a termination defers it
    /// ([`TerminationError`]), never concludes it.
    type Failure: std::error::Error + Into<TerminationError>;

    /// Everything of the provider's before the JIT exists (for OCI: the pod, running its entry
    /// helper). The workspace (runtime, package, account) is prepared before, for both.
    fn prepare<'a>(
        &'a self,
        request: Self::Request<'a>,
    ) -> impl Future<Output = Result<Self::Prepared<'a>, Self::Failure>> + Send;

    /// Hands the JIT over (through `handoff` only) and starts the listener. Returns once the
    /// handoff is gone.
    fn start<'p>(
        &self,
        prepared: &Self::Prepared<'p>,
        handoff: RestrictiveHandoff,
    ) -> impl Future<Output = Result<Self::Identity, Self::Failure>> + Send;

    fn inspect(
        &self,
        identity: &Self::Identity,
    ) -> impl Future<Output = Result<Self::Observation, Self::Failure>> + Send;

    /// What supervision reads of `observation`: alive, and how it exited when the provider
    /// knows.
    fn seen(&self, identity: &Self::Identity, observation: &Self::Observation) -> Seen;

    /// Stops the runner and proves it gone.
    fn stop(
        &self,
        identity: &Self::Identity,
    ) -> impl Future<Output = Result<Stopped, Self::Failure>> + Send;

    /// Removes what the provider made for the runner and proves it gone (native: nothing beyond
    /// the stop, the launcher's cgroup or unit goes with it; OCI: every runner pod of the
    /// identity's generation, also one an interrupted preparation made before it was journalled).
    fn destroy(
        &self,
        identity: &Self::Identity,
    ) -> impl Future<Output = Result<(), Self::Failure>> + Send;
}

/// Native runners: the launcher, unchanged, behind the seam.
pub struct NativeProvider<'l>(pub &'l dyn RunnerLauncher);

impl std::fmt::Debug for NativeProvider<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("NativeProvider")
            .field(&self.0.kind())
            .finish()
    }
}

/// Why a native step failed.
#[derive(Debug, thiserror::Error)]
pub enum NativeFailure {
    #[error("{0}")]
    Start(#[from] StartError),
    #[error("{0}")]
    Stop(#[from] StopError),
    #[error("inspection failed: {0}")]
    Inspect(io::ErrorKind),
}

impl RunnerProvider for NativeProvider<'_> {
    type Request<'a>
        = LaunchSpec<'a>
    where
        Self: 'a;
    type Prepared<'a> = LaunchSpec<'a>;
    type Identity = ProcessIdentity;
    type Observation = Inspection;
    type Failure = NativeFailure;

    async fn prepare<'a>(
        &'a self,
        request: LaunchSpec<'a>,
    ) -> Result<LaunchSpec<'a>, NativeFailure> {
        // Nothing of the launcher's exists before the start: the workspace, package and account
        // are the launch's, and the spec goes through as it is.
        Ok(request)
    }

    async fn start<'p>(
        &self,
        prepared: &Self::Prepared<'p>,
        handoff: RestrictiveHandoff,
    ) -> Result<ProcessIdentity, NativeFailure> {
        Ok(tokio::task::block_in_place(|| {
            self.0.start(prepared, handoff)
        })?)
    }

    async fn inspect(&self, identity: &ProcessIdentity) -> Result<Inspection, NativeFailure> {
        tokio::task::block_in_place(|| self.0.inspect(identity))
            .map_err(|e| NativeFailure::Inspect(e.kind()))
    }

    fn seen(&self, identity: &ProcessIdentity, inspection: &Inspection) -> Seen {
        let alive = inspection.is_alive();
        Seen {
            alive,
            exit: if alive {
                None
            } else {
                self.0.exit_status(identity)
            },
        }
    }

    async fn stop(&self, identity: &ProcessIdentity) -> Result<Stopped, NativeFailure> {
        Ok(tokio::task::block_in_place(|| self.0.stop(identity))?)
    }

    async fn destroy(&self, identity: &ProcessIdentity) -> Result<(), NativeFailure> {
        self.stop(identity).await.map(|_| ())
    }
}

impl<P: PodApi> RunnerProvider for OciProvider<P> {
    type Request<'a>
        = PrepareRequest<'a>
    where
        Self: 'a;
    type Prepared<'a> = PreparedPod<'a>;
    type Identity = PodRef;
    type Observation = PodObservation;
    type Failure = PodFailure;

    async fn prepare<'a>(
        &'a self,
        request: PrepareRequest<'a>,
    ) -> Result<PreparedPod<'a>, PodFailure> {
        OciProvider::prepare_pod(self, request).await
    }

    async fn start<'p>(
        &self,
        prepared: &Self::Prepared<'p>,
        handoff: RestrictiveHandoff,
    ) -> Result<PodRef, PodFailure> {
        OciProvider::start_pod(self, prepared, handoff).await
    }

    async fn inspect(&self, id: &PodRef) -> Result<PodObservation, PodFailure> {
        OciProvider::inspect_pod(self, id).await
    }

    fn seen(&self, _: &PodRef, observation: &PodObservation) -> Seen {
        Seen {
            alive: observation.is_alive(),
            exit: observation
                .exit_code()
                .map(|c| ExitStatus::from_raw((c & 0xff) << 8)),
        }
    }

    async fn stop(&self, id: &PodRef) -> Result<Stopped, PodFailure> {
        OciProvider::stop_pod(self, id).await
    }

    async fn destroy(&self, id: &PodRef) -> Result<(), PodFailure> {
        let attempt =
            crate::pods::attempt_of_pod(&id.identity.pod_name, crate::pods::PodRole::Runner)
                .ok_or(PodFailure::NotOurs)?;
        OciProvider::destroy_generation(self, &id.namespace, attempt, &id.identity)
            .await
            .map(|_| ())
    }
}

/// Why a termination did not conclude (a provider's stop or look failed). Closed.
#[derive(Debug, thiserror::Error)]
pub enum TerminationError {
    /// The intent could not be made durable: nothing was signalled.
    #[error("the termination intent could not be made durable ({0}); nothing was signalled")]
    IntentNotDurable(io::ErrorKind),
    /// The stop did not end in proven death: no conclusion yet (deferred).
    #[error("the runner could not be proven stopped: {0}")]
    Deferred(StopError),
    #[error("re-inspection failed: {0}")]
    Inspect(io::ErrorKind),
}

impl From<NativeFailure> for TerminationError {
    fn from(f: NativeFailure) -> Self {
        match f {
            NativeFailure::Stop(e) => Self::Deferred(e),
            NativeFailure::Inspect(kind) => Self::Inspect(kind),
            // Never returned by a stop or a look.
            NativeFailure::Start(_) => Self::Deferred(StopError::StillRunning),
        }
    }
}

impl From<PodFailure> for TerminationError {
    fn from(_: PodFailure) -> Self {
        // The pod is not proven gone (its deletion or the read failed): tried again.
        Self::Deferred(StopError::StillRunning)
    }
}

/// One look at a started runner through its provider.
pub async fn look<P: RunnerProvider>(
    provider: &P,
    identity: &P::Identity,
) -> Result<Seen, P::Failure> {
    let observation = provider.inspect(identity).await?;
    Ok(provider.seen(identity, &observation))
}
