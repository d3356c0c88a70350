//! Tests of the simulated GitHub and the stand-in runner, each against a real `fake-github`
//! process. Every REST answer is checked against GitHub's official description and every
//! webhook against the official webhook schema.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use reqwest::Method;
use runner_manager_e2e::fake_github::conformance::Conformance;
use runner_manager_e2e::fake_github::jit::JitSettings;
use runner_manager_e2e::fake_github::webhooks::verify_signature;
use runner_manager_e2e::standin_runner::package;
use secrecy::SecretString;
use serde_json::{Value, json};
use sha2::Digest;

const FAKE_BIN: &str = env!("CARGO_BIN_EXE_fake-github");
const STANDIN_BIN: &str = env!("CARGO_BIN_EXE_standin-runner-listener");
const APP_ID: u64 = 4242;
const INSTALLATION: u64 = 77;
const ORG: &str = "octo-org";
const REPO: &str = "hello";
const PAT: &str = "ghp_fake_personal_access_token";
const HOOK_SECRET: &str = "hook-secret";

// ---------------------------------------------------------------------------------------------
// helpers

/// A `fake-github` process, killed when dropped.
struct FakeProcess {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl FakeProcess {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(FAKE_BIN)
            .arg("--package")
            .arg(shared_package())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start fake-github");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().expect("a first line").expect("readable");
        let base = first
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
            .to_owned();
        assert!(base.starts_with("http://127.0.0.1:"), "{base}");
        // Keep draining so the fake never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Self {
            child,
            base,
            _dir: dir,
        }
    }
}

impl Drop for FakeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The stand-in package, built once per test process (gzip is slow in debug builds) and served
/// by every fake this process starts.
fn shared_package() -> &'static Path {
    static PACKAGE: OnceLock<PathBuf> = OnceLock::new();
    PACKAGE.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("fake-github-package-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let spec = package::PackageSpec::small(PathBuf::from(STANDIN_BIN));
        package::build(&spec, &dir).unwrap().path
    })
}

fn conformance() -> &'static Conformance {
    static C: OnceLock<Conformance> = OnceLock::new();
    C.get_or_init(|| Conformance::load().unwrap_or_else(|e| panic!("{e}")))
}

struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Value,
}

/// The template and the path of a resource of the test's repository ([`ORG`]/[`REPO`]).
fn in_repo(template: &str, rest: &str) -> (String, String) {
    (
        format!("/repos/{{owner}}/{{repo}}/{template}"),
        format!("/repos/{ORG}/{REPO}/{rest}"),
    )
}

/// `template` with its one `{…}` parameter replaced by `value`.
fn instance(template: &str, value: impl std::fmt::Display) -> String {
    match (template.find('{'), template.find('}')) {
        (Some(open), Some(close)) => {
            format!("{}{value}{}", &template[..open], &template[close + 1..])
        }
        _ => template.to_owned(),
    }
}

/// The JSON answer to `request` (of the runner protocol, which the description does not cover).
async fn answered(request: reqwest::RequestBuilder) -> Value {
    request.send().await.unwrap().json().await.unwrap()
}

/// A REST client that holds every exchange to GitHub's description.
struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    fn new(base: &str) -> Self {
        Self {
            http: reqwest::Client::new(),
            base: base.to_owned(),
        }
    }

    /// Calls `path` (an instance of `template`) and checks the exchange against the description.
    async fn call(
        &self,
        method: Method,
        template: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> Answer {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.base))
            .header("accept", "application/vnd.github+json");
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = &body {
            req = req.json(b);
        }
        let resp = req.send().await.expect("send");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.expect("body");
        let value: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("a JSON body")
        };
        let c = conformance();
        if status != 204 {
            c.check_response(method.as_str(), template, status, &value)
                .unwrap_or_else(|e| panic!("{e}"));
        }
        if let (Some(b), true) = (&body, (200..300).contains(&status)) {
            c.check_request(method.as_str(), template, b)
                .unwrap_or_else(|e| panic!("{e}"));
        }
        Answer {
            status,
            headers,
            body: value,
        }
    }

    /// [`Self::call`] of `GET`.
    async fn get(&self, template: &str, path: &str, token: Option<&str>) -> Answer {
        self.call(Method::GET, template, path, token, None).await
    }

    /// [`Self::call`] of `POST` with the JSON `body`.
    async fn post(&self, template: &str, path: &str, token: Option<&str>, body: Value) -> Answer {
        self.call(Method::POST, template, path, token, Some(body))
            .await
    }

    /// [`Self::get`] of a resource of the test's repository: `rest` after `/repos/{owner}/{repo}/`
    /// in `template`, after `/repos/{ORG}/{REPO}/` in the path.
    async fn repo_get(&self, template: &str, rest: &str, token: Option<&str>) -> Answer {
        let (template, path) = in_repo(template, rest);
        self.get(&template, &path, token).await
    }

    /// A body-less `method` call on a resource of the test's repository, `template` with its one
    /// `{…}` parameter `value` ([`in_repo`]).
    async fn repo_at(
        &self,
        method: Method,
        template: &str,
        value: impl std::fmt::Display,
        token: Option<&str>,
    ) -> Answer {
        let (template, path) = in_repo(template, &instance(template, value));
        self.call(method, &template, &path, token, None).await
    }

    /// Registers a webhook to `url`, signed with [`HOOK_SECRET`].
    async fn hook(&self, url: &str) -> Value {
        let hook = json!({"url": url, "secret": HOOK_SECRET});
        self.admin(Method::POST, "webhooks", hook).await
    }

    /// Queues a `self-hosted` job in the test's repository.
    async fn queue_job(&self) -> Value {
        let job = json!({"owner": ORG, "repo": REPO, "labels": ["self-hosted"]});
        self.admin(Method::POST, "jobs", job).await
    }

    /// [`Self::call`] of `DELETE`.
    async fn delete(&self, template: &str, path: &str, token: Option<&str>) -> Answer {
        self.call(Method::DELETE, template, path, token, None).await
    }

    async fn admin(&self, method: Method, path: &str, body: Value) -> Value {
        let resp = self
            .http
            .request(method, format!("{}/_admin/{path}", self.base))
            .json(&body)
            .send()
            .await
            .expect("admin call");
        assert!(
            resp.status().is_success(),
            "admin {path}: {}",
            resp.status()
        );
        let bytes = resp.bytes().await.unwrap();
        if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        }
    }

    async fn admin_get(&self, path: &str) -> Value {
        self.http
            .get(format!("{}/_admin/{path}", self.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

/// Polls `check` until it yields, failing after `timeout` with `what`.
async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The App's RSA key pair (PEM): the harness's, made once per test process with openssl.
fn app_keys() -> &'static (String, String) {
    runner_manager_e2e::harness::github::app_keys().expect("openssl makes the App's key pair")
}

fn now() -> i64 {
    runner_manager_e2e::fake_github::clock::unix_now()
}

fn jwt(claims: &Value) -> String {
    let key = jsonwebtoken::EncodingKey::from_rsa_pem(app_keys().0.as_bytes()).unwrap();
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256),
        claims,
        &key,
    )
    .unwrap()
}

/// A valid App JWT, signed once per test process (signing is slow in debug builds); it stays
/// valid for nine minutes, longer than the whole suite runs.
fn good_jwt() -> String {
    static JWT: OnceLock<String> = OnceLock::new();
    JWT.get_or_init(|| jwt(&json!({"iat": now() - 60, "exp": now() + 540, "iss": APP_ID})))
        .clone()
}

/// A simulated GitHub with its App, installation and PAT ([`setup_auth`]), and a client of it.
async fn with_auth() -> (FakeProcess, Api) {
    let fake = FakeProcess::start();
    let api = Api::new(&fake.base);
    setup_auth(&api).await;
    (fake, api)
}

/// Registers the App and its installation on `ORG`, plus a PAT.
async fn setup_auth(api: &Api) {
    api.admin(
        Method::POST,
        "app",
        json!({"app_id": APP_ID, "public_key_pem": app_keys().1}),
    )
    .await;
    api.admin(
        Method::POST,
        "installations",
        json!({"id": INSTALLATION, "account": ORG}),
    )
    .await;
    api.admin(Method::POST, "pats", json!({"token": PAT})).await;
}

async fn installation_token(api: &Api) -> String {
    let a = api
        .call(
            Method::POST,
            "/app/installations/{installation_id}/access_tokens",
            &format!("/app/installations/{INSTALLATION}/access_tokens"),
            Some(&good_jwt()),
            None,
        )
        .await;
    assert_eq!(a.status, 201, "{}", a.body);
    a.body["token"].as_str().unwrap().to_owned()
}

const JIT_TEMPLATE: &str = "/repos/{owner}/{repo}/actions/runners/generate-jitconfig";

async fn generate_jit(api: &Api, token: &str, name: &str, labels: &[&str]) -> (u64, String) {
    let a = api
        .post(
            JIT_TEMPLATE,
            &format!("/repos/{ORG}/{REPO}/actions/runners/generate-jitconfig"),
            Some(token),
            json!({"name": name, "runner_group_id": 1, "labels": labels, "work_folder": "_work"}),
        )
        .await;
    assert_eq!(a.status, 201, "{}", a.body);
    (
        a.body["runner"]["id"].as_u64().unwrap(),
        a.body["encoded_jit_config"].as_str().unwrap().to_owned(),
    )
}

/// One delivery as received: headers and raw body.
type Received = (HeaderMap, Vec<u8>);

/// A webhook receiver on a loopback port that records what it gets.
#[derive(Clone, Default)]
struct Receiver {
    got: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    async fn start() -> (Self, String) {
        let r = Self::default();
        let state = r.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(
                |axum::extract::State(s): axum::extract::State<Receiver>,
                 headers: HeaderMap,
                 body: axum::body::Bytes| async move {
                    s.got.lock().unwrap().push((headers, body.to_vec()));
                    axum::http::StatusCode::OK
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app.with_state(state)).await });
        (r, url)
    }

    fn received(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }

    async fn wait_count(&self, n: usize) -> Vec<Received> {
        wait_for(
            &format!("{n} webhook deliveries"),
            Duration::from_secs(20),
            || {
                let got = self.received();
                async move { (got.len() >= n).then_some(got) }
            },
        )
        .await
    }
}

/// Checks one delivery the way a receiver must, and returns its GUID and parsed body.
fn verify_delivery(headers: &HeaderMap, body: &[u8]) -> (String, Value) {
    let h = |k: &str| {
        headers
            .get(k)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    assert_eq!(h("x-github-event"), "workflow_job");
    let guid = h("x-github-delivery");
    assert!(
        uuid::Uuid::parse_str(&guid).is_ok(),
        "delivery GUID {guid:?}"
    );
    let secret = SecretString::from(HOOK_SECRET.to_owned());
    assert!(
        verify_signature(&secret, body, &h("x-hub-signature-256")),
        "signature must verify"
    );
    let wrong = SecretString::from("other".to_owned());
    assert!(!verify_signature(&wrong, body, &h("x-hub-signature-256")));
    let value: Value = serde_json::from_slice(body).unwrap();
    conformance()
        .check_webhook(&value)
        .unwrap_or_else(|e| panic!("{e}"));
    (guid, value)
}

/// A process's output collected on a thread.
fn collect(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

struct ListenerRun {
    child: Child,
    stdout: Option<std::thread::JoinHandle<String>>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl ListenerRun {
    fn start(root: &Path, jit: &str, extra_env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(root.join("bin/Runner.Listener"))
            .arg("run")
            .env("ACTIONS_RUNNER_INPUT_JITCONFIG", jit)
            .envs(extra_env.iter().copied())
            .current_dir(root)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start Runner.Listener");
        let stdout = Some(collect(child.stdout.take().unwrap()));
        let stderr = Some(collect(child.stderr.take().unwrap()));
        Self {
            child,
            stdout,
            stderr,
        }
    }

    /// Waits for the exit; returns (code, stdout, stderr).
    async fn finish(&mut self) -> (i32, String, String) {
        let status = wait_for("the listener to exit", Duration::from_secs(60), || {
            let s = self.child.try_wait().unwrap();
            async move { s }
        })
        .await;
        let out = self.stdout.take().unwrap().join().unwrap();
        let err = self.stderr.take().unwrap().join().unwrap();
        (status.code().unwrap_or(-1), out, err)
    }
}

impl Drop for ListenerRun {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Downloads the package the fake publishes as the latest release, checks its digest, unpacks it.
async fn install_runner(api: &Api, dest: &Path) {
    let rel = api
        .get(
            "/repos/{owner}/{repo}/releases/latest",
            "/repos/actions/runner/releases/latest",
            None,
        )
        .await;
    assert_eq!(rel.status, 200);
    let asset = &rel.body["assets"][0];
    let name = asset["name"].as_str().unwrap();
    assert!(name.starts_with("actions-runner-linux-x64-") && name.ends_with(".tar.gz"));
    let bytes = api
        .http
        .get(asset["browser_download_url"].as_str().unwrap())
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let digest = format!("sha256:{}", hex::encode(sha2::Sha256::digest(&bytes)));
    assert_eq!(asset["digest"].as_str().unwrap(), digest);
    let tarball = dest.join(name);
    std::fs::write(&tarball, &bytes).unwrap();
    let root = dest.join("runner");
    std::fs::create_dir_all(&root).unwrap();
    package::unpack(&tarball, &root).unwrap();
    for f in [
        "bin/Runner.Listener",
        "bin/Runner.Worker",
        "run.sh",
        "config.sh",
    ] {
        assert!(root.join(f).is_file(), "package lacks {f}");
    }
}

fn diag_logs(root: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(dir) = std::fs::read_dir(root.join("_diag")) else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            // <Prefix>_yyyyMMdd-HHmmss-utc.log
            n.starts_with(&format!("{prefix}_"))
                && n.ends_with("-utc.log")
                && n.len() == prefix.len() + 1 + 15 + 8
        })
        .collect()
}

async fn runner_count(api: &Api, token: &str) -> u64 {
    let a = api
        .repo_get("actions/runners", "actions/runners", Some(token))
        .await;
    assert_eq!(a.status, 200);
    a.body["total_count"].as_u64().unwrap()
}

async fn job_state(api: &Api, token: &str, job_id: u64) -> Value {
    let a = api
        .repo_at(Method::GET, "actions/jobs/{job_id}", job_id, Some(token))
        .await;
    assert_eq!(a.status, 200);
    a.body
}

// ---------------------------------------------------------------------------------------------
// the "done when" scenario

#[tokio::test]
async fn a_jit_runner_takes_one_job_reports_it_and_leaves() {
    let (_fake, api) = with_auth().await;
    let (receiver, hook_url) = Receiver::start().await;
    api.hook(&hook_url).await;
    let token = installation_token(&api).await;

    let dir = tempfile::tempdir().unwrap();
    install_runner(&api, dir.path()).await;
    let root = dir.path().join("runner");

    let (runner_id, jit) = generate_jit(
        &api,
        &token,
        "rm-1",
        &["self-hosted", "linux", "x64", "rm-test"],
    )
    .await;
    let mut listener = ListenerRun::start(&root, &jit, &[]);

    let runner_path = format!("/repos/{ORG}/{REPO}/actions/runners/{runner_id}");
    wait_for("the runner online", Duration::from_secs(30), || {
        let api = &api;
        let token = &token;
        let path = &runner_path;
        async move {
            let a = api
                .get(
                    "/repos/{owner}/{repo}/actions/runners/{runner_id}",
                    path,
                    Some(token),
                )
                .await;
            (a.body["status"] == "online").then_some(())
        }
    })
    .await;

    let queued = api
        .admin(
            Method::POST,
            "jobs",
            json!({
                "owner": ORG, "repo": REPO, "labels": ["self-hosted", "rm-test"], "name": "build",
                "behaviour": {"write_files": [{"path": "src/out.txt", "bytes": 1000}]},
            }),
        )
        .await;
    let job_id = queued["job_id"].as_u64().unwrap();

    let job = wait_for("the job completed", Duration::from_secs(30), || {
        let api = &api;
        let token = &token;
        async move {
            let j = job_state(api, token, job_id).await;
            (j["status"] == "completed").then_some(j)
        }
    })
    .await;
    assert_eq!(job["conclusion"], "success");
    assert_eq!(job["runner_id"].as_u64(), Some(runner_id));
    assert_eq!(job["runner_name"], "rm-1");

    let (code, stdout, stderr) = listener.finish().await;
    assert_eq!(code, 0, "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("Listening for Jobs"), "{stdout}");
    assert!(
        !stdout.contains(&jit) && !stderr.contains(&jit),
        "the JIT must never be printed"
    );

    assert_eq!(
        runner_count(&api, &token).await,
        0,
        "the ephemeral runner is gone"
    );
    let gone = api
        .get(
            "/repos/{owner}/{repo}/actions/runners/{runner_id}",
            &runner_path,
            Some(&token),
        )
        .await;
    assert_eq!(gone.status, 404);

    let runner_logs = diag_logs(&root, "Runner");
    let worker_logs = diag_logs(&root, "Worker");
    assert_eq!(runner_logs.len(), 1, "one Runner_*.log");
    assert_eq!(worker_logs.len(), 1, "one Worker_*.log");
    for log in runner_logs.iter().chain(&worker_logs) {
        let text = std::fs::read_to_string(log).unwrap();
        assert!(!text.is_empty());
        assert!(!text.contains(&jit));
    }
    assert_eq!(
        std::fs::metadata(root.join("_work/src/out.txt"))
            .unwrap()
            .len(),
        1000
    );

    let got = receiver.wait_count(3).await;
    let mut guids = BTreeSet::new();
    let mut actions = Vec::new();
    for (headers, body) in &got {
        let (guid, value) = verify_delivery(headers, body);
        guids.insert(guid);
        assert_eq!(value["workflow_job"]["id"].as_u64(), Some(job_id));
        actions.push(value["action"].as_str().unwrap().to_owned());
    }
    assert_eq!(guids.len(), 3, "every delivery has its own GUID");
    assert_eq!(actions, ["queued", "in_progress", "completed"]);
    let completed: Value = serde_json::from_slice(&got[2].1).unwrap();
    assert_eq!(completed["workflow_job"]["conclusion"], "success");
    assert_eq!(completed["workflow_job"]["runner_name"], "rm-1");

    // The same JIT cannot start a second runner.
    let mut again = ListenerRun::start(&root, &jit, &[]);
    let (code, _, _) = again.finish().await;
    assert_ne!(code, 0, "a used (and deleted) JIT must not connect");
}

// ---------------------------------------------------------------------------------------------
// authentication

#[tokio::test]
async fn app_jwts_are_verified_and_tokens_are_scoped() {
    let (_fake, api) = with_auth().await;
    let tokens_path = format!("/app/installations/{INSTALLATION}/access_tokens");
    let t = "/app/installations/{installation_id}/access_tokens";
    let other_key = {
        let out = Command::new("openssl")
            .args(["genrsa", "2048"])
            .stderr(Stdio::null())
            .output()
            .unwrap();
        jsonwebtoken::EncodingKey::from_rsa_pem(&out.stdout).unwrap()
    };
    let wrong_key = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256),
        &json!({"iat": now() - 60, "exp": now() + 540, "iss": APP_ID}),
        &other_key,
    )
    .unwrap();
    let refused = [
        (
            "expired",
            jwt(&json!({"iat": now() - 1200, "exp": now() - 600, "iss": APP_ID})),
        ),
        (
            "too long",
            jwt(&json!({"iat": now() - 60, "exp": now() + 3600, "iss": APP_ID})),
        ),
        (
            "issued in the future",
            jwt(&json!({"iat": now() + 600, "exp": now() + 900, "iss": APP_ID})),
        ),
        (
            "wrong issuer",
            jwt(&json!({"iat": now() - 60, "exp": now() + 540, "iss": 1})),
        ),
        ("wrong key", wrong_key),
        ("not a JWT", "garbage".to_owned()),
    ];
    for (what, token) in refused {
        let a = api
            .call(Method::POST, t, &tokens_path, Some(&token), None)
            .await;
        assert_eq!(a.status, 401, "{what}: {}", a.body);
    }
    let none = api.call(Method::POST, t, &tokens_path, None, None).await;
    assert_eq!(none.status, 401);
    // `iss` may also be the App id as a string.
    let as_string = jwt(&json!({"iat": now() - 60, "exp": now() + 540, "iss": APP_ID.to_string()}));
    assert_eq!(
        api.call(Method::POST, t, &tokens_path, Some(&as_string), None)
            .await
            .status,
        201
    );
    let unknown = api
        .call(
            Method::POST,
            t,
            "/app/installations/999/access_tokens",
            Some(&good_jwt()),
            None,
        )
        .await;
    assert_eq!(unknown.status, 404);

    let inst = api
        .repo_get("installation", "installation", Some(&good_jwt()))
        .await;
    assert_eq!(inst.status, 200);
    assert_eq!(inst.body["id"].as_u64(), Some(INSTALLATION));
    let org_inst = api
        .get(
            "/orgs/{org}/installation",
            &format!("/orgs/{ORG}/installation"),
            Some(&good_jwt()),
        )
        .await;
    assert_eq!(org_inst.status, 200);

    let token = installation_token(&api).await;
    assert!(token.starts_with("ghs_"));
    let list = "/repos/{owner}/{repo}/actions/runners";
    let own = format!("/repos/{ORG}/{REPO}/actions/runners");
    let elsewhere = "/repos/someone-else/x/actions/runners";
    let jwt = good_jwt();
    for (path, credential, status, why) in [
        (
            own.as_str(),
            Some(token.as_str()),
            200,
            "the installation's own account",
        ),
        (
            elsewhere,
            Some(&token),
            403,
            "an installation reaches only its own account",
        ),
        (
            elsewhere,
            Some(PAT),
            200,
            "a PAT reaches what its owner can",
        ),
        (&own, None, 401, "no credential"),
        (&own, Some("ghs_nope"), 401, "an unknown token"),
        // The App JWT is not a credential for the runner endpoints.
        (&own, Some(&jwt), 401, "the App JWT"),
    ] {
        assert_eq!(
            api.get(list, path, credential).await.status,
            status,
            "{why}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// runners: pagination, JIT rules, busy delete

#[tokio::test]
async fn runner_lists_paginate_with_link_headers_and_filter_by_name() {
    let (fake, api) = with_auth().await;
    for i in 0..5 {
        generate_jit(&api, PAT, &format!("r-{i}"), &["self-hosted"]).await;
    }
    let t = "/repos/{owner}/{repo}/actions/runners";
    let p = format!("/repos/{ORG}/{REPO}/actions/runners");
    let mut seen = Vec::new();
    let mut next = Some(format!("{p}?per_page=2"));
    let mut pages = 0;
    while let Some(path) = next.take() {
        let a = api.get(t, &path, Some(PAT)).await;
        assert_eq!(a.status, 200);
        assert_eq!(a.body["total_count"], 5);
        pages += 1;
        for r in a.body["runners"].as_array().unwrap() {
            seen.push(r["name"].as_str().unwrap().to_owned());
        }
        let link = a.headers.get("link").unwrap().to_str().unwrap().to_owned();
        assert!(link.contains("rel=\"last\""), "{link}");
        next = link
            .split(", ")
            .find(|l| l.ends_with("rel=\"next\""))
            .map(|l| {
                let url = l.trim_start_matches('<').split('>').next().unwrap();
                url.trim_start_matches(&fake.base).to_owned()
            });
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, ["r-0", "r-1", "r-2", "r-3", "r-4"]);

    let all = api.get(t, &p, Some(PAT)).await;
    assert!(all.headers.get("link").is_none(), "one page needs no Link");
    assert_eq!(all.body["runners"].as_array().unwrap().len(), 5);
    let named = api.get(t, &format!("{p}?name=r-3"), Some(PAT)).await;
    assert_eq!(named.body["total_count"], 1);
    assert_eq!(named.body["runners"][0]["name"], "r-3");
    assert_eq!(named.body["runners"][0]["status"], "offline");
}

#[tokio::test]
async fn jit_registration_rules_and_one_shot_use() {
    let (fake, api) = with_auth().await;
    let path = format!("/repos/{ORG}/{REPO}/actions/runners/generate-jitconfig");
    let (_, jit) = generate_jit(&api, PAT, "dup", &["self-hosted"]).await;

    let g = api
        .admin(
            Method::POST,
            "runner-groups",
            json!({"owner": format!("orgs/{ORG}"), "name": "locked", "usable": false}),
        )
        .await;
    for (body, status, why) in [
        (
            json!({"name": "dup", "runner_group_id": 1, "labels": ["x"]}),
            409,
            "a name taken",
        ),
        (
            json!({"name": "n", "labels": ["x"]}),
            422,
            "no runner group",
        ),
        (
            json!({"name": "n", "runner_group_id": 99, "labels": ["x"]}),
            404,
            "an unknown group",
        ),
        (
            json!({"name": "n", "runner_group_id": g["id"], "labels": ["x"]}),
            403,
            "a locked group",
        ),
        (
            json!({"name": "n", "runner_group_id": 1, "labels": []}),
            422,
            "no labels",
        ),
    ] {
        let answer = api.post(JIT_TEMPLATE, &path, Some(PAT), body).await;
        assert_eq!(answer.status, status, "{why}");
    }

    // The JIT carries the runner's real settings files, and opens exactly one session.
    let settings = JitSettings::decode(&SecretString::from(jit.clone())).unwrap();
    assert!(settings.runner.ephemeral);
    assert_eq!(settings.runner.agent_name, "dup");
    let session = json!({
        "client_id": settings.credentials.data.client_id,
        "client_secret": settings.rsa_params.d,
        "version": package::STANDIN_VERSION,
    });
    let url = format!("{}/_runner/sessions", fake.base);
    let first = api.http.post(&url).json(&session).send().await.unwrap();
    assert_eq!(first.status(), 201);
    let second = api.http.post(&url).json(&session).send().await.unwrap();
    assert_eq!(second.status(), 409, "a JIT is good for one use");

    // The mint record (what the real node's checks join with the journal) says the one
    // registration made, both session openings, and that it stays after the runner is deleted.
    let mints = api.admin_get("mints").await;
    let mints = mints.as_array().unwrap();
    assert_eq!(mints.len(), 1, "only the first mint registered: {mints:?}");
    assert_eq!(mints[0]["name"], "dup");
    assert_eq!(mints[0]["sessions"], 2, "{mints:?}");
    assert_eq!(mints[0]["registered"], true);
    assert!(
        !mints[0].to_string().contains(&jit[..40]),
        "the mint record carries no JIT"
    );
    let id = mints[0]["id"].as_u64().unwrap();
    let deleted = api
        .repo_at(Method::DELETE, "actions/runners/{runner_id}", id, Some(PAT))
        .await;
    assert_eq!(deleted.status, 204);
    let mints = api.admin_get("mints").await;
    assert_eq!(mints[0]["id"], id);
    assert_eq!(mints[0]["registered"], false, "{mints}");
}

#[tokio::test]
async fn a_busy_runner_cannot_be_deleted() {
    let (fake, api) = with_auth().await;
    let (id, jit) = generate_jit(&api, PAT, "busy", &["self-hosted"]).await;
    let settings = JitSettings::decode(&SecretString::from(jit)).unwrap();
    let session = api
        .http
        .post(format!("{}/_runner/sessions", fake.base))
        .json(&json!({
            "client_id": settings.credentials.data.client_id,
            "client_secret": settings.rsa_params.d,
            "version": package::STANDIN_VERSION,
        }));
    let session = answered(session).await;
    let session = session["session_token"].as_str().unwrap().to_owned();
    let queued = api.queue_job().await;
    let next = format!("{}/_runner/jobs/next?wait_secs=5", fake.base);
    let job = answered(api.http.get(next).bearer_auth(&session)).await;
    assert_eq!(job["job_id"], queued["job_id"]);

    let t = "/repos/{owner}/{repo}/actions/runners/{runner_id}";
    let p = format!("/repos/{ORG}/{REPO}/actions/runners/{id}");
    let busy = api.get(t, &p, Some(PAT)).await;
    assert_eq!(busy.body["busy"], true);
    let refused = api.delete(t, &p, Some(PAT)).await;
    assert_eq!(refused.status, 422);
    let runs = api
        .repo_get("actions/runs", "actions/runs?status=in_progress", Some(PAT))
        .await;
    assert_eq!(runs.body["total_count"], 1);

    let done = api
        .http
        .post(format!(
            "{}/_runner/jobs/{}/complete",
            fake.base, job["job_id"]
        ))
        .bearer_auth(&session)
        .json(&json!({"conclusion": "success"}))
        .send()
        .await
        .unwrap();
    assert_eq!(done.status(), 204);
    let deleted = api.delete(t, &p, Some(PAT)).await;
    assert_eq!(
        deleted.status, 404,
        "the ephemeral runner left with its job"
    );

    // An idle runner deletes with 204.
    let (idle, _) = generate_jit(&api, PAT, "idle", &["self-hosted"]).await;
    let p = format!("/repos/{ORG}/{REPO}/actions/runners/{idle}");
    assert_eq!(api.delete(t, &p, Some(PAT)).await.status, 204);
    assert_eq!(api.delete(t, &p, Some(PAT)).await.status, 404);
}

// ---------------------------------------------------------------------------------------------
// faults, counters, rate limits

#[tokio::test]
async fn injected_faults_and_counters() {
    let (fake, api) = with_auth().await;
    let t = "/repos/{owner}/{repo}/actions/runners";
    let p = format!("/repos/{ORG}/{REPO}/actions/runners");
    api.admin(
        Method::POST,
        "faults",
        json!({"endpoint": "list_runners", "count": 2, "status": 503, "retry_after_secs": 3}),
    )
    .await;
    for _ in 0..2 {
        let a = api.get(t, &p, Some(PAT)).await;
        assert_eq!(a.status, 503);
        assert_eq!(a.headers.get("retry-after").unwrap(), "3");
    }
    assert_eq!(api.get(t, &p, Some(PAT)).await.status, 200);

    api.admin(
        Method::POST,
        "faults",
        json!({"endpoint": "list_runners", "drop_connection": true}),
    )
    .await;
    let dropped = async {
        let resp = api
            .http
            .get(format!("{}{p}", fake.base))
            .bearer_auth(PAT)
            .send()
            .await?;
        resp.bytes().await
    }
    .await;
    assert!(
        dropped.is_err(),
        "a dropped connection gives no complete answer"
    );

    api.admin(
        Method::POST,
        "faults",
        json!({"endpoint": "list_runners", "latency_ms": 400}),
    )
    .await;
    let started = Instant::now();
    assert_eq!(api.get(t, &p, Some(PAT)).await.status, 200);
    assert!(started.elapsed() >= Duration::from_millis(400));

    api.admin(
        Method::POST,
        "faults",
        json!({"endpoint": "generate_jitconfig", "status": 429, "retry_after_secs": 1}),
    )
    .await;
    let a = api
        .post(
            JIT_TEMPLATE,
            &format!("/repos/{ORG}/{REPO}/actions/runners/generate-jitconfig"),
            Some(PAT),
            json!({"name": "x", "runner_group_id": 1, "labels": ["x"]}),
        )
        .await;
    assert_eq!(a.status, 429);

    let counters = api.admin_get("counters").await;
    assert_eq!(counters["list_runners"]["503"], 2);
    assert_eq!(counters["list_runners"]["200"], 2);
    assert_eq!(counters["list_runners"]["dropped"], 1);
    assert_eq!(counters["generate_jitconfig"]["429"], 1);
}

#[tokio::test]
async fn rate_limits_are_reported_and_enforced_per_bucket() {
    let (_fake, api) = with_auth().await;
    api.admin(
        Method::POST,
        "rate-limits",
        json!({"resource": "core", "limit": 3, "exceeded_status": "429"}),
    )
    .await;
    let t = "/repos/{owner}/{repo}/actions/runners";
    let p = format!("/repos/{ORG}/{REPO}/actions/runners");
    for left in [2, 1, 0] {
        let a = api.get(t, &p, Some(PAT)).await;
        assert_eq!(a.status, 200);
        let h = |k: &str| a.headers.get(k).unwrap().to_str().unwrap().to_owned();
        assert_eq!(h("x-ratelimit-limit"), "3");
        assert_eq!(h("x-ratelimit-remaining"), left.to_string());
        assert_eq!(h("x-ratelimit-resource"), "core");
        assert!(h("x-ratelimit-reset").parse::<i64>().unwrap() > now());
    }
    let over = api.get(t, &p, Some(PAT)).await;
    assert_eq!(over.status, 429);
    assert!(over.headers.get("retry-after").is_some());
    // Registration calls draw from their own bucket.
    let (_, _) = generate_jit(&api, PAT, "still-ok", &["x"]).await;
    let rl = api.get("/rate_limit", "/rate_limit", Some(PAT)).await;
    assert_eq!(rl.status, 200);
    assert_eq!(rl.body["resources"]["core"]["remaining"], 0);
    assert_eq!(
        rl.body["resources"]["actions_runner_registration"]["used"],
        1
    );
}

// ---------------------------------------------------------------------------------------------
// webhooks

#[tokio::test]
async fn webhook_deliveries_can_be_dropped_duplicated_and_redelivered() {
    let fake = FakeProcess::start();
    let api = Api::new(&fake.base);
    let (receiver, url) = Receiver::start().await;
    api.hook(&url).await;
    api.admin(
        Method::PUT,
        "webhooks/controls",
        json!({"drop_next": 1, "duplicate_next": 1}),
    )
    .await;
    api.admin(
        Method::POST,
        "jobs",
        json!({"owner": ORG, "repo": REPO, "labels": ["a"]}),
    )
    .await;
    api.admin(
        Method::POST,
        "jobs",
        json!({"owner": ORG, "repo": REPO, "labels": ["b"]}),
    )
    .await;
    // First delivery dropped, second sent twice with one GUID.
    let got = receiver.wait_count(2).await;
    let (g1, v1) = verify_delivery(&got[0].0, &got[0].1);
    let (g2, _) = verify_delivery(&got[1].0, &got[1].1);
    assert_eq!(g1, g2, "a duplicate carries the same GUID");
    assert_eq!(v1["workflow_job"]["labels"], json!(["b"]));

    let deliveries = api.admin_get("deliveries").await;
    let dropped = deliveries
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["dropped"] == true)
        .unwrap();
    let guid = dropped["guid"].as_str().unwrap();
    api.admin(
        Method::POST,
        &format!("deliveries/{guid}/redeliver"),
        json!({}),
    )
    .await;
    let got = receiver.wait_count(3).await;
    let (g3, v3) = verify_delivery(&got[2].0, &got[2].1);
    assert_eq!(g3, guid, "a redelivery keeps its GUID");
    assert_eq!(v3["workflow_job"]["labels"], json!(["a"]));
    assert_eq!(v3["action"], "queued");

    // A delayed delivery arrives, later.
    api.admin(Method::PUT, "webhooks/controls", json!({"delay_ms": 300}))
        .await;
    let sent = Instant::now();
    api.admin(
        Method::POST,
        "jobs",
        json!({"owner": ORG, "repo": REPO, "labels": ["c"]}),
    )
    .await;
    receiver.wait_count(4).await;
    assert!(sent.elapsed() >= Duration::from_millis(300));
}

// ---------------------------------------------------------------------------------------------
// the other endpoints, at every scope, against the description

#[tokio::test]
async fn every_scope_and_endpoint_answers_in_githubs_shape() {
    let (_fake, api) = with_auth().await;
    for (prefix, scope) in [
        ("/repos/{owner}/{repo}", format!("/repos/{ORG}/{REPO}")),
        ("/orgs/{org}", format!("/orgs/{ORG}")),
        ("/enterprises/{enterprise}", "/enterprises/acme".to_owned()),
    ] {
        // One scope's runner endpoint: the template and the concrete path share the tail.
        let runners = |method: Method, tail_template: &str, tail: &str, body: Option<Value>| {
            let template = format!("{prefix}/actions/runners{tail_template}");
            let path = format!("{scope}/actions/runners{tail}");
            let api = &api;
            async move { api.call(method, &template, &path, Some(PAT), body).await }
        };
        let jit = runners(
            Method::POST,
            "/generate-jitconfig",
            "/generate-jitconfig",
            Some(json!({"name": "s", "runner_group_id": 1, "labels": ["self-hosted", "gpu"]})),
        )
        .await;
        assert_eq!(jit.status, 201, "{scope}");
        assert_eq!(jit.body["runner"]["labels"][1]["type"], "custom");
        let id = jit.body["runner"]["id"].as_u64().unwrap();
        let one = format!("/{id}");
        let list = runners(Method::GET, "", "", None).await;
        assert_eq!(list.body["total_count"], 1, "{scope}");
        let get = runners(Method::GET, "/{runner_id}", &one, None).await;
        assert_eq!(get.status, 200);
        let reg = runners(
            Method::POST,
            "/registration-token",
            "/registration-token",
            None,
        )
        .await;
        assert_eq!(reg.status, 201);
        let dl = runners(Method::GET, "/downloads", "/downloads", None).await;
        assert_eq!(dl.status, 200);
        assert_eq!(dl.body[0]["os"], "linux");
        let del = runners(Method::DELETE, "/{runner_id}", &one, None).await;
        assert_eq!(del.status, 204);
    }
    for (t, p) in [
        (
            "/orgs/{org}/actions/runner-groups",
            format!("/orgs/{ORG}/actions/runner-groups"),
        ),
        (
            "/enterprises/{enterprise}/actions/runner-groups",
            "/enterprises/acme/actions/runner-groups".to_owned(),
        ),
    ] {
        let g = api.get(t, &p, Some(PAT)).await;
        assert_eq!(g.status, 200);
        assert_eq!(g.body["runner_groups"][0]["default"], true);
    }
    let queued = api.queue_job().await;
    let runs = api
        .repo_get("actions/runs", "actions/runs?status=queued", Some(PAT))
        .await;
    assert_eq!(runs.body["total_count"], 1);
    let run_id = runs.body["workflow_runs"][0]["id"].as_u64().unwrap();
    assert_eq!(Some(run_id), queued["run_id"].as_u64());
    let jobs = api
        .repo_at(Method::GET, "actions/runs/{run_id}/jobs", run_id, Some(PAT))
        .await;
    assert_eq!(jobs.body["jobs"][0]["status"], "queued");
    let job = job_state(&api, PAT, queued["job_id"].as_u64().unwrap()).await;
    assert_eq!(job["labels"], json!(["self-hosted"]));
    let rl = api.get("/rate_limit", "/rate_limit", None).await;
    assert_eq!(rl.status, 200);
}

// ---------------------------------------------------------------------------------------------
// hostile and failing job behaviours, and the deprecated-version exit

#[tokio::test]
async fn job_behaviours_hostile_workspace_orphans_and_exit_codes() {
    let (_fake, api) = with_auth().await;
    let dir = tempfile::tempdir().unwrap();
    install_runner(&api, dir.path()).await;
    let root = dir.path().join("runner");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();

    let (_, jit) = generate_jit(&api, PAT, "hostile", &["self-hosted", "hostile"]).await;
    let queued = api
        .admin(
            Method::POST,
            "jobs",
            json!({
                "owner": ORG, "repo": REPO, "labels": ["hostile"],
                "behaviour": {
                    "duration_ms": 50,
                    "fifo_in_tmp": true,
                    "orphan_child_secs": 30,
                    "symlink_work_to": elsewhere,
                    "worker_exit_code": 3,
                    "listener_exit_code": 7,
                },
            }),
        )
        .await;
    let tmp_env = tmp.to_string_lossy().into_owned();
    let mut listener = ListenerRun::start(&root, &jit, &[("TMPDIR", &tmp_env)]);
    let (code, out, err) = listener.finish().await;
    assert_eq!(code, 7, "stdout: {out}\nstderr: {err}");
    let job = job_state(&api, PAT, queued["job_id"].as_u64().unwrap()).await;
    assert_eq!(job["status"], "completed");
    assert_eq!(job["conclusion"], "failure");
    let work = std::fs::symlink_metadata(root.join("_work")).unwrap();
    assert!(
        work.file_type().is_symlink(),
        "_work was replaced by a symlink"
    );
    use std::os::unix::fs::FileTypeExt;
    let fifo = std::fs::symlink_metadata(tmp.join("standin-job.fifo")).unwrap();
    assert!(fifo.file_type().is_fifo());
    let pid: u32 = std::fs::read_to_string(root.join("_diag/orphan.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        Path::new(&format!("/proc/{pid}")).exists(),
        "the child outlives the listener"
    );
    // End the orphan this test started.
    let _ = Command::new("kill").arg(pid.to_string()).status();

    // A version the service no longer accepts: exit 7 when asked for it, 1 otherwise.
    api.admin(
        Method::PUT,
        "minimum-runner-version",
        json!({"version": "9.0.0"}),
    )
    .await;
    let (_, jit) = generate_jit(&api, PAT, "old-1", &["self-hosted"]).await;
    let mut old = ListenerRun::start(
        &root,
        &jit,
        &[("ACTIONS_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE", "1")],
    );
    assert_eq!(old.finish().await.0, 7);
    let (_, jit) = generate_jit(&api, PAT, "old-2", &["self-hosted"]).await;
    let mut old = ListenerRun::start(&root, &jit, &[]);
    assert_eq!(old.finish().await.0, 1);

    // Anything but exactly `run` is refused, and no JIT means no start.
    let bad = Command::new(root.join("bin/Runner.Listener"))
        .arg("configure")
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(1));
    let none = Command::new(root.join("bin/Runner.Listener"))
        .arg("run")
        .env_remove("ACTIONS_RUNNER_INPUT_JITCONFIG")
        .output()
        .unwrap();
    assert_eq!(none.status.code(), Some(1));
}

// ---------------------------------------------------------------------------------------------
// the conformance check itself

#[test]
fn the_conformance_check_rejects_what_github_would_not_send() {
    let c = conformance();
    let t = "/repos/{owner}/{repo}/actions/runners";
    let good = json!({"total_count": 1, "runners": [
        {"id": 1, "name": "r", "os": "linux", "status": "online", "busy": false, "labels": [{"name": "x"}]}
    ]});
    c.check_response("GET", t, 200, &good).unwrap();
    let no_busy = json!({"total_count": 1, "runners": [
        {"id": 1, "name": "r", "os": "linux", "status": "online", "labels": []}
    ]});
    assert!(c.check_response("GET", t, 200, &no_busy).is_err());
    let wrong_type = json!({"total_count": "1", "runners": []});
    assert!(c.check_response("GET", t, 200, &wrong_type).is_err());
    let bad_request = json!({"name": "n", "runner_group_id": 1, "labels": []});
    assert!(c.check_request("POST", JIT_TEMPLATE, &bad_request).is_err());
    assert!(c.check_webhook(&json!({"action": "queued"})).is_err());
}
