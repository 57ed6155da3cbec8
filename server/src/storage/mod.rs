//! Object storage for checkpoints, results and datasets, behind one interface chosen by URL:
//! `file:///path` (a local folder, the embedded default) or `s3://bucket/prefix` (any
//! S3-compatible service through aws-sdk-s3).
//!
//! Every key the API builds starts with `tenants/<tenant id>/`, so no request of one tenant
//! can name another tenant's objects: user paths are checked by [`clean_path`] and then
//! appended below that prefix.

mod local;
mod s3;
pub mod tar;
pub mod usage;

use std::pin::Pin;
use std::sync::Arc;

use actix_web::web::Bytes;
use futures_util::Stream;

pub use local::LocalStore;
pub use s3::S3Store;

use crate::config::Settings;

/// Multipart part size: S3 wants at least 5 MiB for every part but the last.
pub const PART_SIZE: usize = 8 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("no such object")]
    NotFound,
    #[error("bucket {0:?} does not exist")]
    NoBucket(String),
    /// The service could not be reached or failed; worth retrying later.
    #[error("object storage unavailable: {0}")]
    Unavailable(String),
    /// The key cannot be written as asked (a folder store holds a file where the key needs
    /// a folder, or the other way round).
    #[error("{0}")]
    Conflict(String),
    #[error("object storage: {0}")]
    Other(String),
}

pub type StorageResult<T> = Result<T, StorageError>;
pub type ByteStream = Pin<Box<dyn Stream<Item = std::io::Result<Bytes>> + Send>>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    /// Key relative to the listed prefix.
    pub key: String,
    pub size: u64,
    /// Changes whenever the object's content does (S3 ETag, or size+mtime for folders).
    pub etag: String,
}

/// One object being written. Nothing is visible under the key until `finish` returns.
#[async_trait::async_trait]
pub trait Upload: Send {
    async fn write(&mut self, chunk: Bytes) -> StorageResult<()>;
    /// Completes the object; returns its size.
    async fn finish(self: Box<Self>) -> StorageResult<u64>;
    async fn abort(self: Box<Self>);
}

#[async_trait::async_trait]
pub trait ObjectStore: Send + Sync {
    fn describe(&self) -> String;
    async fn bucket_exists(&self, bucket: &str) -> StorageResult<bool>;
    async fn start_upload(&self, bucket: &str, key: &str) -> StorageResult<Box<dyn Upload>>;
    async fn get(&self, bucket: &str, key: &str) -> StorageResult<(u64, ByteStream)>;
    /// Size of the object, `None` when there is none.
    async fn size(&self, bucket: &str, key: &str) -> StorageResult<Option<u64>>;
    /// Objects whose key starts with `prefix` (which should end in `/`), keys relative to it.
    async fn list(&self, bucket: &str, prefix: &str) -> StorageResult<Vec<ObjectMeta>>;
    /// Whether any object lies under `prefix`: a data path must name something stored.
    async fn any_under(&self, bucket: &str, prefix: &str) -> StorageResult<bool> {
        Ok(!self.list(bucket, prefix).await?.is_empty())
    }
    async fn delete(&self, bucket: &str, key: &str) -> StorageResult<()>;
    /// Removes what uploads that never finished left behind (a server stopped mid-upload).
    /// S3 services do this with a lifecycle rule (`AbortIncompleteMultipartUpload`).
    async fn sweep_abandoned(&self, _older_than: std::time::Duration) -> StorageResult<usize> {
        Ok(0)
    }
}

/// The platform's object storage: a backend, its default bucket, and the buckets tenants may
/// name in `s3://` URLs (each tenant only below its own prefix in each of them).
#[derive(Clone)]
pub struct Storage {
    pub backend: Arc<dyn ObjectStore>,
    pub default_bucket: String,
    /// Prepended to every key (the path part of `s3://bucket/prefix`).
    pub root: String,
    pub allowed_buckets: Vec<String>,
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage")
            .field("backend", &self.backend.describe())
            .field("default_bucket", &self.default_bucket)
            .finish()
    }
}

impl Storage {
    pub fn from_settings(s: &Settings) -> anyhow::Result<Storage> {
        let url = s.storage_url.trim();
        let (backend, default_bucket, root): (Arc<dyn ObjectStore>, String, String) =
            if let Some(path) = url.strip_prefix("file://") {
                if path.is_empty() {
                    anyhow::bail!(
                        "storage_url file:// needs a folder, e.g. file:///var/lib/autodl/objects"
                    );
                }
                (
                    Arc::new(LocalStore::new(path.into())),
                    "autodl".to_owned(),
                    String::new(),
                )
            } else if let Some(rest) = url.strip_prefix("s3://") {
                let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
                if bucket.is_empty() {
                    anyhow::bail!("storage_url s3:// needs a bucket, e.g. s3://autodl/objects");
                }
                let root = prefix.trim_matches('/');
                (
                    Arc::new(S3Store::new(s)),
                    bucket.to_owned(),
                    if root.is_empty() {
                        String::new()
                    } else {
                        format!("{root}/")
                    },
                )
            } else {
                anyhow::bail!("storage_url must start with file:// or s3:// (got {url:?})");
            };
        let mut allowed = vec![default_bucket.clone()];
        for b in &s.storage_buckets {
            if !allowed.contains(b) {
                allowed.push(b.clone());
            }
        }
        Ok(Storage {
            backend,
            default_bucket,
            root,
            allowed_buckets: allowed,
        })
    }

    /// The key prefix of one tenant's objects (ends in `/`).
    pub fn tenant_prefix(&self, tenant_id: &str) -> String {
        format!("{}tenants/{tenant_id}/", self.root)
    }

    /// Where the organization's code bundle with this digest is kept. Bundles are written only
    /// by `POST /code`, which checks that the bytes have this digest.
    pub fn code_key(&self, tenant_id: &str, hex: &str) -> (String, String) {
        (
            self.default_bucket.clone(),
            format!("{}code/{hex}", self.tenant_prefix(tenant_id)),
        )
    }

    /// Resolves a user's `s3://bucket/path` (or a bare `path` in the default bucket) to the
    /// bucket and the key prefix inside the tenant's area.
    pub fn resolve(&self, tenant_id: &str, url: &str) -> Result<(String, String), String> {
        let (bucket, path) = match url.strip_prefix("s3://") {
            Some(rest) => {
                let (b, p) = rest.split_once('/').unwrap_or((rest, ""));
                (b.to_owned(), p)
            }
            None => (self.default_bucket.clone(), url),
        };
        if !self.allowed_buckets.contains(&bucket) {
            return Err(format!(
                "bucket {bucket:?} is not one this platform lets tenants use ({})",
                self.allowed_buckets.join(", ")
            ));
        }
        let path = clean_path(path)?;
        let mut key = self.tenant_prefix(tenant_id);
        if !path.is_empty() {
            key.push_str(&path);
            key.push('/');
        }
        Ok((bucket, key))
    }
}

/// Checks a relative object path: no `..`, no `.`, no empty segments, no backslashes or control
/// characters, at most 1024 bytes. Leading and trailing slashes are dropped.
pub fn clean_path(path: &str) -> Result<String, String> {
    let p = path.trim_matches('/');
    if p.len() > 1024 {
        return Err("path is longer than 1024 bytes".into());
    }
    if p.is_empty() {
        return Ok(String::new());
    }
    for seg in p.split('/') {
        if seg.is_empty() || seg == "." || seg == ".." {
            return Err(format!("path {path:?} has an empty, '.' or '..' segment"));
        }
        if seg.len() > 255 {
            return Err(format!("path {path:?} has a name longer than 255 bytes"));
        }
        if seg.chars().any(|c| c.is_control() || c == '\\') {
            return Err(format!(
                "path {path:?} has a control character or backslash"
            ));
        }
    }
    Ok(p.to_owned())
}

/// Reads a whole object into memory (manifests and small files only).
pub async fn read_all(store: &dyn ObjectStore, bucket: &str, key: &str) -> StorageResult<Vec<u8>> {
    use futures_util::StreamExt;
    let (_, mut s) = store.get(bucket, key).await?;
    let mut out = Vec::new();
    while let Some(chunk) = s.next().await {
        out.extend_from_slice(&chunk.map_err(|e| StorageError::Unavailable(e.to_string()))?);
    }
    Ok(out)
}

pub async fn put_bytes(
    store: &dyn ObjectStore,
    bucket: &str,
    key: &str,
    bytes: Bytes,
) -> StorageResult<u64> {
    let mut up = store.start_upload(bucket, key).await?;
    if let Err(e) = up.write(bytes).await {
        up.abort().await;
        return Err(e);
    }
    up.finish().await
}

/// Deletes every object under `prefix`.
pub async fn delete_prefix(
    store: &dyn ObjectStore,
    bucket: &str,
    prefix: &str,
) -> StorageResult<usize> {
    let objects = store.list(bucket, prefix).await?;
    for o in &objects {
        store.delete(bucket, &format!("{prefix}{}", o.key)).await?;
    }
    Ok(objects.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside() {
        assert_eq!(clean_path("/a/b/").unwrap(), "a/b");
        assert_eq!(clean_path("").unwrap(), "");
        for bad in ["a/../b", "..", "a//b", "./a", "a\\b", "a/\u{0}"] {
            assert!(clean_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn tenant_urls_resolve_below_the_tenant() {
        let dir = tempfile::tempdir().unwrap();
        let s = Storage {
            backend: Arc::new(LocalStore::new(dir.path().join("objects"))),
            default_bucket: "autodl".into(),
            root: "root/".into(),
            allowed_buckets: vec!["autodl".into(), "data".into()],
        };
        assert_eq!(
            s.resolve("t1", "s3://data/sets/x").unwrap(),
            ("data".into(), "root/tenants/t1/sets/x/".into())
        );
        assert_eq!(
            s.resolve("t1", "ckpt").unwrap(),
            ("autodl".into(), "root/tenants/t1/ckpt/".into())
        );
        assert!(s
            .resolve("t1", "s3://other/x")
            .unwrap_err()
            .contains("not one"));
        assert!(s.resolve("t1", "s3://data/../t2/x").is_err());
    }
}
