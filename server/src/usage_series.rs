//! GPU use over time: periods (days, weeks from Monday, months; UTC) and each person's
//! GPU-hours in each, the part of an attempt inside a period counting toward it.

use time::{Date, Duration, Month};

/// How long one period is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bucket {
    Day,
    Week,
    Month,
}

impl Bucket {
    pub fn parse(s: &str) -> Option<Bucket> {
        match s {
            "day" => Some(Bucket::Day),
            "week" => Some(Bucket::Week),
            "month" => Some(Bucket::Month),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Bucket::Day => "day",
            Bucket::Week => "week",
            Bucket::Month => "month",
        }
    }

    /// The start of the period holding `d`.
    fn start(self, d: Date) -> Date {
        match self {
            Bucket::Day => d,
            Bucket::Week => d - Duration::days(i64::from(d.weekday().number_days_from_monday())),
            Bucket::Month => d.replace_day(1).unwrap_or(d),
        }
    }

    fn next(self, d: Date) -> Option<Date> {
        match self {
            Bucket::Day => d.next_day(),
            Bucket::Week => d.checked_add(Duration::days(7)),
            Bucket::Month => {
                let (y, m) = match d.month() {
                    Month::December => (d.year() + 1, Month::January),
                    m => (d.year(), m.next()),
                };
                Date::from_calendar_date(y, m, 1).ok()
            }
        }
    }
}

fn ms(d: Date) -> i64 {
    d.midnight().assume_utc().unix_timestamp() * 1000
}

/// The periods covering `[from, to)` (dates, `to` exclusive) as `[start, end)` in ms, at most
/// `max` of them; None when there would be more.
pub fn periods(from: Date, to: Date, bucket: Bucket, max: usize) -> Option<Vec<(i64, i64)>> {
    let mut out = Vec::new();
    let mut at = bucket.start(from);
    while at < to {
        let next = bucket.next(at)?;
        out.push((ms(at), ms(next)));
        if out.len() > max {
            return None;
        }
        at = next;
    }
    Some(out)
}

/// GPU-hours of a run on `gpus` GPUs from `start` to `end` (ms) inside `[a, b)`.
pub fn hours_within(gpus: i64, start: i64, end: i64, a: i64, b: i64) -> f64 {
    let (s, e) = (start.max(a), end.min(b));
    (e - s).max(0) as f64 / 3_600_000.0 * gpus.max(0) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::date;

    #[test]
    fn periods_cover_the_range() {
        let days = periods(
            date!(2026 - 11 - 29),
            date!(2026 - 12 - 02),
            Bucket::Day,
            10,
        )
        .unwrap();
        assert_eq!(days.len(), 3);
        assert_eq!(days[0].1 - days[0].0, 86_400_000);
        // 2026-12-02 is a Wednesday: its week starts on Monday the 30th.
        let weeks = periods(
            date!(2026 - 12 - 02),
            date!(2026 - 12 - 10),
            Bucket::Week,
            10,
        )
        .unwrap();
        assert_eq!(weeks[0].0, ms(date!(2026 - 11 - 30)));
        assert_eq!(weeks.len(), 2);
        let months = periods(
            date!(2026 - 11 - 15),
            date!(2027 - 01 - 02),
            Bucket::Month,
            10,
        )
        .unwrap();
        assert_eq!(months.len(), 3);
        assert_eq!(months[2].0, ms(date!(2027 - 01 - 01)));
        assert!(periods(
            date!(2020 - 01 - 01),
            date!(2026 - 01 - 01),
            Bucket::Day,
            400
        )
        .is_none());
    }

    #[test]
    fn a_run_counts_in_each_period_it_overlaps() {
        let h = 3_600_000;
        assert_eq!(hours_within(2, 0, 3 * h, h, 10 * h), 4.0);
        assert_eq!(hours_within(1, 5 * h, 6 * h, 0, 2 * h), 0.0);
    }
}
