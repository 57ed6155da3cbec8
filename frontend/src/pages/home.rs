use leptos::prelude::*;

use crate::app::use_session;

#[component]
pub fn HomePage() -> impl IntoView {
    let session = use_session();
    view! {
        <section class="hero">
            <h1>"Train on shared GPUs, fairly."</h1>
            <p class="lead">
                "autodl runs your containerized training tasks on your organization's GPUs: fair-share scheduling, "
                "GPU-memory packing, checkpoint-based preemption and quotas, with live charts and logs."
            </p>
            {move || match session.me() {
                Some(me) => view! {
                    <p>"Signed in as " <strong>{me.email}</strong> " in " <strong>{me.tenant_name}</strong> ". "
                       <a href="/account">"Manage your account and API keys"</a> "."</p>
                }.into_any(),
                None => view! {
                    <p class="actions">
                        <a class="button" href="/signup">"Create an account"</a>
                        <a class="button secondary" href="/login">"Sign in"</a>
                    </p>
                }.into_any(),
            }}
        </section>
    }
}
