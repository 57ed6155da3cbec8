//! The SQL of [`Nodes`], for both backends.

use super::*;
use crate::domain::NodeStatus;

const REG_TOKEN_COLS: &str =
    "id, name, token_hash, created_by, created_at, expires_at, revoked, max_uses, uses, node_id";

const NODE_COLS: &str =
    "id, zone, labels, cpu_millis, mem_bytes, gpus, schedulable, created_at, updated_at, credential_hash, last_seen, status, \
     runtime, isolation, data_roots, open_to_all, host_detail";

macro_rules! impl_nodes {
    ($store:ty, $db:ty) => {
        #[async_trait]
        impl Nodes for $store {
            async fn upsert_node(&self, n: &NodeRecord) -> StoreResult<()> {
                sqlx::query(
                    "INSERT INTO nodes (id, zone, labels, cpu_millis, mem_bytes, gpus, schedulable, created_at, updated_at, status,
                                        runtime, isolation, data_roots, host_detail)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
                     ON CONFLICT (id) DO UPDATE SET zone = excluded.zone, labels = excluded.labels,
                        cpu_millis = excluded.cpu_millis, mem_bytes = excluded.mem_bytes, gpus = excluded.gpus,
                        schedulable = excluded.schedulable, updated_at = excluded.updated_at,
                        runtime = excluded.runtime, isolation = excluded.isolation, data_roots = excluded.data_roots,
                        host_detail = excluded.host_detail",
                )
                .bind(&n.id)
                .bind(&n.zone)
                .bind(n.labels.text())
                .bind(n.cpu_millis)
                .bind(n.mem_bytes)
                .bind(n.gpus.text())
                .bind(n.schedulable)
                .bind(n.created_at)
                .bind(n.updated_at)
                .bind(n.status.as_str())
                .bind(&n.runtime)
                .bind(&n.isolation)
                .bind(&n.data_roots)
                .bind(&n.host_detail)
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn list_nodes(&self) -> StoreResult<Vec<NodeRecord>> {
                Ok(sqlx::query_as(&format!("SELECT {NODE_COLS} FROM nodes ORDER BY id"))
                .fetch_all(&self.pool)
                .await?)
            }

            async fn node(&self, id: &str) -> StoreResult<Option<NodeRecord>> {
                Ok(sqlx::query_as(&format!("SELECT {NODE_COLS} FROM nodes WHERE id = $1"))
                    .bind(id)
                    .fetch_optional(&self.pool)
                    .await?)
            }

            async fn silent_nodes(&self, before: i64) -> StoreResult<Vec<NodeRecord>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {NODE_COLS} FROM nodes
                     WHERE credential_hash IS NOT NULL AND status <> 'lost' AND last_seen < $1 ORDER BY id"
                ))
                .bind(before)
                .fetch_all(&self.sched)
                .await?)
            }

            async fn delete_node(&self, id: &str) -> StoreResult<bool> {
                let r = sqlx::query("DELETE FROM nodes WHERE id = $1").bind(id).execute(&self.pool).await?;
                Ok(r.rows_affected() == 1)
            }

            async fn set_node_host(&self, id: &str, host: &NodeHost) -> StoreResult<()> {
                sqlx::query("UPDATE nodes SET runtime = $1, isolation = $2, data_roots = $3, host_detail = $4 WHERE id = $5")
                    .bind(&host.runtime)
                    .bind(&host.isolation)
                    .bind(&host.data_roots)
                    .bind(&host.detail)
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn set_node_open_to_all(&self, id: &str, open: bool) -> StoreResult<bool> {
                let r = sqlx::query("UPDATE nodes SET open_to_all = $1 WHERE id = $2")
                    .bind(open)
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                Ok(r.rows_affected() == 1)
            }

            async fn create_registration_token(&self, t: &RegistrationTokenRecord) -> StoreResult<()> {
                sqlx::query(
                    "INSERT INTO registration_tokens (id, name, token_hash, created_by, created_at, expires_at, revoked, max_uses, uses, node_id)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                )
                .bind(&t.id)
                .bind(&t.name)
                .bind(&t.token_hash)
                .bind(&t.created_by)
                .bind(t.created_at)
                .bind(t.expires_at)
                .bind(t.revoked)
                .bind(t.max_uses)
                .bind(t.uses)
                .bind(&t.node_id)
                .execute(&self.pool)
                .await
                .map_err(conflict("token collision; try again"))?;
                Ok(())
            }

            async fn list_registration_tokens(&self) -> StoreResult<Vec<RegistrationTokenRecord>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {REG_TOKEN_COLS} FROM registration_tokens
                     WHERE revoked = FALSE AND uses < max_uses ORDER BY created_at DESC"
                ))
                .fetch_all(&self.pool)
                .await?)
            }

            async fn registration_token_by_hash(&self, hash: &str) -> StoreResult<Option<RegistrationTokenRecord>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {REG_TOKEN_COLS} FROM registration_tokens
                     WHERE token_hash = $1"
                ))
                .bind(hash)
                .fetch_optional(&self.pool)
                .await?)
            }

            async fn use_registration_token(&self, id: &str, node_id: &str, now: i64) -> StoreResult<bool> {
                let r = sqlx::query(
                    "UPDATE registration_tokens SET uses = uses + 1
                     WHERE id = $1 AND revoked = FALSE AND expires_at > $2 AND uses < max_uses
                       AND (node_id IS NULL OR node_id = $3)",
                )
                .bind(id)
                .bind(now)
                .bind(node_id)
                .execute(&self.pool)
                .await?;
                Ok(r.rows_affected() == 1)
            }

            async fn revoke_registration_token(&self, id: &str) -> StoreResult<bool> {
                let r = sqlx::query("UPDATE registration_tokens SET revoked = TRUE WHERE id = $1 AND revoked = FALSE")
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                Ok(r.rows_affected() == 1)
            }

            async fn set_node_credential(&self, id: &str, hash: &str) -> StoreResult<()> {
                sqlx::query("UPDATE nodes SET credential_hash = $1 WHERE id = $2")
                    .bind(hash)
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn node_by_credential(&self, hash: &str) -> StoreResult<Option<NodeRecord>> {
                Ok(sqlx::query_as(&format!("SELECT {NODE_COLS} FROM nodes WHERE credential_hash = $1"))
                    .bind(hash)
                    .fetch_optional(&self.pool)
                    .await?)
            }

            async fn touch_node(&self, id: &str, now: i64) -> StoreResult<()> {
                sqlx::query(
                    "UPDATE nodes SET last_seen = $1, status = CASE WHEN status = 'lost' THEN 'ready' ELSE status END
                     WHERE id = $2",
                )
                .bind(now)
                .bind(id)
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn touch_nodes(&self, seen: &[(String, i64)]) -> StoreResult<()> {
                let mut tx = self.sched.begin_with(Self::BEGIN_WRITE).await?;
                for chunk in seen.chunks(1000) {
                    let mut q = sqlx::QueryBuilder::<$db>::new("WITH v (id, at) AS (");
                    q.push_values(chunk, |mut b, (id, at)| {
                        b.push_bind(id).push_bind(*at);
                    });
                    q.push(
                        ") UPDATE nodes SET last_seen = v.at FROM v
                         WHERE nodes.id = v.id AND (nodes.last_seen IS NULL OR nodes.last_seen < v.at)",
                    );
                    q.build().execute(&mut *tx).await?;
                }
                tx.commit().await?;
                Ok(())
            }

            async fn set_node_status(&self, id: &str, status: NodeStatus) -> StoreResult<bool> {
                let r = sqlx::query("UPDATE nodes SET status = $1 WHERE id = $2")
                    .bind(status.as_str())
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                Ok(r.rows_affected() == 1)
            }
        }
    };
}

impl_nodes!(SqliteStore, sqlx::Sqlite);
impl_nodes!(PostgresStore, sqlx::Postgres);
