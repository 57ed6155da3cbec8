//! Who is calling: passwords, session tokens, API keys, CSRF and login throttling.

pub mod bearer;
pub mod cache;
pub mod caller;
pub mod cookies;
pub mod password;
pub mod rate_limit;
pub mod secrets;
pub mod session;
pub mod sso;

pub use caller::{Caller, CallerVia, LiveCaller};
