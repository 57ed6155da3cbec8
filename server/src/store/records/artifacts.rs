//! Checkpoints and results kept in object storage.

use crate::domain::{ArtifactKind, ArtifactState};

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ArtifactRecord {
    pub id: String,
    pub task_id: String,
    pub tenant_id: String,
    pub attempt: i64,
    #[sqlx(try_from = "String")]
    pub kind: ArtifactKind,
    #[sqlx(try_from = "String")]
    pub state: ArtifactState,
    pub bucket: String,
    /// Key prefix of its files (ends in `/`).
    pub prefix: String,
    /// JSON array of `{"path", "size"}`.
    pub manifest: Option<String>,
    pub files: i64,
    pub size_bytes: i64,
    pub step: Option<i64>,
    pub epoch: Option<f64>,
    pub created_at: i64,
    pub completed_at: Option<i64>,
    /// The node it came from (none in uploads older than gangs spanning nodes).
    pub node: Option<String>,
}
