//! Values parsed into types that can only hold valid data, each in a module named after what
//! it is, so handlers, use cases and the store never see an unchecked email, a weak password,
//! a GPU type no task could ask for or a nonsensical quota.

mod account;
mod address;
mod artifact;
mod error;
mod gpu_type;
mod idempotency_key;
pub mod names;
mod node;
mod quota;
mod task_ref;
mod timestamp;

pub use account::{parse_name, Email, Password};
pub use address::is_internal;
pub use artifact::{ArtifactKind, ArtifactState};
pub use error::DomainError;
pub use gpu_type::{parse_gpu_type, AllowedGpuTypes};
pub use idempotency_key::IdempotencyKey;
pub use node::{parse_node_id, NodeStatus};
pub use quota::{check_within, parse_quota, quota_to_api};
pub use task_ref::TaskRef;
pub use timestamp::rfc3339;
