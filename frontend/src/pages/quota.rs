use std::future::Future;
use std::pin::Pin;

use autodl_common::api::Quota;
use leptos::prelude::*;

use crate::api::{ApiErr, ApiResult};
use crate::fields::{general_error, Field};

pub fn quota_summary(q: &Quota) -> String {
    let mut parts = Vec::new();
    parts.push(match q.max_gpus {
        Some(n) => format!("{n} GPUs at once"),
        None => "any number of GPUs".into(),
    });
    if let Some(h) = q.gpu_hours_per_month {
        parts.push(format!("{h} GPU-hours a month"));
    }
    if let Some(n) = q.max_queued_tasks {
        parts.push(format!("{n} queued tasks"));
    }
    if let Some(t) = &q.allowed_gpu_types {
        parts.push(format!("types: {}", t.join(", ")));
    }
    if let Some(b) = q.max_storage_bytes {
        parts.push(format!("{} of storage", super::tasks::bytes(b)));
    }
    if let Some(s) = q.share {
        parts.push(format!("fair-share weight {s}"));
    }
    parts.join(" · ")
}

type SaveFuture = Pin<Box<dyn Future<Output = ApiResult<Quota>>>>;

const GIB: f64 = (1u64 << 30) as f64;

/// Edits a quota; `save` sends it and answers with what the server stored. Storage is an
/// organization's cap only (`storage`).
#[component]
pub fn QuotaEditor<F, Fut>(
    initial: Quota,
    save: F,
    on_close: impl Fn() + Clone + Send + Sync + 'static,
    #[prop(optional)] storage: bool,
) -> impl IntoView
where
    F: Fn(Quota) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = ApiResult<Quota>> + 'static,
{
    let opt = |v: Option<String>| RwSignal::new(v.unwrap_or_default());
    let max_gpus = opt(initial.max_gpus.map(|n| n.to_string()));
    let hours = opt(initial.gpu_hours_per_month.map(|n| n.to_string()));
    let queued = opt(initial.max_queued_tasks.map(|n| n.to_string()));
    let types = opt(initial.allowed_gpu_types.map(|t| t.join(", ")));
    let storage_gib = opt(initial
        .max_storage_bytes
        .map(|b| format!("{}", b as f64 / GIB)));
    let share = opt(initial.share.map(|s| s.to_string()));
    let error = RwSignal::new(None::<ApiErr>);
    let saved = RwSignal::new(false);
    let action = Action::new_local(move |q: &Quota| -> SaveFuture { Box::pin(save(q.clone())) });
    Effect::new(move |_| match action.value().get() {
        Some(Ok(_)) => {
            error.set(None);
            saved.set(true);
        }
        Some(Err(e)) => error.set(Some(e)),
        None => {}
    });
    let invalid = |field: &str, what: &str| ApiErr {
        status: 400,
        code: "validation".into(),
        message: format!("{what} must be a number, or empty for no cap"),
        field: Some(field.into()),
    };
    let on_submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        saved.set(false);
        let int = |s: String, f: &str| -> Result<Option<u32>, ApiErr> {
            let s = s.trim().to_string();
            if s.is_empty() {
                Ok(None)
            } else {
                s.parse().map(Some).map_err(|_| invalid(f, f))
            }
        };
        let q = (|| -> Result<Quota, ApiErr> {
            let h = hours.get_untracked();
            Ok(Quota {
                max_gpus: int(max_gpus.get_untracked(), "max_gpus")?,
                gpu_hours_per_month: if h.trim().is_empty() {
                    None
                } else {
                    Some(
                        h.trim()
                            .parse()
                            .map_err(|_| invalid("gpu_hours_per_month", "GPU-hours"))?,
                    )
                },
                max_queued_tasks: int(queued.get_untracked(), "max_queued_tasks")?,
                allowed_gpu_types: {
                    let t = types.get_untracked();
                    let list: Vec<String> = t
                        .split(',')
                        .map(|s| s.trim().to_string())
                        .filter(|s| !s.is_empty())
                        .collect();
                    (!list.is_empty()).then_some(list)
                },
                max_storage_bytes: {
                    let g = storage_gib.get_untracked();
                    if g.trim().is_empty() {
                        None
                    } else {
                        let v: f64 = g
                            .trim()
                            .parse()
                            .map_err(|_| invalid("max_storage_bytes", "Storage"))?;
                        Some((v.max(0.0) * GIB).round() as u64)
                    }
                },
                share: {
                    let w = share.get_untracked();
                    if w.trim().is_empty() {
                        None
                    } else {
                        Some(
                            w.trim()
                                .parse()
                                .map_err(|_| invalid("share", "Fair-share weight"))?,
                        )
                    }
                },
            })
        })();
        match q {
            Ok(q) => {
                action.dispatch(q);
            }
            Err(e) => error.set(Some(e)),
        }
    };
    let ferr =
        move |f: &'static str| Signal::derive(move || error.get().and_then(|e| e.for_field(f)));
    view! {
        <form class="quota-form" method="post" on:submit=on_submit novalidate>
            <Field label="GPUs at once" id="max_gpus" kind="number" value=max_gpus error=ferr("max_gpus") placeholder="no cap"/>
            <Field label="GPU-hours per month" id="gpu_hours_per_month" kind="number" value=hours error=ferr("gpu_hours_per_month") placeholder="no cap"/>
            <Field label="Queued tasks" id="max_queued_tasks" kind="number" value=queued error=ferr("max_queued_tasks") placeholder="no cap"/>
            <Field label="Allowed GPU types" id="allowed_gpu_types" value=types error=ferr("allowed_gpu_types") placeholder="all types (e.g. A100, A40)"/>
            {storage.then(|| view! {
                <Field label="Storage (GiB)" id="max_storage_bytes" kind="number" value=storage_gib error=ferr("max_storage_bytes") placeholder="no cap"/>
            })}
            <Field label="Fair-share weight" id="share" kind="number" value=share error=ferr("share") placeholder="1"/>
            <p class="banner error" role="alert">{move || general_error(error.get(), &["max_gpus", "gpu_hours_per_month", "max_queued_tasks", "allowed_gpu_types", "max_storage_bytes", "share"])}</p>
            {move || saved.get().then(|| view! { <p class="banner ok">"Saved."</p> })}
            <div class="actions">
                <button type="submit" disabled=move || action.pending().get()>"Save quota"</button>
                <button type="button" class="secondary" on:click=move |_| on_close()>"Close"</button>
            </div>
        </form>
    }
}
