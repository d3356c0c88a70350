//! The two formats `/metrics` speaks. `prometheus-client` encodes OpenMetrics 1.0 only, which
//! Prometheus asks for first; scrapers and tools that read the older Prometheus text format
//! (0.0.4) only — `promtool check metrics` among them, and agents that scrape "Prometheus
//! endpoints" — cannot parse it (`# TYPE … info`, a counter family named without `_total`,
//! `# EOF`). So the endpoint negotiates ([`Format::negotiate`]) and the text format is derived
//! from the OpenMetrics encoding ([`to_text`]) rather than kept as a second registry: one set of
//! metrics, two renderings.

/// The content type of the OpenMetrics text exposition.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of the Prometheus text exposition.
pub const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What a scrape is answered in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    OpenMetrics,
    Text,
}

impl Format {
    /// From the request's `Accept`: OpenMetrics unless the client asks for `text/plain` and does
    /// not also accept OpenMetrics (Prometheus sends both, OpenMetrics preferred; `promtool`'s
    /// users and older scrapers send `text/plain`). No header, or `*/*`, keeps OpenMetrics, which
    /// is what every earlier version served.
    pub fn negotiate(accept: Option<&str>) -> Self {
        match accept {
            Some(a) if a.contains("text/plain") && !a.contains("application/openmetrics-text") => {
                Self::Text
            }
            _ => Self::OpenMetrics,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Self::OpenMetrics => OPENMETRICS,
            Self::Text => TEXT,
        }
    }

    /// `openmetrics` (a whole OpenMetrics exposition) in this format.
    pub fn render(self, openmetrics: String) -> String {
        match self {
            Self::OpenMetrics => openmetrics,
            Self::Text => to_text(&openmetrics),
        }
    }
}

/// A `/metrics` answer of both binaries: the content type and the body for a request whose
/// `Accept` is `accept`, from their OpenMetrics encoding.
pub fn answer(accept: Option<&str>, openmetrics: String) -> (&'static str, String) {
    let format = Format::negotiate(accept);
    (format.content_type(), format.render(openmetrics))
}

/// An OpenMetrics exposition as `prometheus-client` writes it, in the Prometheus text format
/// 0.0.4: a counter family is named as its samples are (`x_total`), an info family becomes a
/// gauge `x_info`, unknown becomes untyped; `# UNIT`, `# EOF`, `_created` samples and exemplars
/// (which the text format has no place for) are dropped; HELP loses OpenMetrics' `\"` escape
/// (the text format escapes only `\\` and `\n` there). Samples are kept as written: label
/// escaping is the same in both formats.
pub fn to_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // HELP comes before TYPE, but its name depends on the type: held until the TYPE line.
    let mut help: Option<(&str, &str)> = None;
    // The family being read: its OpenMetrics name and whether `_created` samples belong to it.
    let mut family = "";
    let mut has_created = false;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help = Some((name, text));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            let (text_name, text_kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                "gauge" | "histogram" | "summary" => (name.to_owned(), kind),
                _ => (name.to_owned(), "untyped"),
            };
            family = name;
            has_created = matches!(kind, "counter" | "histogram" | "summary");
            if let Some((_, text)) = help.take().filter(|(n, _)| *n == name) {
                out.push_str(&format!(
                    "# HELP {text_name} {}\n",
                    text.replace("\\\"", "\"")
                ));
            }
            out.push_str(&format!("# TYPE {text_name} {text_kind}\n"));
        } else if line.starts_with('#') {
            // `# UNIT`, `# EOF`: no place in the text format.
        } else if !line.is_empty() {
            let name_end = line.find(['{', ' ']).unwrap_or(line.len());
            let name = &line[..name_end];
            if has_created && name.strip_prefix(family) == Some("_created") {
                continue;
            }
            // An exemplar follows the value after ` # `: searched for after the label set, whose
            // quoted values may hold anything.
            let value_from = name_end + label_set_len(&line[name_end..]);
            let sample = match line[value_from..].find(" # ") {
                Some(i) => &line[..value_from + i],
                None => line,
            };
            out.push_str(sample);
            out.push('\n');
        }
    }
    out
}

/// The length of the `{…}` label set `rest` starts with (0 without one): up to the first `}`
/// outside a quoted value, escapes honoured.
fn label_set_len(rest: &str) -> usize {
    if !rest.starts_with('{') {
        return 0;
    }
    let (mut quoted, mut escaped) = (false, false);
    for (i, c) in rest.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return i + 1,
            _ => {}
        }
    }
    rest.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPENMETRICS_SAMPLE: &str = r#"# HELP rm_calls GitHub calls by "endpoint".
# TYPE rm_calls counter
rm_calls_total{endpoint="a \"b\"",status="200"} 3
rm_calls_created{endpoint="a \"b\"",status="200"} 1700000000.0
# HELP rm_build The version.
# TYPE rm_build info
rm_build_info{version="0.1.0"} 1
# HELP rm_age_seconds Seconds since.
# TYPE rm_age_seconds gauge
# UNIT rm_age_seconds seconds
rm_age_seconds 1.5
# HELP rm_pass_seconds Passes.
# TYPE rm_pass_seconds histogram
rm_pass_seconds_sum 0.25
rm_pass_seconds_count 1
rm_pass_seconds_bucket{le="0.5"} 1 # {trace_id="abc"} 0.25 1700000000.0
rm_pass_seconds_bucket{le="+Inf"} 1
# HELP rm_odd Odd label values.
# TYPE rm_odd gauge
rm_odd{v="} # {x} \\"} 2 # {trace_id="abc"} 1
# HELP rm_empty A family with no series yet.
# TYPE rm_empty counter
# EOF
"#;

    #[test]
    fn openmetrics_becomes_the_prometheus_text_format() {
        let text = to_text(OPENMETRICS_SAMPLE);
        assert_eq!(
            text,
            r#"# HELP rm_calls_total GitHub calls by "endpoint".
# TYPE rm_calls_total counter
rm_calls_total{endpoint="a \"b\"",status="200"} 3
# HELP rm_build_info The version.
# TYPE rm_build_info gauge
rm_build_info{version="0.1.0"} 1
# HELP rm_age_seconds Seconds since.
# TYPE rm_age_seconds gauge
rm_age_seconds 1.5
# HELP rm_pass_seconds Passes.
# TYPE rm_pass_seconds histogram
rm_pass_seconds_sum 0.25
rm_pass_seconds_count 1
rm_pass_seconds_bucket{le="0.5"} 1
rm_pass_seconds_bucket{le="+Inf"} 1
# HELP rm_odd Odd label values.
# TYPE rm_odd gauge
rm_odd{v="} # {x} \\"} 2
# HELP rm_empty_total A family with no series yet.
# TYPE rm_empty_total counter
"#
        );
    }

    #[test]
    fn openmetrics_unless_the_client_asks_for_text_only() {
        // What Prometheus 2.x sends: both, OpenMetrics first.
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(Format::negotiate(None), Format::OpenMetrics);
        assert_eq!(Format::negotiate(Some("*/*")), Format::OpenMetrics);
        assert_eq!(
            Format::negotiate(Some("text/plain; version=0.0.4")),
            Format::Text
        );
        assert_eq!(Format::Text.content_type(), TEXT);
        assert_eq!(
            Format::OpenMetrics.render("x 1\n# EOF\n".into()),
            "x 1\n# EOF\n"
        );
        assert_eq!(Format::Text.render("x 1\n# EOF\n".into()), "x 1\n");
        assert_eq!(
            answer(Some("text/plain"), "x 1\n# EOF\n".into()),
            (TEXT, "x 1\n".to_owned())
        );
    }
}
