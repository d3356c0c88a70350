//! The runner package cache (DESIGN §6, lifecycle-spec §5): download the operator-pinned archive
//! with timeouts and retries, verify its sha256, extract it safely, fingerprint and trust the
//! tree (in memory only), and materialize it into attempt runtimes by reflink or parallel copy,
//! verifying every copy in full.
//!
//! Pure or nearly: [`fingerprint`], [`contents`] (what a verified archive holds),
//! [`timings`]. Filesystem and network: [`download`], [`extract`], [`copy`], [`cache`].

pub mod cache;
pub mod contents;
pub mod copy;
pub mod download;
pub mod extract;
pub mod fingerprint;
pub mod origin;
pub mod timings;

pub use cache::{Materialized, PackageCache, PackageError, PackageRef, RuntimeKind};
pub use timings::PackageTimings;
