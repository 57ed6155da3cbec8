//! Backups of the embedded database, and putting one back.
//!
//! SQLite is copied online with `VACUUM INTO` (one consistent snapshot while the server runs).
//! PostgreSQL has its own tools (`pg_dump -Fc`, `pg_restore`; see docs/operations.md), which
//! know its locks, roles and versions better than a copy by this server could. Object storage
//! (checkpoints, results, code) is not in the database and is left as it is.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};
use sqlx::Row;

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

fn sqlite_file(url: &str) -> Result<PathBuf, BackupError> {
    if !url.starts_with("sqlite:") {
        return Err(BackupError::Refused(
            "this database is PostgreSQL: back it up with `pg_dump -Fc \"$AUTODL_DATABASE_URL\" > FILE` \
             and put it back with `pg_restore --clean --if-exists -d \"$AUTODL_DATABASE_URL\" FILE` \
             (docs/operations.md)"
                .into(),
        ));
    }
    Ok(SqliteConnectOptions::from_str(url)?
        .get_filename()
        .to_path_buf())
}

/// Copies the database named by `url` to `to` (which must not exist) while it may be in use.
pub async fn backup(url: &str, to: &Path) -> Result<u64, BackupError> {
    let from = sqlite_file(url)?;
    if !from.exists() {
        return Err(BackupError::Refused(format!(
            "there is no database at {}",
            from.display()
        )));
    }
    if to.exists() {
        return Err(BackupError::Refused(format!(
            "{} exists already; name a new file",
            to.display()
        )));
    }
    let pool = SqlitePool::connect_with(
        SqliteConnectOptions::new()
            .filename(&from)
            .busy_timeout(std::time::Duration::from_secs(30)),
    )
    .await?;
    sqlx::query("VACUUM INTO $1")
        .bind(to.to_string_lossy().into_owned())
        .execute(&pool)
        .await?;
    pool.close().await;
    restrict(to);
    Ok(std::fs::metadata(to)?.len())
}

/// Puts the backup `from` in place of the database named by `url`. The server must be
/// stopped. The backup is checked first (readable, intact, made by this release or an
/// earlier one: the next start brings its schema forward); the database it replaces is kept
/// beside it (`<file>.before-restore-<ms>`), so nothing is lost by restoring the wrong file.
/// Returns where the replaced database was kept.
pub async fn restore(url: &str, from: &Path, now_ms: i64) -> Result<Option<PathBuf>, BackupError> {
    let target = sqlite_file(url)?;
    check_backup(from).await?;
    let dir = target
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    // Copied beside the database first (removed if anything below fails), then renamed over
    // it whole.
    let mut tmp = tempfile::Builder::new()
        .prefix(".restore-")
        .suffix(".tmp")
        .tempfile_in(dir)?;
    std::io::copy(&mut std::fs::File::open(from)?, tmp.as_file_mut())?;
    tmp.as_file().sync_all()?;
    restrict(tmp.path());
    let mut kept = None;
    if target.exists() {
        // What the old database's write-ahead log holds goes into its file before it moves.
        let pool = SqlitePool::connect_with(SqliteConnectOptions::new().filename(&target)).await?;
        sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(&pool)
            .await?;
        pool.close().await;
        let aside = PathBuf::from(format!("{}.before-restore-{now_ms}", target.display()));
        std::fs::rename(&target, &aside)?;
        kept = Some(aside);
    }
    for suffix in ["-wal", "-shm"] {
        let side = PathBuf::from(format!("{}{suffix}", target.display()));
        if side.exists() {
            std::fs::remove_file(side)?;
        }
    }
    tmp.persist(&target).map_err(|e| e.error)?;
    Ok(kept)
}

async fn check_backup(from: &Path) -> Result<(), BackupError> {
    if !from.is_file() {
        return Err(BackupError::Refused(format!(
            "{} is not a file",
            from.display()
        )));
    }
    let pool = SqlitePool::connect_with(SqliteConnectOptions::new().filename(from).read_only(true))
        .await
        .map_err(|e| BackupError::Refused(format!("{} is not a database: {e}", from.display())))?;
    let intact: String = sqlx::query("PRAGMA integrity_check")
        .fetch_one(&pool)
        .await
        .map_err(|e| BackupError::Refused(format!("{} is not a database: {e}", from.display())))?
        .get(0);
    if intact != "ok" {
        return Err(BackupError::Refused(format!(
            "{} is damaged: {intact}",
            from.display()
        )));
    }
    let version: Option<i64> =
        sqlx::query("SELECT MAX(version) FROM _sqlx_migrations WHERE success")
            .fetch_one(&pool)
            .await
            .map_err(|_| {
                BackupError::Refused(format!("{} is not an autodl database", from.display()))
            })?
            .get(0);
    pool.close().await;
    let known = sqlx::migrate!("../migrations/sqlite")
        .migrations
        .iter()
        .map(|m| m.version)
        .max()
        .unwrap_or(0);
    match version {
        None => Err(BackupError::Refused(format!(
            "{} is not an autodl database",
            from.display()
        ))),
        Some(v) if v > known => Err(BackupError::Refused(format!(
            "{} was made by a newer release (schema {v}; this one knows {known}): restore it with that release",
            from.display()
        ))),
        Some(_) => Ok(()),
    }
}

/// A backup holds every secret digest: only the server's user may read it.
fn restrict(p: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Err(e) = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)) {
        tracing::warn!(path = %p.display(), error = %e, "could not make the backup private");
    }
}
