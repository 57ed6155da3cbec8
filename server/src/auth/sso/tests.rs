use super::*;
use autodl_common::api::Role;

#[test]
fn only_local_paths_are_returned_to() {
    assert_eq!(return_path(Some("/tasks?x=1")), "/tasks?x=1");
    for evil in [
        "//evil.test",
        "https://evil.test",
        "/\\evil.test",
        "",
        "tasks",
    ] {
        assert_eq!(return_path(Some(evil)), "/", "{evil}");
    }
    assert_eq!(return_path(None), "/");
}

#[test]
fn internal_literals_are_refused_for_organizations() {
    assert!(check_endpoint("https://169.254.169.254/token", false).is_err());
    assert!(check_endpoint("http://127.0.0.1:8080", false).is_err());
    assert!(check_endpoint("http://127.0.0.1:8080", true).is_ok());
    assert!(check_endpoint("http://idp.example.com", true).is_err());
    assert!(check_endpoint("https://idp.example.com", false).is_ok());
}

#[tokio::test]
async fn every_call_to_an_organizations_provider_is_judged_first() {
    // Discovery names these addresses; the client refuses them before connecting.
    let client = reqwest::Client::new();
    for url in [
        "https://10.1.2.3/jwks",
        "https://[::1]/token",
        "http://idp.example.com/keys",
    ] {
        let req = openidconnect::http::Request::builder()
            .uri(url)
            .body(Vec::new())
            .unwrap();
        let err = fetch(&client, false, req).await.unwrap_err().to_string();
        assert!(
            err.contains("internal") || err.contains("not https"),
            "{url}: {err}"
        );
    }
}

#[test]
fn the_strongest_mapped_role_wins() {
    let p = SsoProviderRecord {
        id: "p".into(),
        scope: SsoScope::Tenant("t".into()),
        label: "x".into(),
        issuer: "https://idp.example.com".into(),
        client_id: "c".into(),
        client_secret: "s".into(),
        allowed_domains: vec!["acme.test".into()],
        scopes: vec![],
        role_claim: Some("groups".into()),
        role_map: [
            ("ml".to_owned(), "member".to_owned()),
            ("ops".to_owned(), "admin".to_owned()),
        ]
        .into(),
        default_role: None,
        created_at: 0,
        updated_at: 0,
    };
    let who = |values: &[&str]| Identity {
        subject: "s".into(),
        email: None,
        email_verified: true,
        role_values: values.iter().map(|v| (*v).to_owned()).collect(),
    };
    assert_eq!(role_for(&p, &who(&["ml", "ops"])), Some(Role::Admin));
    assert_eq!(role_for(&p, &who(&["ml"])), Some(Role::Member));
    assert_eq!(role_for(&p, &who(&["sales"])), None);
    assert!(domain_allowed(&p, "ada@ACME.test"));
    assert!(!domain_allowed(&p, "ada@evil.test"));
}

/// The generator takes the pattern without its anchors (it makes whole strings anyway).
fn issuers() -> impl proptest::strategy::Strategy<Value = String> {
    let pattern = crate::domain::names::ISSUER;
    let unanchored = pattern.trim_start_matches('^').trim_end_matches('$');
    proptest::string::string_regex(unanchored).unwrap()
}

proptest::proptest! {
    /// The document's issuer pattern promises what the parser keeps: any issuer the request
    /// check lets through is read as a URL, never refused as malformed afterwards.
    #[test]
    fn every_issuer_the_document_allows_is_a_url(
        issuer in issuers()
    ) {
        let req = autodl_common::api::SsoSettingsRequest {
            label: "Idp".into(),
            issuer: issuer.clone(),
            client_id: "c".into(),
            client_secret: Some("s".into()),
            allowed_domains: vec![],
            scopes: vec![],
            role_claim: None,
            role_map: Default::default(),
            default_role: None,
            password_login: None,
        };
        let parsed = parse_settings(&req, SsoScope::Platform, None, 0);
        proptest::prop_assert!(parsed.is_ok(), "{issuer:?}: {:?}", parsed.err());
    }
}

#[test]
fn hosts_that_parsers_read_as_numbers_are_outside_the_issuer_pattern() {
    let pattern = regex::Regex::new(crate::domain::names::ISSUER).unwrap();
    for ok in [
        "https://idp.example.com",
        "http://127.0.0.1:8080/realms/a",
        "https://a-b.c1/",
    ] {
        assert!(pattern.is_match(ok), "{ok}");
    }
    for bad in [
        "https://r.2:65532/x",
        "https://a.0x1f",
        "https://256.1.1.1",
        "https://xn--zz.com",
    ] {
        assert!(!pattern.is_match(bad), "{bad}");
    }
}
