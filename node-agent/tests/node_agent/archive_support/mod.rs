//! Shared by the package tests that need a runner archive: a gzip'd tar of regular files, as
//! GitHub's runner package is laid out (`packages.rs` keeps its own builder, which also writes
//! directories and links).
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

/// A `.tar.gz` of `(path, bytes, mode)` regular files, with fixed mtimes so the same files give
/// the same archive (and sha256).
pub fn tar_gz(files: &[(&str, &[u8], u32)]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    for (path, data, mode) in files {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(0);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(*mode);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, path, *data).unwrap();
    }
    b.into_inner().unwrap().finish().unwrap()
}
