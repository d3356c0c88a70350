//! The webhook source (DESIGN §7): the `workflow_job` receiver's sink, which records jobs in the
//! matching policy's `status.pendingJobs` on every replica (the leader's pull sources repair
//! what deliveries miss: `poll`, `walk`, `checks`).
//!
//! Only an eligible policy takes a job (issue 13, finding 4): Ready for its current generation
//! — the leader resolved it, which proves its credentials against its own host and target —
//! and not refused by the owner bindings. A delivery may change a policy only when the hook's
//! secret vouches for it (finding 5): the cluster secret for policies without a hook of their
//! own, a policy's own secret for the policies of its namespace naming the same Secret.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use runner_manager_crds::attempt::JobFact;
use runner_manager_crds::names::attempt_name;
use runner_manager_crds::policy::ScalePolicy;
use secrecy::SecretString;
use serde_json::{Map, Value};

use super::candidates::Candidates;
use crate::controller::ledger_batch::{BatchError, LedgerBatches};
use crate::controller::writes::Writer;
use crate::policy::ledger::additions;
use crate::policy::matching::JobLabels;
use crate::policy::tenancy::OwnerBindings;
use crate::webhook::{HookRoute, JobAction, JobEvent, JobSink, PolicyKey, SinkError};

/// Whether a delivery that came through `route` may change `policy`. `route_secret` is the
/// Secret the route's own policy names (`None` when that policy is gone or names none). Pure.
pub fn route_covers(route: &HookRoute, route_secret: Option<&str>, policy: &ScalePolicy) -> bool {
    let own = policy
        .spec
        .webhook
        .as_ref()
        .map(|w| w.secret_ref.name.as_str());
    match route {
        // The shared secret vouches only for policies that chose no secret of their own.
        HookRoute::Cluster => own.is_none(),
        HookRoute::Policy { namespace, .. } => {
            policy.metadata.namespace.as_deref() == Some(namespace.as_str())
                && own.is_some()
                && own == route_secret
        }
    }
}

/// The webhook receiver's sink on every replica.
pub struct KubeSink {
    pub writer: Writer,
    pub policies: Store<ScalePolicy>,
    /// Deliveries for one policy that arrive together share one ledger patch.
    pub batches: LedgerBatches,
    /// The admin's owner bindings (`--owner-namespaces`).
    pub bindings: OwnerBindings,
    /// Policies' own hook secrets, read at most every [`HOOK_SECRET_MAX_AGE`].
    pub hook_secrets: HookSecrets,
}

/// How long a policy's hook secret is trusted before it is read again (a rotation takes effect
/// within this; an unauthenticated caller cannot make the receiver read Secrets faster).
pub const HOOK_SECRET_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(10);

/// A hook secret as read, and when: `None` = the Secret or its key `secret` is missing.
type ReadSecret = (tokio::time::Instant, Option<SecretString>);

/// Recently read hook secrets by (namespace, Secret name).
#[derive(Default)]
pub struct HookSecrets {
    read: std::sync::Mutex<std::collections::HashMap<(String, String), ReadSecret>>,
}

impl HookSecrets {
    async fn get(
        &self,
        kube: &kube::Client,
        namespace: &str,
        name: &str,
    ) -> Result<Option<SecretString>, kube::Error> {
        let key = (namespace.to_owned(), name.to_owned());
        {
            let read = self
                .read
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some((at, value)) = read.get(&key)
                && at.elapsed() < HOOK_SECRET_MAX_AGE
            {
                return Ok(value.clone());
            }
        }
        let secret = Api::<Secret>::namespaced(kube.clone(), namespace)
            .get_opt(name)
            .await?;
        let value = secret
            .and_then(|s| s.data?.remove("secret"))
            .and_then(|b| String::from_utf8(b.0).ok())
            .filter(|v| !v.is_empty())
            .map(SecretString::from);
        self.read
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key, (tokio::time::Instant::now(), value.clone()));
        Ok(value)
    }
}

impl std::fmt::Debug for HookSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookSecrets").finish_non_exhaustive()
    }
}

/// Why a delivery could not be recorded (GitHub redelivers on the 503 it gets).
#[derive(Debug, thiserror::Error)]
enum ApplyError {
    #[error(transparent)]
    Ledger(#[from] BatchError),
    #[error("writing the attempt's job: {0}")]
    JobFact(#[from] kube::Error),
    #[error("the hook's secret does not cover the job's policy")]
    Foreign,
}

impl KubeSink {
    /// The job fact of attempt `namespace/attempt`, read fresh (every replica receives
    /// deliveries; only the leader caches attempts), one compare-and-swap with its GitHub fact.
    async fn job_fact(
        &self,
        namespace: &str,
        attempt: &str,
        job: &JobFact,
    ) -> Result<(), kube::Error> {
        // Logged on every path that knows the outcome: with the attempt gone (the history keeps
        // only the newest cleaned attempts, and a short job's `in_progress` can come after its
        // attempt was deleted) this line is the only record of which job the runner ran.
        let written = match self.writer.attempts(namespace).get_opt(attempt).await? {
            Some(a) => {
                crate::controller::supervisor::write_facts(&self.writer, &a, |a| {
                    crate::controller::supervisor::job_facts(a, job)
                })
                .await?
            }
            None => false,
        };
        tracing::info!(
            attempt.namespace = namespace,
            attempt.name = attempt,
            job.id = job.id,
            job.run_id = job.run_id,
            fact_written = written,
            "GitHub assigned the job to the attempt's runner"
        );
        Ok(())
    }

    /// The Secret named by the `spec.webhook` of policy `namespace/name`, if it has one.
    fn hook_secret_name(&self, namespace: &str, name: &str) -> Option<String> {
        let policy = self
            .policies
            .get(&ObjectRef::<ScalePolicy>::new(name).within(namespace))?;
        policy
            .spec
            .webhook
            .as_ref()
            .map(|w| w.secret_ref.name.clone())
    }

    /// Record `event` in the ledger of the policy it matches; that policy, or `None` when none
    /// matches.
    async fn apply(&self, event: JobEvent) -> Result<Option<PolicyKey>, ApplyError> {
        let candidates = Candidates::of(self.policies.state(), true, &self.bindings);
        let job = JobLabels {
            host: &event.host,
            repository: &event.repository,
            enterprise: event.enterprise.as_deref(),
            labels: &event.labels,
        };
        let Some(policy) = candidates.matching(&job) else {
            return Ok(None);
        };
        let route_secret = match &event.route {
            HookRoute::Cluster => None,
            HookRoute::Policy { namespace, name } => self.hook_secret_name(namespace, name),
        };
        if !route_covers(&event.route, route_secret.as_deref(), policy) {
            return Err(ApplyError::Foreign);
        }
        let ns = policy.metadata.namespace.as_deref().unwrap_or_default();
        let name = policy.metadata.name.as_deref().unwrap_or_default();
        let empty = BTreeMap::new();
        let ledger = policy.status.as_ref().map_or(&empty, |s| &s.pending_jobs);
        let key = event.job_id.to_string();
        let id = i64::try_from(event.job_id).unwrap_or(i64::MAX);
        match event.action {
            JobAction::Queued => {
                // This delivery is the origin of the trace of the runner created for the job. It
                // is recorded before the entry is written: the reconcile the write wakes may
                // create the runner before this task runs again, and found no origin then (a
                // cold run's trace scenario met it: runner.create became a root).
                let origins = crate::telemetry::origin::origins();
                origins.record(
                    ns,
                    name,
                    id,
                    crate::telemetry::origin::Kind::Delivery,
                    crate::telemetry::origin::span_context(&tracing::Span::current()),
                );
                let add = additions(ledger, [id], Timestamp::now());
                if let Err(e) = self.batches.write(&self.writer, ns, name, add).await {
                    // Not in the ledger: no runner is made for it until the redelivery, which
                    // records its own origin.
                    origins.withdraw(ns, name, id);
                    return Err(e.into());
                }
            }
            JobAction::Waiting => {}
            JobAction::InProgress | JobAction::Completed => {
                // The attempt whose runner took it learns its job first, and only then does the
                // entry leave the ledger. In the other order a reconcile between the two writes
                // saw neither the entry nor the job: an idle-looking runner over a demand of
                // zero, scaled down with its job (the Controller reacts at once, and a scenario
                // met it). In this order the job is counted once: `presumed_taken` explains
                // the entry by the attempt's job, so it asks for no second runner.
                // A concluded attempt gets its job too (`supervisor::job_facts` says why).
                let fact_written = if event.action == JobAction::InProgress
                    && let Some(attempt) = event.attempt()
                {
                    let job = JobFact {
                        id,
                        run_id: Some(i64::try_from(event.run_id).unwrap_or(i64::MAX)),
                        repository: Some(event.repository.clone()),
                        workflow_ref: None,
                    };
                    self.job_fact(ns, &attempt_name(name, attempt), &job).await
                } else {
                    Ok(())
                };
                // A job the runner's attempt could not be told of keeps its entry, and the 503
                // this answers makes GitHub redeliver: removed now, the runner would look idle
                // over no demand until the redelivery, and be scaled down with its job.
                fact_written?;
                // Removed whether or not our cache shows it yet: a `queued` recorded a moment
                // ago may not have reached the cache, and a null on an absent key is harmless.
                let mut remove = Map::new();
                remove.insert(key, Value::Null);
                self.batches.write(&self.writer, ns, name, remove).await?;
                crate::telemetry::origin::origins().forget(ns, name, id);
            }
        }
        Ok(Some(PolicyKey {
            namespace: ns.to_owned(),
            name: name.to_owned(),
        }))
    }
}

impl JobSink for KubeSink {
    async fn record(&self, event: JobEvent) -> Result<Option<PolicyKey>, SinkError> {
        self.apply(event).await.map_err(|e| match e {
            ApplyError::Foreign => SinkError::ForeignPolicy,
            e => {
                tracing::warn!(error = %e, "recording a job in the ledger failed");
                SinkError::Unavailable
            }
        })
    }

    async fn policy_secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<SecretString>, SinkError> {
        // Only a policy in the cache that names a Secret leads to a read: unknown paths cost
        // nothing but a map lookup.
        let Some(secret) = self.hook_secret_name(namespace, name) else {
            return Ok(None);
        };
        self.hook_secrets
            .get(&self.writer.kube, namespace, &secret)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "reading a policy's webhook secret failed");
                SinkError::Unavailable
            })
    }
}

impl std::fmt::Debug for KubeSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeSink").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::sources::candidates::{proven, target_conflicts};
    use serde_json::json;

    fn policy(
        ns: &str,
        name: &str,
        url: &str,
        hook: Option<&str>,
        ready: Option<(bool, i64)>,
    ) -> ScalePolicy {
        let mut v = json!({
            "apiVersion": "runner-manager.dev/v1alpha1", "kind": "ScalePolicy",
            "metadata": {"namespace": ns, "name": name, "generation": 2, "uid": format!("{ns}-{name}")},
            "spec": {
                "github": {"url": url, "credentialsSecretRef": {"name": "creds"}},
                "labels": ["self-hosted", "linux"], "maxRunners": 2
            }
        });
        if let Some(secret) = hook {
            v["spec"]["webhook"] = json!({"secretRef": {"name": secret}});
        }
        if let Some((ok, generation)) = ready {
            v["status"] = json!({"conditions": [{
                "type": "Ready", "status": if ok { "True" } else { "False" },
                "reason": if ok { "Valid" } else { "CredentialsRejected" }, "message": "",
                "observedGeneration": generation
            }]});
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn only_a_policy_ready_for_its_current_generation_is_proven() {
        let url = "https://github.com/acme/web";
        assert!(proven(&policy("t", "p", url, None, Some((true, 2)))));
        assert!(
            !proven(&policy("t", "p", url, None, Some((false, 2)))),
            "junk Secret"
        );
        assert!(
            !proven(&policy("t", "p", url, None, None)),
            "never resolved"
        );
        assert!(
            !proven(&policy("t", "p", url, None, Some((true, 1)))),
            "proven for an older spec (another URL, perhaps)"
        );
    }

    #[test]
    fn the_attackers_unproven_policy_takes_none_of_the_victims_jobs() {
        let url = "https://github.com/acme/web";
        let policies = vec![
            std::sync::Arc::new(policy("aaa", "steal", url, None, Some((false, 2)))),
            std::sync::Arc::new(policy("team", "web", url, None, Some((true, 2)))),
        ];
        let l = vec!["self-hosted".to_owned(), "linux".to_owned()];
        let job = JobLabels {
            host: "github.com",
            repository: "acme/web",
            enterprise: None,
            labels: &l,
        };
        let c = Candidates::of(policies.clone(), true, &OwnerBindings::default());
        let got = c.matching(&job).unwrap();
        assert_eq!(got.metadata.namespace.as_deref(), Some("team"));
        // What the poll asks before it reads without a settle margin.
        assert!(c.eligible(&policies[1]));
        assert!(!c.eligible(&policies[0]));
        // Both proven, but the owner is bound to `team`: `aaa` is out even with a Ready status
        // written before the binding.
        let both = vec![
            std::sync::Arc::new(policy("aaa", "steal", url, None, Some((true, 2)))),
            policies[1].clone(),
        ];
        let bound = OwnerBindings::parse("acme=team").unwrap();
        let ns_of = |bindings: &OwnerBindings| {
            Candidates::of(both.clone(), true, bindings)
                .matching(&job)
                .and_then(|p| p.metadata.namespace.clone())
        };
        assert_eq!(ns_of(&bound).as_deref(), Some("team"));
        assert!(!Candidates::of(both.clone(), true, &bound).eligible(&both[0]));
        assert_eq!(
            ns_of(&OwnerBindings::default()).as_deref(),
            Some("aaa"),
            "tie by namespace"
        );
        // Both namespaces are reported.
        let conflicts = target_conflicts(&policies);
        assert_eq!(conflicts["aaa/steal"], ["team/web"]);
        assert_eq!(conflicts["team/web"], ["aaa/steal"]);
    }

    #[test]
    fn a_hook_vouches_only_for_the_policies_that_trust_its_secret() {
        let url = "https://github.com/acme/web";
        let shared = policy("team", "web", url, None, None);
        let own = policy("team", "gpu", url, Some("team-hook"), None);
        let cluster = HookRoute::Cluster;
        assert!(route_covers(&cluster, None, &shared));
        assert!(
            !route_covers(&cluster, None, &own),
            "a policy with its own secret"
        );
        let team = HookRoute::Policy {
            namespace: "team".into(),
            name: "gpu".into(),
        };
        assert!(route_covers(&team, Some("team-hook"), &own));
        assert!(!route_covers(&team, Some("team-hook"), &shared));
        assert!(!route_covers(&team, Some("other-hook"), &own));
        assert!(!route_covers(&team, None, &own));
        let elsewhere = HookRoute::Policy {
            namespace: "aaa".into(),
            name: "gpu".into(),
        };
        assert!(
            !route_covers(&elsewhere, Some("team-hook"), &own),
            "another namespace's Secret of the same name is another secret"
        );
    }
}
