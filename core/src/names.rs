//! Naming rules shared by the operator and the agent: attempt objects, GitHub runners,
//! workspace directories and the cluster's ownership label.

use sha2::{Digest, Sha256};
use uuid::Uuid;

/// Every runner we register on GitHub is named with this prefix and the attempt's uuid, so a
/// registration can always be traced back to exactly one attempt (DESIGN §4 rule 10).
pub const RUNNER_NAME_PREFIX: &str = "runner-manager-";

/// The first 12 hex digits of an attempt uuid: short enough for object and unit names, long
/// enough (48 bits) that two attempts of one policy never collide in practice.
pub fn short_hex(attempt: Uuid) -> String {
    attempt.simple().to_string()[..12].to_owned()
}

/// `<policy>-<12 hex>`: the RunnerAttempt object name.
pub fn attempt_name(policy: &str, attempt: Uuid) -> String {
    format!("{policy}-{}", short_hex(attempt))
}

/// `runner-manager-<uuid>`: the GitHub runner name of an attempt.
pub fn runner_name(attempt: Uuid) -> String {
    format!("{RUNNER_NAME_PREFIX}{}", attempt.hyphenated())
}

/// The attempt uuid a runner name carries, if it is one of ours in form (ownership is proven by
/// the cluster label as well, never by the name alone).
pub fn attempt_of_runner_name(name: &str) -> Option<Uuid> {
    name.strip_prefix(RUNNER_NAME_PREFIX)
        .and_then(|rest| Uuid::try_parse(rest).ok())
}

/// `rm-<12 hex of sha256(kube-system namespace UID + operator namespace)>`: the label every
/// runner of this cluster carries, so a GitHub target shared with another cluster is safe.
pub fn ownership_label(kube_system_uid: &str, operator_namespace: &str) -> String {
    let mut h = Sha256::new();
    h.update(kube_system_uid.as_bytes());
    h.update(operator_namespace.as_bytes());
    let digest = hex::encode(h.finalize());
    format!("rm-{}", &digest[..12])
}

/// `runner-manager-agent-<node>`: the agent Lease of a node.
pub fn agent_lease_name(node: &str) -> String {
    format!("runner-manager-agent-{node}")
}

/// `runners/<12 hex>`: an ephemeral attempt runtime, relative to the agent's host root.
pub fn ephemeral_runtime_dir(attempt: Uuid) -> String {
    format!("runners/{}", short_hex(attempt))
}

/// `<namespace>/<policy uid>/s<slot>`: a persistent slot, relative to the agent's slots root.
/// Derived by the agent, never named by a tenant.
pub fn slot_dir(namespace: &str, policy_uid: &str, slot: u32) -> String {
    format!("{namespace}/{policy_uid}/s{slot}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_documented_forms() {
        let id = Uuid::from_u128(0x3f2a_9c01_77aa_4bcd_8e00_1234_5678_9abc);
        assert_eq!(short_hex(id), "3f2a9c0177aa");
        assert_eq!(attempt_name("web", id), "web-3f2a9c0177aa");
        assert_eq!(
            runner_name(id),
            "runner-manager-3f2a9c01-77aa-4bcd-8e00-123456789abc"
        );
        assert_eq!(attempt_of_runner_name(&runner_name(id)), Some(id));
        assert_eq!(attempt_of_runner_name("runner-manager-nope"), None);
        assert_eq!(
            attempt_of_runner_name("other-3f2a9c01-77aa-4bcd-8e00-123456789abc"),
            None
        );
        assert_eq!(ephemeral_runtime_dir(id), "runners/3f2a9c0177aa");
        assert_eq!(slot_dir("team", "uid-1", 3), "team/uid-1/s3");
    }

    #[test]
    fn ownership_label_depends_on_both_inputs() {
        let a = ownership_label("uid-a", "runner-manager-system");
        assert!(a.starts_with("rm-") && a.len() == 15, "{a}");
        assert_ne!(a, ownership_label("uid-b", "runner-manager-system"));
        assert_ne!(a, ownership_label("uid-a", "other"));
        assert_eq!(a, ownership_label("uid-a", "runner-manager-system"));
    }
}
