//! Quotas as administrators set them: checked values, and a member's caps inside the
//! organization's.

use autodl_common::api::Quota;

use super::AllowedGpuTypes;
use super::DomainError;
use crate::store::QuotaRecord;

/// Checks a quota's values and turns it into the stored form.
pub fn parse_quota(q: &Quota) -> Result<QuotaRecord, DomainError> {
    if q.max_gpus.is_some_and(|n| n > 1_000_000) {
        return Err(DomainError::invalid(
            "max_gpus",
            "max_gpus is unreasonably large",
        ));
    }
    if let Some(h) = q.gpu_hours_per_month {
        if !h.is_finite() || !(0.0..=1e9).contains(&h) {
            return Err(DomainError::invalid(
                "gpu_hours_per_month",
                "gpu_hours_per_month must be a number between 0 and 1e9",
            ));
        }
    }
    if q.max_queued_tasks.is_some_and(|n| n > 10_000_000) {
        return Err(DomainError::invalid(
            "max_queued_tasks",
            "max_queued_tasks is unreasonably large",
        ));
    }
    let allowed_gpu_types = AllowedGpuTypes::parse(q.allowed_gpu_types.as_deref())?;
    let max_storage_bytes = match q.max_storage_bytes {
        Some(b) => Some(i64::try_from(b).map_err(|_| {
            DomainError::invalid(
                "max_storage_bytes",
                "max_storage_bytes is unreasonably large",
            )
        })?),
        None => None,
    };
    if let Some(share) = q.share {
        if !share.is_finite() || share <= 0.0 || share > 1000.0 {
            return Err(DomainError::invalid(
                "share",
                "share must be a number above 0 and at most 1000",
            ));
        }
    }
    Ok(QuotaRecord {
        share: q.share,
        max_gpus: q.max_gpus.map(i64::from),
        gpu_hours_per_month: q.gpu_hours_per_month,
        max_queued_tasks: q.max_queued_tasks.map(i64::from),
        allowed_gpu_types,
        max_storage_bytes,
    })
}

pub fn quota_to_api(r: &QuotaRecord) -> Quota {
    Quota {
        max_gpus: r.max_gpus.map(|n| n as u32),
        gpu_hours_per_month: r.gpu_hours_per_month,
        max_queued_tasks: r.max_queued_tasks.map(|n| n as u32),
        allowed_gpu_types: r.allowed_gpu_types.list().map(<[String]>::to_vec),
        max_storage_bytes: r.max_storage_bytes.map(|b| b.max(0) as u64),
        share: r.share,
    }
}

/// A user's quota may only narrow the tenant's: every cap the tenant sets bounds the user's.
pub fn check_within(user: &QuotaRecord, tenant: &QuotaRecord) -> Result<(), DomainError> {
    fn over<T: PartialOrd + Copy>(u: Option<T>, t: Option<T>) -> bool {
        match (u, t) {
            (_, None) => false,
            (None, Some(_)) => false,
            (Some(u), Some(t)) => u > t,
        }
    }
    if over(user.max_gpus, tenant.max_gpus) {
        return Err(DomainError::Refused {
            field: "max_gpus",
            message: "max_gpus exceeds the organization's cap".into(),
        });
    }
    if over(user.gpu_hours_per_month, tenant.gpu_hours_per_month) {
        return Err(DomainError::Refused {
            field: "gpu_hours_per_month",
            message: "gpu_hours_per_month exceeds the organization's cap".into(),
        });
    }
    if over(user.max_queued_tasks, tenant.max_queued_tasks) {
        return Err(DomainError::Refused {
            field: "max_queued_tasks",
            message: "max_queued_tasks exceeds the organization's cap".into(),
        });
    }
    if let Err(bad) = user.allowed_gpu_types.within(&tenant.allowed_gpu_types) {
        return Err(DomainError::Refused {
            field: "allowed_gpu_types",
            message: format!("GPU type {bad:?} is not allowed for the organization"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_quota_within_tenant() {
        let tenant = parse_quota(&Quota {
            max_gpus: Some(8),
            allowed_gpu_types: Some(vec!["A100".into()]),
            ..Default::default()
        })
        .unwrap();
        let ok = parse_quota(&Quota {
            max_gpus: Some(4),
            allowed_gpu_types: Some(vec!["A100-40G".into()]),
            ..Default::default()
        })
        .unwrap();
        assert!(check_within(&ok, &tenant).is_ok());
        let too_many = parse_quota(&Quota {
            max_gpus: Some(9),
            ..Default::default()
        })
        .unwrap();
        assert!(check_within(&too_many, &tenant).is_err());
        let wrong_type = parse_quota(&Quota {
            allowed_gpu_types: Some(vec!["A40".into()]),
            ..Default::default()
        })
        .unwrap();
        assert!(check_within(&wrong_type, &tenant).is_err());
    }
}
