//! The token of an `Authorization: Bearer <token>` header, read one way for every caller
//! (users, API keys, agents, task tokens, metrics scrapers, a task app's own clients).

use actix_web::http::header::{HeaderMap, AUTHORIZATION};

/// What an `Authorization` header says, as far as bearer tokens go.
#[derive(Debug, PartialEq, Eq)]
pub enum Bearer<'a> {
    /// No `Authorization` header.
    Absent,
    /// A header that is not a bearer token (another scheme, no token, not text).
    Malformed,
    Token(&'a str),
}

/// Reads the bearer token. The scheme's name is matched without regard to case (RFC 9110
/// §11.1: `bearer`, `BEARER` and `Bearer` are one scheme), and the spaces around the token
/// are not part of it.
pub fn bearer(headers: &HeaderMap) -> Bearer<'_> {
    let Some(value) = headers.get(AUTHORIZATION) else {
        return Bearer::Absent;
    };
    value
        .to_str()
        .ok()
        .and_then(token_of)
        .map_or(Bearer::Malformed, Bearer::Token)
}

/// The token of one `Authorization` value, if it is a bearer token.
pub fn token_of(value: &str) -> Option<&str> {
    value
        .trim_start()
        .split_once([' ', '\t'])
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .filter(|t| !t.is_empty())
}

/// The bearer token, if the request carries one.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    match bearer(headers) {
        Bearer::Token(t) => Some(t),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header::HeaderValue;

    fn read(v: &str) -> Bearer<'static> {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        match bearer(&h) {
            Bearer::Token(t) => Bearer::Token(Box::leak(t.to_string().into_boxed_str())),
            Bearer::Absent => Bearer::Absent,
            Bearer::Malformed => Bearer::Malformed,
        }
    }

    #[test]
    fn the_scheme_is_matched_without_regard_to_case() {
        for v in [
            "Bearer adl_x",
            "bearer adl_x",
            "BEARER  adl_x ",
            "bEaReR\tadl_x",
        ] {
            assert_eq!(read(v), Bearer::Token("adl_x"), "{v:?}");
        }
        for v in ["Basic YTpi", "Bearer", "Bearer   ", "Beareradl_x", "adl_x"] {
            assert_eq!(read(v), Bearer::Malformed, "{v:?}");
        }
        assert_eq!(bearer(&HeaderMap::new()), Bearer::Absent);
    }
}
