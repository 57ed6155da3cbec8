//! GPU use: GPU-hours from the attempts (GPUs × the part of each attempt's run inside a
//! period; running attempts count up to now), measured utilization from the raw GPU samples of
//! their tasks, idle GPU-hours, the monthly caps and what is used of them, and fair-share
//! standings. Platform administrators see everyone's, an organization's owners and admins
//! their organization's, a member their own.

use std::collections::BTreeMap;

use autodl_common::api::{QuotaUse, StandingPoint, UsagePoint, UsageSeries};
use serde::{Deserialize, Serialize};

use crate::auth::Caller;
use crate::domain::rfc3339;
use crate::error::ApiError;
use crate::state::AppState;
use crate::usage_series::{hours_within, Bucket};

/// One user's usage in the month.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UsageRow {
    pub tenant_id: String,
    pub tenant_name: String,
    pub user_id: String,
    pub user_email: String,
    pub attempts: u64,
    pub gpu_hours: f64,
    /// Mean GPU utilization 0..1 over the month's samples of the user's tasks; null without
    /// samples.
    pub avg_utilization: Option<f64>,
}

/// An organization's total in the month.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TenantUsage {
    pub tenant_id: String,
    pub tenant_name: String,
    pub gpu_hours: f64,
    pub users: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UsageReport {
    pub month: String,
    pub from: String,
    pub to: String,
    pub total_gpu_hours: f64,
    pub tenants: Vec<TenantUsage>,
    pub users: Vec<UsageRow>,
}

/// `[start, end)` of a `YYYY-MM` month in ms since the epoch.
pub fn month_range(month: &str) -> Option<(i64, i64)> {
    let (y, m) = month.split_once('-')?;
    let digits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(y, 4) || !digits(m, 2) {
        return None;
    }
    let y: i32 = y.parse().ok()?;
    let m: u8 = m.parse().ok()?;
    let start_month = time::Month::try_from(m).ok()?;
    let start = time::Date::from_calendar_date(y, start_month, 1).ok()?;
    let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    let end = time::Date::from_calendar_date(ny, time::Month::try_from(nm).ok()?, 1).ok()?;
    let ms = |d: time::Date| d.midnight().assume_utc().unix_timestamp() * 1000;
    Some((ms(start), ms(end)))
}

pub fn current_month(now: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp(now / 1000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!("{:04}-{:02}", t.year(), u8::from(t.month()))
}

fn round(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    // `+ 0.0` turns the -0.0 of an empty sum into 0.
    (v * f).round() / f + 0.0
}

/// The month's GPU-hours per organization and person, for platform administrators.
pub async fn report(
    state: &AppState,
    caller: &Caller,
    month: &str,
) -> Result<UsageReport, ApiError> {
    caller.require_platform_admin()?;
    let (from, to) = month_range(month)
        .ok_or_else(|| ApiError::invalid("month", "month must look like 2024-03"))?;
    let now = state.clock.now_ms();
    let attempts = state.store.usage_attempts(from, to).await?;
    let util: BTreeMap<String, (f64, i64)> = state
        .store
        .usage_utilization(from, to, idle_below())
        .await?
        .into_iter()
        .map(|u| (u.user_id, (u.avg_util, u.samples)))
        .collect();
    let mut users: BTreeMap<(String, String), UsageRow> = BTreeMap::new();
    for a in attempts {
        let start = a.started_at.max(from);
        let end = a.ended_at.unwrap_or(now).min(to);
        let hours = (end - start).max(0) as f64 / 3_600_000.0 * a.gpus.max(0) as f64;
        let row = users
            .entry((a.tenant_name.clone(), a.user_email.clone()))
            .or_insert_with(|| UsageRow {
                avg_utilization: util.get(&a.user_id).map(|u| round(u.0, 4)),
                tenant_id: a.tenant_id,
                tenant_name: a.tenant_name,
                user_id: a.user_id,
                user_email: a.user_email,
                attempts: 0,
                gpu_hours: 0.0,
            });
        row.attempts += 1;
        row.gpu_hours += hours;
    }
    let mut tenants: BTreeMap<String, TenantUsage> = BTreeMap::new();
    let mut rows: Vec<UsageRow> = users.into_values().collect();
    for r in &mut rows {
        r.gpu_hours = round(r.gpu_hours, 4);
        let t = tenants
            .entry(r.tenant_name.clone())
            .or_insert_with(|| TenantUsage {
                tenant_id: r.tenant_id.clone(),
                tenant_name: r.tenant_name.clone(),
                gpu_hours: 0.0,
                users: 0,
            });
        t.gpu_hours = round(t.gpu_hours + r.gpu_hours, 4);
        t.users += 1;
    }
    let total = round(rows.iter().map(|r| r.gpu_hours).sum(), 4);
    Ok(UsageReport {
        month: month.to_owned(),
        from: rfc3339(from),
        to: rfc3339(to),
        total_gpu_hours: total,
        tenants: tenants.into_values().collect(),
        users: rows,
    })
}

/// Below this measured utilization a GPU counts as idle: the session policy's default.
pub fn idle_below() -> f64 {
    autodl_common::api::SessionPolicy::default().idle_util_pct / 100.0
}

/// The most periods one answer holds: a longer range is cut to its latest ones (the answer's
/// `periods` and `from` say which).
const MAX_PERIODS: usize = 400;

/// The periods of `[from, end)`, the latest [`MAX_PERIODS`] of them.
fn latest_periods(from: time::Date, end: time::Date, bucket: Bucket) -> Vec<(i64, i64)> {
    use crate::usage_series::periods;
    let days = match bucket {
        Bucket::Day => 1,
        Bucket::Week => 7,
        Bucket::Month => 31,
    };
    let earliest = end
        .checked_sub(time::Duration::days(days * (MAX_PERIODS as i64 + 1)))
        .unwrap_or(time::Date::MIN);
    let mut spans = periods(from.max(earliest), end, bucket, MAX_PERIODS * 2).unwrap_or_default();
    let cut = spans.len().saturating_sub(MAX_PERIODS);
    spans.drain(..cut);
    spans
}

/// Use per person and period of `[from, end)` (the latest [`MAX_PERIODS`] periods), for the
/// organization and person `asked` for, within what the caller may see.
pub async fn series(
    state: &AppState,
    caller: &Caller,
    asked: (Option<String>, Option<String>),
    (from, end): (time::Date, time::Date),
    bucket: Bucket,
) -> Result<UsageSeries, ApiError> {
    let now = state.clock.now_ms();
    let spans = latest_periods(from, end, bucket);
    let (asked_tenant, asked_user) = asked;
    // Who the caller may see.
    let (tenant, user) = if caller.user.platform_admin {
        (asked_tenant, asked_user)
    } else if caller.role.can_manage() {
        if asked_tenant
            .as_deref()
            .is_some_and(|t| t != caller.tenant_id())
        {
            return Err(ApiError::Forbidden(
                "you see your own organization's use only".into(),
            ));
        }
        (Some(caller.tenant_id().to_owned()), asked_user)
    } else {
        if asked_user.as_deref().is_some_and(|u| u != caller.user.id)
            || asked_tenant
                .as_deref()
                .is_some_and(|t| t != caller.tenant_id())
        {
            return Err(ApiError::Forbidden(
                "you see your own use only; your organization's owners and admins see everyone's"
                    .into(),
            ));
        }
        (
            Some(caller.tenant_id().to_owned()),
            Some(caller.user.id.clone()),
        )
    };
    let seen = |t: &str, u: &str| {
        tenant.as_deref().is_none_or(|x| x == t) && user.as_deref().is_none_or(|x| x == u)
    };
    let (Some(first), Some(last)) = (spans.first(), spans.last()) else {
        return Err(ApiError::invalid("from", "the range holds no whole period"));
    };
    let (a, b) = (first.0, last.1);
    let mut points: BTreeMap<(usize, String), UsagePoint> = BTreeMap::new();
    for att in state.store.usage_attempts(a, b).await? {
        if !seen(&att.tenant_id, &att.user_id) {
            continue;
        }
        let end = att.ended_at.unwrap_or(now);
        let first = spans.partition_point(|(_, pe)| *pe <= att.started_at);
        for (i, (ps, pe)) in spans.iter().enumerate().skip(first) {
            if *ps >= end {
                break;
            }
            let h = hours_within(att.gpus, att.started_at, end, *ps, *pe);
            if h <= 0.0 {
                continue;
            }
            let p = points
                .entry((i, att.user_id.clone()))
                .or_insert_with(|| UsagePoint {
                    start: rfc3339(*ps),
                    tenant_id: att.tenant_id.clone(),
                    tenant_name: att.tenant_name.clone(),
                    user_id: att.user_id.clone(),
                    user_email: att.user_email.clone(),
                    gpu_hours: 0.0,
                    avg_utilization: None,
                    idle_gpu_hours: None,
                });
            p.gpu_hours += h;
        }
    }
    // Measured utilization, for the periods someone used.
    let used: std::collections::BTreeSet<usize> = points.keys().map(|(i, _)| *i).collect();
    for i in used {
        let (ps, pe) = spans[i];
        for u in state.store.usage_utilization(ps, pe, idle_below()).await? {
            if let Some(p) = points.get_mut(&(i, u.user_id)) {
                if u.samples > 0 {
                    p.avg_utilization = Some(round(u.avg_util, 4));
                    p.idle_gpu_hours = Some(round(
                        p.gpu_hours * u.idle_samples as f64 / u.samples as f64,
                        4,
                    ));
                }
            }
        }
    }
    let points: Vec<UsagePoint> = points
        .into_values()
        .map(|mut p| {
            p.gpu_hours = round(p.gpu_hours, 4);
            p
        })
        .collect();
    let quotas = quota_use(state, tenant.as_deref(), user.as_deref(), now).await?;
    let standing = state
        .store
        .standings(a, b)
        .await?
        .into_iter()
        .filter(|(s, _)| seen(&s.tenant_id, &s.user_id))
        .map(|(s, email)| StandingPoint {
            at: rfc3339(s.at),
            tenant_id: s.tenant_id,
            user_id: s.user_id,
            user_email: email,
            fair_share: round(s.fair_share, 4),
            utilization: round(s.utilization, 4),
        })
        .collect();
    let to = end.previous_day().unwrap_or(end);
    Ok(UsageSeries {
        bucket: bucket.as_str().to_owned(),
        from: spans
            .first()
            .and_then(|(ps, _)| time::OffsetDateTime::from_unix_timestamp(ps / 1000).ok())
            .map_or(from, |t| t.date())
            .to_string(),
        to: to.to_string(),
        periods: spans.iter().map(|(ps, _)| rfc3339(*ps)).collect(),
        points,
        quotas,
        standing,
    })
}

/// The caps of the organizations and people in view, and this month's use of each.
async fn quota_use(
    state: &AppState,
    tenant: Option<&str>,
    user: Option<&str>,
    now: i64,
) -> Result<Vec<QuotaUse>, ApiError> {
    let month = crate::notify::quota::month_of(now);
    let used: BTreeMap<(String, String), f64> = state
        .store
        .load_usage()
        .await?
        .into_iter()
        .filter(|u| u.month == month)
        .map(|u| ((u.scope, u.subject_id), u.month_gpu_seconds / 3600.0))
        .collect();
    let mut out = Vec::new();
    for row in state.store.all_quotas().await? {
        let q = &row.quota;
        if q.gpu_hours_per_month.is_none() && q.max_gpus.is_none() {
            continue;
        }
        let name = match row.scope.as_str() {
            "tenant" => {
                if tenant.is_some_and(|t| t != row.subject_id) {
                    continue;
                }
                match state.store.tenant(&row.subject_id).await? {
                    Some(t) => t.name,
                    None => continue,
                }
            }
            _ => {
                let Some(u) = state.store.user(&row.subject_id).await? else {
                    continue;
                };
                if tenant.is_some_and(|t| t != u.tenant_id) || user.is_some_and(|x| x != u.id) {
                    continue;
                }
                u.email
            }
        };
        out.push(QuotaUse {
            used_gpu_hours: round(
                used.get(&(row.scope.clone(), row.subject_id.clone()))
                    .copied()
                    .unwrap_or(0.0),
                4,
            ),
            scope: row.scope,
            id: row.subject_id,
            name,
            month: month.clone(),
            gpu_hours_per_month: q.gpu_hours_per_month,
            max_gpus: q.max_gpus,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn months() {
        let (a, b) = month_range("2024-02").unwrap();
        assert_eq!(b - a, 29 * 86_400_000);
        let (a, b) = month_range("2024-12").unwrap();
        assert_eq!(b - a, 31 * 86_400_000);
        assert!(month_range("2024-13").is_none());
        assert!(month_range("24-01").is_none());
        assert!(month_range("2024-1").is_none());
        assert_eq!(current_month(a), "2024-12");
    }

    #[test]
    fn empty_sums_are_plain_zero() {
        let total = round(std::iter::empty::<f64>().sum(), 4);
        assert_eq!(total.to_string(), "0");
    }
}
