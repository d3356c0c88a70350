//! The pure core of the policy controller: how many runners a policy wants and which to remove
//! (`demand`), which policy a queued job belongs to (`matching`), the job ledger's rules
//! (`ledger`), on which node a new attempt goes (`placement`), and which namespace may name which
//! target (`tenancy`). No I/O: the controllers feed these from their caches and act on the
//! answers. All but `ledger` live in `runner-manager-core` (no Kubernetes type) and are
//! re-exported here; `ledger` reads the custom resources and stays.

pub use runner_manager_core::{demand, matching, placement, tenancy};

pub mod ledger;
