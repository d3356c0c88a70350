//! `runner-manager-core`: the decisions of runner-manager that need neither Kubernetes nor an
//! async runtime (issue 30 item 1; linkerd2's `policy-controller/core` is the model). Pure
//! functions and plain types, tested without a cluster, and a crate that cannot reach the API
//! server: `tests/dependencies.rs` fails when anything it depends on, however indirectly, is kube,
//! k8s-openapi or tokio.
//!
//! - The attempt's vocabulary and rules: the state machine ([`state`]), outcomes ([`outcome`]),
//!   the recovery table ([`recovery`]),
//!   and the names, durations, architectures, hosts and environment rules the custom resources
//!   are written in ([`names`], [`duration`], [`arch`], [`hosts`], [`helper_env`]).
//! - A `RunnerAttempt` as the operator's decisions read it ([`attempt`]), and those decisions:
//!   what is due for it ([`timeouts`]), the housekeeping of a policy's attempts
//!   ([`housekeeping`]), the replacement backoff and `Degraded` ([`failures`]), how many
//!   ledger entries its runners have evidently taken ([`ledger`]), and the policy's decisions
//!   on them: how it scales and which attempts are terminated or drained ([`scaling`]).
//! - What a node advertises on its Lease ([`lease`]).
//! - A policy's GitHub target ([`target`]), which namespace may name it ([`tenancy`]), which
//!   policy a queued job belongs to ([`matching`]), how many runners a policy wants and which
//!   to remove ([`demand`]), and which node a new attempt goes to ([`placement`], reading
//!   requests with [`quantity`]).
//!
//! `runner-manager-crds` builds the custom resources on these types and re-exports the modules
//! under its own name, and builds the validated attempt from the object
//! (`runner_manager_crds::validate::attempt::Attempt`); the operator's `policy` module
//! re-exports the policy decisions. What stays in the operator renders or writes the custom resources: the
//! plan's status, conditions, events and gauges (from a `scaling::Decision`) and the ledger's
//! patches (docs/architecture.md, "Crates").

pub mod arch;
pub mod attempt;
pub mod demand;
pub mod duration;
pub mod failures;
pub mod helper_env;
pub mod hosts;
pub mod housekeeping;
pub mod lease;
pub mod ledger;
pub mod matching;
pub mod names;
pub mod outcome;
pub mod placement;
pub mod quantity;
pub mod recovery;
pub mod scaling;
pub mod state;
pub mod target;
pub mod tenancy;
pub mod timeouts;
