//! Safe extraction of a verified `.tar.gz` into a staging directory. Refused: absolute paths,
//! `..`, a path through an extracted link, links whose target leaves the tree, devices, FIFOs
//! and anything else that is not a directory, file, link or hard link; and a top-level `_work`
//! (a package that once ran a job). Modes are normalised (0755 directories, 0755/0644 files);
//! setuid, setgid and sticky bits are never applied. Every file is hashed as it is written,
//! which gives the [`PackageContents`] the trees are later verified against.
//!
//! Pipelined: the gzip stream is inflated on a thread of its own while the tar entries are
//! written and hashed on the caller's, and the source is read to its end before the extraction
//! counts as done (a download streamed in says there whether its digest matched; see
//! [`super::download::TapReader`]). Each file's and link's [`Stamp`] is taken from the
//! descriptor that wrote it, after its last write, so the cache can tell that the tree it
//! fingerprints later is still what was hashed here ([`super::origin::proven_by_construction`]).
//!
//! Capped ([`ExtractLimits`]): an archive is a tenant's choice (its policy names the URL and the
//! digest), and a small one can inflate without bound. Bytes are counted as they are written,
//! not taken from headers, so a lying header or a sparse entry cannot slip past.

use std::collections::{BTreeSet, HashMap};
use std::fs::{DirBuilder, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

use super::contents::{EntryRecord, PackageContents};
use super::fingerprint::Stamp;
use crate::workspace::WORK_DIR;

/// What one package archive may inflate to. The defaults sit well above GitHub's runner
/// (about 9,000 entries, under 300 MB unpacked, its largest file under 120 MB) and its growth; an admin sets
/// them with the agent's `--package-max-*` flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtractLimits {
    /// All files together, in bytes (hard links count again: they become copies).
    pub max_total_bytes: u64,
    /// Entries of any kind.
    pub max_entries: u64,
    /// One file, in bytes.
    pub max_file_bytes: u64,
}

impl Default for ExtractLimits {
    fn default() -> Self {
        Self {
            max_total_bytes: 4 << 30,
            max_entries: 100_000,
            max_file_bytes: 1 << 30,
        }
    }
}

/// Which cap an archive exceeded (closed: it reaches conditions and events).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtractCap {
    TotalBytes,
    Entries,
    FileBytes,
}

impl ExtractCap {
    /// The agent flag that raises this cap.
    pub fn flag(self) -> &'static str {
        match self {
            Self::TotalBytes => "--package-max-bytes",
            Self::Entries => "--package-max-entries",
            Self::FileBytes => "--package-max-file-bytes",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Self::TotalBytes => "bytes in all",
            Self::Entries => "entries",
            Self::FileBytes => "bytes in one file",
        }
    }
}

/// Why an archive was refused. Terminal: the same archive refuses the same way.
#[derive(Debug, thiserror::Error)]
pub enum ExtractError {
    #[error("the archive holds an absolute path or one that climbs out with `..`")]
    UnsafePath,
    #[error("the archive holds a link whose target leaves the package")]
    EscapingLink,
    #[error("the archive writes through a link it holds")]
    ThroughLink,
    #[error("the archive holds a device, FIFO or other special entry")]
    SpecialEntry,
    #[error("the archive holds the same path twice")]
    Duplicate,
    #[error("the archive holds a top-level `_work`: a package that ran a job is never used")]
    TopLevelWork,
    #[error(
        "the archive inflates past the agent's cap of {limit} {}; the package is refused for this digest until the agent restarts (raise {} if the package is legitimate)",
        cap.what(),
        cap.flag()
    )]
    TooLarge { cap: ExtractCap, limit: u64 },
    #[error(
        "the archive holds more than {limit} bytes between two entries (long names, link names, PAX records, or data on an entry that holds none)"
    )]
    OversizedHeader { limit: u64 },
    #[error("the archive could not be read or written ({0})")]
    Io(#[from] io::Error),
}

impl ExtractError {
    /// Whether the archive itself is at fault (terminal), rather than the disk.
    pub fn is_unsafe_archive(&self) -> bool {
        !matches!(self, Self::Io(_))
    }
}

/// A relative path with only normal components (a leading `./` dropped); `None` for the root
/// entry itself; an error for anything absolute or climbing.
fn normalise(path: &Path) -> Result<Option<PathBuf>, ExtractError> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::Normal(c) => out.push(c),
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(ExtractError::UnsafePath);
            }
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

/// Whether a link at `entry` pointing at `target` stays inside the package. A target is
/// leading `..`s (which climb real directories: nothing is extracted below a link) and then
/// normal names only; a `..` after a name could climb out of another link's target, so it is
/// refused rather than resolved.
fn link_stays_inside(entry: &Path, target: &Path) -> bool {
    if target.is_absolute() {
        return false;
    }
    let mut depth: usize = entry.components().count().saturating_sub(1);
    let mut named = false;
    for component in target.components() {
        match component {
            Component::CurDir => {}
            Component::Normal(_) => {
                named = true;
                depth += 1;
            }
            Component::ParentDir if named => return false,
            Component::ParentDir => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return false,
            },
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// What an extraction has used of its limits so far.
struct Budget {
    limits: ExtractLimits,
    entries: u64,
    bytes: u64,
}

impl Budget {
    fn entry(&mut self) -> Result<(), ExtractError> {
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            return Err(ExtractError::TooLarge {
                cap: ExtractCap::Entries,
                limit: self.limits.max_entries,
            });
        }
        Ok(())
    }

    /// How many bytes the next file may have, and which cap says so.
    fn file_allowance(&self) -> (u64, ExtractCap, u64) {
        let left = self.limits.max_total_bytes.saturating_sub(self.bytes);
        if left < self.limits.max_file_bytes {
            (left, ExtractCap::TotalBytes, self.limits.max_total_bytes)
        } else {
            (
                self.limits.max_file_bytes,
                ExtractCap::FileBytes,
                self.limits.max_file_bytes,
            )
        }
    }
}

/// What an extraction wrote.
#[derive(Debug)]
pub struct Extracted {
    pub contents: PackageContents,
    /// Every file's and link's stamp right after it was written, by relative path.
    pub stamps: HashMap<PathBuf, Stamp>,
}

/// Extracts `archive` (gzip-compressed tar) into the empty directory `dest`, within `limits`.
pub fn extract_tar_gz(
    archive: &Path,
    dest: &Path,
    limits: ExtractLimits,
) -> Result<PackageContents, ExtractError> {
    extract_tar_gz_from(File::open(archive)?, dest, limits).map(|e| e.contents)
}

/// How much inflated data one hand-over between the two threads carries.
const INFLATE_CHUNK: usize = 256 * 1024;

/// What the tar reader may read between two entries it yields: headers, GNU long names and long
/// link names, PAX records, and the skipped data of an entry that holds none. The tar crate reads
/// a long name or PAX body into memory whole, as large as its header declares (a path is at most
/// 4 KiB), so this is what bounds the memory an unverified stream can make the agent allocate.
pub const MAX_HEADER_BYTES: u64 = 256 * 1024;

/// Inflated bytes allowed per entry beyond the files' own bytes (its header, padding and a long
/// name), for the inflater's cap on the whole stream.
const ENTRY_ALLOWANCE: u64 = 8 * 1024;

/// Slack for the end-of-archive blocks and a tar record's zero padding.
const TRAILER_ALLOWANCE: u64 = 1 << 20;

/// How many inflated bytes an archive within `limits` can hold at most: anything past it is
/// refused while inflating, whatever the tar side reads or skips.
fn inflate_cap(limits: ExtractLimits) -> u64 {
    limits
        .max_total_bytes
        .saturating_add(limits.max_entries.saturating_mul(ENTRY_ALLOWANCE))
        .saturating_add(TRAILER_ALLOWANCE)
}

/// Extracts the gzip-compressed tar read from `source` into the empty directory `dest`, within
/// `limits`: inflated on a second thread, and `source` read to its end (an error there fails the
/// extraction) even when the tar's end-of-archive marker came first.
pub fn extract_tar_gz_from(
    source: impl Read + Send,
    dest: &Path,
    limits: ExtractLimits,
) -> Result<Extracted, ExtractError> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<io::Result<Vec<u8>>>(8);
    let cap = inflate_cap(limits);
    let over_cap = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let over_cap = &over_cap;
        let inflater = scope.spawn(move || -> io::Result<()> {
            let mut gz = flate2::read::GzDecoder::new(source);
            let mut inflated = 0u64;
            loop {
                let mut buf = vec![0u8; INFLATE_CHUNK];
                let n = match read_some(&mut gz, &mut buf) {
                    Ok(n) => n,
                    Err(e) => {
                        let _ = tx.send(Err(io::Error::new(e.kind(), e.to_string())));
                        return Err(e);
                    }
                };
                if n == 0 {
                    break;
                }
                // Counted here, not only where files are written: the tar side skips what it
                // does not extract by inflating it too.
                inflated += n as u64;
                if inflated > cap {
                    over_cap.store(true, std::sync::atomic::Ordering::Relaxed);
                    let _ = tx.send(Err(io::Error::other("the archive inflates past its cap")));
                    break;
                }
                buf.truncate(n);
                if tx.send(Ok(buf)).is_err() {
                    // The tar side is done (its end marker, or a refusal): no need to inflate
                    // the rest, only to read it.
                    break;
                }
            }
            drop(tx);
            // Read to the source's end: a streamed download gives its digest's verdict there.
            io::copy(&mut gz.into_inner(), &mut io::sink()).map(drop)
        });
        let written = extract_entries(ChannelReader::new(rx), dest, limits);
        // The receiver went with `written`'s reader: the inflater stops sending and drains.
        let drained = inflater
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the inflating thread panicked")));
        if over_cap.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(ExtractError::TooLarge {
                cap: ExtractCap::TotalBytes,
                limit: limits.max_total_bytes,
            });
        }
        let extracted = written?;
        drained?;
        Ok(extracted)
    })
}

/// One read (what the stream has now, so the tar side never waits for a full buffer while the
/// download still streams); 0 at the end.
fn read_some(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match reader.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            other => return other,
        }
    }
}

/// The inflated stream, as handed over by the inflating thread. Ends when the sender goes (after
/// the last chunk, or after an error it passed on).
struct ChannelReader {
    rx: std::sync::mpsc::Receiver<io::Result<Vec<u8>>>,
    buf: Vec<u8>,
    pos: usize,
}

impl ChannelReader {
    fn new(rx: std::sync::mpsc::Receiver<io::Result<Vec<u8>>>) -> Self {
        Self {
            rx,
            buf: Vec::new(),
            pos: 0,
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.buf.len() {
            match self.rx.recv() {
                Ok(Ok(chunk)) => {
                    self.buf = chunk;
                    self.pos = 0;
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// How much the tar reader read since the last entry it yielded, while it looks for the next.
#[derive(Default)]
struct Gap {
    /// Whether reads count (between entries) or not (an entry's data, read by the extraction).
    armed: std::cell::Cell<bool>,
    bytes: std::cell::Cell<u64>,
    tripped: std::cell::Cell<bool>,
}

/// The tar stream, failing any read that takes a gap between two entries past
/// [`MAX_HEADER_BYTES`] (the tar crate would read on: into a long name's buffer, or through an
/// entry's skipped data).
struct GapReader<R> {
    inner: R,
    gap: std::rc::Rc<Gap>,
}

impl<R: Read> Read for GapReader<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if !self.gap.armed.get() {
            return self.inner.read(out);
        }
        let left = MAX_HEADER_BYTES.saturating_sub(self.gap.bytes.get());
        if left == 0 && !out.is_empty() {
            self.gap.tripped.set(true);
            return Err(io::Error::other("the archive's headers exceed their cap"));
        }
        let want = out.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut out[..want])?;
        self.gap.bytes.set(self.gap.bytes.get() + n as u64);
        Ok(n)
    }
}

fn extract_entries(
    tar_stream: impl Read,
    dest: &Path,
    limits: ExtractLimits,
) -> Result<Extracted, ExtractError> {
    let mut budget = Budget {
        limits,
        entries: 0,
        bytes: 0,
    };
    let gap = std::rc::Rc::new(Gap::default());
    let mut tar = tar::Archive::new(GapReader {
        inner: tar_stream,
        gap: std::rc::Rc::clone(&gap),
    });
    let oversized = |e: io::Error| -> ExtractError {
        if gap.tripped.get() {
            ExtractError::OversizedHeader {
                limit: MAX_HEADER_BYTES,
            }
        } else {
            ExtractError::Io(e)
        }
    };
    let mut contents = PackageContents::default();
    let mut stamps = HashMap::new();
    // One buffer for every file (a fresh one per file cost an allocation and its zeroing each).
    let mut buf = vec![0u8; 256 * 1024];
    // Links are created last, so nothing is ever written through one; an entry below a link
    // path is refused.
    let mut links: Vec<(PathBuf, PathBuf)> = Vec::new();
    let mut link_paths = BTreeSet::new();
    let mut entries = tar.entries()?;
    loop {
        gap.bytes.set(0);
        gap.armed.set(true);
        let Some(entry) = entries.next() else {
            break;
        };
        gap.armed.set(false);
        let mut entry = entry.map_err(oversized)?;
        budget.entry()?;
        let Some(rel) = normalise(&entry.path()?)? else {
            continue;
        };
        if rel
            .components()
            .next()
            .is_some_and(|c| c.as_os_str() == WORK_DIR)
        {
            return Err(ExtractError::TopLevelWork);
        }
        if rel.ancestors().skip(1).any(|a| link_paths.contains(a)) {
            return Err(ExtractError::ThroughLink);
        }
        if contents.entries.contains_key(&rel) || link_paths.contains(&rel) {
            // A directory listed twice is harmless; anything else twice is not.
            if entry.header().entry_type().is_dir()
                && contents.entries.get(&rel) == Some(&EntryRecord::Dir)
            {
                continue;
            }
            return Err(ExtractError::Duplicate);
        }
        let target = dest.join(&rel);
        let kind = entry.header().entry_type();
        if kind.is_dir() {
            make_parents(dest, &rel, &mut contents)?;
            DirBuilder::new().mode(0o755).create(&target)?;
            contents.entries.insert(rel, EntryRecord::Dir);
        } else if kind.is_file() {
            let executable = entry.header().mode()? & 0o111 != 0;
            make_parents(dest, &rel, &mut contents)?;
            let (size, sha256, stamp) =
                write_new(&target, executable, &mut entry, &mut budget, &mut buf)?;
            stamps.insert(rel.clone(), stamp);
            contents.entries.insert(
                rel,
                EntryRecord::File {
                    size,
                    executable,
                    sha256,
                },
            );
        } else if kind.is_symlink() {
            let link = entry
                .link_name()?
                .ok_or(ExtractError::EscapingLink)?
                .into_owned();
            if !link_stays_inside(&rel, &link) {
                return Err(ExtractError::EscapingLink);
            }
            link_paths.insert(rel.clone());
            links.push((rel, link));
        } else if kind.is_hard_link() {
            // A hard link becomes a copy of a file already extracted: nothing outside can be
            // named, and the copy is verified like any file.
            let Some(source) = entry
                .link_name()?
                .map(|l| normalise(&l))
                .transpose()?
                .flatten()
            else {
                return Err(ExtractError::UnsafePath);
            };
            let Some(record @ EntryRecord::File { executable, .. }) =
                contents.entries.get(&source).cloned()
            else {
                return Err(ExtractError::EscapingLink);
            };
            make_parents(dest, &rel, &mut contents)?;
            let mut from = File::open(dest.join(&source))?;
            let (size, sha256, stamp) =
                write_new(&target, executable, &mut from, &mut budget, &mut buf)?;
            // The copy is recorded as its source's bytes: it must hold them (the source is read
            // back from staging, which nothing else should write, but the record is a claim).
            if !matches!(&record, EntryRecord::File { size: s, sha256: h, .. } if *s == size && *h == sha256)
            {
                return Err(ExtractError::Io(io::Error::other(
                    "a hard link's copy differs from the file it names",
                )));
            }
            stamps.insert(rel.clone(), stamp);
            contents.entries.insert(rel, record);
        } else {
            return Err(ExtractError::SpecialEntry);
        }
    }
    for (rel, link) in links {
        if rel.ancestors().skip(1).any(|a| link_paths.contains(a)) {
            return Err(ExtractError::ThroughLink);
        }
        make_parents(dest, &rel, &mut contents)?;
        let at = dest.join(&rel);
        std::os::unix::fs::symlink(&link, &at)?;
        stamps.insert(rel.clone(), Stamp::of(&std::fs::symlink_metadata(&at)?));
        contents
            .entries
            .insert(rel, EntryRecord::Symlink { target: link });
    }
    Ok(Extracted { contents, stamps })
}

/// Creates missing parents of `rel` (archives need not list directories first).
fn make_parents(dest: &Path, rel: &Path, contents: &mut PackageContents) -> io::Result<()> {
    let parents: Vec<&Path> = rel
        .ancestors()
        .skip(1)
        .filter(|a| !a.as_os_str().is_empty())
        .collect();
    for parent in parents.into_iter().rev() {
        if !contents.entries.contains_key(parent) {
            DirBuilder::new().mode(0o755).create(dest.join(parent))?;
            contents
                .entries
                .insert(parent.to_path_buf(), EntryRecord::Dir);
        }
    }
    Ok(())
}

/// Writes a new file (never an existing one, never through a link), hashing what it writes and
/// stopping at the first byte past the budget. Returns its size, digest and stamp (taken from the
/// descriptor after the last write and chmod).
fn write_new(
    path: &Path,
    executable: bool,
    from: &mut impl Read,
    budget: &mut Budget,
    buf: &mut [u8],
) -> Result<(u64, [u8; 32], Stamp), ExtractError> {
    let (allowance, cap, limit) = budget.file_allowance();
    let mode = if executable { 0o755 } else { 0o644 };
    let mut file = File::options()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)?;
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    loop {
        let n = from.read(buf)?;
        if n == 0 {
            break;
        }
        size += n as u64;
        if size > allowance {
            return Err(ExtractError::TooLarge { cap, limit });
        }
        hasher.update(&buf[..n]);
        file.write_all(&buf[..n])?;
    }
    budget.bytes += size;
    // The umask may have narrowed the mode: set it then only (one syscall less per file).
    let mut meta = file.metadata()?;
    if meta.permissions().mode() & 0o7777 != mode {
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        meta = file.metadata()?;
    }
    let stamp = Stamp::of(&meta);
    Ok((size, hasher.finalize().into(), stamp))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gzip'd tar of raw `(header, data)` pairs (headers as the test builds them, no
    /// end-of-archive blocks unless given).
    fn raw_tar_gz(entries: &[(tar::Header, Vec<u8>)], end: bool) -> Vec<u8> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        for (header, data) in entries {
            gz.write_all(header.as_bytes()).unwrap();
            gz.write_all(data).unwrap();
            let pad = (512 - data.len() % 512) % 512;
            gz.write_all(&vec![0u8; pad]).unwrap();
        }
        if end {
            gz.write_all(&[0u8; 1024]).unwrap();
        }
        gz.finish().unwrap()
    }

    fn header(kind: tar::EntryType, name: &str, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(0o755);
        h.set_mtime(0);
        h.set_size(size);
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_cksum();
        h
    }

    #[test]
    fn a_long_name_declaring_gigabytes_is_refused_before_it_is_read_into_memory() {
        // A GNU 'L' header declaring 8 GiB, followed by 64 MiB of it: the tar crate would read
        // all of it into one buffer (and the rest, had it been sent) before the next entry.
        let body = vec![b'a'; 64 << 20];
        let archive = raw_tar_gz(
            &[(
                header(tar::EntryType::GNULongName, "././@LongLink", 8 << 30),
                body,
            )],
            false,
        );
        let dest = tempfile::tempdir().unwrap();
        let err =
            extract_tar_gz_from(&archive[..], dest.path(), ExtractLimits::default()).unwrap_err();
        assert!(
            matches!(
                err,
                ExtractError::OversizedHeader {
                    limit: MAX_HEADER_BYTES
                }
            ),
            "{err:?}"
        );
        assert!(err.is_unsafe_archive());
    }

    #[test]
    fn data_on_an_entry_that_holds_none_is_not_skipped_by_inflating_it() {
        let archive = raw_tar_gz(
            &[(
                header(tar::EntryType::Directory, "d/", 16 << 20),
                vec![0u8; 16 << 20],
            )],
            true,
        );
        let dest = tempfile::tempdir().unwrap();
        let err =
            extract_tar_gz_from(&archive[..], dest.path(), ExtractLimits::default()).unwrap_err();
        assert!(
            matches!(err, ExtractError::OversizedHeader { .. }),
            "{err:?}"
        );
    }

    #[test]
    fn the_whole_stream_inflates_within_the_limits() {
        // Forty directories each carrying 200 KiB (under the gap's cap, so only the inflater's
        // count of the whole stream sees them): 8 MiB inflated against a 1 MiB archive.
        let limits = ExtractLimits {
            max_total_bytes: 1 << 20,
            max_entries: 64,
            max_file_bytes: 1 << 20,
        };
        let entries: Vec<_> = (0..40)
            .map(|i| {
                (
                    header(tar::EntryType::Directory, &format!("d{i}/"), 200 << 10),
                    vec![0u8; 200 << 10],
                )
            })
            .collect();
        let archive = raw_tar_gz(&entries, true);
        let dest = tempfile::tempdir().unwrap();
        let err = extract_tar_gz_from(&archive[..], dest.path(), limits).unwrap_err();
        assert!(
            matches!(
                err,
                ExtractError::TooLarge {
                    cap: ExtractCap::TotalBytes,
                    limit: 1_048_576
                }
            ),
            "{err:?}"
        );
        // The same directories without their data extract.
        let entries: Vec<_> = (0..40)
            .map(|i| {
                (
                    header(tar::EntryType::Directory, &format!("d{i}/"), 0),
                    Vec::new(),
                )
            })
            .collect();
        let dest = tempfile::tempdir().unwrap();
        extract_tar_gz_from(&raw_tar_gz(&entries, true)[..], dest.path(), limits).unwrap();
    }

    #[test]
    fn links_are_judged_by_where_they_land() {
        assert!(link_stays_inside(
            Path::new("bin/node"),
            Path::new("../externals/node")
        ));
        assert!(link_stays_inside(Path::new("a/b/c"), Path::new("../../x")));
        // `up -> ..` then `esc -> up/../x` would land outside: a `..` after a name is refused.
        assert!(!link_stays_inside(
            Path::new("sub/esc"),
            Path::new("up/../x")
        ));
        assert!(!link_stays_inside(
            Path::new("bin/node"),
            Path::new("../../etc/passwd")
        ));
        assert!(!link_stays_inside(Path::new("top"), Path::new("..")));
        assert!(!link_stays_inside(
            Path::new("bin/x"),
            Path::new("/etc/passwd")
        ));
        assert!(link_stays_inside(Path::new("bin/x"), Path::new("./y")));
    }

    #[test]
    fn paths_are_normalised_or_refused() {
        assert_eq!(
            normalise(Path::new("./bin/x")).ok().flatten(),
            Some(PathBuf::from("bin/x"))
        );
        assert!(matches!(normalise(Path::new("./")), Ok(None)));
        assert!(normalise(Path::new("../x")).is_err());
        assert!(normalise(Path::new("bin/../../x")).is_err());
        assert!(normalise(Path::new("/etc/x")).is_err());
    }
}
