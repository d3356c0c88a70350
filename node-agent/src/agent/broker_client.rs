//! The agent's side of the JIT broker (DESIGN §5): one `POST /v1/attempts/{ns}/{name}/jit` per
//! attempt, over HTTPS trusting the CA the operator publishes in its ConfigMap, with the bound
//! service-account token read fresh from its file (kubelet rotates it). An answer lost to a
//! timeout or a broken connection is a lost JIT, never a reason to ask again.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use runner_manager_crds::broker::{JitRequest, JitResponse, jit_path};
use secrecy::{ExposeSecret, SecretString};
use tokio::sync::OnceCell;

/// The ConfigMap the operator publishes its broker CA in (key `ca.crt`), in the system
/// namespace (`operator/src/broker/tls.rs`).
pub const CA_CONFIGMAP: &str = "runner-manager-broker-ca";
const CA_KEY: &str = "ca.crt";
/// The whole exchange; a broker that mints needs one GitHub round trip.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// What one request came to. Closed: reaches logs as a kind.
#[derive(Debug)]
pub enum JitAnswer {
    /// 200: the JIT (secret) and the runner the broker journalled.
    Issued(JitResponse),
    /// 410: a JIT was already issued for this attempt; that one is lost.
    AlreadyIssued,
    /// No answer could be read (timeout, broken connection, unreadable body): the broker may
    /// have minted, so the JIT is lost.
    Lost,
    /// The broker refused before minting (its status code).
    Refused(u16),
    /// The request could not be sent at all (no CA, no token): nothing reached the broker.
    NotSent(&'static str),
}

/// The client.
pub struct BrokerClient {
    url: String,
    token_file: PathBuf,
    kube: kube::Client,
    system_namespace: String,
    http: OnceCell<reqwest::Client>,
}

impl std::fmt::Debug for BrokerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerClient")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl BrokerClient {
    pub fn new(
        url: String,
        token_file: PathBuf,
        kube: kube::Client,
        system_namespace: String,
    ) -> Self {
        Self {
            url: url.trim_end_matches('/').to_owned(),
            token_file,
            kube,
            system_namespace,
            http: OnceCell::new(),
        }
    }

    /// An HTTPS client trusting only the published CA (fetched once, through the API server).
    async fn http(&self) -> Result<&reqwest::Client, &'static str> {
        self.http
            .get_or_try_init(|| async {
                let cm = Api::<ConfigMap>::namespaced(self.kube.clone(), &self.system_namespace)
                    .get(CA_CONFIGMAP)
                    .await
                    .map_err(|_| "the broker CA ConfigMap could not be read")?;
                let pem = cm
                    .data
                    .and_then(|mut d| d.remove(CA_KEY))
                    .ok_or("the broker CA ConfigMap has no ca.crt")?;
                let ca = reqwest::Certificate::from_pem(pem.as_bytes())
                    .map_err(|_| "the broker CA is not PEM")?;
                reqwest::Client::builder()
                    .add_root_certificate(ca)
                    .timeout(REQUEST_TIMEOUT)
                    .build()
                    .map_err(|_| "the HTTPS client could not be built")
            })
            .await
    }

    fn token(&self) -> Result<SecretString, &'static str> {
        let raw = std::fs::read_to_string(&self.token_file)
            .map_err(|_| "the broker token file could not be read")?;
        let token = raw.trim();
        if token.is_empty() {
            return Err("the broker token file is empty");
        }
        Ok(SecretString::from(token.to_owned()))
    }

    /// Asks once. The caller never calls this twice for one attempt.
    pub async fn request_jit(&self, namespace: &str, name: &str, body: &JitRequest) -> JitAnswer {
        let http = match self.http().await {
            Ok(h) => h,
            Err(why) => return JitAnswer::NotSent(why),
        };
        let token = match self.token() {
            Ok(t) => t,
            Err(why) => return JitAnswer::NotSent(why),
        };
        let Ok(json) = serde_json::to_vec(body) else {
            return JitAnswer::NotSent("the request could not be encoded");
        };
        let sent = http
            .post(format!("{}{}", self.url, jit_path(namespace, name)))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .bearer_auth(token.expose_secret())
            .body(json)
            .send()
            .await;
        let response = match sent {
            Ok(r) => r,
            // A connection that was refused never reached the broker; anything later may have.
            Err(e) if e.is_connect() => return JitAnswer::NotSent("the broker is unreachable"),
            Err(_) => return JitAnswer::Lost,
        };
        match response.status().as_u16() {
            200 => match response.bytes().await {
                Ok(bytes) => serde_json::from_slice::<JitResponse>(&bytes)
                    .map(JitAnswer::Issued)
                    .unwrap_or(JitAnswer::Lost),
                Err(_) => JitAnswer::Lost,
            },
            410 => JitAnswer::AlreadyIssued,
            code => JitAnswer::Refused(code),
        }
    }
}
