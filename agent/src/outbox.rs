//! What an attempt leaves for the server when it ends (its end report, its results and its
//! last checkpoint), kept on the node's disk until the server has it.
//!
//! A run may end while the server restarts or object storage is full. Uploading then fails
//! for a while; the agent must neither drop the results nor hold the end report (and the
//! task's GPUs) until they go through. So each ended attempt is written here first: one
//! folder per attempt, with `kept.json` (the report, whether the server has it, the folders
//! still to upload) and a copy of each folder (hard links from the task's folder, taken
//! beneath a handle and owner-checked as uploads are). The agent uploads from here, tells the
//! server the end (saying what is still uploading), and keeps trying what is left, across
//! its own restarts, for a configured time and within a configured size; what it must give
//! up it tells the server, so the task says plainly that it is lost.
//!
//! Every write is a new file renamed into place, so a crash leaves the old state or the new.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use autodl_common::agent::FinishedReport;
use serde::{Deserialize, Serialize};

const RECORD: &str = "kept.json";
/// A folder still being written; removed at the next start.
const PARTIAL: &str = ".partial";

/// One folder the attempt saved and the server does not have yet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Part {
    /// "checkpoint" or "results".
    pub kind: String,
    #[serde(default)]
    pub step: Option<i64>,
    #[serde(default)]
    pub epoch: Option<f64>,
}

/// An ended attempt, as kept.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Kept {
    pub task_id: String,
    pub report: FinishedReport,
    /// Whether the server has the end report.
    pub reported: bool,
    /// What is still to upload, in order.
    pub parts: Vec<Part>,
    /// When it was kept (seconds since the Unix epoch): it is given up `keep_for` later.
    pub kept_at: u64,
    /// Parts given up (kind, why) that the server has not been told of yet.
    #[serde(default)]
    pub lost: Vec<(String, String)>,
}

impl Kept {
    pub fn attempt(&self) -> u32 {
        self.report.attempt
    }

    /// The kinds still to upload, as the end report names them.
    pub fn pending(&self) -> Vec<String> {
        self.parts.iter().map(|p| p.kind.clone()).collect()
    }
}

/// The outbox folder of a node (`<state_dir>/outbox`, the agent's alone: mode 0700).
#[derive(Debug, Clone)]
pub struct Outbox {
    root: PathBuf,
}

impl Outbox {
    pub fn open(state_dir: &Path) -> std::io::Result<Outbox> {
        let root = state_dir.join("outbox");
        std::fs::create_dir_all(&root)?;
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))?;
        // Folders a crash left half-written hold nothing the server was promised.
        for e in std::fs::read_dir(&root)?.flatten() {
            if e.file_name().to_string_lossy().ends_with(PARTIAL) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        Ok(Outbox { root })
    }

    fn dir(&self, task_id: &str, attempt: u32) -> PathBuf {
        self.root
            .join(format!("{}.{attempt}", crate::runtime::safe_name(task_id)))
    }

    /// Where a kept folder is (to upload from).
    pub fn folder(&self, kept: &Kept, kind: &str) -> PathBuf {
        self.dir(&kept.task_id, kept.attempt()).join(kind)
    }

    /// Keeps an ended attempt: its record and a copy of each of its parts' folders
    /// (`folders`: kind, source folder, the task uid whose files count). Nothing is kept
    /// unless all of it is.
    pub fn keep(&self, kept: &Kept, folders: &[(&str, &Path, Option<u32>)]) -> std::io::Result<()> {
        let dir = self.dir(&kept.task_id, kept.attempt());
        let partial = dir.with_file_name(format!(
            "{}{PARTIAL}",
            dir.file_name().unwrap_or_default().to_string_lossy()
        ));
        let _ = std::fs::remove_dir_all(&partial);
        std::fs::create_dir(&partial)?;
        let written = (|| {
            for (kind, src, owner) in folders {
                crate::artifacts::keep_folder(src, &partial.join(kind), *owner)?;
            }
            write_record(&partial, kept)
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_dir_all(&partial);
            return Err(e);
        }
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::rename(&partial, &dir)?;
        sync_dir(&self.root);
        Ok(())
    }

    /// The attempt as kept now, if it still is.
    pub fn load(&self, task_id: &str, attempt: u32) -> Option<Kept> {
        let text = std::fs::read(self.dir(task_id, attempt).join(RECORD)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Writes the record again (what changed: reported, parts).
    pub fn save(&self, kept: &Kept) -> std::io::Result<()> {
        write_record(&self.dir(&kept.task_id, kept.attempt()), kept)
    }

    /// The server has one part (or will never take it): its copy goes.
    pub fn drop_part(&self, kept: &mut Kept, kind: &str) -> std::io::Result<()> {
        kept.parts.retain(|p| p.kind != kind);
        let _ = std::fs::remove_dir_all(self.folder(kept, kind));
        self.save(kept)
    }

    pub fn remove(&self, task_id: &str, attempt: u32) {
        let _ = std::fs::remove_dir_all(self.dir(task_id, attempt));
    }

    /// Everything kept, oldest first. An unreadable record is set aside (logged), not fatal.
    pub fn all(&self) -> Vec<Kept> {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut out: Vec<Kept> = entries
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().ends_with(PARTIAL))
            .filter_map(|e| {
                let path = e.path().join(RECORD);
                let text = std::fs::read(&path).ok()?;
                match serde_json::from_slice(&text) {
                    Ok(k) => Some(k),
                    Err(err) => {
                        tracing::warn!(path = %path.display(), error = %err, "ignoring an unreadable outbox record");
                        None
                    }
                }
            })
            .collect();
        out.sort_by(|a, b| (a.kept_at, &a.task_id).cmp(&(b.kept_at, &b.task_id)));
        out
    }

    /// Bytes kept for one attempt (a file still linked from its task folder counts in full).
    pub fn bytes_of(&self, kept: &Kept) -> u64 {
        folder_bytes(&self.dir(&kept.task_id, kept.attempt()))
    }
}

/// Bytes of the files below `dir`.
pub fn folder_bytes(dir: &Path) -> u64 {
    walkdir::WalkDir::new(dir)
        .follow_links(false)
        .into_iter()
        .flatten()
        .filter(|e| e.file_type().is_file())
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

fn write_record(dir: &Path, kept: &Kept) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{RECORD}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(&serde_json::to_vec(kept).map_err(std::io::Error::other)?)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(RECORD))?;
    sync_dir(dir);
    Ok(())
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Seconds since the Unix epoch (when an attempt is kept; compared across agent restarts).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use autodl_common::agent::ExitReason;

    fn kept(task: &str, parts: &[&str]) -> Kept {
        Kept {
            task_id: task.into(),
            report: FinishedReport {
                attempt: 2,
                exit_code: Some(0),
                reason: ExitReason::Success,
                detail: None,
                uploading: vec![],
                not_kept: None,
            },
            reported: false,
            parts: parts
                .iter()
                .map(|k| Part {
                    kind: (*k).into(),
                    step: None,
                    epoch: None,
                })
                .collect(),
            kept_at: 7,
            lost: vec![],
        }
    }

    #[test]
    fn an_ended_attempt_is_kept_with_its_folders_across_a_reopen() {
        let state = tempfile::tempdir().unwrap();
        let task = tempfile::tempdir().unwrap();
        let results = task.path().join("results");
        std::fs::create_dir_all(results.join("sub")).unwrap();
        std::fs::write(results.join("sub/model.bin"), b"weights").unwrap();
        std::fs::write(results.join(".autodl-save"), b"{}").unwrap();
        let outbox = Outbox::open(state.path()).unwrap();
        let mut k = kept("t/../1", &["results"]);
        outbox
            .keep(&k, &[("results", results.as_path(), None)])
            .unwrap();
        // The task's folder may go; the kept copy stays, and the agent's own files are left.
        std::fs::remove_dir_all(&results).unwrap();
        let copy = outbox.folder(&k, "results");
        assert_eq!(
            std::fs::read(copy.join("sub/model.bin")).unwrap(),
            b"weights"
        );
        assert!(!copy.join(".autodl-save").exists());
        assert!(copy.starts_with(state.path().join("outbox")), "{copy:?}");
        let again = Outbox::open(state.path()).unwrap();
        let all = again.all();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].pending(), vec!["results".to_owned()]);
        assert!(again.bytes_of(&k) >= 7);
        k.reported = true;
        again.drop_part(&mut k, "results").unwrap();
        assert!(!copy.exists());
        let all = again.all();
        assert!(all[0].reported && all[0].parts.is_empty());
        again.remove("t/../1", 2);
        assert!(again.all().is_empty());
        let mode = std::fs::metadata(state.path().join("outbox"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn a_half_written_keep_is_never_read_and_is_removed_at_the_next_open() {
        let state = tempfile::tempdir().unwrap();
        let outbox = Outbox::open(state.path()).unwrap();
        // A source that cannot be read: nothing is kept.
        let missing_parent = state.path().join("nope/results");
        std::fs::create_dir_all(state.path().join("nope")).unwrap();
        std::fs::write(&missing_parent, b"not a folder").unwrap();
        let k = kept("t2", &["results"]);
        assert!(outbox
            .keep(&k, &[("results", missing_parent.as_path(), None)])
            .is_err());
        assert!(outbox.all().is_empty());
        std::fs::create_dir_all(state.path().join("outbox/t3.1.partial")).unwrap();
        let _ = Outbox::open(state.path()).unwrap();
        assert!(!state.path().join("outbox/t3.1.partial").exists());
    }
}
