//! Wall-clock timestamps without a time-zone database: records are stamped in UTC.

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch (negative never happens on a sane clock; clamps to 0).
pub fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// `2026-12-01T08:09:57Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let (date, time) = civil(t);
    format!("{date}T{time}Z")
}

/// `2026-12-01 08:09:57`, nccl-tests' `start_time` layout (UTC here, local time there).
pub fn nccl_tests_stamp(t: SystemTime) -> String {
    let (date, time) = civil(t);
    format!("{date} {time}")
}

/// Parses what [`rfc3339`] writes back to Unix seconds (for `history`'s time axis).
pub fn parse_rfc3339(s: &str) -> Option<f64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut t = time.split(':').map(|x| x.parse::<f64>());
    let (hh, mm, ss) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return None;
    }
    Some(days_from_civil(y, m, day) as f64 * 86400.0 + hh * 3600.0 + mm * 60.0 + ss)
}

fn civil(t: SystemTime) -> (String, String) {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let (y, m, d) = civil_from_days(days);
    (
        format!("{y:04}-{m:02}-{d:02}"),
        format!("{:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60),
    )
}

// Howard Hinnant's civil-calendar algorithms (proleptic Gregorian).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_and_parses_utc() {
        let t = UNIX_EPOCH + Duration::from_secs(1_796_112_597);
        assert_eq!(rfc3339(t), "2026-12-01T08:09:57Z");
        assert_eq!(nccl_tests_stamp(t), "2026-12-01 08:09:57");
        assert_eq!(parse_rfc3339("2026-12-01T08:09:57Z"), Some(1_796_112_597.0));
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(parse_rfc3339("2024-02-29T00:00:00Z"), Some(1_709_164_800.0));
        assert_eq!(parse_rfc3339("yesterday"), None);
    }
}
