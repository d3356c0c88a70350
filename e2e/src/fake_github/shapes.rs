//! JSON bodies shared by several endpoints (users, repositories, runners, jobs, runs), shaped as
//! GitHub's official description requires. The conformance tests hold them to that description.

use serde_json::{Map, Value, json};

use super::clock::iso8601;
use super::jobs::Job;
use super::runners::Runner;

/// A `simple-user` (also used for organizations as webhook `sender`/`owner`).
#[must_use]
pub fn simple_user(base: &str, login: &str, id: u64, kind: &str) -> Value {
    let u = format!("{base}/users/{login}");
    json!({
        "login": login,
        "id": id,
        "node_id": format!("U_fake{id}"),
        "avatar_url": format!("{base}/_avatars/{id}"),
        "gravatar_id": "",
        "url": u,
        "html_url": format!("{base}/_html/{login}"),
        "followers_url": format!("{u}/followers"),
        "following_url": format!("{u}/following{{/other_user}}"),
        "gists_url": format!("{u}/gists{{/gist_id}}"),
        "starred_url": format!("{u}/starred{{/owner}}{{/repo}}"),
        "subscriptions_url": format!("{u}/subscriptions"),
        "organizations_url": format!("{u}/orgs"),
        "repos_url": format!("{u}/repos"),
        "events_url": format!("{u}/events{{/privacy}}"),
        "received_events_url": format!("{u}/received_events"),
        "type": kind,
        "site_admin": false,
    })
}

/// Stable small ids for accounts and repositories, derived from their names so that the same
/// name always gets the same id within and across runs.
#[must_use]
pub fn name_id(name: &str) -> u64 {
    let mut h: u64 = 1_469_598_103_934_665_603;
    for b in name.to_ascii_lowercase().bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(1_099_511_628_211);
    }
    h % 1_000_000_000 + 1
}

const REPO_URL_SUFFIXES: &[(&str, &str)] = &[
    ("archive_url", "/{archive_format}{/ref}"),
    ("assignees_url", "/assignees{/user}"),
    ("blobs_url", "/git/blobs{/sha}"),
    ("branches_url", "/branches{/branch}"),
    ("collaborators_url", "/collaborators{/collaborator}"),
    ("comments_url", "/comments{/number}"),
    ("commits_url", "/commits{/sha}"),
    ("compare_url", "/compare/{base}...{head}"),
    ("contents_url", "/contents/{+path}"),
    ("contributors_url", "/contributors"),
    ("deployments_url", "/deployments"),
    ("downloads_url", "/downloads"),
    ("events_url", "/events"),
    ("forks_url", "/forks"),
    ("git_commits_url", "/git/commits{/sha}"),
    ("git_refs_url", "/git/refs{/sha}"),
    ("git_tags_url", "/git/tags{/sha}"),
    ("hooks_url", "/hooks"),
    ("issue_comment_url", "/issues/comments{/number}"),
    ("issue_events_url", "/issues/events{/number}"),
    ("issues_url", "/issues{/number}"),
    ("keys_url", "/keys{/key_id}"),
    ("labels_url", "/labels{/name}"),
    ("languages_url", "/languages"),
    ("merges_url", "/merges"),
    ("milestones_url", "/milestones{/number}"),
    (
        "notifications_url",
        "/notifications{?since,all,participating}",
    ),
    ("pulls_url", "/pulls{/number}"),
    ("releases_url", "/releases{/id}"),
    ("stargazers_url", "/stargazers"),
    ("statuses_url", "/statuses/{sha}"),
    ("subscribers_url", "/subscribers"),
    ("subscription_url", "/subscription"),
    ("tags_url", "/tags"),
    ("teams_url", "/teams"),
    ("trees_url", "/git/trees{/sha}"),
];

/// A `minimal-repository`.
#[must_use]
pub fn minimal_repository(base: &str, owner: &str, repo: &str) -> Value {
    let api = format!("{base}/repos/{owner}/{repo}");
    let mut m = Map::new();
    m.insert("id".into(), json!(name_id(&format!("{owner}/{repo}"))));
    m.insert("node_id".into(), json!(format!("R_fake_{owner}_{repo}")));
    m.insert("name".into(), json!(repo));
    m.insert("full_name".into(), json!(format!("{owner}/{repo}")));
    m.insert(
        "owner".into(),
        simple_user(base, owner, name_id(owner), "Organization"),
    );
    m.insert("private".into(), json!(true));
    m.insert(
        "html_url".into(),
        json!(format!("{base}/_html/{owner}/{repo}")),
    );
    m.insert("description".into(), Value::Null);
    m.insert("fork".into(), json!(false));
    m.insert("url".into(), json!(api));
    for (key, suffix) in REPO_URL_SUFFIXES {
        m.insert((*key).into(), json!(format!("{api}{suffix}")));
    }
    Value::Object(m)
}

/// The `repository` of a webhook payload: a minimal repository plus the fields webhooks require.
#[must_use]
pub fn webhook_repository(base: &str, owner: &str, repo: &str) -> Value {
    let mut v = minimal_repository(base, owner, repo);
    let created = iso8601(1_600_000_000);
    if let Value::Object(m) = &mut v {
        let extra = json!({
            "clone_url": format!("{base}/_git/{owner}/{repo}.git"),
            "git_url": format!("git://fake/{owner}/{repo}.git"),
            "ssh_url": format!("git@fake:{owner}/{repo}.git"),
            "svn_url": format!("{base}/_html/{owner}/{repo}"),
            "mirror_url": null,
            "homepage": null,
            "language": null,
            "default_branch": "main",
            "forks": 0, "forks_count": 0,
            "open_issues": 0, "open_issues_count": 0,
            "stargazers_count": 0, "watchers": 0, "watchers_count": 0,
            "size": 0,
            "has_downloads": true, "has_issues": true, "has_projects": false,
            "has_wiki": false, "has_pages": false, "has_discussions": false,
            "archived": false, "disabled": false,
            "license": null,
            "topics": [],
            "visibility": "private",
            "created_at": created,
            "updated_at": created,
            "pushed_at": created,
        });
        if let Value::Object(e) = extra {
            m.extend(e);
        }
        // The fake plays github.com (the policies name https://github.com/…): a receiver takes
        // the job's host from `repository.html_url`, as it must to tell github.com's acme/web
        // from a GHES host's.
        m.insert(
            "html_url".into(),
            json!(format!("https://github.com/{owner}/{repo}")),
        );
    }
    v
}

/// A `runner` object (self-hosted runner).
#[must_use]
pub fn runner(r: &Runner, label_id: impl Fn(&str) -> u64) -> Value {
    let labels: Vec<Value> = r
        .labels
        .iter()
        .map(|l| {
            json!({
                "id": label_id(l),
                "name": l,
                "type": if is_read_only_label(l) { "read-only" } else { "custom" },
            })
        })
        .collect();
    let mut v = json!({
        "id": r.id,
        "runner_group_id": r.group_id,
        "name": r.name,
        "os": r.os(),
        "status": r.status().as_str(),
        "busy": r.busy(),
        "ephemeral": true,
        "labels": labels,
    });
    if let (Some(version), Value::Object(m)) = (&r.version, &mut v) {
        m.insert("version".into(), json!(version));
    }
    v
}

/// Labels GitHub applies itself and reports as `read-only`.
#[must_use]
pub fn is_read_only_label(label: &str) -> bool {
    [
        "self-hosted",
        "linux",
        "x64",
        "arm64",
        "arm",
        "windows",
        "macos",
    ]
    .iter()
    .any(|l| l.eq_ignore_ascii_case(label))
}

fn job_steps(job: &Job) -> Value {
    let status = job.status.as_str();
    if job.started_at.is_none() {
        return json!([]);
    }
    json!([{
        "name": "Set up job",
        "status": status,
        "conclusion": job.conclusion.map(|c| c.as_str()),
        "number": 1,
        "started_at": job.started_at.map(iso8601),
        "completed_at": job.completed_at.map(iso8601),
    }])
}

/// A `job` (REST `GET …/actions/jobs/{id}`), also the core of the webhook `workflow_job`.
#[must_use]
pub fn job(base: &str, job: &Job) -> Value {
    let repo_api = format!("{base}/repos/{}/{}", job.owner, job.repo);
    json!({
        "id": job.id,
        "run_id": job.run_id,
        "run_url": format!("{repo_api}/actions/runs/{}", job.run_id),
        "run_attempt": 1,
        "node_id": format!("CR_fake{}", job.id),
        "head_sha": job.head_sha,
        "url": format!("{repo_api}/actions/jobs/{}", job.id),
        "html_url": format!("{base}/_html/{}/{}/actions/runs/{}/job/{}", job.owner, job.repo, job.run_id, job.id),
        "status": job.status.as_str(),
        "conclusion": job.conclusion.map(|c| c.as_str()),
        "created_at": iso8601(job.created_at),
        "started_at": iso8601(job.started_at.unwrap_or(job.created_at)),
        "completed_at": job.completed_at.map(iso8601),
        "name": job.name,
        "steps": job_steps(job),
        "check_run_url": format!("{repo_api}/check-runs/{}", job.id),
        "labels": job.labels,
        "runner_id": job.runner.as_ref().map(|r| r.id),
        "runner_name": job.runner.as_ref().map(|r| r.name.clone()),
        "runner_group_id": job.runner.as_ref().map(|r| r.group_id),
        "runner_group_name": job.runner.as_ref().map(|r| r.group_name.clone()),
        "workflow_name": job.workflow_name,
        "head_branch": "main",
    })
}

/// A `workflow-run`; the fake has one job per run, so the run mirrors its job.
#[must_use]
pub fn workflow_run(base: &str, job: &Job) -> Value {
    let repo_api = format!("{base}/repos/{}/{}", job.owner, job.repo);
    let run_api = format!("{repo_api}/actions/runs/{}", job.run_id);
    let repo = minimal_repository(base, &job.owner, &job.repo);
    // A pull request's run names its head's repository: a fork's, or `null` once the fork is
    // deleted (GitHub's shape).
    let (event, head_repository) = match &job.pull_request {
        None => ("push", repo.clone()),
        Some(pr) => (
            "pull_request",
            pr.head_repository
                .as_deref()
                .and_then(|h| h.split_once('/'))
                .map_or(Value::Null, |(o, r)| minimal_repository(base, o, r)),
        ),
    };
    json!({
        "id": job.run_id,
        "name": job.workflow_name,
        "node_id": format!("WFR_fake{}", job.run_id),
        "head_branch": "main",
        "head_sha": job.head_sha,
        "path": ".github/workflows/fake.yml",
        "display_title": job.workflow_name,
        "run_number": job.run_id,
        "run_attempt": 1,
        "event": event,
        "status": job.status.as_str(),
        "conclusion": job.conclusion.map(|c| c.as_str()),
        "workflow_id": 1,
        "url": run_api,
        "html_url": format!("{base}/_html/{}/{}/actions/runs/{}", job.owner, job.repo, job.run_id),
        "pull_requests": [],
        "created_at": iso8601(job.created_at),
        "updated_at": iso8601(job.completed_at.or(job.started_at).unwrap_or(job.created_at)),
        "jobs_url": format!("{run_api}/jobs"),
        "logs_url": format!("{run_api}/logs"),
        "check_suite_url": format!("{repo_api}/check-suites/{}", job.run_id),
        "artifacts_url": format!("{run_api}/artifacts"),
        "cancel_url": format!("{run_api}/cancel"),
        "rerun_url": format!("{run_api}/rerun"),
        "workflow_url": format!("{repo_api}/actions/workflows/1"),
        "head_commit": {
            "id": job.head_sha,
            "tree_id": job.head_sha,
            "message": "fake commit",
            "timestamp": iso8601(job.created_at),
            "author": {"name": "fake", "email": "fake@example.invalid"},
            "committer": {"name": "fake", "email": "fake@example.invalid"},
        },
        "repository": repo,
        "head_repository": head_repository,
    })
}
