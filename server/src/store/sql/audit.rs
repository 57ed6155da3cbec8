//! The SQL of [`AuditTrail`], for both backends.

use super::*;

const AUDIT_COLS: &str =
    "seq, at, tenant_id, actor_id, actor_email, action, target, detail, ip, prev_hash, hash";

macro_rules! impl_audit {
    ($store:ty) => {
        #[async_trait]
        impl AuditTrail for $store {
            async fn append_audit(&self, r: &NewAuditRecord, at: i64) -> StoreResult<AuditRecord> {
                let mut tx = self.pool.begin_with(Self::BEGIN_WRITE).await?;
                // A write first: it takes the head's lock (SQLite's write lock, PostgreSQL's row
                // lock) before anything is read, so appends queue instead of forking the chain.
                let (seq, prev): (i64, String) = sqlx::query_as(
                    "UPDATE audit_head SET seq = seq + 1 WHERE id = 1 RETURNING seq, hash",
                )
                .fetch_one(&mut *tx)
                .await?;
                let hash = crate::audit::chain::link(&prev, seq, at, r);
                sqlx::query(
                    "INSERT INTO audit_log (seq, at, tenant_id, actor_id, actor_email, action, target, detail, ip, prev_hash, hash)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                )
                .bind(seq)
                .bind(at)
                .bind(&r.tenant_id)
                .bind(&r.actor_id)
                .bind(&r.actor_email)
                .bind(&r.action)
                .bind(&r.target)
                .bind(&r.detail)
                .bind(&r.ip)
                .bind(&prev)
                .bind(&hash)
                .execute(&mut *tx)
                .await?;
                sqlx::query("UPDATE audit_head SET hash = $1 WHERE id = 1")
                    .bind(&hash)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(AuditRecord::from_new(r.clone(), seq, at, prev, hash))
            }

            async fn audit_records(
                &self,
                f: &AuditFilter,
                limit: i64,
            ) -> StoreResult<Vec<AuditRecord>> {
                let (exact, prefix) = match &f.action {
                    Some(a) if a.ends_with('.') => (None, Some(a)),
                    a => (a.as_ref(), None),
                };
                Ok(sqlx::query_as(&format!(
                    "SELECT {AUDIT_COLS} FROM audit_log
                     WHERE ($1 IS NULL OR tenant_id = $1) AND ($2 IS NULL OR actor_email = $2)
                       AND ($3 IS NULL OR action = $3)
                       AND ($4 IS NULL OR substr(action, 1, length($4)) = $4)
                       AND ($5 IS NULL OR at >= $5) AND ($6 IS NULL OR at < $6)
                       AND ($7 IS NULL OR seq < $7)
                     ORDER BY seq DESC LIMIT $8"
                ))
                .bind(&f.tenant_id)
                .bind(&f.actor_email)
                .bind(exact)
                .bind(prefix)
                .bind(f.since)
                .bind(f.until)
                .bind(f.before)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?)
            }

            async fn audit_chain(&self, after: i64, limit: i64) -> StoreResult<Vec<AuditRecord>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {AUDIT_COLS} FROM audit_log WHERE seq > $1 ORDER BY seq LIMIT $2"
                ))
                .bind(after)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?)
            }

            async fn audit_head(&self) -> StoreResult<(i64, String)> {
                Ok(sqlx::query_as("SELECT seq, hash FROM audit_head WHERE id = 1")
                    .fetch_one(&self.pool)
                    .await?)
            }
        }
    };
}

impl_audit!(SqliteStore);
impl_audit!(PostgresStore);
