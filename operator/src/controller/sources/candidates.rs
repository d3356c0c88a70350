//! Which policy a job belongs to ([`Candidates`], built once per pass), which policies may take
//! jobs at all ([`proven`]), and which name a target another namespace's policy names
//! ([`target_conflicts`]). Pure: read by the webhook sink and every pull source.

use runner_manager_crds::conditions::{ConditionStatus, find};
use runner_manager_crds::policy::{PolicyConditionType, ScalePolicy};
use runner_manager_crds::target::GitHubTarget;

use crate::policy::matching::{JobLabels, PolicyLabels, match_job};
use crate::policy::tenancy::{Claim, OwnerBindings, conflicts};

/// Whether the leader has proven this generation of the policy: `Ready=True` observed for the
/// current `metadata.generation`. Resolution reads the credentials Secret and asks GitHub with
/// them for the policy's own target, so Ready is the proof; a spec change (another URL) drops it
/// until the new target is proven. Tenants cannot write status (the CRD's status subresource).
pub fn proven(policy: &ScalePolicy) -> bool {
    let Some(status) = policy.status.as_ref() else {
        return false;
    };
    find(&status.conditions, PolicyConditionType::Ready).is_some_and(|c| {
        c.status == ConditionStatus::True
            && c.observed_generation.is_some()
            && c.observed_generation == policy.metadata.generation
    })
}

/// For every policy (`namespace/name`), the policies of other namespaces naming the same target.
pub fn target_conflicts(
    policies: &[std::sync::Arc<ScalePolicy>],
) -> std::collections::HashMap<String, Vec<String>> {
    let parsed: Vec<(&ScalePolicy, GitHubTarget)> = policies
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| Some((p.as_ref(), GitHubTarget::parse(&p.spec.github.url).ok()?)))
        .collect();
    let claims: Vec<Claim<'_>> = parsed
        .iter()
        .map(|(p, t)| Claim {
            namespace: p.metadata.namespace.as_deref().unwrap_or_default(),
            name: p.metadata.name.as_deref().unwrap_or_default(),
            host: &t.host,
            target: &t.kind,
        })
        .collect();
    let found = conflicts(&claims);
    claims
        .iter()
        .zip(found)
        .filter(|(_, others)| !others.is_empty())
        .map(|(c, others)| (format!("{}/{}", c.namespace, c.name), others))
        .collect()
}

/// The policies a job could belong to, parsed once per use.
#[derive(Debug)]
pub struct Candidates {
    policies: Vec<std::sync::Arc<ScalePolicy>>,
    targets: Vec<Option<GitHubTarget>>,
    eligible: Vec<bool>,
}

impl Candidates {
    pub fn of(
        policies: Vec<std::sync::Arc<ScalePolicy>>,
        webhook_only: bool,
        bindings: &OwnerBindings,
    ) -> Self {
        let policies: Vec<_> = policies
            .into_iter()
            .filter(|p| !webhook_only || p.spec.scaling.webhook)
            // A scale-set policy's jobs come from its message queue only.
            .filter(|p| p.spec.github.demand.is_webhook())
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        let targets: Vec<Option<GitHubTarget>> = policies
            .iter()
            .map(|p| GitHubTarget::parse(&p.spec.github.url).ok())
            .collect();
        // The binding is checked here too, not only at resolution: a status written before the
        // admin bound the owner still says Ready until the leader's next pass.
        let eligible = policies
            .iter()
            .zip(&targets)
            .map(|(p, t)| {
                let ns = p.metadata.namespace.as_deref().unwrap_or_default();
                proven(p)
                    && t.as_ref()
                        .is_some_and(|t| bindings.refuses(&t.kind, ns).is_none())
            })
            .collect();
        Self {
            policies,
            targets,
            eligible,
        }
    }

    /// Whether jobs can be matched to `policy` now: it is proven, its owner binding allows it,
    /// and this matcher was built after both (a matcher is rebuilt at most once a second).
    pub fn eligible(&self, policy: &ScalePolicy) -> bool {
        policy.metadata.uid.is_some()
            && self
                .policies
                .iter()
                .zip(&self.eligible)
                .any(|(p, e)| *e && p.metadata.uid == policy.metadata.uid)
    }

    /// The policy a job belongs to: the one whose labels cover its `runs-on` with the fewest
    /// extra labels, ties by namespace and name (DESIGN §7).
    pub fn matching(&self, job: &JobLabels<'_>) -> Option<&ScalePolicy> {
        let labels: Vec<PolicyLabels<'_>> = self
            .policies
            .iter()
            .zip(&self.targets)
            .zip(&self.eligible)
            .filter_map(|((p, t), eligible)| {
                let t = t.as_ref()?;
                Some(PolicyLabels {
                    namespace: p.metadata.namespace.as_deref()?,
                    name: p.metadata.name.as_deref()?,
                    host: &t.host,
                    target: &t.kind,
                    labels: &p.spec.labels,
                    eligible: *eligible,
                })
            })
            .collect();
        let chosen = match_job(job, &labels)?;
        self.policies
            .iter()
            .find(|p| {
                p.metadata.namespace.as_deref() == Some(chosen.namespace)
                    && p.metadata.name.as_deref() == Some(chosen.name)
            })
            .map(AsRef::as_ref)
    }
}
