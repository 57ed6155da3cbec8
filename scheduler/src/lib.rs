//! autodl's scheduling policy as a pure library: cluster state and `now` go in, decisions come
//! out. No I/O and no clock, so the live server and the trace simulator run the same code and a
//! simulation is reproducible.
//!
//! Entry points: [`admission_check`] at submission, [`Scheduler::schedule`] every cycle.

pub mod admission;
pub mod config;
mod fasthash;
pub mod forecast;
pub mod placement;
pub mod priority;
pub mod scheduler;
pub mod sim;
pub mod snapshot;
pub mod types;

pub use admission::{admission_check, AdmissionError, ClusterView};
pub use config::{Backfill, PolicyConfig, Weights};
pub use placement::PlacementPolicy;
pub use priority::{PriorityBreakdown, PriorityContext};
pub use scheduler::{
    Decision, Decisions, PendingReason, PendingTask, PreemptReason, QuotaCap, QuotaScope,
    ResizeReason, Scheduler,
};
pub use snapshot::{Charge, EndedRun, RunAccount, Snapshot};
pub use types::*;
