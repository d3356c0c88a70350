//! `bin/Runner.Listener run`: reads its JIT configuration from `ACTIONS_RUNNER_INPUT_JITCONFIG`,
//! writes `_diag/Runner_*.log`, goes online, long-polls for one job, runs it through
//! `bin/Runner.Worker`, reports completion and exits (ephemeral). It never prints the JIT.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use secrecy::SecretString;
use tokio::io::AsyncWriteExt;

use super::client::{ClientError, RunnerClient};
use super::diag::{DiagKind, DiagLog};
use super::package::STANDIN_VERSION;
use crate::fake_github::clock::{iso8601, unix_now};
use crate::fake_github::jit::JitSettings;
use crate::fake_github::jobs::{AcquiredJob, Conclusion};

pub const JIT_ENV: &str = "ACTIONS_RUNNER_INPUT_JITCONFIG";
pub const DEPRECATED_EXIT_ENV: &str = "ACTIONS_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE";
/// The real runner's exit code for "this version is no longer accepted".
pub const EXIT_VERSION_DEPRECATED: i32 = 7;
const EXIT_FAILED: i32 = 1;
/// Seconds per long poll.
const POLL_SECS: u64 = 20;

fn say(message: &str) {
    println!("{}: {message}", iso8601(unix_now()));
}

/// The runner's root: the directory holding `bin/`.
pub fn runner_root() -> std::io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .ok_or_else(|| std::io::Error::other("the binary is not under <root>/bin"))
}

/// Persists the settings files into the root, owner-only, as the real runner does with a JIT.
fn write_settings(root: &Path, settings: &JitSettings) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let files = settings
        .files()
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    for (name, content) in files {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(root.join(name))?;
        std::io::Write::write_all(&mut f, &content)?;
    }
    Ok(())
}

/// Runs the listener; returns the process exit code.
pub async fn main(args: &[String]) -> i32 {
    if args != ["run"] {
        eprintln!("Usage: Runner.Listener run   (the stand-in accepts nothing else)");
        return EXIT_FAILED;
    }
    let root = match runner_root() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot find the runner root: {e}");
            return EXIT_FAILED;
        }
    };
    let mut log = match DiagLog::create(&root, DiagKind::Runner) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cannot write _diag: {e}");
            return EXIT_FAILED;
        }
    };
    log.info(&format!(
        "Runner.Listener (stand-in) version {STANDIN_VERSION} starting"
    ));
    let Some(raw) = std::env::var_os(JIT_ENV) else {
        log.line("ERROR", "no JIT configuration in the environment");
        eprintln!("Runner is not configured: {JIT_ENV} is not set");
        return EXIT_FAILED;
    };
    let jit = SecretString::from(raw.to_string_lossy().into_owned());
    let settings = match JitSettings::decode(&jit) {
        Ok(s) => s,
        Err(e) => {
            log.line("ERROR", &format!("invalid JIT configuration: {e}"));
            eprintln!("Invalid JIT configuration: {e}");
            return EXIT_FAILED;
        }
    };
    drop(jit);
    if let Err(e) = write_settings(&root, &settings) {
        log.line("ERROR", &format!("cannot write settings: {e}"));
        return EXIT_FAILED;
    }
    log.info(&format!(
        "runner {} (id {}) connecting",
        settings.runner.agent_name, settings.runner.agent_id
    ));
    let mut client = RunnerClient::new(&settings.runner.server_url);
    if let Err(e) = client.connect(&settings, STANDIN_VERSION).await {
        log.line("ERROR", &format!("session refused: {e}"));
        eprintln!("Failed to connect: {e}");
        if matches!(e, ClientError::VersionDeprecated) {
            let wants_7 = std::env::var(DEPRECATED_EXIT_ENV).is_ok_and(|v| v == "1");
            return if wants_7 {
                EXIT_VERSION_DEPRECATED
            } else {
                EXIT_FAILED
            };
        }
        return EXIT_FAILED;
    }
    println!("√ Connected to GitHub");
    println!("Current runner version: '{STANDIN_VERSION}'");
    say("Listening for Jobs");
    log.info("listening for jobs");
    let job = loop {
        match client.next_job(POLL_SECS).await {
            Ok(Some(job)) => break job,
            Ok(None) => {}
            Err(e) => {
                log.line("ERROR", &format!("polling failed: {e}"));
                eprintln!("Polling failed: {e}");
                return EXIT_FAILED;
            }
        }
    };
    say(&format!("Running job: {}", job.name));
    log.info(&format!("job {} acquired", job.job_id));
    let conclusion = match run_worker(&root, &job).await {
        Ok(0) => Conclusion::Success,
        Ok(code) => {
            log.info(&format!("worker exited {code}"));
            Conclusion::Failure
        }
        Err(e) => {
            log.line("ERROR", &format!("worker could not run: {e}"));
            Conclusion::Failure
        }
    };
    if let Err(e) = client.complete(job.job_id, conclusion).await {
        log.line("ERROR", &format!("completion not reported: {e}"));
        eprintln!("Failed to report completion: {e}");
        return EXIT_FAILED;
    }
    let result = match conclusion {
        Conclusion::Success => "Succeeded",
        Conclusion::Failure => "Failed",
        Conclusion::Cancelled => "Canceled",
    };
    say(&format!("Job {} completed with result: {result}", job.name));
    log.info(&format!(
        "job {} completed: {}",
        job.job_id,
        conclusion.as_str()
    ));
    client.disconnect().await;
    job.behaviour.listener_exit_code.unwrap_or(0)
}

/// Starts `bin/Runner.Worker spawnclient` with the job on stdin and waits for it.
async fn run_worker(root: &Path, job: &AcquiredJob) -> std::io::Result<i32> {
    let mut child = tokio::process::Command::new(root.join("bin").join("Runner.Worker"))
        .arg("spawnclient")
        .current_dir(root)
        .env_remove(JIT_ENV)
        .stdin(Stdio::piped())
        .spawn()?;
    let body = serde_json::to_vec(job).map_err(std::io::Error::other)?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(&body).await?;
        stdin.shutdown().await?;
    }
    let status = child.wait().await?;
    Ok(status.code().unwrap_or(EXIT_FAILED))
}
