//! Holds bodies to GitHub's official description: the OpenAPI subset for REST requests and
//! responses, the webhook schemas for `workflow_job` deliveries. The files are copied into this
//! crate's `testdata/github/` (see `PROVENANCE.md` there for their source and how to refresh them).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use jsonschema::Draft;
use serde_json::{Map, Value, json};

#[derive(Debug, thiserror::Error)]
pub enum ConformanceError {
    #[error(
        "GitHub's description {0} is missing; it belongs in the repository (e2e/testdata/github, see PROVENANCE.md there)"
    )]
    Missing(PathBuf),
    #[error("{0} is not readable JSON: {1}")]
    Unreadable(PathBuf, String),
    #[error("the description has no operation {0}")]
    NoOperation(String),
    #[error("{what}: the schema does not compile: {error}")]
    BadSchema { what: String, error: String },
    #[error("{what} does not match GitHub's description:\n{errors}\nbody: {body}")]
    Mismatch {
        what: String,
        errors: String,
        body: String,
    },
}

/// The official descriptions, loaded once per test; compiled validators are kept, because
/// compiling the larger schemas costs more than validating against them.
#[derive(Debug)]
pub struct Conformance {
    openapi: Value,
    webhooks: Value,
    compiled: Mutex<HashMap<String, Arc<jsonschema::Validator>>>,
}

/// Where the copied GitHub descriptions are (`e2e/testdata/github`).
#[must_use]
pub fn github_testdata_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/github")
}

fn load(name: &str) -> Result<Value, ConformanceError> {
    let path = github_testdata_dir().join(name);
    if !path.exists() {
        return Err(ConformanceError::Missing(path));
    }
    let text = std::fs::read_to_string(&path)
        .map_err(|e| ConformanceError::Unreadable(path.clone(), e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| ConformanceError::Unreadable(path, e.to_string()))
}

/// Turns OpenAPI 3.0 `nullable: true` into JSON Schema (`type: [T, "null"]`, `null` in enums).
#[must_use]
pub fn openapi_to_json_schema(v: &Value) -> Value {
    match v {
        Value::Array(items) => Value::Array(items.iter().map(openapi_to_json_schema).collect()),
        Value::Object(m) => {
            let mut out: Map<String, Value> = m
                .iter()
                .filter(|(k, _)| {
                    k.as_str() != "nullable" && k.as_str() != "example" && k.as_str() != "examples"
                })
                .map(|(k, v)| (k.clone(), openapi_to_json_schema(v)))
                .collect();
            if m.get("nullable") == Some(&Value::Bool(true)) {
                match out.get("type").cloned() {
                    Some(Value::String(t)) => {
                        out.insert("type".into(), json!([t, "null"]));
                        if let Some(Value::Array(e)) = out.get_mut("enum") {
                            e.push(Value::Null);
                        }
                    }
                    _ => {
                        return json!({"anyOf": [Value::Object(out), {"type": "null"}]});
                    }
                }
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

fn compile(what: &str, schema: &Value) -> Result<jsonschema::Validator, ConformanceError> {
    jsonschema::options()
        .with_draft(Draft::Draft7)
        .build(schema)
        .map_err(|e| ConformanceError::BadSchema {
            what: what.to_owned(),
            error: e.to_string(),
        })
}

fn check_with(
    what: String,
    validator: &jsonschema::Validator,
    body: &Value,
) -> Result<(), ConformanceError> {
    let errors: Vec<String> = validator
        .iter_errors(body)
        .take(8)
        .map(|e| format!("  at {}: {e}", e.instance_path()))
        .collect();
    if errors.is_empty() {
        return Ok(());
    }
    let mut shown = body.to_string();
    shown.truncate(2000);
    Err(ConformanceError::Mismatch {
        what,
        errors: errors.join("\n"),
        body: shown,
    })
}

/// GitHub's error body, for statuses the description does not list.
fn basic_error() -> Value {
    json!({
        "type": "object",
        "required": ["message", "documentation_url"],
        "properties": {"message": {"type": "string"}, "documentation_url": {"type": "string"}},
    })
}

impl Conformance {
    /// Loads both descriptions; fails with a clear message when they are absent.
    pub fn load() -> Result<Self, ConformanceError> {
        Ok(Self {
            openapi: load("openapi-runners-subset.json")?,
            webhooks: load("webhooks-workflow_job-schema.json")?,
            compiled: Mutex::new(HashMap::new()),
        })
    }

    /// Validates `body` against `schema`, compiling it once per `key`.
    fn check(
        &self,
        key: &str,
        what: String,
        schema: &Value,
        body: &Value,
    ) -> Result<(), ConformanceError> {
        let cached = self
            .compiled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned();
        let validator = match cached {
            Some(v) => v,
            None => {
                let v = Arc::new(compile(&what, schema)?);
                self.compiled
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(key.to_owned(), v.clone());
                v
            }
        };
        check_with(what, &validator, body)
    }

    fn operation(&self, method: &str, template: &str) -> Result<&Value, ConformanceError> {
        self.openapi
            .get("paths")
            .and_then(|p| p.get(template))
            .and_then(|p| p.get(method.to_ascii_lowercase()))
            .ok_or_else(|| ConformanceError::NoOperation(format!("{method} {template}")))
    }

    /// Checks a response body against the description of `method template` at `status`.
    /// An error status the description does not list must still be GitHub's error shape.
    pub fn check_response(
        &self,
        method: &str,
        template: &str,
        status: u16,
        body: &Value,
    ) -> Result<(), ConformanceError> {
        let op = self.operation(method, template)?;
        let what = format!("{method} {template} → {status}");
        let documented = op.get("responses").and_then(|r| r.get(status.to_string()));
        match documented {
            Some(resp) => match resp.pointer("/content/application~1json/schema") {
                Some(schema) => self.check(
                    &format!("response {method} {template} {status}"),
                    what,
                    &openapi_to_json_schema(schema),
                    body,
                ),
                None => Ok(()),
            },
            None if status >= 400 => self.check("basic-error", what, &basic_error(), body),
            None => Err(ConformanceError::Mismatch {
                what,
                errors: "  the description does not list this status".into(),
                body: body.to_string(),
            }),
        }
    }

    /// Checks a request body the fake accepted.
    pub fn check_request(
        &self,
        method: &str,
        template: &str,
        body: &Value,
    ) -> Result<(), ConformanceError> {
        let op = self.operation(method, template)?;
        // The key of its compiled schema is the operation's name, as it is said in a mismatch.
        let what = format!("request {method} {template}");
        match op.pointer("/requestBody/content/application~1json/schema") {
            Some(schema) => self.check(&what, what.clone(), &openapi_to_json_schema(schema), body),
            None => Ok(()),
        }
    }

    /// Checks a `workflow_job` delivery against the schema for its `action`.
    pub fn check_webhook(&self, body: &Value) -> Result<(), ConformanceError> {
        let action = body.get("action").and_then(Value::as_str).unwrap_or("");
        let key = format!("workflow-job-{}", action.replace('_', "-"));
        let schema = self
            .webhooks
            .get("webhooks")
            .and_then(|w| w.get(&key))
            .and_then(|w| w.pointer("/post/requestBody/content/application~1json/schema"))
            .ok_or_else(|| ConformanceError::NoOperation(key.clone()))?;
        self.check(&key, format!("webhook {key}"), schema, body)
    }
}
