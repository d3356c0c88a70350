//! The direct launcher for real: the entry helper, a real cgroup v2 per runner, a real runner
//! account (`nobody`), and a shell stand-in for `bin/Runner.Listener`. Runs as root.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::launch_support;

use launch_support::*;
use runner_manager_crds::attempt::{Launcher, ProcessIdentity};
use runner_manager_node_agent::handoff::{HandoffError, HandoffRefusal, RestrictiveHandoff};
use runner_manager_node_agent::process::environment::{
    EnvironmentLayers, EnvironmentRefusal, layered_environment,
};
use runner_manager_node_agent::process::identity_file;
use runner_manager_node_agent::process::{GoneBecause, Inspection, inspect};
use runner_manager_node_agent::providers::cgroup::{CgroupError, CgroupLimits};
use runner_manager_node_agent::providers::launcher::StartFailure;
use runner_manager_node_agent::providers::{RunnerLauncher, Stopped};

#[test]
fn the_jit_reaches_the_listener_environment_only_and_nothing_survives_the_start() {
    let w = World::new();
    let launcher = w.launcher();
    let (handoff, value) = w.handoff();
    assert!(!format!("{handoff:?}").contains(&value));
    let id = launcher.start(&w.spec("sleep"), handoff).unwrap();

    // Ordering (lifecycle spec §2.7 item 4), checked the instant `start` returns, without
    // waiting: the handoff is gone and the identity is durable.
    assert_eq!(handoffs_in(&w.runtime), 0, "handoff survived the start");
    assert_eq!(identity_file::read(&w.runtime).unwrap().as_ref(), Some(&id));
    assert_eq!(id.launcher, Launcher::Direct);
    assert_eq!(
        id.cgroup,
        format!(
            "/{}/rm-{}",
            w.parent_name,
            &w.attempt.simple().to_string()[..12]
        )
    );

    // The stand-in ran as the runner account, in its cgroup from its first instruction (the
    // helper joined before exec), with exactly `run`, and saw the JIT in its environment.
    assert_eq!(w.wait_for("ready").trim(), id.pid.to_string());
    let cgroup_at_start = w.wait_for("cgroup");
    assert!(
        cgroup_at_start
            .lines()
            .any(|l| l == format!("0::{}", id.cgroup)),
        "{cgroup_at_start}"
    );
    assert_eq!(w.wait_for("uid").trim(), RUNNER.uid.to_string());
    assert_eq!(w.wait_for("args"), "run\n");
    assert_eq!(w.wait_for("jit").trim(), "present");

    // Never in argv (of any process), only in the listener's own environment, in no file.
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", id.pid)).unwrap();
    let argv: Vec<&[u8]> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .collect();
    assert_eq!(argv.last().unwrap(), b"run");
    assert!(argv[argv.len() - 2].ends_with(b"bin/Runner.Listener"));
    assert!(!any_cmdline_contains(&value));
    // The listener has it; so may a process the listener itself started (the stand-in's shell
    // runs short-lived commands, as the real listener starts its worker): every holder must be
    // inside the runner's own cgroup, never another process on the host.
    let holders = pids_with_environ_containing(&value);
    assert!(holders.contains(&id.pid), "{holders:?}");
    for pid in holders {
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        assert!(
            cgroup.is_empty() || cgroup.lines().any(|l| l == format!("0::{}", id.cgroup)),
            "pid {pid} outside the runner's cgroup holds the JIT: {cgroup}"
        );
    }
    for f in files_under(w.base.path()) {
        let bytes = std::fs::read(&f).unwrap();
        assert!(
            !bytes.windows(value.len()).any(|x| x == value.as_bytes()),
            "{f:?} holds the JIT"
        );
    }
    let status = std::fs::read_to_string(format!("/proc/{}/status", id.pid)).unwrap();
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("NoNewPrivs:") && l.ends_with('1')),
        "{status}"
    );
    assert!(
        status.lines().any(|l| l == "CapEff:\t0000000000000000"),
        "{status}"
    );

    assert!(launcher.inspect(&id).unwrap().is_alive());
    assert_eq!(launcher.stop(&id).unwrap(), Stopped::Stopped);
    assert_eq!(
        launcher.inspect(&id).unwrap(),
        Inspection::Gone(GoneBecause::NoProcess)
    );
    assert!(
        !w.parent()
            .path()
            .join(format!("rm-{}", &w.attempt.simple().to_string()[..12]))
            .exists()
    );
    // Stopping again is a proven no-op.
    assert_eq!(launcher.stop(&id).unwrap(), Stopped::AlreadyGone);
}

#[test]
fn the_runner_outlives_the_launcher_and_a_new_one_stops_it() {
    let w = World::new();
    let (secret, _) = jit();
    let id = {
        let launcher = w.launcher();
        let handoff = RestrictiveHandoff::create(&w.runtime, RUNNER, &secret).unwrap();
        launcher.start(&w.spec("sleep"), handoff).unwrap()
        // The launcher (the agent's only handle on the child) is dropped here.
    };
    w.wait_for("ready");
    assert!(inspect(&id).unwrap().is_alive());
    // Its cgroup is not the agent's.
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    assert!(!own.lines().any(|l| l == format!("0::{}", id.cgroup)));

    // A restarted agent finds it by the durable identity alone.
    let recovered = identity_file::read(&w.runtime).unwrap().unwrap();
    assert_eq!(recovered, id);
    let again = w.launcher();
    assert!(again.inspect(&recovered).unwrap().is_alive());
    assert_eq!(again.stop(&recovered).unwrap(), Stopped::Stopped);
    assert!(!again.inspect(&recovered).unwrap().is_alive());
}

#[test]
fn stop_kills_the_whole_cgroup_including_a_grandchild_that_escaped() {
    let w = World::new();
    let launcher = w.launcher();
    let id = w.start(&launcher, "escape");
    let grandchild: u32 = w.wait_for("grandchild.pid").trim().parse().unwrap();
    w.wait_for("ready");
    let gstat = runner_manager_node_agent::process::stat::read_stat(grandchild)
        .unwrap()
        .unwrap();
    let g = ProcessIdentity {
        pid: grandchild,
        start_time: gstat.start_time,
        ..id.clone()
    };
    // Its own session, but still in the runner's cgroup.
    assert!(inspect(&g).unwrap().is_alive());
    assert_eq!(launcher.stop(&id).unwrap(), Stopped::Stopped);
    assert!(!inspect(&g).unwrap().is_alive());
    assert!(!inspect(&id).unwrap().is_alive());
}

#[test]
fn a_recycled_pid_reads_gone_and_is_never_signalled() {
    let w = World::new();
    let launcher = w.launcher();
    let id = w.start_sleeping(&launcher);

    // An unrelated process standing in for whoever got the runner's pid after a recycle.
    let (mut victim, victim_start) = recycled_pid_owner();
    let recycled = ProcessIdentity {
        pid: victim.id(),
        start_time: victim_start + 1,
        ..id.clone()
    };
    assert_eq!(
        launcher.inspect(&recycled).unwrap(),
        Inspection::Gone(GoneBecause::PidRecycled)
    );
    // Same pid and start time but not in the recorded cgroup: a forged identity file.
    let forged = ProcessIdentity {
        pid: victim.id(),
        start_time: victim_start,
        ..id.clone()
    };
    assert_eq!(
        launcher.inspect(&forged).unwrap(),
        Inspection::Gone(GoneBecause::OutsideCgroup)
    );

    // Stopping by the recycled identity stops the attempt's cgroup (the runner) and never
    // touches the pid's new owner.
    assert_eq!(launcher.stop(&recycled).unwrap(), Stopped::Stopped);
    assert!(!launcher.inspect(&id).unwrap().is_alive());
    assert!(
        victim.try_wait().unwrap().is_none(),
        "the recycled pid was signalled"
    );
    // An identity naming a cgroup that is not one of ours is refused outright.
    let foreign = ProcessIdentity {
        cgroup: "/user.slice".into(),
        ..forged
    };
    assert!(launcher.stop(&foreign).is_err());
    assert!(victim.try_wait().unwrap().is_none());
    victim.kill().unwrap();
    victim.wait().unwrap();
}

#[test]
fn the_exit_status_is_kept_for_the_conclusion() {
    let w = World::new();
    let launcher = w.launcher();
    let id = w.start_and_wait_exit(&launcher, "exit7");
    assert_eq!(launcher.exit_status(&id).and_then(|s| s.code()), Some(7));
    assert_eq!(launcher.stop(&id).unwrap(), Stopped::AlreadyGone);
}

#[test]
fn a_missing_listener_fails_before_any_child_and_leaves_no_handoff() {
    let w = World::new();
    std::fs::remove_file(w.runtime.join("bin/Runner.Listener")).unwrap();
    let launcher = w.launcher();
    let (handoff, value) = w.handoff();
    let err = launcher.start(&w.spec("sleep"), handoff).unwrap_err();
    assert!(matches!(err.failure, StartFailure::ListenerMissing));
    assert!(err.retryable() && err.live.is_none());
    assert_eq!(handoffs_in(&w.runtime), 0);
    assert!(!err.to_string().contains(&value) && !format!("{err:?}").contains(&value));
    assert!(identity_file::read(&w.runtime).unwrap().is_none());
}

#[test]
fn a_helper_that_cannot_be_spawned_is_retryable_and_leaves_nothing() {
    let w = World::new();
    let launcher = runner_manager_node_agent::providers::direct::DirectLauncher::new(
        w.parent(),
        w.base.path().join("no-such-helper"),
    );
    let (handoff, _) = w.handoff();
    let err = launcher.start(&w.spec("sleep"), handoff).unwrap_err();
    assert!(matches!(err.failure, StartFailure::Spawn(_)), "{err:?}");
    assert!(err.retryable());
    assert_eq!(handoffs_in(&w.runtime), 0);
    assert_eq!(
        std::fs::read_dir(w.parent().path())
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_dir())
            .count(),
        0
    );
}

#[test]
fn a_helper_that_fails_after_it_existed_is_never_retried() {
    let w = World::new();
    let launcher = w.launcher();
    let (handoff, _) = w.handoff();
    // The runtime no longer private by the time the helper looks: it refuses the handoff.
    std::os::unix::fs::chown(&w.runtime, Some(0), Some(0)).unwrap();
    let err = launcher.start(&w.spec("sleep"), handoff).unwrap_err();
    assert!(matches!(err.failure, StartFailure::Entry(_)), "{err:?}");
    assert!(!err.retryable() && err.live.is_none());
    assert_eq!(handoffs_in(&w.runtime), 0);
    assert!(!w.tmp("ready").exists());
}

#[test]
fn a_second_start_of_one_attempt_is_refused_as_post_child() {
    let w = World::new();
    let launcher = w.launcher();
    let (secret, _) = jit();
    let id = launcher
        .start(
            &w.spec("sleep"),
            RestrictiveHandoff::create(&w.runtime, RUNNER, &secret).unwrap(),
        )
        .unwrap();
    let err = launcher
        .start(
            &w.spec("sleep"),
            RestrictiveHandoff::create(&w.runtime, RUNNER, &secret).unwrap(),
        )
        .unwrap_err();
    assert!(
        matches!(
            err.failure,
            StartFailure::Cgroup(CgroupError::AlreadyExists)
        ),
        "{err:?}"
    );
    assert!(!err.retryable());
    assert_eq!(handoffs_in(&w.runtime), 0);
    launcher.stop(&id).unwrap();
}

#[test]
fn limits_are_in_the_cgroup_before_the_runner_joins_or_the_launch_is_refused() {
    let w = World::new();
    let launcher = w.launcher();
    let (secret, _) = jit();
    let mut spec = w.spec("sleep");
    spec.limits = CgroupLimits {
        memory_max: Some(256 << 20),
        cpu_quota_us: Some(50_000),
        ..CgroupLimits::default()
    };
    let handoff = RestrictiveHandoff::create(&w.runtime, RUNNER, &secret).unwrap();
    match launcher.start(&spec, handoff) {
        Ok(id) => {
            println!("memory and cpu controllers available: memory.max/cpu.max checked for real");
            let dir = w
                .parent()
                .path()
                .join(format!("rm-{}", &w.attempt.simple().to_string()[..12]));
            assert_eq!(
                std::fs::read_to_string(dir.join("memory.max"))
                    .unwrap()
                    .trim(),
                (256u64 << 20).to_string()
            );
            assert_eq!(
                std::fs::read_to_string(dir.join("cpu.max")).unwrap().trim(),
                "50000 100000"
            );
            launcher.stop(&id).unwrap();
        }
        Err(err) => {
            // A hybrid host whose memory/cpu controllers are bound to cgroup v1: the runner is
            // not started unlimited, and nothing was started at all.
            println!(
                "this host's cgroup v2 lacks the memory/cpu controllers: the launch is refused before any child ({err})"
            );
            assert!(
                matches!(
                    err.failure,
                    StartFailure::Cgroup(CgroupError::ControllerUnavailable(_))
                ),
                "{err:?}"
            );
            assert!(err.retryable());
            assert_eq!(handoffs_in(&w.runtime), 0);
            assert!(!w.tmp("ready").exists());
        }
    }
}

#[test]
fn the_handoff_is_private_to_the_runner_and_read_once() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let w = World::new();
    let (secret, value) = jit();
    let h = RestrictiveHandoff::create(&w.runtime, RUNNER, &secret).unwrap();
    let m = std::fs::symlink_metadata(h.path()).unwrap();
    assert_eq!(
        (m.mode() & 0o7777, m.uid(), m.gid(), m.nlink()),
        (0o600, RUNNER.uid, RUNNER.gid, 1)
    );
    let path = h.path().to_path_buf();
    let taken = runner_manager_node_agent::handoff::take(&path, RUNNER.uid).unwrap();
    assert_eq!(secrecy::ExposeSecret::expose_secret(&taken), value);
    assert!(!path.exists(), "the reader deletes it");
    assert!(runner_manager_node_agent::handoff::take(&path, RUNNER.uid).is_err());
    drop(h);

    // A hard link to it: refused and still deleted.
    let h = RestrictiveHandoff::create(&w.runtime, RUNNER, &secret).unwrap();
    std::fs::hard_link(h.path(), w.runtime.join("tmp/copy")).unwrap();
    let err = runner_manager_node_agent::handoff::take(h.path(), RUNNER.uid).unwrap_err();
    assert!(
        matches!(err, HandoffError::Refused(HandoffRefusal::ExtraLinks)),
        "{err:?}"
    );
    std::fs::remove_file(w.runtime.join("tmp/copy")).unwrap();
    drop(h);
    assert_eq!(handoffs_in(&w.runtime), 0, "drop deletes it");

    // A link planted under a handoff name is never followed.
    let target = w.runtime.join("tmp/target");
    std::fs::write(&target, "x").unwrap();
    let planted = w.runtime.join("jit-planted.tmp");
    std::os::unix::fs::symlink(&target, &planted).unwrap();
    let err = runner_manager_node_agent::handoff::take(&planted, RUNNER.uid).unwrap_err();
    assert!(
        matches!(err, HandoffError::Refused(HandoffRefusal::NotARegularFile)),
        "{err:?}"
    );
    std::fs::remove_file(&planted).unwrap();

    // The runtime must be a real 0700 directory of the runner.
    std::fs::set_permissions(&w.runtime, std::fs::Permissions::from_mode(0o755)).unwrap();
    let err = RestrictiveHandoff::create(&w.runtime, RUNNER, &secret).unwrap_err();
    assert!(matches!(
        err,
        HandoffError::Refused(HandoffRefusal::RuntimeModeNotPrivate)
    ));
    std::fs::set_permissions(&w.runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
    let other = runner_manager_node_agent::account::RunnerAccount {
        uid: 65533,
        gid: 65533,
    };
    let err = RestrictiveHandoff::create(&w.runtime, other, &secret).unwrap_err();
    assert!(matches!(
        err,
        HandoffError::Refused(HandoffRefusal::RuntimeWrongOwner)
    ));
    let link = w.base.path().join("rt-link");
    std::os::unix::fs::symlink(&w.runtime, &link).unwrap();
    let err = RestrictiveHandoff::create(&link, RUNNER, &secret).unwrap_err();
    assert!(
        matches!(
            err,
            HandoffError::Refused(HandoffRefusal::RuntimeNotADirectory)
        ),
        "{err:?}"
    );
    assert!(!format!("{err:?}{err}").contains(&value));
}

/// Every file under `dir` whose name starts with `prefix`, with its owner and content.
fn traces(dir: &std::path::Path, prefix: &str) -> Vec<(u32, String)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| {
            let m = e.metadata().unwrap();
            (
                m.uid(),
                String::from_utf8_lossy(&std::fs::read(e.path()).unwrap()).into_owned(),
            )
        })
        .collect()
}

/// Issue 13: the entry helper runs as root until its final exec, so a `runner.env` loader
/// variable (`LD_PRELOAD=/tmp/x.so` planted by an earlier job) in its environment would run
/// code as root. The agent's validator refuses such names; and even a snapshot that bypassed
/// it never reaches the helper's root phase, only the runner after the uid change.
///
/// The observable is the loader itself: with `LD_DEBUG=files` and `LD_DEBUG_OUTPUT=<prefix>`,
/// ld.so writes `<prefix>.<pid>` naming every program it loads, in every process that has the
/// variables when it execs. A trace naming the helper is the helper's root phase seeing them.
#[test]
fn a_loader_variable_in_runner_env_is_refused_and_never_reaches_the_helpers_root_phase() {
    let w = World::new();
    // The validator: refused, by name and class.
    let layers = EnvironmentLayers {
        runner_env: [("LD_PRELOAD".to_owned(), "/tmp/x.so".to_owned())].into(),
        ..EnvironmentLayers::default()
    };
    assert_eq!(
        layered_environment(&layers, &w.runtime).unwrap_err(),
        EnvironmentRefusal::DynamicLoader("LD_PRELOAD".into())
    );

    let dir = w.base.path().join("ld-debug");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();

    // The control: the helper is dynamically loaded, so with the variables in its own
    // environment its loader does write a trace naming it.
    let control = std::process::Command::new(ENTRY_HELPER)
        .env("LD_DEBUG", "files")
        .env("LD_DEBUG_OUTPUT", dir.join("control"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert_eq!(control.code(), Some(125), "no arguments: a usage failure");
    let control = traces(&dir, "control");
    assert!(
        control
            .iter()
            .any(|(_, t)| t.contains("runner-manager-runner-entry")),
        "the observable works: {control:?}"
    );

    // Bypassing the validator: the spec's environment carries the loader variables.
    let mut spec = w.spec("sleep");
    spec.environment
        .insert("LD_DEBUG".to_owned(), "files".to_owned());
    spec.environment.insert(
        "LD_DEBUG_OUTPUT".to_owned(),
        dir.join("launch").to_string_lossy().into_owned(),
    );
    let (secret, _) = jit();
    let launcher = w.launcher();
    let handoff = RestrictiveHandoff::create(&w.runtime, RUNNER, &secret).unwrap();
    let id = launcher.start(&spec, handoff).unwrap();
    w.wait_for("ready");
    let env = w.wait_for("env");

    let launched = traces(&dir, "launch");
    // The root phase never had them: no trace names the helper, and none is root's.
    for (uid, trace) in &launched {
        assert!(
            !trace.contains("runner-manager-runner-entry"),
            "the helper's loader saw the policy's LD_DEBUG: {trace}"
        );
        assert_eq!(*uid, RUNNER.uid, "a trace written as uid {uid}");
    }
    // The runner did, after the uid change: its shell was loaded with them, and its
    // environment holds them — but not the channel they travelled in.
    assert!(!launched.is_empty(), "the runner's loader wrote no trace");
    assert!(env.lines().any(|l| l == "LD_DEBUG=files"), "{env}");
    assert!(env.lines().any(|l| l == "STANDIN_MODE=sleep"), "{env}");
    assert!(!env.contains("RUNNER_MANAGER_RUNNER_ENV"), "{env}");
    launcher.stop(&id).unwrap();
}
