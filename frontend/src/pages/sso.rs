//! Single sign-on settings: an organization's provider (its owners and admins, on the
//! organization page) and the platform's (platform admins, on the admin page).

use std::collections::BTreeMap;

use autodl_common::api::{SsoOption, SsoSettings, SsoSettingsRequest};
use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

use crate::api::{self, ApiErr};
use crate::fields::general_error;
use crate::paths;
use crate::time::Time;

/// "a, b c" → ["a", "b", "c"].
fn words(s: &str) -> Vec<String> {
    s.split([',', ' ', '\n'])
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Lines of `value = role`.
fn role_lines(s: &str) -> BTreeMap<String, String> {
    s.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(v, r)| (v.trim().to_owned(), r.trim().to_owned()))
        .filter(|(v, _)| !v.is_empty())
        .collect()
}

#[component]
fn Text(
    label: &'static str,
    id: &'static str,
    value: RwSignal<String>,
    error: RwSignal<Option<ApiErr>>,
    #[prop(optional)] placeholder: &'static str,
    #[prop(optional)] kind: Option<&'static str>,
) -> impl IntoView {
    let field = id.strip_prefix("sso-").unwrap_or(id).replace('-', "_");
    let err = move || error.get().and_then(|e| e.for_field(&field));
    view! {
        <div class="field">
            <label for=id>{label}</label>
            <input id=id type=kind.unwrap_or("text") placeholder=placeholder data-testid=id autocomplete="off"
                prop:value=value on:input=move |ev| value.set(event_target_value(&ev))/>
            <p class="field-error" role="alert">{err}</p>
        </div>
    }
}

/// The settings form for `path` (`/api/v1/tenant/sso` or `/api/v1/admin/sso`); an
/// organization's also maps claims to roles and can turn passwords off.
#[component]
pub fn SsoSettingsForm(organization: bool) -> impl IntoView {
    let path = StoredValue::new(if organization {
        paths::tenant_sso()
    } else {
        paths::admin_sso()
    });
    let settings = Resource::new(|| (), move |_| api::get::<SsoSettings>(path.get_value()));
    let label = RwSignal::new(String::new());
    let issuer = RwSignal::new(String::new());
    let client_id = RwSignal::new(String::new());
    let client_secret = RwSignal::new(String::new());
    let domains = RwSignal::new(String::new());
    let scopes = RwSignal::new(String::new());
    let role_claim = RwSignal::new(String::new());
    let role_map = RwSignal::new(String::new());
    let default_role = RwSignal::new(String::new());
    let password_login = RwSignal::new(true);
    let error = RwSignal::new(None::<ApiErr>);
    let saved = RwSignal::new(false);
    Effect::new(move |_| {
        if let Some(Ok(s)) = settings.get() {
            password_login.set(s.password_login);
            if let Some(p) = s.provider {
                label.set(p.label);
                issuer.set(p.issuer);
                client_id.set(p.client_id);
                domains.set(p.allowed_domains.join(", "));
                scopes.set(p.scopes.join(" "));
                role_claim.set(p.role_claim.unwrap_or_default());
                role_map.set(
                    p.role_map
                        .iter()
                        .map(|(v, r)| format!("{v} = {r}"))
                        .collect::<Vec<_>>()
                        .join("\n"),
                );
                default_role.set(p.default_role.unwrap_or_default());
            }
        }
    });
    let save = Action::new_local(move |req: &SsoSettingsRequest| {
        let req = req.clone();
        async move { api::put::<_, SsoSettings>(path.get_value(), &req).await }
    });
    Effect::new(move |_| match save.value().get() {
        Some(Ok(_)) => {
            error.set(None);
            saved.set(true);
            client_secret.set(String::new());
            settings.refetch();
        }
        Some(Err(e)) => {
            saved.set(false);
            error.set(Some(e));
        }
        None => {}
    });
    let remove =
        Action::new_local(move |_: &()| async move { api::delete(path.get_value()).await });
    Effect::new(move |_| match remove.value().get() {
        Some(Ok(())) => {
            for s in [
                label,
                issuer,
                client_id,
                domains,
                scopes,
                role_claim,
                role_map,
                default_role,
            ] {
                s.set(String::new());
            }
            saved.set(false);
            settings.refetch();
        }
        Some(Err(e)) => error.set(Some(e)),
        None => {}
    });
    let on_submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        saved.set(false);
        let secret = client_secret.get_untracked();
        let role = default_role.get_untracked();
        let claim = role_claim.get_untracked();
        save.dispatch(SsoSettingsRequest {
            label: label.get_untracked(),
            issuer: issuer.get_untracked(),
            client_id: client_id.get_untracked(),
            client_secret: (!secret.is_empty()).then_some(secret),
            allowed_domains: words(&domains.get_untracked()),
            scopes: words(&scopes.get_untracked()),
            role_claim: (organization && !claim.trim().is_empty()).then_some(claim),
            role_map: if organization {
                role_lines(&role_map.get_untracked())
            } else {
                BTreeMap::new()
            },
            default_role: (organization && !role.is_empty()).then_some(role),
            password_login: organization.then(|| password_login.get_untracked()),
        });
    };
    let configured = move || {
        matches!(
            settings.get(),
            Some(Ok(SsoSettings {
                provider: Some(_),
                ..
            }))
        )
    };
    view! {
        <section class="card" data-testid="sso-settings">
            <h2>"Single sign-on"</h2>
            <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || settings.get().map(|r| match r {
                Err(e) => view! { <p class="banner error">{e.message}</p> }.into_any(),
                Ok(s) => view! {
                    <p class="muted">
                        {if organization {
                            "People of this organization sign in through its OpenID Connect provider (Okta, Entra ID, Keycloak, Google…). "
                        } else {
                            "Anyone the platform's provider admits may sign in; newcomers get an organization of their own. "
                        }}
                        "Register this redirect URI with the provider: " <code data-testid="sso-redirect-uri">{s.redirect_uri.clone()}</code>
                    </p>
                    {s.provider.map(|p| view! {
                        <p class="small muted">"Set up; last changed " <Time at=p.updated_at/> "."</p>
                    })}
                }.into_any(),
            })}
            </Transition>
            <form class="stack" on:submit=on_submit novalidate>
                <Text label="Button label" id="sso-label" value=label error placeholder="e.g. Acme login"/>
                <Text label="Issuer URL" id="sso-issuer" value=issuer error placeholder="https://login.example.com/realms/acme"/>
                <Text label="Client ID" id="sso-client-id" value=client_id error/>
                <Text label="Client secret" id="sso-client-secret" value=client_secret error kind="password"
                    placeholder="kept as it is when left empty"/>
                <Text label="Allowed email domains" id="sso-allowed-domains" value=domains error placeholder="example.com, lab.example.com (empty: any)"/>
                <Text label="Extra scopes" id="sso-scopes" value=scopes error placeholder="e.g. groups"/>
                <Show when=move || organization>
                    <Text label="Role claim" id="sso-role-claim" value=role_claim error placeholder="e.g. groups"/>
                    <div class="field">
                        <label for="sso-role-map">"Claim value → role (one per line: " <code>"value = admin"</code> " or " <code>"member"</code> ")"</label>
                        <textarea id="sso-role-map" data-testid="sso-role-map" rows="3"
                            prop:value=role_map on:input=move |ev| role_map.set(event_target_value(&ev))></textarea>
                        <p class="field-error" role="alert">{move || error.get().and_then(|e| e.for_field("role_map"))}</p>
                    </div>
                    <div class="field">
                        <label for="sso-default-role">"Role of people no value maps"</label>
                        <select id="sso-default-role" data-testid="sso-default-role"
                            prop:value=default_role on:change=move |ev| default_role.set(event_target_value(&ev))>
                            <option value="">"none: refuse them"</option>
                            <option value="member">"member"</option>
                            <option value="admin">"admin"</option>
                        </select>
                    </div>
                    <label class="check">
                        <input type="checkbox" data-testid="sso-password-login"
                            prop:checked=password_login on:change=move |ev| password_login.set(event_target_checked(&ev))/>
                        " Members may also sign in with a password (platform admins always may)"
                    </label>
                </Show>
                <div class="row-actions">
                    <button type="submit" data-testid="sso-save" disabled=move || save.pending().get()>
                        {move || if save.pending().get() { "Checking the provider…" } else { "Save" }}
                    </button>
                    <Show when=configured>
                        <button type="button" class="danger" data-testid="sso-remove" on:click=move |_| {
                            if crate::live::confirm("Remove single sign-on? Passwords work again.") { remove.dispatch(()); }
                        }>"Remove"</button>
                    </Show>
                </div>
            </form>
            <p class="banner error" role="alert">{move || general_error(error.get(), &["label", "issuer", "client_id", "client_secret", "allowed_domains", "scopes", "role_claim", "role_map"])}</p>
            <Show when=move || saved.get()><p class="banner ok" data-testid="sso-saved">"Saved: the provider answered."</p></Show>
        </section>
    }
}

/// On the account page: link this account to a provider (owners and platform admins must do
/// so themselves before they can sign in with it), and why the last attempt failed.
#[component]
pub fn LinkSso() -> impl IntoView {
    let query = use_query_map();
    let providers = Resource::new(
        || (),
        |_| async move { api::get::<Vec<SsoOption>>(paths::sso_providers()).await },
    );
    let failed = move || query.read().get("sso_error").filter(|e| !e.is_empty());
    view! {
        <Transition fallback=|| ()>
            {move || providers.get().and_then(Result::ok).filter(|l| !l.is_empty()).map(|list| view! {
                <section class="card" data-testid="link-sso">
                    <h2>"Single sign-on"</h2>
                    <p class="muted">"Sign in to a provider as yourself to let it sign you in here from now on."</p>
                    {move || failed().map(|e| view! { <p class="banner error" role="alert" data-testid="sso-error">{e}</p> })}
                    <div class="row-actions">
                        {list.into_iter().map(|p| view! {
                            <a class="button secondary" rel="external" data-testid="link-sso-button"
                                href=format!("{}?link=true&return_to=/account", crate::paths::sso_start(&p.id))>
                                "Link " {p.label}
                            </a>
                        }).collect_view()}
                    </div>
                </section>
            })}
        </Transition>
    }
}
