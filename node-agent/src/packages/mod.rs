//! The runner package cache (DESIGN §6, lifecycle-spec §5): download the operator-pinned archive
//! with timeouts and retries, verify its sha256, extract it safely (while it downloads, into a
//! staging used only once the digest matched), fingerprint and trust the tree (in memory only;
//! proven by construction in the process that extracted it, by a full read after a restart), and materialize it into attempt runtimes by reflink or parallel copy,
//! proving every byte of every copy: hashed as it is copied, or cloned from an origin (the tree,
//! or a seed on the runtime's volume) that was read in full and kept its fingerprint across the
//! clone.
//!
//! Pure or nearly: [`fingerprint`], [`contents`] (what a verified archive holds),
//! [`timings`]. Filesystem and network: [`download`], [`extract`], [`copy`], [`origin`],
//! [`cache`].

pub mod cache;
pub mod contents;
pub mod copy;
pub mod download;
pub mod extract;
pub mod fingerprint;
pub mod origin;
pub mod overlay;
pub mod timings;

pub use cache::{Materialized, PackageCache, PackageError, PackageRef, RuntimeKind};
pub use timings::{InstallProof, PackageTimings};
