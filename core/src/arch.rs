//! The processor architectures runner-manager places runners on (issue 31 item 5): every one
//! GitHub publishes a Linux runner package for. A node's architecture is its
//! `kubernetes.io/arch` label (the kubelet sets it from the architecture it was built for); a
//! package's is the `architecture` of its entry in GitHub's downloads listing. The two
//! vocabularies differ (`amd64` is GitHub's `x64`), and this is their one translation. Pure.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The well-known label every kubelet sets on its Node.
pub const ARCH_LABEL: &str = "kubernetes.io/arch";

/// An architecture GitHub publishes a Linux runner package for. Closed: a node of any other
/// architecture (`s390x`, `ppc64le`) has no package and gets no runner.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
pub enum Arch {
    /// 64-bit x86 (`amd64` to Kubernetes).
    #[serde(rename = "x64")]
    X64,
    /// 64-bit ARM.
    #[serde(rename = "arm64")]
    Arm64,
    /// 32-bit ARM.
    #[serde(rename = "arm")]
    Arm,
}

impl Arch {
    pub const ALL: [Self; 3] = [Self::X64, Self::Arm64, Self::Arm];

    /// GitHub's name (the downloads listing's `architecture`, the package's file name).
    pub fn github(self) -> &'static str {
        match self {
            Self::X64 => "x64",
            Self::Arm64 => "arm64",
            Self::Arm => "arm",
        }
    }

    /// Kubernetes' name (the value of [`ARCH_LABEL`], Go's `GOARCH`).
    pub fn kubernetes(self) -> &'static str {
        match self {
            Self::X64 => "amd64",
            Self::Arm64 => "arm64",
            Self::Arm => "arm",
        }
    }

    /// From a downloads-listing `architecture`; `None` for one runner-manager does not place.
    pub fn from_github(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.github() == s)
    }

    /// A node's architecture from its labels. A Node without [`ARCH_LABEL`] (every kubelet
    /// sets it; only a hand-made Node object lacks it) is taken as `amd64`, the one
    /// architecture placed before runner-manager knew others. `None`: the node's architecture
    /// has no runner package.
    pub fn of_node(labels: &std::collections::BTreeMap<String, String>) -> Option<Self> {
        match labels.get(ARCH_LABEL).map(String::as_str) {
            None => Some(Self::X64),
            Some(v) => Self::ALL.into_iter().find(|a| a.kubernetes() == v),
        }
    }
}

impl Arch {
    /// The architecture this program was built for (`None`: one with no runner package).
    pub fn of_host() -> Option<Self> {
        match std::env::consts::ARCH {
            "x86_64" => Some(Self::X64),
            "aarch64" => Some(Self::Arm64),
            "arm" => Some(Self::Arm),
            _ => None,
        }
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.github())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn labels(arch: Option<&str>) -> BTreeMap<String, String> {
        arch.map(|a| (ARCH_LABEL.to_owned(), a.to_owned()))
            .into_iter()
            .collect()
    }

    #[test]
    fn a_nodes_label_maps_to_githubs_name() {
        assert_eq!(Arch::of_node(&labels(Some("amd64"))), Some(Arch::X64));
        assert_eq!(Arch::of_node(&labels(Some("arm64"))), Some(Arch::Arm64));
        assert_eq!(Arch::of_node(&labels(Some("arm"))), Some(Arch::Arm));
        // GitHub's word is not Kubernetes' word.
        assert_eq!(Arch::of_node(&labels(Some("x64"))), None);
        assert_eq!(Arch::of_node(&labels(Some("s390x"))), None);
        assert_eq!(Arch::of_node(&labels(None)), Some(Arch::X64));
    }

    #[test]
    fn the_listing_and_the_snapshot_use_githubs_words() {
        for a in Arch::ALL {
            assert_eq!(Arch::from_github(a.github()), Some(a));
            assert_eq!(
                serde_json::to_value(a).unwrap(),
                serde_json::json!(a.github())
            );
        }
        assert_eq!(Arch::from_github("amd64"), None);
    }
}
