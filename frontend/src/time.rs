//! Times as the viewer reads them: in their own zone with the zone said, the exact instant on
//! hover. The server renders in the zone the browser told it last time (a cookie); once the
//! page is hydrated, the browser's own calendar decides (daylight saving included).

use leptos::prelude::*;
use time::format_description::well_known::Rfc3339;
use time::{OffsetDateTime, UtcOffset};

/// Where the viewer's clock is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zone {
    Utc,
    /// Minutes east of UTC, as the browser last said.
    Offset(i32),
    /// The browser's own zone, asked for each instant.
    Browser,
}

/// The viewer's zone for this page (context).
#[derive(Clone, Copy)]
pub struct ViewerZone(pub RwSignal<Zone>);

/// The cookie in which the browser tells the server its UTC offset in minutes.
pub const ZONE_COOKIE: &str = "autodl_tz";

/// A zone from the cookie's value: whole minutes within the offsets that exist.
pub fn zone_from_cookie(value: &str) -> Option<Zone> {
    let m: i32 = value.trim().parse().ok()?;
    (-14 * 60..=14 * 60).contains(&m).then_some(Zone::Offset(m))
}

/// Makes the viewer's zone known to the page: the server's guess first (so hydration finds
/// the same text), the browser's own once running.
pub fn provide_zone() {
    #[cfg(not(feature = "hydrate"))]
    let first = use_context::<Zone>().unwrap_or(Zone::Utc);
    #[cfg(feature = "hydrate")]
    let first = crate::api::cookie(ZONE_COOKIE)
        .and_then(|v| zone_from_cookie(&v))
        .unwrap_or(Zone::Utc);
    let zone = RwSignal::new(first);
    provide_context(ViewerZone(zone));
    // Effects run only in the browser.
    Effect::new(move |_| {
        zone.set(Zone::Browser);
        #[cfg(feature = "hydrate")]
        crate::api::set_cookie(
            ZONE_COOKIE,
            &offset_minutes(now_ms(), Zone::Browser).to_string(),
        );
    });
}

fn current_zone() -> Zone {
    use_context::<ViewerZone>().map_or(Zone::Utc, |z| z.0.get())
}

/// Milliseconds since the epoch, now.
pub fn now_ms() -> f64 {
    #[cfg(feature = "hydrate")]
    {
        js_sys::Date::now()
    }
    #[cfg(not(feature = "hydrate"))]
    {
        (OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as f64
    }
}

/// Milliseconds since the epoch of an RFC 3339 time.
pub fn parse_ms(at: &str) -> Option<f64> {
    OffsetDateTime::parse(at, &Rfc3339)
        .ok()
        .map(|t| (t.unix_timestamp_nanos() / 1_000_000) as f64)
}

/// An instant as RFC 3339 in UTC (for API queries).
pub fn iso(ms: f64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos((ms as i128) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_default()
}

/// The zone's offset from UTC at that instant, in minutes.
fn offset_minutes(ms: f64, zone: Zone) -> i32 {
    match zone {
        Zone::Utc => 0,
        Zone::Offset(m) => m,
        Zone::Browser => {
            #[cfg(feature = "hydrate")]
            {
                let d = js_sys::Date::new(&wasm_bindgen::JsValue::from_f64(ms));
                -(d.get_timezone_offset() as i32)
            }
            #[cfg(not(feature = "hydrate"))]
            {
                let _ = ms;
                0
            }
        }
    }
}

fn zone_label(minutes: i32) -> String {
    if minutes == 0 {
        return "UTC".into();
    }
    let sign = if minutes < 0 { '-' } else { '+' };
    let m = minutes.abs();
    if m % 60 == 0 {
        format!("UTC{sign}{}", m / 60)
    } else {
        format!("UTC{sign}{}:{:02}", m / 60, m % 60)
    }
}

fn shifted(ms: f64, zone: Zone) -> Option<(OffsetDateTime, i32)> {
    let minutes = offset_minutes(ms, zone);
    let offset = UtcOffset::from_whole_seconds(minutes * 60).ok()?;
    let t = OffsetDateTime::from_unix_timestamp_nanos((ms as i128) * 1_000_000).ok()?;
    Some((t.to_offset(offset), minutes))
}

/// `2026-12-02 11:33 UTC+1` (with seconds when asked); the text itself when it is no time.
pub fn format_in(at: &str, zone: Zone, seconds: bool) -> String {
    let Some((t, minutes)) = parse_ms(at).and_then(|ms| shifted(ms, zone)) else {
        return at.to_owned();
    };
    let mut s = format!(
        "{:04}-{:02}-{:02} {:02}:{:02}",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute()
    );
    if seconds {
        s.push_str(&format!(":{:02}", t.second()));
    }
    s.push(' ');
    s.push_str(&zone_label(minutes));
    s
}

/// An instant in the viewer's zone (tracked: re-read when the zone becomes the browser's).
pub fn local(at: &str) -> String {
    format_in(at, current_zone(), false)
}

/// Clock time of an instant in the viewer's zone, for chart axes: `11:33:05`.
pub fn clock(ms: f64, zone: Zone) -> String {
    match shifted(ms, zone) {
        Some((t, _)) => format!("{:02}:{:02}:{:02}", t.hour(), t.minute(), t.second()),
        None => String::new(),
    }
}

/// The UTC date of an instant, briefly, for axes over days: `12-03`.
pub fn day(ms: f64) -> String {
    match shifted(ms, Zone::Utc) {
        Some((t, _)) => format!("{:02}-{:02}", u8::from(t.month()), t.day()),
        None => String::new(),
    }
}

/// The label of the viewer's zone now (for axis captions).
pub fn zone_now(zone: Zone) -> String {
    zone_label(offset_minutes(now_ms(), zone))
}

/// How long, said briefly: `45s`, `12m 5s`, `3h 12m`, `2d 4h`.
pub fn duration(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86_400 => format!("{}h {}m", s / 3600, (s / 60) % 60),
        _ => format!("{}d {}h", s / 86_400, (s / 3600) % 24),
    }
}

/// An instant shown in the viewer's zone, the exact RFC 3339 time on hover.
#[component]
pub fn Time(#[prop(into)] at: String, #[prop(optional)] seconds: bool) -> impl IntoView {
    let zone = use_context::<ViewerZone>();
    let shown = at.clone();
    view! {
        <time datetime=at.clone() title=at>
            {move || format_in(&shown, zone.map_or(Zone::Utc, |z| z.0.get()), seconds)}
        </time>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_said_in_the_viewer_s_zone() {
        let at = "2026-12-02T10:33:51Z";
        assert_eq!(format_in(at, Zone::Utc, false), "2026-12-02 10:33 UTC");
        assert_eq!(
            format_in(at, Zone::Offset(60), true),
            "2026-12-02 11:33:51 UTC+1"
        );
        assert_eq!(
            format_in(at, Zone::Offset(-210), false),
            "2026-12-02 07:03 UTC-3:30"
        );
        assert_eq!(
            format_in(at, Zone::Offset(14 * 60), false),
            "2026-12-03 00:33 UTC+14"
        );
        assert_eq!(format_in("not a time", Zone::Utc, false), "not a time");
        assert_eq!(zone_from_cookie("-330"), Some(Zone::Offset(-330)));
        assert_eq!(zone_from_cookie("9999"), None);
        assert_eq!(zone_from_cookie("x"), None);
        assert_eq!(
            parse_ms(&iso(1_764_671_631_000.0)),
            Some(1_764_671_631_000.0)
        );
    }

    #[test]
    fn durations_are_brief() {
        assert_eq!(duration(45.2), "45s");
        assert_eq!(duration(725.0), "12m 5s");
        assert_eq!(duration(11_520.0), "3h 12m");
        assert_eq!(duration(187_200.0), "2d 4h");
        assert_eq!(duration(-3.0), "0s");
    }
}
