pub mod account;
pub mod admin;
pub mod auth;
pub mod home;
pub mod org;
pub mod quota;
