//! The Lease validator (DESIGN §6, issue 13 finding 3). Pure. In the operator's namespace an
//! agent may create and write only the Lease named for its own pod's node
//! (`runner-manager-agent-<node>`): not another node's (forged capacity, `recoveryComplete`),
//! not the operator's leader Lease. RBAC cannot say this (`create` takes no `resourceNames`, and
//! node names are not known when the chart is rendered). Leases elsewhere are RBAC's alone.

use runner_manager_crds::names::agent_lease_name;
use serde_json::Value;

use super::review::{Operation, Verdict, Who};

/// Decide a write of Lease `name` in `namespace`; `system` is the operator's namespace. Pure.
pub fn decide(
    who: &Who,
    operation: Operation,
    system: &str,
    namespace: Option<&str>,
    name: Option<&str>,
    new: Option<&Value>,
) -> Verdict {
    let Who::Agent { node } = who else {
        return Verdict::Allow;
    };
    if namespace != Some(system) || matches!(operation, Operation::Connect) {
        return Verdict::Allow;
    }
    // On CREATE the request's name may be empty (generateName); the object's is the truth.
    let name = name
        .filter(|n| !n.is_empty())
        .or_else(|| new?.pointer("/metadata/name")?.as_str());
    let Some(node) = node else {
        return Verdict::deny(
            "the caller's agent pod could not be proven (a pod-bound token of a live agent pod is required)",
        );
    };
    let own = agent_lease_name(node);
    if name == Some(own.as_str()) {
        Verdict::Allow
    } else {
        Verdict::deny(format!(
            "Lease {}: an agent writes only its own node's Lease ({own})",
            name.unwrap_or("<unnamed>")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn agent(node: &str) -> Who {
        Who::Agent {
            node: Some(node.to_owned()),
        }
    }

    #[test]
    fn an_agent_writes_only_its_own_nodes_lease() {
        for op in [Operation::Create, Operation::Update, Operation::Delete] {
            assert!(
                decide(
                    &agent("a"),
                    op,
                    "rm",
                    Some("rm"),
                    Some("runner-manager-agent-a"),
                    None
                )
                .is_allowed()
            );
            assert_eq!(
                decide(
                    &agent("a"),
                    op,
                    "rm",
                    Some("rm"),
                    Some("runner-manager-agent-b"),
                    None
                ),
                Verdict::deny(
                    "Lease runner-manager-agent-b: an agent writes only its own node's Lease (runner-manager-agent-a)"
                )
            );
            // The operator's leader Lease.
            assert!(
                !decide(
                    &agent("a"),
                    op,
                    "rm",
                    Some("rm"),
                    Some("runner-manager-operator"),
                    None
                )
                .is_allowed()
            );
        }
        // A generated name is judged by the object's name.
        let obj = json!({"metadata": {"name": "runner-manager-agent-b"}});
        assert!(
            !decide(
                &agent("a"),
                Operation::Create,
                "rm",
                Some("rm"),
                Some(""),
                Some(&obj)
            )
            .is_allowed()
        );
        assert!(!decide(&agent("a"), Operation::Create, "rm", Some("rm"), None, None).is_allowed());
        // A node named like a prefix of another is not that node.
        assert!(
            !decide(
                &agent("a"),
                Operation::Update,
                "rm",
                Some("rm"),
                Some("runner-manager-agent-ab"),
                None
            )
            .is_allowed()
        );
    }

    #[test]
    fn an_unproven_agent_writes_no_lease_and_others_are_left_to_rbac() {
        assert!(
            !decide(
                &Who::Agent { node: None },
                Operation::Update,
                "rm",
                Some("rm"),
                Some("runner-manager-agent-a"),
                None
            )
            .is_allowed()
        );
        for who in [Who::Operator, Who::Admin, Who::Other] {
            assert!(
                decide(
                    &who,
                    Operation::Update,
                    "rm",
                    Some("rm"),
                    Some("runner-manager-operator"),
                    None
                )
                .is_allowed()
            );
        }
        // Outside the operator's namespace the webhook has no opinion (RBAC gives agents nothing).
        assert!(
            decide(
                &agent("a"),
                Operation::Update,
                "rm",
                Some("kube-node-lease"),
                Some("x"),
                None
            )
            .is_allowed()
        );
    }
}
