//! Times as the API writes them.

/// RFC 3339 text of a millisecond timestamp, as every API answer shows times: always three
/// fraction digits in UTC, so the text sorts as the time does (clients compare it as text).
pub fn rfc3339(ms: i64) -> String {
    const FORMAT: &[time::format_description::FormatItem<'static>] = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .ok()
        .and_then(|t| t.format(FORMAT).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::rfc3339;

    #[test]
    fn times_read_as_text_sort_as_the_times_do() {
        assert_eq!(rfc3339(1_796_315_353_830), "2026-12-03T16:29:13.830Z");
        assert_eq!(rfc3339(1_796_315_353_000), "2026-12-03T16:29:13.000Z");
        let times: Vec<i64> = (0..2_000).map(|i| 1_796_316_553_000 + i * 7).collect();
        let texts: Vec<String> = times.iter().map(|&t| rfc3339(t)).collect();
        assert!(texts.windows(2).all(|w| w[0] < w[1]), "{texts:?}");
    }
}
