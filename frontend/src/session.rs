//! Who is signed in, and the page wrappers that depend on it: bodies for signed-in users
//! only, sign-in pages for signed-out visitors only, and where a sign-in returns to.

use autodl_common::api::Me;
use leptos::prelude::*;
use leptos_router::components::Redirect;

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
                let login = format!("/login?next={}", crate::paths::encode(&here()));
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
