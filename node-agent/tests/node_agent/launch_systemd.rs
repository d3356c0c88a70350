//! The systemd launcher against a real systemd (issue 13 finding 6): a runner unit with the
//! agent's sandbox, whose stand-in listener performs what a hostile job would try — write the
//! host's file system, read /home, see other processes, reach a disk, make a setuid file, reach
//! the cloud's metadata service, fork without bound, leave files in /tmp and /dev/shm for the
//! next tenant of its account — and records what happened.
//!
//! Runs only inside the private systemd's namespaces (`e2e/systemd/start.sh`, then
//! `nsexec env RM_SYSTEMD_TESTS=1 cargo test -p runner-manager-node-agent --test
//! launch_systemd`, as `e2e/run-tests.sh` does) with the runner accounts of
//! `e2e/setup-runner-accounts.sh`; elsewhere each test prints why it skipped.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::launch_support;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use launch_support::{ENTRY_HELPER, jit, read_when_there};
use runner_manager_node_agent::account::RunnerAccount;
use runner_manager_node_agent::handoff::RestrictiveHandoff;
use runner_manager_node_agent::providers::cgroup::{CgroupLimits, RunnerDefaults};
use runner_manager_node_agent::providers::launcher::{Prestart, PrestartedStart};
use runner_manager_node_agent::providers::sandbox::{
    PROBE_ACCOUNT, RunnerNetwork, SandboxRefusal, namespace_addresses, probe_target,
    prove_denied_unreachable,
};
use runner_manager_node_agent::providers::systemd::{SystemdLauncher, install_helper};
use runner_manager_node_agent::providers::{LaunchSpec, RunnerLauncher, Stopped};

/// `rm-runner<n>` of `e2e/setup-runner-accounts.sh` (uid 20000 + n, n ≤ 64): systemd resolves
/// `User=` through NSS. Each test runs its units under accounts of its own: the tests run at once,
/// and `RemoveIPC` clears a uid's IPC only when that uid's last unit stops, so a unit of another
/// test under the same uid would keep this test's /dev/shm file (a CI run saw exactly that).
const fn runner(n: u32) -> RunnerAccount {
    RunnerAccount {
        uid: 20000 + n,
        gid: 20000,
    }
}

/// What the probe tries; one `name=yes|no` line each, then `done`.
const PROBE: &str = r#"#!/bin/bash
r="$PWD/probe"; : > "$r.tmp"
say() { echo "$1=$2" >> "$r.tmp"; }
try() { if eval "$2" >/dev/null 2>&1; then say "$1" yes; else say "$1" no; fi; }
try write_usr 'touch /usr/rm-probe-$PROBE_ID'
try write_owned_outside 'touch "$PROBE_OUTSIDE/x"'
try write_runtime 'touch "$PWD/written"'
try read_home_marker 'cat /home/rm-probe-$PROBE_ID'
try see_pid1 'test -e /proc/1/status'
try see_disk 'test -b /dev/vda || test -b /dev/sda || test -b /dev/nvme0n1'
try make_setuid 'touch "$PWD/s" && chmod 4755 "$PWD/s" && test -u "$PWD/s"'
try write_tmp 'echo left > /tmp/rm-probe-$PROBE_ID'
try write_shm 'echo left > /dev/shm/rm-probe-$PROBE_ID'
# The IP firewall drops what goes to a metadata address (a TCP connect then never completes);
# the control is a listener of the test's on loopback.
try metadata_reachable 'timeout 3 bash -c "exec 3<>/dev/tcp/169.254.169.254/80"'
try loopback_reachable 'timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$PROBE_PORT"'
# A listener of the test's on one of the node's own addresses (every node port): denied.
[ -n "$PROBE_NODE_ADDR" ] && try node_address_reachable 'timeout 3 bash -c "exec 3<>/dev/tcp/$PROBE_NODE_ADDR/$PROBE_NODE_PORT"'
# The nf_tables class (CVE-2024-1086): a user and network namespace of the job's own.
try unshare_user_net 'unshare -Urn true'
try unshare_mount 'unshare -m true'
# The kubelet's directory (pods' Secret volumes) is hidden, not just read-only.
try read_kubelet_marker 'cat /var/lib/kubelet/rm-probe-$PROBE_ID'
# What every job needs: git, outbound TLS (a test server on loopback), node's interface list
# (netlink), python and perl.
try git 'git init -q "$PWD/g" && git -C "$PWD/g" -c user.email=a@b -c user.name=a commit -q --allow-empty -m x'
[ -n "$PROBE_TLS_PORT" ] && try https 'curl -fsk --max-time 5 https://127.0.0.1:$PROBE_TLS_PORT/ -o /dev/null'
command -v node >/dev/null && try node_interfaces 'node -e "require(\"os\").networkInterfaces()"'
try python '/usr/bin/python3 -c "import socket, subprocess; subprocess.run([\"true\"], check=True); socket.getaddrinfo(\"localhost\", 80)"'
# The other tenant's environment, by every channel a local account has (issue 28 item 4).
if [ -n "$PROBE_PEER_UNIT" ]; then
  { systemctl show "$PROBE_PEER_UNIT" -p Environment; systemctl cat "$PROBE_PEER_UNIT"
    cat "/run/systemd/transient/$PROBE_PEER_UNIT"; tr '\0' '\n' < "/proc/$PROBE_PEER_PID/environ"
    ls -la "$PROBE_PEER_RUNTIME"; } > "$PWD/peer-view" 2>&1
  say peer_view collected
fi
# A fork bomb in miniature: perl's fork fails at once where bash's would retry for seconds.
say niceness "$(nice)"
say tasks_started "$(perl -e 'my @k; for (1..80) { my $p = fork(); last unless defined $p; if (!$p) { sleep 60; exit 0 } push @k, $p } print scalar(@k); kill 9, @k; waitpid($_, 0) for @k')"
echo done >> "$r.tmp"; mv "$r.tmp" "$r"
# A job that ignores SIGTERM (and so do its children: an ignored signal stays ignored across
# exec), as a stop must expect.
[ -n "$PROBE_IGNORE_TERM" ] && trap '' TERM
exec sleep 1000
"#;

fn inside_systemd(test: &str) -> bool {
    let here =
        std::env::var_os("RM_SYSTEMD_TESTS").is_some() && Path::new("/run/systemd/system").exists();
    if !here {
        println!(
            "{test}: skipped (not inside e2e/systemd's namespaces; e2e/run-tests.sh runs it there)"
        );
    }
    here
}

/// A host root outside /tmp (the unit's /tmp is private) with one runtime owned by the runner.
struct Host {
    /// The runner account the test's units run as (its own: see [`runner`]).
    account: RunnerAccount,
    root: PathBuf,
    runtime: PathBuf,
    /// A directory of the runner's own account beside its runtime: writable but for the
    /// sandbox (`ProtectSystem=strict`).
    outside: PathBuf,
    id: String,
}

impl Host {
    fn new(account: RunnerAccount) -> Self {
        let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        let root = PathBuf::from(format!("/var/lib/runner-manager-systemd-test-{id}"));
        let runtime = root.join("runners").join(&id);
        std::fs::create_dir_all(runtime.join("bin")).unwrap();
        for d in [&root, &root.join("runners")] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let listener = runtime.join("bin/Runner.Listener");
        std::fs::write(&listener, PROBE).unwrap();
        std::fs::set_permissions(&listener, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(&runtime, Some(account.uid), Some(account.gid)).unwrap();
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
        let outside = root.join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::chown(&outside, Some(account.uid), Some(account.gid)).unwrap();
        // Readable by anyone, were /home visible.
        std::fs::write(format!("/home/rm-probe-{id}"), b"operator data").unwrap();
        Self {
            account,
            root,
            runtime,
            outside,
            id,
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
        let _ = std::fs::remove_file(format!("/home/rm-probe-{}", self.id));
        let _ = std::fs::remove_file(format!("/usr/rm-probe-{}", self.id));
        let _ = std::fs::remove_file(format!("/tmp/rm-probe-{}", self.id));
        let _ = std::fs::remove_file(format!("/dev/shm/rm-probe-{}", self.id));
    }
}

fn spec<'a>(host: &'a Host, attempt: uuid::Uuid, extra: &[(&str, &str)]) -> LaunchSpec<'a> {
    let mut environment = BTreeMap::new();
    environment.insert("PROBE_ID".to_owned(), host.id.clone());
    environment.insert(
        "PROBE_OUTSIDE".to_owned(),
        host.outside.display().to_string(),
    );
    environment.insert("PROBE_PORT".to_owned(), "9".to_owned());
    environment.insert(
        "PATH".to_owned(),
        "/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
    );
    for (k, v) in extra {
        environment.insert((*k).to_owned(), (*v).to_owned());
    }
    LaunchSpec {
        attempt,
        runtime: &host.runtime,
        account: host.account,
        environment,
        limits: CgroupLimits::default(),
        cache: None,
    }
}

/// The launcher as the agent makes it: the entry helper installed on the host root, where the
/// unit can exec it (a helper left under /tmp — a checkout there — is hidden by PrivateTmp).
fn launcher(host: &Host) -> SystemdLauncher {
    SystemdLauncher::new(install_helper(Path::new(ENTRY_HELPER), &host.root).unwrap())
        .with_network(node_network())
}

/// A host for `account`, and its launcher.
fn launching(account: RunnerAccount) -> (Host, SystemdLauncher) {
    let host = Host::new(account);
    let launcher = launcher(&host);
    (host, launcher)
}

/// The agent's default filter with this host's own addresses as the node's.
fn node_network() -> RunnerNetwork {
    RunnerNetwork::new(&[], &[], &namespace_addresses("self"), &[]).unwrap()
}

/// A listener on one of this host's own (denied) addresses, if it has one.
fn node_listener() -> Option<std::net::TcpListener> {
    let ip = probe_target(&namespace_addresses("self"), &node_network())?;
    std::net::TcpListener::bind((ip, 0)).ok()
}

/// `openssl s_server` on loopback: a TLS endpoint a job's outbound HTTPS can be tried on.
struct TlsServer {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl TlsServer {
    fn start() -> Option<Self> {
        let dir = tempfile::tempdir().ok()?;
        let (key, cert) = (dir.path().join("k.pem"), dir.path().join("c.pem"));
        let made = std::process::Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            ])
            .args(["-subj", "/CN=localhost", "-keyout"])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .stderr(std::process::Stdio::null())
            .status()
            .ok()?
            .success();
        if !made {
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let child = std::process::Command::new("openssl")
            .args(["s_server", "-quiet", "-www", "-accept"])
            .arg(port.to_string())
            .arg("-cert")
            .arg(&cert)
            .arg("-key")
            .arg(&key)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .ok()?;
        // Ready once it accepts (bounded).
        let until = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(Self {
            child,
            port,
            _dir: dir,
        })
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn handoff(host: &Host) -> RestrictiveHandoff {
    let (secret, _) = jit();
    RestrictiveHandoff::create(&host.runtime, host.account, &secret).unwrap()
}

/// A start that fails inside systemd (here: the runner cannot enter its runtime) leaves no
/// unit holding the name, so the next start of the same attempt is not refused as "already
/// loaded" until someone runs `systemctl reset-failed`.
#[test]
fn a_failed_start_does_not_hold_the_units_name() {
    if !inside_systemd("a_failed_start_does_not_hold_the_units_name") {
        return;
    }
    let (host, launcher) = launching(runner(1));
    let attempt = uuid::Uuid::new_v4();
    let handoff_file = handoff(&host);
    std::os::unix::fs::chown(&host.runtime, Some(0), Some(0)).unwrap();
    let refused = launcher.start(&spec(&host, attempt, &[]), handoff_file);
    assert!(
        refused.is_err(),
        "the runner cannot chdir into a root-owned 0700 runtime"
    );
    std::os::unix::fs::chown(
        &host.runtime,
        Some(host.account.uid),
        Some(host.account.gid),
    )
    .unwrap();
    let identity = launcher
        .start(&spec(&host, attempt, &[]), handoff(&host))
        .unwrap();
    read_when_there(&host.runtime.join("probe"), Duration::from_secs(60));
    launcher.stop(&identity).unwrap();
}

/// A runner that takes a queued job, runs it and ends at once was still started: the launcher
/// learns its identity from the helper's receipt, written before the handoff is taken, not by
/// asking systemd for a main pid the unit no longer has (a real-node check once saw this start
/// fail as "no start time" although the job ran).
#[test]
fn a_runner_that_ends_at_once_was_still_started() {
    if !inside_systemd("a_runner_that_ends_at_once_was_still_started") {
        return;
    }
    let host = Host::new(runner(8));
    std::fs::write(
        host.runtime.join("bin/Runner.Listener"),
        "#!/bin/sh\nexit 0\n",
    )
    .unwrap();
    let launcher = launcher(&host);
    for _ in 0..3 {
        let identity = launcher
            .start(&spec(&host, uuid::Uuid::new_v4(), &[]), handoff(&host))
            .expect("a start whose runner has already ended is a start");
        assert_eq!(identity.cgroup.rsplit('/').next(), identity.unit.as_deref());
        // Ended, and nothing of the receipt left in the runtime.
        let until = Instant::now() + Duration::from_secs(30);
        while launcher.inspect(&identity).unwrap().is_alive() {
            assert!(Instant::now() < until, "the runner never ended");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!host.runtime.join(".entry-receipt").exists());
        launcher.stop(&identity).unwrap();
    }
}

/// A runner that ignores SIGTERM is stopped at once, not after systemd's stop timeout (10 s in
/// this systemd, 90 s on a default host).
#[test]
fn a_runner_ignoring_sigterm_is_stopped_without_waiting_for_the_stop_timeout() {
    if !inside_systemd("a_runner_ignoring_sigterm_is_stopped") {
        return;
    }
    let (host, launcher) = launching(runner(2));
    let identity = launcher
        .start(
            &spec(&host, uuid::Uuid::new_v4(), &[("PROBE_IGNORE_TERM", "1")]),
            handoff(&host),
        )
        .unwrap();
    read_when_there(&host.runtime.join("probe"), Duration::from_secs(60));
    let started = Instant::now();
    launcher.stop(&identity).unwrap();
    let took = started.elapsed();
    println!("stop of a TERM-ignoring runner: {} ms", took.as_millis());
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(!launcher.inspect(&identity).unwrap().is_alive());
}

#[test]
fn a_runner_unit_is_sandboxed_and_leaves_nothing_for_the_next_tenant() {
    if !inside_systemd("a_runner_unit_is_sandboxed") {
        return;
    }
    let (host, launcher) = launching(runner(3));
    let mut environment = BTreeMap::new();
    environment.insert("PROBE_ID".to_owned(), host.id.clone());
    environment.insert(
        "PROBE_OUTSIDE".to_owned(),
        host.outside.display().to_string(),
    );
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    environment.insert(
        "PROBE_PORT".to_owned(),
        listener.local_addr().unwrap().port().to_string(),
    );
    // Whether this host has a metadata service at all: where it has, the unit must not reach it
    // although the host does (the attack, and the proof the defence is what stops it).
    let host_reaches_metadata = std::net::TcpStream::connect_timeout(
        &"169.254.169.254:80".parse().unwrap(),
        Duration::from_secs(3),
    )
    .is_ok();
    println!("the host reaches 169.254.169.254:80: {host_reaches_metadata}");
    environment.insert(
        "PATH".to_owned(),
        "/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
    );
    let node = node_listener();
    if let Some(l) = &node {
        let a = l.local_addr().unwrap();
        environment.insert("PROBE_NODE_ADDR".to_owned(), a.ip().to_string());
        environment.insert("PROBE_NODE_PORT".to_owned(), a.port().to_string());
    }
    println!(
        "a listener on a node address: {:?}",
        node.as_ref().map(|l| l.local_addr())
    );
    let tls = TlsServer::start();
    if let Some(t) = &tls {
        environment.insert("PROBE_TLS_PORT".to_owned(), t.port.to_string());
    }
    // The kubelet's directory with a readable marker, made for the test where the host has none.
    let kubelet = Path::new("/var/lib/kubelet");
    let made_kubelet = !kubelet.exists();
    std::fs::create_dir_all(kubelet).unwrap();
    let marker = kubelet.join(format!("rm-probe-{}", host.id));
    std::fs::write(&marker, b"pod secret").unwrap();
    std::fs::set_permissions(&marker, std::fs::Permissions::from_mode(0o644)).unwrap();
    let defaults = RunnerDefaults {
        memory_max: Some(512 << 20),
        tasks_max: Some(32),
        nice: 10,
    };
    let spec = LaunchSpec {
        attempt: uuid::Uuid::new_v4(),
        runtime: &host.runtime,
        account: host.account,
        environment,
        limits: CgroupLimits::default().with_defaults(defaults),
        cache: None,
    };
    let (secret, _) = jit();
    let handoff = RestrictiveHandoff::create(&host.runtime, host.account, &secret).unwrap();
    let identity = launcher.start(&spec, handoff).unwrap();
    let report = read_when_there(&host.runtime.join("probe"), Duration::from_secs(60));
    println!("probe:\n{report}");
    let said: BTreeMap<&str, &str> = report.lines().filter_map(|l| l.split_once('=')).collect();
    let expect = [
        ("write_usr", "no"),
        ("write_owned_outside", "no"),
        ("write_runtime", "yes"),
        ("read_home_marker", "no"),
        ("see_pid1", "no"),
        ("see_disk", "no"),
        ("make_setuid", "no"),
        ("write_tmp", "yes"),
        ("write_shm", "yes"),
        ("metadata_reachable", "no"),
        ("loopback_reachable", "yes"),
        ("unshare_user_net", "no"),
        ("unshare_mount", "no"),
        ("read_kubelet_marker", "no"),
        ("git", "yes"),
        ("python", "yes"),
    ];
    let _ = std::fs::remove_file(&marker);
    if made_kubelet {
        let _ = std::fs::remove_dir(kubelet);
    }
    for (what, want) in expect {
        assert_eq!(said.get(what).copied(), Some(want), "{what}: {report}");
    }
    if node.is_some() {
        assert_eq!(
            said.get("node_address_reachable").copied(),
            Some("no"),
            "{report}"
        );
    }
    if tls.is_some() {
        assert_eq!(said.get("https").copied(), Some("yes"), "{report}");
    }
    if said.contains_key("node_interfaces") {
        assert_eq!(
            said.get("node_interfaces").copied(),
            Some("yes"),
            "{report}"
        );
    }
    // `--runner-nice` as the unit's `Nice=`, on a real systemd: the runner yields to the agent.
    assert_eq!(said.get("niceness").copied(), Some("10"), "{report}");
    let tasks: u32 = said["tasks_started"].trim().parse().unwrap();
    assert!(tasks < 32, "TasksMax=32 let {tasks} sleeps start");
    assert!(!Path::new(&format!("/usr/rm-probe-{}", host.id)).exists());
    assert!(!host.outside.join("x").exists());
    // The unit's /tmp is its own: nothing reached the host's.
    assert!(!Path::new(&format!("/tmp/rm-probe-{}", host.id)).exists());
    let shm = PathBuf::from(format!("/dev/shm/rm-probe-{}", host.id));
    assert!(shm.exists(), "/dev/shm is shared while the unit runs");

    launcher.stop(&identity).unwrap();
    // RemoveIPC: the account's /dev/shm files go with the unit, so the next runner under this
    // account (another tenant's, for an ephemeral runner) finds nothing of this one. systemd
    // removes them when it vacuums the uid's last reference, just after the unit is inactive
    // (a CI rehearsal saw the file still there at the instant `stop` returned): wait for it.
    let until = Instant::now() + Duration::from_secs(10);
    while shm.exists() {
        assert!(Instant::now() < until, "RemoveIPC left {shm:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The orphan sweep's view of systemd (issue 20): a runner unit is listed by its attempt name
/// and stopped by that name alone, the whole unit, with no identity; a unit of the same form
/// outside the runners' slice is not listed, so it is never taken for an orphan.
#[test]
fn a_leftover_runner_unit_is_listed_and_stopped_by_its_attempt_name_only() {
    if !inside_systemd("a_leftover_runner_unit_is_listed_and_stopped_by_its_attempt_name_only") {
        return;
    }
    let attempt = uuid::Uuid::new_v4();
    let (host, launcher) = launching(runner(4));
    let short = attempt.simple().to_string()[..12].to_owned();
    let identity = launcher
        .start(
            &spec(&host, attempt, &[("PROBE_IGNORE_TERM", "1")]),
            handoff(&host),
        )
        .unwrap();
    read_when_there(&host.runtime.join("probe"), Duration::from_secs(60));
    // Same form, another slice: not ours.
    let stranger = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
    let ok = std::process::Command::new("systemd-run")
        .arg(format!("--unit=rm-{stranger}.service"))
        .args(["--quiet", "--", "sleep", "1000"])
        .env("SYSTEMD_IGNORE_CHROOT", "1")
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let listed = launcher.leftovers().unwrap();
    assert!(listed.contains(&short), "{listed:?}");
    assert!(!listed.contains(&stranger), "{listed:?}");

    let stopped = launcher.stop_leftover(&short).unwrap();
    assert_eq!(
        stopped,
        runner_manager_node_agent::providers::Stopped::Stopped
    );
    assert!(!launcher.inspect(&identity).unwrap().is_alive());
    assert!(!launcher.leftovers().unwrap().contains(&short));
    assert!(launcher.stop_leftover("not-12-hex").is_err());
    let _ = std::process::Command::new("systemctl")
        .args(["stop", &format!("rm-{stranger}.service")])
        .env("SYSTEMD_IGNORE_CHROOT", "1")
        .status();
}

/// A listener that records the JIT and one variable of its environment, then runs on.
const RECORDER: &str = "#!/bin/sh\nprintf '%s %s' \"$ACTIONS_RUNNER_INPUT_JITCONFIG\" \"$PROBE_ID\" > \"$PWD/took.tmp\"\nmv \"$PWD/took.tmp\" \"$PWD/took\"\nexec sleep 1000\n";

/// `systemctl is-active` of a unit.
fn unit_state(unit: &str) -> String {
    let out = std::process::Command::new("systemctl")
        .args(["is-active", unit])
        .env("SYSTEMD_IGNORE_CHROOT", "1")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Waits (bounded) until `ready` holds.
fn wait_until(what: &str, ready: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(Instant::now() < until, "{what}: not within 30 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A host whose listener is the [`RECORDER`], and the unit name of a new attempt.
fn recording_host(account: RunnerAccount) -> (Host, uuid::Uuid, String) {
    let host = Host::new(account);
    std::fs::write(host.runtime.join("bin/Runner.Listener"), RECORDER).unwrap();
    let attempt = uuid::Uuid::new_v4();
    let unit = format!("rm-{}.service", &attempt.simple().to_string()[..12]);
    (host, attempt, unit)
}

/// [`recording_host`] and its launcher: the host, the attempt, its unit name, the launcher.
fn recording(account: RunnerAccount) -> (Host, uuid::Uuid, String, SystemdLauncher) {
    let (host, attempt, unit) = recording_host(account);
    let launcher = launcher(&host);
    (host, attempt, unit, launcher)
}

/// The unit of `spec` started ahead of its JIT, once it runs and its helper waits (the helper
/// writes its receipt first thing).
fn start_ahead(
    launcher: &SystemdLauncher,
    host: &Host,
    spec: &LaunchSpec<'_>,
    unit: &str,
) -> Prestart {
    let ahead = launcher.prestart(spec).expect("the unit is started ahead");
    wait_until("the helper waiting in its unit", || {
        unit_state(unit) == "active" && host.runtime.join(".entry-receipt").exists()
    });
    ahead
}

/// Issue 32: the runner's unit starts before its JIT exists (the sandbox's start overlaps the
/// JIT request), its helper waiting in the unit; the handoff offered afterwards is taken and the
/// listener runs with the JIT and the policy's environment, leaving nothing of the handover
/// (pointer, marker, receipt, handoff or environment file) in the runtime.
#[test]
fn a_unit_started_ahead_of_its_jit_takes_the_handoff_offered_later() {
    if !inside_systemd("a_unit_started_ahead_of_its_jit_takes_the_handoff_offered_later") {
        return;
    }
    let (host, attempt, unit, launcher) = recording(runner(9));
    let asked = Instant::now();
    let spec = spec(&host, attempt, &[]);
    let ahead = start_ahead(&launcher, &host, &spec, &unit);
    let waiting = asked.elapsed();
    assert!(!host.runtime.join("took").exists());
    let (secret, plain) = jit();
    let offered = Instant::now();
    let handoff = RestrictiveHandoff::create(&host.runtime, host.account, &secret).unwrap();
    let identity = launcher
        .start_prestarted(&spec, ahead, handoff)
        .expect("the helper takes the handoff offered to it");
    // For docs/benchmarks.md: what is left on the launch's path once the unit waits.
    println!(
        "started ahead: helper waiting {} ms after the start was asked; handoff taken and identity durable {} ms after the JIT",
        waiting.as_millis(),
        offered.elapsed().as_millis()
    );
    assert_eq!(identity.unit.as_deref(), Some(unit.as_str()));
    let took = read_when_there(&host.runtime.join("took"), Duration::from_secs(60));
    assert_eq!(took, format!("{plain} {}", host.id));
    let left: Vec<String> = std::fs::read_dir(&host.runtime)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".jit") || n.starts_with("jit-") || n == ".entry-receipt")
        .collect();
    assert!(left.is_empty(), "left in the runtime: {left:?}");
    assert!(launcher.inspect(&identity).unwrap().is_alive());
    launcher.stop(&identity).unwrap();
}

/// Issue 32, the attack: a job of a persistent slot leaves, for the slot's next runner, a pointer
/// to a handoff of its own holding another JIT (its account owns the slot, so both pass the
/// helper's checks). The unit started ahead must take the JIT the agent offers, never the planted
/// one: the start clears what an earlier runner left before the helper looks.
#[test]
fn a_pointer_an_earlier_job_planted_is_not_what_the_next_runner_takes() {
    if !inside_systemd("a_pointer_an_earlier_job_planted_is_not_what_the_next_runner_takes") {
        return;
    }
    let (host, attempt, unit, launcher) = recording(runner(12));
    let (decoy, decoy_plain) = jit();
    let planted = RestrictiveHandoff::create(&host.runtime, host.account, &decoy).unwrap();
    let pointer = host.runtime.join(".jit-handoff");
    std::fs::write(&pointer, planted.name()).unwrap();
    std::os::unix::fs::chown(&pointer, Some(host.account.uid), Some(host.account.gid)).unwrap();
    let spec = spec(&host, attempt, &[]);
    let ahead = start_ahead(&launcher, &host, &spec, &unit);
    let (secret, plain) = jit();
    let handoff = RestrictiveHandoff::create(&host.runtime, host.account, &secret).unwrap();
    let identity = launcher.start_prestarted(&spec, ahead, handoff).unwrap();
    let took = read_when_there(&host.runtime.join("took"), Duration::from_secs(60));
    assert_eq!(took, format!("{plain} {}", host.id));
    assert!(!took.contains(&decoy_plain));
    launcher.stop(&identity).unwrap();
}

/// Issue 32, the crash boundary: a unit started ahead whose JIT never comes (refused, or the
/// agent crashed before `Starting`) has no identity journalled; the attempt's cleanup stops it
/// by the attempt's name, and only a name of that form.
#[test]
fn a_unit_started_ahead_whose_jit_never_comes_is_stopped_by_its_attempt_name() {
    if !inside_systemd("a_unit_started_ahead_whose_jit_never_comes_is_stopped_by_its_attempt_name")
    {
        return;
    }
    let (host, attempt, unit, launcher) = recording(runner(10));
    let short = attempt.simple().to_string()[..12].to_owned();
    // Held, as a launch waiting for its JIT holds it (its environment file is the helper's).
    let ahead = start_ahead(&launcher, &host, &spec(&host, attempt, &[]), &unit);
    assert!(launcher.leftovers().unwrap().contains(&short));
    assert_eq!(launcher.stop_prestarted(&short).unwrap(), Stopped::Stopped);
    assert_ne!(unit_state(&unit), "active");
    assert!(!launcher.leftovers().unwrap().contains(&short));
    assert_eq!(
        launcher.stop_prestarted(&short).unwrap(),
        Stopped::AlreadyGone
    );
    assert!(launcher.stop_prestarted("not-12-hex").is_err());
    ahead.settled();
}

/// Issue 32: a helper started ahead that ended before its JIT was offered (killed, or its wait
/// ran out) gives the handoff back untaken, and a runner started the ordinary way takes the
/// same JIT under the same unit name.
#[test]
fn a_unit_started_ahead_that_ended_gives_its_jit_back_for_an_ordinary_start() {
    if !inside_systemd("a_unit_started_ahead_that_ended_gives_its_jit_back_for_an_ordinary_start") {
        return;
    }
    let (host, attempt, unit, launcher) = recording(runner(11));
    let spec = spec(&host, attempt, &[]);
    let ahead = start_ahead(&launcher, &host, &spec, &unit);
    let killed = std::process::Command::new("systemctl")
        .args(["kill", "--kill-whom=all", "--signal=SIGKILL", &unit])
        .env("SYSTEMD_IGNORE_CHROOT", "1")
        .status()
        .unwrap();
    assert!(killed.success());
    wait_until("the killed unit ended", || unit_state(&unit) != "active");
    let (secret, plain) = jit();
    let handoff = RestrictiveHandoff::create(&host.runtime, host.account, &secret).unwrap();
    let Err(PrestartedStart::Unseen(handoff)) = launcher.start_prestarted(&spec, ahead, handoff)
    else {
        panic!("a handoff nothing took is given back unseen");
    };
    assert!(handoff.exists().unwrap(), "the handoff is still whole");
    drop(handoff);
    let handoff = RestrictiveHandoff::create(&host.runtime, host.account, &secret).unwrap();
    let identity = launcher
        .start(&spec, handoff)
        .expect("the ordinary start after it");
    let took = read_when_there(&host.runtime.join("took"), Duration::from_secs(60));
    assert_eq!(took, format!("{plain} {}", host.id));
    launcher.stop(&identity).unwrap();
}

/// Issue 28 item 4, the attack: a second tenant's runner (another runner account, running at
/// the same time) reads the first one's unit by every channel a local account has —
/// `systemctl show -p Environment`, `systemctl cat`, the unit file under
/// `/run/systemd/transient` (0644), `/proc/<pid>/environ`, its runtime — and finds none of the
/// first tenant's `runner.env`. The unit file is readable (the control: the peer does see
/// `User=`), the environment is not in it.
#[test]
fn another_tenants_runner_cannot_read_this_ones_runner_env() {
    if !inside_systemd("another_tenants_runner_cannot_read_this_ones_runner_env") {
        return;
    }
    let secret = format!("tenantAsecret{}", uuid::Uuid::new_v4().simple());
    let (host, launcher) = launching(runner(5));
    let victim = launcher
        .start(
            &spec(&host, uuid::Uuid::new_v4(), &[("TENANT_A_TOKEN", &secret)]),
            handoff(&host),
        )
        .unwrap();
    read_when_there(&host.runtime.join("probe"), Duration::from_secs(60));
    let unit = victim.unit.clone().unwrap();

    // The other tenant: rm-runner2, its own runtime.
    const PEER: RunnerAccount = runner(6);
    let peer_runtime = host.root.join("runners").join("peer");
    std::fs::create_dir_all(peer_runtime.join("bin")).unwrap();
    let listener = peer_runtime.join("bin/Runner.Listener");
    std::fs::write(&listener, PROBE).unwrap();
    std::fs::set_permissions(&listener, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&peer_runtime, Some(PEER.uid), Some(PEER.gid)).unwrap();
    std::fs::set_permissions(&peer_runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut peer_spec = spec(
        &host,
        uuid::Uuid::new_v4(),
        &[
            ("PROBE_PEER_UNIT", unit.as_str()),
            ("PROBE_PEER_PID", &victim.pid.to_string()),
            ("PROBE_PEER_RUNTIME", &host.runtime.display().to_string()),
        ],
    );
    peer_spec.runtime = &peer_runtime;
    peer_spec.account = PEER;
    let (jit_secret, _) = jit();
    let peer = launcher
        .start(
            &peer_spec,
            RestrictiveHandoff::create(&peer_runtime, PEER, &jit_secret).unwrap(),
        )
        .unwrap();
    let report = read_when_there(&peer_runtime.join("probe"), Duration::from_secs(60));
    assert!(report.contains("peer_view=collected"), "{report}");
    let view = std::fs::read_to_string(peer_runtime.join("peer-view")).unwrap();
    println!("what the other tenant saw:\n{view}");
    launcher.stop(&peer).unwrap();
    launcher.stop(&victim).unwrap();
    assert!(
        view.contains(&format!("User={}", host.account.uid)),
        "the control: the unit file is readable to another account"
    );
    assert!(
        !view.contains(&secret),
        "the other tenant read runner.env:\n{view}"
    );
    assert!(!view.contains("TENANT_A_TOKEN"), "{view}");
}

/// The start-up proof against the real systemd (issue 28 item 3): with the runners' filter a
/// probe unit cannot reach the agent's listener on a denied address, so the launcher is
/// accepted; with a unit whose filter does not hold (here: the same probe, its unit given no
/// deny list, as a kernel without cgroup BPF would run it) it is refused as not enforced.
#[test]
fn the_network_probe_accepts_an_enforcing_systemd_and_refuses_one_that_is_not() {
    if !inside_systemd("the_network_probe_accepts_an_enforcing_systemd") {
        return;
    }
    let host = Host::new(runner(7));
    let own = namespace_addresses("self");
    let network = node_network();
    if probe_target(&own, &network).is_none() {
        println!("skipped: this host has no own address the filter denies");
        return;
    }
    let enforcing = launcher(&host);
    let started = Instant::now();
    let target = prove_denied_unreachable(
        &enforcing,
        &network,
        &own,
        &host.root,
        PROBE_ACCOUNT,
        Duration::from_secs(30),
    )
    .expect("the real systemd enforces IPAddressDeny");
    println!(
        "network proof: {target} unreachable from a probe unit, in {} ms",
        started.elapsed().as_millis()
    );
    let unfiltered = launcher(&host).with_network(RunnerNetwork {
        deny: Vec::new(),
        allow: Vec::new(),
    });
    assert_eq!(
        prove_denied_unreachable(
            &unfiltered,
            &network,
            &own,
            &host.root,
            PROBE_ACCOUNT,
            Duration::from_secs(30),
        ),
        Err(SandboxRefusal::NotEnforced)
    );
    // Nothing of the probes is left: no directory, no unit.
    let left: Vec<_> = std::fs::read_dir(&host.root)
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".network-probe-")
        })
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
