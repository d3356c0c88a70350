//! Durations as people write them in manifests (`90s`, `5m`, `1h30m`), the same grammar the API
//! server's schema enforces, so a value the server accepted always parses here.

use std::fmt;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The schema pattern: one or more `<digits><unit>` with unit `ms`, `s`, `m` or `h`.
pub const DURATION_PATTERN: &str = r"^([0-9]{1,9}(ms|s|m|h))+$";

/// A duration written `<n><unit>…` (`ms`, `s`, `m`, `h`), e.g. `5m` or `1h30m`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ManifestDuration(Duration);

/// Why a duration string was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DurationError {
    #[error("empty duration; write e.g. `90s`, `5m` or `1h30m`")]
    Empty,
    #[error("`{0}` is not a duration; write e.g. `90s`, `5m` or `1h30m` (units ms, s, m, h)")]
    Malformed(String),
}

impl ManifestDuration {
    pub const fn from_secs(secs: u64) -> Self {
        Self(Duration::from_secs(secs))
    }

    pub const fn as_duration(self) -> Duration {
        self.0
    }

    pub fn parse(text: &str) -> Result<Self, DurationError> {
        if text.is_empty() {
            return Err(DurationError::Empty);
        }
        let malformed = || DurationError::Malformed(text.to_owned());
        let mut total = Duration::ZERO;
        let mut rest = text;
        while !rest.is_empty() {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 || digits > 9 {
                return Err(malformed());
            }
            let n: u64 = rest[..digits].parse().map_err(|_| malformed())?;
            rest = &rest[digits..];
            let (unit, len) = if rest.starts_with("ms") {
                (Duration::from_millis(1), 2)
            } else if rest.starts_with('s') {
                (Duration::from_secs(1), 1)
            } else if rest.starts_with('m') {
                (Duration::from_secs(60), 1)
            } else if rest.starts_with('h') {
                (Duration::from_secs(3600), 1)
            } else {
                return Err(malformed());
            };
            rest = &rest[len..];
            let part = unit.checked_mul(u32::try_from(n).map_err(|_| malformed())?);
            total = part
                .and_then(|p| total.checked_add(p))
                .ok_or_else(malformed)?;
        }
        Ok(Self(total))
    }
}

impl fmt::Display for ManifestDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms == 0 {
            return f.write_str("0s");
        }
        if !ms.is_multiple_of(1000) {
            return write!(f, "{ms}ms");
        }
        let secs = ms / 1000;
        let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
        if h > 0 {
            write!(f, "{h}h")?;
        }
        if m > 0 {
            write!(f, "{m}m")?;
        }
        if s > 0 {
            write!(f, "{s}s")?;
        }
        Ok(())
    }
}

impl Serialize for ManifestDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ManifestDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for ManifestDuration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ManifestDuration".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": DURATION_PATTERN,
            "maxLength": 32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_forms() {
        for (text, want) in [
            ("90s", Duration::from_secs(90)),
            ("5m", Duration::from_secs(300)),
            ("1h30m", Duration::from_secs(5400)),
            ("250ms", Duration::from_millis(250)),
        ] {
            assert_eq!(ManifestDuration::parse(text).unwrap().0, want, "{text}");
        }
    }

    #[test]
    fn refuses_what_the_schema_refuses() {
        for bad in [
            "",
            "5",
            "m",
            "5 m",
            "5d",
            "-5s",
            "1.5h",
            "5mm",
            "9999999999s",
        ] {
            assert!(ManifestDuration::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn display_round_trips() {
        for text in ["90s", "5m", "1h30m", "250ms", "2h", "1h1m1s"] {
            let d = ManifestDuration::parse(text).unwrap();
            let shown = d.to_string();
            assert_eq!(
                ManifestDuration::parse(&shown).unwrap(),
                d,
                "{text} -> {shown}"
            );
        }
        assert_eq!(ManifestDuration::parse("90s").unwrap().to_string(), "1m30s");
    }
}
