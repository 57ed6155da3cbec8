use autodl_common::api::Me;
use leptos::prelude::*;
use leptos_meta::{provide_meta_context, MetaTags, Title};
use leptos_router::components::{Route, Router, Routes, A};
use leptos_router::path;

use crate::api;
use crate::pages::{
    account::AccountPage, admin::AdminPage, auth::LoginPage, auth::SignupPage,
    cluster::ClusterPage, home::HomePage, org::OrgPage, submit::SubmitPage, tasks::TaskPage,
    tasks::TasksPage,
};

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

/// Who is signed in, fetched once hydrated and refetched after sign-in or sign-out.
#[derive(Clone, Copy)]
pub struct Session(pub LocalResource<Option<Me>>);

impl Session {
    pub fn me(&self) -> Option<Me> {
        self.0.get().flatten()
    }
    pub fn loaded(&self) -> bool {
        self.0.get().is_some()
    }
    pub fn refresh(&self) {
        self.0.refetch();
    }
}

pub fn use_session() -> Session {
    expect_context::<Session>()
}

#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    let session = Session(LocalResource::new(|| async {
        api::get::<Me>("/api/v1/me").await.ok()
    }));
    provide_context(session);

    view! {
        <Title text="autodl"/>
        <Router>
            <Nav/>
            <main class="container">
                <Routes fallback=|| view! { <section class="card"><h1>"Page not found"</h1><p><A href="/">"Back home"</A></p></section> }>
                    <Route path=path!("/") view=HomePage/>
                    <Route path=path!("/signup") view=SignupPage/>
                    <Route path=path!("/login") view=LoginPage/>
                    <Route path=path!("/account") view=AccountPage/>
                    <Route path=path!("/organization") view=OrgPage/>
                    <Route path=path!("/admin") view=AdminPage/>
                    <Route path=path!("/tasks") view=TasksPage/>
                    <Route path=path!("/tasks/:id") view=TaskPage/>
                    <Route path=path!("/submit") view=SubmitPage/>
                    <Route path=path!("/cluster") view=ClusterPage/>
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
        let _ = api::post_empty("/api/v1/auth/logout").await;
    });
    Effect::new(move |_| {
        if logout.version().get() > 0 {
            session.refresh();
            navigate("/login", Default::default());
        }
    });
    view! {
        <header class="topbar">
            <nav class="container nav">
                <a class="brand" href="/">"autodl"</a>
                <div class="nav-links">
                    {move || match session.me() {
                        Some(me) => view! {
                            <a href="/tasks" data-testid="nav-tasks">"Tasks"</a>
                            <a href="/submit" data-testid="nav-submit">"Submit"</a>
                            <a href="/cluster" data-testid="nav-cluster">"Cluster"</a>
                            <a href="/account">"Account"</a>
                            <a href="/organization">"Organization"</a>
                            {me.platform_admin.then(|| view! { <a href="/admin">"Admin"</a> })}
                            <span class="muted nav-user" data-testid="nav-user">{me.email.clone()}</span>
                            <button class="link-button" on:click=move |_| { logout.dispatch(()); }>"Sign out"</button>
                        }.into_any(),
                        None => view! {
                            <a href="/login">"Sign in"</a>
                            <a class="button small" href="/signup">"Create account"</a>
                        }.into_any(),
                    }}
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
                bind:value=value
            />
            <p class="field-error" id=err_id2 role="alert">{move || error.get()}</p>
        </div>
    }
}

/// Shows a page's body only to signed-in users; others get a link to sign in.
#[component]
pub fn RequireLogin(children: ChildrenFn) -> impl IntoView {
    let session = use_session();
    let children = StoredValue::new(children);
    view! {
        {move || {
            if !session.loaded() {
                view! { <p class="muted">"Loading…"</p> }.into_any()
            } else if session.me().is_some() {
                children.read_value()().into_any()
            } else {
                view! {
                    <section class="card">
                        <h1>"Please sign in"</h1>
                        <p>"This page needs an account. " <a href="/login">"Sign in"</a> " or " <a href="/signup">"create one"</a> "."</p>
                    </section>
                }.into_any()
            }
        }}
    }
}

/// The error of the last attempt that is not about a form field, for a banner.
pub fn general_error(err: Option<api::ApiErr>, fields: &[&str]) -> Option<String> {
    err.filter(|e| e.field.as_deref().is_none_or(|f| !fields.contains(&f)))
        .map(|e| e.message)
}
