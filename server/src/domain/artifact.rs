//! What agents save for tasks in object storage, and where each save is in its life.

use super::DomainError;

/// What an agent saves for a task: a checkpoint to resume from, or the task's results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArtifactKind {
    Checkpoint,
    Results,
}

impl ArtifactKind {
    pub fn parse(raw: &str) -> Result<Self, DomainError> {
        match raw {
            "checkpoint" => Ok(ArtifactKind::Checkpoint),
            "results" => Ok(ArtifactKind::Results),
            other => Err(DomainError::invalid(
                "kind",
                format!("kind is \"checkpoint\" or \"results\", not {other:?}"),
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ArtifactKind::Checkpoint => "checkpoint",
            ArtifactKind::Results => "results",
        }
    }

    /// The folder of an organization's objects that holds artifacts of this kind.
    pub fn folder(self) -> &'static str {
        match self {
            ArtifactKind::Checkpoint => "checkpoints",
            ArtifactKind::Results => "results",
        }
    }
}

impl std::fmt::Display for ArtifactKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// As a database column holds it.
impl TryFrom<String> for ArtifactKind {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        ArtifactKind::parse(&s).map_err(|_| format!("unknown artifact kind {s:?}"))
    }
}

/// Where an artifact is in its life: its files arrive while uploading; a commit makes it
/// complete (visible, restorable); retention or an abandoned upload has it deleting, then
/// deleted once its objects are gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArtifactState {
    Uploading,
    Complete,
    Deleting,
    Deleted,
}

impl ArtifactState {
    pub fn as_str(self) -> &'static str {
        match self {
            ArtifactState::Uploading => "uploading",
            ArtifactState::Complete => "complete",
            ArtifactState::Deleting => "deleting",
            ArtifactState::Deleted => "deleted",
        }
    }
}

impl std::fmt::Display for ArtifactState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TryFrom<String> for ArtifactState {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        [
            ArtifactState::Uploading,
            ArtifactState::Complete,
            ArtifactState::Deleting,
            ArtifactState::Deleted,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
        .ok_or_else(|| format!("unknown artifact state {s:?}"))
    }
}
