//! `autodl-server serve` runs the platform; `autodl-server admin ...` manages accounts from the
//! shell (the first platform administrator, forgotten passwords).

use std::path::PathBuf;

use anyhow::Context;
use autodl_server::auth::{password, secrets::new_id};
use autodl_server::clock::{Clock, SystemClock};
use autodl_server::config::Settings;
use autodl_server::domain::{parse_name, Email, Password};
use autodl_server::startup::Application;
use autodl_server::store::{self, TenantRecord, UserRecord};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "autodl-server",
    version,
    about = "autodl GPU training platform server"
)]
struct Cli {
    /// TOML configuration file (also AUTODL_CONFIG); AUTODL_* variables override it.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the API and the web app.
    Serve {
        /// Also run three agents on simulated GPUs (4xA100-40G, and 2xA40 twice) in this process.
        #[arg(long, env = "AUTODL_DEMO")]
        demo: bool,
    },
    /// Copy the SQLite database to FILE while the server may run (PostgreSQL: pg_dump).
    Backup { file: PathBuf },
    /// Put a backup in place of the SQLite database; stop the server first. The database it
    /// replaces is kept beside it.
    Restore { file: PathBuf },
    /// The audit trail.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// Account administration from the shell.
    Admin {
        #[command(subcommand)]
        command: AdminCommand,
    },
}

#[derive(Subcommand)]
enum AuditCommand {
    /// Checks every record's hash and link from the first to the head; exits 1 when one was
    /// changed, removed or cut off. Prints the head's hash: keep it elsewhere to catch a
    /// rewrite of the whole trail later.
    Verify,
}

#[derive(Subcommand)]
enum AdminCommand {
    /// Create a platform administrator (and their organization if it does not exist yet).
    CreateAdmin {
        #[arg(long)]
        email: String,
        /// Password; read from AUTODL_ADMIN_PASSWORD when not given.
        #[arg(long, env = "AUTODL_ADMIN_PASSWORD", hide_env_values = true)]
        password: String,
        #[arg(long, default_value = "Operators")]
        tenant: String,
    },
    /// Make an existing account a platform administrator, or with --revoke no longer one. It
    /// applies from the account's next request.
    MakeAdmin {
        #[arg(long)]
        email: String,
        #[arg(long)]
        revoke: bool,
    },
    /// Set a new password for an account and end its sessions.
    ResetPassword {
        #[arg(long)]
        email: String,
        #[arg(long, env = "AUTODL_NEW_PASSWORD", hide_env_values = true)]
        password: String,
    },
}

/// Stack for threads that render pages. A page's view is one deeply nested type, and an
/// unoptimized build renders the larger pages in frames that outgrow the 2 MiB default.
const THREAD_STACK: &str = "16777216";

fn main() -> anyhow::Result<()> {
    // The demo's agents show tasks this program as their nvidia-smi (simulated GPUs).
    #[cfg(feature = "demo")]
    autodl_agent::gpu::smi::run_if_called();
    // Read by std when a thread is spawned without a stack size (the HTTP workers are), so
    // set before any thread starts; an operator's own setting wins.
    if std::env::var_os("RUST_MIN_STACK").is_none() {
        std::env::set_var("RUST_MIN_STACK", THREAD_STACK);
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

/// The demo's agents on simulated GPUs, in this process.
#[cfg(feature = "demo")]
async fn start_demo(
    app: &Application,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    let dir = std::path::PathBuf::from(
        std::env::var("AUTODL_DEMO_DIR").unwrap_or_else(|_| "data/demo-agents".into()),
    );
    autodl_server::demo::start_agents(&app.state, &dir, shutdown).await?;
    Ok(())
}

#[cfg(not(feature = "demo"))]
async fn start_demo(
    _app: &Application,
    _shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    anyhow::bail!("this server was built without the demo (build it with the `demo` feature)")
}

async fn run() -> anyhow::Result<()> {
    autodl_server::telemetry::init();
    let cli = Cli::parse();
    let settings = Settings::load(cli.config).context("reading configuration")?;
    match cli.command {
        Command::Serve { demo } => {
            let app = Application::build(settings.clone()).await?;
            tracing::info!(
                "autodl listening on http://{}:{} (store: {})",
                settings.listen.ip(),
                app.port(),
                app.state.store.backend()
            );
            let shutdown = tokio_util::sync::CancellationToken::new();
            if demo {
                start_demo(&app, shutdown.clone()).await?;
            }
            app.run_until_stopped().await?;
            shutdown.cancel();
        }
        Command::Backup { file } => {
            let bytes = store::backup::backup(&settings.database_url, &file).await?;
            println!("backed up to {} ({bytes} bytes)", file.display());
        }
        Command::Restore { file } => {
            let kept =
                store::backup::restore(&settings.database_url, &file, SystemClock.now_ms()).await?;
            println!("restored {}", file.display());
            if let Some(k) = kept {
                println!("the database it replaced is kept at {}", k.display());
            }
        }
        Command::Audit {
            command: AuditCommand::Verify,
        } => {
            let store = store::open(&settings.database_url, 2).await?;
            match autodl_server::audit::verify(store.as_ref()).await? {
                Ok(v) => println!(
                    "the audit trail holds: {} records, head {}",
                    v.records,
                    if v.head.is_empty() {
                        "(empty)"
                    } else {
                        &v.head
                    }
                ),
                Err(broken) => {
                    eprintln!("{broken}");
                    std::process::exit(1);
                }
            }
        }
        Command::Admin { command } => admin(settings, command).await?,
    }
    Ok(())
}

async fn admin(settings: Settings, command: AdminCommand) -> anyhow::Result<()> {
    let store = store::open(&settings.database_url, 2).await?;
    let now = SystemClock.now_ms();
    match command {
        AdminCommand::CreateAdmin {
            email,
            password: pw,
            tenant,
        } => {
            let email = Email::parse(&email).map_err(|e| anyhow::anyhow!("{e}"))?;
            let pw = Password::parse(&pw, Some(&email)).map_err(|e| anyhow::anyhow!("{e}"))?;
            let tenant_name =
                parse_name("tenant", &tenant, 64).map_err(|e| anyhow::anyhow!("{e}"))?;
            if let Some(user) = store.user_by_email(email.as_str()).await? {
                store
                    .set_user_flags(&user.id, Some(false), Some(true))
                    .await?;
                println!(
                    "{} already exists; it is now a platform administrator",
                    email.as_str()
                );
                return Ok(());
            }
            let tenant = TenantRecord {
                id: new_id(),
                name: tenant_name,
                created_at: now,
                trusted: false,
                internal: false,
            };
            let user = UserRecord {
                id: new_id(),
                email: email.as_str().to_owned(),
                password_hash: password::hash(pw.into_inner()).await?,
                tenant_id: tenant.id.clone(),
                role: autodl_common::api::Role::Owner,
                platform_admin: true,
                disabled: false,
                created_at: now,
            };
            store.create_tenant_with_owner(&tenant, &user).await?;
            println!(
                "created platform administrator {} in organization {:?}",
                user.email, tenant.name
            );
        }
        AdminCommand::MakeAdmin { email, revoke } => {
            let email = Email::parse(&email).map_err(|e| anyhow::anyhow!("{e}"))?;
            let user = store
                .user_by_email(email.as_str())
                .await?
                .with_context(|| format!("no account with email {}", email.as_str()))?;
            store.set_user_flags(&user.id, None, Some(!revoke)).await?;
            println!(
                "{} is {} a platform administrator",
                email.as_str(),
                if revoke { "no longer" } else { "now" }
            );
        }
        AdminCommand::ResetPassword {
            email,
            password: pw,
        } => {
            let email = Email::parse(&email).map_err(|e| anyhow::anyhow!("{e}"))?;
            let user = store
                .user_by_email(email.as_str())
                .await?
                .with_context(|| format!("no account with email {}", email.as_str()))?;
            let pw = Password::parse(&pw, Some(&email)).map_err(|e| anyhow::anyhow!("{e}"))?;
            store
                .set_password(&user.id, &password::hash(pw.into_inner()).await?)
                .await?;
            store.revoke_user_sessions(&user.id, None).await?;
            println!(
                "password of {} reset; its sessions were ended",
                email.as_str()
            );
        }
    }
    Ok(())
}
