//! The agent's Kubernetes client, counting every request it sends by verb
//! (`runner_manager_agent_api_requests_total`). The count is what leaves the process, so it
//! includes the watcher, the Lease, Events and the broker's token reviews: the benchmark of
//! API reads per attempt (`e2e/benches/scale_up.rs`, steady state) reads it.

use kube::Client;
use kube::client::{Body, ClientBuilder};

/// What a request does, from its method and query. A closed vocabulary (metric label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiVerb {
    /// A GET or LIST (one object or a collection).
    Read,
    /// A watch (a GET with `watch=true`/`watch=1`): long-lived, counted when opened.
    Watch,
    Create,
    Patch,
    Update,
    Delete,
    Other,
}

impl ApiVerb {
    pub const ALL: [Self; 7] = [
        Self::Read,
        Self::Watch,
        Self::Create,
        Self::Patch,
        Self::Update,
        Self::Delete,
        Self::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Watch => "watch",
            Self::Create => "create",
            Self::Patch => "patch",
            Self::Update => "update",
            Self::Delete => "delete",
            Self::Other => "other",
        }
    }

    /// The verb of a request with `method` and `query`. Pure.
    pub fn of(method: &axum::http::Method, query: Option<&str>) -> Self {
        use axum::http::Method;
        let watch =
            query.is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
        match *method {
            Method::GET if watch => Self::Watch,
            Method::GET => Self::Read,
            Method::POST => Self::Create,
            Method::PATCH => Self::Patch,
            Method::PUT => Self::Update,
            Method::DELETE => Self::Delete,
            _ => Self::Other,
        }
    }
}

/// The kube client of `config` with the counting layer.
pub fn client(
    config: kube::Config,
    metrics: std::sync::Arc<crate::agent::metrics::AgentMetrics>,
) -> Result<Client, kube::Error> {
    let counting = tower::util::MapRequestLayer::new(move |r: axum::http::Request<Body>| {
        metrics.api_request(ApiVerb::of(r.method(), r.uri().query()).as_str());
        r
    });
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&counting)
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Method;

    #[test]
    fn reads_and_watches_are_told_apart() {
        assert_eq!(ApiVerb::of(&Method::GET, None), ApiVerb::Read);
        assert_eq!(
            ApiVerb::of(&Method::GET, Some("labelSelector=a%3Db&limit=500")),
            ApiVerb::Read
        );
        assert_eq!(
            ApiVerb::of(
                &Method::GET,
                Some("labelSelector=a&watch=true&resourceVersion=1")
            ),
            ApiVerb::Watch
        );
        assert_eq!(ApiVerb::of(&Method::PATCH, None), ApiVerb::Patch);
        assert_eq!(ApiVerb::of(&Method::PUT, None), ApiVerb::Update);
        assert_eq!(ApiVerb::of(&Method::POST, None), ApiVerb::Create);
        assert_eq!(ApiVerb::of(&Method::DELETE, None), ApiVerb::Delete);
        assert_eq!(ApiVerb::of(&Method::HEAD, None), ApiVerb::Other);
    }

    #[test]
    fn every_verb_is_a_series_of_the_metric() {
        let exposed: Vec<&str> = ApiVerb::ALL.iter().map(|v| v.as_str()).collect();
        assert_eq!(exposed, crate::agent::metrics::API_VERBS);
    }
}
