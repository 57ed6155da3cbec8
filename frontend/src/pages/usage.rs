//! Usage over time (`/usage`): GPU-hours per organization or person by day, week or month,
//! with measured utilization, idle GPU-hours and the monthly caps. Platform administrators see
//! everyone, an organization's owners and admins their organization, a member themselves. The
//! choices are the page's address, so a view is a link and the CSV export matches it.

use std::collections::BTreeMap;

use autodl_common::api::UsageSeries;
use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

use crate::api;
use crate::chart::{LineChart, Series, PALETTE};
use crate::paths;
use crate::plot::XAxis;
use crate::session::{use_session, RequireLogin};
use crate::time;

/// The query keys the API takes.
const PASSED: [&str; 4] = ["bucket", "from", "to", "tenant"];

#[component]
pub fn UsagePage() -> impl IntoView {
    view! { <RequireLogin><Usage/></RequireLogin> }
}

/// One line of the totals table: GPU-hours, utilization weighted by them, idle GPU-hours.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Total {
    pub gpu_hours: f64,
    weighted_util: f64,
    measured_hours: f64,
    pub idle_gpu_hours: f64,
}

impl Total {
    pub fn utilization(&self) -> Option<f64> {
        (self.measured_hours > 0.0).then(|| self.weighted_util / self.measured_hours)
    }
}

/// Per subject (an organization's name, or a person's email): the GPU-hours in each period
/// (`[(period start ms, hours)]`, every period present) and the totals.
pub fn by_subject(s: &UsageSeries, per_org: bool) -> BTreeMap<String, (Vec<(f64, f64)>, Total)> {
    let starts: Vec<f64> = s.periods.iter().filter_map(|p| time::parse_ms(p)).collect();
    let mut out: BTreeMap<String, (Vec<(f64, f64)>, Total)> = BTreeMap::new();
    for p in &s.points {
        let key = if per_org {
            p.tenant_name.clone()
        } else {
            p.user_email.clone()
        };
        let entry = out
            .entry(key)
            .or_insert_with(|| (starts.iter().map(|t| (*t, 0.0)).collect(), Total::default()));
        if let Some(at) = time::parse_ms(&p.start) {
            if let Some(slot) = entry.0.iter_mut().find(|(t, _)| *t == at) {
                slot.1 += p.gpu_hours;
            }
        }
        let t = &mut entry.1;
        t.gpu_hours += p.gpu_hours;
        if let Some(u) = p.avg_utilization {
            t.weighted_util += u * p.gpu_hours;
            t.measured_hours += p.gpu_hours;
        }
        t.idle_gpu_hours += p.idle_gpu_hours.unwrap_or(0.0);
    }
    out
}

/// GPU-hours, with the digits that matter at their size.
/// How long one kept standing stands for: the scheduler keeps one every 10 minutes.
const STANDING_MS: f64 = 600_000.0;

/// Each person's fair-share factor over time, one line each: a step per kept standing, held
/// until the next one (or for its 10 minutes), so a single one is seen too.
pub fn standing_lines(s: &UsageSeries) -> Vec<Series> {
    let mut by: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for p in &s.standing {
        if let Some(at) = time::parse_ms(&p.at) {
            by.entry(p.user_email.as_str())
                .or_default()
                .push((at, p.fair_share));
        }
    }
    by.into_iter()
        .enumerate()
        .map(|(i, (who, kept))| {
            let mut steps = Vec::with_capacity(kept.len() * 2);
            for (k, (at, f)) in kept.iter().enumerate() {
                let until = kept
                    .get(k + 1)
                    .map_or(at + STANDING_MS, |n| n.0.min(at + STANDING_MS));
                steps.push((*at, *f));
                steps.push((until, *f));
            }
            Series::new(who, PALETTE[i % PALETTE.len()], steps)
        })
        .collect()
}

/// Dates under a range of days; clock times when it all happened within two days.
fn standing_axis(lines: &[Series]) -> XAxis {
    let xs = lines.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let (lo, hi) = xs.fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
    if hi - lo < 2.0 * 86_400_000.0 {
        XAxis::Time
    } else {
        XAxis::Date
    }
}

fn hours(h: f64) -> String {
    if h >= 100.0 {
        format!("{h:.0}")
    } else if h >= 1.0 {
        format!("{h:.2}")
    } else {
        format!("{h:.3}")
    }
}

#[component]
fn Usage() -> impl IntoView {
    let session = use_session();
    let query = use_query_map();
    let passed = Memo::new(move |_| {
        query.with(|q| {
            let given: Vec<(&str, String)> = PASSED
                .iter()
                .filter_map(|k| q.get(k).filter(|v| !v.is_empty()).map(|v| (*k, v)))
                .collect();
            paths::query(given.iter().map(|(k, v)| (*k, v.as_str())))
        })
    });
    let value = move |k: &str| query.with(|q| q.get(k).unwrap_or_default());
    let data = Resource::new(
        move || passed.get(),
        |qs| async move { api::get::<UsageSeries>(&format!("{}?{qs}", paths::usage_series())).await },
    );
    let platform = move || session.me().is_some_and(|m| m.platform_admin);
    let manager = move || {
        session
            .me()
            .is_some_and(|m| m.platform_admin || m.role.can_manage())
    };
    // Organizations for platform administrators (unless they look at one), people otherwise.
    let per_org = move || platform() && value("tenant").is_empty() && value("by") != "person";
    let bucket = move || {
        let b = value("bucket");
        if b.is_empty() {
            "day".to_owned()
        } else {
            b
        }
    };
    view! {
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
        <section class="card">
            <h1>"Usage"</h1>
            <p class="muted">{move || if platform() {
                "GPU-hours of every organization over time, measured utilization, idle GPU-hours (measured under 5%) and the monthly caps."
            } else if manager() {
                "GPU-hours of your organization's members over time, measured utilization, idle GPU-hours (measured under 5%) and the monthly caps."
            } else {
                "Your GPU-hours over time, measured utilization, idle GPU-hours (measured under 5%) and the monthly caps."
            }}</p>
            <form method="get" action="/usage" class="filters" data-testid="usage-filters">
                <div class="field">
                    <label for="usage-bucket">"Per"</label>
                    <select id="usage-bucket" name="bucket" data-testid="usage-bucket">
                        {[("day", "day"), ("week", "week"), ("month", "month")].into_iter().map(|(v, l)| {
                            view! { <option value=v selected=move || bucket() == v>{l}</option> }
                        }).collect_view()}
                    </select>
                </div>
                <div class="field">
                    <label for="usage-from">"From"</label>
                    <input id="usage-from" type="date" name="from" value=move || value("from")/>
                </div>
                <div class="field">
                    <label for="usage-to">"To"</label>
                    <input id="usage-to" type="date" name="to" value=move || value("to")/>
                </div>
                {move || platform().then(|| view! {
                    <div class="field">
                        <label for="usage-by">"Show"</label>
                        <select id="usage-by" name="by" data-testid="usage-by">
                            <option value="org" selected=value("by") != "person">"organizations"</option>
                            <option value="person" selected=value("by") == "person">"people"</option>
                        </select>
                    </div>
                })}
                <button type="submit" data-testid="usage-apply">"Show"</button>
            </form>
            <p class="actions">
                <a class="button secondary small" download="autodl-usage.csv" data-testid="usage-csv"
                    href=move || format!("{}?format=csv&{}", paths::usage_series(), passed.get())>"Export CSV"</a>
            </p>
        </section>
        {move || data.get().map(|r| match r {
            Err(e) => view! { <section class="card"><p class="banner error" role="alert">{e.message}</p></section> }.into_any(),
            Ok(s) => {
                let org = per_org();
                let subjects = by_subject(&s, org);
                let series: Vec<Series> = subjects.iter().enumerate().map(|(i, (name, (points, _)))| {
                    Series::new(name.clone(), PALETTE[i % PALETTE.len()], points.clone())
                }).collect();
                let caps = s.quotas.clone();
                let standing = standing_lines(&s);
                let axis = standing_axis(&standing);
                let title = format!("GPU-hours per {} ({} to {})", s.bucket, s.from, s.to);
                view! {
                    <section class="card">
                        {if subjects.is_empty() {
                            view! { <p class="muted" data-testid="usage-empty">"No GPU use in this range."</p> }.into_any()
                        } else {
                            view! { <LineChart title unit="h" testid="usage-chart" series=Signal::stored(series) x_axis=Signal::stored(XAxis::Date) from_zero=true/> }.into_any()
                        }}
                        <table class="table" data-testid="usage-totals">
                            <thead><tr>
                                <th>{if org { "Organization" } else { "Person" }}</th>
                                <th>"GPU-hours"</th><th>"Mean utilization"</th><th>"Idle GPU-hours"</th>
                            </tr></thead>
                            <tbody>
                                {subjects.into_iter().map(|(name, (_, t))| view! {
                                    <tr>
                                        <td data-label="Who">{name}</td>
                                        <td data-label="GPU-hours">{hours(t.gpu_hours)}</td>
                                        <td data-label="Mean utilization">{t.utilization().map(|u| format!("{:.0}%", u * 100.0)).unwrap_or_else(|| "—".into())}</td>
                                        <td data-label="Idle GPU-hours">{hours(t.idle_gpu_hours)}</td>
                                    </tr>
                                }).collect_view()}
                            </tbody>
                        </table>
                    </section>
                    {(!standing.is_empty()).then(|| view! {
                        <section class="card">
                            <h2>"Fair-share standing"</h2>
                            <p class="muted">"How the scheduler ranked each person with work waiting or running, every 10 minutes: 1 means no use lately, 0.5 exactly their share, and it halves with each further share's worth (use fades with a half-life). Together with measured utilization, this is why one person's task goes ahead of another's."</p>
                            <LineChart title="Fair-share factor" unit="" testid="standing-chart" series=Signal::stored(standing) x_axis=Signal::stored(axis) y_max=1.0 from_zero=true/>
                        </section>
                    })}
                    <section class="card">
                        <h2>"Monthly caps"</h2>
                        {if caps.is_empty() {
                            view! { <p class="muted">"No caps set."</p> }.into_any()
                        } else {
                            view! {
                                <table class="table" data-testid="usage-quotas">
                                    <thead><tr><th>"For"</th><th>"This month"</th><th>"GPU-hours used"</th><th>"At most at once"</th></tr></thead>
                                    <tbody>
                                        {caps.into_iter().map(|q| {
                                            let pct = q.gpu_hours_per_month.filter(|l| *l > 0.0).map(|l| (q.used_gpu_hours / l * 100.0).min(999.0));
                                            view! {
                                                <tr>
                                                    <td data-label="For">{q.name.clone()}" "<span class="muted small">{if q.scope == "tenant" { "(organization)" } else { "" }}</span></td>
                                                    <td data-label="This month">{q.month.clone()}</td>
                                                    <td data-label="GPU-hours used">
                                                        {match q.gpu_hours_per_month {
                                                            Some(l) => format!("{} of {} ({:.0}%)", hours(q.used_gpu_hours), hours(l), pct.unwrap_or(0.0)),
                                                            None => format!("{} (no cap)", hours(q.used_gpu_hours)),
                                                        }}
                                                        {pct.map(|p| view! { <div class="meter"><span style=format!("width:{:.0}%", p.min(100.0))></span></div> })}
                                                    </td>
                                                    <td data-label="At most at once">{q.max_gpus.map(|g| format!("{g} GPUs")).unwrap_or_else(|| "—".into())}</td>
                                                </tr>
                                            }
                                        }).collect_view()}
                                    </tbody>
                                </table>
                            }.into_any()
                        }}
                    </section>
                }.into_any()
            }
        })}
        </Transition>
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use autodl_common::api::UsagePoint;

    fn point(start: &str, org: &str, who: &str, h: f64, util: Option<f64>) -> UsagePoint {
        UsagePoint {
            start: start.into(),
            tenant_id: org.into(),
            tenant_name: org.into(),
            user_id: who.into(),
            user_email: who.into(),
            gpu_hours: h,
            avg_utilization: util,
            idle_gpu_hours: util.map(|_| h / 4.0),
        }
    }

    #[test]
    fn totals_and_lines_per_subject() {
        let s = UsageSeries {
            bucket: "day".into(),
            from: "2026-12-01".into(),
            to: "2026-12-02".into(),
            periods: vec!["2026-12-01T00:00:00Z".into(), "2026-12-02T00:00:00Z".into()],
            points: vec![
                point("2026-12-01T00:00:00Z", "Lab", "a@x", 2.0, Some(0.5)),
                point("2026-12-02T00:00:00Z", "Lab", "b@x", 2.0, None),
            ],
            quotas: vec![],
            standing: vec![],
        };
        let orgs = by_subject(&s, true);
        let (line, total) = &orgs["Lab"];
        assert_eq!(line.iter().map(|p| p.1).collect::<Vec<_>>(), vec![2.0, 2.0]);
        assert_eq!(total.gpu_hours, 4.0);
        assert_eq!(
            total.utilization(),
            Some(0.5),
            "weighted by measured hours only"
        );
        assert_eq!(total.idle_gpu_hours, 0.5);
        assert_eq!(by_subject(&s, false).len(), 2);
    }
}
