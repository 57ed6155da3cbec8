use autodl_common::api::{
    InvitationPreview, LoginRequest, LoginResponse, SignupRequest, SsoOption,
};
use leptos::prelude::*;
use leptos_router::hooks::{use_navigate, use_query_map};

use crate::api::{self, ApiErr};
use crate::fields::{general_error, Field};
use crate::paths;
use crate::session::{after_sign_in, use_session, SignedOutOnly};

fn field_err(result: RwSignal<Option<ApiErr>>, field: &'static str) -> Signal<Option<String>> {
    Signal::derive(move || result.get().and_then(|e| e.for_field(field)))
}

/// Checks done in the browser before sending, so obvious mistakes show at once.
fn check_email(email: &str) -> Option<ApiErr> {
    let e = email.trim();
    let ok = e.len() <= 254
        && e.split_once('@')
            .is_some_and(|(l, d)| !l.is_empty() && d.contains('.'));
    (!ok).then(|| ApiErr {
        status: 400,
        code: "validation".into(),
        message: "enter a valid email address".into(),
        field: Some("email".into()),
    })
}

#[component]
pub fn SignupPage() -> impl IntoView {
    // An invitation is for whoever holds the link, signed in or not.
    let invited = use_query_map()
        .read_untracked()
        .get("invitation")
        .is_some_and(|t| !t.is_empty());
    if invited {
        view! { <Signup/> }.into_any()
    } else {
        view! { <SignedOutOnly><Signup/></SignedOutOnly> }.into_any()
    }
}

/// The page a sign-up confirmation link opens: it finishes the sign-up and signs in.
#[component]
pub fn SignupConfirmPage() -> impl IntoView {
    let query = use_query_map();
    let session = use_session();
    let navigate = use_navigate();
    let error = RwSignal::new(None::<String>);
    let confirm = Action::new_local(move |token: &String| {
        let body = autodl_common::api::SignupConfirmRequest {
            token: token.clone(),
        };
        async move { api::post::<_, LoginResponse>(paths::signup_confirm(), &body).await }
    });
    Effect::new(move |_| {
        if let Some(t) = query
            .read_untracked()
            .get("token")
            .filter(|t| !t.is_empty())
        {
            confirm.dispatch(t);
        } else {
            error.set(Some(
                "this link has no token: open the link from the email".into(),
            ));
        }
    });
    Effect::new(move |_| match confirm.value().get() {
        Some(Ok(_)) => {
            session.refresh();
            navigate("/tasks", Default::default());
        }
        Some(Err(e)) => error.set(Some(e.message)),
        None => {}
    });
    view! {
        <section class="card narrow">
            <h1>"Finishing your sign-up"</h1>
            {move || match error.get() {
                Some(e) => view! { <p class="banner error" role="alert" data-testid="signup-confirm-error">{e}</p> }.into_any(),
                None => view! { <p class="muted">"One moment…"</p> }.into_any(),
            }}
            <p class="muted"><a href="/signup">"Sign up again"</a>" · "<a href="/login">"Sign in"</a></p>
        </section>
    }
}

#[component]
fn Signup() -> impl IntoView {
    let query = use_query_map();
    let next = move || query.read_untracked().get("next");
    let invitation = move || query.read().get("invitation").filter(|t| !t.is_empty());
    let preview = Resource::new(invitation, |token| async move {
        match token {
            Some(t) => Some(api::get::<InvitationPreview>(paths::invitation_preview(&t)).await),
            None => None,
        }
    });

    let email = RwSignal::new(String::new());
    let password = RwSignal::new(String::new());
    let tenant_name = RwSignal::new(String::new());
    let error = RwSignal::new(None::<ApiErr>);
    let session = use_session();
    let navigate = use_navigate();

    Effect::new(move |_| {
        if let Some(Some(Ok(p))) = preview.get() {
            email.set(p.email.clone());
        }
    });

    let submit = Action::new_local(move |req: &SignupRequest| {
        let req = req.clone();
        async move { api::post::<_, serde_json::Value>(paths::signup(), &req).await }
    });
    // Where the server sends email, a sign-up is finished from the link it sends.
    let pending = RwSignal::new(None::<String>);
    Effect::new(move |_| match submit.value().get() {
        Some(Ok(v)) if v["status"] == "confirm_email" => {
            pending.set(v["message"].as_str().map(str::to_owned));
        }
        Some(Ok(_)) => {
            session.refresh();
            navigate(&after_sign_in(next()), Default::default());
        }
        Some(Err(e)) => error.set(Some(e)),
        None => {}
    });

    let on_submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        if let Some(e) = check_email(&email.get_untracked()) {
            error.set(Some(e));
            return;
        }
        if password.get_untracked().chars().count() < 10 {
            error.set(Some(ApiErr {
                status: 400,
                code: "validation".into(),
                message: "password must be at least 10 characters".into(),
                field: Some("password".into()),
            }));
            return;
        }
        error.set(None);
        let inv = invitation();
        submit.dispatch(SignupRequest {
            email: email.get_untracked(),
            password: password.get_untracked(),
            tenant_name: inv.is_none().then(|| tenant_name.get_untracked()),
            invitation: inv,
        });
    };

    view! {
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
        <section class="card narrow">
            <h1>"Create your account"</h1>
            {move || match preview.get() {
                Some(Some(Ok(p))) => view! {
                    <p class="notice">"You are invited to join " <strong>{p.tenant_name}</strong> " as " {p.role.as_str()} "."</p>
                }.into_any(),
                Some(Some(Err(e))) => view! { <p class="banner error">{e.message}</p> }.into_any(),
                _ => ().into_any(),
            }}
            {move || pending.get().map(|m| view! { <p class="banner ok" role="status" data-testid="signup-pending">{m}</p> })}
            <form method="post" on:submit=on_submit novalidate>
                <Field label="Email" id="email" kind="email" value=email error=field_err(error, "email") autocomplete="email"/>
                <Field label="Password" id="password" kind="password" value=password error=field_err(error, "password")
                    autocomplete="new-password" placeholder="at least 10 characters, letters and digits"/>
                <Show when=move || invitation().is_none()>
                    <Field label="Organization" id="tenant_name" value=tenant_name error=field_err(error, "tenant_name")
                        placeholder="e.g. Vision Lab"/>
                </Show>
                <p class="banner error" role="alert">{move || general_error(error.get(), &["email", "password", "tenant_name"])}</p>
                <button type="submit" disabled=move || submit.pending().get()>
                    {move || if submit.pending().get() { "Creating…" } else { "Create account" }}
                </button>
            </form>
            <p class="muted">"Already have an account? " <a href="/login">"Sign in"</a></p>
        </section>
        </Transition>
    }
}

#[component]
pub fn LoginPage() -> impl IntoView {
    view! { <SignedOutOnly><Login/></SignedOutOnly> }
}

#[component]
fn Login() -> impl IntoView {
    let query = use_query_map();
    let next = move || query.read_untracked().get("next");
    let email = RwSignal::new(String::new());
    let password = RwSignal::new(String::new());
    let error = RwSignal::new(None::<ApiErr>);
    let session = use_session();
    let navigate = use_navigate();
    // Single sign-on: the providers' buttons (the platform's, and an organization's once the
    // email typed is of a domain its provider names), and why the last round trip was refused.
    let domain = Memo::new(move |_| {
        email
            .get()
            .trim()
            .rsplit_once('@')
            .map(|(_, d)| d.to_ascii_lowercase())
            .filter(|d| d.contains('.'))
    });
    let providers = Resource::new(
        move || domain.get(),
        |domain| async move {
            let path = match domain {
                Some(d) => format!(
                    "{}?email={}",
                    paths::sso_providers(),
                    paths::encode(&format!("someone@{d}"))
                ),
                None => paths::sso_providers(),
            };
            api::get::<Vec<SsoOption>>(&path).await
        },
    );
    let sso_error = move || query.read().get("sso_error").filter(|e| !e.is_empty());
    let submit = Action::new_local(move |req: &LoginRequest| {
        let req = req.clone();
        async move { api::post::<_, LoginResponse>(paths::login(), &req).await }
    });
    Effect::new(move |_| match submit.value().get() {
        Some(Ok(_)) => {
            session.refresh();
            navigate(&after_sign_in(next()), Default::default());
        }
        Some(Err(e)) => error.set(Some(e)),
        None => {}
    });
    let on_submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        if let Some(e) = check_email(&email.get_untracked()) {
            error.set(Some(e));
            return;
        }
        error.set(None);
        submit.dispatch(LoginRequest {
            email: email.get_untracked(),
            password: password.get_untracked(),
        });
    };

    let start = move |id: &str| {
        format!(
            "{}?return_to={}",
            paths::sso_start(id),
            paths::encode(&after_sign_in(next()))
        )
    };
    view! {
        <section class="card narrow">
            <h1>"Sign in"</h1>
            {move || sso_error().map(|e| view! { <p class="banner error" role="alert" data-testid="sso-error">{e}</p> })}
            <Transition fallback=|| ()>
                {move || providers.get().and_then(Result::ok).filter(|l| !l.is_empty()).map(|list| view! {
                    <div class="sso-options">
                        {list.into_iter().map(|p| view! {
                            // A full page load: the server sends the browser on to the provider.
                            <a class="button sso" rel="external" href=start(&p.id)>"Sign in with " {p.label}</a>
                        }).collect_view()}
                        <p class="muted or">"or with your password"</p>
                    </div>
                })}
            </Transition>
            <form method="post" on:submit=on_submit novalidate>
                <Field label="Email" id="email" kind="email" value=email error=field_err(error, "email") autocomplete="email"/>
                <Field label="Password" id="password" kind="password" value=password error=field_err(error, "password")
                    autocomplete="current-password"/>
                <p class="banner error" role="alert">{move || general_error(error.get(), &["email", "password"])}</p>
                <button type="submit" disabled=move || submit.pending().get()>"Sign in"</button>
            </form>
            <p class="muted">"New here? " <a href="/signup">"Create an account"</a></p>
        </section>
    }
}
