//! Ages as kubectl prints them: apimachinery's `duration.HumanDuration` over the time since a
//! timestamp (`5m`, `2m30s`, `3h10m`, `4d`), `<unknown>` for none, `<invalid>` for the future.

use chrono::{DateTime, Utc};

/// `HumanDuration` of the time from `timestamp` (RFC 3339, with or without fraction) to `now`.
pub fn since(timestamp: Option<&str>, now: DateTime<Utc>) -> String {
    match timestamp
        .filter(|t| !t.is_empty())
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
    {
        Some(t) => human_duration(now.signed_duration_since(t).num_seconds()),
        None => "<unknown>".to_owned(),
    }
}

/// apimachinery's `HumanDuration`, on whole seconds.
pub fn human_duration(seconds: i64) -> String {
    // Up to two seconds in the future count as now: clocks of two machines disagree a little.
    if seconds < -1 {
        return "<invalid>".to_owned();
    }
    if seconds < 0 {
        return "0s".to_owned();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations_as_apimachinery_prints_them() {
        // (seconds, printed), from upstream's duration tests.
        let cases: &[(i64, &str)] = &[
            (-2, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (1, "1s"),
            (119, "119s"),
            (120, "2m"),
            (150, "2m30s"),
            (9 * 60 + 59, "9m59s"),
            (10 * 60, "10m"),
            (179 * 60 + 59, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 10 * 60, "3h10m"),
            (8 * 3600, "8h"),
            (47 * 3600 + 59 * 60, "47h"),
            (48 * 3600, "2d"),
            (48 * 3600 + 5 * 3600, "2d5h"),
            (8 * 24 * 3600, "8d"),
            (729 * 24 * 3600, "729d"),
            (730 * 24 * 3600, "2y"),
            (731 * 24 * 3600, "2y1d"),
            (8 * 365 * 24 * 3600, "8y"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(*secs), *want, "{secs}s");
        }
    }

    #[test]
    fn since_a_timestamp() {
        let now = DateTime::parse_from_rfc3339("2026-01-01T00:05:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(since(Some("2026-01-01T00:00:00Z"), now), "5m");
        assert_eq!(since(Some("2026-01-01T00:04:59.123456Z"), now), "0s");
        assert_eq!(since(None, now), "<unknown>");
        assert_eq!(since(Some(""), now), "<unknown>");
        assert_eq!(since(Some("yesterday"), now), "<unknown>");
    }
}
