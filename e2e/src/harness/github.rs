//! A simulated GitHub for scenario tests: `fake-github` served in this process on a loopback
//! port, with a GitHub App (its RSA key made by the system's openssl), an installation and a
//! PAT registered through the admin API.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use runner_manager_crds::target::GitHubTarget;
use runner_manager_operator::github::auth::Credentials;
use runner_manager_operator::github::retry::RetryPolicy;
use runner_manager_operator::github::{GitHubClient, GitHubConfig};
use secrecy::ExposeSecret;
use serde_json::{Value, json};

use crate::fake_github::{self, RunningFake};

/// The App's id on the fake.
pub const APP_ID: u64 = 4242;
/// The App's installation on the fake's `acme` organization.
pub const INSTALLATION_ID: u64 = 777;
/// The organization (and owner of the repository `acme/web`).
pub const ORG: &str = "acme";
/// A personal access token the fake accepts everywhere.
pub const PAT: &str = "ghp_fakepersonalaccesstoken0000000001";

/// Why the simulated GitHub could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum FakeError {
    #[error("openssl: {0}")]
    Openssl(String),
    #[error("starting fake-github: {0}")]
    Start(#[from] std::io::Error),
    #[error("admin API {0}: {1}")]
    Admin(String, String),
}

/// The App's RSA key pair (private PEM, public PEM), made once per process with openssl.
pub fn app_keys() -> Result<&'static (String, String), FakeError> {
    static KEYS: OnceLock<Result<(String, String), String>> = OnceLock::new();
    KEYS.get_or_init(|| {
        let private = Command::new("openssl")
            .args(["genrsa", "2048"])
            .stderr(Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        if !private.status.success() {
            return Err("openssl genrsa failed".into());
        }
        let mut child = Command::new("openssl")
            .args(["rsa", "-pubout"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| e.to_string())?;
        if let Some(mut stdin) = child.stdin.take() {
            std::io::Write::write_all(&mut stdin, &private.stdout).map_err(|e| e.to_string())?;
        }
        let public = child.wait_with_output().map_err(|e| e.to_string())?;
        Ok((
            String::from_utf8_lossy(&private.stdout).into_owned(),
            String::from_utf8_lossy(&public.stdout).into_owned(),
        ))
    })
    .as_ref()
    .map_err(|e| FakeError::Openssl(e.clone()))
}

/// A running simulated GitHub and an admin client for it.
pub struct SimulatedGitHub {
    pub running: RunningFake,
    http: reqwest::Client,
    /// Served over HTTPS: the certificate (PEM) of the private CA that signed its certificate.
    pub ca_pem: Option<String>,
}

impl std::fmt::Debug for SimulatedGitHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatedGitHub")
            .field("base_url", &self.running.base_url)
            .finish_non_exhaustive()
    }
}

impl SimulatedGitHub {
    /// Start the fake with the App, its installation on `acme`, and the PAT.
    pub async fn start() -> Result<Self, FakeError> {
        Self::start_with_package(None).await
    }

    /// Like [`start`](Self::start), also publishing `package` as the runner release (served
    /// at `<base>/_downloads/<file name>`).
    pub async fn start_with_package(
        package: Option<fake_github::state::PackageInfo>,
    ) -> Result<Self, FakeError> {
        let running =
            fake_github::start(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), package).await?;
        Self::set_up(running, None).await
    }

    /// Like [`start_with_package`](Self::start_with_package), served over HTTPS with a
    /// certificate a private CA signed (a GitHub Enterprise Server with an internal CA):
    /// [`Self::ca_pem`] is that CA.
    pub async fn start_tls_with_package(
        package: Option<fake_github::state::PackageInfo>,
    ) -> Result<Self, FakeError> {
        let (running, ca_pem) =
            fake_github::start_tls(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), package).await?;
        Self::set_up(running, Some(ca_pem)).await
    }

    /// Register the App, its installation and the PAT on a started fake.
    async fn set_up(running: RunningFake, ca_pem: Option<String>) -> Result<Self, FakeError> {
        // The harness's own admin client trusts the fake's CA, and only it.
        let http = match &ca_pem {
            None => reqwest::Client::new(),
            Some(pem) => reqwest::Certificate::from_pem(pem.as_bytes())
                .and_then(|ca| reqwest::Client::builder().tls_certs_only([ca]).build())
                .map_err(|e| FakeError::Admin("client".into(), e.to_string()))?,
        };
        let this = Self {
            running,
            http,
            ca_pem,
        };
        let (_, public) = app_keys()?;
        this.admin(
            "POST",
            "app",
            json!({"app_id": APP_ID, "public_key_pem": public}),
        )
        .await?;
        this.admin(
            "POST",
            "installations",
            json!({"id": INSTALLATION_ID, "account": ORG}),
        )
        .await?;
        this.admin("POST", "pats", json!({"token": PAT})).await?;
        Ok(this)
    }

    pub fn base_url(&self) -> &str {
        &self.running.base_url
    }

    /// Call the admin API: `method` `/_admin/<path>` with a JSON body.
    pub async fn admin(&self, method: &str, path: &str, body: Value) -> Result<Value, FakeError> {
        let url = format!("{}/_admin/{path}", self.running.base_url);
        let method = reqwest::Method::from_bytes(method.as_bytes())
            .map_err(|e| FakeError::Admin(path.to_owned(), e.to_string()))?;
        let mut req = self.http.request(method, &url);
        if !body.is_null() {
            req = req.json(&body);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| FakeError::Admin(path.to_owned(), e.to_string()))?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        if !status.is_success() {
            return Err(FakeError::Admin(
                path.to_owned(),
                format!("{status}: {text}"),
            ));
        }
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// `{"<endpoint>": {"<status>": n}}`.
    pub async fn counters(&self) -> Result<Value, FakeError> {
        self.admin("GET", "counters", Value::Null).await
    }

    /// How many calls an endpoint answered (every status).
    pub async fn calls(&self, endpoint: &str) -> Result<u64, FakeError> {
        let c = self.counters().await?;
        Ok(c.get(endpoint)
            .and_then(Value::as_object)
            .map(|m| m.values().filter_map(Value::as_u64).sum())
            .unwrap_or(0))
    }

    /// Every registration the fake holds.
    pub async fn runners(&self) -> Result<Vec<Value>, FakeError> {
        Ok(self
            .admin("GET", "runners", Value::Null)
            .await?
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// The registrations the fake holds under `name`.
    pub async fn runners_named(&self, name: &str) -> Result<Vec<Value>, FakeError> {
        Ok(self
            .runners()
            .await?
            .into_iter()
            .filter(|r| r["name"] == name)
            .collect())
    }

    /// Queue the job `job` describes (`{"owner", "repo", "labels", "behaviour", ..}`); its id.
    pub async fn queue_job(&self, job: Value) -> Result<u64, FakeError> {
        let v = self.admin("POST", "jobs", job).await?;
        v["job_id"]
            .as_u64()
            .ok_or_else(|| FakeError::Admin("jobs".into(), format!("no job id in {v}")))
    }

    /// Add the repositories `names` to organization `owner` (what `GET /orgs/{org}/repos` lists).
    pub async fn add_repos(&self, owner: &str, names: &[&str]) -> Result<Value, FakeError> {
        self.admin("POST", "repos", json!({"owner": owner, "names": names}))
            .await
    }

    /// Drop the next `n` webhook deliveries (the operator then only polls).
    pub async fn drop_webhooks(&self, n: u64) -> Result<Value, FakeError> {
        self.admin("PUT", "webhooks/controls", json!({"drop_next": n}))
            .await
    }

    /// Queue a fault (`{"endpoint": .., "count": .., "status"/"latency_ms"/..}`) on the fake.
    pub async fn fault(&self, fault: Value) -> Result<Value, FakeError> {
        self.admin("POST", "faults", fault).await
    }

    /// Every webhook delivery the fake recorded, as captured on the wire.
    pub async fn deliveries(&self) -> Result<Value, FakeError> {
        self.admin("GET", "deliveries", Value::Null).await
    }

    /// Assert that no webhook reached the operator: every delivery the fake recorded was dropped
    /// (the scenario turned webhooks off). The deliveries, for the caller's further checks.
    pub async fn assert_every_delivery_dropped(&self) -> Vec<Value> {
        let deliveries = self
            .deliveries()
            .await
            .unwrap_or_else(|e| panic!("the fake's deliveries: {e}"));
        let list = deliveries
            .as_array()
            .cloned()
            .unwrap_or_else(|| panic!("deliveries are not a list: {deliveries}"));
        assert!(
            list.iter().all(|d| d["dropped"] == true),
            "a webhook reached the operator: {deliveries}"
        );
        list
    }

    /// Every JIT config the fake ever issued, in the clear (to look for it where it must not be).
    pub fn issued_jits(&self) -> Vec<String> {
        self.running
            .fake
            .world()
            .issued_jits
            .iter()
            .map(|j| j.expose_secret().to_owned())
            .collect()
    }
}

/// Credentials for the fake's PAT.
pub fn pat_credentials() -> Credentials {
    let data = [("token".to_owned(), ByteString(PAT.as_bytes().to_vec()))].into();
    // A fixed, non-empty token: always accepted.
    Credentials::from_secret_data(&data).unwrap_or_else(|e| unreachable!("{e}"))
}

/// Credentials for the fake's App, with or without the installation id.
pub fn app_credentials(installation: Option<u64>) -> Result<Credentials, FakeError> {
    Credentials::from_secret_data(&app_secret_data(installation)?)
        .map_err(|e| FakeError::Openssl(e.to_string()))
}

/// The data of a credentials Secret for the fake's App, with or without the installation id.
pub fn app_secret_data(
    installation: Option<u64>,
) -> Result<BTreeMap<String, ByteString>, FakeError> {
    let mut data: BTreeMap<String, ByteString> = BTreeMap::new();
    data.insert("appId".into(), ByteString(APP_ID.to_string().into_bytes()));
    data.insert(
        "privateKey".into(),
        ByteString(app_keys()?.0.clone().into_bytes()),
    );
    if let Some(i) = installation {
        data.insert(
            "installationId".into(),
            ByteString(i.to_string().into_bytes()),
        );
    }
    Ok(data)
}

impl SimulatedGitHub {
    /// The operator's GitHub client for `url`, pointed at the fake, retrying fast, recording every
    /// request it sends (for the contract check).
    pub fn client(&self, url: &str, credentials: Credentials) -> GitHubClient {
        let config = GitHubConfig {
            api_base: Some(self.base_url().to_owned()),
            retry: RetryPolicy {
                attempts: 4,
                base: Duration::from_millis(20),
                max_wait: Duration::from_secs(5),
            },
            timeout: Duration::from_secs(10),
            record: true,
            metrics: None,
            max_response_bytes: runner_manager_operator::github::client::DEFAULT_MAX_RESPONSE_BYTES,
            // The fake serves plain http on loopback (the admin flag `--allow-http-hosts`).
            http_hosts: loopback_hosts(),
            // Or https, signed by its own CA (the admin flag `--github-ca-file`).
            extra_roots: self
                .ca_pem
                .iter()
                .filter_map(|pem| reqwest::Certificate::from_pem(pem.as_bytes()).ok())
                .collect(),
        };
        let target = GitHubTarget::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        GitHubClient::new(target, credentials, config).unwrap_or_else(|e| panic!("{e}"))
    }
}

/// The hosts the simulated GitHub serves on over plain http, as an admin would allow them.
pub fn loopback_hosts() -> runner_manager_crds::hosts::HostList {
    runner_manager_crds::hosts::HostList::parse(super::process::LOOPBACK).unwrap_or_default()
}
