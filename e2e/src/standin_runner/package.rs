//! Builds the stand-in runner package: a `.tar.gz` laid out like
//! `actions-runner-linux-x64-<version>.tar.gz`, whose `bin/Runner.Listener` and
//! `bin/Runner.Worker` are the stand-in binary.
//!
//! Two shapes: the small one the scenarios use (a few filler files), and the runner-sized one
//! the benchmarks use ([`Shape::RunnerSized`]: ≥ 9,000 files, ≥ 150 MB of incompressible bytes
//! besides the listener, laid out like GitHub's runner), built once per content and kept in a
//! cache ([`cached`]).

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use flate2::Compression;
use flate2::write::GzEncoder;
use sha2::{Digest, Sha256};

use crate::fake_github::state::PackageInfo;

/// The version the stand-in claims.
pub const STANDIN_VERSION: &str = "2.330.0";

#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    #[error("cannot read the stand-in listener binary {0}: {1}")]
    Listener(PathBuf, std::io::Error),
    #[error("cannot write the package {0}: {1}")]
    Write(PathBuf, std::io::Error),
    #[error("cannot use the package cache {0}: {1}")]
    Cache(PathBuf, std::io::Error),
}

/// How the package's filler is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shape {
    /// `filler_files` files of `filler_bytes` in total under `externals/`, of compressible text.
    Filler,
    /// Shaped like GitHub's runner (issue 15 item 8: the real one is ~147 MB and ~9,000 files):
    /// many small and a few large files under `bin/` and `externals/` (two node runtimes and
    /// their modules), of incompressible bytes so the archive is as large as what it unpacks to
    /// and the agent's download, digest and inflate cost what the real package's do.
    /// `filler_files`/`filler_bytes` are ignored.
    RunnerSized,
}

/// What to build.
#[derive(Debug, Clone)]
pub struct PackageSpec {
    pub version: String,
    /// The compiled stand-in (`standin-runner-listener`).
    pub listener_binary: PathBuf,
    /// Filler files under `externals/` (the real package has about 9,000 files).
    pub filler_files: u64,
    /// Total bytes of filler content (the real package unpacks to about 200 MB).
    pub filler_bytes: u64,
    pub shape: Shape,
}

impl PackageSpec {
    /// A small package for tests.
    #[must_use]
    pub fn small(listener_binary: PathBuf) -> Self {
        Self {
            version: STANDIN_VERSION.into(),
            listener_binary,
            filler_files: 16,
            filler_bytes: 64 * 1024,
            shape: Shape::Filler,
        }
    }

    /// A package shaped like the real one, for benchmarks.
    #[must_use]
    pub fn benchmark(listener_binary: PathBuf) -> Self {
        Self {
            version: STANDIN_VERSION.into(),
            listener_binary,
            filler_files: 9000,
            filler_bytes: 200 * 1024 * 1024,
            shape: Shape::Filler,
        }
    }

    /// The runner-sized package the end-to-end benches use ([`Shape::RunnerSized`]).
    #[must_use]
    pub fn runner_sized(listener_binary: PathBuf) -> Self {
        Self {
            version: STANDIN_VERSION.into(),
            listener_binary,
            filler_files: 0,
            filler_bytes: 0,
            shape: Shape::RunnerSized,
        }
    }

    #[must_use]
    pub fn file_name(&self) -> String {
        format!("actions-runner-linux-x64-{}.tar.gz", self.version)
    }
}

const RUN_SH: &str = "#!/bin/bash\n# Stand-in for actions/runner's run.sh.\ncd \"$(dirname \"$0\")\" || exit 1\nexec ./bin/Runner.Listener run \"$@\"\n";
const CONFIG_SH: &str = "#!/bin/bash\necho 'The stand-in runner registers only with a JIT configuration (ACTIONS_RUNNER_INPUT_JITCONFIG).' >&2\nexit 1\n";
const ENV_SH: &str = "#!/bin/bash\n# Stand-in for actions/runner's env.sh.\nexit 0\n";
const SAFE_SLEEP_SH: &str = "#!/bin/bash\nsleep \"$1\"\n";

fn append(
    tar: &mut tar::Builder<impl Write>,
    path: &str,
    mode: u32,
    data: &mut dyn Read,
    size: u64,
) -> std::io::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_size(size);
    header.set_mode(mode);
    header.set_mtime(1_700_000_000);
    header.set_entry_type(tar::EntryType::Regular);
    tar.append_data(&mut header, path, data)
}

/// Deterministic filler bytes (not all zeros, so compression does not make them vanish).
struct Filler {
    left: u64,
    state: u64,
}

impl Read for Filler {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = usize::try_from(self.left.min(buf.len() as u64)).unwrap_or(buf.len());
        for b in &mut buf[..n] {
            self.state = self
                .state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            *b = (self.state >> 59) as u8 + b'a';
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Deterministic incompressible bytes (splitmix64): a runner's binaries and assemblies hardly
/// compress, and the benchmarks must pay the real package's download and inflate.
struct Noise {
    left: u64,
    state: u64,
}

impl Noise {
    fn new(left: u64, seed: u64) -> Self {
        Self {
            left,
            state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03,
        }
    }

    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl Read for Noise {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = usize::try_from(self.left.min(buf.len() as u64)).unwrap_or(buf.len());
        for chunk in buf[..n].chunks_mut(8) {
            let word = self.next().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// A size in `[lo, hi)` drawn from `seed` (deterministic, so the package is the same each build).
fn spread(seed: u64, lo: u64, hi: u64) -> u64 {
    let mut n = Noise::new(0, seed.wrapping_add(0x5EED));
    lo + n.next() % (hi - lo)
}

/// The filler files of [`Shape::RunnerSized`] (path, mode, size), besides the listener and the
/// scripts: what GitHub's runner holds, in round figures — `bin/` with ~800 assemblies (a few
/// large), two node runtimes under `externals/` with their executables and ~8,300 small module
/// files: 9,106 files, ~157 MB (the listener, a debug binary of ~33 MB, comes on top).
#[must_use]
pub fn runner_sized_files() -> Vec<(String, u32, u64)> {
    const MB: u64 = 1024 * 1024;
    let mut files = Vec::with_capacity(9_200);
    for (i, name) in [
        "Runner.Common",
        "Runner.Sdk",
        "Runner.Plugins",
        "System.Private.CoreLib",
    ]
    .into_iter()
    .enumerate()
    {
        files.push((format!("bin/{name}.dll"), 0o644, 8 * MB + (i as u64) * MB));
    }
    for i in 0..800u64 {
        let size = spread(i, 4 * 1024, 44 * 1024);
        files.push((format!("bin/System.Lib{i}.dll"), 0o644, size));
    }
    for (node, size) in [("node20", 44 * MB), ("node16", 38 * MB)] {
        files.push((format!("externals/{node}/bin/node"), 0o755, size));
    }
    for i in 0..8_300u64 {
        let node = if i % 2 == 0 { "node20" } else { "node16" };
        let size = spread(1_000_000 + i, 256, 4 * 1024);
        files.push((
            format!("externals/{node}/lib/node_modules/m{}/f{i}.js", i / 100),
            0o644,
            size,
        ));
    }
    files
}

/// Writes the package into `dir` and returns its description (sha256, size).
pub fn build(spec: &PackageSpec, dir: &Path) -> Result<PackageInfo, PackageError> {
    let path = dir.join(spec.file_name());
    let werr = |e| PackageError::Write(path.clone(), e);
    let listener = std::fs::read(&spec.listener_binary)
        .map_err(|e| PackageError::Listener(spec.listener_binary.clone(), e))?;
    let out = File::create(&path).map_err(werr)?;
    let gz = GzEncoder::new(BufWriter::new(out), Compression::fast());
    let mut tar = tar::Builder::new(gz);
    let len = listener.len() as u64;
    append(
        &mut tar,
        "bin/Runner.Listener",
        0o755,
        &mut listener.as_slice(),
        len,
    )
    .map_err(werr)?;
    // The worker is the same program; a hard link keeps the package (and its build) half the size.
    let mut link = tar::Header::new_gnu();
    link.set_entry_type(tar::EntryType::Link);
    link.set_size(0);
    link.set_mode(0o755);
    link.set_mtime(1_700_000_000);
    tar.append_link(&mut link, "bin/Runner.Worker", "bin/Runner.Listener")
        .map_err(werr)?;
    for (name, text) in [
        ("run.sh", RUN_SH),
        ("config.sh", CONFIG_SH),
        ("env.sh", ENV_SH),
        ("safe_sleep.sh", SAFE_SLEEP_SH),
    ] {
        append(
            &mut tar,
            name,
            0o755,
            &mut text.as_bytes(),
            text.len() as u64,
        )
        .map_err(werr)?;
    }
    match spec.shape {
        Shape::Filler => {
            let files = spec.filler_files.max(1);
            let per_file = spec.filler_bytes / files;
            for i in 0..files {
                let size = if i == 0 {
                    per_file + spec.filler_bytes % files
                } else {
                    per_file
                };
                let name = format!("externals/node20/lib/node_modules/m{}/f{i}.js", i / 100);
                let mut filler = Filler {
                    left: size,
                    state: i,
                };
                append(&mut tar, &name, 0o644, &mut filler, size).map_err(werr)?;
            }
        }
        Shape::RunnerSized => {
            for (i, (name, mode, size)) in runner_sized_files().into_iter().enumerate() {
                let mut noise = Noise::new(size, i as u64);
                append(&mut tar, &name, mode, &mut noise, size).map_err(werr)?;
            }
        }
    }
    let gz = tar.into_inner().map_err(werr)?;
    let mut buf = gz.finish().map_err(werr)?;
    buf.flush().map_err(werr)?;
    drop(buf);
    let (sha256, size) = digest(&path).map_err(werr)?;
    Ok(PackageInfo {
        version: spec.version.clone(),
        file_name: spec.file_name(),
        sha256,
        size,
        path,
    })
}

fn digest(path: &Path) -> std::io::Result<(String, u64)> {
    let mut f = File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        size += n as u64;
    }
    Ok((hex::encode(h.finalize()), size))
}

/// Unpacks a package into `dest` (for tests and by-hand use).
pub fn unpack(package: &Path, dest: &Path) -> std::io::Result<()> {
    let f = File::open(package)?;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(f));
    archive.set_preserve_permissions(true);
    archive.unpack(dest)
}

/// Bumped when [`build`]'s output changes for the same spec, so a cached package is rebuilt.
const GENERATOR: &str = "standin-package/2";

/// The package `spec` describes, from the cache under `root` (built there first if missing).
/// Keyed by content: the listener's bytes, the spec and [`GENERATOR`]; so an unchanged package is
/// never built again, and a rebuilt listener gets a new one. Written under a temporary name and
/// renamed, so concurrent builders (two benches) never serve a half-written archive. Other
/// entries unused for two hours are removed.
pub fn cached(spec: &PackageSpec, root: &Path) -> Result<PackageInfo, PackageError> {
    let cerr = |e| PackageError::Cache(root.to_path_buf(), e);
    let listener = std::fs::read(&spec.listener_binary)
        .map_err(|e| PackageError::Listener(spec.listener_binary.clone(), e))?;
    let mut key = Sha256::new();
    key.update(GENERATOR.as_bytes());
    key.update(
        format!(
            "{}|{}|{}|{:?}",
            spec.version, spec.filler_files, spec.filler_bytes, spec.shape
        )
        .as_bytes(),
    );
    key.update(&listener);
    drop(listener);
    let key = hex::encode(key.finalize());
    let dir = root.join(&key[..24]);
    let archive = dir.join(spec.file_name());
    let digest_file = dir.join("sha256");
    if let (Ok(sha256), Ok(meta)) = (
        std::fs::read_to_string(&digest_file),
        std::fs::metadata(&archive),
    ) {
        let _ = filetime_touch(&dir);
        return Ok(PackageInfo {
            version: spec.version.clone(),
            file_name: spec.file_name(),
            sha256: sha256.trim().to_owned(),
            size: meta.len(),
            path: archive,
        });
    }
    std::fs::create_dir_all(root).map_err(cerr)?;
    prune(root, &key[..24]);
    let staging = root.join(format!(".build-{}-{}", &key[..24], std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(cerr)?;
    let built = build(spec, &staging)?;
    std::fs::write(staging.join("sha256"), &built.sha256).map_err(cerr)?;
    // Another builder may have won the race: its entry is the same bytes.
    if std::fs::rename(&staging, &dir).is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    Ok(PackageInfo {
        path: archive,
        ..built
    })
}

/// Marks a cache entry used (its directory's mtime), so [`prune`] keeps it.
fn filetime_touch(dir: &Path) -> std::io::Result<()> {
    let f = File::open(dir)?;
    f.set_modified(std::time::SystemTime::now())
}

/// Removes the cache entries other than `keep` not used for two hours: a runner-sized entry is
/// ~170 MB and every rebuilt listener makes one (40 minutes of parallel edits to the e2e crate made 1.2 GB);
/// a bench touches its entry each time it asks for it, so a running one keeps it.
fn prune(root: &Path, keep: &str) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    let stale_after = std::time::Duration::from_secs(2 * 3600);
    for entry in entries.flatten() {
        let stale = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > stale_after);
        if stale && entry.file_name() != keep {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runner_sized_shape_is_the_size_of_githubs_runner() {
        let files = runner_sized_files();
        let bytes: u64 = files.iter().map(|f| f.2).sum();
        assert!(files.len() >= 9_000, "{} files", files.len());
        assert!(bytes >= 150 * 1024 * 1024, "{bytes} bytes");
        assert!(files.iter().filter(|f| f.0.starts_with("bin/")).count() > 500);
        assert!(
            files
                .iter()
                .any(|f| f.0.starts_with("externals/") && f.2 > 30 << 20)
        );
        let names: std::collections::BTreeSet<&String> = files.iter().map(|f| &f.0).collect();
        assert_eq!(names.len(), files.len(), "no path twice");
    }

    #[test]
    fn noise_does_not_compress() {
        let mut raw = Vec::new();
        Noise::new(1 << 20, 7).read_to_end(&mut raw).unwrap();
        let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
        gz.write_all(&raw).unwrap();
        let packed = gz.finish().unwrap();
        assert!(
            packed.len() as f64 > raw.len() as f64 * 0.99,
            "{}",
            packed.len()
        );
    }

    #[test]
    fn a_cached_package_is_built_once_per_content() {
        let dir = tempfile::tempdir().unwrap();
        let listener = dir.path().join("listener");
        std::fs::write(&listener, b"first").unwrap();
        let spec = PackageSpec::small(listener.clone());
        let root = dir.path().join("cache");
        let a = cached(&spec, &root).unwrap();
        let built_at = std::fs::metadata(&a.path).unwrap().modified().unwrap();
        let b = cached(&spec, &root).unwrap();
        assert_eq!((&a.path, &a.sha256, a.size), (&b.path, &b.sha256, b.size));
        assert_eq!(
            std::fs::metadata(&b.path).unwrap().modified().unwrap(),
            built_at,
            "not rebuilt"
        );
        assert_eq!(digest(&b.path).unwrap(), (b.sha256.clone(), b.size));
        // Another listener is another package.
        std::fs::write(&listener, b"second").unwrap();
        let c = cached(&spec, &root).unwrap();
        assert_ne!(c.path, a.path);
        assert_ne!(c.sha256, a.sha256);
    }
}
