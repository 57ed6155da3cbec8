//! The audit trail (`/audit`): who did what, when and from where. An organization's owners
//! and admins see their organization's, platform administrators everyone's. The filters are
//! the page's query, so a filtered view is a link, works without scripts, and the export links
//! download exactly what is shown (and older records beyond it).

use autodl_common::api::AuditPage as Page;
use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

use super::tasks::encode;
use crate::api;
use crate::paths;
use crate::session::{use_session, RequireLogin};
use crate::time::Time;

/// The query keys the page passes on to the API.
const FILTERS: [&str; 5] = ["action", "actor", "since", "until", "tenant"];

/// Action families offered in the filter; any action name also works typed into the URL.
const FAMILIES: [(&str, &str); 8] = [
    ("", "All actions"),
    ("auth.", "Sign-ins and accounts"),
    ("api_key.", "API keys"),
    ("member.", "Members and roles"),
    ("tenant.", "Organization settings and quotas"),
    ("node.", "Nodes"),
    ("task.", "Tasks (shells, ports, cancels)"),
    ("webhook.", "Webhooks"),
];

#[component]
pub fn AuditPage() -> impl IntoView {
    view! { <RequireLogin><Audit/></RequireLogin> }
}

/// `key=value&…` of the filters that are set, encoded.
fn filter_query(get: impl Fn(&str) -> Option<String>) -> String {
    let set: Vec<(&str, String)> = FILTERS
        .iter()
        .filter_map(|k| {
            get(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
                .map(|v| (*k, v))
        })
        .collect();
    crate::paths::query(set.iter().map(|(k, v)| (*k, v.as_str())))
}

#[component]
fn Audit() -> impl IntoView {
    let session = use_session();
    let query = use_query_map();
    let filters = Memo::new(move |_| query.with(|q| filter_query(|k| q.get(k))));
    let before = Memo::new(move |_| query.with(|q| q.get("before")));
    let page = Resource::new(
        move || (filters.get(), before.get()),
        |(f, before)| async move {
            let mut path = format!("{}?limit=100&{f}", paths::audit());
            if let Some(b) = before.filter(|b| !b.is_empty()) {
                path.push_str(&format!("&before={}", encode(&b)));
            }
            api::get::<Page>(&path).await
        },
    );
    let value = move |k: &'static str| query.with(|q| q.get(k).unwrap_or_default());
    let platform = move || session.me().is_some_and(|m| m.platform_admin);
    let export = move |format: &str| {
        format!(
            "{}?format={format}&limit=100000&{}",
            paths::audit(),
            filters.get()
        )
    };
    view! {
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
        <section class="card">
            <h1>"Audit trail"</h1>
            <p class="muted">"Sign-ins, keys, roles, quotas, nodes, shells into tasks and other security- and money-relevant actions, with who did them and from where. Each record carries the hash of the one before it: "<code>"autodl-server audit verify"</code>" finds one that was changed or removed."</p>
            <form method="get" action="/audit" class="filters" data-testid="audit-filters">
                <div class="field">
                    <label for="audit-action">"Action"</label>
                    <select id="audit-action" name="action" data-testid="audit-action">
                        {FAMILIES.iter().map(|(v, label)| {
                            let selected = value("action") == *v;
                            view! { <option value=*v selected=selected>{*label}</option> }
                        }).collect_view()}
                    </select>
                </div>
                <div class="field">
                    <label for="audit-actor">"By (email)"</label>
                    <input id="audit-actor" type="email" name="actor" value=value("actor") data-testid="audit-actor"/>
                </div>
                <div class="field">
                    <label for="audit-since">"From"</label>
                    <input id="audit-since" type="date" name="since" value=value("since")/>
                </div>
                <div class="field">
                    <label for="audit-until">"Before"</label>
                    <input id="audit-until" type="date" name="until" value=value("until")/>
                </div>
                {move || platform().then(|| view! {
                    <div class="field">
                        <label for="audit-tenant">"Organization id"</label>
                        <input id="audit-tenant" name="tenant" value=value("tenant")/>
                    </div>
                })}
                <button type="submit" data-testid="audit-filter">"Filter"</button>
            </form>
            <p class="actions">
                <a class="button secondary small" href=move || export("csv") download="autodl-audit.csv" data-testid="audit-csv">"Export CSV"</a>
                " "
                <a class="button secondary small" href=move || export("json") download="autodl-audit.json" data-testid="audit-json">"Export JSON"</a>
            </p>
        </section>
        <section class="card">
            {move || match page.get() {
                None => view! { <p class="muted">"Loading…"</p> }.into_any(),
                Some(Err(e)) => view! { <p class="banner error" role="alert">{e.message}</p> }.into_any(),
                Some(Ok(p)) if p.records.is_empty() => view! { <p class="muted" data-testid="audit-empty">"No records match."</p> }.into_any(),
                Some(Ok(p)) => {
                    let older = p.next_before.map(|b| {
                        let f = filters.get();
                        format!("/audit?before={b}{}{f}", if f.is_empty() { "" } else { "&" })
                    });
                    view! {
                        <table class="table" data-testid="audit">
                            <thead><tr><th>"#"</th><th>"When"</th><th>"Who"</th><th>"Action"</th><th>"On"</th><th>"Details"</th><th>"From"</th></tr></thead>
                            <tbody>
                                {p.records.into_iter().map(|r| view! {
                                    <tr title=format!("hash {}", r.hash)>
                                        <td data-label="#">{r.seq}</td>
                                        <td data-label="When"><Time at=r.at.clone() seconds=true/></td>
                                        <td data-label="Who">{r.actor_email.clone().unwrap_or_else(|| "—".into())}</td>
                                        <td data-label="Action"><span class="badge">{r.action.clone()}</span></td>
                                        <td data-label="On">{r.target.clone()}</td>
                                        <td data-label="Details"><code class="small">{r.detail.to_string()}</code></td>
                                        <td data-label="From">{r.ip.clone().unwrap_or_default()}</td>
                                    </tr>
                                }).collect_view()}
                            </tbody>
                        </table>
                        {older.map(|href| view! { <p><a href=href data-testid="audit-older">"Older records"</a></p> })}
                    }.into_any()
                }
            }}
        </section>
        </Transition>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_set_filters_are_passed_on_encoded() {
        let q = filter_query(|k| match k {
            "action" => Some("auth.".into()),
            "actor" => Some(" a+b@example.com ".into()),
            "since" => Some(String::new()),
            _ => None,
        });
        assert_eq!(q, "action=auth.&actor=a%2Bb%40example.com");
    }
}
