//! Simulated GPUs for demos and tests: numbers that follow the tasks the agent runs, so the
//! scheduler, dashboards and utilisation-aware placement can be exercised without hardware.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::backoff::mix64;

use super::{AgentGpu, GpuAllocation, GpuBackend, GpuError, GpuSample, ProcessMemory};

const GIB: u64 = 1 << 30;

/// (type, memory in GiB, board power in W).
const KNOWN: &[(&str, u64, f64)] = &[
    ("A100-40G", 40, 400.0),
    ("A100-80G", 80, 400.0),
    ("A40", 48, 300.0),
    ("A10", 24, 150.0),
    ("A30", 24, 165.0),
    ("L4", 24, 72.0),
    ("L40S", 48, 350.0),
    ("V100-16G", 16, 300.0),
    ("V100-32G", 32, 300.0),
    ("T4", 16, 70.0),
    ("H100-80G", 80, 700.0),
    ("H200-141G", 141, 700.0),
    ("RTX-4090", 24, 450.0),
];

/// Share of a card a task uses when it holds the whole card and declared no memory.
const DEFAULT_MEMORY_SHARE: f64 = 0.8;
/// Seconds for a task's utilisation to ramp from idle to its plateau (data loading, warm-up).
const RAMP: Duration = Duration::from_secs(10);

/// Type names `--simulate` accepts without an explicit memory size.
pub fn known_gpu_types() -> Vec<&'static str> {
    KNOWN.iter().map(|k| k.0).collect()
}

#[derive(Debug, Clone, PartialEq)]
pub struct SimulatedGpu {
    pub gpu_type: String,
    pub memory: u64,
    pub power_w: f64,
}

/// Parses `--simulate` specs: comma-separated `COUNTxTYPE` items ("4xA100-40G",
/// "2xA100-40G,2xA40"); the count defaults to 1, type names are case-insensitive, and an
/// unknown type needs its memory as `TYPE:SIZE` ("1xFOO:24GiB"; units B, KB, MB, GB, KiB,
/// MiB, GiB, TiB). Returns one entry per GPU in index order.
pub fn parse_simulate_spec(spec: &str) -> Result<Vec<SimulatedGpu>, GpuError> {
    let mut out = Vec::new();
    for item in spec.split(',').map(str::trim) {
        if item.is_empty() {
            return Err(GpuError::Spec(format!("empty item in GPU spec {spec:?}")));
        }
        let (count, rest) = match item.split_once(['x', 'X']) {
            Some((n, rest)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
                let n: u32 = n
                    .parse()
                    .map_err(|_| GpuError::Spec(format!("bad count in {item:?}")))?;
                (n, rest.trim())
            }
            _ => (1, item),
        };
        if count == 0 || count > 64 {
            return Err(GpuError::Spec(format!(
                "GPU count in {item:?} must be between 1 and 64"
            )));
        }
        let gpu = match rest.split_once(':') {
            Some((name, size)) => {
                let name = name.trim();
                if name.is_empty() {
                    return Err(GpuError::Spec(format!("missing GPU type in {item:?}")));
                }
                // The grammar of task specs: `24G` is 24 GiB, `24GB` 24 x 10^9 bytes.
                let memory = autodl_common::units::parse_size(size)
                    .ok()
                    .filter(|&m| m > 0)
                    .ok_or_else(|| GpuError::Spec(format!("bad memory size in {item:?}")))?;
                let power_w = lookup(name).map_or(300.0, |k| k.2);
                SimulatedGpu {
                    gpu_type: lookup(name).map_or_else(|| name.to_string(), |k| k.0.to_string()),
                    memory,
                    power_w,
                }
            }
            None => {
                let k = lookup(rest).ok_or_else(|| {
                    GpuError::Spec(format!(
                        "unknown GPU type {rest:?}; known types: {}; or give the memory as TYPE:SIZE (e.g. 1x{rest}:24GiB)",
                        known_gpu_types().join(", ")
                    ))
                })?;
                SimulatedGpu {
                    gpu_type: k.0.to_string(),
                    memory: k.1 * GIB,
                    power_w: k.2,
                }
            }
        };
        out.extend(std::iter::repeat_n(gpu, count as usize));
    }
    Ok(out)
}

fn lookup(name: &str) -> Option<&'static (&'static str, u64, f64)> {
    KNOWN.iter().find(|k| k.0.eq_ignore_ascii_case(name))
}

/// Deterministic simulated GPUs: given the seed, the same allocations and the same instants,
/// [`SimulatedBackend::sample_at`] returns the same numbers.
#[derive(Debug)]
pub struct SimulatedBackend {
    gpus: Vec<SimulatedGpu>,
    seed: u64,
    allocations: Mutex<Vec<GpuAllocation>>,
}

impl SimulatedBackend {
    pub fn new(gpus: Vec<SimulatedGpu>, seed: u64) -> Self {
        SimulatedBackend {
            gpus,
            seed,
            allocations: Mutex::new(Vec::new()),
        }
    }

    pub fn from_spec(spec: &str, seed: u64) -> Result<Self, GpuError> {
        Ok(Self::new(parse_simulate_spec(spec)?, seed))
    }

    fn uuid(&self, index: u32) -> String {
        let a = mix64(self.seed ^ 0xA5A5_5A5A_0000_0000 ^ u64::from(index));
        let b = mix64(a ^ u64::from(index).rotate_left(17));
        format!(
            "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xffff,
            b >> 48,
            b & 0xffff_ffff_ffff
        )
    }

    /// The plateau a task's utilisation ramps to, in [0.85, 0.98], fixed per task.
    fn plateau(&self, task_id: &str) -> f64 {
        let h = task_id
            .bytes()
            .fold(self.seed, |h, b| mix64(h ^ u64::from(b)));
        0.85 + 0.13 * unit(h)
    }

    pub fn sample_at(&self, now: Instant) -> Vec<GpuSample> {
        let allocations = self
            .allocations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        self.gpus
            .iter()
            .enumerate()
            .map(|(i, gpu)| {
                let index = i as u32;
                let mut util = 0.0;
                let mut mem_used = 0u64;
                let mut processes = Vec::new();
                for a in allocations
                    .iter()
                    .filter(|a| a.gpu_indices.contains(&index))
                {
                    let mem = a
                        .gpu_memory
                        .unwrap_or((gpu.memory as f64 * DEFAULT_MEMORY_SHARE) as u64);
                    mem_used = mem_used.saturating_add(mem);
                    let elapsed = now.saturating_duration_since(a.since);
                    let ramp = (elapsed.as_secs_f64() / RAMP.as_secs_f64()).min(1.0);
                    // Noise keyed on whole seconds keeps samples reproducible for a given instant.
                    let tick = elapsed.as_secs();
                    let noise =
                        (unit(mix64(self.seed ^ (u64::from(index) << 40) ^ tick)) - 0.5) * 0.04;
                    util += (self.plateau(&a.task_id) + noise) * ramp;
                    if let Some(pid) = a.pid {
                        processes.push(ProcessMemory { pid, mem_used: mem });
                    }
                }
                let util = util.clamp(0.0, 1.0);
                GpuSample {
                    gpu_index: index,
                    util,
                    mem_used: mem_used.min(gpu.memory),
                    mem_total: gpu.memory,
                    temperature: Some((32.0 + 45.0 * util).round() as u32),
                    power_w: Some(((0.15 + 0.85 * util) * gpu.power_w * 10.0).round() / 10.0),
                    processes,
                }
            })
            .collect()
    }
}

/// Maps a hash to [0, 1).
fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

impl GpuBackend for SimulatedBackend {
    fn inventory(&self) -> Result<Vec<AgentGpu>, GpuError> {
        Ok(self
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| AgentGpu {
                index: i as u32,
                gpu_type: g.gpu_type.clone(),
                uuid: Some(self.uuid(i as u32)),
                memory: g.memory,
            })
            .collect())
    }

    fn sample(&self) -> Result<Vec<GpuSample>, GpuError> {
        Ok(self.sample_at(Instant::now()))
    }

    fn is_simulated(&self) -> bool {
        true
    }

    fn set_allocations(&self, allocations: &[GpuAllocation]) {
        *self.allocations.lock().unwrap_or_else(|e| e.into_inner()) = allocations.to_vec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_parsing() {
        let g = parse_simulate_spec("4xA100-40G").unwrap();
        assert_eq!(g.len(), 4);
        assert!(g
            .iter()
            .all(|g| g.gpu_type == "A100-40G" && g.memory == 40 * GIB));

        let g = parse_simulate_spec(" 2xA100-40G, 2xa40 ").unwrap();
        let types: Vec<_> = g.iter().map(|g| g.gpu_type.as_str()).collect();
        assert_eq!(types, ["A100-40G", "A100-40G", "A40", "A40"]);
        assert_eq!(g[2].memory, 48 * GIB);

        let g = parse_simulate_spec("H200-141G").unwrap();
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].memory, 141 * GIB);

        let g = parse_simulate_spec("1xFOO:24GiB,2xBAR:16GB").unwrap();
        assert_eq!(g[0].gpu_type, "FOO");
        assert_eq!(g[0].memory, 24 * GIB);
        assert_eq!(g[2].memory, 16_000_000_000);

        let err = parse_simulate_spec("2xZ999").unwrap_err().to_string();
        assert!(
            err.contains("unknown GPU type") && err.contains("A100-40G") && err.contains("T4"),
            "{err}"
        );
        for bad in [
            "",
            "0xA40",
            "4x",
            "A40,",
            "1xFOO:lots",
            "1x:4GiB",
            "100xA40",
        ] {
            assert!(parse_simulate_spec(bad).is_err(), "{bad:?} should fail");
        }
    }

    #[test]
    fn inventory_is_stable_and_uuids_are_unique() {
        let b = SimulatedBackend::from_spec("2xA100-40G,2xA40", 42).unwrap();
        let inv = b.inventory().unwrap();
        assert_eq!(inv, b.inventory().unwrap());
        assert_eq!(inv[3].index, 3);
        let mut uuids: Vec<_> = inv.iter().map(|g| g.uuid.clone()).collect();
        uuids.sort();
        uuids.dedup();
        assert_eq!(uuids.len(), 4);
        let uuid = inv[0].uuid.as_deref().unwrap_or_default();
        assert!(uuid.starts_with("GPU-") && uuid.len() == 40, "{uuid}");
        let other = SimulatedBackend::from_spec("2xA100-40G,2xA40", 43).unwrap();
        assert_ne!(other.inventory().unwrap()[0].uuid, inv[0].uuid);
    }

    #[test]
    fn metrics_follow_assigned_tasks() {
        let b = SimulatedBackend::from_spec("4xA100-40G", 1).unwrap();
        let t0 = Instant::now();
        // Idle: nothing used.
        for s in b.sample_at(t0) {
            assert_eq!(s.util, 0.0);
            assert_eq!(s.mem_used, 0);
            assert_eq!(s.mem_total, 40 * GIB);
        }
        b.set_allocations(&[
            GpuAllocation {
                task_id: "declared".into(),
                gpu_indices: vec![0, 1],
                gpu_memory: Some(10 * GIB),
                since: t0,
                pid: Some(4242),
            },
            GpuAllocation {
                task_id: "whole".into(),
                gpu_indices: vec![2],
                gpu_memory: None,
                since: t0,
                pid: None,
            },
        ]);
        // At the start the ramp has not begun; memory is held at once.
        let s = b.sample_at(t0);
        assert_eq!(s[0].mem_used, 10 * GIB);
        assert_eq!(
            s[0].processes,
            vec![ProcessMemory {
                pid: 4242,
                mem_used: 10 * GIB
            }]
        );
        assert!(s[0].util < 0.05);
        // After the ramp: high utilisation on the held GPUs, none on the free one.
        for secs in [12, 30, 100, 1000] {
            let s = b.sample_at(t0 + Duration::from_secs(secs));
            for (i, g) in s.iter().enumerate().take(3) {
                assert!(
                    (0.83..=1.0).contains(&g.util),
                    "gpu {i} at {secs}s: {}",
                    g.util
                );
            }
            assert_eq!(s[1].mem_used, 10 * GIB);
            assert_eq!(
                s[2].mem_used,
                (40.0 * GIB as f64 * DEFAULT_MEMORY_SHARE) as u64
            );
            assert_eq!(s[3].util, 0.0);
            assert_eq!(s[3].mem_used, 0);
            assert!(s[0].temperature.unwrap() > s[3].temperature.unwrap());
        }
        // Halfway through the ramp utilisation is in between.
        let mid = b.sample_at(t0 + Duration::from_secs(5))[0].util;
        assert!((0.35..0.55).contains(&mid), "{mid}");
        // Deterministic: same seed, same instant, same numbers.
        let again = SimulatedBackend::from_spec("4xA100-40G", 1).unwrap();
        again.set_allocations(&b.allocations.lock().unwrap());
        let at = t0 + Duration::from_secs(77);
        assert_eq!(again.sample_at(at), b.sample_at(at));
        // Back to idle when the tasks end.
        b.set_allocations(&[]);
        assert!(b
            .sample_at(at)
            .iter()
            .all(|s| s.util == 0.0 && s.mem_used == 0));
    }
}
