//! The log output's field allow-list (one implementation for both binaries; each names its own
//! list in its `telemetry` module). A field whose name is not on the list is dropped from every line,
//! whatever the call site passed: an event's fields and the fields of the span it runs in. The
//! message is always kept (call sites never format workflow-controlled values into it).
//!
//! Text lines are formatted by [`AllowedFields`]; JSON lines are filtered as they are written
//! ([`AllowedJson`]), so `fields` and `span` carry only listed keys.

use std::fmt;
use std::io;

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::format::{FormatFields, Writer};

/// The key every event has; always kept.
const MESSAGE: &str = "message";

/// Text formatting of span and event fields that keeps only `allowed` names (and the message).
#[derive(Clone, Copy, Debug)]
pub struct AllowedFields(pub &'static [&'static str]);

struct Visitor<'a, 'w> {
    allowed: &'static [&'static str],
    writer: &'a mut Writer<'w>,
    first: bool,
    result: fmt::Result,
}

impl Visitor<'_, '_> {
    fn write(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.result.is_err() {
            return;
        }
        let name = field.name();
        let sep = if self.first { "" } else { " " };
        self.result = if name == MESSAGE {
            self.first = false;
            write!(self.writer, "{sep}{value:?}")
        } else if self.allowed.contains(&name) {
            self.first = false;
            write!(self.writer, "{sep}{name}={value:?}")
        } else {
            Ok(())
        };
    }
}

impl Visit for Visitor<'_, '_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == MESSAGE {
            self.write(field, &format_args!("{value}"));
        } else {
            self.write(field, &value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.write(field, value);
    }
}

impl<'w> FormatFields<'w> for AllowedFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut v = Visitor {
            allowed: self.0,
            writer: &mut writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut v);
        v.result
    }
}

/// Keeps only `allowed` keys (and the message) in a JSON line's `fields`, `span` and `spans`.
/// A line that is not JSON is passed on unchanged. Pure.
pub fn filter_json_line(line: &[u8], allowed: &[&str]) -> Option<Vec<u8>> {
    let mut v: serde_json::Value = serde_json::from_slice(line).ok()?;
    let keep = |o: &mut serde_json::Map<String, serde_json::Value>, extra: &str| {
        o.retain(|k, _| k == extra || allowed.contains(&k.as_str()));
    };
    if let Some(o) = v.get_mut("fields").and_then(|f| f.as_object_mut()) {
        keep(o, MESSAGE);
    }
    if let Some(o) = v.get_mut("span").and_then(|f| f.as_object_mut()) {
        keep(o, "name");
    }
    if let Some(a) = v.get_mut("spans").and_then(|f| f.as_array_mut()) {
        for s in a.iter_mut().filter_map(|s| s.as_object_mut()) {
            keep(s, "name");
        }
    }
    let mut out = serde_json::to_vec(&v).ok()?;
    out.push(b'\n');
    Some(out)
}

/// A writer for JSON lines that applies [`filter_json_line`] to each line.
#[derive(Clone, Debug)]
pub struct AllowedJson<M> {
    pub inner: M,
    pub allowed: &'static [&'static str],
}

/// One line's writer.
#[derive(Debug)]
pub struct AllowedJsonWriter<W> {
    inner: W,
    allowed: &'static [&'static str],
}

impl<W: io::Write> io::Write for AllowedJsonWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // The formatter hands over each line whole.
        match filter_json_line(buf, self.allowed) {
            Some(filtered) => self.inner.write_all(&filtered)?,
            None => self.inner.write_all(buf)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for AllowedJson<M> {
    type Writer = AllowedJsonWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        AllowedJsonWriter {
            inner: self.inner.make_writer(),
            allowed: self.allowed,
        }
    }
}
