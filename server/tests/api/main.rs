//! API tests against a real server, each on SQLite and on PostgreSQL.

mod helpers;

mod accounts;
mod admin_cli;
mod api_keys;
mod tasks;
mod tenancy;
