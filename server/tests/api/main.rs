//! API tests against a real server, each on SQLite and on PostgreSQL.

mod helpers;

mod accounts;
mod admin_cli;
mod agents;
mod api_keys;
mod apps;
mod audit;
mod backup;
mod code;
mod e2e;
mod elastic;
mod environments;
mod faults;
mod gangs;
mod isolation;
mod layers;
mod leader;
mod notifications;
#[cfg(feature = "demo")]
mod replay;
mod replicas;
mod results_kept;
#[path = "../support/s3_server.rs"]
mod s3_server;
mod scheduling;
mod security;
mod sessions;
mod sso;
mod storage;
mod submissions;
mod sweeps;
mod tasks;
mod tenancy;
mod tunnels;
mod upgrade;
mod usage;
mod webhooks;
