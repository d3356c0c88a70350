//! `_diag/<Kind>_<yyyyMMdd-HHmmss>-utc.log`, as the real runner names them.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::fake_github::clock::{diag_stamp, iso8601, unix_now};

/// Which component writes the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiagKind {
    Runner,
    Worker,
}

impl DiagKind {
    fn prefix(self) -> &'static str {
        match self {
            Self::Runner => "Runner",
            Self::Worker => "Worker",
        }
    }
}

/// An append-only diagnostic log.
#[derive(Debug)]
pub struct DiagLog {
    file: File,
    pub path: PathBuf,
    kind: DiagKind,
}

impl DiagLog {
    /// Creates `_diag` under `root` if needed and opens a new log named for now.
    pub fn create(root: &Path, kind: DiagKind) -> std::io::Result<Self> {
        let dir = root.join("_diag");
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(format!(
            "{}_{}-utc.log",
            kind.prefix(),
            diag_stamp(unix_now())
        ));
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        Ok(Self { file, path, kind })
    }

    /// Writes one line. Callers pass fixed messages and non-secret values only.
    /// An `INFO` line.
    pub fn info(&mut self, message: &str) {
        self.line("INFO", message);
    }

    pub fn line(&mut self, level: &str, message: &str) {
        // A log that cannot be written must not stop the runner; the real one carries on too.
        let _ = writeln!(
            self.file,
            "[{} {level} {}] {message}",
            iso8601(unix_now()),
            self.kind.prefix()
        );
    }
}
