//! "Quota nearly used": a person or organization with a monthly GPU-hour cap hears when its
//! use this month passes 80% and again at 100%, once each per month, whichever server notices
//! first (the alert is claimed in the database). Checked by the scheduling leader, whose
//! charges keep the month's usage current.

use crate::store::{Accounts, Notifications, Usage, Webhooks};

/// Percentages of the cap that are told.
pub const LEVELS: [i64; 2] = [80, 100];

/// "YYYY-MM" (UTC) of `now_ms`, as the usage table keeps it.
pub fn month_of(now_ms: i64) -> String {
    crate::scheduling::snapshot::month_text(autodl_scheduler::month_of(
        (now_ms / 1000).max(0) as u64
    ))
}

/// Tells each subject over a level it was not told of yet this month; how many were told.
pub async fn check<S: Accounts + Notifications + Usage + Webhooks + ?Sized>(
    store: &S,
    now_ms: i64,
) -> anyhow::Result<usize> {
    let month = month_of(now_ms);
    let usage: std::collections::HashMap<(String, String), f64> = store
        .load_usage()
        .await?
        .into_iter()
        .filter(|u| u.month == month)
        .map(|u| ((u.scope, u.subject_id), u.month_gpu_seconds))
        .collect();
    let mut told = 0;
    for row in store.all_quotas().await? {
        let Some(limit) = row.quota.gpu_hours_per_month.filter(|l| *l > 0.0) else {
            continue;
        };
        let used = usage
            .get(&(row.scope.clone(), row.subject_id.clone()))
            .copied()
            .unwrap_or(0.0)
            / 3600.0;
        let Some(level) = LEVELS
            .iter()
            .rev()
            .copied()
            .find(|l| used * 100.0 >= limit * *l as f64)
        else {
            continue;
        };
        if !store
            .claim_quota_alert(&row.scope, &row.subject_id, &month, level, now_ms)
            .await?
        {
            continue;
        }
        let (tenant, people, who) = if row.scope == "tenant" {
            let managers: Vec<String> = store
                .list_members(&row.subject_id)
                .await?
                .into_iter()
                .filter(|u| !u.disabled && matches!(u.role.as_str(), "owner" | "admin"))
                .map(|u| u.id)
                .collect();
            (
                row.subject_id.clone(),
                managers,
                serde_json::json!({ "id": row.subject_id }),
            )
        } else {
            let Some(user) = store.user(&row.subject_id).await? else {
                continue;
            };
            let who = serde_json::json!({ "id": user.id, "email": user.email });
            (user.tenant_id, vec![user.id], who)
        };
        let data = serde_json::json!({
            "scope": row.scope,
            "subject": who,
            "month": month,
            "percent": level,
            "used_gpu_hours": (used * 100.0).round() / 100.0,
            "limit_gpu_hours": limit,
        });
        let people: Vec<&str> = people.iter().map(String::as_str).collect();
        super::tell(
            store,
            &tenant,
            &people,
            super::Event::QuotaNearlyUsed,
            data,
            now_ms,
        )
        .await;
        told += 1;
    }
    Ok(told)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn months_are_said_as_the_usage_table_keeps_them() {
        assert_eq!(month_of(1_764_671_631_000), "2025-12");
        assert_eq!(month_of(1_767_225_600_000), "2026-01");
    }
}
