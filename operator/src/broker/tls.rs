//! The broker's own CA and serving certificate, made at the first start (rcgen), kept in a
//! Secret in the operator's namespace so every replica and every restart serves the same one,
//! and the CA published in a ConfigMap that agents read through the API server.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ObjectMeta, PostParams};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use secrecy::{ExposeSecret, SecretString};

/// The Secret holding the CA and serving key pairs.
pub const TLS_SECRET: &str = "runner-manager-broker-tls";
/// The ConfigMap publishing the CA (key `ca.crt`).
pub const CA_CONFIGMAP: &str = "runner-manager-broker-ca";

/// The broker's certificate material.
pub struct BrokerTls {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: SecretString,
}

impl std::fmt::Debug for BrokerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerTls").finish_non_exhaustive()
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

/// Make a fresh CA and a serving certificate signed by it.
pub fn generate(names: Vec<String>) -> Result<BrokerTls, TlsError> {
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "runner-manager broker CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(names)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "runner-manager-broker");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &issuer)?;
    Ok(BrokerTls {
        ca_pem: ca_cert.pem(),
        cert_pem: cert.pem(),
        key_pem: SecretString::from(key.serialize_pem()),
    })
}

fn field(secret: &Secret, key: &'static str) -> Result<String, TlsError> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
        .ok_or(TlsError::Incomplete(key))
}

fn from_secret(secret: &Secret) -> Result<BrokerTls, TlsError> {
    Ok(BrokerTls {
        ca_pem: field(secret, "ca.crt")?,
        cert_pem: field(secret, "tls.crt")?,
        key_pem: SecretString::from(field(secret, "tls.key")?),
    })
}

/// The stored certificate, or a new one stored for every replica. Two replicas starting at once
/// both try to create; the loser reads the winner's.
pub async fn ensure(
    client: &kube::Client,
    namespace: &str,
    names: Vec<String>,
) -> Result<BrokerTls, TlsError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let tls = match secrets.get_opt(TLS_SECRET).await? {
        Some(s) => from_secret(&s)?,
        None => {
            let fresh = generate(names)?;
            let data: BTreeMap<String, ByteString> = [
                ("ca.crt", fresh.ca_pem.clone()),
                ("tls.crt", fresh.cert_pem.clone()),
                ("tls.key", fresh.key_pem.expose_secret().to_owned()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), ByteString(v.into_bytes())))
            .collect();
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(TLS_SECRET.to_owned()),
                    ..ObjectMeta::default()
                },
                type_: Some("kubernetes.io/tls".to_owned()),
                data: Some(data),
                ..Secret::default()
            };
            match secrets.create(&PostParams::default(), &secret).await {
                Ok(_) => fresh,
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    from_secret(&secrets.get(TLS_SECRET).await?)?
                }
                Err(e) => return Err(e.into()),
            }
        }
    };
    publish_ca(client, namespace, &tls.ca_pem).await?;
    Ok(tls)
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

/// The rustls server config of the broker.
pub fn server_config(tls: &BrokerTls) -> Result<rustls::ServerConfig, TlsError> {
    let certs: Vec<_> = rustls_pemfile::certs(&mut tls.cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|_| TlsError::Pem)?;
    let key = rustls_pemfile::private_key(&mut tls.key_pem.expose_secret().as_bytes())
        .map_err(|_| TlsError::Pem)?
        .ok_or(TlsError::Pem)?;
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    Ok(config)
}
