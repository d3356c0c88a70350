//! A copy origin (a trusted tree, or a seed on the runtime's volume) and its proof: its bytes
//! read against the verified contents *after* its fingerprint was taken, with the fingerprint
//! unchanged afterwards. Only a proven origin lets a clone's verification skip the bytes (see
//! [`CopyReport::check`](super::copy::CopyReport::check)).
//!
//! Why the fingerprint alone is not enough: the contents are hashed from the archive stream as
//! it is extracted, and the fingerprint is taken afterwards, so an edit in between is part of
//! the recorded fingerprint. Reading the tree once after the fingerprint closes that gap.

use std::io;
use std::path::Path;

use super::contents::{EntryRecord, PackageContents, RetainedWork};
use super::extract::Extracted;
use super::fingerprint::{Fingerprint, fingerprint, fingerprint_visiting};

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

/// The fingerprint of a tree this process just extracted, if the tree is provably what the
/// extraction hashed — `None` otherwise (the caller then proves it by reading it, as any
/// origin).
///
/// Why no byte needs reading again: the gap [`prove_origin`] closes is an edit between a file's
/// hashing (as it was written) and the fingerprint. Here every file's and link's stamp was taken
/// from the descriptor that wrote it, after its last write and chmod, and the fingerprint's own
/// walk finds each with that same stamp (inode, size, mode, owner, ctime) — any write,
/// truncation, chmod, rename or replacement in between would have moved one — and finds exactly
/// the entries the contents list, of their kinds. The tree was therefore read in full (as it
/// was written) before the fingerprint and unchanged up to it, which is what the proof
/// establishes. This holds only in the process that extracted it: after a restart the stamps
/// are gone and the tree is proven by reading it.
pub fn proven_by_construction(
    tree: &Path,
    extracted: &Extracted,
) -> io::Result<Option<Fingerprint>> {
    let mut seen = 0usize;
    let mut holds = true;
    let print = fingerprint_visiting(tree, &mut |rel, stamp| {
        seen += 1;
        let matches = match extracted.contents.entries.get(rel) {
            Some(EntryRecord::Dir) => stamp.is_dir(),
            Some(EntryRecord::File { size, .. }) => {
                extracted.stamps.get(rel) == Some(stamp) && stamp.size == *size
            }
            Some(EntryRecord::Symlink { .. }) => extracted.stamps.get(rel) == Some(stamp),
            None => false,
        };
        holds &= matches;
    })?;
    Ok((holds && seen == extracted.contents.entries.len()).then_some(print))
}

/// Whether an origin proven at `recorded` still has that fingerprint: checked after a copy, so
/// it brackets the clone together with the check before it.
pub fn still_intact(path: &Path, recorded: Fingerprint) -> bool {
    // An origin that cannot be fingerprinted any more is not intact.
    fingerprint(path).is_ok_and(|now| now == recorded)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::packages::extract::{ExtractLimits, extract_tar_gz_from};

    fn archive() -> Vec<u8> {
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let mut b = tar::Builder::new(gz);
        for (path, data) in [
            ("bin/Runner.Listener", &b"listener"[..]),
            ("run.sh", b"run"),
        ] {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o755);
            h.set_size(data.len() as u64);
            b.append_data(&mut h, path, data).unwrap();
        }
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, "listener", "bin/Runner.Listener")
            .unwrap();
        b.into_inner().unwrap().finish().unwrap()
    }

    fn extracted(dir: &Path) -> Extracted {
        std::fs::create_dir(dir).unwrap();
        extract_tar_gz_from(&archive()[..], dir, ExtractLimits::default()).unwrap()
    }

    /// Proven by construction only while every written entry keeps its stamp and nothing is
    /// added: an edit, a replacement, a removal or an extra entry after
    /// the extraction leaves the tree to be proven by reading it.
    #[test]
    fn a_tree_is_proven_by_construction_only_as_it_was_written() {
        let root = tempfile::tempdir().unwrap();
        let tree = root.path().join("t");
        let x = extracted(&tree);
        assert_eq!(
            proven_by_construction(&tree, &x).unwrap(),
            Some(fingerprint(&tree).unwrap())
        );

        std::fs::write(tree.join("run.sh"), b"run").unwrap();
        assert_eq!(
            proven_by_construction(&tree, &x).unwrap(),
            None,
            "rewritten"
        );

        let tree = root.path().join("u");
        let x = extracted(&tree);
        std::fs::remove_file(tree.join("listener")).unwrap();
        std::os::unix::fs::symlink("bin/Runner.Listener", tree.join("listener")).unwrap();
        assert_eq!(proven_by_construction(&tree, &x).unwrap(), None, "replaced");

        let tree = root.path().join("v");
        let x = extracted(&tree);
        std::fs::write(tree.join("bin/extra"), b"x").unwrap();
        assert_eq!(proven_by_construction(&tree, &x).unwrap(), None, "extra");

        let tree = root.path().join("c");
        let x = extracted(&tree);
        std::fs::set_permissions(
            tree.join("run.sh"),
            std::os::unix::fs::PermissionsExt::from_mode(0o744),
        )
        .unwrap();
        assert_eq!(proven_by_construction(&tree, &x).unwrap(), None, "chmodded");

        let tree = root.path().join("w");
        let x = extracted(&tree);
        std::fs::remove_file(tree.join("run.sh")).unwrap();
        assert_eq!(proven_by_construction(&tree, &x).unwrap(), None, "missing");
    }
}
