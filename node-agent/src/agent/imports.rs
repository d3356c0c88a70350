//! No module of `agent/` imports another in a circle (issue 15): the test reads each file's
//! `super::…` and `crate::agent::…` paths (and, in `mod.rs`, the paths into its children) up to
//! the file's test module, builds the graph and fails on a cycle, naming it. A path to an item of
//! `mod.rs` (`super::Agent`) is an edge to `mod`.
//!
//! `mod.rs` is the process root (it wires the children in `run`); the context every stage is
//! handed (`Agent`) lives below the stages in `node`, so the root is checked like any module.

use std::collections::{BTreeMap, BTreeSet};

/// The modules `source` (the text of module `module`, one of `modules`) refers to.
pub fn references(module: &str, source: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let source = &source[..test_code_at(source)];
    // Comments name modules without importing them.
    let source: String = source
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let source = source.as_str();
    let mut found = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut add = |name: String| {
        if name.is_empty() {
            return;
        }
        let target = if modules.contains(&name) {
            name
        } else {
            "mod".to_owned()
        };
        if target != module {
            found.insert(target);
        }
    };
    if module == "mod" {
        // The parent names its children by their bare paths (`supervise::step`).
        for (i, _) in source.match_indices("::") {
            let before = &source[..i];
            let start = before
                .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
                .map_or(0, |j| j + 1);
            let name = &before[start..];
            let preceded = before[..start].ends_with("::");
            if !preceded && modules.contains(name) && name != "mod" {
                found.insert(name.to_owned());
            }
        }
        return found;
    }
    for prefix in ["super::", "crate::agent::"] {
        for (i, _) in source.match_indices(prefix) {
            let before = source[..i].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let rest = &source[i + prefix.len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // `use super::{Agent, cleanup, edges::{a, b}};`: the head of each item.
                let mut depth = 0;
                let mut item = String::new();
                for c in group.chars() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            add(ident(item.trim()));
                            item.clear();
                            continue;
                        }
                        _ => {}
                    }
                    item.push(c);
                }
                add(ident(item.trim()));
            } else {
                add(ident(rest));
            }
        }
    }
    found
}

/// Where the file's test code starts: the first `#[cfg(test)]` on a module with a body (a
/// `#[cfg(test)] mod x;` declaration is not test code of this file).
fn test_code_at(source: &str) -> usize {
    source
        .match_indices("#[cfg(test)]")
        .find(|(i, m)| {
            let rest = source[i + m.len()..].trim_start();
            rest.lines()
                .next()
                .is_some_and(|l| l.trim_end().ends_with('{'))
        })
        .map_or(source.len(), |(i, _)| i)
}

/// A cycle in `graph`, as the path around it, if there is one.
pub fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let from = path.iter().position(|n| n == node).unwrap_or(0);
                let mut around = path[from..].to_vec();
                around.push(node.to_owned());
                return Some(around);
            }
            None => {}
        }
        marks.insert(node.to_owned(), Mark::Open);
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, marks, path) {
                return Some(c);
            }
        }
        path.pop();
        marks.insert(node.to_owned(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if let Some(c) = visit(node, graph, &mut marks, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn modules(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn paths_grouped_imports_and_parent_items_are_read() {
        let m = modules(&["mod", "launch", "cleanup", "edges", "metrics", "events"]);
        let src = "//! see super::launch\nuse super::{Agent, cleanup, edges::{a, b}};\nuse super::events::{self, X};\nfn f() { super::metrics::global().x(); crate::agent::launch::go(); }\n#[cfg(test)]\nmod tests { use super::super::metrics; }";
        assert_eq!(
            references("supervise", src, &m),
            modules(&["mod", "cleanup", "edges", "events", "metrics", "launch"])
        );
        let parent = "pub mod launch;\n#[cfg(test)]\nmod imports;\nuse edges::x;\nfn f() { launch::go(); std::launch::no(); }";
        assert_eq!(references("mod", parent, &m), modules(&["edges", "launch"]));
    }

    #[test]
    fn a_cycle_is_found_and_named() {
        let graph: BTreeMap<String, BTreeSet<String>> = [
            ("a", modules(&["b"])),
            ("b", modules(&["c"])),
            ("c", modules(&["a"])),
            ("d", modules(&["a"])),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(
            cycle(&graph),
            Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
        );
        let mut acyclic = graph.clone();
        acyclic.insert("c".into(), BTreeSet::new());
        assert_eq!(cycle(&acyclic), None);
    }

    /// The agent's own modules.
    #[test]
    fn no_module_of_the_agent_imports_another_in_a_circle() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/agent");
        let mut sources = BTreeMap::new();
        for e in std::fs::read_dir(&dir).expect("src/agent") {
            let path = e.expect("entry").path();
            if path.extension().is_some_and(|x| x == "rs")
                && let Some(stem) = path.file_stem().and_then(|s| s.to_str())
            {
                let text = std::fs::read_to_string(&path).expect("source");
                sources.insert(stem.to_owned(), text);
            }
        }
        assert!(sources.len() > 20, "read {} files", sources.len());
        let names: BTreeSet<String> = sources.keys().cloned().collect();
        let graph: BTreeMap<String, BTreeSet<String>> = sources
            .iter()
            .map(|(m, text)| (m.clone(), references(m, text, &names)))
            .collect();
        if let Some(c) = cycle(&graph) {
            panic!(
                "modules of agent/ import each other in a circle: {}",
                c.join(" -> ")
            );
        }
    }
}
