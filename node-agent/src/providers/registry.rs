//! The agent's providers, one of each kind, and the one place that picks one (issue 30 item 3):
//! by the attempt's execution mode. The mode is in the attempt's snapshot and never changes,
//! while an identity kind may be shared (a pod and a microVM would both journal an environment
//! identity), so the mode is the key, and the identity each mode journals is the journal's rule
//! (`crds::attempt`).
//! Every kind is here for supervision and cleanup even when the agent does not offer it for new
//! attempts (an agent restarted without `--oci` still watches and destroys the runner pods an
//! earlier run started; a node whose runner sandbox was not proven still stops its native
//! runners): what it offers is [`Providers::offers`].
//!
//! Adding a kind: its module implementing [`Provider`], its `ExecutionMode`, and a line in
//! [`Providers::of`] and [`Providers::offers`] (docs/architecture.md, "Adding a provider").

use runner_manager_crds::attempt::AttemptSnapshot;
use runner_manager_crds::policy::ExecutionMode;

use super::launcher::RunnerLauncher;
use super::oci::{KubePods, OciProvider};
use super::provider::{NativeProvider, Provider};
use super::sandbox::SandboxRefusal;

/// One provider of each kind, and what is offered for new attempts.
pub struct Providers {
    native: NativeProvider<Box<dyn RunnerLauncher>>,
    /// Why native runners are refused (the systemd launcher's sandbox was not proven at start):
    /// native attempts are rejected and the Lease says why. `None`: offered.
    native_refused: Option<SandboxRefusal>,
    oci: OciProvider<KubePods>,
    /// `--oci`: runner pods on this node. Without it OCI attempts are rejected
    /// (`SnapshotUnusable`), never run natively.
    oci_offered: bool,
}

impl std::fmt::Debug for Providers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Providers")
            .field("native", &self.native)
            .field("native_refused", &self.native_refused)
            .field("oci_offered", &self.oci_offered)
            .finish_non_exhaustive()
    }
}

impl Providers {
    pub fn new(
        launcher: Box<dyn RunnerLauncher>,
        native_refused: Option<SandboxRefusal>,
        oci: OciProvider<KubePods>,
        oci_offered: bool,
    ) -> Self {
        Self {
            native: NativeProvider(launcher),
            native_refused,
            oci,
            oci_offered,
        }
    }

    /// The provider of an execution mode (offered or not: supervision and cleanup need it).
    pub fn of(&self, mode: ExecutionMode) -> &dyn Provider {
        match mode {
            ExecutionMode::Native => &self.native,
            ExecutionMode::Oci => &self.oci,
        }
    }

    /// Whether new attempts of `mode` are admitted here.
    pub fn offers(&self, mode: ExecutionMode) -> bool {
        match mode {
            ExecutionMode::Native => self.native_refused.is_none(),
            ExecutionMode::Oci => self.oci_offered,
        }
    }

    /// Whether this agent admits a new attempt of `snapshot`: its kind offered here, and the
    /// kind's own check.
    pub fn admits(&self, snapshot: &AttemptSnapshot) -> bool {
        let mode = snapshot.execution.mode;
        self.offers(mode) && self.of(mode).admits(snapshot)
    }

    /// Whether a provider offered here runs its runners as pods (the agent then watches its
    /// node's pods).
    pub fn makes_pods(&self) -> bool {
        self.oci_offered
    }

    /// Why native runners are refused, if they are.
    pub fn native_refused(&self) -> Option<SandboxRefusal> {
        self.native_refused
    }

    /// The native launcher, for the orphan sweep of its leftover units or cgroups.
    pub fn launcher(&self) -> &dyn RunnerLauncher {
        self.native.launcher()
    }
}
