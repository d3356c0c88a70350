//! Which namespace may name which GitHub target (issue 13, finding 4). Pure.
//!
//! Two safeguards, both decided here and enforced by the policy controller and the job matcher:
//! - **Owner bindings**: an admin setting (`--owner-namespaces owner=ns1,ns2;owner2=ns3`, chart
//!   value `ownerNamespaces`) binds GitHub owners to namespaces. A policy elsewhere that names a
//!   bound owner is not Ready and takes no job, even with valid credentials: credentials show
//!   that a tenant *can* reach a target, the binding says which tenant the cluster lets serve it.
//! - **Conflicts**: two namespaces naming one target (same host, same repository, organization
//!   or enterprise) is reported on both policies (`Conflict`) and as an Event, so a person sees
//!   a claim they did not expect. It does not stop either policy: jobs already go only to Ready
//!   policies, and a tie between two proven ones is ordinary label matching.

use std::collections::{BTreeMap, BTreeSet};

use crate::target::TargetKind;

/// The operator flag that binds owners; named in condition messages so a person knows what to
/// change.
pub const OWNER_NAMESPACES_FLAG: &str = "--owner-namespaces";
/// The chart value that sets the flag.
pub const OWNER_NAMESPACES_VALUE: &str = "ownerNamespaces";

/// GitHub owners (lowercase) → the namespaces allowed to name them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnerBindings {
    owners: BTreeMap<String, BTreeSet<String>>,
}

/// Why `--owner-namespaces` cannot be parsed. Refused at start: a typo must not silently unbind
/// an owner.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BindingsError {
    #[error("`{0}` is not OWNER=NAMESPACE[,NAMESPACE…]")]
    NotAPair(String),
    #[error("owner `{0}` is bound twice; list all its namespaces in one OWNER=NS1,NS2 entry")]
    Repeated(String),
    #[error("owner `{0}` is bound to no namespace")]
    NoNamespace(String),
}

/// The owner a target belongs to: the repository's owner, the organization, or the enterprise.
pub fn owner_of(target: &TargetKind) -> &str {
    match target {
        TargetKind::Repository { owner, .. } => owner,
        TargetKind::Organization { org } => org,
        TargetKind::Enterprise { enterprise } => enterprise,
    }
}

impl OwnerBindings {
    /// Parse `owner=ns1,ns2;owner2=ns3` (whitespace around names ignored; empty = no bindings).
    pub fn parse(s: &str) -> Result<Self, BindingsError> {
        let mut owners = BTreeMap::new();
        for entry in s.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let (owner, namespaces) = entry
                .split_once('=')
                .map(|(o, n)| (o.trim(), n))
                .filter(|(o, _)| !o.is_empty() && !o.contains(['=', ',']))
                .ok_or_else(|| BindingsError::NotAPair(entry.to_owned()))?;
            let set: BTreeSet<String> = namespaces
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
                .collect();
            if set.is_empty() {
                return Err(BindingsError::NoNamespace(owner.to_owned()));
            }
            if owners.insert(owner.to_ascii_lowercase(), set).is_some() {
                return Err(BindingsError::Repeated(owner.to_owned()));
            }
        }
        Ok(Self { owners })
    }

    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }

    /// The namespaces `target`'s owner is bound to, when `namespace` is not one of them; `None`
    /// when the policy may name it (the owner is unbound, or bound to this namespace).
    pub fn refuses(&self, target: &TargetKind, namespace: &str) -> Option<&BTreeSet<String>> {
        let bound = self.owners.get(&owner_of(target).to_ascii_lowercase())?;
        (!bound.contains(namespace)).then_some(bound)
    }

    /// The `Ready=False` message for a refused policy: what is bound where, by which setting,
    /// and the two ways out.
    pub fn refusal_message(
        target: &TargetKind,
        namespace: &str,
        bound: &BTreeSet<String>,
    ) -> String {
        let list = bound
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "spec.github.url: GitHub owner {owner} is bound to namespace(s) {list} by the operator's \
             {OWNER_NAMESPACES_FLAG} setting (chart value {OWNER_NAMESPACES_VALUE}); create this \
             policy in one of those namespaces, or ask the cluster admin to add {namespace} to \
             the binding of {owner}",
            owner = owner_of(target),
        )
    }
}

/// One policy's claim on a target.
#[derive(Clone, Copy, Debug)]
pub struct Claim<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub host: &'a str,
    pub target: &'a TargetKind,
}

/// A target in one comparable form: host and names lowercase, as GitHub compares them.
fn target_key(host: &str, target: &TargetKind) -> String {
    let host = host.to_ascii_lowercase();
    match target {
        TargetKind::Repository { owner, repo } => format!(
            "{host}/repo/{}/{}",
            owner.to_ascii_lowercase(),
            repo.to_ascii_lowercase()
        ),
        TargetKind::Organization { org } => format!("{host}/org/{}", org.to_ascii_lowercase()),
        TargetKind::Enterprise { enterprise } => {
            format!("{host}/enterprise/{}", enterprise.to_ascii_lowercase())
        }
    }
}

/// For every claim (by index), the `namespace/name` of the claims of *other* namespaces on the
/// same target, sorted; empty when there is none. Policies of one namespace naming one target
/// (a `linux` and a `gpu` policy) are ordinary and not a conflict.
pub fn conflicts(claims: &[Claim<'_>]) -> Vec<Vec<String>> {
    let mut by_target: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, c) in claims.iter().enumerate() {
        by_target
            .entry(target_key(c.host, c.target))
            .or_default()
            .push(i);
    }
    let mut out = vec![Vec::new(); claims.len()];
    for group in by_target.values() {
        for &i in group {
            let mut others: Vec<String> = group
                .iter()
                .map(|&j| &claims[j])
                .filter(|o| o.namespace != claims[i].namespace)
                .map(|o| format!("{}/{}", o.namespace, o.name))
                .collect();
            others.sort();
            out[i] = others;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo(owner: &str, name: &str) -> TargetKind {
        TargetKind::Repository {
            owner: owner.into(),
            repo: name.into(),
        }
    }

    #[test]
    fn bindings_parse_and_refuse_other_namespaces() {
        let b = OwnerBindings::parse(" Acme = team-a, team-b ; other=ops;").unwrap();
        assert!(!b.is_empty());
        let web = repo("acme", "web");
        assert_eq!(b.refuses(&web, "team-a"), None);
        assert_eq!(b.refuses(&web, "team-b"), None);
        let bound = b.refuses(&web, "aaa").unwrap();
        assert_eq!(bound.iter().collect::<Vec<_>>(), ["team-a", "team-b"]);
        let org = TargetKind::Organization { org: "ACME".into() };
        assert!(
            b.refuses(&org, "aaa").is_some(),
            "owners compare case-insensitively"
        );
        assert_eq!(b.refuses(&repo("free", "x"), "aaa"), None, "unbound owner");
        let msg = OwnerBindings::refusal_message(&web, "aaa", bound);
        for part in [
            "acme",
            "team-a, team-b",
            OWNER_NAMESPACES_FLAG,
            OWNER_NAMESPACES_VALUE,
            "aaa",
        ] {
            assert!(msg.contains(part), "{part}: {msg}");
        }
        assert!(OwnerBindings::parse("").unwrap().is_empty());
    }

    #[test]
    fn malformed_bindings_are_refused() {
        for (s, want) in [
            ("acme", BindingsError::NotAPair("acme".into())),
            ("=ns", BindingsError::NotAPair("=ns".into())),
            ("acme=", BindingsError::NoNamespace("acme".into())),
            ("acme=a;ACME=b", BindingsError::Repeated("ACME".into())),
        ] {
            assert_eq!(OwnerBindings::parse(s), Err(want), "{s}");
        }
    }

    #[test]
    fn two_namespaces_on_one_target_conflict_and_one_namespace_does_not() {
        let web = repo("acme", "web");
        let web_upper = repo("ACME", "Web");
        let api = repo("acme", "api");
        let claims = [
            Claim {
                namespace: "team",
                name: "linux",
                host: "github.com",
                target: &web,
            },
            Claim {
                namespace: "team",
                name: "gpu",
                host: "github.com",
                target: &web,
            },
            Claim {
                namespace: "aaa",
                name: "steal",
                host: "GitHub.com",
                target: &web_upper,
            },
            Claim {
                namespace: "aaa",
                name: "api",
                host: "github.com",
                target: &api,
            },
            Claim {
                namespace: "ghes",
                name: "web",
                host: "ghe.example.com",
                target: &web,
            },
        ];
        let c = conflicts(&claims);
        assert_eq!(c[0], ["aaa/steal"]);
        assert_eq!(c[1], ["aaa/steal"]);
        assert_eq!(c[2], ["team/gpu", "team/linux"]);
        assert!(c[3].is_empty());
        assert!(c[4].is_empty(), "another host is another target");
    }
}
