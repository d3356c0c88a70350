//! Objects the scenario tests make again and again, in one place.

use std::collections::BTreeMap;

use kube::Resource;
use runner_manager_crds::attempt::{
    AttemptSnapshot, AttemptTimeouts, ExecutionSnapshot, RunnerAttempt, RunnerAttemptSpec,
    RunnerPackage, TargetScope, TargetSnapshot,
};
use runner_manager_crds::duration::ManifestDuration;
use runner_manager_crds::names::attempt_name;
use runner_manager_crds::policy::{ExecutionMode, WorkspaceMode};
use runner_manager_crds::{NODE_LABEL, POLICY_LABEL};

/// A native, ephemeral attempt of policy `policy` (uid `policy_uid`) for the repository
/// `https://github.com/acme/web`, bound to `node`, named `<policy>-<12 hex of id>` and labelled
/// as the operator labels attempts.
pub fn native_attempt(id: uuid::Uuid, policy: &str, policy_uid: &str, node: &str) -> RunnerAttempt {
    let spec = RunnerAttemptSpec {
        id: id.hyphenated().to_string(),
        policy: policy.into(),
        node_name: node.into(),
        snapshot: AttemptSnapshot {
            policy_uid: policy_uid.into(),
            target: TargetSnapshot {
                url: "https://github.com/acme/web".into(),
                scope: TargetScope::Repository,
            },
            labels: vec!["self-hosted".into(), "linux".into()],
            runner_group_id: 1,
            workspace: WorkspaceMode::Ephemeral,
            fork_pull_requests: runner_manager_crds::policy::ForkPullRequests::Allow,
            caches: None,
            docker: false,
            max_slots: 4,
            execution: ExecutionSnapshot {
                mode: ExecutionMode::Native,
                image: None,
                resources: None,
            },
            runner: RunnerPackage {
                version: "2.330.0".into(),
                url: "https://example.invalid/actions-runner-linux-x64-2.330.0.tar.gz".into(),
                sha256: "a".repeat(64),
                architecture: None,
            },
            env: BTreeMap::new(),
            timeouts: AttemptTimeouts {
                registration: ManifestDuration::from_secs(300),
                idle: ManifestDuration::from_secs(600),
                jit_handoff: ManifestDuration::from_secs(120),
            },
            scale_set: None,
        },
        replaces: None,
        termination: None,
    };
    let mut attempt = RunnerAttempt::new(&attempt_name(policy, id), spec);
    attempt.meta_mut().labels = Some(
        [
            (POLICY_LABEL.to_owned(), policy.to_owned()),
            (NODE_LABEL.to_owned(), node.to_owned()),
        ]
        .into(),
    );
    attempt
}
