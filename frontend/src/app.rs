use autodl_common::api::Me;
use leptos::prelude::*;
use leptos_meta::{provide_meta_context, MetaTags, Title};
use leptos_router::components::{Redirect, Route, Router, Routes, A};
use leptos_router::{path, SsrMode};

use crate::api;
use crate::pages::{
    account::AccountPage, admin::AdminPage, auth::LoginPage, auth::SignupConfirmPage,
    auth::SignupPage, cluster::ClusterPage, home::HomePage, org::OrgPage, submit::SubmitPage,
    task_view::TaskPage, tasks::TasksPage,
};
use crate::paths;

/// The HTML document around the app, rendered on the server only.
pub fn shell(options: LeptosOptions) -> impl IntoView {
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8"/>
                <meta name="viewport" content="width=device-width, initial-scale=1"/>
                <link rel="stylesheet" href="/pkg/autodl.css"/>
                <HydrationScripts options/>
                <MetaTags/>
            </head>
            <body>
                <App/>
            </body>
        </html>
    }
}

/// Who is signed in: resolved on the server from the request's cookie, handed to hydration
/// with the page, and refetched after sign-in or sign-out.
#[derive(Clone, Copy)]
pub struct Session(pub Resource<Option<Me>>);

impl Session {
    pub fn me(&self) -> Option<Me> {
        self.0.get().flatten()
    }
    pub fn refresh(&self) {
        self.0.refetch();
    }
    /// Forgets the caller at once (after signing out), rather than showing them until a
    /// refetch answers.
    pub fn clear(&self) {
        self.0.set(Some(None));
    }
}

pub fn use_session() -> Session {
    expect_context::<Session>()
}

#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    let session = Session(Resource::new(
        || (),
        |_| async { api::get::<Me>(paths::me()).await.ok() },
    ));
    provide_context(session);
    crate::time::provide_zone();

    view! {
        <Title text="autodl"/>
        <Router>
            // The router would treat the fragment as a navigation; focus moves by hand (and
            // the plain link still works before hydration).
            <a class="skip-link" href="#main" on:click=|ev| { ev.prevent_default(); crate::live::focus("main"); }>"Skip to content"</a>
            <Nav/>
            <main class="container" id="main" tabindex="-1">
                <Routes fallback=NotFound>
                    <Route path=path!("/") view=HomePage ssr=SsrMode::Async/>
                    <Route path=path!("/signup") view=SignupPage ssr=SsrMode::Async/>
                    <Route path=path!("/signup/confirm") view=SignupConfirmPage/>
                    <Route path=path!("/login") view=LoginPage ssr=SsrMode::Async/>
                    <Route path=path!("/account") view=AccountPage ssr=SsrMode::Async/>
                    <Route path=path!("/organization") view=OrgPage ssr=SsrMode::Async/>
                    <Route path=path!("/admin") view=AdminPage ssr=SsrMode::Async/>
                    <Route path=path!("/audit") view=crate::pages::audit::AuditPage ssr=SsrMode::Async/>
                    <Route path=path!("/usage") view=crate::pages::usage::UsagePage ssr=SsrMode::Async/>
                    <Route path=path!("/tasks") view=TasksPage ssr=SsrMode::Async/>
                    <Route path=path!("/tasks/:id") view=TaskPage ssr=SsrMode::Async/>
                    <Route path=path!("/submit") view=SubmitPage ssr=SsrMode::Async/>
                    <Route path=path!("/sweeps") view=crate::pages::sweeps::SweepsPage ssr=SsrMode::Async/>
                    <Route path=path!("/sweeps/:id") view=crate::pages::sweeps::SweepPage ssr=SsrMode::Async/>
                    <Route path=path!("/compare") view=crate::pages::compare::ComparePage ssr=SsrMode::Async/>
                    <Route path=path!("/cluster") view=ClusterPage ssr=SsrMode::Async/>
                </Routes>
            </main>
        </Router>
    }
}

#[component]
fn Nav() -> impl IntoView {
    let session = use_session();
    let navigate = leptos_router::hooks::use_navigate();
    let logout = Action::new_local(move |_: &()| async move {
        let _ = api::post_empty(paths::logout()).await;
    });
    Effect::new(move |_| {
        if logout.version().get() > 0 {
            session.clear();
            navigate("/login", Default::default());
        }
    });
    view! {
        <header class="topbar">
            <nav class="container nav">
                <a class="brand" href="/">"autodl"</a>
                <div class="nav-links">
                    <Transition>
                    {move || match session.me() {
                        Some(me) => view! {
                            <a href="/tasks" data-testid="nav-tasks">"Tasks"</a>
                            <a href="/submit" data-testid="nav-submit">"Submit"</a>
                            <a href="/sweeps" data-testid="nav-sweeps">"Sweeps"</a>
                            <a href="/cluster" data-testid="nav-cluster">"Cluster"</a>
                            <a href="/usage" data-testid="nav-usage">"Usage"</a>
                            <a href="/account">"Account"</a>
                            <a href="/organization">"Organization"</a>
                            {(me.platform_admin || me.role.can_manage()).then(|| view! { <a href="/audit" data-testid="nav-audit">"Audit"</a> })}
                            {me.platform_admin.then(|| view! { <a href="/admin">"Admin"</a> })}
                            <span class="muted nav-user" data-testid="nav-user">{me.email.clone()}</span>
                            <button class="link-button" on:click=move |_| { logout.dispatch(()); }>"Sign out"</button>
                        }.into_any(),
                        None => view! {
                            <a href="/login">"Sign in"</a>
                            <a class="button small" href="/signup">"Create account"</a>
                        }.into_any(),
                    }}
                    </Transition>
                </div>
            </nav>
        </header>
    }
}

/// A labelled input bound to a signal, with its error shown beneath it.
#[component]
pub fn Field(
    #[prop(into)] label: String,
    #[prop(into)] id: String,
    #[prop(into, default = "text".to_string())] kind: String,
    value: RwSignal<String>,
    #[prop(into)] error: Signal<Option<String>>,
    #[prop(into, optional)] autocomplete: Option<String>,
    #[prop(into, optional)] placeholder: Option<String>,
) -> impl IntoView {
    let err_id = format!("{id}-error");
    let kind_is_password = kind == "password";
    let err_id2 = err_id.clone();
    view! {
        <div class="field" class:has-error=move || error.get().is_some()>
            <label for=id.clone()>{label}</label>
            <input
                id=id.clone()
                name=id
                type=kind
                autocomplete=autocomplete
                placeholder=placeholder
                aria-describedby=err_id.clone()
                aria-invalid=move || error.get().is_some().to_string()
                // The attribute too, so the value is in the server's HTML before hydration
                // (never a password's).
                value=move || if kind_is_password { String::new() } else { value.get() }
                bind:value=value
            />
            <p class="field-error" id=err_id2 role="alert">{move || error.get()}</p>
        </div>
    }
}

/// Shows a page's body only to signed-in users; others get a link to sign in that brings
/// them back here.
///
/// The body is built once the session is known (a `Suspend`, not a re-run closure): pages
/// create their resources as they are built, and a boundary that rebuilt them on every
/// resolution would fetch forever while rendering on the server.
#[component]
pub fn RequireLogin(children: ChildrenFn) -> impl IntoView {
    let session = use_session();
    let children = StoredValue::new(children);
    let location = leptos_router::hooks::use_location();
    let here = move || {
        let (path, query) = (location.pathname.get(), location.search.get());
        if query.is_empty() {
            path
        } else {
            format!("{path}?{query}")
        }
    };
    view! {
        <Suspense fallback=|| view! { <p class="muted">"Loading…"</p> }>
        {move || Suspend::new(async move {
            if session.0.await.is_some() {
                children.read_value()().into_any()
            } else {
                let login = format!("/login?next={}", crate::pages::tasks::encode(&here()));
                view! {
                    <section class="card">
                        <h1>"Please sign in"</h1>
                        <p>"This page needs an account. " <a href=login data-testid="sign-in-link">"Sign in"</a> " or " <a href="/signup">"create one"</a> "."</p>
                    </section>
                }.into_any()
            }
        })}
        </Suspense>
    }
}

/// Sign-in and sign-up are for people who are not signed in: a signed-in visitor is sent on
/// to where the sign-in would have taken them, by the server (a redirect, so the form never
/// shows, with or without JavaScript) or, after a client-side sign-in, by the router.
#[component]
pub fn SignedOutOnly(children: ChildrenFn) -> impl IntoView {
    let session = use_session();
    let query = leptos_router::hooks::use_query_map();
    let children = StoredValue::new(children);
    view! {
        <Suspense fallback=|| view! { <p class="muted">"Loading…"</p> }>
        {move || Suspend::new(async move {
            if session.0.await.is_some() {
                let to = after_sign_in(query.read_untracked().get("next"));
                view! {
                    <Redirect path=to.clone()/>
                    <p class="muted">"You are signed in. " <a href=to>"Continue"</a></p>
                }
                .into_any()
            } else {
                children.read_value()().into_any()
            }
        })}
        </Suspense>
    }
}

/// Where to go after signing in: the `next` the sign-in link carried, if it is a path on
/// this site (never another origin), else the dashboard.
pub fn after_sign_in(next: Option<String>) -> String {
    next.filter(|n| {
        // Browsers drop tabs and newlines from URLs and read `\` as `/`: "/\t/evil" would
        // leave the site.
        n.starts_with('/')
            && !n.starts_with("//")
            && !n.contains('\\')
            && !n.chars().any(|c| c.is_control() || c.is_whitespace())
    })
    .unwrap_or_else(|| "/".into())
}

/// The error of the last attempt that is not about a form field, for a banner.
pub fn general_error(err: Option<api::ApiErr>, fields: &[&str]) -> Option<String> {
    err.filter(|e| e.field.as_deref().is_none_or(|f| !fields.contains(&f)))
        .map(|e| e.message)
}

#[cfg(test)]
mod tests {
    use super::after_sign_in;

    #[test]
    fn sign_in_returns_only_to_this_site() {
        for ok in ["/tasks?state=pending", "/tasks/0190-ab", "/"] {
            assert_eq!(after_sign_in(Some(ok.into())), ok);
        }
        for bad in [
            "//evil.example/x",
            "/\\evil.example",
            "/\t/evil.example",
            "/\n/evil.example",
            "https://evil.example",
            "javascript:alert(1)",
            "",
        ] {
            assert_eq!(after_sign_in(Some(bad.into())), "/", "{bad:?}");
        }
        assert_eq!(after_sign_in(None), "/");
    }
}

/// A path the app does not know: the usual layout, and a 404 status when rendered on the server.
#[component]
fn NotFound() -> impl IntoView {
    #[cfg(not(feature = "hydrate"))]
    if let Some(crate::api::PageStatus(set)) = use_context::<crate::api::PageStatus>() {
        set(404);
    }
    view! { <section class="card"><h1>"Page not found"</h1><p><A href="/">"Back home"</A></p></section> }
}
