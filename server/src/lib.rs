//! autodl server: REST API, web app host, the scheduler runner and the agents' side of it.

pub mod agents;
pub mod audit;
pub mod auth;
pub mod clock;
pub mod config;
pub mod demo;
pub mod domain;
pub mod error;
pub mod notify;
pub mod prometheus_metrics;
pub mod replay;
pub mod replicas;
pub mod routes;
pub mod scheduling;
pub mod security_headers;
pub mod site;
pub mod startup;
pub mod state;
pub mod storage;
pub mod store;
pub mod task_web;
pub mod tasks;
pub mod telemetry;
pub mod tunnels;
pub mod usage_series;
pub mod usecases;
