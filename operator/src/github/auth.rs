//! Credentials (from the policy's Secret) and the tokens they yield. A GitHub App signs a
//! short-lived JWT (RS256) and exchanges it for a one-hour installation token, cached until five
//! minutes before expiry and refreshed by one caller at a time; a token (PAT) is used as is.
//! Errors name the Secret key to fix, never a value.
//!
//! Every key is also accepted under the name actions-runner-controller gives it
//! (`github_app_id`, `github_app_installation_id`, `github_app_private_key`, `github_token`), so a
//! team migrating from it can name its existing Secret; a Secret holding both spellings of one
//! key is refused rather than guessed.

use std::collections::BTreeMap;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use k8s_openapi::ByteString;
use secrecy::{ExposeSecret, SecretString};

/// Secret keys.
pub const KEY_APP_ID: &str = "appId";
pub const KEY_INSTALLATION_ID: &str = "installationId";
pub const KEY_PRIVATE_KEY: &str = "privateKey";
pub const KEY_TOKEN: &str = "token";

/// The same keys as actions-runner-controller names them, accepted as well.
pub const ARC_KEY_APP_ID: &str = "github_app_id";
pub const ARC_KEY_INSTALLATION_ID: &str = "github_app_installation_id";
pub const ARC_KEY_PRIVATE_KEY: &str = "github_app_private_key";
pub const ARC_KEY_TOKEN: &str = "github_token";

/// Every accepted spelling of each key: (ours, actions-runner-controller's).
pub const KEY_ALIASES: [(&str, &str); 4] = [
    (KEY_APP_ID, ARC_KEY_APP_ID),
    (KEY_INSTALLATION_ID, ARC_KEY_INSTALLATION_ID),
    (KEY_PRIVATE_KEY, ARC_KEY_PRIVATE_KEY),
    (KEY_TOKEN, ARC_KEY_TOKEN),
];

/// How a policy authenticates to GitHub.
pub enum Credentials {
    App {
        app_id: u64,
        installation_id: Option<u64>,
        key: EncodingKey,
    },
    Token(SecretString),
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::App {
                app_id,
                installation_id,
                ..
            } => f
                .debug_struct("App")
                .field("app_id", app_id)
                .field("installation_id", installation_id)
                .finish_non_exhaustive(),
            Self::Token(_) => f.write_str("Token(<redacted>)"),
        }
    }
}

/// What is wrong with a credentials Secret: the key, and how to fix it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CredentialsError {
    #[error(
        "the Secret has neither `{KEY_PRIVATE_KEY}` (with `{KEY_APP_ID}`) for a GitHub App nor `{KEY_TOKEN}` for a token (actions-runner-controller's `{ARC_KEY_APP_ID}`, `{ARC_KEY_PRIVATE_KEY}`, `{ARC_KEY_TOKEN}` are accepted too)"
    )]
    Empty,
    #[error("the Secret has both `{0}` and `{1}` (the same key, spelled two ways); keep one")]
    Duplicate(&'static str, &'static str),
    #[error("the Secret has both `{KEY_PRIVATE_KEY}` and `{KEY_TOKEN}`; keep one")]
    Ambiguous,
    #[error("key `{0}` is missing; add it to the Secret")]
    Missing(&'static str),
    #[error("key `{0}` is not valid UTF-8")]
    NotText(&'static str),
    #[error("key `{0}` must be a positive integer")]
    NotANumber(&'static str),
    #[error(
        "key `{KEY_PRIVATE_KEY}` is not an RSA private key in PEM (the .pem file GitHub generated for the App)"
    )]
    BadPrivateKey,
    #[error("key `{KEY_TOKEN}` is empty")]
    EmptyToken,
    #[error("signing the App JWT failed")]
    Signing,
}

/// The value of `key` (our spelling), found under it or under actions-runner-controller's
/// spelling, with the name it was found under (errors about the value name that one).
fn text<'a>(
    data: &'a BTreeMap<String, ByteString>,
    key: &'static str,
) -> Result<Option<(&'static str, &'a str)>, CredentialsError> {
    let arc = KEY_ALIASES
        .iter()
        .find(|(ours, _)| *ours == key)
        .map(|(_, arc)| *arc);
    let found = match (data.get(key), arc.and_then(|a| data.get(a).map(|v| (a, v)))) {
        (Some(_), Some((arc, _))) => return Err(CredentialsError::Duplicate(key, arc)),
        (Some(v), None) => Some((key, v)),
        (None, Some((arc, v))) => Some((arc, v)),
        (None, None) => None,
    };
    found
        .map(|(name, v)| {
            std::str::from_utf8(&v.0)
                .map(|t| (name, t))
                .map_err(|_| CredentialsError::NotText(name))
        })
        .transpose()
}

fn number(s: &str, key: &'static str) -> Result<u64, CredentialsError> {
    s.trim()
        .parse::<u64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or(CredentialsError::NotANumber(key))
}

impl Credentials {
    /// Read credentials from a Secret's data.
    pub fn from_secret_data(data: &BTreeMap<String, ByteString>) -> Result<Self, CredentialsError> {
        let key = text(data, KEY_PRIVATE_KEY)?;
        let token = text(data, KEY_TOKEN)?;
        match (key, token) {
            (Some(_), Some(_)) => Err(CredentialsError::Ambiguous),
            (None, None) => Err(CredentialsError::Empty),
            (None, Some((_, t))) => {
                let t = t.trim();
                if t.is_empty() {
                    return Err(CredentialsError::EmptyToken);
                }
                Ok(Self::Token(SecretString::from(t.to_owned())))
            }
            (Some((_, pem)), None) => {
                let (name, app_id) =
                    text(data, KEY_APP_ID)?.ok_or(CredentialsError::Missing(KEY_APP_ID))?;
                let app_id = number(app_id, name)?;
                let installation_id = text(data, KEY_INSTALLATION_ID)?
                    .map(|(name, s)| number(s, name))
                    .transpose()?;
                let key = EncodingKey::from_rsa_pem(pem.as_bytes())
                    .map_err(|_| CredentialsError::BadPrivateKey)?;
                Ok(Self::App {
                    app_id,
                    installation_id,
                    key,
                })
            }
        }
    }
}

#[derive(serde::Serialize)]
struct Claims {
    iat: i64,
    exp: i64,
    iss: String,
}

/// The App's JWT: `iat` 60 s in the past (clock drift), `exp` 9 minutes ahead (GitHub allows
/// at most 10), `iss` the App id.
pub fn app_jwt(
    app_id: u64,
    key: &EncodingKey,
    now_unix: i64,
) -> Result<SecretString, CredentialsError> {
    let claims = Claims {
        iat: now_unix - 60,
        exp: now_unix + 9 * 60,
        iss: app_id.to_string(),
    };
    jsonwebtoken::encode(&Header::new(Algorithm::RS256), &claims, key)
        .map(SecretString::from)
        .map_err(|_| CredentialsError::Signing)
}

/// An installation token and when it stops being used (five minutes before GitHub's expiry).
#[derive(Clone)]
pub struct CachedToken {
    pub token: SecretString,
    pub use_until_unix: i64,
}

impl std::fmt::Debug for CachedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedToken")
            .field("use_until_unix", &self.use_until_unix)
            .finish_non_exhaustive()
    }
}

/// Refresh this long before GitHub's expiry, so no request carries a token about to lapse.
pub const REFRESH_MARGIN_SECS: i64 = 5 * 60;

impl CachedToken {
    pub fn new(token: SecretString, expires_at_unix: i64) -> Self {
        Self {
            token,
            use_until_unix: expires_at_unix - REFRESH_MARGIN_SECS,
        }
    }

    pub fn is_fresh(&self, now_unix: i64) -> bool {
        now_unix < self.use_until_unix
    }
}

/// The `Authorization` header value of a token.
pub fn bearer(token: &SecretString) -> String {
    format!("Bearer {}", token.expose_secret())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, ByteString> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
            .collect()
    }

    #[test]
    fn secret_problems_name_the_key_never_the_value() {
        let cases: [(&[(&str, &str)], CredentialsError); 6] = [
            (&[], CredentialsError::Empty),
            (
                &[("token", "t"), ("privateKey", "k")],
                CredentialsError::Ambiguous,
            ),
            (
                &[("privateKey", "pem")],
                CredentialsError::Missing(KEY_APP_ID),
            ),
            (
                &[("privateKey", "pem"), ("appId", "x1")],
                CredentialsError::NotANumber(KEY_APP_ID),
            ),
            (
                &[("privateKey", "TOPSECRETPEM"), ("appId", "7")],
                CredentialsError::BadPrivateKey,
            ),
            (&[("token", "  ")], CredentialsError::EmptyToken),
        ];
        for (pairs, want) in cases {
            let got = Credentials::from_secret_data(&data(pairs)).unwrap_err();
            assert_eq!(got, want);
            assert!(!got.to_string().contains("TOPSECRETPEM"));
        }
        let token = Credentials::from_secret_data(&data(&[("token", "ghp_SECRET\n")])).unwrap();
        assert!(!format!("{token:?}").contains("ghp_SECRET"));
    }

    /// A Secret made for actions-runner-controller works as it is: its key names are accepted,
    /// and a key spelled both ways is refused with both names.
    #[test]
    fn actions_runner_controller_key_names_are_accepted() {
        let token = Credentials::from_secret_data(&data(&[
            ("github_token", "ghp_SECRET"),
            ("github_webhook_secret_token", "ignored"),
        ]))
        .unwrap();
        assert!(matches!(token, Credentials::Token(t) if t.expose_secret() == "ghp_SECRET"));

        let pem = rsa_pem();
        let app = Credentials::from_secret_data(&data(&[
            ("github_app_id", "12345"),
            ("github_app_installation_id", "678"),
            ("github_app_private_key", &pem),
        ]))
        .unwrap();
        assert!(matches!(
            app,
            Credentials::App {
                app_id: 12345,
                installation_id: Some(678),
                ..
            }
        ));
        // The two spellings mix (one Secret edited by hand during a migration).
        let mixed = Credentials::from_secret_data(&data(&[
            ("appId", "12345"),
            ("github_app_private_key", &pem),
        ]))
        .unwrap();
        assert!(matches!(
            mixed,
            Credentials::App {
                app_id: 12345,
                installation_id: None,
                ..
            }
        ));

        let cases: [(&[(&str, &str)], CredentialsError); 4] = [
            (
                &[("token", "a"), ("github_token", "b")],
                CredentialsError::Duplicate(KEY_TOKEN, ARC_KEY_TOKEN),
            ),
            (
                &[("github_token", "t"), ("github_app_private_key", "k")],
                CredentialsError::Ambiguous,
            ),
            (
                &[("github_app_private_key", "k"), ("github_app_id", "x")],
                CredentialsError::NotANumber(ARC_KEY_APP_ID),
            ),
            (
                &[("github_app_private_key", "k")],
                CredentialsError::Missing(KEY_APP_ID),
            ),
        ];
        for (pairs, want) in cases {
            assert_eq!(
                Credentials::from_secret_data(&data(pairs)).unwrap_err(),
                want
            );
        }
        assert!(
            CredentialsError::Empty
                .to_string()
                .contains("github_app_private_key")
        );
    }

    /// A throwaway RSA key in PEM (PKCS#8).
    fn rsa_pem() -> String {
        rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256)
            .unwrap()
            .serialize_pem()
    }

    #[test]
    fn cached_tokens_expire_five_minutes_early() {
        let t = CachedToken::new(SecretString::from("ghs_SECRETTOKEN"), 10_000);
        assert!(t.is_fresh(10_000 - 301));
        assert!(!t.is_fresh(10_000 - 300));
        assert!(!format!("{t:?}").contains("SECRETTOKEN"));
    }
}
