//! The job gate on the node (`spec.workspace.forkPullRequests`,
//! [`runner_manager_crds::job_admission`]): where a runner's job-started hook asks whether its
//! job may run.
//!
//! Per attempt whose rule is `Refuse`, the agent makes `<host root>/gates/<attempt uuid>/`
//! (root's, 0755) holding the hook script (root's, 0755: the runner may read and run it, not
//! change it) and a Unix socket (the runner account's, 0600: no other account can connect),
//! and points the listener's `ACTIONS_RUNNER_HOOK_JOB_STARTED` at the script. The runner runs
//! the hook before any step of a job; the hook runs this binary's client
//! ([`client_main`], `--job-gate SOCKET`) with the `GITHUB_REPOSITORY` and `GITHUB_RUN_ID` the
//! runner was given, and the agent answers from the broker's decision. A refused job fails at
//! its start with the reason in its log; no step of it runs. Everything that goes wrong fails
//! closed: no socket, no answer, no broker, an unreadable claim all refuse.
//!
//! Nothing of the runtime is trusted: the directory is outside it (a slot's runtime is the
//! runner account's, and a former job could have left anything there), and what the socket
//! is told only says where the broker should look.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use runner_manager_crds::job_admission::{JobAdmissionAnswer, JobRefusal};
use serde::{Deserialize, Serialize};

/// Under the agent's host root.
pub const GATES_DIR: &str = "gates";
const SOCKET: &str = "gate.sock";
const HOOK: &str = "job-started.sh";
/// The runner's job-started hook variable.
pub const HOOK_VARIABLE: &str = "ACTIONS_RUNNER_HOOK_JOB_STARTED";
/// A hook the policy's `runner.env` named, run by the gate's hook after an admission.
pub const NEXT_HOOK_VARIABLE: &str = "RUNNER_MANAGER_NEXT_JOB_STARTED_HOOK";
/// The client's argument.
pub const CLIENT_FLAG: &str = "--job-gate";
/// The most bytes of a claim or an answer.
const MESSAGE_LIMIT: u64 = 16 * 1024;
/// How long the hook waits for its answer: a broker round trip and two GitHub calls, retried.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(90);
/// How long the agent waits for a connected hook to say its claim.
const CLAIM_TIMEOUT: Duration = Duration::from_secs(10);

/// What the hook tells the gate: where GitHub says the job comes from. Only a pointer for the
/// broker, which confirms it with GitHub.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Claim {
    pub repository: String,
    pub run_id: i64,
}

/// Where one attempt's gate lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatePaths {
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub hook: PathBuf,
}

impl GatePaths {
    /// `<host root>/gates/<12 hex>`: named like the attempt's runtime and unit, so the orphan
    /// sweep compares it with the same claims.
    pub fn of(host_root: &Path, attempt: &uuid::Uuid) -> Self {
        let dir = host_root
            .join(GATES_DIR)
            .join(runner_manager_crds::names::short_hex(*attempt));
        Self {
            socket: dir.join(SOCKET),
            hook: dir.join(HOOK),
            dir,
        }
    }
}

/// Why a gate could not be made. The launch fails before its JIT: a runner that would run
/// without its gate is not started.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("the job gate's directory {0} could not be made: {1}")]
    Directory(PathBuf, std::io::Error),
    #[error("the job gate's socket could not be bound: {0}")]
    Bind(std::io::Error),
    #[error("the job gate's hook could not be written: {0}")]
    Hook(std::io::Error),
    #[error("a job gate path holds a quote or a non-UTF-8 byte: {0}")]
    UnquotablePath(PathBuf),
    #[error("the attempt has no valid id to name its gate by")]
    NoAttemptId,
}

fn quoted(p: &Path) -> Result<String, GateError> {
    match p.to_str() {
        Some(s) if !s.contains('\'') => Ok(format!("'{s}'")),
        _ => Err(GateError::UnquotablePath(p.to_path_buf())),
    }
}

/// The hook script: the client, then the policy's own hook if `runner.env` named one. A gate
/// that `fails_closed` (the policy refuses fork pull requests) fails the job when the client
/// gets no admission; one kept only for the cache's verdict lets the job run without it (its
/// cache writes are then discarded: no verdict was recorded).
pub fn hook_script(helper: &Path, socket: &Path, fails_closed: bool) -> Result<String, GateError> {
    Ok(format!(
        "#!/bin/sh\n# runner-manager's job gate (spec.workspace.forkPullRequests, spec.caches); made by the node agent.\n{} {CLIENT_FLAG} {} || {}\nif [ -n \"${{{NEXT_HOOK_VARIABLE}:-}}\" ]; then exec bash -e \"${NEXT_HOOK_VARIABLE}\"; fi\n",
        quoted(helper)?,
        quoted(socket)?,
        if fails_closed { "exit 1" } else { "true" },
    ))
}

/// Makes the gate of one attempt (anything a crashed agent left there replaced) and binds its
/// socket, connectable by `uid` only. Blocking (a few syscalls).
pub fn prepare(
    paths: &GatePaths,
    helper: &Path,
    (uid, gid): (u32, u32),
    fails_closed: bool,
) -> Result<std::os::unix::net::UnixListener, GateError> {
    let script = hook_script(helper, &paths.socket, fails_closed)?;
    if let Some(parent) = paths.dir.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .map_err(|e| GateError::Directory(parent.to_path_buf(), e))?;
    }
    match std::fs::remove_dir_all(&paths.dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(GateError::Directory(paths.dir.clone(), e));
        }
        _ => {}
    }
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(&paths.dir)
        .and_then(|()| std::fs::set_permissions(&paths.dir, std::fs::Permissions::from_mode(0o755)))
        .map_err(|e| GateError::Directory(paths.dir.clone(), e))?;
    // Written whole under another name, then renamed: the runner never runs half a script.
    let partial = paths.dir.join(".hook.partial");
    std::fs::write(&partial, script)
        .and_then(|()| std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755)))
        .and_then(|()| std::fs::rename(&partial, &paths.hook))
        .map_err(GateError::Hook)?;
    let listener =
        std::os::unix::net::UnixListener::bind(&paths.socket).map_err(GateError::Bind)?;
    std::os::unix::fs::chown(&paths.socket, Some(uid), Some(gid))
        .and_then(|()| {
            std::fs::set_permissions(&paths.socket, std::fs::Permissions::from_mode(0o600))
        })
        .map_err(GateError::Bind)?;
    listener.set_nonblocking(true).map_err(GateError::Bind)?;
    Ok(listener)
}

/// The attempt names (12 hex) of the gates under `<host root>/gates`; entries of any other name
/// are not listed (nor ever removed).
pub fn gate_names(host_root: &Path) -> std::io::Result<Vec<String>> {
    crate::providers::launcher::attempt_names_in(&host_root.join(GATES_DIR))
}

/// Removes the gate of attempt name `short` (12 hex); whether it was there.
pub fn remove_named(host_root: &Path, short: &str) -> std::io::Result<bool> {
    if !crate::providers::launcher::is_attempt_short(short) {
        return Ok(false);
    }
    match std::fs::remove_dir_all(host_root.join(GATES_DIR).join(short)) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Removes an attempt's gate (its runner is gone). Missing is done.
pub fn remove(paths: &GatePaths) -> std::io::Result<()> {
    match std::fs::remove_dir_all(&paths.dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn refusal(message: &str) -> JobAdmissionAnswer {
    JobAdmissionAnswer {
        refused: Some(JobRefusal::Unconfirmed),
        message: message.to_owned(),
        write_back: false,
    }
}

/// Serves the gate until the task is dropped: each connection says one [`Claim`] and gets one
/// JSON line. Connections are served one at a time. A JIT runner runs one job, so only the
/// first claim is decided (`decide`: the broker, two GitHub reads); every later connection gets
/// that decision again for the same claim and a refusal for any other, without asking anyone:
/// a job that reaches the socket after its admission cannot spend the installation's GitHub
/// budget by claiming in a loop. A connection that says nothing in time, or something
/// unreadable, is refused (and decides nothing).
pub async fn serve<F, Fut>(listener: tokio::net::UnixListener, decide: F)
where
    F: Fn(Claim) -> Fut,
    Fut: std::future::Future<Output = JobAdmissionAnswer>,
{
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let mut decided: Option<(Claim, JobAdmissionAnswer)> = None;
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of descriptors, say: not a loop that spins the agent's CPU meanwhile.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        };
        let (read, mut write) = stream.into_split();
        let mut line = String::new();
        let said = tokio::time::timeout(
            CLAIM_TIMEOUT,
            BufReader::new(read.take(MESSAGE_LIMIT)).read_line(&mut line),
        )
        .await;
        let answer = match said {
            Ok(Ok(_)) => match (serde_json::from_str::<Claim>(line.trim()), &decided) {
                (Ok(claim), None) => {
                    let answer = decide(claim.clone()).await;
                    decided = Some((claim, answer.clone()));
                    answer
                }
                (Ok(claim), Some((first, answer))) if claim == *first => answer.clone(),
                (Ok(_), Some(_)) => refusal(
                    "runner-manager: this runner's job gate already decided its one job; another claim is refused",
                ),
                (Err(_), _) => {
                    refusal("runner-manager: the job gate could not read the hook's claim")
                }
            },
            _ => refusal("runner-manager: the hook said nothing in time"),
        };
        let mut out = serde_json::to_vec(&answer).unwrap_or_default();
        out.push(b'\n');
        let _ = write.write_all(&out).await;
        let _ = write.shutdown().await;
    }
}

/// The hook's side, run as the runner's account: `--job-gate SOCKET`. `None` when `args` are
/// not the client's. Prints the decision for the job's log; exits 0 when admitted.
pub fn client_main(args: &[OsString]) -> Option<i32> {
    if args.first().and_then(|a| a.to_str()) != Some(CLIENT_FLAG) {
        return None;
    }
    let answer = match args.get(1).filter(|_| args.len() == 2) {
        Some(socket) => ask(Path::new(socket)),
        None => Err("usage: --job-gate SOCKET".to_owned()),
    };
    Some(match answer {
        Ok(a) => {
            println!("{}", a.message);
            i32::from(a.refused.is_some())
        }
        Err(why) => {
            println!("runner-manager: the job gate refused the job: {why}");
            1
        }
    })
}

fn ask(socket: &Path) -> Result<JobAdmissionAnswer, String> {
    let repository = std::env::var("GITHUB_REPOSITORY")
        .map_err(|_| "the runner gave the hook no GITHUB_REPOSITORY".to_owned())?;
    let run_id = std::env::var("GITHUB_RUN_ID")
        .ok()
        .and_then(|r| r.parse::<i64>().ok())
        .ok_or_else(|| "the runner gave the hook no GITHUB_RUN_ID".to_owned())?;
    let mut stream = std::os::unix::net::UnixStream::connect(socket)
        .map_err(|e| format!("the node agent's gate could not be reached ({e})"))?;
    stream
        .set_read_timeout(Some(CLIENT_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(CLIENT_TIMEOUT)))
        .map_err(|e| e.to_string())?;
    let mut line = serde_json::to_vec(&Claim { repository, run_id }).map_err(|e| e.to_string())?;
    line.push(b'\n');
    stream
        .write_all(&line)
        .map_err(|e| format!("the claim could not be sent ({e})"))?;
    let mut body = String::new();
    stream
        .take(MESSAGE_LIMIT)
        .read_to_string(&mut body)
        .map_err(|e| format!("no answer came ({e})"))?;
    serde_json::from_str(body.trim()).map_err(|_| "the answer could not be read".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hook_fails_the_job_when_the_client_refuses_and_chains_a_policy_hook() {
        let s = hook_script(
            Path::new("/opt/rm/entry"),
            Path::new("/var/lib/rm/gates/x/gate.sock"),
            true,
        )
        .unwrap();
        assert!(s.contains("'/opt/rm/entry' --job-gate '/var/lib/rm/gates/x/gate.sock' || exit 1"));
        assert!(s.contains(NEXT_HOOK_VARIABLE));
        // A gate kept only for the cache's verdict lets the job run without one.
        let open = hook_script(Path::new("/e"), Path::new("/s"), false).unwrap();
        assert!(open.contains("'/e' --job-gate '/s' || true"), "{open}");
        assert!(matches!(
            hook_script(Path::new("/opt/it's/entry"), Path::new("/s"), true),
            Err(GateError::UnquotablePath(_))
        ));
    }

    #[test]
    fn a_claim_names_exactly_a_repository_and_a_run() {
        let c: Claim = serde_json::from_str(r#"{"repository":"acme/web","runId":7}"#).unwrap();
        assert_eq!(c.run_id, 7);
        assert!(
            serde_json::from_str::<Claim>(r#"{"repository":"a/b","runId":7,"verdict":"admit"}"#)
                .is_err()
        );
    }

    /// The gate over a real socket: an unreadable claim is refused and decides nothing; the
    /// first claim is decided; the same claim again gets the same answer and any other claim a
    /// refusal, neither asking the broker (a job looping on the socket cannot spend the GitHub
    /// budget: one decision per runner).
    #[tokio::test]
    async fn the_gate_decides_one_claim_per_runner_and_never_asks_twice() {
        let dir = tempfile::tempdir().unwrap();
        let paths = GatePaths::of(dir.path(), &uuid::Uuid::nil());
        let me = rustix::process::getuid().as_raw();
        let gid = rustix::process::getgid().as_raw();
        let listener = prepare(&paths, Path::new("/bin/true"), (me, gid), true).unwrap();
        let mode = std::fs::metadata(&paths.socket)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "only the runner's account may connect");
        let listener = tokio::net::UnixListener::from_std(listener).unwrap();
        let asked_broker = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counter = asked_broker.clone();
        let server = tokio::spawn(serve(listener, move |c: Claim| {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                if c.repository == "acme/web" {
                    JobAdmissionAnswer {
                        refused: None,
                        message: "admitted".into(),
                        write_back: false,
                    }
                } else {
                    JobAdmissionAnswer {
                        refused: Some(JobRefusal::ForkPullRequest),
                        message: "refused: a fork".into(),
                        write_back: false,
                    }
                }
            }
        }));
        let socket = paths.socket.clone();
        let asked = |repo: &'static str| {
            let socket = socket.clone();
            tokio::task::spawn_blocking(move || {
                let mut s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
                s.write_all(format!("{{\"repository\":\"{repo}\",\"runId\":1}}\n").as_bytes())
                    .unwrap();
                let mut body = String::new();
                s.read_to_string(&mut body).unwrap();
                serde_json::from_str::<JobAdmissionAnswer>(body.trim()).unwrap()
            })
        };
        // A garbage claim first: refused, and it decides nothing.
        let garbage = {
            let socket = socket.clone();
            tokio::task::spawn_blocking(move || {
                let mut s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
                s.write_all(b"{\"verdict\":\"admit\"}\n").unwrap();
                let mut body = String::new();
                s.read_to_string(&mut body).unwrap();
                serde_json::from_str::<JobAdmissionAnswer>(body.trim()).unwrap()
            })
            .await
            .unwrap()
        };
        assert_eq!(garbage.refused, Some(JobRefusal::Unconfirmed));
        assert_eq!(asked("acme/web").await.unwrap().refused, None);
        // The same claim again: the same answer, the broker not asked again.
        assert_eq!(asked("acme/web").await.unwrap().refused, None);
        // Any other claim after the decision: refused locally.
        let other = asked("mallory/web").await.unwrap();
        assert_eq!(
            other.refused,
            Some(JobRefusal::Unconfirmed),
            "{}",
            other.message
        );
        for _ in 0..20 {
            asked("acme/other").await.unwrap();
        }
        assert_eq!(
            asked_broker.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "a runner's claims in a loop reached the broker"
        );
        server.abort();
        remove(&paths).unwrap();
        assert!(!paths.dir.exists());
    }
}
