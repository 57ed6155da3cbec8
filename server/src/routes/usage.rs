//! GPU use as HTTP: the monthly report for platform administrators and the series per
//! person and period, as JSON or CSV. What is counted and who sees what are
//! `usecases::usage`'s.

use actix_web::{get, web, HttpResponse};
use autodl_common::api::{ErrorBody, UsageSeries};
use serde::Deserialize;

use super::attachment::attachment;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;
use crate::usecases::usage::{self as gpu_use, UsageReport};

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct UsageQuery {
    /// `YYYY-MM` (UTC); the current month when absent.
    month: Option<String>,
    /// `json` (default) or `csv`.
    format: Option<String>,
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
        .unwrap_or_else(|| gpu_use::current_month(state.clock.now_ms()));
    let report = gpu_use::report(&state, &caller, &month).await?;
    match q.format.as_deref() {
        None | Some("json") => Ok(HttpResponse::Ok().json(report)),
        Some("csv") => Ok(HttpResponse::Ok()
            .content_type("text/csv; charset=utf-8")
            .insert_header(attachment(&format!("autodl-usage-{month}.csv")))
            .body(to_csv(&report))),
        Some(_) => Err(ApiError::invalid("format", "format is json or csv")),
    }
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct SeriesQuery {
    /// First day (UTC, `YYYY-MM-DD`); 29 days before `to` unless given.
    from: Option<String>,
    /// Last day included (UTC, `YYYY-MM-DD`); today unless given.
    to: Option<String>,
    /// `day` (default), `week` (from Monday) or `month`.
    bucket: Option<String>,
    /// An organization (platform administrators; others see their own).
    tenant: Option<String>,
    /// One person (their organization's owners and admins, platform administrators; a member
    /// sees only themselves).
    user: Option<String>,
    /// `json` (default) or `csv`.
    format: Option<String>,
}

fn day(field: &'static str, s: &str) -> Result<time::Date, ApiError> {
    let fmt = time::macros::format_description!("[year]-[month]-[day]");
    time::Date::parse(s, &fmt).map_err(|_| {
        ApiError::invalid(
            field,
            format!("{field}: {s:?} is not a date like 2026-12-01"),
        )
    })
}

fn series_csv(s: &UsageSeries) -> String {
    use super::csv::field;
    let mut out = String::from(
        "bucket,start,tenant_id,tenant,user_id,user,gpu_hours,avg_utilization,idle_gpu_hours\n",
    );
    for p in &s.points {
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{}\n",
            s.bucket,
            p.start,
            field(&p.tenant_id),
            field(&p.tenant_name),
            field(&p.user_id),
            field(&p.user_email),
            p.gpu_hours,
            p.avg_utilization.map(|v| v.to_string()).unwrap_or_default(),
            p.idle_gpu_hours.map(|v| v.to_string()).unwrap_or_default()
        ));
    }
    out
}

/// GPU-hours, measured utilization and idle GPU-hours per person and period, with the monthly
/// caps and what is used of them: everyone's for platform administrators, the organization's
/// for its owners and admins, a member's own otherwise. CSV with `format=csv`.
#[utoipa::path(
    params(SeriesQuery),
    responses(
        (status = 200, description = "Use per person and period; CSV with format=csv", content(
            (UsageSeries = "application/json"),
            (String = "text/csv")
        )),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)
    )
)]
#[get("/usage/series")]
#[tracing::instrument(skip_all, fields(user = %caller.user.id))]
pub async fn series(
    state: web::Data<AppState>,
    caller: Caller,
    q: web::Query<SeriesQuery>,
) -> Result<HttpResponse, ApiError> {
    use crate::usage_series::Bucket;
    let format = q.format.as_deref().unwrap_or("json");
    if !matches!(format, "json" | "csv") {
        return Err(ApiError::invalid("format", "format is json or csv"));
    }
    let bucket = Bucket::parse(q.bucket.as_deref().unwrap_or("day"))
        .ok_or_else(|| ApiError::invalid("bucket", "bucket is day, week or month"))?;
    let now = state.clock.now_ms();
    let today = time::OffsetDateTime::from_unix_timestamp(now / 1000)
        .map_err(anyhow::Error::from)?
        .date();
    let to =
        q.to.as_deref()
            .map(|s| day("to", s))
            .transpose()?
            .unwrap_or(today);
    let from = match q.from.as_deref() {
        Some(s) => day("from", s)?,
        None => to - time::Duration::days(29),
    };
    // The two days in either order are the same range; nothing ran before 1970.
    let (from, to) = if from > to { (to, from) } else { (from, to) };
    let epoch = time::macros::date!(1970 - 01 - 01);
    let (from, to) = (from.max(epoch), to.max(epoch));
    let end = to
        .next_day()
        .ok_or_else(|| ApiError::invalid("to", "to is too far ahead"))?;
    let out = gpu_use::series(
        &state,
        &caller,
        (q.tenant.clone(), q.user.clone()),
        (from, end),
        bucket,
    )
    .await?;
    Ok(match format {
        "csv" => HttpResponse::Ok()
            .content_type("text/csv; charset=utf-8")
            .insert_header(attachment(&format!("autodl-usage-{from}-{to}.csv")))
            .body(series_csv(&out)),
        _ => HttpResponse::Ok().json(out),
    })
}
