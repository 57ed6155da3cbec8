//! A folder as object storage: `<root>/<bucket>/<key>`. Objects are written to a temporary file
//! and renamed into place, so a reader never sees half an object.

use std::path::{Path, PathBuf};

use actix_web::web::Bytes;
use tokio::io::AsyncWriteExt;

use super::{ByteStream, ObjectMeta, ObjectStore, StorageError, StorageResult, Upload};

pub struct LocalStore {
    root: PathBuf,
}

impl LocalStore {
    /// Creates the folder (private to the server's user) if it is missing.
    pub fn new(root: PathBuf) -> Self {
        use std::os::unix::fs::DirBuilderExt;
        if !root.exists() {
            if let Err(e) = std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&root)
            {
                tracing::warn!(root = %root.display(), error = %e, "could not create the object folder");
            }
        }
        LocalStore { root }
    }

    fn path(&self, bucket: &str, key: &str) -> StorageResult<PathBuf> {
        // Keys are built from checked paths; refuse anything that could leave the folder anyway.
        if bucket.is_empty()
            || bucket.contains(['/', '\\'])
            || bucket.starts_with('.')
            || key.split('/').any(|s| s == ".." || s == ".")
        {
            return Err(StorageError::Other(format!("invalid key {bucket}/{key}")));
        }
        Ok(self.root.join(bucket).join(key))
    }
}

fn io_err(e: std::io::Error) -> StorageError {
    if e.kind() == std::io::ErrorKind::NotFound {
        StorageError::NotFound
    } else {
        StorageError::Unavailable(e.to_string())
    }
}

/// Placing a finished object: a file where the key needs a folder (`conf` when writing
/// `conf/child`) or a folder where it needs a file is the caller's conflict, not an outage.
fn place_err(e: std::io::Error) -> StorageError {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::AlreadyExists | K::NotADirectory | K::IsADirectory | K::DirectoryNotEmpty => {
            StorageError::Conflict(
                "an object and a folder of objects cannot have the same name".into(),
            )
        }
        _ => io_err(e),
    }
}

struct LocalUpload {
    /// Removed when dropped, so an upload abandoned any way (an error, a dropped future, a
    /// failed rename) leaves nothing under `.uploads`.
    tmp: tempfile::TempPath,
    dest: PathBuf,
    file: tokio::fs::File,
    size: u64,
}

#[async_trait::async_trait]
impl Upload for LocalUpload {
    async fn write(&mut self, chunk: Bytes) -> StorageResult<()> {
        self.size += chunk.len() as u64;
        self.file.write_all(&chunk).await.map_err(io_err)
    }

    async fn finish(mut self: Box<Self>) -> StorageResult<u64> {
        let flushed = async {
            self.file.flush().await?;
            self.file.sync_all().await?;
            if let Some(parent) = self.dest.parent() {
                tokio::fs::create_dir_all(parent).await?;
            }
            Ok::<_, std::io::Error>(())
        }
        .await;
        flushed.map_err(place_err)?;
        let LocalUpload {
            tmp, dest, size, ..
        } = *self;
        tokio::task::spawn_blocking(move || tmp.persist(&dest).map_err(|e| e.error))
            .await
            .map_err(|e| io_err(std::io::Error::other(e)))?
            .map_err(place_err)?;
        Ok(size)
    }

    async fn abort(self: Box<Self>) {
        let tmp = self.tmp;
        let _ = tokio::task::spawn_blocking(move || tmp.close()).await;
    }
}

#[async_trait::async_trait]
impl ObjectStore for LocalStore {
    fn describe(&self) -> String {
        format!("folder {}", self.root.display())
    }

    async fn bucket_exists(&self, bucket: &str) -> StorageResult<bool> {
        // Buckets of the embedded store are plain folders, made on first use.
        let p = self.path(bucket, "")?;
        tokio::fs::create_dir_all(&p).await.map_err(io_err)?;
        Ok(true)
    }

    async fn start_upload(&self, bucket: &str, key: &str) -> StorageResult<Box<dyn Upload>> {
        let dest = self.path(bucket, key)?;
        let tmp_dir = self.root.join(".uploads");
        tokio::fs::create_dir_all(&tmp_dir).await.map_err(io_err)?;
        let (file, tmp) =
            tokio::task::spawn_blocking(move || tempfile::NamedTempFile::new_in(tmp_dir))
                .await
                .map_err(|e| io_err(std::io::Error::other(e)))?
                .map_err(io_err)?
                .into_parts();
        let file = tokio::fs::File::from_std(file);
        Ok(Box::new(LocalUpload {
            tmp,
            dest,
            file,
            size: 0,
        }))
    }

    async fn get(&self, bucket: &str, key: &str) -> StorageResult<(u64, ByteStream)> {
        let p = self.path(bucket, key)?;
        let file = tokio::fs::File::open(&p).await.map_err(io_err)?;
        let meta = file.metadata().await.map_err(io_err)?;
        if !meta.is_file() {
            return Err(StorageError::NotFound);
        }
        let stream = tokio_util::io::ReaderStream::with_capacity(file, 256 * 1024);
        Ok((meta.len(), Box::pin(stream)))
    }

    async fn size(&self, bucket: &str, key: &str) -> StorageResult<Option<u64>> {
        match tokio::fs::metadata(self.path(bucket, key)?).await {
            Ok(m) if m.is_file() => Ok(Some(m.len())),
            Ok(_) => Ok(None),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(io_err(e)),
        }
    }

    async fn list(&self, bucket: &str, prefix: &str) -> StorageResult<Vec<ObjectMeta>> {
        let base = self.path(bucket, prefix)?;
        let dir: &Path = if prefix.ends_with('/') || prefix.is_empty() {
            &base
        } else {
            base.parent().unwrap_or(&base)
        };
        let (dir, prefix) = (dir.to_path_buf(), prefix.to_owned());
        let root = self.path(bucket, "")?;
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            if !dir.exists() {
                return Ok(out);
            }
            for entry in walkdir::WalkDir::new(&dir).follow_links(false) {
                let entry = entry.map_err(|e| StorageError::Unavailable(e.to_string()))?;
                if !entry.file_type().is_file() {
                    continue;
                }
                let Ok(rel) = entry.path().strip_prefix(&root) else {
                    continue;
                };
                let full = rel.to_string_lossy().replace('\\', "/");
                let Some(key) = full.strip_prefix(&prefix) else {
                    continue;
                };
                let meta = entry
                    .metadata()
                    .map_err(|e| StorageError::Unavailable(e.to_string()))?;
                let mtime = meta
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_nanos());
                out.push(ObjectMeta {
                    key: key.to_owned(),
                    size: meta.len(),
                    etag: format!("{}-{mtime}", meta.len()),
                });
            }
            out.sort_by(|a, b| a.key.cmp(&b.key));
            Ok(out)
        })
        .await
        .map_err(|e| StorageError::Other(e.to_string()))?
    }

    async fn sweep_abandoned(&self, older_than: std::time::Duration) -> StorageResult<usize> {
        let dir = self.root.join(".uploads");
        let mut entries = match tokio::fs::read_dir(&dir).await {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(io_err(e)),
        };
        let mut removed = 0;
        while let Some(entry) = entries.next_entry().await.map_err(io_err)? {
            let old = entry
                .metadata()
                .await
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > older_than);
            if old && tokio::fs::remove_file(entry.path()).await.is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }

    async fn delete(&self, bucket: &str, key: &str) -> StorageResult<()> {
        let p = self.path(bucket, key)?;
        match tokio::fs::remove_file(&p).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(e)),
        }
        // Drop folders left empty, up to the bucket.
        let stop = self.path(bucket, "")?;
        let mut dir = p.parent().map(Path::to_path_buf);
        while let Some(d) = dir {
            if d == stop || !d.starts_with(&stop) || tokio::fs::remove_dir(&d).await.is_err() {
                break;
            }
            dir = d.parent().map(Path::to_path_buf);
        }
        Ok(())
    }
}
