//! `Cookie` request headers read piece by piece as actix-web reads them for the platform
//! itself (`HttpRequest::cookie`: split at `;`, each piece parsed by the `cookie` crate with
//! percent-decoding). Whatever passes a request on with some cookies taken out (a task's app
//! behind the proxy, the pages' own calls to the API) uses this, so a piece the platform would
//! read as one of its cookies is always recognised as one, however it is spelled.

use actix_web::cookie::Cookie;

/// The non-empty pieces of one `Cookie` header value, as they were sent.
pub fn pieces(header: &str) -> impl Iterator<Item = &str> {
    header.split(';').map(str::trim).filter(|c| !c.is_empty())
}

/// The name the platform would read `piece` under; `None` for a piece it cannot read at all
/// (which it therefore never takes for one of its own).
pub fn name_of(piece: &str) -> Option<String> {
    Cookie::parse_encoded(piece)
        .ok()
        .map(|c| c.name().to_owned())
}

/// Whether `piece` is read by the platform as one of the cookies named.
pub fn is_one_of(piece: &str, names: &[&str]) -> bool {
    name_of(piece).is_some_and(|n| names.contains(&n.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_named_as_the_platform_reads_them() {
        let names = ["autodl_session"];
        for ours in [
            "autodl_session=x",
            " autodl_session = x ",
            "autodl%5Fsession=x",
            "autodl_session=",
            "autodl_session=\"quoted\"",
            "autodl_session=a=b",
        ] {
            assert!(is_one_of(ours, &names), "{ours:?}");
        }
        for theirs in [
            "autodl_sessionx=1",
            "xautodl_session=1",
            "autodl_session",
            "=x",
            "theme=dark",
        ] {
            assert!(!is_one_of(theirs, &names), "{theirs:?}");
        }
        let header = "a=1;; b=2 ;autodl_session=s";
        assert_eq!(
            pieces(header).collect::<Vec<_>>(),
            ["a=1", "b=2", "autodl_session=s"]
        );
    }
}
