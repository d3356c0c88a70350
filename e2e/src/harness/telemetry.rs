//! Observing the processes as a platform team would (issue 17): scraping their `/metrics`
//! (OpenMetrics text) and probes, and an OTLP/HTTP receiver that decodes the official OTLP
//! protobufs (`opentelemetry-proto`'s prost types) the real operator and agents export.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;

/// The agent's `/metrics`, `/healthz`, `/readyz` address, from the line it logs once it serves
/// (`health=ADDR` in text, `fields.health` in JSON).
pub fn agent_health(lines: &[String]) -> Option<String> {
    lines.iter().find_map(|l| {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(l) {
            return v["fields"]["health"]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_owned);
        }
        let at = l.find(" health=")?;
        let addr = l[at + " health=".len()..].split_whitespace().next()?;
        (!addr.is_empty()).then(|| addr.to_owned())
    })
}

/// One scrape: the status, the `Content-Type` and the body.
#[derive(Clone, Debug)]
pub struct Scrape {
    pub status: u16,
    pub content_type: String,
    pub body: String,
}

/// `GET http://{addr}{path}`.
pub async fn get(addr: &str, path: &str) -> Result<Scrape, String> {
    let r = reqwest::get(format!("http://{addr}{path}"))
        .await
        .map_err(|e| format!("GET {path}: {e}"))?;
    let status = r.status().as_u16();
    let content_type = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = r.text().await.map_err(|e| format!("GET {path}: {e}"))?;
    Ok(Scrape {
        status,
        content_type,
        body,
    })
}

/// The value of the sample `name{labels}` (labels exactly as exposed, e.g.
/// `outcome="started"`; empty for none). Pure.
pub fn sample(body: &str, name: &str, labels: &str) -> Option<f64> {
    let key = if labels.is_empty() {
        name.to_owned()
    } else {
        format!("{name}{{{labels}}}")
    };
    body.lines().find_map(|l| {
        let rest = l.strip_prefix(&key)?;
        let value = rest.strip_prefix(' ')?;
        value.split_whitespace().next()?.parse().ok()
    })
}

/// The families (`# TYPE` lines) of an exposition. Pure.
pub fn families(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// One span as received.
#[derive(Clone, Debug, PartialEq)]
pub struct ReceivedSpan {
    pub service: String,
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root.
    pub parent_span_id: String,
    /// Span ids this span links to (`follows_from`).
    pub links: Vec<String>,
    /// String, integer and boolean attributes, as text.
    pub attributes: HashMap<String, String>,
}

/// An OTLP/HTTP (protobuf) trace receiver on loopback: `POST /v1/traces`.
#[derive(Debug)]
pub struct OtlpReceiver {
    pub endpoint: String,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn traces(State(spans): State<Arc<Mutex<Vec<ReceivedSpan>>>>, body: Bytes) -> Vec<u8> {
    if let Ok(req) = ExportTraceServiceRequest::decode(body) {
        let mut out = spans.lock().unwrap_or_else(PoisonError::into_inner);
        for rs in req.resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| text(kv.value.as_ref()?.value.as_ref()?))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    out.push(ReceivedSpan {
                        service: service.clone(),
                        name: s.name,
                        trace_id: hex::encode(&s.trace_id),
                        span_id: hex::encode(&s.span_id),
                        parent_span_id: hex::encode(&s.parent_span_id),
                        links: s.links.iter().map(|l| hex::encode(&l.span_id)).collect(),
                        attributes: s
                            .attributes
                            .iter()
                            .filter_map(|kv| {
                                Some((kv.key.clone(), text(kv.value.as_ref()?.value.as_ref()?)?))
                            })
                            .collect(),
                    });
                }
            }
        }
    }
    ExportTraceServiceResponse::default().encode_to_vec()
}

fn text(v: &AnyValue) -> Option<String> {
    match v {
        AnyValue::StringValue(s) => Some(s.clone()),
        AnyValue::IntValue(i) => Some(i.to_string()),
        AnyValue::BoolValue(b) => Some(b.to_string()),
        AnyValue::DoubleValue(d) => Some(d.to_string()),
        _ => None,
    }
}

impl OtlpReceiver {
    pub async fn start() -> Result<Self, String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("bind: {e}"))?;
        let addr = listener.local_addr().map_err(|e| format!("addr: {e}"))?;
        let spans = Arc::new(Mutex::new(Vec::new()));
        let app = axum::Router::new()
            .route("/v1/traces", post(traces))
            .with_state(spans.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            endpoint: format!("http://{addr}"),
            spans,
            task,
        })
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The environment that points a process's OTLP exporter here, flushing every 200 ms.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT", self.endpoint.clone()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".to_owned()),
            ("OTEL_BSP_SCHEDULE_DELAY", "200".to_owned()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_families_and_the_logged_address_are_read() {
        let body = "# TYPE runner_manager_agent_launches counter\n\
                    runner_manager_agent_launches_total{outcome=\"started\"} 2\n\
                    runner_manager_agent_ready 1\n# EOF\n";
        assert_eq!(
            sample(
                body,
                "runner_manager_agent_launches_total",
                "outcome=\"started\""
            ),
            Some(2.0)
        );
        assert_eq!(sample(body, "runner_manager_agent_ready", ""), Some(1.0));
        assert_eq!(sample(body, "runner_manager_agent_re", ""), None);
        assert_eq!(families(body), ["runner_manager_agent_launches"]);
        let text = "2026-01-01T00:00:00Z  INFO runner_manager_node_agent::agent: node n serving (capacity 4) node=n capacity=4 health=127.0.0.1:4567".to_owned();
        assert_eq!(agent_health(&[text]).as_deref(), Some("127.0.0.1:4567"));
        let json = r#"{"fields":{"message":"node n serving","health":"127.0.0.1:80"}}"#.to_owned();
        assert_eq!(agent_health(&[json]).as_deref(), Some("127.0.0.1:80"));
    }
}
