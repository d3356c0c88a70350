//! A scripted API server for unit tests of what writes to the cluster (controller-rs's
//! `ApiServerVerifier`, issue 30 item 7): a `kube::Client` whose every request is recorded and
//! answered by the test's own function, in process, with no cluster. A test then asserts which
//! requests a stage sent and in which order, and how it takes an answer the API server can give
//! (a conflict, a 500, a 404). The end-to-end tests prove the same stages against a real API
//! server; these pin their order and error handling one request at a time. One home for the
//! operator's stages (`controller::scripted`) and the agent's (`agent::scripted`), behind this
//! crate's `scripted` feature, which only dev-dependencies enable.

use std::sync::{Arc, Mutex};

use http::{Request, Response};
use http_body_util::BodyExt;
use serde_json::{Value, json};

/// One request the stage sent.
#[derive(Clone, Debug, PartialEq)]
pub struct Seen {
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The JSON body (`null` when there is none).
    pub body: Value,
}

impl Seen {
    /// Whether this is an Event (sent from its own queue, in no fixed order with the writes).
    pub fn is_event(&self) -> bool {
        self.path.contains("/events")
    }

    /// `METHOD <plural>/<name>[/<subresource>]` (`PATCH runnerattempts/a1/status`): what the
    /// order assertions read.
    pub fn short(&self) -> String {
        let tail = ["/runnerattempts/", "/scalepolicies/"]
            .iter()
            .find_map(|plural| {
                let (_, rest) = self.path.split_once(plural)?;
                Some(format!("{}{rest}", &plural[1..]))
            })
            .unwrap_or_else(|| self.path.clone());
        format!("{} {tail}", self.method)
    }
}

/// What the script answers: a status and a JSON body.
pub type Answer = (u16, Value);

/// The requests a client sent, in order.
#[derive(Clone, Debug, Default)]
pub struct Recorded(Arc<Mutex<Vec<Seen>>>);

impl Recorded {
    /// Every request but Events, as [`Seen::short`].
    pub fn writes(&self) -> Vec<String> {
        self.all()
            .iter()
            .filter(|s| !s.is_event())
            .map(Seen::short)
            .collect()
    }

    /// Every request that changes something (not an Event, not a read), as [`Seen::short`]:
    /// what a stage that re-reads before each write is asserted on.
    pub fn changes(&self) -> Vec<String> {
        self.writes()
            .into_iter()
            .filter(|w| !w.starts_with("GET "))
            .collect()
    }

    pub fn all(&self) -> Vec<Seen> {
        self.0.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// The body of the first request whose [`Seen::short`] is `short` (`null` when none).
    pub fn body_of(&self, short: &str) -> Value {
        self.all()
            .into_iter()
            .find(|s| s.short() == short)
            .map_or(Value::Null, |s| s.body)
    }
}

/// A client whose requests `answer` answers, and their record.
pub fn client(
    answer: impl Fn(&Seen) -> Answer + Send + Sync + 'static,
) -> (kube::Client, Recorded) {
    let recorded = Recorded::default();
    let log = recorded.clone();
    let answer = Arc::new(answer);
    let service = tower::service_fn(move |req: Request<kube::client::Body>| {
        let log = log.clone();
        let answer = answer.clone();
        async move {
            let method = req.method().to_string();
            let path = req.uri().path().to_owned();
            let bytes = req.into_body().collect().await?.to_bytes();
            let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let seen = Seen { method, path, body };
            let (status, reply) = answer(&seen);
            if let Ok(mut v) = log.0.lock() {
                v.push(seen);
            }
            let response = Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(kube::client::Body::from(serde_json::to_vec(&reply)?))?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(response)
        }
    });
    (kube::Client::new(service, "default"), recorded)
}

/// The API server's answer to a write of an object that is gone.
pub fn not_found() -> Answer {
    (
        404,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
    )
}

/// A successful deletion's answer.
pub fn deleted() -> Answer {
    (
        200,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200}),
    )
}

/// A 500 as the API server words it.
pub fn internal_error() -> Answer {
    (
        500,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "InternalError", "code": 500, "message": "etcd timed out"}),
    )
}
