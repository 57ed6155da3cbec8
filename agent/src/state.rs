//! The node credential on disk. It is a bearer secret for this node, so the file is created
//! with mode 0600 and replaced atomically (a crash never leaves half a credential).

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::AgentError;

pub const CREDENTIAL_FILE: &str = "credential.json";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedCredential {
    pub server: String,
    pub node_id: String,
    pub credential: String,
}

fn state_err(path: &Path) -> impl FnOnce(std::io::Error) -> AgentError + '_ {
    move |source| AgentError::State {
        path: path.to_path_buf(),
        source,
    }
}

pub fn credential_path(state_dir: &Path) -> PathBuf {
    state_dir.join(CREDENTIAL_FILE)
}

/// `None` when there is no usable file; a corrupt file is treated as absent (re-registering
/// fixes it) rather than stopping the agent.
pub fn load_credential(state_dir: &Path) -> Option<SavedCredential> {
    let path = credential_path(state_dir);
    let text = std::fs::read_to_string(&path).ok()?;
    match serde_json::from_str(&text) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "ignoring unreadable credential file");
            None
        }
    }
}

pub fn save_credential(state_dir: &Path, cred: &SavedCredential) -> Result<(), AgentError> {
    std::fs::create_dir_all(state_dir).map_err(state_err(state_dir))?;
    let path = credential_path(state_dir);
    // Written beside the credential and renamed over it whole: a crash mid-write keeps the old
    // one. The temporary file is made owner-only (0600) and is removed if anything fails.
    let mut f = tempfile::Builder::new()
        .prefix(&format!(".{CREDENTIAL_FILE}."))
        .permissions(std::fs::Permissions::from_mode(0o600))
        .tempfile_in(state_dir)
        .map_err(state_err(state_dir))?;
    let body = serde_json::to_vec_pretty(cred).unwrap_or_default();
    f.write_all(&body).map_err(state_err(f.path()))?;
    f.as_file().sync_all().map_err(state_err(f.path()))?;
    f.persist(&path).map_err(|e| state_err(&path)(e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_with_private_mode() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("nested");
        assert_eq!(load_credential(&state), None);
        let c = SavedCredential {
            server: "http://s".into(),
            node_id: "n1".into(),
            credential: "adln_x".into(),
        };
        save_credential(&state, &c).unwrap();
        assert_eq!(load_credential(&state), Some(c.clone()));
        let mode = std::fs::metadata(credential_path(&state))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let c2 = SavedCredential {
            credential: "adln_y".into(),
            ..c
        };
        save_credential(&state, &c2).unwrap();
        assert_eq!(load_credential(&state).unwrap().credential, "adln_y");
        std::fs::write(credential_path(&state), "not json").unwrap();
        assert_eq!(load_credential(&state), None);
    }
}
