//! Demand signals (DESIGN §7): the webhook receiver's sink, which records jobs in the matching
//! policy's `status.pendingJobs` (every replica), and the leader's repairs — polling queued runs
//! (a repository target's own; an organization's or enterprise's by walking its repositories,
//! `github::walk`) and one `GET …/actions/jobs/{id}` for a job pending past its grace.
//!
//! Only an eligible policy takes a job (issue 13, finding 4): Ready for its current generation
//! — the leader resolved it, which proves its credentials against its own host and target —
//! and not refused by the owner bindings. A delivery may change a policy only when the hook's
//! secret vouches for it (finding 5): the cluster secret for policies without a hook of their
//! own, a policy's own secret for the policies of its namespace naming the same Secret.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use runner_manager_crds::attempt::JobFact;
use runner_manager_crds::names::attempt_name;
use runner_manager_crds::policy::{PENDING_JOBS_BOUND, ScalePolicy};
use secrecy::SecretString;
use serde_json::{Map, Value, json};

use super::candidates::Candidates;
use crate::controller::ledger_batch::{BatchError, LedgerBatches};
use crate::controller::writes::Writer;
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

/// The entries to add: jobs not yet in the ledger, while it has room. Pure.
pub fn additions(
    ledger: &BTreeMap<String, Time>,
    jobs: impl IntoIterator<Item = i64>,
    now: Timestamp,
) -> Map<String, Value> {
    let mut out = Map::new();
    for id in jobs {
        let key = id.to_string();
        if ledger.contains_key(&key) || out.contains_key(&key) {
            continue;
        }
        if ledger.len() + out.len() >= PENDING_JOBS_BOUND {
            break;
        }
        out.insert(key, json!(Time(now)));
    }
    out
}

/// How many of a policy's pending jobs its own runners have evidently taken already, though the
/// ledger does not know it yet (polling: no `in_progress` delivery; the entry stays until a poll
/// proves the job left the queue, up to a couple of intervals). Without this a runner that took
/// a job leaves "idle" while the job's entry still counts, and the policy mints a second runner
/// for the same job (issue 19: 8 runners for 4 jobs).
///
/// - An entry whose job an attempt is known to run (`facts.job`, from the delivery) is taken.
/// - A runner that took a job not known to us (busy, or concluded having completed one, within
///   `horizon`) explains one entry recorded before it took its job: matched oldest entry to
///   earliest runner, so a job queued after a runner went busy is never explained by it.
///
/// Only a scale-up is held back by it (`demand::decide_holding`); scale-down counts the whole
/// ledger, so a runner is never removed on a presumption. Pure.
pub fn presumed_taken(
    ledger: &BTreeMap<String, Time>,
    attempts: &[std::sync::Arc<runner_manager_crds::attempt::RunnerAttempt>],
    now: Timestamp,
    horizon: std::time::Duration,
) -> u32 {
    use runner_manager_crds::outcome::Outcome;
    let known: std::collections::BTreeSet<String> = attempts
        .iter()
        .filter_map(|a| a.status.as_ref()?.facts.job.as_ref())
        .map(|j| j.id.to_string())
        .collect();
    let mut taken = ledger.keys().filter(|k| known.contains(*k)).count();
    let mut entries: Vec<Timestamp> = ledger
        .iter()
        .filter(|(k, _)| !known.contains(*k))
        .map(|(_, t)| t.0)
        .collect();
    entries.sort();
    let since = now
        .checked_sub(k8s_openapi::jiff::SignedDuration::try_from(horizon).unwrap_or_default())
        .unwrap_or(now);
    let mut takers: Vec<Timestamp> = attempts
        .iter()
        .filter_map(|a| {
            let status = a.status.as_ref()?;
            if status.facts.job.is_some() {
                return None;
            }
            let ts = status.journal.timestamps();
            let completed = matches!(status.journal.outcome(), Some(Outcome::CompletedJob));
            ts.busy_at
                .as_ref()
                .or(if completed {
                    ts.concluded_at.as_ref()
                } else {
                    None
                })
                .map(|t| t.0)
        })
        .filter(|t| *t >= since)
        .collect();
    takers.sort();
    let mut next = 0;
    for took in takers {
        if next < entries.len() && entries[next] <= took {
            next += 1;
            taken += 1;
        }
    }
    u32::try_from(taken).unwrap_or(u32::MAX)
}

/// [`presumed_taken`] for a policy: the horizon is two poll intervals, the longest a taken
/// job's entry waits for a poll to remove it; a `ScaleSet` policy's entries leave with their
/// `JobStarted` (and the set's statistics), so only known jobs count there.
pub fn presumed_taken_of(
    policy: &ScalePolicy,
    attempts: &[std::sync::Arc<runner_manager_crds::attempt::RunnerAttempt>],
    now: Timestamp,
) -> u32 {
    let horizon = if policy.spec.github.demand == runner_manager_crds::policy::DemandMode::ScaleSet
    {
        std::time::Duration::ZERO
    } else {
        policy.spec.scaling.poll_interval.as_duration() * 2
    };
    let empty = BTreeMap::new();
    let ledger = policy.status.as_ref().map_or(&empty, |s| &s.pending_jobs);
    presumed_taken(ledger, attempts, now, horizon)
}

/// The entries of jobs the organization walk saw leave the queue (listed queued by one read of
/// their repository, absent from a later one): removed at once, not after a complete cycle and a
/// poll interval's margin, so a job its runner took stops asking for a runner within one cycle.
/// Pure.
pub fn left_queue(ledger: &BTreeMap<String, Time>, left: &[i64]) -> Map<String, Value> {
    left.iter()
        .map(i64::to_string)
        .filter(|k| ledger.contains_key(k))
        .map(|k| (k, Value::Null))
        .collect()
}

/// The entries a complete poll of a repository target proves are no longer queued: recorded
/// before `cutoff` and absent from the poll's queued jobs. Without this, a job whose `in_progress`
/// and `completed` deliveries were lost stays in the ledger until its per-job check and keeps a
/// runner launched for it (over-provisioning). The cutoff lies a poll interval before the poll,
/// because GitHub's run list can lag behind the `queued` delivery of a brand-new job. Pure.
pub fn stale_after_poll(
    ledger: &BTreeMap<String, Time>,
    queued: &[i64],
    cutoff: Timestamp,
) -> Map<String, Value> {
    let found: std::collections::BTreeSet<String> = queued.iter().map(i64::to_string).collect();
    ledger
        .iter()
        .filter(|(job, at)| !found.contains(*job) && at.0 < cutoff)
        .map(|(job, _)| (job.clone(), Value::Null))
        .collect()
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

    fn policy(
        ns: &str,
        name: &str,
        url: &str,
        hook: Option<&str>,
        ready: Option<(bool, i64)>,
    ) -> ScalePolicy {
        let mut v = json!({
            "apiVersion": "runner-manager.dev/v1alpha1", "kind": "ScalePolicy",
            "metadata": {"namespace": ns, "name": name, "generation": 2},
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

    #[test]
    fn a_poll_removes_only_old_entries_it_no_longer_sees_queued() {
        let t = |s| Time(Timestamp::from_second(s).unwrap());
        let ledger: BTreeMap<String, Time> = [
            ("1".to_owned(), t(100)), // old, still queued: kept
            ("2".to_owned(), t(100)), // old, no longer queued: removed
            ("3".to_owned(), t(200)), // recorded after the cutoff (a brand-new job): kept
        ]
        .into();
        let cutoff = Timestamp::from_second(150).unwrap();
        let stale = stale_after_poll(&ledger, &[1], cutoff);
        assert_eq!(stale.keys().cloned().collect::<Vec<_>>(), vec!["2"]);
        assert_eq!(stale["2"], Value::Null);
    }

    #[test]
    fn additions_skip_known_jobs_and_respect_the_bound() {
        let now = Timestamp::from_second(100).unwrap();
        let mut ledger = BTreeMap::new();
        ledger.insert("1".to_owned(), Time(now));
        let add = additions(&ledger, [1, 2, 2, 3], now);
        assert_eq!(add.keys().cloned().collect::<Vec<_>>(), vec!["2", "3"]);
        let full: BTreeMap<String, Time> = (0..PENDING_JOBS_BOUND)
            .map(|i| (i.to_string(), Time(now)))
            .collect();
        assert!(additions(&full, [5_000_000], now).is_empty());
    }

    fn taker(
        busy_at: Option<i64>,
        completed_at: Option<i64>,
        job: Option<i64>,
    ) -> std::sync::Arc<runner_manager_crds::attempt::RunnerAttempt> {
        let t = |s: i64| Time(Timestamp::from_second(s).unwrap());
        let mut status = json!({"state": "Idle"});
        if let Some(b) = busy_at {
            status = json!({"state": "Busy", "timestamps": {"busyAt": t(b)}});
        }
        if let Some(c) = completed_at {
            status = json!({"state": "Finished", "outcome": {"kind": "CompletedJob"},
                            "timestamps": {"concludedAt": t(c)}});
        }
        if let Some(j) = job {
            // The facts are flattened into the status on the wire.
            status["job"] = json!({"id": j, "runId": 1, "repository": "acme/web"});
        }
        std::sync::Arc::new(serde_json::from_value(json!({
            "apiVersion": "runner-manager.dev/v1alpha1", "kind": "RunnerAttempt",
            "metadata": {"name": "web-1"},
            "spec": {"id": "01234567-89ab-4def-8123-456789abcdef", "policy": "web", "nodeName": "n",
              "snapshot": {"policyUid": "u", "target": {"url": "https://github.com/a/b", "scope": "Repository"},
                "labels": ["x"], "runnerGroupId": 1, "workspace": "Ephemeral", "maxSlots": 1,
                "execution": {"mode": "Native"},
                "runner": {"version": "2.330.0", "url": "u", "sha256": "a".repeat(64)},
                "timeouts": {"registration": "60s", "idle": "120s", "jitHandoff": "120s"}}},
            "status": status
        })).unwrap())
    }

    /// Why a concluded runner's job fact is written (`supervisor::job_facts`): its delivery
    /// removed its own job's entry, and without the fact it explained another job's.
    #[test]
    fn a_concluded_runner_whose_job_is_known_explains_no_other_entry() {
        let t = |s: i64| Time(Timestamp::from_second(s).unwrap());
        // Jobs 1 and 2 queued together; the runner took 1, concluded, and 1's entry is gone.
        let ledger: BTreeMap<String, Time> = [("2".into(), t(100))].into();
        let now = Timestamp::from_second(170).unwrap();
        let h = std::time::Duration::from_secs(120);
        assert_eq!(
            presumed_taken(&ledger, &[taker(None, Some(160), None)], now, h),
            1,
            "without its fact the runner hides job 2's demand"
        );
        assert_eq!(
            presumed_taken(&ledger, &[taker(None, Some(160), Some(1))], now, h),
            0,
            "with it job 2 is demand"
        );
    }

    #[test]
    fn a_runner_that_took_a_job_explains_one_older_entry_within_the_horizon() {
        let t = |s: i64| Time(Timestamp::from_second(s).unwrap());
        let ledger: BTreeMap<String, Time> = [
            ("1".into(), t(100)),
            ("2".into(), t(100)),
            ("3".into(), t(200)),
        ]
        .into();
        let now = Timestamp::from_second(210).unwrap();
        let h = std::time::Duration::from_secs(60);
        // Nothing taken: an idle runner explains nothing.
        assert_eq!(
            presumed_taken(&ledger, &[taker(None, None, None)], now, h),
            0
        );
        // A busy runner and one that completed its job explain two entries older than them.
        let two = [taker(Some(150), None, None), taker(None, Some(160), None)];
        assert_eq!(presumed_taken(&ledger, &two, now, h), 2);
        // A runner busy before a job was recorded does not explain that job.
        let early = [
            taker(Some(150), None, None),
            taker(Some(151), None, None),
            taker(Some(152), None, None),
        ];
        assert_eq!(
            presumed_taken(&ledger, &early, now, h),
            2,
            "entry 3 came after them"
        );
        // Past the horizon the ledger is trusted again.
        assert_eq!(
            presumed_taken(&ledger, &[taker(Some(100), None, None)], now, h),
            0
        );
        // A job known to run on one of ours counts, whatever its age; its runner explains no
        // other entry.
        assert_eq!(
            presumed_taken(&ledger, &[taker(Some(150), None, Some(3))], now, h),
            1
        );
    }
}
