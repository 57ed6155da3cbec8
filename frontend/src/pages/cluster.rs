//! The cluster (`/cluster`): every node's GPUs as a heatmap of measured utilization (memory
//! taken below each), refreshed every 3 s, with the tasks sharing each GPU.

use std::time::Duration;

use autodl_common::tasks::NodeInfo;
use leptos::prelude::*;

use super::tasks::bytes;
use crate::api;
use crate::live;
use crate::paths;
use crate::session::RequireLogin;

#[component]
pub fn ClusterPage() -> impl IntoView {
    view! { <RequireLogin><Cluster/></RequireLogin> }
}

/// The cell's shade, from the card's colour to blue as the GPU gets busier: the share goes to
/// the stylesheet (`--heat`), whose colours follow light and dark mode and keep the numbers
/// above 4.5:1 contrast at every level.
fn heat(share: f64) -> String {
    format!("--heat:{:.0}%", share.clamp(0.0, 1.0) * 100.0)
}

/// Nodes whose tasks share the host unconfined (an agent that could not sandbox them, left
/// open to every organization): users deciding where their code runs should know.
fn unisolated(nodes: &[NodeInfo]) -> Vec<String> {
    nodes
        .iter()
        .filter(|n| n.isolation == "none" && !n.trusted_only)
        .map(|n| n.id.clone())
        .collect()
}

/// A warning naming the nodes that do not isolate tasks from each other; nothing when all do.
#[component]
pub fn IsolationNotice(#[prop(into)] nodes: Signal<Vec<NodeInfo>>) -> impl IntoView {
    move || {
        let open = unisolated(&nodes.get());
        (!open.is_empty()).then(|| {
            view! {
                <p class="banner warn" role="status" data-testid="isolation-notice">
                    <strong>"Tasks are not isolated from each other"</strong>
                    {format!(
                        " on {}: the agent there could not sandbox them, so any task on it can read the files and processes of the others. Keep secrets and private data off it.",
                        open.join(", ")
                    )}
                </p>
            }
        })
    }
}

#[component]
fn Cluster() -> impl IntoView {
    let tick = live::ticker(Duration::from_secs(3));
    let nodes = Resource::new(
        move || tick.get(),
        |_| api::get::<Vec<NodeInfo>>(paths::nodes()),
    );
    view! {
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
        <section class="card">
            <h1>"Cluster"</h1>
            <p class="muted">"Each square is a GPU, shaded by how busy it is (measured utilization), with the share of its memory held by tasks below. Updated every 3 s."</p>
            {move || match nodes.get() {
                None => view! { <p class="muted">"Loading…"</p> }.into_any(),
                Some(Err(e)) => view! { <p class="banner error" role="alert">{e.message}</p> }.into_any(),
                Some(Ok(list)) if list.is_empty() => view! { <p class="muted">"No nodes have joined yet."</p> }.into_any(),
                Some(Ok(list)) => {
                    let (total, busy) = list.iter().flat_map(|n| n.gpus.iter()).fold((0, 0), |(t, b), g| (t + 1, b + usize::from(!g.tasks.is_empty())));
                    let shown = list.clone();
                    view! {
                        <IsolationNotice nodes=Signal::derive(move || shown.clone())/>
                        <p data-testid="cluster-summary"><strong>{busy}</strong>" of "<strong>{total}</strong>" GPUs in use on "{list.len()}" nodes."</p>
                        <div class="heatmap" data-testid="heatmap">
                            {list.into_iter().map(|n| view! {
                                <div class="node-row" data-node=n.id.clone()>
                                    <div class="node-name">
                                        <strong>{n.id.clone()}</strong>
                                        <span class="muted small">{n.zone.clone()}{(!n.schedulable).then_some(" · cordoned")}</span>
                                        {(n.isolation == "none" && !n.trusted_only).then(|| view! { <span class="badge warn">"not isolated"</span> })}
                                    </div>
                                    <div class="gpu-cells">
                                        {n.gpus.into_iter().map(|g| {
                                            let share = if g.memory == 0 { 0.0 } else { g.allocated_memory as f64 / g.memory as f64 };
                                            let util = g.utilization;
                                            let title = format!("{} GPU {} · {}: {} busy · {} of {} memory allocated{}", n.id, g.index, g.gpu_type,
                                                util.map_or_else(|| "no recent sample".to_owned(), |u| format!("{:.0}%", u * 100.0)),
                                                bytes(g.allocated_memory), bytes(g.memory),
                                                if g.tasks.is_empty() { String::new() } else { format!(" · tasks: {}", g.tasks.join(", ")) });
                                            view! {
                                                <div class="gpu-cell" style=heat(util.unwrap_or(0.0)) title=title data-testid="gpu-cell" data-tasks=g.tasks.len()
                                                    data-util=util.map(|u| format!("{u:.2}"))>
                                                    <span class="gpu-index">{g.index}</span>
                                                    <span class="gpu-type">{g.gpu_type.clone()}</span>
                                                    <span class="gpu-share" data-testid="gpu-util">{util.map_or_else(|| "—".to_owned(), |u| format!("{:.0}% busy", u * 100.0))}</span>
                                                    <span class="small">{format!("mem {:.0}%", share * 100.0)}</span>
                                                    <span class="gpu-tasks">
                                                        {g.tasks.iter().zip(g.task_numbers.iter().map(Some).chain(std::iter::repeat(None))).map(|(t, number)| {
                                                            // A task's number is what its owner knows it by.
                                                            let short = number.map_or_else(|| t.get(..8).unwrap_or(t).to_string(), |n| format!("#{n}"));
                                                            // Another organization's task has no page here.
                                                            if g.other_org_tasks.contains(t) {
                                                                view! { <span class="foreign" title="another organization's task" data-testid="foreign-task">{short}</span> }.into_any()
                                                            } else {
                                                                view! { <a href=format!("/tasks/{t}")>{short}</a> }.into_any()
                                                            }
                                                        }).collect_view()}
                                                    </span>
                                                </div>
                                            }
                                        }).collect_view()}
                                    </div>
                                </div>
                            }).collect_view()}
                        </div>
                    }.into_any()
                }
            }}
        </section>
        </Transition>
    }
}
