//! Wire types of the autodl REST API.
//!
//! They live in their own crate so the server, the Leptos web app (compiled to wasm) and the
//! agent agree on one definition: a renamed field breaks the build instead of a user's page.

pub mod agent;
pub mod api;
#[cfg(feature = "bundle")]
pub mod bundle;
pub mod metrics;
pub mod tasks;
#[cfg(feature = "units")]
pub mod units;
pub mod uri;

/// Each enum's text (`as_str`, `parse`, database columns, query strings) is the text serde
/// writes on the wire, variant by variant.
#[cfg(test)]
mod names_agree {
    use strum::VariantArray;

    fn agree<T>()
    where
        T: VariantArray + serde::Serialize + Copy + Into<&'static str> + std::str::FromStr,
        T: PartialEq + std::fmt::Debug,
    {
        for v in T::VARIANTS {
            let text: &'static str = (*v).into();
            assert_eq!(serde_json::to_value(v).unwrap(), text, "{v:?}");
            assert_eq!(text.parse::<T>().ok(), Some(*v), "{v:?}");
        }
    }

    #[test]
    fn serde_and_text_names_are_the_same() {
        agree::<crate::tasks::TaskState>();
        agree::<crate::tasks::TaskKind>();
        agree::<crate::tasks::Launcher>();
        agree::<crate::api::Role>();
        agree::<crate::agent::Stream>();
        agree::<crate::agent::ExitReason>();
        assert_eq!(crate::tasks::TaskState::TimedOut.as_str(), "timed_out");
        assert_eq!(crate::tasks::TaskState::parse("Running"), None);
    }
}
