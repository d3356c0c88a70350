//! The RunnerAttempt validator (DESIGN §6, issue 13 finding 3). Pure: the decision is a function
//! of who asks (the agent already placed on its node), the operation and the objects.
//!
//! - Only the operator (and `system:masters`) creates RunnerAttempts or changes their spec.
//! - An agent writes only the **status** of attempts whose `spec.nodeName` is its own pod's node,
//!   and never the fields other writers own: `status.runner` (journalled by the broker before the
//!   JIT leaves) and the operator's facts `status.github` / `status.job`.
//! - Anyone else is left to RBAC (the chart grants tenants nothing on attempts).

use serde_json::Value;

use super::review::{Operation, Verdict, Who};

/// Status fields an agent must leave as they are.
pub const NOT_THE_AGENTS: [&str; 3] = ["runner", "github", "job"];

fn node_of(obj: Option<&Value>) -> Option<&str> {
    obj?.pointer("/spec/nodeName")?.as_str()
}

fn name_of(old: Option<&Value>, new: Option<&Value>) -> String {
    old.or(new)
        .and_then(|o| o.pointer("/metadata/name"))
        .and_then(Value::as_str)
        .unwrap_or("?")
        .to_owned()
}

/// Decide a write of a RunnerAttempt (`subresource` `Some("status")` for the status). Pure.
pub fn decide(
    who: &Who,
    operation: Operation,
    subresource: Option<&str>,
    old: Option<&Value>,
    new: Option<&Value>,
) -> Verdict {
    if matches!(who, Who::Operator | Who::Admin)
        || matches!(operation, Operation::Delete | Operation::Connect)
    {
        return Verdict::Allow;
    }
    let name = name_of(old, new);
    match (operation, subresource) {
        (Operation::Create, None) => Verdict::deny("only the operator creates RunnerAttempts"),
        (Operation::Update, None) => match who {
            Who::Agent { .. } => Verdict::deny(format!(
                "RunnerAttempt {name}: an agent writes only the status of its own node's attempts"
            )),
            _ if old.and_then(|o| o.get("spec")) != new.and_then(|n| n.get("spec")) => {
                Verdict::deny(format!(
                    "RunnerAttempt {name}: only the operator changes an attempt's spec"
                ))
            }
            _ => Verdict::Allow,
        },
        (_, Some("status")) => match who {
            Who::Agent { node: None } => Verdict::deny(format!(
                "RunnerAttempt {name}: the caller's agent pod could not be proven (a pod-bound token of a live agent pod is required)"
            )),
            Who::Agent { node: Some(node) } => {
                let bound = node_of(old).or_else(|| node_of(new));
                if bound != Some(node.as_str()) {
                    return Verdict::deny(format!(
                        "RunnerAttempt {name} is bound to node {}; the caller's agent runs on {node}",
                        bound.unwrap_or("<none>")
                    ));
                }
                let before = old.and_then(|o| o.get("status"));
                let after = new.and_then(|n| n.get("status"));
                for field in NOT_THE_AGENTS {
                    if before.and_then(|s| s.get(field)) != after.and_then(|s| s.get(field)) {
                        return Verdict::deny(format!(
                            "RunnerAttempt {name}: status.{field} is not the agent's to write"
                        ));
                    }
                }
                Verdict::Allow
            }
            _ => Verdict::Allow,
        },
        (_, Some(other)) => match who {
            Who::Agent { .. } => Verdict::deny(format!(
                "RunnerAttempt {name}: an agent may not write {other}"
            )),
            _ => Verdict::Allow,
        },
        _ => Verdict::Allow,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn attempt(node: &str, status: Value) -> Value {
        json!({
            "metadata": {"name": "web-1", "namespace": "team"},
            "spec": {"id": "x", "policy": "web", "nodeName": node, "snapshot": {"a": 1}},
            "status": status,
        })
    }

    /// `who` updating `old` into `new`, through `subresource` or (`None`) the object itself.
    fn update(who: &Who, subresource: Option<&str>, old: &Value, new: &Value) -> Verdict {
        decide(who, Operation::Update, subresource, Some(old), Some(new))
    }

    fn agent(node: &str) -> Who {
        Who::Agent {
            node: Some(node.to_owned()),
        }
    }

    #[test]
    fn an_agent_writes_the_status_of_its_own_nodes_attempts_only() {
        let old = attempt("a", json!({"state": "Allocated"}));
        let new = attempt("a", json!({"state": "Preparing"}));
        let own = update(&agent("a"), Some("status"), &old, &new);
        assert_eq!(own, Verdict::Allow);
        let foreign = update(&agent("b"), Some("status"), &old, &new);
        assert_eq!(
            foreign,
            Verdict::deny("RunnerAttempt web-1 is bound to node a; the caller's agent runs on b")
        );
        // An unproven pod (gone, not the DaemonSet's, no node) writes nothing.
        let unproven = update(&Who::Agent { node: None }, Some("status"), &old, &new);
        assert!(!unproven.is_allowed());
    }

    #[test]
    fn an_agent_never_writes_the_runner_or_the_operators_facts() {
        let old = attempt(
            "a",
            json!({"state": "Idle", "runner": {"id": 7, "name": "runner-manager-x"}}),
        );
        for (field, value) in [
            ("runner", json!({"id": 99, "name": "runner-manager-victim"})),
            (
                "github",
                json!({"status": "Absent", "busy": false, "generation": 9}),
            ),
            ("job", json!({"id": 5})),
        ] {
            let mut new = old.clone();
            new["status"][field] = value;
            let v = update(&agent("a"), Some("status"), &old, &new);
            assert_eq!(
                v,
                Verdict::deny(format!(
                    "RunnerAttempt web-1: status.{field} is not the agent's to write"
                )),
                "{field}"
            );
        }
        // Removing the runner is a change too.
        let mut new = old.clone();
        new["status"].as_object_mut().unwrap().remove("runner");
        assert!(!update(&agent("a"), Some("status"), &old, &new).is_allowed());
    }

    #[test]
    fn only_the_operator_creates_attempts_or_changes_their_spec() {
        let a = attempt("a", json!({}));
        for who in [agent("a"), Who::Agent { node: None }, Who::Other] {
            assert_eq!(
                decide(&who, Operation::Create, None, None, Some(&a)),
                Verdict::deny("only the operator creates RunnerAttempts"),
                "{who:?}"
            );
        }
        let mut changed = a.clone();
        changed["spec"]["nodeName"] = json!("b");
        assert!(!update(&agent("a"), None, &a, &changed).is_allowed());
        assert!(!update(&Who::Other, None, &a, &changed).is_allowed());
        // The agent may not touch the object itself at all (finalizers, labels).
        let mut relabelled = a.clone();
        relabelled["metadata"]["labels"] = json!({"x": "y"});
        assert!(!update(&agent("a"), None, &a, &relabelled).is_allowed());
        // Others changing metadata only (the garbage collector, finalizer removal) pass.
        assert!(update(&Who::Other, None, &a, &relabelled).is_allowed());
        for who in [Who::Operator, Who::Admin] {
            assert!(decide(&who, Operation::Create, None, None, Some(&a)).is_allowed());
            assert!(update(&who, None, &a, &changed).is_allowed());
        }
    }

    #[test]
    fn deletion_and_other_writers_status_are_left_to_rbac() {
        let a = attempt("a", json!({}));
        assert!(decide(&agent("b"), Operation::Delete, None, Some(&a), None).is_allowed());
        let mut new = a.clone();
        new["status"]["runner"] = json!({"id": 1});
        assert!(update(&Who::Other, Some("status"), &a, &new).is_allowed());
        assert!(!update(&agent("a"), Some("scale"), &a, &a).is_allowed());
    }
}
