//! The broker's own CA and its short-lived serving certificates (issue 13, finding 10). The CA
//! (ten years) is made at the first start (rcgen) and kept — certificate and key — in a Secret in
//! the operator's namespace, so every replica and every restart signs with the same one, and it
//! is published in a ConfigMap that agents read through the API server. Each replica issues its
//! own serving certificate from it, valid for `--broker-cert-lifetime` (≤ 90 days, 30 by
//! default), and issues the next one at two thirds of that: the rustls resolver hands new
//! handshakes the new certificate while open connections keep theirs, so no agent is dropped.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ObjectMeta, PostParams};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use secrecy::{ExposeSecret, SecretString};

/// The Secret holding the CA and serving key pairs.
pub const TLS_SECRET: &str = "runner-manager-broker-tls";
/// The ConfigMap publishing the CA (key `ca.crt`).
pub const CA_CONFIGMAP: &str = "runner-manager-broker-ca";

/// The default serving-certificate lifetime (`--broker-cert-lifetime`).
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long the CA lives: agents and the admission webhook trust it, so it outlives many
/// serving certificates; replacing it means restarting the agents.
const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// A certificate is valid from a little before it was issued (clocks of other nodes).
const BACKDATE: Duration = Duration::from_secs(5 * 60);
const CA_NAME: &str = "runner-manager broker CA";

/// The broker's certificate material: the kept CA (its key too, to issue serving certificates)
/// and the serving certificate this replica serves now.
pub struct BrokerTls {
    pub ca_pem: String,
    ca_key_pem: SecretString,
    names: Vec<String>,
    lifetime: Duration,
    /// What new handshakes get; swapped at each rotation.
    resolver: Arc<RotatingCert>,
    /// The serving certificate issued last (PEM), for tests and tools.
    pub cert_pem: String,
}

impl std::fmt::Debug for BrokerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerTls")
            .field("lifetime", &self.lifetime)
            .finish_non_exhaustive()
    }
}

/// Why the certificate could not be made or loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("generating the broker certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("API server: {0}")]
    Kube(#[from] kube::Error),
    #[error("Secret {TLS_SECRET} lacks key {0}; delete the Secret to have a new certificate made")]
    Incomplete(&'static str),
    #[error("loading the certificate into rustls: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("the stored key or certificate is not valid PEM")]
    Pem,
}

/// The DNS names the serving certificate covers: the broker Service in every form a client may
/// use, plus loopback for agents that run beside the operator (tests, `make demo`).
pub fn serving_names(namespace: &str, service: &str) -> Vec<String> {
    vec![
        service.to_owned(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
    ]
}

/// The CA's parameters: the same every time, so an issuer rebuilt from the kept key signs
/// certificates that chain to the stored CA certificate (same subject, same key identifier).
fn ca_params() -> Result<CertificateParams, TlsError> {
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name.push(DnType::CommonName, CA_NAME);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok(ca)
}

/// A fresh CA: certificate and key, PEM.
pub fn generate_ca() -> Result<(String, SecretString), TlsError> {
    let key = KeyPair::generate()?;
    let mut params = ca_params()?;
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - BACKDATE;
    params.not_after = now + CA_LIFETIME;
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), SecretString::from(key.serialize_pem())))
}

/// A serving certificate for `names`, signed by the CA, valid from a few minutes ago for
/// `lifetime`. Returns certificate and key, PEM.
pub fn issue(
    ca_key_pem: &SecretString,
    names: &[String],
    lifetime: Duration,
) -> Result<(String, SecretString), TlsError> {
    let ca_key = KeyPair::from_pem(ca_key_pem.expose_secret())?;
    let issuer = rcgen::Issuer::new(ca_params()?, ca_key);
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(names.to_vec())?;
    params
        .distinguished_name
        .push(DnType::CommonName, "runner-manager-broker");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - BACKDATE;
    params.not_after = now + lifetime;
    let cert = params.signed_by(&key, &issuer)?;
    Ok((cert.pem(), SecretString::from(key.serialize_pem())))
}

fn certified(cert_pem: &str, key_pem: &SecretString) -> Result<Arc<CertifiedKey>, TlsError> {
    let certs: Vec<_> = rustls_pemfile::certs(&mut cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|_| TlsError::Pem)?;
    let key = rustls_pemfile::private_key(&mut key_pem.expose_secret().as_bytes())
        .map_err(|_| TlsError::Pem)?
        .ok_or(TlsError::Pem)?;
    let signing = rustls::crypto::aws_lc_rs::sign::any_supported_type(&key)?;
    Ok(Arc::new(CertifiedKey::new(certs, signing)))
}

/// The serving certificate new handshakes get, replaced at each rotation.
#[derive(Debug)]
pub struct RotatingCert(RwLock<Arc<CertifiedKey>>);

impl RotatingCert {
    fn set(&self, key: Arc<CertifiedKey>) {
        if let Ok(mut k) = self.0.write() {
            *k = key;
        }
    }
}

impl ResolvesServerCert for RotatingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.read().ok().map(|k| k.clone())
    }
}

impl BrokerTls {
    fn new(
        ca_pem: String,
        ca_key_pem: SecretString,
        names: Vec<String>,
        lifetime: Duration,
    ) -> Result<Self, TlsError> {
        let (cert_pem, key_pem) = issue(&ca_key_pem, &names, lifetime)?;
        let resolver = Arc::new(RotatingCert(RwLock::new(certified(&cert_pem, &key_pem)?)));
        Ok(Self {
            ca_pem,
            ca_key_pem,
            names,
            lifetime,
            resolver,
            cert_pem,
        })
    }

    /// When the next certificate is issued: at two thirds of the lifetime.
    pub fn rotation_interval(&self) -> Duration {
        self.lifetime * 2 / 3
    }

    /// Issue a new serving certificate and hand it to new handshakes. Connections already open
    /// keep the one they were made with.
    pub fn rotate(&mut self) -> Result<(), TlsError> {
        let (cert_pem, key_pem) = issue(&self.ca_key_pem, &self.names, self.lifetime)?;
        self.resolver.set(certified(&cert_pem, &key_pem)?);
        self.cert_pem = cert_pem;
        Ok(())
    }

    /// Rotate at two thirds of each lifetime until the task is aborted. A failed issue is
    /// retried soon (the current certificate still has a third of its life).
    pub fn spawn_rotation(&self) -> tokio::task::JoinHandle<()> {
        let (ca_key, names, lifetime, resolver) = (
            self.ca_key_pem.clone(),
            self.names.clone(),
            self.lifetime,
            self.resolver.clone(),
        );
        let interval = self.rotation_interval();
        tokio::spawn(async move {
            let mut wait = interval;
            loop {
                tokio::time::sleep(wait).await;
                let issued =
                    issue(&ca_key, &names, lifetime).and_then(|(cert, key)| certified(&cert, &key));
                match issued {
                    Ok(key) => {
                        resolver.set(key);
                        wait = interval;
                        tracing::info!(
                            lifetime_s = lifetime.as_secs(),
                            "broker serving certificate rotated"
                        );
                    }
                    Err(e) => {
                        wait = interval.min(Duration::from_secs(60)) / 2;
                        tracing::error!(error = %e, "broker serving certificate not rotated; retrying");
                    }
                }
            }
        })
    }
}

fn field(secret: &Secret, key: &'static str) -> Result<String, TlsError> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
        .ok_or(TlsError::Incomplete(key))
}

fn ca_data(
    ca_pem: &str,
    ca_key: &SecretString,
    first: &(String, SecretString),
) -> BTreeMap<String, ByteString> {
    [
        ("ca.crt", ca_pem.to_owned()),
        ("ca.key", ca_key.expose_secret().to_owned()),
        // The Secret's type requires them: the first serving certificate. Replicas serve their
        // own, issued in memory from ca.key.
        ("tls.crt", first.0.clone()),
        ("tls.key", first.1.expose_secret().to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), ByteString(v.into_bytes())))
    .collect()
}

/// The kept CA, or a new one stored for every replica, and a serving certificate issued from it
/// for `lifetime`. Two replicas starting at once both try to create; the loser reads the
/// winner's. A Secret from a version that did not keep the CA key (`ca.key`) gets a new CA once
/// (agents read the published CA again when they restart).
pub async fn ensure(
    client: &kube::Client,
    namespace: &str,
    names: Vec<String>,
    lifetime: Duration,
) -> Result<BrokerTls, TlsError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let (ca_pem, ca_key) = loop {
        let stored = secrets.get_opt(TLS_SECRET).await?;
        if let Some(s) = &stored
            && s.data.as_ref().is_some_and(|d| d.contains_key("ca.key"))
        {
            break (field(s, "ca.crt")?, SecretString::from(field(s, "ca.key")?));
        }
        let (ca_pem, ca_key) = generate_ca()?;
        let first = issue(&ca_key, &names, lifetime)?;
        let data = ca_data(&ca_pem, &ca_key, &first);
        let written = match stored {
            None => {
                let secret = Secret {
                    metadata: ObjectMeta {
                        name: Some(TLS_SECRET.to_owned()),
                        ..ObjectMeta::default()
                    },
                    type_: Some("kubernetes.io/tls".to_owned()),
                    data: Some(data),
                    ..Secret::default()
                };
                secrets.create(&PostParams::default(), &secret).await
            }
            Some(mut old) => {
                tracing::warn!(
                    secret = TLS_SECRET,
                    "the broker CA key was not kept by the previous version: a new CA is made; restart the node agents so they trust it"
                );
                // Replaced under its resourceVersion: of two replicas upgrading at once, one wins.
                old.data = Some(data);
                secrets
                    .replace(TLS_SECRET, &PostParams::default(), &old)
                    .await
            }
        };
        match written {
            Ok(_) => break (ca_pem, ca_key),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    };
    publish_ca(client, namespace, &ca_pem).await?;
    BrokerTls::new(ca_pem, ca_key, names, lifetime)
}

async fn publish_ca(client: &kube::Client, namespace: &str, ca_pem: &str) -> Result<(), TlsError> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(CA_CONFIGMAP.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some([("ca.crt".to_owned(), ca_pem.to_owned())].into()),
        ..ConfigMap::default()
    };
    let params = kube::api::PatchParams::apply("runner-manager-operator").force();
    maps.patch(CA_CONFIGMAP, &params, &kube::api::Patch::Apply(&cm))
        .await?;
    Ok(())
}

/// The rustls server config of the broker: the rotating serving certificate.
pub fn server_config(tls: &BrokerTls) -> Result<rustls::ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(tls.resolver.clone());
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier;

    #[test]
    fn serving_certificates_chain_to_the_kept_ca_and_rotate() {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let (ca_pem, ca_key) = generate_ca().unwrap_or_else(|e| panic!("{e}"));
        let names = serving_names("ns", "svc");
        let mut tls = BrokerTls::new(ca_pem.clone(), ca_key, names, DEFAULT_LIFETIME)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(tls.rotation_interval(), DEFAULT_LIFETIME * 2 / 3);
        let first = tls.cert_pem.clone();
        tls.rotate().unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(tls.cert_pem, first, "a new certificate");
        // Both verify against the CA for the Service's name (webpki, as agents do).
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
            roots
                .add(c.unwrap_or_else(|e| panic!("{e}")))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let verifier = rustls::client::WebPkiServerVerifier::builder(Arc::new(roots))
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        for pem in [&first, &tls.cert_pem] {
            let leaf = rustls_pemfile::certs(&mut pem.as_bytes())
                .next()
                .and_then(Result::ok)
                .unwrap_or_else(|| panic!("no certificate"));
            let name = rustls::pki_types::ServerName::try_from("svc.ns.svc")
                .unwrap_or_else(|e| panic!("{e}"));
            verifier
                .verify_server_cert(&leaf, &[], &name, &[], rustls::pki_types::UnixTime::now())
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }
}
