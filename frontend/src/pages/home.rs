use std::time::Duration;

use autodl_common::api::Quota;
use autodl_common::tasks::{Task, TaskPage};
use leptos::prelude::*;

use super::quota::quota_summary;
use super::tasks::{gpu_summary, state_badge};
use crate::api;
use crate::live;
use crate::paths;
use crate::session::use_session;
use crate::time::Time;

#[component]
pub fn HomePage() -> impl IntoView {
    let session = use_session();
    view! {
        <Suspense>
        {move || Suspend::new(async move { match session.0.await {
            Some(_) => view! { <Dashboard/> }.into_any(),
            None => view! {
                <section class="hero">
                    <h1>"Train on shared GPUs, fairly."</h1>
                    <p class="lead">
                        "autodl runs your containerized training tasks on your organization's GPUs: fair-share scheduling, "
                        "GPU-memory packing, checkpoint-based preemption and quotas, with live charts and logs."
                    </p>
                    <p class="actions">
                        <a class="button" href="/signup">"Create an account"</a>
                        <a class="button secondary" href="/login">"Sign in"</a>
                    </p>
                </section>
            }.into_any(),
        }})}
        </Suspense>
    }
}

/// A plain-words note on where the caller stands in the fair-share order.
/// `waiting` is the first page of the caller's waiting tasks, `total` how many wait in all.
fn fair_share_note(waiting: &[Task], total: u64) -> String {
    let factors: Vec<_> = waiting
        .iter()
        .filter_map(|t| t.waiting.as_ref().and_then(|w| w.priority.clone()))
        .collect();
    if waiting.is_empty() {
        return "Nothing of yours is waiting: new tasks start as soon as GPUs fit them.".into();
    }
    if factors.is_empty() {
        return "Your waiting tasks have not been through a scheduling cycle yet.".into();
    }
    // A quota holds them whatever their place in the fair-share order: say that instead.
    if let Some(w) = waiting
        .iter()
        .filter_map(|t| t.waiting.as_ref())
        .find(|w| w.reason.as_deref() == Some("quota"))
    {
        let held = waiting
            .iter()
            .filter(|t| t.waiting.as_ref().and_then(|w| w.reason.as_deref()) == Some("quota"))
            .count();
        let of = if total > waiting.len() as u64 {
            format!("the first {} of your {total}", waiting.len())
        } else {
            format!("your {total}")
        };
        return format!(
            "{held} of {of} waiting tasks are held by a quota: {}.",
            w.message
        );
    }
    let share = factors.iter().map(|f| f.fair_share).sum::<f64>() / factors.len() as f64;
    let lead = if share >= 0.66 {
        "You have used little of your fair share lately, so your tasks are near the front of the queue."
    } else if share >= 0.33 {
        "You have used about your fair share lately; your tasks queue alongside everyone else's."
    } else {
        "You have used more than your fair share lately, so others' tasks go first for now; your priority recovers as your recent usage ages out."
    };
    format!("{lead} (fair-share factor {share:.2} of 1.)")
}

#[component]
fn Dashboard() -> impl IntoView {
    let session = use_session();
    let tick = live::ticker(Duration::from_secs(5));
    let running = Resource::new(
        move || tick.get(),
        |_| api::get::<TaskPage>(format!("{}?user=me&state=running&limit=50", paths::tasks())),
    );
    let waiting = Resource::new(
        move || tick.get(),
        |_| api::get::<TaskPage>(format!("{}?user=me&state=pending&limit=50", paths::tasks())),
    );
    let quota = Resource::new(|| (), |_| api::get::<Quota>(paths::tenant_quota()));
    let list = move |r: Resource<Result<TaskPage, api::ApiErr>>| {
        r.get()
            .and_then(|r| r.ok())
            .map(|p| p.items)
            .unwrap_or_default()
    };
    // The tables show the first page; the counts are of all pages.
    let total = move |r: Resource<Result<TaskPage, api::ApiErr>>| {
        r.get()
            .and_then(|r| r.ok())
            .map(|p| p.total.max(p.items.len() as u64))
            .unwrap_or_default()
    };
    let more = move |r: Resource<Result<TaskPage, api::ApiErr>>, state: &'static str| {
        let (shown, all) = (list(r).len() as u64, total(r));
        (all > shown).then(|| {
            view! {
                <p class="muted small">{format!("The first {shown} of {all}. ")}
                    <a href=format!("/tasks?state={state}&mine=1")>"See them all"</a></p>
            }
        })
    };
    let table = move |tasks: Vec<Task>, empty: &'static str, testid: &'static str| {
        view! {
            <table class="table" data-testid=testid>
                <thead><tr><th>"Name"</th><th>"State"</th><th>"GPUs"</th><th>"Submitted"</th><th>"Note"</th></tr></thead>
                <tbody>
                {if tasks.is_empty() {
                    view! { <tr><td colspan="5" class="muted">{empty}</td></tr> }.into_any()
                } else {
                    tasks.into_iter().map(|t| view! {
                        <tr>
                            <td><a href=format!("/tasks/{}", t.id)>{t.name.clone()}</a></td>
                            <td>{state_badge(t.state)}</td>
                            <td>{gpu_summary(&t.spec)}</td>
                            <td><Time at=t.created_at.clone()/></td>
                            <td class="muted small">{t.waiting.as_ref().map(|w| w.message.clone()).unwrap_or_default()}</td>
                        </tr>
                    }).collect_view().into_any()
                }}
                </tbody>
            </table>
        }
    };
    view! {
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
        <section class="card">
            <div class="title-row">
                <h1>"Dashboard"</h1>
                <div class="actions">
                    <a class="button" href="/submit">"Submit a task"</a>
                    <a class="button secondary" href="/tasks">"All tasks"</a>
                </div>
            </div>
            <p class="muted">{move || session.me().map(|m| format!("{} · {}", m.email, m.tenant_name))}</p>
            <div class="stats">
                <div class="stat"><span class="stat-value" data-testid="running-count">{move || total(running)}</span><span class="muted">"running"</span></div>
                <div class="stat"><span class="stat-value" data-testid="waiting-count">{move || total(waiting)}</span><span class="muted">"waiting"</span></div>
                <div class="stat"><span class="stat-value">{move || {
                    let shown = list(running);
                    let gpus = shown.iter().map(|t| t.spec.gpus_per_worker * t.spec.num_workers).sum::<u32>();
                    // Counted over the first page only: say so rather than undercount.
                    if total(running) > shown.len() as u64 { format!("{gpus}+") } else { gpus.to_string() }
                }}</span><span class="muted">"GPUs in use"</span></div>
            </div>
            <p class="muted">"Organization quota: " <span data-testid="dash-quota">{move || quota.get().and_then(|q| q.ok()).map(|q| quota_summary(&q))}</span></p>
            <p class="notice" data-testid="fair-share">{move || fair_share_note(&list(waiting), total(waiting))}</p>
        </section>
        <section class="card">
            <h2>"Running"</h2>
            {move || table(list(running), "Nothing running.", "dash-running")}
            {move || more(running, "running")}
        </section>
        <section class="card">
            <h2>"Waiting"</h2>
            {move || table(list(waiting), "Nothing waiting.", "dash-waiting")}
            {move || more(waiting, "pending")}
        </section>
        </Transition>
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use autodl_common::tasks::{PriorityFactors, TaskState, Waiting};

    fn waiting(reason: &str, message: &str, fair_share: f64) -> Task {
        let mut t = crate::pages::task_notices::tests::task(TaskState::Pending, 0);
        t.waiting = Some(Waiting {
            reason: Some(reason.into()),
            message: message.into(),
            position: Some(0),
            priority: Some(PriorityFactors {
                fair_share,
                utilization: 1.0,
                deadline: 0.0,
                declared: 0.5,
                age: 0.0,
                gpu_fit: 1.0,
                total: 0.5,
            }),
            estimated_start: None,
        });
        t
    }

    #[test]
    fn the_dashboard_says_a_quota_holds_tasks_before_any_place_in_the_queue() {
        let held = [
            waiting("priority", "tasks ahead of it", 0.9),
            waiting("quota", "over your GPU quota: 2 of 2 GPUs in use", 0.9),
        ];
        let note = fair_share_note(&held, 2);
        assert_eq!(
            note,
            "1 of your 2 waiting tasks are held by a quota: over your GPU quota: 2 of 2 GPUs in use."
        );
        assert!(!note.contains("near the front"));
        assert!(fair_share_note(&held, 60).contains("the first 2 of your 60"));
    }

    #[test]
    fn the_dashboard_says_where_fair_share_puts_the_caller() {
        let t = |share| [waiting("priority", "tasks ahead of it", share)];
        assert!(fair_share_note(&t(0.9), 1).starts_with("You have used little"));
        assert!(fair_share_note(&t(0.5), 1).contains("alongside everyone else's"));
        assert!(fair_share_note(&t(0.1), 1).contains("others' tasks go first"));
        assert!(fair_share_note(&[], 0).starts_with("Nothing of yours is waiting"));
        let mut fresh = crate::pages::task_notices::tests::task(TaskState::Pending, 0);
        fresh.waiting = None;
        assert!(fair_share_note(&[fresh], 1).contains("not been through a scheduling cycle"));
    }
}
