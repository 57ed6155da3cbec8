//! GPU inventory and utilisation behind one trait, so the agent loop is the same for real
//! NVIDIA hosts and for simulated demo nodes.

mod naming;
mod nvml;
mod sim;
pub mod smi;

use std::time::Instant;

pub use naming::gpu_type_from_name;
pub use nvml::NvmlBackend;
pub use sim::{known_gpu_types, parse_simulate_spec, SimulatedBackend, SimulatedGpu};

pub use crate::error::GpuError;
pub use crate::protocol::{AgentGpu, ProcessMemory};

/// One reading of one GPU. The agent adds the time and the task holding the GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSample {
    pub gpu_index: u32,
    /// Fraction in [0, 1].
    pub util: f64,
    pub mem_used: u64,
    pub mem_total: u64,
    pub temperature: Option<u32>,
    pub power_w: Option<f64>,
    pub processes: Vec<ProcessMemory>,
}

/// What a running task holds, so a simulated backend can make its numbers follow the work.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuAllocation {
    pub task_id: String,
    pub gpu_indices: Vec<u32>,
    /// Declared bytes per GPU; `None` holds whole cards.
    pub gpu_memory: Option<u64>,
    pub since: Instant,
    /// The task's main process on the host, once known.
    pub pid: Option<u32>,
}

/// Source of GPU facts. Methods are blocking (NVML calls are); the agent calls them from a
/// blocking thread.
pub trait GpuBackend: Send + Sync {
    fn inventory(&self) -> Result<Vec<AgentGpu>, GpuError>;
    fn sample(&self) -> Result<Vec<GpuSample>, GpuError>;

    /// Simulated GPUs cannot be handed to a container as devices; runtimes only set the
    /// visibility variables for them.
    fn is_simulated(&self) -> bool {
        false
    }

    /// Called whenever the set of running tasks changes. Real hardware measures usage itself,
    /// so the default ignores it.
    fn set_allocations(&self, _allocations: &[GpuAllocation]) {}
}
