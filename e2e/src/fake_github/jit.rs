//! The `encoded_jit_config` format: base64 of a JSON object whose keys are the runner's settings
//! files (`.runner`, `.credentials`, `.credentials_rsaparams`) and whose values are base64 of
//! each file. The stand-in runner decodes it exactly as the real one does.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const RUNNER_FILE: &str = ".runner";
pub const CREDENTIALS_FILE: &str = ".credentials";
pub const RSA_PARAMS_FILE: &str = ".credentials_rsaparams";

#[derive(Debug, thiserror::Error)]
pub enum JitError {
    #[error("the JIT configuration is not base64")]
    NotBase64,
    #[error("the JIT configuration is not a JSON object of files")]
    NotJson,
    #[error("the JIT configuration lacks the settings file {0}")]
    MissingFile(&'static str),
    #[error("the settings file {0} in the JIT configuration is malformed")]
    BadFile(&'static str),
}

/// `.runner`, in the runner's own (camelCase) keys.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunnerSettings {
    pub agent_id: u64,
    pub agent_name: String,
    pub pool_id: u64,
    pub pool_name: String,
    pub server_url: String,
    pub git_hub_url: String,
    pub work_folder: String,
    pub ephemeral: bool,
    pub disable_update: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CredentialData {
    pub client_id: String,
    pub authorization_url: String,
    pub require_fips_cryptography: String,
}

/// `.credentials`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CredentialSettings {
    pub scheme: String,
    pub data: CredentialData,
}

/// `.credentials_rsaparams`: the real runner keeps an RSA private key here. The fake puts random
/// material in the same fields and uses `d` as the secret the runner proves itself with.
#[derive(Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RsaParams {
    pub d: String,
    pub dp: String,
    pub dq: String,
    pub exponent: String,
    pub inverse_q: String,
    pub modulus: String,
    pub p: String,
    pub q: String,
}

impl std::fmt::Debug for RsaParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RsaParams(redacted)")
    }
}

/// The three settings files a JIT configuration carries.
#[derive(Debug, Clone)]
pub struct JitSettings {
    pub runner: RunnerSettings,
    pub credentials: CredentialSettings,
    pub rsa_params: RsaParams,
}

impl JitSettings {
    /// The raw file contents, by file name, as the runner writes them into its root.
    pub fn files(&self) -> Result<BTreeMap<&'static str, Vec<u8>>, JitError> {
        let mut files = BTreeMap::new();
        files.insert(
            RUNNER_FILE,
            serde_json::to_vec_pretty(&self.runner).map_err(|_| JitError::BadFile(RUNNER_FILE))?,
        );
        files.insert(
            CREDENTIALS_FILE,
            serde_json::to_vec_pretty(&self.credentials)
                .map_err(|_| JitError::BadFile(CREDENTIALS_FILE))?,
        );
        files.insert(
            RSA_PARAMS_FILE,
            serde_json::to_vec_pretty(&self.rsa_params)
                .map_err(|_| JitError::BadFile(RSA_PARAMS_FILE))?,
        );
        Ok(files)
    }

    /// Encodes as GitHub's `encoded_jit_config`.
    pub fn encode(&self) -> Result<SecretString, JitError> {
        let map: BTreeMap<&str, String> = self
            .files()?
            .into_iter()
            .map(|(k, v)| (k, STANDARD.encode(v)))
            .collect();
        let json = serde_json::to_vec(&map).map_err(|_| JitError::NotJson)?;
        Ok(SecretString::from(STANDARD.encode(json)))
    }

    /// Decodes an `encoded_jit_config`.
    pub fn decode(encoded: &SecretString) -> Result<Self, JitError> {
        let outer = STANDARD
            .decode(encoded.expose_secret().trim())
            .map_err(|_| JitError::NotBase64)?;
        let map: BTreeMap<String, String> =
            serde_json::from_slice(&outer).map_err(|_| JitError::NotJson)?;
        fn file<T: serde::de::DeserializeOwned>(
            map: &BTreeMap<String, String>,
            name: &'static str,
        ) -> Result<T, JitError> {
            let b64 = map.get(name).ok_or(JitError::MissingFile(name))?;
            let raw = STANDARD.decode(b64).map_err(|_| JitError::BadFile(name))?;
            serde_json::from_slice(&raw).map_err(|_| JitError::BadFile(name))
        }
        Ok(Self {
            runner: file(&map, RUNNER_FILE)?,
            credentials: file(&map, CREDENTIALS_FILE)?,
            rsa_params: file(&map, RSA_PARAMS_FILE)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_has_the_real_outer_structure() {
        let s = JitSettings {
            runner: RunnerSettings {
                agent_id: 7,
                agent_name: "r".into(),
                pool_id: 1,
                pool_name: "Default".into(),
                server_url: "http://127.0.0.1:1/_runner".into(),
                git_hub_url: "http://127.0.0.1:1/_html/o/r".into(),
                work_folder: "_work".into(),
                ephemeral: true,
                disable_update: true,
            },
            credentials: CredentialSettings {
                scheme: "OAuth".into(),
                data: CredentialData {
                    client_id: "c".into(),
                    authorization_url: "u".into(),
                    require_fips_cryptography: "True".into(),
                },
            },
            rsa_params: RsaParams {
                d: "secret".into(),
                dp: String::new(),
                dq: String::new(),
                exponent: "AQAB".into(),
                inverse_q: String::new(),
                modulus: String::new(),
                p: String::new(),
                q: String::new(),
            },
        };
        let enc = s.encode().expect("encode");
        let outer = STANDARD.decode(enc.expose_secret()).expect("b64");
        let map: BTreeMap<String, String> = serde_json::from_slice(&outer).expect("json");
        let keys: Vec<&str> = map.keys().map(String::as_str).collect();
        assert_eq!(keys, [".credentials", ".credentials_rsaparams", ".runner"]);
        let back = JitSettings::decode(&enc).expect("decode");
        assert_eq!(back.runner.agent_id, 7);
        assert_eq!(back.rsa_params.d, "secret");
        assert!(!format!("{back:?}").contains("secret"));
    }
}
