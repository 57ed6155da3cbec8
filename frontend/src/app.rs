use autodl_common::api::Me;
use leptos::prelude::*;
use leptos_meta::{provide_meta_context, MetaTags, Title};
use leptos_router::components::{Route, Router, Routes, A};
use leptos_router::{path, SsrMode};

use crate::api;
use crate::pages::{
    account::AccountPage, admin::AdminPage, auth::LoginPage, auth::SignupConfirmPage,
    auth::SignupPage, cluster::ClusterPage, home::HomePage, org::OrgPage, submit::SubmitPage,
    task_view::TaskPage, tasks::TasksPage,
};
use crate::paths;
use crate::session::{use_session, Session};

/// The tab's icon: a chip, as an SVG data URL.
const FAVICON: &str = "data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 16 16'%3E%3Crect x='3' y='3' width='10' height='10' rx='2' fill='%232563eb'/%3E%3Cpath d='M6 1v2M10 1v2M6 13v2M10 13v2M1 6h2M1 10h2M13 6h2M13 10h2' stroke='%232563eb'/%3E%3C/svg%3E";

/// The HTML document around the app, rendered on the server only.
pub fn shell(options: LeptosOptions) -> impl IntoView {
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8"/>
                <meta name="viewport" content="width=device-width, initial-scale=1"/>
                <link rel="stylesheet" href="/pkg/autodl.css"/>
                // The icon travels inside the page: no request for /favicon.ico to answer 404.
                <link rel="icon" href=FAVICON/>
                <HydrationScripts options/>
                <MetaTags/>
            </head>
            <body>
                <App/>
            </body>
        </html>
    }
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

/// A path the app does not know: the usual layout, and a 404 status when rendered on the server.
#[component]
fn NotFound() -> impl IntoView {
    #[cfg(not(feature = "hydrate"))]
    if let Some(crate::api::PageStatus(set)) = use_context::<crate::api::PageStatus>() {
        set(404);
    }
    view! { <section class="card"><h1>"Page not found"</h1><p><A href="/">"Back home"</A></p></section> }
}
