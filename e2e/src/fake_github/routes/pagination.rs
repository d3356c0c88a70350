//! `per_page`/`page` paging with GitHub's `Link` header.

use axum::http::{HeaderValue, Uri};
use serde::Deserialize;

/// Query parameters of list endpoints. Kept as strings: GitHub ignores junk rather than failing.
#[derive(Debug, Default, Deserialize)]
pub struct PageQuery {
    pub per_page: Option<String>,
    pub page: Option<String>,
    pub name: Option<String>,
    pub status: Option<String>,
}

impl PageQuery {
    /// `per_page` defaults to 30 and is capped at 100; `page` starts at 1.
    #[must_use]
    pub fn window(&self) -> (usize, usize) {
        let per_page = self
            .per_page
            .as_deref()
            .and_then(|p| p.parse::<usize>().ok())
            .filter(|p| *p > 0)
            .unwrap_or(30)
            .min(100);
        let page = self
            .page
            .as_deref()
            .and_then(|p| p.parse::<usize>().ok())
            .filter(|p| *p > 0)
            .unwrap_or(1);
        (per_page, page)
    }
}

/// One page of `items`, and the `Link` header value when there is more than one page.
pub fn paginate<T: Clone>(
    items: &[T],
    query: &PageQuery,
    base: &str,
    uri: &Uri,
) -> (Vec<T>, Option<HeaderValue>) {
    let (per_page, page) = query.window();
    let start = per_page.saturating_mul(page - 1);
    let slice: Vec<T> = items.iter().skip(start).take(per_page).cloned().collect();
    let last = items.len().div_ceil(per_page).max(1);
    if last <= 1 {
        return (slice, None);
    }
    let others: Vec<String> = uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty() && !kv.starts_with("page=") && !kv.starts_with("per_page="))
        .map(str::to_owned)
        .collect();
    let link = |p: usize, rel: &str| {
        let mut q = others.clone();
        q.push(format!("per_page={per_page}"));
        q.push(format!("page={p}"));
        format!("<{base}{}?{}>; rel=\"{rel}\"", uri.path(), q.join("&"))
    };
    let mut rels = Vec::new();
    if page > 1 {
        rels.push(link(page - 1, "prev"));
    }
    if page < last {
        rels.push(link(page + 1, "next"));
    }
    rels.push(link(last, "last"));
    rels.push(link(1, "first"));
    (slice, HeaderValue::from_str(&rels.join(", ")).ok())
}

/// A list endpoint's answer: `{"total_count", "<key>": <this page>}` with its `Link` header.
pub fn page_response(
    items: &[serde_json::Value],
    key: &str,
    query: &PageQuery,
    base: &str,
    uri: &Uri,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let (page, link) = paginate(items, query, base, uri);
    let mut resp =
        axum::Json(serde_json::json!({"total_count": items.len(), key: page})).into_response();
    if let Some(link) = link {
        resp.headers_mut().insert("link", link);
    }
    resp
}
