//! Rows as the store keeps them, with states and kinds as types (parsed when read), one file
//! per aggregate. Times are Unix milliseconds.

pub use autodl_common::api::SessionPolicy;

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
