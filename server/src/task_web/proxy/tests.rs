use super::*;
use actix_web::test::TestRequest;

#[test]
fn only_local_paths_follow_the_trade() {
    assert_eq!(local_path(Some("/lab?x=1")), "/lab?x=1");
    for bad in [
        None,
        Some("https://evil.example"),
        Some("//evil.example"),
        Some("/\\evil"),
        Some("lab"),
    ] {
        assert_eq!(local_path(bad), "/", "{bad:?}");
    }
}

#[test]
fn platform_credentials_never_reach_the_app() {
    let req = TestRequest::get()
        .uri("/lab")
        .insert_header((header::HOST, "8888-t.apps.localhost"))
        .insert_header((
            header::COOKIE,
            "autodl_session=s; _xsrf=abc; autodl_app=p; autodl_csrf=c; theme=dark",
        ))
        .insert_header((header::AUTHORIZATION, "Bearer adl_secret"))
        .insert_header(("x-forwarded-for", "10.0.0.1"))
        .insert_header((header::CONNECTION, "keep-alive, x-private"))
        .insert_header(("x-private", "1"))
        .to_http_request();
    let out = to_app(&req, false, |t| t.starts_with("adl_"));
    let get = |n: &str| {
        out.iter()
            .filter(|(k, _)| k.as_str() == n)
            .map(|(_, v)| v.to_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(get("cookie"), vec!["_xsrf=abc; theme=dark"]);
    assert!(get("authorization").is_empty());
    assert!(get("x-forwarded-for").is_empty());
    assert!(get("x-private").is_empty());
    assert!(get("connection").is_empty());
    assert_eq!(get("host"), vec!["8888-t.apps.localhost"]);
    // The app's own credentials go through.
    let req = TestRequest::get()
        .insert_header((header::AUTHORIZATION, "token jupyter-token"))
        .to_http_request();
    let out = to_app(&req, false, |t| t.starts_with("adl_"));
    assert!(out
        .iter()
        .any(|(k, v)| k == header::AUTHORIZATION && v == "token jupyter-token"));
}

/// However the header is spelled, a cookie the platform reads as its own (and the platform's
/// bearer credential, in any case of `Bearer`) is taken out; the app's own pass through as sent.
#[test]
fn tricky_headers_never_carry_platform_credentials_to_the_app() {
    let cookies_sent = |header: &str| {
        let req = TestRequest::get()
            .insert_header((header::COOKIE, header))
            .to_http_request();
        to_app(&req, false, |_| false)
            .into_iter()
            .filter(|(k, _)| k == header::COOKIE)
            .map(|(_, v)| v.to_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    for (sent, kept) in [
        ("autodl_session = s;theme=dark", vec!["theme=dark"]),
        ("autodl%5Fsession=s; a=1", vec!["a=1"]),
        (";; autodl_csrf=c ;;autodl_app=p;", vec![]),
        ("autodl_session=\"s\"; b=\"x;y\"", vec!["b=\"x; y\""]),
        (
            "autodl_sessionx=1; xautodl_session=2",
            vec!["autodl_sessionx=1; xautodl_session=2"],
        ),
        ("flag; autodl_session=s", vec!["flag"]),
    ] {
        assert_eq!(cookies_sent(sent), kept, "{sent:?}");
    }
    for auth in [
        "bearer adl_secret",
        "BEARER adl_secret",
        "Bearer   adl_secret  ",
    ] {
        let req = TestRequest::get()
            .insert_header((header::AUTHORIZATION, auth))
            .to_http_request();
        let out = to_app(&req, false, |t| t == "adl_secret");
        assert!(
            out.iter().all(|(k, _)| k != header::AUTHORIZATION),
            "{auth:?} reached the app"
        );
    }
}

#[test]
fn the_apps_cookies_stay_on_its_host() {
    let mut h = hyper::HeaderMap::new();
    for c in [
        "_xsrf=1; Domain=apps.localhost; Path=/",
        "autodl_app=forged; Path=/",
        "autodl_session=forged; Domain=localhost",
    ] {
        h.append(hyper::header::SET_COOKIE, c.parse().unwrap());
    }
    h.append(hyper::header::CONNECTION, "close".parse().unwrap());
    h.append(hyper::header::CONTENT_TYPE, "text/html".parse().unwrap());
    let out = from_app_headers(&h);
    let cookies: Vec<_> = out
        .iter()
        .filter(|(k, _)| k == header::SET_COOKIE)
        .map(|(_, v)| v.to_str().unwrap())
        .collect();
    assert_eq!(cookies, vec!["_xsrf=1; Path=/"]);
    assert!(out.iter().all(|(k, _)| k != header::CONNECTION));
    assert!(out.iter().any(|(k, _)| k == header::CONTENT_TYPE));
}

#[test]
fn other_sites_may_link_but_not_act() {
    let req = |site: Option<&str>, mode: &str, post: bool| {
        let mut r = if post {
            TestRequest::post()
        } else {
            TestRequest::get()
        };
        if let Some(s) = site {
            r = r.insert_header(("sec-fetch-site", s));
        }
        r.insert_header(("sec-fetch-mode", mode)).to_http_request()
    };
    assert!(!cross_origin(&req(None, "cors", true)));
    assert!(!cross_origin(&req(Some("same-origin"), "cors", true)));
    assert!(!cross_origin(&req(Some("same-site"), "navigate", false)));
    assert!(cross_origin(&req(Some("same-site"), "cors", false)));
    assert!(cross_origin(&req(Some("cross-site"), "navigate", true)));
    assert!(cross_origin(&req(Some("same-site"), "websocket", false)));
}
