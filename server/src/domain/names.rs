//! The names people give things (GPU types, nodes, environment variables, labels, metrics,
//! idempotency keys) and the addresses they type (emails, sign-in providers' issuers), each
//! rule written once: as the pattern the API's contract publishes
//! (`routes::contract`) and the parsers check, so the two can never disagree.

use std::sync::LazyLock;

use regex::Regex;

/// A GPU type ("A100", "A100-40G", "H200-141G").
pub const GPU_TYPE: &str = r"^[A-Za-z0-9._-]{1,64}$";
/// A node's id.
pub const NODE_ID: &str = r"^[A-Za-z0-9._-]{1,128}$";
/// An environment variable a task sets.
pub const ENV_NAME: &str = r"^[A-Za-z_][A-Za-z0-9_]{0,255}$";
/// A label's name.
pub const LABEL_KEY: &str = r"^[A-Za-z0-9_./-]{1,63}$";
/// A training metric a task reports.
pub const METRIC_NAME: &str = r"^[A-Za-z0-9_./-]{1,64}$";
/// An `Idempotency-Key` header: 1 to 128 printable ASCII characters, no blank at either end.
pub const IDEMPOTENCY_KEY: &str = r"^[\x21-\x7e]([\x20-\x7e]{0,126}[\x21-\x7e])?$";

/// The addresses accounts use: a plain dot-atom local part of at most 64 characters (one to
/// four parts) and a host name with a TLD. Every address it allows is one the account rules
/// take (`domain::account::Email`, checked by a property test).
pub const EMAIL: &str = r"^([A-Za-z0-9_%+-]{1,64}|[A-Za-z0-9_%+-]{1,31}\.[A-Za-z0-9_%+-]{1,32}|[A-Za-z0-9_%+-]{1,20}\.[A-Za-z0-9_%+-]{1,20}\.[A-Za-z0-9_%+-]{1,22}|[A-Za-z0-9_%+-]{1,15}\.[A-Za-z0-9_%+-]{1,15}\.[A-Za-z0-9_%+-]{1,15}\.[A-Za-z0-9_%+-]{1,16})@[A-Za-z0-9]{1,20}(-[A-Za-z0-9]{1,10}){0,3}(\.[A-Za-z0-9]{1,20}(-[A-Za-z0-9]{1,10}){0,3}){0,3}\.[A-Za-z]{2,12}$";
/// An OpenID issuer: an http(s) URL without query or fragment. The host is an IPv4 address or
/// names whose last label starts with a letter: URL parsers read a host ending in a number as an
/// IPv4 address (`r.2` is refused), and a label with `--` may be punycode that does not decode.
pub const ISSUER: &str = r"^https?://((25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])){3}|([A-Za-z0-9]{1,63}(-[A-Za-z0-9]{1,63})*\.){0,8}[A-Za-z][A-Za-z0-9]{0,62}(-[A-Za-z0-9]{1,63})*)(:([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?(/[A-Za-z0-9._~-]+)*/?$";

macro_rules! checks {
    ($($(#[$doc:meta])* $check:ident => $pattern:ident),* $(,)?) => {
        $(
            $(#[$doc])*
            pub fn $check(name: &str) -> bool {
                static RULE: LazyLock<Regex> =
                    LazyLock::new(|| Regex::new($pattern).expect("a valid pattern"));
                RULE.is_match(name)
            }
        )*
    };
}

checks! {
    /// Whether `name` is a GPU type name ([`GPU_TYPE`]).
    is_gpu_type => GPU_TYPE,
    /// Whether `name` is a node id ([`NODE_ID`]).
    is_node_id => NODE_ID,
    /// Whether `name` is an environment variable's name ([`ENV_NAME`]).
    is_env_name => ENV_NAME,
    /// Whether `name` is a label's name ([`LABEL_KEY`]).
    is_label_key => LABEL_KEY,
    /// Whether `name` is a metric's name ([`METRIC_NAME`]).
    is_metric_name => METRIC_NAME,
    /// Whether `name` is an idempotency key ([`IDEMPOTENCY_KEY`]).
    is_idempotency_key => IDEMPOTENCY_KEY,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_as_the_contract_says() {
        assert!(is_gpu_type("A100-40G") && !is_gpu_type(" A100") && !is_gpu_type(""));
        assert!(!is_gpu_type(&"x".repeat(65)));
        assert!(is_node_id("gpu-01.lab") && !is_node_id("a/b"));
        assert!(is_env_name("_X1") && !is_env_name("1X") && !is_env_name(&"X".repeat(257)));
        assert!(is_label_key("team/vision") && !is_label_key("a b"));
        assert!(is_metric_name("val/loss") && !is_metric_name("loss!"));
        assert!(is_idempotency_key("retry-1 of 2"));
        for bad in ["", " k", "k ", "k\u{7f}", "ключ"] {
            assert!(!is_idempotency_key(bad), "{bad:?}");
        }
        assert!(!is_idempotency_key(&"k".repeat(129)) && is_idempotency_key(&"k".repeat(128)));
    }
}
