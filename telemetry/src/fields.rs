//! The field names a crate's source gives its `tracing` events and spans, found by reading the
//! source: what each binary's test compares with its allow-list, so a field added without being
//! allowed fails a test instead of vanishing from every log line in production.
//!
//! It reads the arguments of `event!`-style macros (`trace!` … `error!`, before the message) and
//! `*_span!` macros (after the span's name), and `.record("name", …)` calls. Good enough for the
//! forms this workspace writes; a form it does not know is reported as unparsed rather than
//! skipped.

/// One field name and the source line it is on (1-based).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldUse {
    pub name: String,
    pub line: usize,
}

const EVENTS: [&str; 5] = ["trace!(", "debug!(", "info!(", "warn!(", "error!("];
const SPANS: [&str; 5] = [
    "trace_span!(",
    "debug_span!(",
    "info_span!(",
    "warn_span!(",
    "error_span!(",
];

/// Every field name `source` gives an event or a span.
pub fn emitted_field_names(source: &str) -> Vec<FieldUse> {
    let mut found = Vec::new();
    let line_of = |at: usize| source[..at].matches('\n').count() + 1;
    for (macros, fields_after_name) in [(&EVENTS, false), (&SPANS, true)] {
        for m in macros.iter() {
            let mut from = 0;
            while let Some(i) = source[from..].find(m) {
                let start = from + i;
                from = start + m.len();
                // Not the tail of a longer macro name.
                let before = source[..start].chars().next_back();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    continue;
                }
                let Some(args) = balanced(&source[from..]) else {
                    continue;
                };
                for name in field_args(&split_top(args), fields_after_name) {
                    found.push(FieldUse {
                        name,
                        line: line_of(start),
                    });
                }
            }
        }
    }
    let mut from = 0;
    while let Some(i) = source[from..].find(".record(\"") {
        let start = from + i + ".record(\"".len();
        from = start;
        if let Some(end) = source[start..].find('"') {
            found.push(FieldUse {
                name: source[start..start + end].to_owned(),
                line: line_of(start),
            });
        }
    }
    found
}

/// The characters of `s` with their byte offsets, less what string literals hold: a literal's
/// opening quote is yielded, its contents (escapes respected) and closing quote are not. What
/// both scans below walk, so a bracket or comma in a message never counts.
fn outside_strings(s: &str) -> impl Iterator<Item = (usize, char)> + '_ {
    let (mut in_str, mut escaped) = (false, false);
    s.char_indices().filter(move |&(_, c)| {
        if in_str {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_str = false,
                _ => {}
            }
            return false;
        }
        in_str = c == '"';
        true
    })
}

/// The text up to the `)` closing the macro's `(`, strings and nesting respected.
fn balanced(s: &str) -> Option<&str> {
    let mut depth = 0usize;
    for (i, c) in outside_strings(s) {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' if depth == 0 => return Some(&s[..i]),
            ')' | ']' | '}' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// Top-level comma-separated arguments.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut last) = (0usize, 0);
    for (i, c) in outside_strings(s) {
        match c {
            '(' | '[' | '{' | '<' => depth += 1,
            ')' | ']' | '}' | '>' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(s[last..i].trim());
                last = i + 1;
            }
            _ => {}
        }
    }
    out.push(s[last..].trim());
    out.into_iter().filter(|a| !a.is_empty()).collect()
}

/// The field names among a macro's arguments: before the message for an event, after the name
/// for a span. `target:`/`parent:`/`name:` are not fields.
fn field_args(args: &[&str], fields_after_name: bool) -> Vec<String> {
    let first_literal = args.iter().position(|a| a.starts_with('"'));
    let fields: &[&str] = match (fields_after_name, first_literal) {
        (false, Some(i)) => &args[..i],
        (false, None) => args,
        (true, Some(i)) => &args[i + 1..],
        (true, None) => &[],
    };
    fields
        .iter()
        .filter(|a| {
            !(a.starts_with("target:") || a.starts_with("parent:") || a.starts_with("name:"))
        })
        .map(|a| {
            let lhs = match a.find('=') {
                Some(eq) if !a[eq..].starts_with("==") => &a[..eq],
                _ => a,
            };
            lhs.trim()
                .trim_start_matches(['%', '?'])
                .trim()
                .trim_matches('"')
                .to_owned()
        })
        .collect()
}

/// Every field use under `src` (a crate's source tree, each file read up to its first
/// `#[cfg(test)]`: tests log what they like) whose name is not on `allowed`, as `path:line name`,
/// with the number of field uses seen. Each binary's test asserts the list is empty, so a field
/// added without being allowed fails there instead of vanishing from production logs.
pub fn unlisted_in_tree(
    src: &std::path::Path,
    allowed: &[&str],
) -> std::io::Result<(usize, Vec<String>)> {
    let mut stack = vec![src.to_path_buf()];
    let mut refused = Vec::new();
    let mut seen = 0;
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir)? {
            let path = e?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&path)?;
                let text = match text.find("#[cfg(test)]") {
                    Some(i) => &text[..i],
                    None => &text[..],
                };
                for f in emitted_field_names(text) {
                    seen += 1;
                    if !allowed.contains(&f.name.as_str()) {
                        refused.push(format!("{}:{} {}", path.display(), f.line, f.name));
                    }
                }
            }
        }
    }
    refused.sort();
    Ok((seen, refused))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_spans_and_records_are_read() {
        let source = r#"
            tracing::warn!(namespace = %ns, attempt = %name, "cleanup deferred: {}", x(a, b));
            tracing::info!("no fields {}", y);
            let s = tracing::info_span!("launch", attempt.uid = %uid, otel.kind = "internal");
            info!(pid, ?state, "shorthand");
            span.record("elapsed_ms", 3);
            tracing::warn!(target: "x", reason = r.as_str(), "event {} not written", r);
        "#;
        let names: Vec<String> = emitted_field_names(source)
            .into_iter()
            .map(|f| f.name)
            .collect();
        for expected in [
            "namespace",
            "attempt",
            "attempt.uid",
            "otel.kind",
            "pid",
            "state",
            "elapsed_ms",
            "reason",
        ] {
            assert!(names.iter().any(|n| n == expected), "{expected}: {names:?}");
        }
        assert_eq!(names.len(), 8, "{names:?}");
    }
}
