//! The live scheduler: the runner loads the policy's input from the store (the same
//! [`autodl_scheduler::Snapshot`] the simulator runs on), asks the pure policy for decisions
//! at the clock's `now`, and applies them.

pub mod active;
pub mod beside;
pub mod dependencies;
pub mod explain;
pub mod forecast;
pub mod handle;
pub mod housekeeping;
pub mod idle;
pub mod runner;
pub mod snapshot;
pub mod sweeps;
pub mod waiting;

pub use explain::explain;
pub use handle::SchedulerHandle;
pub use runner::Runner;
pub use snapshot::{load_quotas, to_node, to_quota};
