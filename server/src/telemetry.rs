use tracing_subscriber::{fmt, EnvFilter};

/// Logs go to stderr, filtered by `RUST_LOG` (default `info`). Safe to call twice (tests).
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
