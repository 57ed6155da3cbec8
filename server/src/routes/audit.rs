//! The audit trail for administrators: an organization's owners and admins see their
//! organization's records, platform administrators everyone's. Filter, page, or export as CSV.

use actix_web::{get, web, HttpResponse};
use autodl_common::api::{AuditEntry, AuditPage, ErrorBody};
use serde::Deserialize;

use crate::audit;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::AuditFilter;
use crate::usecases::audit_trail;

/// The most records one answer (or one export) holds.
const MAX_LIMIT: i64 = 100_000;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// An organization's id (platform administrators; others see their own organization's).
    tenant: Option<String>,
    /// The acting account's email.
    actor: Option<String>,
    /// An action (`api_key.created`) or a family of them (`auth.`).
    action: Option<String>,
    /// From this instant on: RFC 3339 or a UTC date `YYYY-MM-DD`.
    since: Option<String>,
    /// Before this instant: RFC 3339 or a UTC date `YYYY-MM-DD`.
    until: Option<String>,
    /// Only records older than this one (the previous page's `next_before`).
    #[param(minimum = 1)]
    before: Option<i64>,
    /// How many records, newest first: 100 unless given, at most 100000.
    #[param(minimum = 1, maximum = 100000)]
    limit: Option<i64>,
    /// `json` (default) or `csv` (a download).
    format: Option<String>,
}

/// An instant given as RFC 3339 or as a UTC date.
fn instant(field: &'static str, s: &str) -> Result<i64, ApiError> {
    use time::format_description::well_known::Rfc3339;
    let bad = || {
        ApiError::invalid(
            field,
            format!("{field}: {s:?} is not a time; write e.g. 2026-12-01 or 2026-12-01T09:30:00Z"),
        )
    };
    let t = match time::OffsetDateTime::parse(s, &Rfc3339) {
        Ok(t) => t,
        Err(_) => {
            let fmt = time::macros::format_description!("[year]-[month]-[day]");
            time::Date::parse(s, &fmt)
                .map_err(|_| bad())?
                .midnight()
                .assume_utc()
        }
    };
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).map_err(|_| bad())
}

fn to_csv(records: &[AuditEntry]) -> String {
    use super::csv::field;
    let mut out = String::from(
        "seq,at,tenant_id,actor_id,actor_email,action,target,detail,ip,prev_hash,hash\n",
    );
    for r in records {
        let opt = |v: &Option<String>| field(v.as_deref().unwrap_or(""));
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{}\n",
            r.seq,
            r.at,
            opt(&r.tenant_id),
            opt(&r.actor_id),
            opt(&r.actor_email),
            field(&r.action),
            field(&r.target),
            field(&r.detail.to_string()),
            opt(&r.ip),
            r.prev_hash,
            r.hash
        ));
    }
    out
}

/// Audit records, newest first.
#[utoipa::path(
    params(AuditQuery),
    responses(
        (status = 200, description = "A page of the trail; CSV with format=csv", content(
            (AuditPage = "application/json"),
            (String = "text/csv")
        )),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)
    )
)]
#[get("/audit")]
#[tracing::instrument(skip_all, fields(user = %caller.user.id))]
pub async fn list(
    state: web::Data<AppState>,
    caller: Caller,
    q: web::Query<AuditQuery>,
) -> Result<HttpResponse, ApiError> {
    let tenant_id = audit_trail::in_view(&caller, q.tenant.clone())?;
    if q.before.is_some_and(|b| b < 1) {
        return Err(ApiError::invalid(
            "before",
            "before is a record number, from 1",
        ));
    }
    let limit = q.limit.unwrap_or(100);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::invalid(
            "limit",
            format!("limit is between 1 and {MAX_LIMIT}"),
        ));
    }
    let filter = AuditFilter {
        tenant_id,
        actor_email: q.actor.as_ref().map(|a| a.trim().to_lowercase()),
        action: q.action.clone().filter(|a| !a.is_empty()),
        since: q
            .since
            .as_deref()
            .map(|s| instant("since", s))
            .transpose()?,
        until: q
            .until
            .as_deref()
            .map(|s| instant("until", s))
            .transpose()?,
        before: q.before,
    };
    let format = q.format.as_deref().unwrap_or("json");
    if !matches!(format, "json" | "csv") {
        return Err(ApiError::invalid("format", "format is json or csv"));
    }
    let rows = audit_trail::page(&state, &caller, filter, limit).await?;
    let next_before = (rows.len() as i64 == limit)
        .then(|| rows.last().map(|r| r.seq))
        .flatten();
    let records: Vec<AuditEntry> = rows.into_iter().map(audit::entry).collect();
    Ok(match format {
        "csv" => HttpResponse::Ok()
            .content_type("text/csv; charset=utf-8")
            .insert_header(super::attachment::attachment("autodl-audit.csv"))
            .body(to_csv(&records)),
        _ => HttpResponse::Ok().json(AuditPage {
            records,
            next_before,
        }),
    })
}
