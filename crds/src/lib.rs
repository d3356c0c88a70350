//! `runner-manager-crds`: the API of runner-manager (`runner-manager.dev/v1alpha1`).
//!
//! The custom resource types, the journal that applies the state machine to
//! `RunnerAttempt.status`, the recovery decision, semantic validation, the JIT broker's wire
//! types and the pod specs. No I/O. The vocabulary and rules that need no Kubernetes type (the
//! state machine, outcomes, targets, names, durations, the node's advert) live in
//! `runner-manager-core`; they are re-exported here under their old paths, so
//! `runner_manager_crds::state` is `runner_manager_core::state`.
//! The operator and the node agent both depend on this crate and on nothing of each other.

pub use runner_manager_core::{
    arch, duration, helper_env, hosts, lease, names, outcome, quantity, state, target,
};

pub mod attempt;
pub mod broker;
pub mod caches;
pub mod conditions;
#[cfg(feature = "fixtures")]
pub mod fixtures;
pub mod job_admission;
pub mod patch;
pub mod pods;
pub mod policy;
pub mod recovery;
pub mod reference;
#[cfg(feature = "scripted")]
pub mod scripted;
pub mod validate;
#[cfg(feature = "client")]
pub mod writer;

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
/// Annotation the operator sets when it creates an attempt: the policy generation it was made
/// for, which the failure count groups launches by.
pub const POLICY_GENERATION_ANNOTATION: &str = "runner-manager.dev/policy-generation";
/// Annotation the operator sets when it creates an attempt: the W3C `traceparent` of the
/// attempt's trace (only while it exports OpenTelemetry traces), so the agent's launch spans
/// join the operator's. Nothing decides on it.
pub const TRACEPARENT_ANNOTATION: &str = "runner-manager.dev/traceparent";

/// The generated CRDs: (file name, YAML). `crdgen` writes them; a test compares them to the
/// committed files.
pub fn crd_documents() -> Vec<(&'static str, Result<String, serde_norway::Error>)> {
    use kube::CustomResourceExt;
    vec![
        (
            "scalepolicies.yaml",
            serde_norway::to_string(&kept(policy::ScalePolicy::crd())),
        ),
        (
            "runnerattempts.yaml",
            serde_norway::to_string(&kept(attempt::RunnerAttempt::crd())),
        ),
    ]
}

/// `helm.sh/resource-policy: keep` on the files a chart or `kubectl apply` installs: deleting a
/// CRD deletes every ScalePolicy and RunnerAttempt with it (and with them the journal of runners
/// still running), so no `helm uninstall` or pruning tool may do it on its own.
fn kept(
    mut crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    crd.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("helm.sh/resource-policy".to_owned(), "keep".to_owned());
    crd
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    /// Go documentation that k8s-openapi carries into a schema (`Time`, `Quantity`, …): a field
    /// that inherits it reads as noise in `kubectl explain`; override it with a doc comment.
    const GO_DOC_TEXT: [&str; 4] = [
        "is a wrapper around",
        "Time is a wrapper",
        "Quantity is a fixed-point representation",
        "IntOrString is a type",
    ];

    /// Every property of `node` (and below) that has no description of its own, or one with Go's
    /// text, with its path.
    fn undescribed(node: &Value, path: &str, out: &mut Vec<String>) {
        let Some(obj) = node.as_object() else { return };
        if let Some(d) = obj.get("description").and_then(Value::as_str)
            && let Some(go) = GO_DOC_TEXT.iter().find(|t| d.contains(*t))
        {
            out.push(format!("{path}: Go documentation (\"{go}\")"));
        }
        if let Some(props) = obj.get("properties").and_then(Value::as_object) {
            for (name, prop) in props {
                let here = format!("{path}.{name}");
                let described = prop
                    .get("description")
                    .and_then(Value::as_str)
                    .is_some_and(|d| !d.trim().is_empty());
                if !described {
                    out.push(format!("{here}: no description"));
                }
                undescribed(prop, &here, out);
            }
        }
        if let Some(items) = obj.get("items") {
            undescribed(items, &format!("{path}[]"), out);
        }
        if let Some(values) = obj.get("additionalProperties") {
            undescribed(values, &format!("{path}{{}}"), out);
        }
        for key in ["anyOf", "oneOf", "allOf"] {
            for (i, alt) in obj
                .get(key)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                undescribed(alt, &format!("{path}<{key}[{i}]>"), out);
            }
        }
    }

    fn schemas() -> Vec<(&'static str, Value)> {
        use kube::CustomResourceExt;
        [
            ("ScalePolicy", super::policy::ScalePolicy::crd()),
            ("RunnerAttempt", super::attempt::RunnerAttempt::crd()),
        ]
        .into_iter()
        .map(|(kind, crd)| {
            let crd = serde_json::to_value(crd).unwrap();
            (
                kind,
                crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone(),
            )
        })
        .collect()
    }

    /// `kubectl explain` and the generated reference read these descriptions: every field of both
    /// kinds has one of its own, and none is Go's documentation of a Kubernetes type.
    #[test]
    fn every_field_is_described() {
        let mut missing = Vec::new();
        for (kind, schema) in schemas() {
            undescribed(&schema, kind, &mut missing);
        }
        assert!(
            missing.is_empty(),
            "fields without a description of their own (add a doc comment on the Rust field):\n{}",
            missing.join("\n")
        );
    }

    /// The walk above finds what it should: a property without a description, and Go's text.
    #[test]
    fn the_description_walk_finds_gaps() {
        let schema = serde_json::json!({
            "description": "root",
            "properties": {
                "a": {"type": "string"},
                "b": {"description": "ok", "properties": {
                    "t": {"description": "Time is a wrapper around time.Time which supports correct marshaling"}
                }},
                "m": {"description": "map", "additionalProperties": {"properties": {"x": {}}}}
            }
        });
        let mut out = Vec::new();
        undescribed(&schema, "K", &mut out);
        out.sort();
        assert_eq!(out.len(), 3, "{out:?}");
        assert!(out[0].starts_with("K.a: no description"));
        assert!(out.iter().any(|p| p.starts_with("K.b.t: Go documentation")));
        assert!(out.iter().any(|p| p == "K.m{}.x: no description"));
    }

    /// Conditions are a map list keyed by `type` (one condition per type; server-side apply
    /// merges them by type).
    #[test]
    fn conditions_are_a_map_list_keyed_by_type() {
        for (kind, schema) in schemas() {
            let conditions = &schema["properties"]["status"]["properties"]["conditions"];
            assert_eq!(conditions["x-kubernetes-list-type"], "map", "{kind}");
            assert_eq!(
                conditions["x-kubernetes-list-map-keys"],
                serde_json::json!(["type"]),
                "{kind}"
            );
            let required = conditions["items"]["required"].as_array().unwrap();
            assert!(
                required.contains(&Value::from("type")),
                "{kind}: a map key must be required"
            );
        }
    }

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
