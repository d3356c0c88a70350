//! `docs/parity.md` against the tests it cites: every `covered:` row names test functions that
//! exist (a file of the repository, each `mod` on the way, and a `fn` under a test attribute or
//! in a `proptest!` block), every other citation names a function that exists, and the summary's
//! counts are the rows' statuses. The page is how a reader learns what the predecessor's tests
//! became; a citation left behind by a rename would tell them a behaviour is pinned when nothing
//! pins it. Reads files only.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// A table row of the page: its number and its cells.
struct Row {
    number: u32,
    cells: Vec<String>,
}

fn rows(page: &str) -> Vec<Row> {
    page.lines()
        .filter_map(|l| {
            let inner = l.strip_prefix("| ")?.strip_suffix(" |")?;
            let cells: Vec<String> = inner.split(" | ").map(|c| c.trim().to_owned()).collect();
            let number = cells.first()?.parse().ok()?;
            (cells.len() >= 7).then_some(Row { number, cells })
        })
        .collect()
}

/// `path.rs::mod::…::name` citations in `text` (backticks optional).
fn citations(text: &str) -> Vec<(String, Vec<String>)> {
    text.split(|c: char| c.is_whitespace() || c == ',' || c == '`' || c == '(' || c == ')')
        .filter_map(|token| {
            let (path, rest) = token.split_once(".rs::")?;
            let segments: Vec<String> = rest
                .trim_end_matches(['.', ';', ':'])
                .split("::")
                .map(str::to_owned)
                .collect();
            let ok = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_');
            (segments.iter().all(|s| ok(s))
                && path
                    .chars()
                    .all(|c| c.is_alphanumeric() || "_-./".contains(c)))
            .then(|| (format!("{path}.rs"), segments))
        })
        .collect()
}

/// Why `path::segments` does not resolve, if it does not; `test` asks for a test function.
fn unresolved(path: &str, segments: &[String], test: bool) -> Option<String> {
    let Ok(source) = std::fs::read_to_string(repo().join(path)) else {
        return Some(format!("{path}: no such file"));
    };
    let (name, modules) = segments.split_last()?;
    for m in modules {
        if !source.contains(&format!("mod {m} ")) && !source.contains(&format!("mod {m}{{")) {
            return Some(format!("{path}: no `mod {m}`"));
        }
    }
    let lines: Vec<&str> = source.lines().collect();
    let at = lines.iter().position(|l| {
        let l = l.trim_start();
        [
            "fn ",
            "async fn ",
            "pub fn ",
            "pub async fn ",
            "pub(crate) fn ",
            "pub(crate) async fn ",
        ]
        .iter()
        .any(|p| {
            l.strip_prefix(p).is_some_and(|r| {
                r.starts_with(name.as_str()) && r[name.len()..].starts_with(['(', '<'])
            })
        })
    });
    let Some(at) = at else {
        return Some(format!("{path}: no `fn {name}`"));
    };
    if !test {
        return None;
    }
    // A test attribute among the lines just above (doc comments and other attributes may sit
    // between), or a property test.
    let attributed = lines[at.saturating_sub(40)..at]
        .iter()
        .rev()
        .take_while(|l| {
            let l = l.trim_start();
            l.starts_with("#[") || l.starts_with("///") || l.starts_with("//") || l.is_empty()
        })
        .any(|l| l.trim_start().starts_with("#[") && l.contains("test"));
    let property = lines
        .iter()
        .any(|l| l.trim_start().starts_with("proptest! {"));
    (!attributed && !property).then(|| format!("{path}: `fn {name}` is not a test"))
}

#[test]
fn every_citation_of_the_parity_page_resolves_and_the_summary_counts_its_rows() {
    let page = std::fs::read_to_string(repo().join("docs/parity.md")).unwrap_or_default();
    assert!(!page.is_empty(), "docs/parity.md is missing");
    let rows = rows(&page);
    let mut problems = Vec::new();
    let mut statuses: BTreeMap<&str, usize> = BTreeMap::new();
    for row in &rows {
        let status = row.cells.last().map(String::as_str).unwrap_or_default();
        let kind = ["covered:", "planned:", "unplanned:", "n/a:"]
            .into_iter()
            .find(|k| status.starts_with(k))
            .map(|k| k.trim_end_matches(':'));
        match kind {
            Some(k) => *statuses.entry(k).or_default() += 1,
            None => problems.push(format!("row {}: status `{status}`", row.number)),
        }
        if kind == Some("covered") && citations(status).is_empty() {
            problems.push(format!("row {}: covered, but cites no test", row.number));
        }
        let last = row.cells.len() - 1;
        for (i, cell) in row.cells.iter().enumerate() {
            let covered_cell = kind == Some("covered") && i == last;
            for (path, segments) in citations(cell) {
                if let Some(why) = unresolved(&path, &segments, covered_cell) {
                    problems.push(format!("row {}: {why}", row.number));
                }
            }
        }
    }
    // The summary table: `| covered | 84 |`, …, `| **total** | **116** |`.
    let summary = |label: &str| -> Option<usize> {
        page.lines().find_map(|l| {
            let rest = l.strip_prefix(&format!("| {label} | "))?;
            rest.trim_start_matches('*')
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
    };
    for kind in ["covered", "planned", "unplanned", "n/a"] {
        let counted = statuses.get(kind).copied().unwrap_or(0);
        let said = summary(kind);
        if said.unwrap_or(0) != counted {
            problems.push(format!(
                "summary says {said:?} {kind}, the rows say {counted}"
            ));
        }
    }
    if summary("**total**") != Some(rows.len()) {
        problems.push(format!(
            "summary total {:?}, {} rows",
            summary("**total**"),
            rows.len()
        ));
    }
    println!("{} rows, {statuses:?}", rows.len());
    assert!(
        problems.is_empty(),
        "docs/parity.md:\n{}",
        problems.join("\n")
    );
}

#[test]
fn citations_are_read_as_path_modules_and_name() {
    assert_eq!(
        citations("covered: `e2e/tests/e2e/agent.rs::a_b`, node-agent/src/x.rs::tests::c_d (x)"),
        vec![
            ("e2e/tests/e2e/agent.rs".to_owned(), vec!["a_b".to_owned()]),
            (
                "node-agent/src/x.rs".to_owned(),
                vec!["tests".to_owned(), "c_d".to_owned()]
            ),
        ]
    );
    assert!(unresolved("e2e/tests/e2e/parity.rs", &["no_such_fn".to_owned()], true).is_some());
    assert!(
        unresolved(
            "e2e/tests/e2e/parity.rs",
            &["citations_are_read_as_path_modules_and_name".to_owned()],
            true
        )
        .is_none()
    );
    assert!(unresolved("e2e/tests/e2e/parity.rs", &["repo".to_owned()], true).is_some());
}
