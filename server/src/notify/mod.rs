//! Telling people what happened without them watching a page: organizations' webhooks.

pub mod webhooks;
