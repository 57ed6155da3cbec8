//! Parts of URLs built by the web app and the agent: one path segment or one query value,
//! percent-encoded so that any text (a task id, a file name, a label) stays that one part.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// Everything but RFC 3986's unreserved characters (letters, digits, `-`, `_`, `.`, `~`).
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// Percent-encodes `s` as one path segment or query value.
pub fn encode_component(s: &str) -> String {
    utf8_percent_encode(s, COMPONENT).to_string()
}

/// A query string (without the `?`) from pairs, in the order given.
pub fn query<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_part_whatever_the_text() {
        assert_eq!(encode_component("a/b c?d#é~x"), "a%2Fb%20c%3Fd%23%C3%A9~x");
        assert_eq!(encode_component("3f2a-11_.x"), "3f2a-11_.x");
        assert_eq!(
            query([("label", "team=a&b"), ("state", "running")]),
            "label=team%3Da%26b&state=running"
        );
    }
}
