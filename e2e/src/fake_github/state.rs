//! The fake's whole in-memory world, behind one lock, and the operations on it that more than one
//! route needs (runner registration, job assignment, webhook emission).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use super::auth::{self, AppRegistration, Caller, Installation, IssuedToken, TargetType};
use super::clock::unix_now;
use super::endpoint::{Endpoint, Resource};
use super::error::ApiError;
use super::faults::Fault;
use super::jit::{CredentialData, CredentialSettings, JitSettings, RsaParams, RunnerSettings};
use super::jobs::{AcquiredJob, AssignedRunner, Conclusion, Job, JobStatus};
use super::ratelimit::Bucket;
use super::runners::{Runner, RunnerGroup};
use super::scope::Scope;
use super::shapes;
use super::webhooks::{Delivery, Hook, JobAction, Outgoing, WebhookControls};
use crate::standin_runner::behaviour::JobBehaviour;

/// The release the fake publishes as `actions/runner`'s latest, and serves for download.
#[derive(Debug, Clone)]
pub struct PackageInfo {
    pub version: String,
    pub file_name: String,
    pub sha256: String,
    pub size: u64,
    pub path: std::path::PathBuf,
}

/// A Linux package the downloads listing names beside the served one.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ListedDownload {
    /// GitHub's word: `x64`, `arm64`, `arm`, or any other a test wants listed.
    pub architecture: String,
    pub filename: String,
    /// Absent: listed without a checksum.
    pub sha256: Option<String>,
}

/// Everything the fake remembers.
#[derive(Debug, Default)]
pub struct World {
    pub app: Option<AppRegistration>,
    pub installations: BTreeMap<u64, Installation>,
    /// Installation tokens by hash.
    pub tokens: HashMap<String, IssuedToken>,
    /// Personal access tokens by hash.
    pub pats: HashSet<String>,
    pub runners: BTreeMap<u64, Runner>,
    pub groups: BTreeMap<Scope, Vec<RunnerGroup>>,
    pub jobs: BTreeMap<u64, Job>,
    /// Runner sessions: token hash to runner id.
    pub sessions: HashMap<String, u64>,
    pub label_ids: HashMap<String, u64>,
    pub buckets: BTreeMap<Resource, Bucket>,
    pub faults: BTreeMap<Endpoint, VecDeque<Fault>>,
    /// Calls per endpoint and outcome (`"200"`, `"404"`, `"dropped"` …).
    pub counters: BTreeMap<Endpoint, BTreeMap<String, u64>>,
    pub hooks: Vec<Hook>,
    pub webhook_controls: WebhookControls,
    pub deliveries: Vec<Delivery>,
    /// Runner versions below this are refused at session start (the runner exits 7).
    pub minimum_runner_version: Option<String>,
    /// Every `encoded_jit_config` handed out, so a scenario can prove none of them is left
    /// anywhere (API server, logs, host roots) once things settle.
    pub issued_jits: Vec<SecretString>,
    /// Every registration `generate-jitconfig` made, in order, kept after the runner is deleted:
    /// what a scenario joins with the attempts' journal (each mint belongs to one attempt, by the
    /// runner name its uuid derives) instead of comparing a counter with a sampled state.
    pub mints: Vec<Mint>,
    /// Repositories by lower-case `owner/repo` → id, added by the admin API; a job queued in a
    /// repository adds it too (`GET /orgs/{org}/repos`).
    pub repos: BTreeMap<String, u64>,
    /// The organizations of each enterprise (lower-case), for the GraphQL query that lists them.
    pub enterprise_orgs: BTreeMap<String, Vec<String>>,
    /// The runner scale-set service (`scaleset`).
    pub scale_sets: super::scaleset_world::ScaleSetWorld,
    /// Linux packages of other architectures the downloads listing names beside the served
    /// one (`POST /_admin/downloads`): listed, never served.
    pub other_downloads: Vec<ListedDownload>,
    next_id: u64,
}

/// One JIT minted: the registration it made and what became of its single use.
#[derive(Debug, Clone)]
pub struct Mint {
    pub id: u64,
    pub name: String,
    pub scope: String,
    /// Unix seconds.
    pub at: i64,
    /// Session openings presented with its credentials (the first is the JIT's one use; any
    /// later one, refused, is a runner started twice on one JIT).
    pub sessions: u32,
}

impl World {
    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Adds `owner/repo` if it is new; its id either way.
    pub fn add_repo(&mut self, owner: &str, repo: &str) -> u64 {
        let key = format!(
            "{}/{}",
            owner.to_ascii_lowercase(),
            repo.to_ascii_lowercase()
        );
        if let Some(id) = self.repos.get(&key) {
            return *id;
        }
        let id = self.next_id();
        self.repos.insert(key, id);
        id
    }

    /// The repositories of an organization (or user), by name: (id, name).
    #[must_use]
    pub fn repos_of(&self, owner: &str) -> Vec<(u64, String)> {
        let prefix = format!("{}/", owner.to_ascii_lowercase());
        self.repos
            .iter()
            .filter_map(|(k, id)| Some((*id, k.strip_prefix(&prefix)?.to_owned())))
            .collect()
    }

    pub fn label_id(&mut self, label: &str) -> u64 {
        let key = label.to_ascii_lowercase();
        let next = self.label_ids.len() as u64 + 1;
        *self.label_ids.entry(key).or_insert(next)
    }

    /// The groups of an organization or enterprise; every account has `Default` (id 1).
    pub fn groups_of(&mut self, owner: &Scope) -> &mut Vec<RunnerGroup> {
        self.groups.entry(owner.clone()).or_insert_with(|| {
            vec![RunnerGroup {
                id: 1,
                name: "Default".into(),
                default: true,
                usable: true,
            }]
        })
    }

    pub fn bucket(&mut self, resource: Resource, now: i64) -> &mut Bucket {
        self.buckets
            .entry(resource)
            .or_insert_with(|| Bucket::default_for(resource, now))
    }

    pub fn runner_json(&mut self, id: u64) -> Option<Value> {
        let labels = self.runners.get(&id)?.labels.clone();
        let ids: HashMap<String, u64> = labels
            .iter()
            .map(|l| (l.to_ascii_lowercase(), self.label_id(l)))
            .collect();
        let r = self.runners.get(&id)?;
        Some(shapes::runner(r, |l| {
            ids.get(&l.to_ascii_lowercase()).copied().unwrap_or(0)
        }))
    }
}

/// A running fake GitHub.
#[derive(Debug)]
pub struct FakeGithub {
    world: Mutex<World>,
    /// Bumped whenever a job or runner changes, to wake long polls.
    changed: watch::Sender<u64>,
    pub base_url: String,
    outgoing: mpsc::UnboundedSender<Outgoing>,
    pub package: Option<PackageInfo>,
}

/// Body of `generate-jitconfig`, already checked against the description.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct JitRequest {
    pub name: Option<String>,
    pub runner_group_id: Option<u64>,
    pub labels: Option<Vec<String>>,
    pub work_folder: Option<String>,
}

impl FakeGithub {
    /// Creates the fake and returns the receiving end of its webhook queue.
    #[must_use]
    pub fn new(
        base_url: String,
        package: Option<PackageInfo>,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<Outgoing>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (changed, _) = watch::channel(0);
        let fake = Arc::new(Self {
            world: Mutex::new(World::default()),
            changed,
            base_url,
            outgoing: tx,
            package,
        });
        (fake, rx)
    }

    /// The lock is never held across an await; a panic while holding it leaves consistent data.
    pub fn world(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Wakes long polls (a scale set acquired jobs).
    pub fn bump_public(&self) {
        self.bump();
    }

    /// Authorises a REST call at `scope`: a PAT reaches everything, an installation token only its
    /// own account.
    pub fn authorize(&self, headers: &HeaderMap, scope: &Scope) -> Result<Caller, ApiError> {
        let token = auth::presented_token(headers).ok_or_else(ApiError::requires_auth)?;
        let hash = auth::token_hash(token);
        let world = self.world();
        if world.pats.contains(&hash) {
            return Ok(Caller::PersonalAccessToken);
        }
        let issued = world.tokens.get(&hash).ok_or_else(ApiError::unauthorized)?;
        if issued.expires_at <= unix_now() {
            return Err(ApiError::unauthorized());
        }
        let inst = world
            .installations
            .get(&issued.installation_id)
            .ok_or_else(ApiError::unauthorized)?;
        let enterprise_scope = matches!(scope, Scope::Enterprise { .. });
        let enterprise_inst = inst.target_type == TargetType::Enterprise;
        if inst.suspended
            || enterprise_scope != enterprise_inst
            || !inst.account.eq_ignore_ascii_case(scope.account())
        {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "Resource not accessible by integration",
            ));
        }
        Ok(Caller::Installation(inst.id))
    }

    /// Authenticates a call that needs the App's JWT.
    pub fn authenticate_app(&self, headers: &HeaderMap) -> Result<u64, ApiError> {
        let token = auth::presented_token(headers).ok_or_else(ApiError::requires_auth)?;
        let world = self.world();
        let app = world.app.as_ref().ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "A JSON web token could not be decoded",
            )
        })?;
        auth::verify_app_jwt(app, token, unix_now())?;
        Ok(app.app_id)
    }

    /// `generate-jitconfig`: registers a runner and returns its JSON and JIT configuration.
    pub fn generate_jit(
        &self,
        scope: &Scope,
        req: JitRequest,
    ) -> Result<(Value, SecretString), ApiError> {
        let name = req.name.filter(|n| !n.is_empty()).ok_or_else(|| {
            ApiError::validation("Invalid request.\n\n\"name\" wasn't supplied.", vec![])
        })?;
        let group_id = req.runner_group_id.ok_or_else(|| {
            ApiError::validation(
                "Invalid request.\n\n\"runner_group_id\" wasn't supplied.",
                vec![],
            )
        })?;
        let labels = req.labels.unwrap_or_default();
        if labels.is_empty() || labels.len() > 100 {
            return Err(ApiError::validation(
                "Invalid request.\n\nlabels must have between 1 and 100 items.",
                vec![],
            ));
        }
        let mut world = self.world();
        let group = world
            .groups_of(&scope.group_owner())
            .iter()
            .find(|g| g.id == group_id)
            .cloned()
            .ok_or_else(ApiError::not_found)?;
        if !group.usable {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "The runner group is not available to this repository.",
            ));
        }
        if world
            .runners
            .values()
            .any(|r| r.scope == *scope && r.name.eq_ignore_ascii_case(&name))
        {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("Already exists - A runner with the name {name} already exists."),
            ));
        }
        let id = world.next_id();
        let client_id = uuid::Uuid::new_v4().to_string();
        let secret = auth::mint_token("");
        let work_folder = req.work_folder.unwrap_or_else(|| "_work".into());
        let settings = JitSettings {
            runner: RunnerSettings {
                agent_id: id,
                agent_name: name.clone(),
                pool_id: group.id,
                pool_name: group.name.clone(),
                server_url: format!("{}/_runner", self.base_url),
                git_hub_url: format!("{}/_html/{}", self.base_url, scope.path()),
                work_folder: work_folder.clone(),
                ephemeral: true,
                disable_update: true,
            },
            credentials: CredentialSettings {
                scheme: "OAuth".into(),
                data: CredentialData {
                    client_id: client_id.clone(),
                    authorization_url: format!("{}/_runner/sessions", self.base_url),
                    require_fips_cryptography: "True".into(),
                },
            },
            rsa_params: random_rsa_params(&secret),
        };
        let encoded = settings
            .encode()
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        world.runners.insert(
            id,
            Runner {
                id,
                name,
                scope: scope.clone(),
                group_id: group.id,
                group_name: group.name,
                labels,
                work_folder,
                version: None,
                client_id,
                client_secret: secret,
                jit_used: false,
                session: None,
                job: None,
            },
        );
        world.issued_jits.push(encoded.clone());
        let minted_name = world.runners[&id].name.clone();
        world.mints.push(Mint {
            id,
            name: minted_name,
            scope: scope.path(),
            at: unix_now(),
            sessions: 0,
        });
        let json = world.runner_json(id).unwrap_or(Value::Null);
        drop(world);
        self.bump();
        Ok((json, encoded))
    }

    /// Deletes a runner: 404 unknown (or in another scope), 422 while it runs a job.
    pub fn delete_runner(&self, scope: &Scope, id: u64) -> Result<(), ApiError> {
        let mut world = self.world();
        let runner = world
            .runners
            .get(&id)
            .filter(|r| r.scope == *scope)
            .ok_or_else(ApiError::not_found)?;
        if runner.busy() {
            return Err(ApiError::validation(
                format!(
                    "Bad request - Runner \"{}\" is still running a job\"",
                    runner.name
                ),
                vec![],
            ));
        }
        if let Some(session) = runner.session.clone() {
            world.sessions.remove(&session);
        }
        world.runners.remove(&id);
        drop(world);
        self.bump();
        Ok(())
    }

    /// Opens the runner's one session (the JIT's single use).
    pub fn open_session(
        &self,
        client_id: &str,
        client_secret: &str,
        version: &str,
    ) -> Result<SecretString, ApiError> {
        let mut world = self.world();
        if let Some(min) = world.minimum_runner_version.clone()
            && version_lt(version, &min)
        {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!("Runner version v{version} is deprecated and cannot receive messages."),
            ));
        }
        let runner = world
            .runners
            .values_mut()
            .find(|r| r.client_id == client_id)
            .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "Runner registration not found"))?;
        if runner.client_secret.expose_secret() != client_secret {
            return Err(ApiError::unauthorized());
        }
        let (id, used) = (runner.id, runner.jit_used);
        if let Some(m) = world.mints.iter_mut().rev().find(|m| m.id == id) {
            m.sessions += 1;
        }
        let runner = world
            .runners
            .get_mut(&id)
            .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "Runner registration not found"))?;
        if used {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "This JIT configuration has already been used.",
            ));
        }
        runner.jit_used = true;
        runner.version = Some(version.to_owned());
        let token = auth::mint_token("ghr_");
        let hash = auth::token_hash(token.expose_secret());
        runner.session = Some(hash.clone());
        let id = runner.id;
        world.sessions.insert(hash, id);
        drop(world);
        self.bump();
        Ok(token)
    }

    /// The runner a session token belongs to.
    pub fn session_runner(&self, headers: &HeaderMap) -> Result<u64, ApiError> {
        let token = auth::presented_token(headers).ok_or_else(ApiError::requires_auth)?;
        self.world()
            .sessions
            .get(&auth::token_hash(token))
            .copied()
            .ok_or_else(ApiError::unauthorized)
    }

    /// Ends a session: the runner goes offline.
    pub fn close_session(&self, runner_id: u64) {
        let mut world = self.world();
        if let Some(r) = world.runners.get_mut(&runner_id)
            && let Some(hash) = r.session.take()
        {
            world.sessions.remove(&hash);
        }
        drop(world);
        self.bump();
    }

    /// Gives the runner the oldest queued job it can take, if any.
    pub fn try_assign(&self, runner_id: u64) -> Result<Option<AcquiredJob>, ApiError> {
        let mut world = self.world();
        let runner = world
            .runners
            .get(&runner_id)
            .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "Runner registration not found"))?;
        if runner.busy() {
            return Ok(None);
        }
        let Some(job_id) = world
            .jobs
            .values()
            .find(|j| {
                j.status == JobStatus::Queued
                    && runner.scope.covers_repo(&j.owner, &j.repo)
                    && runner.covers_labels(&j.labels)
            })
            .map(|j| j.id)
        else {
            return Ok(None);
        };
        let assigned = AssignedRunner {
            id: runner.id,
            name: runner.name.clone(),
            group_id: runner.group_id,
            group_name: runner.group_name.clone(),
        };
        if let Some(r) = world.runners.get_mut(&runner_id) {
            r.job = Some(job_id);
        }
        let Some(job) = world.jobs.get_mut(&job_id) else {
            return Ok(None);
        };
        job.status = JobStatus::InProgress;
        job.started_at = Some(unix_now());
        job.runner = Some(assigned);
        let acquired = AcquiredJob {
            job_id,
            run_id: job.run_id,
            name: job.name.clone(),
            repository: format!("{}/{}", job.owner, job.repo),
            behaviour: job.behaviour.clone(),
        };
        let job = job.clone();
        self.emit(&mut world, JobAction::InProgress, &job);
        drop(world);
        self.bump();
        Ok(Some(acquired))
    }

    /// The runner reports its job finished; the ephemeral runner's registration goes with it.
    pub fn complete_job(
        &self,
        runner_id: u64,
        job_id: u64,
        conclusion: Conclusion,
    ) -> Result<(), ApiError> {
        let mut world = self.world();
        let holds = world
            .runners
            .get(&runner_id)
            .is_some_and(|r| r.job == Some(job_id));
        if !holds {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "The runner does not hold this job.",
            ));
        }
        let Some(job) = world.jobs.get_mut(&job_id) else {
            return Err(ApiError::not_found());
        };
        job.status = JobStatus::Completed;
        job.conclusion = Some(conclusion);
        job.completed_at = Some(unix_now());
        let job = job.clone();
        if let Some(r) = world.runners.remove(&runner_id)
            && let Some(hash) = r.session
        {
            world.sessions.remove(&hash);
        }
        self.emit(&mut world, JobAction::Completed, &job);
        drop(world);
        self.bump();
        Ok(())
    }

    /// Queues a job in `owner/repo` (admin API).
    pub fn queue_job(
        &self,
        owner: &str,
        repo: &str,
        name: String,
        labels: Vec<String>,
        behaviour: JobBehaviour,
        pull_request: Option<crate::fake_github::jobs::PullRequestOrigin>,
    ) -> (u64, u64) {
        let mut world = self.world();
        world.add_repo(owner, repo);
        let run_id = world.next_id();
        let id = world.next_id();
        let job = Job {
            id,
            run_id,
            owner: owner.to_owned(),
            repo: repo.to_owned(),
            workflow_name: format!("{name} workflow"),
            name,
            head_sha: hex::encode(sha2_digest(&id.to_le_bytes())),
            labels,
            status: JobStatus::Queued,
            conclusion: None,
            created_at: unix_now(),
            started_at: None,
            completed_at: None,
            runner: None,
            behaviour,
            pull_request,
        };
        world.jobs.insert(id, job.clone());
        self.emit(&mut world, JobAction::Queued, &job);
        drop(world);
        self.bump();
        (id, run_id)
    }

    /// The `workflow_job` payload for a job event.
    #[must_use]
    pub fn webhook_payload(&self, action: JobAction, job: &Job) -> Value {
        let base = &self.base_url;
        let mut wj = shapes::job(base, job);
        if action == JobAction::Queued {
            wj["steps"] = json!([]);
        }
        json!({
            "action": action.as_str(),
            "workflow_job": wj,
            "repository": shapes::webhook_repository(base, &job.owner, &job.repo),
            "organization": {
                "login": job.owner,
                "id": shapes::name_id(&job.owner),
                "node_id": format!("O_fake_{}", job.owner),
                "url": format!("{base}/orgs/{}", job.owner),
                "repos_url": format!("{base}/orgs/{}/repos", job.owner),
                "events_url": format!("{base}/orgs/{}/events", job.owner),
                "hooks_url": format!("{base}/orgs/{}/hooks", job.owner),
                "issues_url": format!("{base}/orgs/{}/issues", job.owner),
                "members_url": format!("{base}/orgs/{}/members{{/member}}", job.owner),
                "public_members_url": format!("{base}/orgs/{}/public_members{{/member}}", job.owner),
                "avatar_url": format!("{base}/_avatars/{}", job.owner),
                "description": null,
            },
            "sender": shapes::simple_user(base, "fake-sender", 1, "User"),
        })
    }

    /// Records a delivery per configured hook and queues it for sending, honouring the controls.
    fn emit(&self, world: &mut World, action: JobAction, job: &Job) {
        if world.hooks.is_empty() {
            return;
        }
        let body =
            Arc::new(serde_json::to_vec(&self.webhook_payload(action, job)).unwrap_or_default());
        let hooks = world.hooks.clone();
        for hook in hooks {
            let guid = uuid::Uuid::new_v4().to_string();
            let controls = &mut world.webhook_controls;
            let dropped = controls.drop_next > 0;
            if dropped {
                controls.drop_next -= 1;
            }
            let copies = if !dropped && controls.duplicate_next > 0 {
                controls.duplicate_next -= 1;
                2
            } else {
                u32::from(!dropped)
            };
            let delay = Duration::from_millis(controls.delay_ms);
            world.deliveries.push(Delivery {
                guid: guid.clone(),
                hook_id: hook.id,
                action,
                job_id: job.id,
                body: body.clone(),
                dropped,
                attempts: Vec::new(),
            });
            for _ in 0..copies {
                // A closed channel means the fake is shutting down; nothing to deliver to.
                let _ = self.outgoing.send(Outgoing {
                    guid: guid.clone(),
                    job_id: job.id,
                    hook_id: hook.id,
                    url: hook.url.clone(),
                    secret: hook.secret.clone(),
                    body: body.clone(),
                    delay,
                    redelivery: false,
                });
            }
        }
    }

    /// Re-sends a recorded delivery with its original GUID (admin API).
    pub fn redeliver(&self, guid: &str) -> Result<(), ApiError> {
        let world = self.world();
        let d = world
            .deliveries
            .iter()
            .find(|d| d.guid == guid)
            .ok_or_else(ApiError::not_found)?;
        let hook = world
            .hooks
            .iter()
            .find(|h| h.id == d.hook_id)
            .ok_or_else(ApiError::not_found)?;
        let _ = self.outgoing.send(Outgoing {
            guid: d.guid.clone(),
            job_id: d.job_id,
            hook_id: hook.id,
            url: hook.url.clone(),
            secret: hook.secret.clone(),
            body: d.body.clone(),
            delay: Duration::ZERO,
            redelivery: true,
        });
        Ok(())
    }

    pub fn record_attempt(&self, guid: &str, status: Option<u16>, redelivery: bool) {
        let mut world = self.world();
        if let Some(d) = world.deliveries.iter_mut().find(|d| d.guid == guid) {
            d.attempts
                .push(super::webhooks::Attempt { status, redelivery });
        }
    }

    pub fn count(&self, endpoint: Endpoint, outcome: String) {
        *self
            .world()
            .counters
            .entry(endpoint)
            .or_default()
            .entry(outcome)
            .or_default() += 1;
    }

    pub fn take_fault(&self, endpoint: Endpoint) -> Option<Fault> {
        self.world().faults.get_mut(&endpoint)?.pop_front()
    }
}

fn sha2_digest(bytes: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).to_vec()
}

/// Random material in the shape of the runner's RSA parameters; `d` carries the client secret.
fn random_rsa_params(secret: &SecretString) -> RsaParams {
    use base64::Engine;
    let rnd = || {
        base64::engine::general_purpose::STANDARD.encode(uuid::Uuid::new_v4().as_bytes().repeat(8))
    };
    RsaParams {
        d: secret.expose_secret().to_owned(),
        dp: rnd(),
        dq: rnd(),
        exponent: "AQAB".into(),
        inverse_q: rnd(),
        modulus: rnd(),
        p: rnd(),
        q: rnd(),
    }
}

/// Compares dotted versions numerically (`2.300.0` < `2.330.1`).
#[must_use]
pub fn version_lt(a: &str, b: &str) -> bool {
    let parse = |v: &str| -> Vec<u64> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    parse(a) < parse(b)
}
