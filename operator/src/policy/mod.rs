//! The pure core of the policy controller: how many runners a policy wants and which to remove
//! (`demand`), which policy a queued job belongs to (`matching`), the job ledger's rules (`ledger`), on which node a new attempt
//! goes (`placement`), and which namespace may name which target (`tenancy`). No I/O: the
//! controllers feed these from their caches and act on the answers.

pub mod demand;
pub mod ledger;
pub mod matching;
pub mod placement;
pub mod tenancy;
