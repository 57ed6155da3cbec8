//! Rows as the store keeps them, with states and kinds as types (parsed when read), one file
//! per aggregate. Times are Unix milliseconds.

pub use autodl_common::api::SessionPolicy;

use serde::de::DeserializeOwned;

mod accounts;
mod artifacts;
mod audit;
mod leadership;
mod nodes;
mod notifications;
mod sso;
mod tasks;
mod usage;

pub use accounts::*;
pub use artifacts::*;
pub use audit::*;
pub use leadership::*;
pub use nodes::*;
pub use notifications::*;
pub use sso::*;
pub use tasks::*;
pub use usage::*;

/// A TEXT column that holds JSON (a task's spec, a run's placement), decoded as its row is
/// read: a value the server cannot read fails that read, naming the column, once, instead of
/// each caller decoding it again with a policy of its own. It reads as the value it holds.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JsonText<T>(pub T);

impl<T: DeserializeOwned> TryFrom<String> for JsonText<T> {
    type Error = serde_json::Error;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        serde_json::from_str(&s).map(JsonText)
    }
}

/// A nullable column: NULL is `None`.
impl<T: DeserializeOwned> TryFrom<Option<String>> for JsonText<Option<T>> {
    type Error = serde_json::Error;

    fn try_from(s: Option<String>) -> Result<Self, Self::Error> {
        s.map(|s| serde_json::from_str(&s))
            .transpose()
            .map(JsonText)
    }
}

impl<T: serde::Serialize> JsonText<T> {
    /// The text to store (`None` for a `None` held in a nullable column is the caller's).
    pub fn text(&self) -> String {
        // Values the server holds are plain data; encoding them cannot fail.
        serde_json::to_string(&self.0).unwrap_or_default()
    }
}

impl<T> std::ops::Deref for JsonText<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> std::ops::DerefMut for JsonText<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}
