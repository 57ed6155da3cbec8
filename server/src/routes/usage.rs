//! Monthly GPU usage per organization and user, for platform administrators: GPU-hours from
//! the attempts (GPUs × the part of each attempt's run inside the month; running attempts count
//! up to now) and mean GPU utilization from the raw GPU samples of their tasks.

use std::collections::BTreeMap;

use actix_web::{get, web, HttpResponse};
use autodl_common::api::ErrorBody;
use serde::{Deserialize, Serialize};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::{rfc3339, AppState};

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct UsageQuery {
    /// `YYYY-MM` (UTC); the current month when absent.
    month: Option<String>,
    /// `json` (default) or `csv`.
    format: Option<String>,
}

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

fn current_month(now: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp(now / 1000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!("{:04}-{:02}", t.year(), u8::from(t.month()))
}

fn round(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    // `+ 0.0` turns the -0.0 of an empty sum into 0.
    (v * f).round() / f + 0.0
}

pub async fn report(state: &AppState, month: &str) -> Result<UsageReport, ApiError> {
    let (from, to) = month_range(month)
        .ok_or_else(|| ApiError::invalid("month", "month must look like 2024-03"))?;
    let now = state.clock.now_ms();
    let attempts = state.store.usage_attempts(from, to).await?;
    let util: BTreeMap<String, (f64, i64)> = state
        .store
        .usage_utilization(from, to)
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

pub fn to_csv(r: &UsageReport) -> String {
    let mut out =
        String::from("month,tenant_id,tenant,user_id,user,attempts,gpu_hours,avg_utilization\n");
    for u in &r.users {
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{}\n",
            r.month,
            super::csv::field(&u.tenant_id),
            super::csv::field(&u.tenant_name),
            super::csv::field(&u.user_id),
            super::csv::field(&u.user_email),
            u.attempts,
            u.gpu_hours,
            u.avg_utilization.map(|v| v.to_string()).unwrap_or_default()
        ));
    }
    out
}

/// GPU-hours and mean utilization per organization and user in a month (UTC), as JSON or, with
/// `format=csv`, as a CSV download.
#[utoipa::path(
    params(UsageQuery),
    responses(
        (status = 200, description = "The month's usage; CSV with format=csv", content(
            (UsageReport = "application/json"),
            (String = "text/csv")
        )),
        (status = 400, body = ErrorBody), (status = 403, body = ErrorBody)
    )
)]
#[get("/admin/usage")]
pub async fn usage(
    state: web::Data<AppState>,
    caller: Caller,
    q: web::Query<UsageQuery>,
) -> Result<HttpResponse, ApiError> {
    caller.require_platform_admin()?;
    let month = q
        .month
        .clone()
        .unwrap_or_else(|| current_month(state.clock.now_ms()));
    let report = report(&state, &month).await?;
    match q.format.as_deref() {
        None | Some("json") => Ok(HttpResponse::Ok().json(report)),
        Some("csv") => Ok(HttpResponse::Ok()
            .content_type("text/csv; charset=utf-8")
            .insert_header((
                "Content-Disposition",
                format!("attachment; filename=\"autodl-usage-{month}.csv\""),
            ))
            .body(to_csv(&report))),
        Some(_) => Err(ApiError::invalid("format", "format is json or csv")),
    }
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
