//! A new attempt, built without I/O from the policy, what was resolved for it and the chosen
//! node: name, labels, finalizer, its policy as controller owner and the immutable snapshot of
//! DESIGN §3.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;
use runner_manager_crds::attempt::{
    AttemptSnapshot, AttemptTimeouts, ExecutionSnapshot, RunnerAttempt, RunnerAttemptSpec,
    RunnerPackage, TargetSnapshot,
};
use runner_manager_crds::duration::ManifestDuration;
use runner_manager_crds::names::attempt_name;
use runner_manager_crds::policy::{ExecutionMode, ScalePolicy};
use runner_manager_crds::validate::ValidatedPolicy;

use crate::controller::resolve::RunnerPackages;
use runner_manager_crds::{CLEANUP_FINALIZER, NODE_LABEL, POLICY_LABEL};

/// The policy generation an attempt was made for: consecutive failures are counted within one
/// generation, so a changed spec starts afresh (DESIGN §11).
pub use runner_manager_crds::POLICY_GENERATION_ANNOTATION;

/// How long an agent may hold a `Prepared` attempt without a JIT (DESIGN §4 rule 9).
pub const JIT_HANDOFF: ManifestDuration = ManifestDuration::from_secs(120);

/// What was resolved for the policy's current generation.
#[derive(Clone, Debug, PartialEq)]
pub struct Pinned<'a> {
    /// The policy as validated at resolution: identity, parsed target, spec.
    pub policy: &'a ValidatedPolicy,
    pub runner_group_id: i64,
    /// One package per architecture; the attempt pins its node's.
    pub packages: &'a RunnerPackages,
    pub env: &'a BTreeMap<String, String>,
}

/// The attempt to create on `node`, running `package` (the one of the node's architecture).
/// Infallible: everything it reads was validated at resolution.
pub fn build(
    pinned: &Pinned<'_>,
    package: &RunnerPackage,
    id: uuid::Uuid,
    node: &str,
    replaces: Option<String>,
) -> RunnerAttempt {
    let policy = pinned.policy;
    let name = policy.name.as_str();
    let target = &policy.target;
    let spec = &policy.spec;
    let attempt_spec = RunnerAttemptSpec {
        id: id.hyphenated().to_string(),
        policy: name.to_owned(),
        node_name: node.to_owned(),
        snapshot: AttemptSnapshot {
            policy_uid: policy.uid.clone(),
            target: TargetSnapshot {
                url: spec.github.url.clone(),
                scope: target.scope(),
            },
            labels: spec.labels.clone(),
            runner_group_id: pinned.runner_group_id,
            workspace: spec.workspace.mode,
            fork_pull_requests: spec.workspace.fork_rule(),
            // Validation resolved the namespace already (`validate_policy`): it cannot fail here.
            caches: spec.caches.as_ref().and_then(|c| {
                let namespace =
                    runner_manager_crds::validate::cache_namespace(c, &policy.namespace, target)
                        .ok()?;
                Some(runner_manager_crds::caches::CacheSnapshot {
                    namespace,
                    tools: if c.tools.is_empty() {
                        runner_manager_crds::caches::CacheTool::defaults()
                    } else {
                        c.tools.clone()
                    },
                    write_back: c.write_back.clone(),
                })
            }),
            docker: spec.docker.enabled && spec.execution.mode == ExecutionMode::Native,
            max_slots: spec.max_runners,
            execution: ExecutionSnapshot {
                mode: spec.execution.mode,
                image: spec.execution.image.clone(),
                resources: spec.execution.resources.clone(),
            },
            runner: package.clone(),
            env: pinned.env.clone(),
            timeouts: AttemptTimeouts {
                registration: spec.timeouts.registration,
                idle: spec.timeouts.idle,
                jit_handoff: JIT_HANDOFF,
            },
            scale_set: (spec.github.demand == runner_manager_crds::policy::DemandMode::ScaleSet)
                .then(|| runner_manager_crds::policy::scale_set_name(&policy.namespace, name)),
        },
        replaces,
        termination: None,
    };
    let mut attempt = RunnerAttempt::new(&attempt_name(name, id), attempt_spec);
    let meta = attempt.meta_mut();
    meta.namespace = Some(policy.namespace.clone());
    meta.labels = Some(
        [
            (POLICY_LABEL.to_owned(), name.to_owned()),
            (NODE_LABEL.to_owned(), node.to_owned()),
        ]
        .into(),
    );
    meta.annotations = Some(
        [(
            POLICY_GENERATION_ANNOTATION.to_owned(),
            policy.generation.to_string(),
        )]
        .into(),
    );
    meta.finalizers = Some(vec![CLEANUP_FINALIZER.to_owned()]);
    // The policy controls its attempts (issue 33 item 5): Argo CD's resource tree and health
    // show them under it, and `kubectl get ra -o yaml` names it by uid. Deleting the attempt
    // never waits on it, nor deleting the policy on them (`blockOwnerDeletion: false`): the
    // policy's finalizer drains them first, and the garbage collector removes what is left
    // once the policy is gone.
    meta.owner_references = Some(vec![OwnerReference {
        api_version: ScalePolicy::api_version(&()).into_owned(),
        kind: ScalePolicy::kind(&()).into_owned(),
        name: name.to_owned(),
        uid: policy.uid.clone(),
        controller: Some(true),
        block_owner_deletion: Some(false),
    }]);
    attempt
}

#[cfg(test)]
mod tests {
    use super::*;
    use runner_manager_crds::attempt::TargetScope;

    fn policy() -> ScalePolicy {
        let mut p: ScalePolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "runner-manager.dev/v1alpha1", "kind": "ScalePolicy",
            "metadata": {"name": "web", "namespace": "team", "uid": "u-1", "generation": 3},
            "spec": {"github": {"url": "https://github.com/acme/web", "credentialsSecretRef": {"name": "gh"}},
                     "labels": ["self-hosted", "linux"], "maxRunners": 4,
                     "timeouts": {"registration": "2m", "idle": "5m"}}
        }))
        .unwrap();
        p.metadata.generation = Some(3);
        p
    }

    #[test]
    fn builds_name_labels_finalizer_and_snapshot() {
        let pkg = RunnerPackage {
            version: "2.330.0".into(),
            url: "https://x/actions-runner-linux-x64-2.330.0.tar.gz".into(),
            sha256: "b".repeat(64),
            architecture: None,
        };
        let env = BTreeMap::from([("A".to_owned(), "1".to_owned())]);
        let id = uuid::Uuid::parse_str("0123456789ab4def8123456789abcdef").unwrap();
        let packages = RunnerPackages::single(pkg.clone());
        let valid = runner_manager_crds::validate::validated(&policy()).unwrap();
        let pinned = Pinned {
            policy: &valid,
            runner_group_id: 7,
            packages: &packages,
            env: &env,
        };
        let a = build(&pinned, &pkg, id, "node-a", Some("web-old".into()));
        assert_eq!(a.metadata.name.as_deref(), Some("web-0123456789ab"));
        assert_eq!(a.metadata.namespace.as_deref(), Some("team"));
        let labels = a.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[POLICY_LABEL], "web");
        assert_eq!(labels[NODE_LABEL], "node-a");
        assert_eq!(
            a.metadata.finalizers.as_deref(),
            Some(&[CLEANUP_FINALIZER.to_owned()][..])
        );
        assert_eq!(
            a.metadata.annotations.as_ref().unwrap()[POLICY_GENERATION_ANNOTATION],
            "3"
        );
        let owners = a.metadata.owner_references.as_ref().unwrap();
        assert_eq!(owners.len(), 1);
        assert_eq!(owners[0].kind, "ScalePolicy");
        assert_eq!(owners[0].api_version, "runner-manager.dev/v1alpha1");
        assert_eq!(
            (owners[0].name.as_str(), owners[0].uid.as_str()),
            ("web", "u-1")
        );
        assert_eq!(owners[0].controller, Some(true));
        assert_eq!(owners[0].block_owner_deletion, Some(false));
        let s = &a.spec.snapshot;
        assert_eq!(s.policy_uid, "u-1");
        assert_eq!(s.target.scope, TargetScope::Repository);
        assert_eq!(s.runner, pkg);
        assert_eq!(s.env, env);
        assert_eq!(s.runner_group_id, 7);
        assert_eq!(s.timeouts.registration.as_duration().as_secs(), 120);
        assert_eq!(a.spec.replaces.as_deref(), Some("web-old"));
        assert_eq!(a.spec.node_name, "node-a");
        assert!(a.spec.termination.is_none());
    }
}
