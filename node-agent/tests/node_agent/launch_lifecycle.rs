//! Termination (intent before signal, proof of death before the outcome), `_diag` evidence and
//! the exit-code reading, and the systemd launcher's exact unit properties. Runs as root.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::launch_support;

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Mutex;

use launch_support::*;
use runner_manager_crds::attempt::{Launcher, ProcessIdentity, TerminationReason};
use runner_manager_crds::outcome::{FailureReason, Outcome};
use runner_manager_crds::recovery::TerminateReason;
use runner_manager_crds::state::AttemptState;
use runner_manager_node_agent::evidence::{ExitReading, JobEvidence, job_evidence};
use runner_manager_node_agent::handoff::RestrictiveHandoff;
use runner_manager_node_agent::process::{Inspection, inspect};
use runner_manager_node_agent::providers::cgroup::CgroupLimits;
use runner_manager_node_agent::providers::launcher::StartError;
use runner_manager_node_agent::providers::systemd::{Handing, unit_properties};
use runner_manager_node_agent::providers::{LaunchSpec, RunnerLauncher, StopError, Stopped};
use runner_manager_node_agent::termination::{
    INTENT_FILE, IntentReason, TerminationError, read_intent, terminate,
};

/// `terminate` as the registration deadline asks it of a `Starting` attempt.
fn terminate_at_registration_deadline<L: RunnerLauncher + ?Sized>(
    launcher: &L,
    identity: &ProcessIdentity,
    runtime: &Path,
) -> Result<Outcome, TerminationError> {
    terminate(
        launcher,
        identity,
        runtime,
        IntentReason::Deadline(TerminateReason::RegistrationTimeout),
        AttemptState::Starting,
    )
}

#[test]
fn an_idle_termination_records_its_reason_stops_the_real_runner_and_is_not_a_failure() {
    let w = World::new();
    let launcher = w.launcher();
    let id = w.start_sleeping(&launcher);
    let reason = IntentReason::Deadline(TerminateReason::IdleTimeout);
    let outcome = terminate(&launcher, &id, &w.runtime, reason, AttemptState::Idle).unwrap();
    assert_eq!(outcome, Outcome::ExitedIdleWithoutWork);
    assert!(!outcome.wants_replacement());
    assert!(!inspect(&id).unwrap().is_alive());
    // The reason survives for a restarted agent (not the predecessor's fixed
    // `registration-timeout`).
    assert_eq!(read_intent(&w.runtime).unwrap(), Some(reason));
    assert_eq!(
        std::fs::read_to_string(w.runtime.join(INTENT_FILE)).unwrap(),
        "idle-timeout\n"
    );
}

#[test]
fn an_intent_that_cannot_be_made_durable_means_no_signal_and_no_outcome() {
    let w = World::new();
    let launcher = w.launcher();
    let id = w.start_sleeping(&launcher);
    // A directory where the intent must go: the rename over it fails.
    std::fs::create_dir(w.runtime.join(INTENT_FILE)).unwrap();
    let err = terminate_at_registration_deadline(&launcher, &id, &w.runtime).unwrap_err();
    assert!(
        matches!(err, TerminationError::IntentNotDurable(_)),
        "{err:?}"
    );
    assert!(
        launcher.inspect(&id).unwrap().is_alive(),
        "signalled without a durable intent"
    );
    std::fs::remove_dir(w.runtime.join(INTENT_FILE)).unwrap();
    launcher.stop(&id).unwrap();
}

/// A launcher that records what happened in which order, and can lie about stopping.
struct Recording {
    runtime: PathBuf,
    log: Mutex<Vec<String>>,
    stop_kills: bool,
}

impl Recording {
    /// A launcher for the runtime `runtime` whose stop kills the runner or, `!stop_kills`,
    /// claims success and leaves it alive.
    fn new(runtime: &Path, stop_kills: bool) -> Self {
        Recording {
            runtime: runtime.into(),
            log: Mutex::new(vec![]),
            stop_kills,
        }
    }
}

impl RunnerLauncher for Recording {
    fn kind(&self) -> Launcher {
        Launcher::Direct
    }
    fn start(
        &self,
        _: &LaunchSpec<'_>,
        _: RestrictiveHandoff,
    ) -> Result<ProcessIdentity, StartError> {
        unreachable!()
    }
    fn inspect(&self, _: &ProcessIdentity) -> std::io::Result<Inspection> {
        self.log.lock().unwrap().push("inspect".into());
        Ok(
            if self.stop_kills && self.log.lock().unwrap().iter().any(|l| l == "stop") {
                Inspection::Gone(runner_manager_node_agent::process::GoneBecause::NoProcess)
            } else {
                Inspection::Alive
            },
        )
    }
    fn stop(&self, _: &ProcessIdentity) -> Result<Stopped, StopError> {
        let intent = read_intent(&self.runtime).unwrap();
        self.log
            .lock()
            .unwrap()
            .push(format!("stop (intent on disk: {intent:?})"));
        self.log.lock().unwrap().push("stop".into());
        Ok(Stopped::Stopped)
    }
    fn exit_status(&self, _: &ProcessIdentity) -> Option<ExitStatus> {
        None
    }
}

fn some_identity() -> ProcessIdentity {
    ProcessIdentity {
        launcher: Launcher::Direct,
        unit: None,
        pid: 1,
        start_time: 1,
        cgroup: "/x/rm-0123456789ab".into(),
    }
}

#[test]
fn the_intent_is_on_disk_when_the_stop_happens_and_death_is_proven_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let l = Recording::new(dir.path(), true);
    // Deleted while starting (not idle): a requested termination, not an idle exit.
    let reason = IntentReason::Requested(TerminationReason::Deleted);
    let outcome = terminate(
        &l,
        &some_identity(),
        dir.path(),
        reason,
        AttemptState::Starting,
    )
    .unwrap();
    assert_eq!(
        outcome,
        Outcome::Failed(FailureReason::TerminationRequested)
    );
    let log = l.log.lock().unwrap().clone();
    assert_eq!(
        log,
        vec![
            format!("stop (intent on disk: {:?})", Some(reason)),
            "stop".to_owned(),
            "inspect".to_owned(),
        ]
    );
}

#[test]
fn a_stop_that_claims_success_but_leaves_it_alive_concludes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let l = Recording::new(dir.path(), false);
    let err = terminate_at_registration_deadline(&l, &some_identity(), dir.path()).unwrap_err();
    assert!(
        matches!(err, TerminationError::Deferred(StopError::StillRunning)),
        "{err:?}"
    );
}

#[test]
fn a_recycled_pid_is_not_signalled_by_termination() {
    let w = World::new();
    let launcher = w.launcher();
    let (mut victim, victim_start) = recycled_pid_owner();
    let recycled = ProcessIdentity {
        launcher: Launcher::Direct,
        unit: None,
        pid: victim.id(),
        start_time: victim_start + 1,
        cgroup: launcher.parent().child_relative("rm-0123456789ab"),
    };
    let outcome = terminate_at_registration_deadline(&launcher, &recycled, &w.runtime).unwrap();
    assert_eq!(
        outcome,
        Outcome::Failed(FailureReason::TerminatedAfterRegistrationTimeout)
    );
    assert!(
        victim.try_wait().unwrap().is_none(),
        "the recycled pid was signalled"
    );
    victim.kill().unwrap();
    victim.wait().unwrap();
}

fn diag(files: &[&str], links: &[&str]) -> tempfile::TempDir {
    let rt = tempfile::tempdir().unwrap();
    let d = rt.path().join("_diag");
    std::fs::create_dir(&d).unwrap();
    for f in files {
        std::fs::write(d.join(f), "x").unwrap();
    }
    for l in links {
        std::os::unix::fs::symlink("/etc/hostname", d.join(l)).unwrap();
    }
    rt
}

#[test]
fn diag_evidence_reads_names_only_and_never_follows_links() {
    let ran = diag(
        &[
            "Runner_20260101-000000-utc.log",
            "Worker_20260101-000100-utc.log",
        ],
        &[],
    );
    assert_eq!(job_evidence(ran.path()), JobEvidence::RanAJob);
    let idle = diag(&["Runner_20260101-000000-utc.log", "pages"], &[]);
    assert_eq!(job_evidence(idle.path()), JobEvidence::NoJob);
    let none = diag(&[], &[]);
    assert_eq!(job_evidence(none.path()), JobEvidence::Unknown);
    // A link named like a worker log is not evidence of a job.
    let forged = diag(
        &["Runner_20260101-000000-utc.log"],
        &["Worker_20260101-000100-utc.log"],
    );
    assert_eq!(job_evidence(forged.path()), JobEvidence::NoJob);
    // `_diag` itself a link: unknown, not followed.
    let rt = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(ran.path().join("_diag"), rt.path().join("_diag")).unwrap();
    assert_eq!(job_evidence(rt.path()), JobEvidence::Unknown);
    // No `_diag`.
    assert_eq!(
        job_evidence(Path::new("/nonexistent")),
        JobEvidence::Unknown
    );
}

#[test]
fn diag_evidence_is_bounded_by_entry_count() {
    let many: Vec<String> = (0..runner_manager_node_agent::evidence::MAX_DIAG_ENTRIES + 10)
        .map(|i| format!("pages-{i}"))
        .collect();
    let refs: Vec<&str> = many.iter().map(String::as_str).collect();
    let rt = diag(&refs, &[]);
    assert_eq!(job_evidence(rt.path()), JobEvidence::Unknown);
}

#[test]
fn exit_code_7_is_a_rejected_runner_version_from_a_real_exit() {
    let w = World::new();
    let launcher = w.launcher();
    let id = w.start_and_wait_exit(&launcher, "exit7");
    let reading = ExitReading::of(launcher.exit_status(&id));
    assert_eq!(reading, ExitReading::VersionRejected);
    assert_eq!(
        reading.decided_outcome(),
        Some(Outcome::Failed(FailureReason::RunnerVersionRejected))
    );
    assert_eq!(ExitReading::of(None), ExitReading::Other);
    launcher.stop(&id).unwrap();
}

#[test]
fn the_systemd_unit_has_exactly_these_properties_and_never_the_jit() {
    println!(
        "this machine does not boot systemd: testing the exact transient-unit properties the \
         systemd launcher submits, not a running unit"
    );
    let attempt = uuid::Uuid::parse_str("0123456789ab4cde8f0123456789abcd").unwrap();
    let runtime = PathBuf::from("/var/lib/runner-manager/runners/0123456789ab");
    let (_, value) = jit();
    let mut environment = std::collections::BTreeMap::new();
    environment.insert("PATH".to_owned(), "/usr/bin:/bin".to_owned());
    environment.insert("TMPDIR".to_owned(), format!("{}/tmp", runtime.display()));
    let spec = LaunchSpec {
        attempt,
        runtime: &runtime,
        account: runner_manager_node_agent::account::RunnerAccount {
            uid: 1201,
            gid: 1200,
        },
        environment,
        limits: CgroupLimits {
            memory_max: Some(8 << 30),
            cpu_quota_us: Some(150_000),
            nice: 10,
            ..CgroupLimits::default()
        },
        cache: Some(Path::new(
            "/var/lib/runner-manager/caches/attempts/0123456789ab/mnt",
        )),
    };
    let handoff = runtime.join("jit-6f1c2a.tmp");
    let unit = unit_properties(
        &spec,
        Path::new("/usr/bin/runner-manager-runner-entry"),
        Handing::File(&handoff),
        &runtime.join("jit-env-5d0e.tmp"),
        &runner_manager_node_agent::providers::sandbox::RunnerNetwork::default(),
    );
    assert_eq!(unit.name, "rm-0123456789ab.service");
    let props: Vec<(&str, &str)> = unit
        .properties
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        props,
        vec![
            ("Slice", "runnermanager.slice"),
            ("Type", "exec"),
            ("User", "1201"),
            ("Group", "1200"),
            ("NoNewPrivileges", "yes"),
            ("CapabilityBoundingSet", ""),
            ("AmbientCapabilities", ""),
            ("KillMode", "control-group"),
            // The sandbox (issue 13 finding 6, issue 28 item 3; proven against a real systemd
            // in tests/launch_systemd.rs).
            ("PrivateTmp", "yes"),
            ("PrivateDevices", "yes"),
            ("ProtectSystem", "strict"),
            ("ProtectHome", "yes"),
            ("ProtectProc", "invisible"),
            ("ProtectKernelTunables", "yes"),
            ("ProtectKernelModules", "yes"),
            ("ProtectKernelLogs", "yes"),
            ("ProtectControlGroups", "yes"),
            ("ProtectClock", "yes"),
            ("ProtectHostname", "yes"),
            ("RestrictSUIDSGID", "yes"),
            ("RestrictRealtime", "yes"),
            ("LockPersonality", "yes"),
            ("RemoveIPC", "yes"),
            ("PrivateIPC", "yes"),
            ("RestrictNamespaces", "yes"),
            ("SystemCallFilter", "@system-service"),
            ("SystemCallErrorNumber", "EPERM"),
            ("SystemCallArchitectures", "native"),
            (
                "RestrictAddressFamilies",
                "AF_UNIX AF_INET AF_INET6 AF_NETLINK"
            ),
            (
                "InaccessiblePaths",
                runner_manager_node_agent::providers::systemd::INACCESSIBLE_PATHS
            ),
            // The default filter: no cluster ranges or node addresses (the agent's flags add
            // them).
            (
                "IPAddressDeny",
                "169.254.0.0/16 fe80::/10 fd00:ec2::23 fd00:ec2::254 fd20:ce::254 168.63.129.16 100.100.100.200"
            ),
            ("MemoryMax", "8589934592"),
            ("CPUQuota", "150%"),
            // `--runner-nice`: the node's running jobs do not starve the next launch.
            ("Nice", "10"),
            (
                "ReadWritePaths",
                // The runtime and the runner's dependency cache (`spec.caches`).
                "/var/lib/runner-manager/runners/0123456789ab /var/lib/runner-manager/caches/attempts/0123456789ab/mnt"
            ),
            (
                "WorkingDirectory",
                "/var/lib/runner-manager/runners/0123456789ab"
            ),
            ("StandardInput", "null"),
            ("StandardOutput", "null"),
            ("StandardError", "null"),
        ]
    );
    // The listener's environment is no property and no variable of the unit: it reaches the
    // helper in the environment file (issue 28 item 4); the unit has the helper's fixed one.
    assert_eq!(
        unit.environment,
        [
            (
                "PATH".to_owned(),
                "/usr/sbin:/usr/bin:/sbin:/bin".to_owned()
            ),
            ("LANG".to_owned(), "C.UTF-8".to_owned()),
        ]
    );
    assert_eq!(
        unit.command,
        [
            "/usr/bin/runner-manager-runner-entry",
            "--handoff",
            "/var/lib/runner-manager/runners/0123456789ab/jit-6f1c2a.tmp",
            "--runtime",
            "/var/lib/runner-manager/runners/0123456789ab",
            "--environment",
            "/var/lib/runner-manager/runners/0123456789ab/jit-env-5d0e.tmp",
            // The helper also sets its session's scheduler autogroup to the unit's `Nice=`.
            "--nice",
            "10",
            // Where the helper writes its pid and start time before it takes the handoff.
            "--receipt",
            "/var/lib/runner-manager/runners/0123456789ab/.entry-receipt",
        ]
        .map(std::ffi::OsString::from)
    );
    let argv = unit.systemd_run_args();
    assert_eq!(argv[0], "--unit=rm-0123456789ab.service");
    assert!(
        argv.iter()
            .any(|a| a == "--property=KillMode=control-group")
    );
    assert!(argv.iter().any(|a| a == "--"));
    for a in &argv {
        assert!(!a.to_string_lossy().contains(&value));
        assert!(!a.to_string_lossy().contains("ACTIONS_RUNNER_INPUT"));
    }
}
