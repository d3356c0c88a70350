//! Builds the stand-in runner package: a `.tar.gz` laid out like
//! `actions-runner-linux-x64-<version>.tar.gz`, whose `bin/Runner.Listener` and
//! `bin/Runner.Worker` are the stand-in binary.

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
