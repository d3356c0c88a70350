//! Docker for jobs against a real systemd and a real rootless Podman (issue 31 item 1): a runner
//! unit whose stand-in listener is a job that builds an image, runs a container, starts a
//! `services:`-style container on a network of its own and reaches it by port and by alias,
//! then tries what a hostile job would: a privileged container and the host's root through the
//! socket it was given, and the host's hidden paths through the engine's own socket, past the
//! proxy. After the runner, the engine is stopped and its directory removed: nothing of what the
//! job started, created or built is left.
//!
//! Runs inside `e2e/systemd`'s namespaces with `/proc/sys` writable (an engine's netavark sets
//! its own network namespace's sysctls), with Podman, the Docker CLI and a static busybox that
//! `e2e/docker/install.sh` provides; `make test`'s systemd stage runs it so, and by hand:
//!
//! ```sh
//! cli=$(e2e/docker/install.sh | tail -n 1)
//! RM_SYSTEMD_PROC_SYS=rw e2e/systemd/start.sh
//! "$RM_CACHE/systemd/bin/nsexec" env -C "$PWD" RM_SYSTEMD_TESTS=1 RM_DOCKER_CLI="$cli" \
//!   cargo test --workspace --test node_agent docker_systemd::
//! e2e/systemd/stop.sh
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::launch_support::{ENTRY_HELPER, jit, read_when_there};
use runner_manager_node_agent::account::RunnerAccount;
use runner_manager_node_agent::docker::engine::{EngineDirs, EngineSpec, JOB_SOCKET};
use runner_manager_node_agent::docker::proxy::{self, Proxy};
use runner_manager_node_agent::docker::rules::Rules;
use runner_manager_node_agent::handoff::RestrictiveHandoff;
use runner_manager_node_agent::providers::cgroup::CgroupLimits;
use runner_manager_node_agent::providers::sandbox::{RunnerNetwork, namespace_addresses};
use runner_manager_node_agent::providers::systemd::{SystemdLauncher, install_helper};
use runner_manager_node_agent::providers::{LaunchSpec, RunnerLauncher, Stopped};

const ACCOUNT: RunnerAccount = RunnerAccount {
    uid: 20010,
    gid: 20000,
};

/// The job: each step's result a `name=yes|no` line, then `done`.
const JOB: &str = r#"#!/bin/bash
r="$PWD/job"; : > "$r.tmp"
say() { echo "$1=$2" >> "$r.tmp"; }
try() { if eval "$2" >"$PWD/out-$1" 2>&1; then say "$1" yes; else say "$1" no; fi; }
# A step that hangs fails in a minute, not at the test's deadline.
d="timeout -k 3 20 $PWD/bin/docker"
cd "$PWD/ctx"
try build '$d build -q -t app:1 .'
try run '$d run app:1 echo hello-from-a-container > "$PWD/run-output"; grep -q hello-from-a-container "$PWD/run-output"'
# A failing `docker run --rm` fails the step: its exit code reaches the job.
try rm_exit_code '$d run --rm app:1 sh -c "exit 3"; [ $? = 3 ]'
try network '$d network create net1'
try service '$d run -d --name db --network net1 --network-alias db -p 127.0.0.1:$JOB_PORT:80 app:1 sh -c "mkdir -p /www && echo served > /www/index.html && exec httpd -f -p 80 -h /www"'
try by_port 'for i in $(seq 50); do curl -fs http://127.0.0.1:$JOB_PORT/ && break; sleep 0.2; done | grep -q served'
try by_alias '$d run --network net1 app:1 wget -qO- http://db/ | grep -q served'
try workspace_mount '$d run -v "$PWD":/w app:1 cat /w/Dockerfile | grep -q scratch'
try volume '$d volume create v1'
try left_running '$d run -d app:1 sleep 1000'
# What a hostile job tries through the socket it was given: refused by the proxy.
try privileged '$d run --rm --privileged app:1 true'
try host_root '$d run --rm -v /:/host app:1 true'
try host_network '$d run --rm --network host app:1 true'
# Past the proxy, on the engine's own socket (same account): the engine sees no more of the
# host than the job, so the hidden paths stay hidden.
try engine_kubelet 'DOCKER_HOST=unix://$ENGINE_SOCKET $d run --rm -v /var/lib/kubelet:/k app:1 cat /k/rm-docker-probe-$JOB_ID'
try engine_home 'DOCKER_HOST=unix://$ENGINE_SOCKET $d run --rm -v /home:/h app:1 cat /h/rm-docker-probe-$JOB_ID'
mv "$r.tmp" "$r"
exec sleep 1000
"#;

const DOCKERFILE: &str = "FROM scratch\nCOPY busybox /bin/busybox\nRUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\n";

/// The Docker CLI when this test should run: inside `e2e/systemd`'s namespaces with
/// `RM_DOCKER_CLI` set (`make test` sets it after `e2e/docker/install.sh`). Set, a missing piece
/// is a failure, not a skip: an install that broke must not pass as a test that ran.
fn inside_systemd_with_podman(test: &str) -> Option<PathBuf> {
    let here =
        std::env::var_os("RM_SYSTEMD_TESTS").is_some() && Path::new("/run/systemd/system").exists();
    let Some(cli) = std::env::var_os("RM_DOCKER_CLI").map(PathBuf::from) else {
        println!("{test}: skipped (no RM_DOCKER_CLI; e2e/run-tests.sh sets it)");
        return None;
    };
    if !here {
        println!(
            "{test}: skipped (not inside e2e/systemd's namespaces; e2e/run-tests.sh runs it there)"
        );
        return None;
    }
    for (path, what) in [
        (Path::new("/usr/bin/podman"), "Podman"),
        (cli.as_path(), "the Docker CLI at RM_DOCKER_CLI"),
        (
            Path::new("/bin/busybox"),
            "a static busybox (busybox-static)",
        ),
    ] {
        assert!(
            path.exists(),
            "{test}: {what} is missing ({}): e2e/docker/install.sh installs it",
            path.display()
        );
    }
    Some(cli)
}

fn processes_of(uid: u32) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let owner = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|u| u.parse::<u32>().ok());
        if owner == Some(uid) {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            found.push(format!("{pid} {}", comm.trim()));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_docker_builds_runs_and_serves_then_leaves_nothing_and_refuses_the_host() {
    let Some(cli) = inside_systemd_with_podman("a_jobs_docker_builds_runs_and_serves") else {
        return;
    };
    let id = uuid::Uuid::new_v4();
    let short = id.simple().to_string()[..12].to_owned();
    let root = PathBuf::from(format!("/var/lib/runner-manager-docker-test-{short}"));
    let runtime = root.join("runners").join(&short);
    for d in [&root, &root.join("runners")] {
        std::fs::create_dir_all(d).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::create_dir_all(runtime.join("bin")).unwrap();
    std::fs::create_dir_all(runtime.join("ctx")).unwrap();
    std::fs::write(runtime.join("bin/Runner.Listener"), JOB).unwrap();
    std::fs::set_permissions(
        runtime.join("bin/Runner.Listener"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::copy(&cli, runtime.join("bin/docker")).unwrap();
    std::fs::copy("/bin/busybox", runtime.join("ctx/busybox")).unwrap();
    std::fs::write(runtime.join("ctx/Dockerfile"), DOCKERFILE).unwrap();
    let chown = std::process::Command::new("chown")
        .arg("-R")
        .arg(format!("{}:{}", ACCOUNT.uid, ACCOUNT.gid))
        .arg(&runtime)
        .status()
        .unwrap();
    assert!(chown.success());
    std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
    // Markers a job must never read, the engine's way or its own.
    std::fs::create_dir_all("/var/lib/kubelet").unwrap();
    for dir in ["/var/lib/kubelet", "/home"] {
        std::fs::write(format!("{dir}/rm-docker-probe-{short}"), b"node secret").unwrap();
    }
    let network = RunnerNetwork::new(&[], &[], &namespace_addresses("self"), &[]).unwrap();
    let launcher = SystemdLauncher::new(install_helper(Path::new(ENTRY_HELPER), &root).unwrap())
        .with_network(network);

    // The engine, then the job's socket, as the agent's launch makes them.
    let dirs = EngineDirs::new(&root, &id);
    dirs.prepare(ACCOUNT).unwrap();
    launcher
        .start_engine(&EngineSpec {
            attempt: id,
            account: ACCOUNT,
            dirs: &dirs,
            runtime: &runtime,
            cache: None,
            podman: Path::new("/usr/bin/podman"),
            limits: &CgroupLimits {
                memory_max: Some(2 << 30),
                tasks_max: Some(4096),
                ..CgroupLimits::default()
            },
        })
        .expect("the engine's unit starts");
    let socket = runtime.join(JOB_SOCKET);
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    std::os::unix::fs::chown(&socket, Some(ACCOUNT.uid), Some(ACCOUNT.gid)).unwrap();
    let served = proxy::spawn(
        listener,
        Arc::new(Proxy {
            rules: Rules {
                attempt: id.to_string(),
                bind_roots: vec![runtime.clone()],
            },
            engine: dirs.socket(),
            engine_wait: Duration::from_secs(60),
            unavailable: None,
        }),
    );

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut environment = std::collections::BTreeMap::new();
    for (k, v) in [
        ("PATH", "/usr/sbin:/usr/bin:/sbin:/bin".to_owned()),
        ("DOCKER_HOST", format!("unix://{}", socket.display())),
        ("ENGINE_SOCKET", dirs.socket().display().to_string()),
        ("JOB_PORT", port.to_string()),
        ("JOB_ID", short.clone()),
    ] {
        environment.insert(k.to_owned(), v);
    }
    let (secret, _) = jit();
    let handoff = RestrictiveHandoff::create(&runtime, ACCOUNT, &secret).unwrap();
    let identity = tokio::task::block_in_place(|| {
        launcher.start(
            &LaunchSpec {
                attempt: id,
                runtime: &runtime,
                account: ACCOUNT,
                environment,
                limits: CgroupLimits::default(),
                cache: None,
            },
            handoff,
        )
    })
    .unwrap();
    let report = tokio::task::block_in_place(|| {
        read_when_there(&runtime.join("job"), Duration::from_secs(300))
    });
    let out = |step: &str| {
        std::fs::read_to_string(runtime.join(format!("ctx/out-{step}"))).unwrap_or_default()
    };
    println!("job:\n{report}");
    for step in [
        "build",
        "run",
        "rm_exit_code",
        "network",
        "service",
        "by_port",
        "by_alias",
        "workspace_mount",
        "volume",
        "left_running",
    ] {
        assert!(
            report.contains(&format!("{step}=yes")),
            "{step} failed: {}",
            out(step)
        );
    }
    for (step, message) in [
        ("privileged", "privileged containers are refused"),
        ("host_root", "bind mount of \"/\" is refused"),
        ("host_network", "the host's network namespace is refused"),
    ] {
        assert!(report.contains(&format!("{step}=no")), "{step} was allowed");
        assert!(
            out(step).contains(message),
            "{step}: the job is told why: {}",
            out(step)
        );
    }
    // Straight to the engine `--rm`'s exit code is Podman's own (0: rules::wait_query), so
    // these are judged by what the container read.
    for step in ["engine_kubelet", "engine_home"] {
        assert!(
            !out(step).contains("node secret") && out(step).contains("Permission denied"),
            "{step}: the engine showed the job a hidden path: {}",
            out(step)
        );
    }

    // The attempt's limits hold for the engine's unit, whose processes its containers are.
    let shown = std::process::Command::new("systemctl")
        .args(["show", "-P", "MemoryLimit,MemoryMax,TasksMax"])
        .arg(runner_manager_node_agent::docker::engine::unit_name(&id))
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.contains("2147483648") && shown.contains("4096"),
        "the engine's unit lacks the attempt's limits: {shown}"
    );

    // The runner ends; the engine's leftovers are counted, then it goes with all of them.
    let left = proxy::leftovers(&dirs.socket())
        .await
        .expect("the engine answers");
    println!("left by the job: {left:?}");
    assert!(left.containers >= 2 && left.volumes >= 1 && left.networks >= 1 && left.images >= 1);
    served.abort();
    tokio::task::block_in_place(|| {
        launcher.stop(&identity).unwrap();
        assert_eq!(launcher.stop_engine(&short).unwrap(), Stopped::Stopped);
        assert_eq!(launcher.engine_leftovers().unwrap(), Vec::<String>::new());
    });
    runner_manager_node_agent::workspace::remove::remove_tree(&dirs.root).unwrap();
    assert!(!dirs.root.exists());
    let still = processes_of(ACCOUNT.uid);
    assert!(still.is_empty(), "processes left: {still:?}");
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the service's port is closed"
    );

    let _ = std::fs::remove_dir_all(&root);
    for dir in ["/var/lib/kubelet", "/home"] {
        let _ = std::fs::remove_file(format!("{dir}/rm-docker-probe-{short}"));
    }
}

/// A proxy alone, for a person to try a Docker CLI against: `RM_PROXY_ENGINE=<engine socket>
/// RM_PROXY_SOCKET=<socket to serve> cargo test ... -- --ignored serve_a_proxy_by_hand`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "by hand only"]
async fn serve_a_proxy_by_hand() {
    let engine = PathBuf::from(std::env::var_os("RM_PROXY_ENGINE").unwrap());
    let socket = PathBuf::from(std::env::var_os("RM_PROXY_SOCKET").unwrap());
    let _ = std::fs::remove_file(&socket);
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let served = proxy::spawn(
        listener,
        Arc::new(Proxy {
            rules: Rules {
                attempt: "by-hand".to_owned(),
                bind_roots: vec!["/tmp".into()],
            },
            engine,
            engine_wait: Duration::from_secs(5),
            unavailable: None,
        }),
    );
    tokio::time::sleep(Duration::from_secs(600)).await;
    served.abort();
}
