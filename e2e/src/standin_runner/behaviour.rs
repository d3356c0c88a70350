//! What a queued job makes the stand-in runner do, carried in the job's metadata.

use serde::{Deserialize, Serialize};

/// A file the job writes under `_work`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkFile {
    /// Relative to `_work`; absolute paths and `..` are refused.
    pub path: String,
    #[serde(default)]
    pub bytes: u64,
}

/// A file under the directory an environment variable names (a tool's cache, `spec.caches`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheFile {
    /// The variable naming the directory (`npm_config_cache`); the job fails when it is unset.
    pub variable: String,
    /// Relative to that directory; absolute paths and `..` are refused.
    pub path: String,
    /// What the file holds; in `expect_cache`, `None` expects no file.
    #[serde(default)]
    pub content: Option<String>,
}

/// Job behaviours. The default is a job that succeeds at once.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobBehaviour {
    /// How long the job runs.
    #[serde(default)]
    pub duration_ms: u64,
    /// Files written into `_work`.
    #[serde(default)]
    pub write_files: Vec<WorkFile>,
    /// Checked first: the job fails unless each file holds what it says (a warm cache).
    #[serde(default)]
    pub expect_cache: Vec<CacheFile>,
    /// Then written (a tool filling its cache; a hostile job poisoning it).
    #[serde(default)]
    pub write_cache: Vec<CacheFile>,
    /// Hostile: replace `_work` with a symlink to this path.
    #[serde(default)]
    pub symlink_work_to: Option<String>,
    /// Leave a FIFO in the job's temp directory (`$TMPDIR`, else `_work/_temp`).
    #[serde(default)]
    pub fifo_in_tmp: bool,
    /// Hostile: leave a chain of directories this deep under `_work/deep`, a FIFO and a link
    /// out of the tree at its bottom.
    #[serde(default)]
    pub deep_tree_depth: Option<u32>,
    /// Hostile: leave this many files in one directory, `_work/wide`.
    #[serde(default)]
    pub wide_tree_entries: Option<u32>,
    /// Spawn a child that sleeps this long and outlives the listener.
    #[serde(default)]
    pub orphan_child_secs: Option<u64>,
    /// Hold this many MiB (every page written) for the job's duration: a job that outgrows its
    /// runner's memory limit, so a real kernel OOM-kills it (e2e/cluster/oci-check.sh).
    #[serde(default)]
    pub allocate_mib: Option<u64>,
    /// Shell steps, as a workflow's `run:` steps: each `bash -e -c` in `_work` with the
    /// runner's environment (its `DOCKER_HOST`), in order, before the job's duration; the first
    /// that fails fails the job. Their output goes to the worker's log.
    #[serde(default)]
    pub steps: Vec<String>,
    /// Keep the node busy for the job's duration (the busy-node benchmark): CPU and disk, from
    /// inside the runner's own cgroup, as a compiling job does.
    #[serde(default)]
    pub busy: Option<BusyLoad>,
    /// The worker's exit code; non-zero makes the job's conclusion `failure`.
    #[serde(default)]
    pub worker_exit_code: i32,
    /// The listener's exit code after the job (7 is the real runner's "deprecated version").
    #[serde(default)]
    pub listener_exit_code: Option<i32>,
}

/// What a busy job burns while it runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BusyLoad {
    /// Threads spinning on the CPU.
    #[serde(default)]
    pub threads: u32,
    /// MiB written (and synced) per second to a file under `_work`, rewritten from its start
    /// every 64 MiB.
    #[serde(default)]
    pub write_mib_per_sec: u64,
    /// An absolute path: the job ends as soon as it exists (checked every 100 ms), so the
    /// benchmark ends the load when its measurement ends rather than after a guessed duration.
    #[serde(default)]
    pub until_file: Option<String>,
}
