//! `runner-manager-crds`: the API of runner-manager (`runner-manager.dev/v1alpha1`).
//!
//! Everything here is pure: the custom resource types, the attempt state machine and its
//! recovery decision, semantic validation, the JIT broker's wire types and the naming rules.
//! The operator and the node agent both depend on this crate and on nothing of each other.

pub mod attempt;
pub mod broker;
pub mod conditions;
pub mod duration;
pub mod lease;
pub mod names;
pub mod outcome;
pub mod patch;
pub mod policy;
pub mod recovery;
pub mod state;
pub mod target;
pub mod validate;

/// The API group of every runner-manager resource.
pub const GROUP: &str = "runner-manager.dev";
/// The one served and stored version.
pub const VERSION: &str = "v1alpha1";
/// The finalizer the operator puts on every attempt and removes once it is `Cleaned`.
pub const CLEANUP_FINALIZER: &str = "runner-manager.dev/cleanup";
/// Label naming an attempt's policy.
pub const POLICY_LABEL: &str = "runner-manager.dev/policy";
/// Label naming an attempt's node.
pub const NODE_LABEL: &str = "runner-manager.dev/node";
/// Annotation with which a person releases an attempt that can never be cleaned.
pub const ABANDON_ANNOTATION: &str = "runner-manager.dev/abandon";

/// The generated CRDs: (file name, YAML). `crdgen` writes them; a test compares them to the
/// committed files.
pub fn crd_documents() -> Vec<(&'static str, Result<String, serde_norway::Error>)> {
    use kube::CustomResourceExt;
    vec![
        (
            "scalepolicies.yaml",
            serde_norway::to_string(&policy::ScalePolicy::crd()),
        ),
        (
            "runnerattempts.yaml",
            serde_norway::to_string(&attempt::RunnerAttempt::crd()),
        ),
    ]
}

#[cfg(test)]
mod tests {
    /// The committed YAML is what the types generate: run `cargo run --bin crdgen` after changing
    /// an API type, and commit `crds/generated/`.
    #[test]
    fn committed_crds_are_fresh() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("generated");
        for (file, yaml) in super::crd_documents() {
            let want = yaml.unwrap();
            let path = dir.join(file);
            let have = std::fs::read_to_string(&path).unwrap_or_else(|e| {
                panic!("{}: {e}; run `cargo run --bin crdgen`", path.display())
            });
            assert!(
                have == want,
                "{} is stale: run `cargo run --bin crdgen` and commit crds/generated/",
                path.display()
            );
        }
    }
}
