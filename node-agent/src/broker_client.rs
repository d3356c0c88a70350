//! The agent's side of the broker (DESIGN §5), over HTTPS trusting the CA the operator publishes
//! in its ConfigMap, with the bound service-account token read fresh from its file (kubelet
//! rotates it):
//!
//! - the JIT: one `POST /v1/attempts/{ns}/{name}/jit` per attempt. An answer lost to a timeout
//!   or a broken connection is a lost JIT, never a reason to ask again;
//! - pods (issue 28): the agent holds no pod write right, so it orders its attempts' runner and
//!   placeholder pods (`POST /v1/attempts/{ns}/{name}/pods`) and their removal
//!   (`POST /v1/pods/{ns}/{name}/removal`) from the operator, which builds them. Both are
//!   idempotent: an order repeated after a lost answer meets the pod the first one made.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use runner_manager_crds::broker::{
    JitRequest, JitResponse, PodOrder, PodRemoval, jit_path, pod_removal_path, pods_path,
};
use runner_manager_crds::job_admission::{
    JobAdmissionAnswer, JobAdmissionRequest, JobRefusal, job_path,
};
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

/// Why a pod order or removal did not succeed. Closed: reaches logs as a kind and an HTTP code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PodOrderError {
    /// 409: a pod of the attempt's pod name exists and is not this attempt's.
    #[error("a pod of that name is not this attempt's")]
    Conflict,
    /// The broker refused (its status code: 403 wrong node, 404 no such attempt, 422 the order
    /// or the API server refused the pod, 5xx).
    #[error("the broker refused the pod ({0})")]
    Refused(u16),
    /// Nothing reached the broker, or no answer came back: the order may or may not have been
    /// carried out (orders are idempotent; the caller may order again).
    #[error("the broker could not be reached")]
    Unreachable,
}

/// What a pod order came to: the pod as stored.
#[derive(Debug)]
pub enum Ordered {
    /// 201: the broker made it now.
    Made(Pod),
    /// 200: it was there already, this attempt's (an order repeated after a crash or a lost
    /// answer).
    Existing(Pod),
}

impl Ordered {
    pub fn pod(self) -> Pod {
        match self {
            Self::Made(p) | Self::Existing(p) => p,
        }
    }
}

/// What one exchange came to, before its body is read as an answer.
enum Exchange {
    Answered(u16, Vec<u8>),
    NotSent(&'static str),
    /// Sent, and no answer could be read.
    Lost,
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

    /// One `POST` of `body` as JSON to `path`.
    async fn post(&self, path: &str, body: &impl serde::Serialize) -> Exchange {
        let http = match self.http().await {
            Ok(h) => h,
            Err(why) => return Exchange::NotSent(why),
        };
        let token = match self.token() {
            Ok(t) => t,
            Err(why) => return Exchange::NotSent(why),
        };
        let Ok(json) = serde_json::to_vec(body) else {
            return Exchange::NotSent("the request could not be encoded");
        };
        let sent = http
            .post(format!("{}{path}", self.url))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .bearer_auth(token.expose_secret())
            .body(json)
            .send()
            .await;
        let response = match sent {
            Ok(r) => r,
            // A connection that was refused never reached the broker; anything later may have.
            Err(e) if e.is_connect() => return Exchange::NotSent("the broker is unreachable"),
            Err(_) => return Exchange::Lost,
        };
        let status = response.status().as_u16();
        match response.bytes().await {
            Ok(bytes) => Exchange::Answered(status, bytes.to_vec()),
            Err(_) => Exchange::Lost,
        }
    }

    /// Asks once. The caller never calls this twice for one attempt.
    pub async fn request_jit(&self, namespace: &str, name: &str, body: &JitRequest) -> JitAnswer {
        match self.post(&jit_path(namespace, name), body).await {
            Exchange::NotSent(why) => JitAnswer::NotSent(why),
            Exchange::Lost => JitAnswer::Lost,
            Exchange::Answered(200, bytes) => serde_json::from_slice::<JitResponse>(&bytes)
                .map(JitAnswer::Issued)
                .unwrap_or(JitAnswer::Lost),
            Exchange::Answered(410, _) => JitAnswer::AlreadyIssued,
            Exchange::Answered(code, _) => JitAnswer::Refused(code),
        }
    }

    /// Orders a pod of attempt `namespace/name`; the pod as stored.
    pub async fn order_pod(
        &self,
        namespace: &str,
        name: &str,
        order: &PodOrder,
    ) -> Result<Ordered, PodOrderError> {
        let pod = |bytes: &[u8]| {
            serde_json::from_slice::<Pod>(bytes).map_err(|_| PodOrderError::Unreachable)
        };
        match self.post(&pods_path(namespace, name), order).await {
            Exchange::Answered(201, bytes) => pod(&bytes).map(Ordered::Made),
            Exchange::Answered(200, bytes) => pod(&bytes).map(Ordered::Existing),
            Exchange::Answered(409, _) => Err(PodOrderError::Conflict),
            Exchange::Answered(code, _) => Err(PodOrderError::Refused(code)),
            Exchange::NotSent(why) => {
                tracing::warn!(namespace, attempt = name, "pod order not sent: {why}");
                Err(PodOrderError::Unreachable)
            }
            Exchange::Lost => Err(PodOrderError::Unreachable),
        }
    }

    /// Asks whether the job the runner of `namespace/name` started may run
    /// ([`runner_manager_crds::job_admission`]). Every failure to get an answer refuses: the
    /// gate fails closed, and the job's log says why.
    pub async fn admit_job(
        &self,
        namespace: &str,
        name: &str,
        body: &JobAdmissionRequest,
    ) -> JobAdmissionAnswer {
        let unconfirmed = |message: String| JobAdmissionAnswer {
            refused: Some(JobRefusal::Unconfirmed),
            message,
            write_back: false,
        };
        match self.post(&job_path(namespace, name), body).await {
            Exchange::Answered(200, bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|_| {
                unconfirmed("runner-manager: the operator's answer could not be read".into())
            }),
            Exchange::Answered(code, bytes) => {
                let detail =
                    serde_json::from_slice::<runner_manager_crds::broker::BrokerError>(&bytes)
                        .map(|e| e.message)
                        .unwrap_or_default();
                unconfirmed(format!(
                    "runner-manager: the operator refused to confirm the job ({code}): {detail}"
                ))
            }
            Exchange::NotSent(why) => unconfirmed(format!(
                "runner-manager: the operator could not be asked: {why}"
            )),
            Exchange::Lost => unconfirmed("runner-manager: the operator's answer was lost".into()),
        }
    }

    /// Removes pod `namespace/name` if it still has `uid` (gone, or another pod's now, is done).
    pub async fn remove_pod(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<(), PodOrderError> {
        let body = PodRemoval {
            uid: uid.to_owned(),
        };
        match self.post(&pod_removal_path(namespace, name), &body).await {
            Exchange::Answered(200, _) => Ok(()),
            Exchange::Answered(code, _) => Err(PodOrderError::Refused(code)),
            Exchange::NotSent(why) => {
                tracing::warn!(namespace, pod = name, "pod removal not sent: {why}");
                Err(PodOrderError::Unreachable)
            }
            Exchange::Lost => Err(PodOrderError::Unreachable),
        }
    }
}
