/// Why the domain's rules refuse a value. The rules know nothing of HTTP: the edge maps each
/// kind to its answer (`ApiError`'s `From`), so a rule reads the same from a handler, a use
/// case, the command line or a test.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DomainError {
    /// The value cannot be what `field` asks for (malformed, empty, too long, unknown).
    #[error("{message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    /// Well formed, but a rule refuses it (a cap beyond the organization's).
    #[error("{message}")]
    Refused {
        field: &'static str,
        message: String,
    },
    /// Not a value of the kind at all, and about no form field (a header).
    #[error("{0}")]
    Malformed(String),
    /// A cap of the organization's (sessions a member may hold) leaves no room for it.
    #[error("{0}")]
    OverQuota(String),
}

impl DomainError {
    pub fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        DomainError::Invalid {
            field,
            message: message.into(),
        }
    }
}
