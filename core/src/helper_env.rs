//! The entry helper's environment (`runner-manager-runner-entry`, in the node agent): how every
//! launcher (native units, the direct launcher, OCI runner pods) hands the listener's environment
//! to the helper, which decodes it and passes it to the listener at its final `exec`. Here, not
//! in the agent, because the operator builds OCI runner pods (issue 28) and the pod's
//! environment is this encoding. Pure.

use std::collections::BTreeMap;

/// The variable carrying the listener's environment to the helper ([`encode_environment`]).
pub const ENVIRONMENT_VARIABLE: &str = "RUNNER_MANAGER_RUNNER_ENV";
/// The helper's own `PATH`: fixed, never the policy's.
pub const HELPER_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";
/// The helper's own `LANG`: fixed, never the policy's.
pub const HELPER_LANG: &str = "C.UTF-8";

/// Bytes [`encode_environment`] writes as themselves: no white space, quote, backslash, `$`,
/// `%` or control character, so the encoded value is one word to every parser it passes
/// through (`systemd-run --setenv`, a unit's `Environment=`, a shell).
pub fn plain(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'_' | b'-' | b'.' | b'/' | b':' | b',' | b'+' | b'=' | b'@'
        )
}

/// The listener's environment as one opaque value: `NAME=value` records separated by NUL,
/// every byte outside [`plain`] as `%XX`.
pub fn encode_environment(env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    for (i, (name, value)) in env.iter().enumerate() {
        if i > 0 {
            out.push_str("%00");
        }
        for b in name
            .bytes()
            .chain(std::iter::once(b'='))
            .chain(value.bytes())
        {
            if plain(b) {
                out.push(char::from(b));
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
    }
    out
}

/// The helper's whole environment, as a launcher starts it: fixed `PATH` and `LANG`, and the
/// listener's environment encoded in [`ENVIRONMENT_VARIABLE`]. Nothing of `listener` acts before
/// the final `exec`.
pub fn helper_environment(listener: &BTreeMap<String, String>) -> Vec<(String, String)> {
    vec![
        ("PATH".to_owned(), HELPER_PATH.to_owned()),
        ("LANG".to_owned(), HELPER_LANG.to_owned()),
        (
            ENVIRONMENT_VARIABLE.to_owned(),
            encode_environment(listener),
        ),
    ]
}
