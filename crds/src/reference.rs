//! The field reference of a kind, as Markdown, generated from its CRD schema: what
//! `docs/scalepolicy-reference.md` holds. `crdgen` writes it; a test fails when the committed
//! page differs from what the types generate.

use std::fmt::Write as _;

use serde_json::Value;

/// The reference page of `ScalePolicy`.
pub fn scalepolicy_markdown() -> String {
    use kube::CustomResourceExt;
    let crd = serde_json::to_value(crate::policy::ScalePolicy::crd()).unwrap_or(Value::Null);
    let mut out = String::new();
    out.push_str(
        "# ScalePolicy reference\n\n\
         <!-- Generated from the CRD by `make crds` (crds/src/reference.rs); do not edit. -->\n\n",
    );
    let _ = writeln!(
        out,
        "`{}/{}`, kind `ScalePolicy`, namespaced, short name `sp`. {}\n",
        crate::GROUP,
        crate::VERSION,
        crd_description(&crd)
    );
    out.push_str(
        "A field is required when marked **required**; every other field may be left out and \
         takes its default. Durations are written like `90s`, `5m`, `1h30m` (units `ms`, `s`, \
         `m`, `h`). The API server refuses what breaks a constraint below; the operator refuses \
         what only it can check (an unknown Secret, a persistent workspace on an organization, …) \
         with `Ready=False` and a reason (see troubleshooting.md).\n\n",
    );
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    for (section, title) in [
        ("spec", "## spec\n\nWhat the team asks for.\n"),
        (
            "status",
            "## status\n\nWritten by the operator; read it, never write it.\n",
        ),
    ] {
        out.push_str(title);
        out.push_str("\n| field | type | default | constraints | description |\n");
        out.push_str("|---|---|---|---|---|\n");
        let node = &schema["properties"][section];
        rows(node, section, &mut out);
        out.push('\n');
    }
    out.push_str("## Printer columns\n\n| column | shown | from |\n|---|---|---|\n");
    for col in crd["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let wide = col["priority"].as_i64().unwrap_or(0) > 0;
        let _ = writeln!(
            out,
            "| {} | {} | `{}` |",
            col["name"].as_str().unwrap_or_default(),
            if wide { "`-o wide`" } else { "always" },
            col["jsonPath"].as_str().unwrap_or_default(),
        );
    }
    out
}

fn crd_description(crd: &Value) -> String {
    one_line(
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"]
            .as_str()
            .unwrap_or_default(),
    )
}

/// One table row per property under `node`, depth first, in schema order (alphabetical).
fn rows(node: &Value, path: &str, out: &mut String) {
    let required: Vec<&str> = node["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let Some(props) = node["properties"].as_object() else {
        return;
    };
    for (name, prop) in props {
        let here = format!("{path}.{name}");
        let mut description = one_line(prop["description"].as_str().unwrap_or_default());
        if required.contains(&name.as_str()) {
            description = format!("**required.** {description}");
        }
        let _ = writeln!(
            out,
            "| `{here}` | {} | {} | {} | {} |",
            type_of(prop),
            prop.get("default")
                .map(|d| format!("`{}`", compact(d)))
                .unwrap_or_default(),
            constraints(prop),
            cell(&description),
        );
        rows(prop, &here, out);
        if prop["type"] == "array" {
            rows(&prop["items"], &format!("{here}[]"), out);
        }
    }
}

fn type_of(prop: &Value) -> String {
    if prop["x-kubernetes-int-or-string"] == true {
        return "integer or string".to_owned();
    }
    match prop["type"].as_str() {
        Some("array") => format!(
            "list of {}",
            prop["items"]["type"].as_str().unwrap_or("object")
        ),
        Some("object") if prop.get("additionalProperties").is_some() => format!(
            "map of {}",
            prop["additionalProperties"]["type"]
                .as_str()
                .unwrap_or("object")
        ),
        Some("string") if prop["format"] == "date-time" => "timestamp".to_owned(),
        Some(t) => t.to_owned(),
        None => "object".to_owned(),
    }
}

fn constraints(prop: &Value) -> String {
    let mut c = Vec::new();
    if let Some(e) = prop["enum"].as_array() {
        c.push(format!(
            "one of {}",
            e.iter()
                .map(|v| format!("`{}`", compact(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    for (key, word) in [
        ("minimum", "≥"),
        ("maximum", "≤"),
        ("minLength", "length ≥"),
        ("maxLength", "length ≤"),
        ("minItems", "items ≥"),
        ("maxItems", "items ≤"),
    ] {
        if let Some(v) = prop.get(key) {
            c.push(format!("{word} {}", number(v)));
        }
    }
    if let Some(p) = prop["pattern"].as_str() {
        c.push(format!("pattern `{}`", p.replace('|', "\\|")));
    }
    for (key, word) in [
        ("minLength", "each: length ≥"),
        ("maxLength", "each: length ≤"),
    ] {
        if let Some(v) = prop["items"].get(key) {
            c.push(format!("{word} {}", number(v)));
        }
    }
    if let Some(p) = prop["items"]["pattern"].as_str() {
        c.push(format!("each: pattern `{}`", p.replace('|', "\\|")));
    }
    c.join("; ")
}

/// `1000`, not `1000.0`: schemars writes bounds as floats.
fn number(v: &Value) -> String {
    match v.as_f64() {
        #[allow(clippy::cast_possible_truncation)]
        Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
        _ => v.to_string(),
    }
}

fn compact(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    /// `docs/scalepolicy-reference.md` is what the types generate: run `make crds` after changing
    /// an API type, and commit the page with the CRDs.
    #[test]
    fn committed_reference_is_fresh() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../docs/scalepolicy-reference.md");
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == super::scalepolicy_markdown(),
            "{} is stale: run `make crds` and commit it",
            path.display()
        );
    }

    #[test]
    fn the_reference_names_every_spec_field() {
        let page = super::scalepolicy_markdown();
        for field in [
            "`spec.github.url`",
            "`spec.github.credentialsSecretRef.name`",
            "`spec.labels`",
            "`spec.maxRunners`",
            "`spec.minIdle`",
            "`spec.workspace.mode`",
            "`spec.timeouts.idle`",
            "`status.conditions[].reason`",
        ] {
            assert!(page.contains(field), "{field} missing");
        }
        assert!(page.contains("**required.**"));
    }
}
