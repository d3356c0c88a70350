//! `actions/runner`'s latest release and the download of the stand-in package.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::fake_github::clock::iso8601;
use crate::fake_github::error::ApiError;
use crate::fake_github::shapes;
use crate::fake_github::state::FakeGithub;

/// `GET /repos/actions/runner/releases/latest`. The sha256 is published both as the asset's
/// `digest` and in the release body between the markers the real release notes use.
pub async fn latest(
    State(fake): State<Arc<FakeGithub>>,
    Path(params): Path<BTreeMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let is_runner = params
        .get("owner")
        .is_some_and(|o| o.eq_ignore_ascii_case("actions"))
        && params
            .get("repo")
            .is_some_and(|r| r.eq_ignore_ascii_case("runner"));
    let pkg = fake
        .package
        .as_ref()
        .filter(|_| is_runner)
        .ok_or_else(ApiError::not_found)?;
    let base = &fake.base_url;
    let api = format!("{base}/repos/actions/runner");
    let author = shapes::simple_user(base, "github-actions", 41_898_282, "Bot");
    let when = iso8601(1_700_000_000);
    Ok(Json(json!({
        "url": format!("{api}/releases/1"),
        "html_url": format!("{base}/_html/actions/runner/releases/tag/v{}", pkg.version),
        "assets_url": format!("{api}/releases/1/assets"),
        "upload_url": format!("{api}/releases/1/assets{{?name,label}}"),
        "tarball_url": format!("{api}/tarball/v{}", pkg.version),
        "zipball_url": format!("{api}/zipball/v{}", pkg.version),
        "id": 1,
        "node_id": "RE_fake1",
        "tag_name": format!("v{}", pkg.version),
        "target_commitish": "main",
        "name": format!("v{}", pkg.version),
        "body": format!("stand-in runner\n<!-- BEGIN SHA linux-x64 -->{}<!-- END SHA linux-x64 -->", pkg.sha256),
        "draft": false,
        "prerelease": false,
        "immutable": false,
        "created_at": when,
        "published_at": when,
        "author": author.clone(),
        "assets": [{
            "url": format!("{api}/releases/assets/1"),
            "browser_download_url": format!("{base}/_downloads/{}", pkg.file_name),
            "id": 1,
            "node_id": "RA_fake1",
            "name": pkg.file_name,
            "label": null,
            "state": "uploaded",
            "content_type": "application/gzip",
            "size": pkg.size,
            "digest": format!("sha256:{}", pkg.sha256),
            "download_count": 0,
            "created_at": when,
            "updated_at": when,
            "uploader": author,
        }],
    })))
}

/// `GET /_downloads/{file}`: the package bytes.
pub async fn download(
    State(fake): State<Arc<FakeGithub>>,
    Path(file): Path<String>,
) -> Result<Response, ApiError> {
    let pkg = fake
        .package
        .as_ref()
        .filter(|p| p.file_name == file)
        .ok_or_else(ApiError::not_found)?;
    let f = tokio::fs::File::open(&pkg.path)
        .await
        .map_err(|_| ApiError::not_found())?;
    let stream = tokio_util_stream(f);
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (header::CONTENT_LENGTH, pkg.size.to_string()),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

/// Streams a file in 64 KiB chunks without pulling in another crate.
fn tokio_util_stream(
    file: tokio::fs::File,
) -> impl futures_util::Stream<Item = std::io::Result<Vec<u8>>> {
    use tokio::io::AsyncReadExt;
    futures_util::stream::unfold(Some(file), |state| async move {
        let mut file = state?;
        let mut buf = vec![0u8; 64 * 1024];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(buf), Some(file)))
            }
            Err(e) => Some((Err(e), None)),
        }
    })
}
