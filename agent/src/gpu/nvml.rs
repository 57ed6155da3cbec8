//! Real GPUs through NVML. nvml-wrapper loads libnvidia-ml at run time, so this compiles on
//! hosts without NVIDIA drivers and [`NvmlBackend::new`] fails cleanly there.

use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;

use super::{naming::gpu_type_from_name, AgentGpu, GpuBackend, GpuError, GpuSample, ProcessMemory};

pub struct NvmlBackend {
    nvml: Nvml,
}

impl std::fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlBackend").finish_non_exhaustive()
    }
}

fn nvml_err(what: &str, e: nvml_wrapper::error::NvmlError) -> GpuError {
    GpuError::Nvml(format!("{what}: {e}"))
}

impl NvmlBackend {
    pub fn new() -> Result<Self, GpuError> {
        let nvml = Nvml::init().map_err(|e| nvml_err("init", e))?;
        Ok(NvmlBackend { nvml })
    }
}

impl GpuBackend for NvmlBackend {
    fn inventory(&self) -> Result<Vec<AgentGpu>, GpuError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| nvml_err("device count", e))?;
        let mut gpus = Vec::with_capacity(count as usize);
        for index in 0..count {
            let d = self
                .nvml
                .device_by_index(index)
                .map_err(|e| nvml_err("device", e))?;
            let name = d.name().map_err(|e| nvml_err("name", e))?;
            let memory = d.memory_info().map_err(|e| nvml_err("memory", e))?.total;
            gpus.push(AgentGpu {
                index,
                gpu_type: gpu_type_from_name(&name, memory),
                uuid: Some(d.uuid().map_err(|e| nvml_err("uuid", e))?),
                memory,
            });
        }
        Ok(gpus)
    }

    /// Optional readings (temperature, power, processes) are left empty when a GPU does not
    /// support them rather than failing the whole sample.
    fn sample(&self) -> Result<Vec<GpuSample>, GpuError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| nvml_err("device count", e))?;
        let mut out = Vec::with_capacity(count as usize);
        for index in 0..count {
            let d = self
                .nvml
                .device_by_index(index)
                .map_err(|e| nvml_err("device", e))?;
            let mem = d.memory_info().map_err(|e| nvml_err("memory", e))?;
            let util = d
                .utilization_rates()
                .map(|u| f64::from(u.gpu) / 100.0)
                .unwrap_or(0.0);
            let processes = d
                .running_compute_processes()
                .map(|ps| {
                    ps.into_iter()
                        .map(|p| ProcessMemory {
                            pid: p.pid,
                            mem_used: match p.used_gpu_memory {
                                UsedGpuMemory::Used(b) => b,
                                UsedGpuMemory::Unavailable => 0,
                            },
                        })
                        .collect()
                })
                .unwrap_or_default();
            out.push(GpuSample {
                gpu_index: index,
                util,
                mem_used: mem.used,
                mem_total: mem.total,
                temperature: d.temperature(TemperatureSensor::Gpu).ok(),
                power_w: d.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
                processes,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs on GPU hosts; elsewhere NVML cannot load and the test says so and passes.
    #[test]
    fn nvml_inventory_and_sample_when_available() {
        let backend = match NvmlBackend::new() {
            Ok(b) => b,
            Err(e) => {
                eprintln!("skipping: no NVML on this host ({e})");
                return;
            }
        };
        let inv = backend.inventory().expect("inventory");
        let samples = backend.sample().expect("sample");
        assert_eq!(inv.len(), samples.len());
        for (g, s) in inv.iter().zip(&samples) {
            eprintln!(
                "GPU {}: {} {} {} bytes; sample {s:?}",
                g.index,
                g.gpu_type,
                g.uuid.as_deref().unwrap_or_default(),
                g.memory
            );
            assert!(!g.gpu_type.is_empty());
            assert!(g.uuid.as_deref().is_some_and(|u| u.starts_with("GPU-")));
            assert_eq!(s.mem_total, g.memory);
            assert!((0.0..=1.0).contains(&s.util));
        }
    }
}
