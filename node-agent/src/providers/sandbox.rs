//! A native runner's network sandbox (issue 28 item 3) and the start-up proof that it takes
//! effect.
//!
//! Native runners live in the host's network namespace: without a filter a job reaches the
//! kubelet (10250 on the node's addresses), every pod and Service, the node's own daemons and
//! the cloud's metadata services (instance and pod credentials). The systemd launcher therefore
//! gives every runner unit an `IPAddressDeny=` of link-local (IPv4 and IPv6), every metadata
//! address we know of outside it, the node's own addresses, and the cluster's pod and Service
//! ranges, with an admin allow-list (`IPAddressAllow=`, which systemd lets win over the deny
//! list) for what runners must still reach there. `IPAddressDeny=` filters by prefix, not port:
//! the node's addresses are denied whole (a job reaches none of the node's ports on them).
//! Loopback stays open, because a job's own tests listen and connect there; what the node
//! serves on 127.0.0.1 is reachable (docs/security.md says so).
//!
//! systemd implements the filter with cgroup BPF programs and, where the kernel cannot attach
//! them, starts the unit anyway with a notice in its own log. Nothing in the unit says the
//! filter is missing, so the agent proves it at start ([`prove_denied_unreachable`]): it opens a
//! listener on one of its own addresses that the deny list covers, starts a throw-away unit with
//! the runners' sandbox that tries to connect to it, and refuses the systemd launcher unless the
//! unit reports the connection blocked and the listener saw nothing.

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use runner_manager_crds::lease::NativeRefusal;

use crate::account::RunnerAccount;

/// Link-local, IPv4 and IPv6: every cloud's metadata service (169.254.169.254 and its
/// neighbours), ECS and EKS credential agents, and whatever else a host offers there. Denied
/// whole: a node-local DNS cache on link-local (169.254.20.10) goes in the allow-list.
pub const LINK_LOCAL: [&str; 2] = ["169.254.0.0/16", "fe80::/10"];

/// Metadata and credential endpoints, inside link-local and outside it. The ones outside are
/// denied by being here; all of them are refused in the allow-list (an allow entry wins over
/// a deny entry in systemd, so `169.254.0.0/16` allowed would reopen instance credentials).
pub const METADATA_ADDRESSES: [&str; 9] = [
    // AWS, GCP, Azure, Oracle, OpenStack, DigitalOcean instance metadata.
    "169.254.169.254",
    // AWS ECS task metadata and credentials.
    "169.254.170.2",
    // EKS Pod Identity agent (IPv4 and IPv6).
    "169.254.170.23",
    "fd00:ec2::23",
    // Tencent Cloud metadata.
    "169.254.0.23",
    // AWS instance metadata over IPv6.
    "fd00:ec2::254",
    // GCP metadata over IPv6.
    "fd20:ce::254",
    // Azure WireServer (VM agent, extension settings with secrets): not link-local.
    "168.63.129.16",
    // Alibaba Cloud metadata: not link-local.
    "100.100.100.200",
];

/// An address prefix (`10.96.0.0/12`, `fd00:ec2::254`): what `IPAddressDeny=` and
/// `IPAddressAllow=` take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IpPrefix {
    addr: IpAddr,
    len: u8,
}

/// A prefix that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an IP address or CIDR prefix (e.g. 10.96.0.0/12, fd00::/64)")]
pub struct PrefixError(pub String);

impl IpPrefix {
    /// One address, as a full-length prefix.
    pub fn host(addr: IpAddr) -> Self {
        let len = if addr.is_ipv4() { 32 } else { 128 };
        Self { addr, len }
    }

    fn bits(addr: IpAddr) -> (u128, u8) {
        match addr {
            IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
            IpAddr::V6(a) => (u128::from(a), 128),
        }
    }

    /// Whether `ip` is in the prefix (never across families).
    pub fn contains(&self, ip: IpAddr) -> bool {
        if self.addr.is_ipv4() != ip.is_ipv4() {
            return false;
        }
        let (net, width) = Self::bits(self.addr);
        let (a, _) = Self::bits(ip);
        let shift = u32::from(width - self.len);
        shift >= 128 || (net >> shift) == (a >> shift)
    }

    /// Whether every address of `other` is in this prefix.
    pub fn covers(&self, other: &IpPrefix) -> bool {
        self.len <= other.len && self.contains(other.addr)
    }
}

impl FromStr for IpPrefix {
    type Err = PrefixError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || PrefixError(s.to_owned());
        let (addr, len) = match s.trim().split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s.trim(), None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let width = if addr.is_ipv4() { 32 } else { 128 };
        let len = match len {
            Some(l) => l.parse::<u8>().map_err(|_| bad())?,
            None => width,
        };
        if len > width {
            return Err(bad());
        }
        // Host bits set (10.96.0.1/12) would be read by systemd as the network anyway; refuse
        // them so the value the admin wrote is the value enforced.
        let (a, _) = Self::bits(addr);
        let host_bits = if len == width {
            0
        } else {
            a & (u128::MAX >> (128 - u32::from(width - len)))
        };
        if host_bits != 0 {
            return Err(bad());
        }
        Ok(Self { addr, len })
    }
}

impl fmt::Display for IpPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = if self.addr.is_ipv4() { 32 } else { 128 };
        if self.len == width {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.len)
        }
    }
}

/// A flag's list of prefixes (one value to clap, not many).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefixList(pub Vec<IpPrefix>);

/// Parses a comma- or space-separated list of prefixes (a flag's value).
pub fn parse_prefixes(s: &str) -> Result<Vec<IpPrefix>, PrefixError> {
    s.split([',', ' '])
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(IpPrefix::from_str)
        .collect()
}

fn fixed(list: &[&str]) -> Vec<IpPrefix> {
    list.iter()
        .filter_map(|p| IpPrefix::from_str(p).ok())
        .collect()
}

/// Why a runner network could not be built. Closed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NetworkError {
    #[error(
        "--runner-ip-allow entry {0} covers the metadata address {1}: an allowed prefix wins over the deny list, so runners would reach instance credentials; allow a narrower prefix that leaves {1} out"
    )]
    AllowsMetadata(IpPrefix, IpPrefix),
}

/// The runner units' network filter: denied prefixes, and the admin's allowed ones (which
/// systemd lets win).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunnerNetwork {
    pub deny: Vec<IpPrefix>,
    pub allow: Vec<IpPrefix>,
}

impl Default for RunnerNetwork {
    /// Link-local and the metadata addresses only (no cluster ranges, no node addresses).
    fn default() -> Self {
        Self::new(&[], &[], &[], &[]).unwrap_or(Self {
            deny: Vec::new(),
            allow: Vec::new(),
        })
    }
}

impl RunnerNetwork {
    /// Link-local, the metadata addresses, the node's own non-loopback addresses, the pod and
    /// Service ranges; `allow` as given, refused where it would reopen a metadata address.
    pub fn new(
        pod_cidrs: &[IpPrefix],
        service_cidrs: &[IpPrefix],
        node_addresses: &[IpAddr],
        allow: &[IpPrefix],
    ) -> Result<Self, NetworkError> {
        let metadata = fixed(&METADATA_ADDRESSES);
        for a in allow {
            if let Some(m) = metadata.iter().find(|m| a.covers(m)) {
                return Err(NetworkError::AllowsMetadata(*a, *m));
            }
        }
        let mut deny = fixed(&LINK_LOCAL);
        let mut add = |p: IpPrefix| {
            if !deny.iter().any(|d| d.covers(&p)) {
                deny.push(p);
            }
        };
        for m in metadata {
            add(m);
        }
        for p in pod_cidrs.iter().chain(service_cidrs) {
            add(*p);
        }
        for ip in node_addresses.iter().filter(|ip| !ip.is_loopback()) {
            add(IpPrefix::host(*ip));
        }
        Ok(Self {
            deny,
            allow: allow.to_vec(),
        })
    }

    /// Whether a runner unit cannot reach `ip`, by systemd's rule: allowed wins, then denied.
    pub fn denies(&self, ip: IpAddr) -> bool {
        !self.allow.iter().any(|a| a.contains(ip)) && self.deny.iter().any(|d| d.contains(ip))
    }

    /// The unit properties: `IPAddressDeny=` always, `IPAddressAllow=` when the admin set one.
    pub fn properties(&self) -> Vec<(String, String)> {
        let join = |l: &[IpPrefix]| {
            l.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" ")
        };
        let mut p = vec![("IPAddressDeny".to_owned(), join(&self.deny))];
        if !self.allow.is_empty() {
            p.push(("IPAddressAllow".to_owned(), join(&self.allow)));
        }
        p
    }
}

/// The local IPv4 addresses in `/proc/<pid>/net/fib_trie`: each leaf `|-- <ip>` followed by a
/// `/32 host LOCAL` line. Pure.
pub fn parse_fib_trie(text: &str) -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut leaf: Option<Ipv4Addr> = None;
    for line in text.lines() {
        let t = line.trim();
        if let Some(ip) = t.strip_prefix("|-- ") {
            leaf = ip.trim().parse().ok();
        } else if t.starts_with("/32 host LOCAL")
            && let Some(ip) = leaf
            && !out.contains(&IpAddr::V4(ip))
        {
            out.push(IpAddr::V4(ip));
        }
    }
    out
}

/// The IPv6 addresses in `/proc/<pid>/net/if_inet6` (first column, 32 hex digits). Pure.
pub fn parse_if_inet6(text: &str) -> Vec<IpAddr> {
    text.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|h| h.len() == 32)
        .filter_map(|h| u128::from_str_radix(h, 16).ok())
        .map(|n| IpAddr::V6(Ipv6Addr::from(n)))
        .collect()
}

/// The addresses of the network namespace of `pid` (`self`, or `1`: the host's, in the agent's
/// hostPID pod). Unreadable files give no addresses.
pub fn namespace_addresses(pid: &str) -> Vec<IpAddr> {
    let read =
        |f: &str| std::fs::read_to_string(format!("/proc/{pid}/net/{f}")).unwrap_or_default();
    let mut all = parse_fib_trie(&read("fib_trie"));
    all.extend(parse_if_inet6(&read("if_inet6")));
    all
}

/// The address the probe listens on: one of the agent's own addresses that the runner filter
/// denies (in a pod, its pod IP in the pod range; on a host, a node address). IPv4 first.
pub fn probe_target(own: &[IpAddr], network: &RunnerNetwork) -> Option<IpAddr> {
    let mut candidates: Vec<IpAddr> = own
        .iter()
        .copied()
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified() && network.denies(*ip))
        // An IPv6 link-local address needs a scope id to connect to; skip it.
        .filter(|ip| !matches!(ip, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80))
        .collect();
    candidates.sort_by_key(|ip| !ip.is_ipv4());
    candidates.first().copied()
}

/// The probe unit's account: `nobody`, never a runner account, so the probe's stop touches no
/// runner's processes or files.
pub const PROBE_ACCOUNT: RunnerAccount = RunnerAccount {
    uid: 65534,
    gid: 65534,
};

/// What the probe unit wrote: [`REACHED`] or [`BLOCKED`], one line.
pub const REACHED: &str = "reached";
pub const BLOCKED: &str = "blocked";

/// Why the systemd launcher is refused. Closed: it reaches the node's Lease and the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SandboxRefusal {
    #[error(
        "the runner network filter is not enforced: a probe unit with the runners' IPAddressDeny= reached a denied address (systemd could not attach its cgroup BPF firewall: the kernel lacks CONFIG_CGROUP_BPF or cgroup v2 is not mounted); native runners would reach the kubelet, every pod and the cloud's metadata service. Fix the node's kernel/cgroup setup, or run native runners elsewhere"
    )]
    NotEnforced,
    #[error(
        "none of the agent's own addresses is denied to runners, so the network filter cannot be proven: the agent's pod IP should lie in --runner-pod-cidrs (the chart's nodeAgent.runnerNetwork.podCIDRs); set it to the cluster's pod range"
    )]
    NoDeniedAddress,
    #[error(
        "the network probe could not be set up (listener or probe directory): see the agent's log; the systemd launcher stays refused until it succeeds"
    )]
    ProbeSetup,
    #[error(
        "the network probe unit could not be started on the node's systemd: check /run/systemd is mounted and systemd-run works"
    )]
    ProbeNotStarted,
    #[error(
        "the network probe unit did not report in time: the node's systemd did not run it (see its journal for rm-probe-*.service)"
    )]
    ProbeDidNotReport,
}

impl SandboxRefusal {
    pub const ALL: [Self; 5] = [
        Self::NotEnforced,
        Self::NoDeniedAddress,
        Self::ProbeSetup,
        Self::ProbeNotStarted,
        Self::ProbeDidNotReport,
    ];

    /// The Lease annotation's word.
    pub fn lease(self) -> NativeRefusal {
        match self {
            Self::NotEnforced => NativeRefusal::NetworkFilterNotEnforced,
            Self::NoDeniedAddress => NativeRefusal::NoDeniedAddress,
            Self::ProbeSetup => NativeRefusal::ProbeSetupFailed,
            Self::ProbeNotStarted => NativeRefusal::ProbeNotStarted,
            Self::ProbeDidNotReport => NativeRefusal::ProbeDidNotReport,
        }
    }

    /// The log line's closed `error` field.
    pub fn as_str(self) -> &'static str {
        self.lease().as_str()
    }
}

/// The decision from what was observed. Pure: the listener's own observation outranks what
/// the probe says (a probe that connected is proof whatever it wrote).
pub fn verdict(listener_accepted: bool, reported: Option<&str>) -> Result<(), SandboxRefusal> {
    if listener_accepted {
        return Err(SandboxRefusal::NotEnforced);
    }
    match reported.map(str::trim) {
        Some(BLOCKED) => Ok(()),
        Some(REACHED) => Err(SandboxRefusal::NotEnforced),
        _ => Err(SandboxRefusal::ProbeDidNotReport),
    }
}

/// One probe to run: where it connects and where it writes its verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    /// `rm-probe-<12hex>.service`.
    pub unit: String,
    pub target: SocketAddr,
    /// The probe's own directory (the only path it may write).
    pub dir: PathBuf,
    /// `<dir>/result`: [`REACHED`] or [`BLOCKED`].
    pub result: PathBuf,
    pub account: RunnerAccount,
}

/// What starts the probe: the node's systemd in the agent, a stand-in in unit tests.
pub trait ProbeUnits {
    /// Starts the throw-away unit for `probe`, with the runners' network properties; returns
    /// once it is submitted.
    fn start_probe(&self, probe: &Probe) -> io::Result<()>;
    /// Stops and forgets it (best effort).
    fn remove_probe(&self, probe: &Probe);
}

/// Proves that a runner unit cannot reach a denied address: `own` are the agent's addresses,
/// `root` a directory the probe unit can see at the same path (the host root).
pub fn prove_denied_unreachable(
    units: &dyn ProbeUnits,
    network: &RunnerNetwork,
    own: &[IpAddr],
    root: &Path,
    account: RunnerAccount,
    deadline: Duration,
) -> Result<SocketAddr, SandboxRefusal> {
    let ip = probe_target(own, network).ok_or(SandboxRefusal::NoDeniedAddress)?;
    let setup = |what: &str, e: io::Error| {
        tracing::warn!("network probe: {what}: {:?}", e.kind());
        SandboxRefusal::ProbeSetup
    };
    let listener = TcpListener::bind((ip, 0)).map_err(|e| setup("listening", e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| setup("listening", e))?;
    let target = listener.local_addr().map_err(|e| setup("listening", e))?;
    let short = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
    let dir = root.join(format!(".network-probe-{short}"));
    make_probe_dir(&dir, account).map_err(|e| setup("its directory", e))?;
    let probe = Probe {
        unit: format!("rm-probe-{short}.service"),
        target,
        result: dir.join("result"),
        dir,
        account,
    };
    let outcome = run_probe(units, &probe, &listener, deadline);
    units.remove_probe(&probe);
    let _ = std::fs::remove_dir_all(&probe.dir);
    outcome.map(|()| target)
}

fn make_probe_dir(dir: &Path, account: RunnerAccount) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(0o700).create(dir)?;
    std::os::unix::fs::chown(dir, Some(account.uid), Some(account.gid))
}

fn run_probe(
    units: &dyn ProbeUnits,
    probe: &Probe,
    listener: &TcpListener,
    deadline: Duration,
) -> Result<(), SandboxRefusal> {
    if let Err(e) = units.start_probe(probe) {
        tracing::warn!("network probe: starting its unit: {:?}", e.kind());
        return Err(SandboxRefusal::ProbeNotStarted);
    }
    let until = Instant::now() + deadline;
    let mut accepted = false;
    let reported = loop {
        accepted |= listener.accept().is_ok();
        // Complete once the line ends: the probe writes it in one call, but a reader may see
        // a prefix of it.
        let text = std::fs::read_to_string(&probe.result).ok();
        if let Some(t) = text.filter(|t| t.ends_with('\n')) {
            // The probe connected (or not) before it wrote: a connection is in the backlog.
            accepted |= listener.accept().is_ok();
            break Some(t);
        }
        if Instant::now() >= until {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    verdict(accepted, reported.as_deref())
}

/// How long the probe's connect may take before it counts as blocked. A dropped SYN never
/// answers; a reachable listener on the node answers at once.
pub const PROBE_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The entry helper's probe mode: `--probe-connect <ip:port> --probe-result <path>`. Connects
/// (bounded) and writes [`REACHED`] or [`BLOCKED`] to a new 0600 file. `None` when the args are
/// not a probe's.
pub fn probe_main(args: &[std::ffi::OsString]) -> Option<i32> {
    let [flag, target, result_flag, result] = args else {
        return None;
    };
    if flag != "--probe-connect" || result_flag != "--probe-result" {
        return None;
    }
    let Some(target) = target.to_str().and_then(|t| t.parse::<SocketAddr>().ok()) else {
        return Some(2);
    };
    let word = match std::net::TcpStream::connect_timeout(&target, PROBE_CONNECT_TIMEOUT) {
        Ok(_) => REACHED,
        Err(_) => BLOCKED,
    };
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(Path::new(result))
        .and_then(|mut f| f.write_all(format!("{word}\n").as_bytes()));
    Some(if written.is_ok() { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> IpPrefix {
        s.parse().unwrap()
    }

    #[test]
    fn prefixes_parse_contain_and_print() {
        assert!(p("10.96.0.0/12").contains("10.97.0.5".parse().unwrap()));
        assert!(!p("10.96.0.0/12").contains("10.112.0.1".parse().unwrap()));
        assert!(p("fe80::/10").contains("fe80::1".parse().unwrap()));
        assert!(!p("fe80::/10").contains("169.254.1.1".parse().unwrap()));
        assert!(p("0.0.0.0/0").contains("8.8.8.8".parse().unwrap()));
        assert_eq!(p("fd00:ec2::254").to_string(), "fd00:ec2::254");
        assert_eq!(p("10.96.0.0/12").to_string(), "10.96.0.0/12");
        for bad in ["10.96.0.1/12", "10.0.0.0/33", "x", "10.0.0.0/", "::/129"] {
            assert!(bad.parse::<IpPrefix>().is_err(), "{bad}");
        }
        assert_eq!(
            parse_prefixes("10.98.0.0/24, 10.97.0.0/24").unwrap(),
            vec![p("10.98.0.0/24"), p("10.97.0.0/24")]
        );
        assert!(parse_prefixes("").unwrap().is_empty());
    }

    /// Every address the issue names is denied, and the cluster's ranges and the node's
    /// addresses are; loopback and the internet are not.
    #[test]
    fn the_deny_list_covers_metadata_link_local_cluster_ranges_and_the_node() {
        let node: IpAddr = "10.213.7.2".parse().unwrap();
        let n = RunnerNetwork::new(
            &[p("10.98.0.0/24")],
            &[p("10.97.0.0/24")],
            &[
                node,
                "127.0.0.1".parse().unwrap(),
                "fe80::1".parse().unwrap(),
            ],
            &[],
        )
        .unwrap();
        for ip in [
            "169.254.169.254",
            "168.63.129.16",
            "fd20:ce::254",
            "169.254.0.23",
            "169.254.170.23",
            "fd00:ec2::23",
            "fd00:ec2::254",
            "100.100.100.200",
            "169.254.20.10",
            "fe80::1234",
            "10.98.0.7",
            "10.97.0.1",
            "10.213.7.2",
        ] {
            assert!(n.denies(ip.parse().unwrap()), "{ip} reachable");
        }
        for ip in ["127.0.0.1", "::1", "10.213.7.1", "140.82.112.3"] {
            assert!(!n.denies(ip.parse().unwrap()), "{ip} denied");
        }
        let props = n.properties();
        assert_eq!(props.len(), 1, "no allow-list, no IPAddressAllow");
        assert_eq!(props[0].0, "IPAddressDeny");
        assert!(
            props[0].1.starts_with("169.254.0.0/16 fe80::/10 "),
            "{}",
            props[0].1
        );
        // Inside link-local: not repeated.
        assert!(!props[0].1.contains("169.254.169.254"), "{}", props[0].1);
    }

    #[test]
    fn the_allow_list_wins_but_never_over_a_metadata_address() {
        let n = RunnerNetwork::new(&[p("10.98.0.0/24")], &[], &[], &[p("169.254.20.10")]).unwrap();
        assert!(!n.denies("169.254.20.10".parse().unwrap()));
        assert!(n.denies("169.254.169.254".parse().unwrap()));
        assert_eq!(
            n.properties()[1],
            ("IPAddressAllow".to_owned(), "169.254.20.10".to_owned())
        );
        for wide in ["169.254.0.0/16", "0.0.0.0/0", "168.63.129.0/24", "fd00::/8"] {
            assert!(
                matches!(
                    RunnerNetwork::new(&[], &[], &[], &[p(wide)]),
                    Err(NetworkError::AllowsMetadata(..))
                ),
                "{wide}"
            );
        }
    }

    #[test]
    fn local_addresses_are_read_from_proc() {
        let fib = "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n     +-- 127.0.0.0/8 2 0 2\n        |-- 127.0.0.1\n           /32 host LOCAL\n     |-- 192.0.2.0\n        /24 link UNICAST\n     |-- 192.0.2.2\n        /32 host LOCAL\nLocal:\n     |-- 192.0.2.2\n        /32 host LOCAL\n     |-- 192.0.2.255\n        /32 link BROADCAST\n";
        let v4 = parse_fib_trie(fib);
        assert_eq!(
            v4,
            vec![
                "127.0.0.1".parse::<IpAddr>().unwrap(),
                "192.0.2.2".parse().unwrap()
            ]
        );
        let v6 = parse_if_inet6(
            "fd000000000000000000000000000002 02 40 00 80     eth0\n00000000000000000000000000000001 01 80 10 80       lo\n",
        );
        assert_eq!(
            v6,
            vec!["fd00::2".parse::<IpAddr>().unwrap(), "::1".parse().unwrap()]
        );
    }

    #[test]
    fn the_probe_target_is_an_own_denied_address() {
        let n = RunnerNetwork::new(&[p("10.98.0.0/24")], &[], &[], &[]).unwrap();
        let own: Vec<IpAddr> = ["127.0.0.1", "fe80::1", "10.98.0.9", "192.0.2.2"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(probe_target(&own, &n), Some("10.98.0.9".parse().unwrap()));
        assert_eq!(probe_target(&own[..2], &n), None, "loopback and fe80 only");
    }

    #[test]
    fn the_verdict_trusts_the_listener_first() {
        assert_eq!(verdict(false, Some("blocked\n")), Ok(()));
        assert_eq!(
            verdict(true, Some("blocked\n")),
            Err(SandboxRefusal::NotEnforced)
        );
        assert_eq!(
            verdict(false, Some("reached\n")),
            Err(SandboxRefusal::NotEnforced)
        );
        assert_eq!(verdict(false, None), Err(SandboxRefusal::ProbeDidNotReport));
        assert_eq!(
            verdict(false, Some("junk\n")),
            Err(SandboxRefusal::ProbeDidNotReport)
        );
        let words: std::collections::BTreeSet<_> =
            SandboxRefusal::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(words.len(), SandboxRefusal::ALL.len());
    }

    /// Stand-ins for the node's systemd: one whose kernel does not enforce (the probe's connect
    /// goes through, as on a host without cgroup BPF), one that enforces, one that never runs
    /// the unit.
    enum Stand {
        NotEnforcing,
        Enforcing,
        Silent,
    }

    impl ProbeUnits for Stand {
        fn start_probe(&self, probe: &Probe) -> io::Result<()> {
            let word = match self {
                Self::Silent => return Ok(()),
                // The probe's connect succeeds: nothing filters it.
                Self::NotEnforcing => {
                    std::net::TcpStream::connect_timeout(&probe.target, PROBE_CONNECT_TIMEOUT)
                        .map(|_| REACHED)
                        .unwrap_or(BLOCKED)
                }
                Self::Enforcing => BLOCKED,
            };
            std::fs::write(&probe.result, format!("{word}\n"))
        }
        fn remove_probe(&self, _probe: &Probe) {}
    }

    fn me() -> RunnerAccount {
        RunnerAccount {
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
        }
    }

    #[test]
    fn a_host_that_does_not_enforce_the_filter_is_refused() {
        let root = tempfile::tempdir().unwrap();
        // Loopback stands in for the denied address here: only the decision is under test.
        let network = RunnerNetwork::new(&[p("127.0.0.0/8")], &[], &[], &[]).unwrap();
        let own = ["127.0.0.1".parse().unwrap()];
        // probe_target never picks loopback, so the steps after it are driven directly.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let dir = root.path().join("probe");
        make_probe_dir(&dir, me()).unwrap();
        let probe = Probe {
            unit: "rm-probe-0123456789ab.service".into(),
            target: listener.local_addr().unwrap(),
            result: dir.join("result"),
            dir: dir.clone(),
            account: me(),
        };
        let d = Duration::from_secs(5);
        assert_eq!(
            run_probe(&Stand::NotEnforcing, &probe, &listener, d),
            Err(SandboxRefusal::NotEnforced)
        );
        std::fs::remove_file(&probe.result).unwrap();
        assert_eq!(run_probe(&Stand::Enforcing, &probe, &listener, d), Ok(()));
        std::fs::remove_file(&probe.result).unwrap();
        assert_eq!(
            run_probe(
                &Stand::Silent,
                &probe,
                &listener,
                Duration::from_millis(200)
            ),
            Err(SandboxRefusal::ProbeDidNotReport)
        );
        // And no own denied address at all: refused before anything starts.
        assert_eq!(
            prove_denied_unreachable(&Stand::Enforcing, &network, &own, root.path(), me(), d),
            Err(SandboxRefusal::NoDeniedAddress)
        );
    }
}
