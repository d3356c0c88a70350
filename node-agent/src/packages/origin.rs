//! A copy origin (a trusted tree, or a seed on the runtime's volume) and its proof: its bytes
//! read against the verified contents *after* its fingerprint was taken, with the fingerprint
//! unchanged afterwards. Only a proven origin lets a clone's verification skip the bytes (see
//! [`CopyCheck::for_copy`](super::contents::CopyCheck::for_copy)).
//!
//! Why the fingerprint alone is not enough: the contents are hashed from the archive stream as
//! it is extracted, and the fingerprint is taken afterwards, so an edit in between is part of
//! the recorded fingerprint. Reading the tree once after the fingerprint closes that gap.

use std::io;
use std::path::Path;

use super::contents::{PackageContents, RetainedWork};
use super::fingerprint::{Fingerprint, fingerprint};

/// Whether the tree at `path` holds exactly `contents`, read in full while its fingerprint
/// stayed `recorded` (checked before and after the read). `Ok(false)` for any difference.
pub fn prove_origin(
    path: &Path,
    contents: &PackageContents,
    recorded: Fingerprint,
    threads: usize,
) -> io::Result<bool> {
    if fingerprint(path)? != recorded {
        return Ok(false);
    }
    if contents
        .verify_tree(path, RetainedWork::Include, threads)?
        .is_err()
    {
        return Ok(false);
    }
    Ok(fingerprint(path)? == recorded)
}

/// Whether an origin proven at `recorded` still has that fingerprint: checked after a copy, so
/// it brackets the clone together with the check before it.
pub fn still_intact(path: &Path, recorded: Fingerprint) -> bool {
    // An origin that cannot be fingerprinted any more is not intact.
    fingerprint(path).is_ok_and(|now| now == recorded)
}
