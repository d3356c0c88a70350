//! Who is calling: a `TokenReview` of the bound service-account token (audience
//! `runner-manager-broker`), the pod it is bound to, and that pod's node. Only a live agent pod
//! is a caller: right service account, agent labels, matching uid, not being deleted,
//! controlled by the agent DaemonSet itself (its uid, not its name), and — where the pod has an
//! IP — reached from that IP.
//!
//! Labels, `spec.nodeName` and the service account are all chosen by whoever creates the pod.
//! The controller reference to the DaemonSet's uid is what ties the pod to the one object an
//! admin installed; the peer address ties the request to the pod's network identity, so a token
//! copied off node X and replayed from elsewhere does not pass as node X's agent.
//!
//! What an unknown caller may cost (issue 28 item 5): a token the broker has not reviewed is
//! first read as a JWT without trusting it ([`shape`]): one that is not shaped
//! like a token of the agent ServiceAccount, is for another audience or has expired is refused
//! without a TokenReview. One that could be is reviewed only while its source address has budget
//! left ([`REVIEW_BURST`], [`REVIEW_PER_SECOND`]); a review that passes refunds it, so agents
//! never run an address's budget down, while a flood of forged tokens from one address costs the
//! API server a few reviews a second and is answered 429 at once for the rest.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use runner_manager_crds::broker::BROKER_AUDIENCE;
use secrecy::{ExposeSecret, SecretString};

use crate::listen::PeerBudget;

const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";
const POD_UID_EXTRA: &str = "authentication.kubernetes.io/pod-uid";

/// How long a looked-up DaemonSet uid is trusted before it is read again.
const DAEMONSET_UID_TTL: Duration = Duration::from_secs(60);
/// A caller whose owner uid differs from the cached one triggers a re-read (the DaemonSet may
/// have been re-created), but no more often than this: a stream of forged callers costs the API
/// server one GET per interval, not one per request.
const DAEMONSET_UID_REFRESH: Duration = Duration::from_secs(5);

/// Who may call: the agents' namespace, service account, pod labels and DaemonSet.
#[derive(Debug)]
pub struct AgentIdentity {
    pub namespace: String,
    pub service_account: String,
    /// Every one of these labels must be on the caller's pod (the DaemonSet's selector).
    pub pod_labels: BTreeMap<String, String>,
    /// The agent DaemonSet (in `namespace`): the caller's pod must be controlled by it.
    pub daemonset: String,
    /// Its uid as last read (`None`: it did not exist), and when.
    daemonset_uid: Mutex<Option<(Option<String>, Instant)>>,
    /// Successful TokenReviews, briefly remembered.
    reviews: ReviewCache,
}

/// How long a successful TokenReview is reused. The pod (uid, deletion, owner, address) is still
/// read on every request, so a token whose pod is gone is refused at once; a revoked token
/// passes the review step for at most this long.
const REVIEW_TTL: Duration = Duration::from_secs(30);
/// Reviews remembered at once: a few per agent (each agent has one token at a time, renewed
/// hourly). When full, expired entries go, then everything.
const REVIEW_CACHE_ENTRIES: usize = 4096;
/// TokenReviews of tokens not yet reviewed one source address may cause at once, then
/// [`REVIEW_PER_SECOND`]. An address is one agent pod, or many behind one SNAT address (each
/// reviewed once per [`REVIEW_TTL`] and refunded): the burst covers a node pool's agents all
/// starting at once.
pub const REVIEW_BURST: u32 = 64;
pub const REVIEW_PER_SECOND: u32 = 4;

/// The claims read from a token before it is trusted: only to decide whether it is worth a
/// TokenReview. Nothing read here is believed; the review decides.
#[derive(Debug, serde::Deserialize)]
struct UntrustedClaims {
    #[serde(default)]
    sub: String,
    #[serde(default)]
    aud: Audiences,
    #[serde(default)]
    exp: Option<u64>,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(untagged)]
enum Audiences {
    One(String),
    Many(Vec<String>),
    #[default]
    None,
}

/// What a token's claims, read without checking its signature, say about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// It could be a token of the agent account for the broker: worth a TokenReview.
    Candidate,
    /// A token for the broker, unexpired, of another account: it cannot pass, and is answered as
    /// a reviewed one of that account would be ([`AuthnError::WrongServiceAccount`]).
    OtherAccount,
    /// Not a JWT, not for the broker's audience, or expired.
    Junk,
}

/// The [`Shape`] of `token` against `username` (`system:serviceaccount:<ns>:<name>`) at
/// `now_unix`. Anything but [`Shape::Candidate`] spares the API server a TokenReview of something
/// that cannot pass one.
pub fn shape(token: &SecretString, username: &str, now_unix: u64) -> Shape {
    let Ok(claims) =
        jsonwebtoken::dangerous::insecure_decode_claims::<UntrustedClaims>(token.expose_secret())
    else {
        return Shape::Junk;
    };
    let audience = match &claims.aud {
        Audiences::One(a) => a == BROKER_AUDIENCE,
        Audiences::Many(all) => all.iter().any(|a| a == BROKER_AUDIENCE),
        Audiences::None => false,
    };
    if !audience || claims.exp.is_some_and(|exp| exp <= now_unix) {
        Shape::Junk
    } else if claims.sub == username {
        Shape::Candidate
    } else {
        Shape::OtherAccount
    }
}

/// What a successful TokenReview said about a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reviewed {
    pub username: String,
    pub pod_name: Option<String>,
    pub pod_uid: Option<String>,
}

/// Successful TokenReviews by the token's sha256 (the token itself is never kept), each reused
/// for [`REVIEW_TTL`]: an agent's JIT requests cost the API server one review per TTL, not one
/// each. Failed reviews are not remembered (nothing an attacker sends is cached).
#[derive(Debug)]
pub struct ReviewCache {
    entries: Mutex<std::collections::HashMap<[u8; 32], (Reviewed, Instant)>>,
    /// Reviews sent to the API server (tests and metrics).
    pub sent: std::sync::atomic::AtomicU64,
    /// Tokens refused without a review (not shaped like an agent's, or the address's budget
    /// spent).
    pub spared: std::sync::atomic::AtomicU64,
    budget: PeerBudget,
}

impl Default for ReviewCache {
    fn default() -> Self {
        Self {
            entries: Mutex::default(),
            sent: std::sync::atomic::AtomicU64::new(0),
            spared: std::sync::atomic::AtomicU64::new(0),
            budget: PeerBudget::new(REVIEW_BURST, REVIEW_PER_SECOND),
        }
    }
}

fn token_hash(token: &SecretString) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(token.expose_secret().as_bytes()).into()
}

impl ReviewCache {
    fn cached(&self, key: &[u8; 32]) -> Option<Reviewed> {
        let entries = self.entries.lock().ok()?;
        let (r, at) = entries.get(key)?;
        (at.elapsed() < REVIEW_TTL).then(|| r.clone())
    }

    fn remember(&self, key: [u8; 32], reviewed: Reviewed) {
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        if entries.len() >= REVIEW_CACHE_ENTRIES {
            entries.retain(|_, (_, at)| at.elapsed() < REVIEW_TTL);
            if entries.len() >= REVIEW_CACHE_ENTRIES {
                entries.clear();
            }
        }
        entries.insert(key, (reviewed, Instant::now()));
    }

    /// The token's review for the broker audience: remembered, or asked of the API server —
    /// only for a token that could be `username`'s, within `peer`'s budget.
    pub async fn review(
        &self,
        client: &kube::Client,
        token: &SecretString,
        username: &str,
        peer: IpAddr,
    ) -> Result<Reviewed, AuthnError> {
        use std::sync::atomic::Ordering::Relaxed;
        let key = token_hash(token);
        if let Some(r) = self.cached(&key) {
            return Ok(r);
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        match shape(token, username, now) {
            Shape::Candidate => {}
            Shape::OtherAccount => {
                self.spared.fetch_add(1, Relaxed);
                return Err(AuthnError::WrongServiceAccount);
            }
            Shape::Junk => {
                self.spared.fetch_add(1, Relaxed);
                return Err(AuthnError::NotAuthenticated);
            }
        }
        if !self.budget.try_spend(peer) {
            self.spared.fetch_add(1, Relaxed);
            return Err(AuthnError::Throttled);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.expose_secret().to_owned()),
                audiences: Some(vec![BROKER_AUDIENCE.to_owned()]),
            },
            ..TokenReview::default()
        };
        self.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let reviewed = Api::<TokenReview>::all(client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|_| AuthnError::Unavailable)?;
        let status = reviewed.status.ok_or(AuthnError::NotAuthenticated)?;
        let audience_ok = status
            .audiences
            .as_ref()
            .is_some_and(|a| a.iter().any(|x| x == BROKER_AUDIENCE));
        if status.authenticated != Some(true) || !audience_ok {
            return Err(AuthnError::NotAuthenticated);
        }
        let user = status.user.ok_or(AuthnError::NotAuthenticated)?;
        let extra = user.extra.unwrap_or_default();
        let one = |k: &str| extra.get(k).and_then(|v| v.first()).cloned();
        let r = Reviewed {
            username: user.username.unwrap_or_default(),
            pod_name: one(POD_NAME_EXTRA),
            pod_uid: one(POD_UID_EXTRA),
        };
        self.remember(key, r.clone());
        self.budget.refund(peer);
        Ok(r)
    }
}

impl AgentIdentity {
    pub fn new(
        namespace: String,
        service_account: String,
        pod_labels: BTreeMap<String, String>,
        daemonset: String,
    ) -> Self {
        Self {
            namespace,
            service_account,
            pod_labels,
            daemonset,
            daemonset_uid: Mutex::new(None),
            reviews: ReviewCache::default(),
        }
    }

    /// The cached reading and its age, if any.
    fn cached(&self) -> Option<(Option<String>, Duration)> {
        let cached = self.daemonset_uid.lock().ok()?;
        cached.as_ref().map(|(uid, at)| (uid.clone(), at.elapsed()))
    }

    /// The agent DaemonSet's uid (`None`: there is none). A reading is kept for
    /// [`DAEMONSET_UID_TTL`]; a caller whose `owner_uid` differs from it makes it be read again,
    /// at most every [`DAEMONSET_UID_REFRESH`], so a re-created DaemonSet is accepted at once.
    pub(crate) async fn daemonset_uid(
        &self,
        client: &kube::Client,
        owner_uid: &str,
    ) -> Result<Option<String>, AuthnError> {
        if let Some((uid, age)) = self.cached()
            && age < DAEMONSET_UID_TTL
            && (uid.as_deref() == Some(owner_uid) || age < DAEMONSET_UID_REFRESH)
        {
            return Ok(uid);
        }
        let ds = Api::<DaemonSet>::namespaced(client.clone(), &self.namespace)
            .get_opt(&self.daemonset)
            .await
            .map_err(|e| {
                tracing::warn!(daemonset = %self.daemonset, error = %e, "the agent DaemonSet could not be read");
                AuthnError::Unavailable
            })?;
        let uid = ds.and_then(|d| d.metadata.uid);
        if let Ok(mut cached) = self.daemonset_uid.lock() {
            *cached = Some((uid.clone(), Instant::now()));
        }
        Ok(uid)
    }
}

/// A proven caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub pod_name: String,
    pub pod_uid: String,
    pub node_name: String,
}

/// Why a caller was refused. Closed: the broker maps each to a status, never echoes the token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthnError {
    #[error("no bearer token")]
    NoToken,
    #[error("the token was not accepted for the broker audience")]
    NotAuthenticated,
    #[error("the token is not bound to a pod")]
    NotPodBound,
    #[error("the token belongs to another service account")]
    WrongServiceAccount,
    #[error("the token's pod no longer exists or was replaced")]
    PodGone,
    #[error("the token's pod is not an agent pod")]
    NotAnAgent,
    #[error("the token's pod is not bound to a node")]
    NoNode,
    #[error("the token's pod is not controlled by the agent DaemonSet")]
    NotOwnedByAgentDaemonSet,
    #[error("the request does not come from the token's pod address")]
    WrongPeer,
    #[error("the API server could not be asked")]
    Unavailable,
    #[error("too many unknown tokens from this address; try again later")]
    Throttled,
}

impl AuthnError {
    /// 401 for anything about the token, 403 for a valid token of the wrong pod.
    pub fn http_status(self) -> u16 {
        match self {
            Self::NoToken | Self::NotAuthenticated | Self::NotPodBound | Self::PodGone => 401,
            Self::WrongServiceAccount
            | Self::NotAnAgent
            | Self::NoNode
            | Self::NotOwnedByAgentDaemonSet
            | Self::WrongPeer => 403,
            Self::Unavailable => 503,
            Self::Throttled => 429,
        }
    }

    /// What the caller is told. The two checks an attacker with a stolen token would probe are
    /// answered like any other non-agent pod, so the answer does not say which one failed (the
    /// log does).
    pub fn public_message(self) -> String {
        match self {
            Self::NotOwnedByAgentDaemonSet | Self::WrongPeer => Self::NotAnAgent.to_string(),
            e => e.to_string(),
        }
    }
}

/// The uid the pod's controller reference names, when that controller is a DaemonSet.
pub(crate) fn controlling_daemonset(pod: &Pod) -> Option<&str> {
    pod.metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true))
        .filter(|o| o.kind == "DaemonSet" && o.api_version == "apps/v1")
        .map(|o| o.uid.as_str())
}

/// Whether `peer` is one of the pod's IPs. `None` when the pod has no IP yet (no kubelet has
/// reported it), where there is nothing to compare. An IPv4 peer seen on a dual-stack socket
/// (`::ffff:a.b.c.d`) is compared as IPv4.
fn peer_matches(pod: &Pod, peer: IpAddr) -> Option<bool> {
    let status = pod.status.as_ref()?;
    let ips: Vec<IpAddr> = status
        .pod_ip
        .iter()
        .chain(status.pod_ips.iter().flatten().map(|p| &p.ip))
        .filter_map(|ip| ip.parse::<IpAddr>().ok())
        .map(|ip| ip.to_canonical())
        .collect();
    if ips.is_empty() {
        return None;
    }
    Some(ips.contains(&peer.to_canonical()))
}

/// Prove the caller: its token, its pod, and that `peer` (the TCP peer of the request) is that
/// pod.
pub async fn authenticate(
    client: &kube::Client,
    identity: &AgentIdentity,
    token: &SecretString,
    peer: IpAddr,
) -> Result<Caller, AuthnError> {
    let want = format!(
        "system:serviceaccount:{}:{}",
        identity.namespace, identity.service_account
    );
    let reviewed = identity.reviews.review(client, token, &want, peer).await?;
    if reviewed.username != want {
        return Err(AuthnError::WrongServiceAccount);
    }
    let (Some(pod_name), Some(pod_uid)) = (reviewed.pod_name, reviewed.pod_uid) else {
        return Err(AuthnError::NotPodBound);
    };
    let pod = Api::<Pod>::namespaced(client.clone(), &identity.namespace)
        .get_opt(&pod_name)
        .await
        .map_err(|_| AuthnError::Unavailable)?
        .ok_or(AuthnError::PodGone)?;
    if pod.metadata.uid.as_deref() != Some(pod_uid.as_str())
        || pod.metadata.deletion_timestamp.is_some()
    {
        return Err(AuthnError::PodGone);
    }
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    if !identity
        .pod_labels
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v))
    {
        return Err(AuthnError::NotAnAgent);
    }
    let spec = pod.spec.as_ref();
    if spec.and_then(|s| s.service_account_name.as_deref())
        != Some(identity.service_account.as_str())
    {
        return Err(AuthnError::WrongServiceAccount);
    }
    let node_name = spec
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty())
        .ok_or(AuthnError::NoNode)?;
    let Some(owner_uid) = controlling_daemonset(&pod) else {
        tracing::warn!(pod = %pod_name, node = %node_name, "broker caller refused: its pod has no DaemonSet controller");
        return Err(AuthnError::NotOwnedByAgentDaemonSet);
    };
    let agent_uid = identity.daemonset_uid(client, owner_uid).await?;
    if agent_uid.as_deref() != Some(owner_uid) {
        tracing::warn!(
            pod = %pod_name,
            node = %node_name,
            daemonset = %identity.daemonset,
            owner_uid,
            agent_daemonset_uid = agent_uid.as_deref().unwrap_or("<absent>"),
            "broker caller refused: its pod is controlled by another DaemonSet than the agent's"
        );
        return Err(AuthnError::NotOwnedByAgentDaemonSet);
    }
    if peer_matches(&pod, peer) == Some(false) {
        tracing::warn!(
            pod = %pod_name,
            node = %node_name,
            %peer,
            pod_ip = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref()).unwrap_or(""),
            "broker caller refused: the request does not come from its pod's address"
        );
        return Err(AuthnError::WrongPeer);
    }
    Ok(Caller {
        pod_name,
        pod_uid,
        node_name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const AGENT: &str = "system:serviceaccount:runner-manager-system:runner-manager-node-agent";

    /// A token with `claims`, signed with a key the broker never sees: only its shape counts.
    fn token(claims: serde_json::Value) -> SecretString {
        let jwt = jsonwebtoken::EncodingKey::from_secret(b"not the API server's key")
            .and_then(|key| jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key))
            .unwrap_or_default();
        SecretString::from(jwt)
    }

    #[test]
    fn only_a_token_shaped_like_the_agents_is_worth_a_review() {
        let now = 1_800_000_000;
        let good = serde_json::json!({"sub": AGENT, "aud": [BROKER_AUDIENCE], "exp": now + 600});
        assert_eq!(shape(&token(good), AGENT, now), Shape::Candidate);
        let one_audience = serde_json::json!({"sub": AGENT, "aud": BROKER_AUDIENCE});
        assert_eq!(shape(&token(one_audience), AGENT, now), Shape::Candidate);
        // Another pod's own token for the broker: what a pod that floods the broker can have.
        let other = serde_json::json!({"sub": "system:serviceaccount:team:default", "aud": [BROKER_AUDIENCE], "exp": now + 600});
        assert_eq!(shape(&token(other), AGENT, now), Shape::OtherAccount);
        let refused = [
            // The API server's audience, not the broker's.
            serde_json::json!({"sub": AGENT, "aud": ["https://kubernetes.default.svc"], "exp": now + 600}),
            serde_json::json!({"sub": AGENT, "exp": now + 600}),
            // Expired.
            serde_json::json!({"sub": AGENT, "aud": [BROKER_AUDIENCE], "exp": now - 1}),
        ];
        for claims in refused {
            assert_eq!(
                shape(&token(claims.clone()), AGENT, now),
                Shape::Junk,
                "{claims}"
            );
        }
        for junk in ["", "junk", "a.b.c", "a.b", "....", "eyJ.eyJ.x"] {
            assert_eq!(
                shape(&SecretString::from(junk), AGENT, now),
                Shape::Junk,
                "{junk:?}"
            );
        }
    }

    #[test]
    fn a_throttled_caller_is_told_429() {
        assert_eq!(AuthnError::Throttled.http_status(), 429);
    }
}
