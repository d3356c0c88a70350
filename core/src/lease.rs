//! What a node agent publishes on its Lease (`runner-manager-agent-<node>` in the system
//! namespace, DESIGN §6): the contract between the agent, which writes these annotations on every
//! heartbeat, and the operator's placement, which reads them. Pure: both sides share this one
//! encoding so a key or format can never drift between them.

use std::collections::{BTreeMap, BTreeSet};

/// Runners the node may hold at once (the agent's `--capacity`).
pub const CAPACITY: &str = "runner-manager.dev/capacity";
/// Capacity units free by the agent's own count (every attempt that counts against capacity,
/// `Pending` included, is taken).
pub const FREE: &str = "runner-manager.dev/free";
/// `true` once every attempt of the node has been reconciled after the agent started
/// (DESIGN §4 rule 8); the operator places nothing on the node before.
pub const RECOVERY_COMPLETE: &str = "runner-manager.dev/recovery-complete";
/// Why recovery is not complete, when it is blocked (a closed [`RecoveryBlocked`] word).
pub const RECOVERY_BLOCKED: &str = "runner-manager.dev/recovery-blocked";
/// Providers that can launch on this node: `native`, `oci`, comma-separated.
pub const PROVIDERS: &str = "runner-manager.dev/providers";
/// The sha256 of every runner package in the agent's cache, comma-separated.
pub const PACKAGES: &str = "runner-manager.dev/packages";
/// Cleaned persistent slots nothing leases, per policy uid: `<uid>=<n>,…`.
pub const FREE_SLOTS: &str = "runner-manager.dev/free-slots";
/// What the node's pods of other workloads request (`cpu=<millicores>,memory=<bytes>`): pods
/// bound to the node without the `runner-manager.dev/pod-role` label that have not ended. Empty
/// (or absent, from an older agent) when the agent does not know.
pub const FOREIGN_REQUESTS: &str = "runner-manager.dev/foreign-requests";

/// Why the agent refuses to launch native runners, when it does (a closed [`NativeRefusal`]
/// word; empty when native runners are offered). `native` is then absent from [`PROVIDERS`].
pub const NATIVE_REFUSED: &str = "runner-manager.dev/native-refused";

/// Why an agent refuses native runners: its start-up proof that the runner units' sandbox
/// takes effect failed. Closed: it reaches the Lease and the operator's view of the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NativeRefusal {
    /// A probe unit reached an address the runner network filter denies.
    NetworkFilterNotEnforced,
    /// None of the agent's addresses is denied to runners: the filter cannot be proven (the
    /// pod range is likely misconfigured).
    NoDeniedAddress,
    /// The probe's listener or directory could not be made.
    ProbeSetupFailed,
    /// The node's systemd did not take the probe unit.
    ProbeNotStarted,
    /// The probe unit did not report in time.
    ProbeDidNotReport,
}

impl NativeRefusal {
    pub const ALL: [Self; 5] = [
        Self::NetworkFilterNotEnforced,
        Self::NoDeniedAddress,
        Self::ProbeSetupFailed,
        Self::ProbeNotStarted,
        Self::ProbeDidNotReport,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::NetworkFilterNotEnforced => "NetworkFilterNotEnforced",
            Self::NoDeniedAddress => "NoDeniedAddress",
            Self::ProbeSetupFailed => "ProbeSetupFailed",
            Self::ProbeNotStarted => "ProbeNotStarted",
            Self::ProbeDidNotReport => "ProbeDidNotReport",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// Why an agent's recovery cannot complete: closed, because it reaches the Lease, events and
/// the operator's `Scaling` condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RecoveryBlocked {
    /// A recorded runner identity is unreadable or missing for a process that may live.
    IdentityUnreadable,
    /// The attempts of the node could not be listed.
    ListFailed,
    /// A status write needed by recovery keeps failing.
    JournalWriteFailed,
    /// GitHub did not answer (the operator's fact says `unreachable`) for an attempt whose
    /// decision needs it: deferred until it answers.
    GitHubUnreachable,
}

impl RecoveryBlocked {
    pub const ALL: [Self; 4] = [
        Self::IdentityUnreadable,
        Self::ListFailed,
        Self::JournalWriteFailed,
        Self::GitHubUnreachable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::IdentityUnreadable => "IdentityUnreadable",
            Self::ListFailed => "ListFailed",
            Self::JournalWriteFailed => "JournalWriteFailed",
            Self::GitHubUnreachable => "GitHubUnreachable",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// A launch provider an agent offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Provider {
    Native,
    Oci,
}

impl Provider {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Native => "native",
            Self::Oci => "oci",
        }
    }
}

/// Everything an agent advertises on its Lease.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentAdvert {
    pub capacity: u32,
    pub free: u32,
    pub recovery_complete: bool,
    pub recovery_blocked: Option<RecoveryBlocked>,
    pub providers: BTreeSet<Provider>,
    /// sha256 hex of each cached package.
    pub packages: BTreeSet<String>,
    /// Free cleaned slots per policy uid (only non-zero counts are published).
    pub free_slots: BTreeMap<String, u32>,
    /// What other workloads' pods on the node request (`None`: unknown — an older agent, or
    /// its watch has not listed yet). Placement takes it from the node's room, as the
    /// scheduler and kubelet do, without the operator watching every pod of the cluster.
    pub foreign_requests: Option<ForeignRequests>,
    /// Why native runners are refused on the node (`None`: they are offered, or an older agent).
    pub native_refused: Option<NativeRefusal>,
}

/// CPU and memory requested by the node's pods of other workloads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForeignRequests {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

/// An annotation that is present but unreadable: the operator treats the node as unplaceable
/// and names the key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("agent Lease annotation {key}={value:?} is not {expected}")]
pub struct AdvertError {
    pub key: &'static str,
    pub value: String,
    pub expected: &'static str,
}

impl AgentAdvert {
    /// The annotations to merge onto the Lease (every key, so a stale value is overwritten).
    pub fn to_annotations(&self) -> BTreeMap<String, String> {
        let join = |it: &mut dyn Iterator<Item = String>| it.collect::<Vec<_>>().join(",");
        BTreeMap::from([
            (CAPACITY.to_owned(), self.capacity.to_string()),
            (FREE.to_owned(), self.free.to_string()),
            (
                RECOVERY_COMPLETE.to_owned(),
                self.recovery_complete.to_string(),
            ),
            (
                RECOVERY_BLOCKED.to_owned(),
                self.recovery_blocked
                    .map(RecoveryBlocked::as_str)
                    .unwrap_or_default()
                    .to_owned(),
            ),
            (
                PROVIDERS.to_owned(),
                join(&mut self.providers.iter().map(|p| p.as_str().to_owned())),
            ),
            (
                PACKAGES.to_owned(),
                join(&mut self.packages.iter().cloned()),
            ),
            (
                FREE_SLOTS.to_owned(),
                join(
                    &mut self
                        .free_slots
                        .iter()
                        .filter(|(_, n)| **n > 0)
                        .map(|(uid, n)| format!("{uid}={n}")),
                ),
            ),
            (
                FOREIGN_REQUESTS.to_owned(),
                self.foreign_requests
                    .map(|f| format!("cpu={},memory={}", f.cpu_millis, f.memory_bytes))
                    .unwrap_or_default(),
            ),
            (
                NATIVE_REFUSED.to_owned(),
                self.native_refused
                    .map(NativeRefusal::as_str)
                    .unwrap_or_default()
                    .to_owned(),
            ),
        ])
    }

    /// Read an advert back. A Lease without our annotations (an agent that has not published
    /// yet) reads as capacity 0 and recovery incomplete: nothing is placed on it.
    pub fn from_annotations(a: &BTreeMap<String, String>) -> Result<Self, AdvertError> {
        let get = |k: &str| a.get(k).map(String::as_str).unwrap_or_default().trim();
        let number = |key: &'static str| -> Result<u32, AdvertError> {
            let v = get(key);
            if v.is_empty() {
                return Ok(0);
            }
            v.parse().map_err(|_| AdvertError {
                key,
                value: v.to_owned(),
                expected: "a non-negative integer",
            })
        };
        let list = |key: &str| -> Vec<&str> {
            get(key)
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .collect()
        };
        let recovery_complete = match get(RECOVERY_COMPLETE) {
            "true" => true,
            "false" | "" => false,
            other => {
                return Err(AdvertError {
                    key: RECOVERY_COMPLETE,
                    value: other.to_owned(),
                    expected: "true or false",
                });
            }
        };
        let recovery_blocked = match get(RECOVERY_BLOCKED) {
            "" => None,
            v => Some(RecoveryBlocked::parse(v).ok_or_else(|| AdvertError {
                key: RECOVERY_BLOCKED,
                value: v.to_owned(),
                expected: "a recovery-blocked reason",
            })?),
        };
        let mut providers = BTreeSet::new();
        for p in list(PROVIDERS) {
            providers.insert(match p {
                "native" => Provider::Native,
                "oci" => Provider::Oci,
                other => {
                    return Err(AdvertError {
                        key: PROVIDERS,
                        value: other.to_owned(),
                        expected: "native or oci",
                    });
                }
            });
        }
        let mut free_slots = BTreeMap::new();
        for pair in list(FREE_SLOTS) {
            let parsed = pair
                .split_once('=')
                .and_then(|(uid, n)| Some((uid.to_owned(), n.parse::<u32>().ok()?)));
            let (uid, n) = parsed.ok_or_else(|| AdvertError {
                key: FREE_SLOTS,
                value: pair.to_owned(),
                expected: "<policy uid>=<count>",
            })?;
            free_slots.insert(uid, n);
        }
        let foreign_requests = match get(FOREIGN_REQUESTS) {
            "" => None,
            v => Some(parse_foreign(v).ok_or_else(|| AdvertError {
                key: FOREIGN_REQUESTS,
                value: v.to_owned(),
                expected: "cpu=<millicores>,memory=<bytes>",
            })?),
        };
        let native_refused = match get(NATIVE_REFUSED) {
            "" => None,
            v => Some(NativeRefusal::parse(v).ok_or_else(|| AdvertError {
                key: NATIVE_REFUSED,
                value: v.to_owned(),
                expected: "a native-refused reason",
            })?),
        };
        Ok(Self {
            native_refused,
            capacity: number(CAPACITY)?,
            free: number(FREE)?,
            recovery_complete,
            recovery_blocked,
            providers,
            packages: list(PACKAGES).into_iter().map(str::to_owned).collect(),
            free_slots,
            foreign_requests,
        })
    }
}

fn parse_foreign(v: &str) -> Option<ForeignRequests> {
    let mut f = ForeignRequests::default();
    let (mut cpu, mut memory) = (false, false);
    for pair in v.split(',').map(str::trim) {
        match pair.split_once('=')? {
            ("cpu", n) if !cpu => (f.cpu_millis, cpu) = (n.parse().ok()?, true),
            ("memory", n) if !memory => (f.memory_bytes, memory) = (n.parse().ok()?, true),
            _ => return None,
        }
    }
    (cpu && memory).then_some(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_advert_survives_its_annotations() {
        let advert = AgentAdvert {
            capacity: 4,
            free: 3,
            recovery_complete: true,
            recovery_blocked: None,
            providers: [Provider::Native].into(),
            packages: ["ab".repeat(32), "cd".repeat(32)].into(),
            free_slots: [("uid-1".to_owned(), 2)].into(),
            foreign_requests: Some(ForeignRequests {
                cpu_millis: 1500,
                memory_bytes: 2 << 30,
            }),
            native_refused: None,
        };
        let back = AgentAdvert::from_annotations(&advert.to_annotations()).unwrap();
        assert_eq!(back, advert);
        let blocked = AgentAdvert {
            recovery_blocked: Some(RecoveryBlocked::IdentityUnreadable),
            native_refused: Some(NativeRefusal::NetworkFilterNotEnforced),
            ..AgentAdvert::default()
        };
        assert_eq!(
            AgentAdvert::from_annotations(&blocked.to_annotations()).unwrap(),
            blocked
        );
    }

    #[test]
    fn a_lease_without_annotations_offers_nothing() {
        let a = AgentAdvert::from_annotations(&BTreeMap::new()).unwrap();
        assert_eq!(a.capacity, 0);
        assert!(!a.recovery_complete);
        assert_eq!(a.foreign_requests, None, "an older agent: unknown");
    }

    #[test]
    fn garbage_names_the_key() {
        for (key, value) in [
            (CAPACITY, "four"),
            (RECOVERY_COMPLETE, "yes"),
            (PROVIDERS, "docker"),
            (FREE_SLOTS, "uid-1"),
            (RECOVERY_BLOCKED, "Because"),
            (FOREIGN_REQUESTS, "cpu=1"),
            (FOREIGN_REQUESTS, "cpu=1,memory=2Gi"),
            (FOREIGN_REQUESTS, "cpu=1,cpu=2"),
        ] {
            let err = AgentAdvert::from_annotations(&[(key.to_owned(), value.to_owned())].into())
                .unwrap_err();
            assert_eq!(err.key, key);
            assert!(err.to_string().contains(key));
        }
    }
}
