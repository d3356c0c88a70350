//! The core crate is the part of runner-manager that cannot reach a Kubernetes API server or
//! need an async runtime (issue 30 item 1): nothing it depends on, however indirectly, is kube,
//! k8s-openapi or tokio. Read from the workspace's `Cargo.lock`, which lists every package's
//! dependencies (dev-dependencies included, so a test helper pulling kube in fails too).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};

const CRATE: &str = "runner-manager-core";
const FORBIDDEN: [&str; 4] = ["kube", "kube-client", "k8s-openapi", "tokio"];

/// Package name → the names it depends on, from a `Cargo.lock` (version 3 or 4).
fn dependency_graph(lock: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph = BTreeMap::new();
    for package in lock.split("[[package]]").skip(1) {
        let name = package
            .lines()
            .find_map(|l| l.strip_prefix("name = "))
            .map(|n| n.trim_matches('"').to_owned())
            .expect("a package without a name");
        let mut deps = BTreeSet::new();
        if let Some(start) = package.find("dependencies = [") {
            let list = &package[start..];
            let list = &list[..list.find(']').expect("an unclosed dependency list")];
            for entry in list.split('"').skip(1).step_by(2) {
                // `name`, `name version` or `name version (source)`.
                deps.insert(entry.split(' ').next().unwrap_or(entry).to_owned());
            }
        }
        graph.entry(name).or_insert_with(BTreeSet::new).extend(deps);
    }
    graph
}

/// Every package reachable from `root`, each with the path that reached it.
fn reachable(graph: &BTreeMap<String, BTreeSet<String>>, root: &str) -> BTreeMap<String, String> {
    let mut seen = BTreeMap::from([(root.to_owned(), root.to_owned())]);
    let mut todo = vec![root.to_owned()];
    while let Some(p) = todo.pop() {
        let via = seen[&p].clone();
        for d in graph.get(&p).into_iter().flatten() {
            if !seen.contains_key(d) {
                seen.insert(d.clone(), format!("{via} → {d}"));
                todo.push(d.clone());
            }
        }
    }
    seen
}

#[test]
fn the_core_crate_depends_on_no_kubernetes_client_and_no_async_runtime() {
    let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.lock"))
        .expect("the workspace's Cargo.lock");
    let graph = dependency_graph(&lock);
    assert!(graph.contains_key(CRATE), "{CRATE} is not in Cargo.lock");
    let reached = reachable(&graph, CRATE);
    let bad: Vec<&String> = FORBIDDEN.iter().filter_map(|f| reached.get(*f)).collect();
    assert!(bad.is_empty(), "the core crate reaches {bad:?}");
    // The walk itself: the operator does reach them.
    let operator = reachable(&graph, "runner-manager-operator");
    for f in ["kube", "k8s-openapi", "tokio"] {
        assert!(
            operator.contains_key(f),
            "the walk missed {f} below the operator"
        );
    }
}
