//! autodl server: REST API, web app host and (in later parts) the scheduler runner.

pub mod agents;
pub mod auth;
pub mod config;
pub mod demo;
pub mod domain;
pub mod error;
pub mod json;
pub mod metrics;
pub mod routes;
pub mod security_headers;
pub mod startup;
pub mod state;
pub mod storage;
pub mod store;
pub mod tasks;
pub mod telemetry;
pub mod web_app;
