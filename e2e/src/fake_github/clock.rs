//! Wall-clock helpers: GitHub speaks ISO 8601 UTC and unix seconds; the runner names its
//! diagnostic logs `yyyyMMdd-HHmmss`. Written out here rather than pulling a date crate in.

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the unix epoch, now.
#[must_use]
pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Civil date (year, month, day) from days since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        year,
        u32::try_from(month).unwrap_or(1),
        u32::try_from(day).unwrap_or(1),
    )
}

fn parts(unix: i64) -> (i64, u32, u32, i64, i64, i64) {
    let (y, mo, d) = civil_from_days(unix.div_euclid(86_400));
    let secs = unix.rem_euclid(86_400);
    (y, mo, d, secs / 3600, (secs / 60) % 60, secs % 60)
}

/// `2024-05-01T12:00:00Z`, the form GitHub uses in JSON bodies.
#[must_use]
pub fn iso8601(unix: i64) -> String {
    let (y, mo, d, h, mi, s) = parts(unix);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

/// `20240501-120000`, the stamp in `_diag/Runner_<stamp>-utc.log`.
#[must_use]
pub fn diag_stamp(unix: i64) -> String {
    let (y, mo, d, h, mi, s) = parts(unix);
    format!("{y:04}{mo:02}{d:02}-{h:02}{mi:02}{s:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso8601(1_714_564_800), "2024-05-01T12:00:00Z");
        assert_eq!(diag_stamp(951_782_400 + 3_723), "20000229-010203");
    }
}
