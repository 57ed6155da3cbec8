//! The values a spec's fields hold, parsed: sizes, time spans, times, scripts and text.

use autodl_common::tasks::{Size, TimeSpan};
use autodl_common::units;
use time::format_description::well_known::Rfc3339;
use time::{OffsetDateTime, PrimitiveDateTime};

use crate::domain::DomainError;

pub fn parse_size(field: &'static str, s: &Size) -> Result<u64, DomainError> {
    let n = match s {
        Size::Bytes(n) => *n,
        Size::Text(t) => units::parse_size(t).map_err(|e| DomainError::invalid(field, e))?,
    };
    if n == 0 {
        return Err(DomainError::invalid(
            field,
            format!("{field} must be more than zero"),
        ));
    }
    Ok(n)
}

/// The longest `time_limit` or `estimated_runtime` taken: a year.
const MAX_SPAN_SECS: u64 = 365 * 86_400;

/// Whole seconds of a span given as seconds or as text ("2h30m", "90m", "1d 12h", "45s").
pub fn parse_span(field: &'static str, s: &TimeSpan) -> Result<u64, DomainError> {
    let secs = match s {
        TimeSpan::Seconds(n) => *n,
        // A bare number in a string is seconds, as it is without the quotes.
        TimeSpan::Text(t) => units::parse_duration(t)
            .map_err(|e| DomainError::invalid(field, format!("{field}: {e}")))?
            .as_secs(),
    };
    if secs == 0 {
        return Err(DomainError::invalid(
            field,
            format!("{field} must be at least one second (e.g. \"30m\")"),
        ));
    }
    if secs > MAX_SPAN_SECS {
        return Err(DomainError::invalid(
            field,
            format!("{field} must be at most a year"),
        ));
    }
    Ok(secs)
}

/// An RFC 3339 time as Unix milliseconds (agents' samples and log lines, query cursors).
pub fn parse_time_ms(s: &str) -> Option<i64> {
    OffsetDateTime::parse(s.trim(), &Rfc3339)
        .ok()
        .map(|t| (t.unix_timestamp_nanos() / 1_000_000) as i64)
}

/// ISO 8601 date-time; without an offset it is taken as UTC. Returns Unix seconds.
pub fn parse_deadline(s: &str) -> Result<i64, DomainError> {
    let s = s.trim();
    if let Ok(t) = OffsetDateTime::parse(s, &Rfc3339) {
        return Ok(t.unix_timestamp());
    }
    let formats = [
        time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]"),
        time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]"),
        time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]"),
        time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]"),
    ];
    for f in formats {
        if let Ok(t) = PrimitiveDateTime::parse(s, &f) {
            return Ok(t.assume_utc().unix_timestamp());
        }
    }
    Err(DomainError::invalid(
        "deadline",
        format!("{s:?} is not an ISO 8601 date and time (e.g. 2024-03-20T18:00)"),
    ))
}

/// A shell command: like `text`, but multi-line scripts (newlines, tabs) are fine.
pub(super) fn script(field: &'static str, s: &str, max: usize) -> Result<String, DomainError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(DomainError::invalid(field, format!("{field} is required")));
    }
    if t.chars().count() > max {
        return Err(DomainError::invalid(
            field,
            format!("{field} must be at most {max} characters"),
        ));
    }
    if t.chars()
        .any(|c| c.is_control() && !matches!(c, '\n' | '\t' | '\r'))
    {
        return Err(DomainError::invalid(
            field,
            format!("{field} must not contain control characters other than newlines and tabs"),
        ));
    }
    Ok(t.to_owned())
}

pub(super) fn text(field: &'static str, s: &str, max: usize) -> Result<String, DomainError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(DomainError::invalid(field, format!("{field} is required")));
    }
    if t.chars().count() > max {
        return Err(DomainError::invalid(
            field,
            format!("{field} must be at most {max} characters"),
        ));
    }
    if t.chars().any(|c| c.is_control()) {
        return Err(DomainError::invalid(
            field,
            format!("{field} must not contain control characters"),
        ));
    }
    Ok(t.to_owned())
}
