//! The listener's environment (lifecycle spec §9.4, DESIGN §6 "Native provider"), later layers
//! winning: the inherited environment the caller chose, platform defaults, dependency caches,
//! the policy's `runner.env`, then `TMPDIR`/`TEMP`/`TMP` = `<runtime>/tmp`, which nothing can
//! override. `ACTIONS_RUNNER_INPUT_*` is reserved for the entry helper, which adds the JIT at
//! the final `exec` only: it is dropped from the inherited layer and refused from `runner.env`.
//!
//! `runner.env` is a tenant's: it may not name the dynamic loader's (`LD_*`) or the C library's
//! variables (`GCONV_PATH`, `GLIBC_TUNABLES`, `MALLOC_*`, …), the same classes the operator
//! refuses ([`runner_manager_crds::validate::reserved_env_name`]). The entry helper applies this
//! environment only at its final `exec`, after the uid change ([`crate::entry`]); the refusal is
//! the second wall, for a snapshot that reached the agent some other way.

use std::collections::BTreeMap;
use std::path::Path;

use runner_manager_crds::validate::{ReservedEnvName, reserved_env_name};

/// The variable the listener reads its JIT from (runner ≥ 2.336.0).
pub const JIT_VARIABLE: &str = "ACTIONS_RUNNER_INPUT_JITCONFIG";
/// Names no layer but the entry helper may set.
const RESERVED_PREFIX: &str = "ACTIONS_RUNNER_INPUT_";
const TMP_VARIABLES: [&str; 3] = ["TMPDIR", "TEMP", "TMP"];
/// `PATH` when the inherited layer has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A `runner.env` name the agent refuses. Carries the name (names are not secret; values are
/// never carried).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EnvironmentRefusal {
    #[error("runner.env may not set {0}: it is reserved for the runner's temporary directory")]
    ReservedTmp(String),
    #[error("runner.env may not set an ACTIONS_RUNNER_INPUT_ variable")]
    ReservedRunnerInput,
    #[error("runner.env may not set a RUNNER_MANAGER_ variable: the agent's own")]
    ReservedAgent,
    #[error(
        "runner.env may not set {0}: a dynamic-loader variable (LD_*) acts on every program the runner starts; remove it from the policy's runner.env"
    )]
    DynamicLoader(String),
    #[error(
        "runner.env may not set {0}: a C-library variable (GCONV_PATH, GLIBC_TUNABLES, MALLOC_*, NLSPATH, …) changes how every program behaves; remove it from the policy's runner.env"
    )]
    CLibrary(String),
    #[error("runner.env names an invalid variable")]
    InvalidName,
}

fn is_reserved_input(name: &str) -> bool {
    name.len() >= RESERVED_PREFIX.len()
        && name[..RESERVED_PREFIX.len()].eq_ignore_ascii_case(RESERVED_PREFIX)
}

fn valid_name(name: &str) -> bool {
    let mut b = name.bytes();
    matches!(b.next(), Some(c) if c == b'_' || c.is_ascii_alphabetic())
        && b.all(|c| c == b'_' || c.is_ascii_alphanumeric())
}

/// The layers of one launch.
#[derive(Clone, Debug, Default)]
pub struct EnvironmentLayers {
    /// What the agent passes through (its own environment, filtered by the caller).
    pub inherited: BTreeMap<String, String>,
    /// Dependency-cache variables of the attempt's target.
    pub caches: BTreeMap<String, String>,
    /// The snapshot's `runner.env`.
    pub runner_env: BTreeMap<String, String>,
}

/// Linux platform defaults: a `PATH` when none is inherited, and PowerShell telemetry opted
/// out unless the inherited layer already chose.
fn platform_defaults(inherited: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut d = BTreeMap::new();
    if inherited.get("PATH").is_none_or(String::is_empty) {
        d.insert("PATH".to_owned(), DEFAULT_PATH.to_owned());
    }
    if inherited
        .get("POWERSHELL_TELEMETRY_OPTOUT")
        .is_none_or(String::is_empty)
    {
        d.insert("POWERSHELL_TELEMETRY_OPTOUT".to_owned(), "1".to_owned());
    }
    // Without it a runner GitHub no longer accepts exits like any crash; with it, it exits 7,
    // which the agent concludes as `RunnerVersionRejected` (never retried).
    d.insert(
        "ACTIONS_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE".to_owned(),
        "1".to_owned(),
    );
    d
}

/// A runner listener's environment: the snapshot's `runner_env` over `PATH` alone (nothing
/// else of the agent's passes through) — the agent's own `PATH` for a host process, the image's
/// for a pod.
pub fn runner_environment(
    path: Option<String>,
    runner_env: &BTreeMap<String, String>,
    runtime: &Path,
) -> Result<BTreeMap<String, String>, EnvironmentRefusal> {
    layered_environment(
        &EnvironmentLayers {
            inherited: path
                .map(|p| BTreeMap::from([("PATH".to_owned(), p)]))
                .unwrap_or_default(),
            caches: BTreeMap::new(),
            runner_env: runner_env.clone(),
        },
        runtime,
    )
}

/// The complete environment of the listener but for the JIT.
pub fn layered_environment(
    layers: &EnvironmentLayers,
    runtime: &Path,
) -> Result<BTreeMap<String, String>, EnvironmentRefusal> {
    for name in layers.runner_env.keys() {
        if !valid_name(name) {
            return Err(EnvironmentRefusal::InvalidName);
        }
        if is_reserved_input(name) {
            return Err(EnvironmentRefusal::ReservedRunnerInput);
        }
        match reserved_env_name(name) {
            None => {}
            Some(ReservedEnvName::Agent) => return Err(EnvironmentRefusal::ReservedAgent),
            Some(ReservedEnvName::TempDir) => {
                return Err(EnvironmentRefusal::ReservedTmp(name.clone()));
            }
            Some(ReservedEnvName::DynamicLoader) => {
                return Err(EnvironmentRefusal::DynamicLoader(name.clone()));
            }
            Some(ReservedEnvName::CLibrary) => {
                return Err(EnvironmentRefusal::CLibrary(name.clone()));
            }
        }
    }
    let mut env: BTreeMap<String, String> = layers
        .inherited
        .iter()
        .filter(|(k, _)| !is_reserved_input(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    env.extend(platform_defaults(&layers.inherited));
    env.extend(
        layers
            .caches
            .iter()
            .filter(|(k, _)| !is_reserved_input(k))
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    env.extend(layers.runner_env.clone());
    let tmp = runtime.join("tmp").to_string_lossy().into_owned();
    for t in TMP_VARIABLES {
        env.insert(t.to_owned(), tmp.clone());
    }
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn later_layers_win_and_tmp_is_last() {
        let layers = EnvironmentLayers {
            inherited: map(&[
                ("HOME", "/agent"),
                ("TMPDIR", "/elsewhere"),
                ("ACTIONS_RUNNER_INPUT_JITCONFIG", "leak"),
                ("PATH", "/bin"),
            ]),
            caches: map(&[("ELECTRON_CACHE", "/c/e"), ("npm_config_cache", "/c/npm")]),
            runner_env: map(&[("ELECTRON_CACHE", "/r/e"), ("HOME", "/r/home")]),
        };
        let env = layered_environment(&layers, Path::new("/rt")).unwrap();
        assert_eq!(env["ELECTRON_CACHE"], "/r/e");
        assert_eq!(env["npm_config_cache"], "/c/npm");
        assert_eq!(env["HOME"], "/r/home");
        assert_eq!(env["PATH"], "/bin");
        assert_eq!(env["POWERSHELL_TELEMETRY_OPTOUT"], "1");
        for t in TMP_VARIABLES {
            assert_eq!(env[t], "/rt/tmp");
        }
        assert!(!env.keys().any(|k| k.starts_with("ACTIONS_RUNNER_INPUT_")));
    }

    #[test]
    fn an_inherited_telemetry_choice_is_kept_and_runner_env_overrides_it() {
        let mut layers = EnvironmentLayers {
            inherited: map(&[("POWERSHELL_TELEMETRY_OPTOUT", "no")]),
            ..Default::default()
        };
        let env = layered_environment(&layers, Path::new("/rt")).unwrap();
        assert_eq!(env["POWERSHELL_TELEMETRY_OPTOUT"], "no");
        layers.runner_env = map(&[("POWERSHELL_TELEMETRY_OPTOUT", "0")]);
        let env = layered_environment(&layers, Path::new("/rt")).unwrap();
        assert_eq!(env["POWERSHELL_TELEMETRY_OPTOUT"], "0");
    }

    #[test]
    fn runner_env_cannot_set_reserved_names_and_errors_carry_no_value() {
        for (name, want) in [
            ("tmpdir", EnvironmentRefusal::ReservedTmp("tmpdir".into())),
            ("TMP", EnvironmentRefusal::ReservedTmp("TMP".into())),
            (
                "actions_runner_input_jitconfig",
                EnvironmentRefusal::ReservedRunnerInput,
            ),
            ("1BAD", EnvironmentRefusal::InvalidName),
        ] {
            let layers = EnvironmentLayers {
                runner_env: map(&[(name, "ghp_secretvalue")]),
                ..Default::default()
            };
            let err = layered_environment(&layers, Path::new("/rt")).unwrap_err();
            assert_eq!(err, want);
            assert!(!err.to_string().contains("ghp_"));
        }
    }

    #[test]
    fn runner_env_cannot_set_loader_or_libc_variables() {
        // Each refusal names the variable it refused.
        type Refused = fn(&str) -> EnvironmentRefusal;
        let loader = |name: &str| EnvironmentRefusal::DynamicLoader(name.into());
        let libc = |name: &str| EnvironmentRefusal::CLibrary(name.into());
        let reserved = |_: &str| EnvironmentRefusal::ReservedAgent;
        let cases: [(&str, Refused); 11] = [
            ("LD_PRELOAD", loader),
            ("LD_LIBRARY_PATH", loader),
            ("ld_audit", loader),
            ("GCONV_PATH", libc),
            ("GLIBC_TUNABLES", libc),
            ("MALLOC_CHECK_", libc),
            ("NLSPATH", libc),
            ("HOSTALIASES", libc),
            ("RESOLV_HOST_CONF", libc),
            ("TZDIR", libc),
            ("RUNNER_MANAGER_RUNNER_ENV", reserved),
        ];
        for (name, refusal) in cases {
            let want = refusal(name);
            let layers = EnvironmentLayers {
                runner_env: map(&[("GOOD", "1"), (name, "/tmp/planted-by-a-job.so")]),
                ..Default::default()
            };
            let err = layered_environment(&layers, Path::new("/rt")).unwrap_err();
            assert_eq!(err, want);
            let text = err.to_string();
            assert!(!text.contains("planted"), "{text}");
        }
        // Near misses are ordinary names.
        let layers = EnvironmentLayers {
            runner_env: map(&[("LDFLAGS", "-L/opt"), ("OLD_PWD", "/x"), ("LANG", "C")]),
            ..Default::default()
        };
        assert!(layered_environment(&layers, Path::new("/rt")).is_ok());
    }
}
