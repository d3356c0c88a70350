//! The cold install of one package, step by step (issue 15 item 9: cold launch ≤ 1.5 s): the
//! archive served over loopback HTTP, then downloaded, checked, extracted, fingerprinted and
//! proven by the package cache and mounted as an overlay lower (`--copy` for the checked copy),
//! each step's time printed; then the same steps one by one outside the cache, for the split.
//!
//! `cargo run -p runner-manager-node-agent --example cold_install -- <archive.tar.gz> [--copy]`
//! (root, for the mount). The runner-sized stand-in the benches use sits under
//! `target/e2e-cache/packages/*/`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Instant;

use runner_manager_crds::hosts::HostList;
use runner_manager_node_agent::packages::download::{
    DownloadLimits, Downloader, RetryPolicy, Timeouts,
};
use runner_manager_node_agent::packages::extract::{ExtractLimits, extract_tar_gz};
use runner_manager_node_agent::packages::fingerprint::fingerprint;
use runner_manager_node_agent::packages::origin::prove_origin;
use runner_manager_node_agent::packages::overlay::{self, Materializer};
use runner_manager_node_agent::packages::{PackageCache, PackageRef, RuntimeKind};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn ms(d: std::time::Duration) -> String {
    format!("{} ms", d.as_millis())
}

/// Serves `body` to every connection, once each.
async fn serve(body: std::sync::Arc<Vec<u8>>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let body = std::sync::Arc::clone(&body);
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(&body).await;
            });
        }
    });
    format!("http://{addr}/package.tar.gz")
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt().with_target(false).init();
    let args: Vec<String> = std::env::args().collect();
    let archive = PathBuf::from(args.get(1).expect("the archive's path"));
    let copy = args.iter().any(|a| a == "--copy");
    let body = std::fs::read(&archive).unwrap();
    let sha = hex::encode(Sha256::digest(&body));
    let size = body.len();
    let url = serve(std::sync::Arc::new(body)).await;
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let dir = tempfile::Builder::new()
        .prefix("rm-cold-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let limits = DownloadLimits {
        http_hosts: HostList::parse("127.0.0.1").unwrap(),
        ..DownloadLimits::default()
    };
    let downloader =
        Downloader::with_limits(RetryPolicy::PRODUCTION, Timeouts::PRODUCTION, limits).unwrap();
    println!(
        "archive {:.0} MB, {threads} threads, load {}",
        size as f64 / 1e6,
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );

    // The cache, end to end.
    let cache = PackageCache::new(dir.path().join("packages"), downloader.clone())
        .unwrap()
        .with_materializer(if copy {
            Materializer::Copy
        } else {
            Materializer::Overlay
        });
    let runtime = dir.path().join("runtime");
    std::fs::create_dir(&runtime).unwrap();
    let started = Instant::now();
    let m = cache
        .materialize(
            "a",
            PackageRef {
                sha256: &sha,
                url: &url,
            },
            &runtime,
            RuntimeKind::Ephemeral,
        )
        .await
        .unwrap();
    println!(
        "cache materialize ({}): {} (install {}, verify {}, lay in {}; split in the \
         'package install step' lines above)",
        m.by.as_str(),
        ms(started.elapsed()),
        ms(m.timings.install),
        ms(m.timings.verify),
        ms(m.timings.copy)
    );
    if !copy {
        let _ = overlay::unmount(&runtime);
    }

    // The steps one by one.
    let part = dir.path().join("download");
    let started = Instant::now();
    downloader.fetch(&url, &sha, &part).await.unwrap();
    println!(
        "download + sha256 (no extraction): {}",
        ms(started.elapsed())
    );
    let started = Instant::now();
    let mut gz =
        flate2::read::GzDecoder::new(std::io::BufReader::new(std::fs::File::open(&part).unwrap()));
    let n = std::io::copy(&mut gz, &mut std::io::sink()).unwrap();
    println!("inflate only ({n} bytes): {}", ms(started.elapsed()));
    let started = Instant::now();
    let _ = std::fs::read(&part).map(|b| Sha256::digest(&b));
    println!("read + sha256 of the archive: {}", ms(started.elapsed()));
    let tree = dir.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    let started = Instant::now();
    let contents = extract_tar_gz(&part, &tree, ExtractLimits::default()).unwrap();
    println!(
        "extract + hash ({} files): {}",
        contents.files(),
        ms(started.elapsed())
    );
    let started = Instant::now();
    let print = fingerprint(&tree).unwrap();
    println!("fingerprint: {}", ms(started.elapsed()));
    let started = Instant::now();
    assert!(prove_origin(&tree, &contents, print, threads).unwrap());
    println!("proof (read every byte again): {}", ms(started.elapsed()));
}
