//! The check each binary runs on its own field allow-list (one home for it), and the log sink it
//! writes to.

use std::io;

use tracing_subscriber::fmt::MakeWriter;

/// A log sink: what a layer wrote, for the allow-list check below.
#[derive(Clone, Debug, Default)]
pub struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Captured {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }
}

impl io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Self;
    fn make_writer(&'a self) -> Self {
        self.clone()
    }
}

/// The check each binary runs on its own list (one home for it): one line carrying
/// workflow-controlled values (a job name on the span and the event, labels, a runner name)
/// beside fields a list must keep (`namespace`, `reason`, the span's `attempt.uid`), written
/// through [`crate::log_layer`] with `allowed` in text and in JSON. `Err` says what leaked or
/// what was lost.
pub fn check_list(allowed: &'static [&'static str]) -> Result<(), String> {
    use tracing_subscriber::layer::SubscriberExt;
    for json in [false, true] {
        let out = Captured::default();
        let subscriber =
            tracing_subscriber::registry().with(crate::log_layer(json, out.clone(), allowed));
        tracing::subscriber::with_default(subscriber, || {
            let span =
                tracing::info_span!("launch", attempt.uid = "uid-1", job.name = "EVIL-span-job");
            let _in = span.enter();
            tracing::info!(
                namespace = "team-a",
                job_name = "EVIL-job-name",
                labels = ?["EVIL-label"],
                runner_name = %"EVIL-runner",
                reason = "Ready",
                "one line"
            );
        });
        let text = out.text();
        let format = if json { "json" } else { "text" };
        if text.contains("EVIL") {
            return Err(format!(
                "{format}: a workflow-controlled value leaked: {text}"
            ));
        }
        for kept in ["team-a", "Ready", "one line", "uid-1", "launch"] {
            if !text.contains(kept) {
                return Err(format!("{format}: lost {kept}: {text}"));
            }
        }
        if json {
            let v: serde_json::Value =
                serde_json::from_str(text.trim()).map_err(|e| format!("json: {e}: {text}"))?;
            let ok = v["fields"]["namespace"] == "team-a"
                && v["fields"]["message"] == "one line"
                && v["span"]["attempt.uid"] == "uid-1"
                && v["fields"].get("job_name").is_none();
            if !ok {
                return Err(format!("json: not the line expected: {text}"));
            }
        } else if !text.contains("namespace=\"team-a\"") {
            return Err(format!("text: not the line expected: {text}"));
        }
    }
    Ok(())
}

/// Both checks a binary runs on its own allow-list, for its one test: the list keeps what it
/// must and drops what a workflow controls ([`check_list`]), and every field name the binary's
/// source (`src`, its `CARGO_MANIFEST_DIR/src`) gives a log line or span is on it: one that is
/// not would be dropped from every line in production, unseen (parity row 111).
pub fn check_binary(src: &std::path::Path, allowed: &'static [&'static str]) -> Result<(), String> {
    check_list(allowed)?;
    let (seen, refused) =
        crate::fields::unlisted_in_tree(src, allowed).map_err(|e| e.to_string())?;
    if seen <= 20 {
        return Err(format!(
            "the scan of {} found only {seen} fields",
            src.display()
        ));
    }
    if !refused.is_empty() {
        return Err(format!("fields not on the allow-list: {refused:#?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_fails_on_a_list_that_lets_a_job_name_through_or_loses_a_kept_field() {
        const GOOD: &[&str] = &["namespace", "reason", "attempt.uid"];
        const LEAKY: &[&str] = &["namespace", "reason", "attempt.uid", "job_name"];
        const LOSSY: &[&str] = &["namespace", "attempt.uid"];
        assert_eq!(check_list(GOOD), Ok(()));
        let leak = check_list(LEAKY).unwrap_err();
        assert!(leak.contains("leaked"), "{leak}");
        let lost = check_list(LOSSY).unwrap_err();
        assert!(lost.contains("lost Ready"), "{lost}");
    }
}
