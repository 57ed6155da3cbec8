//! `nvidia-smi` for simulated GPUs: what a task on a demo node runs to see the GPUs it holds.
//!
//! A node with simulated GPUs has no NVIDIA driver, so the real tool is absent and a README's
//! `autodl exec TASK -- nvidia-smi` would say `not found`. The agent writes each attempt's GPUs
//! as its simulated backend last read them ([`SmiState`], a file beside the attempt, never the
//! task's to change), and the agent's own program answers as `nvidia-smi` (called by that
//! name) from that file: the usual table, `-L`, `--query-gpu ... --format=csv`, `-i`, `-l`. It
//! says in its header that the GPUs are simulated, so nobody takes the numbers for hardware's.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// The variable naming the state file, set for every task on a simulated node.
pub const STATE_VAR: &str = "AUTODL_SIMULATED_GPUS";
/// The state file's name in its folder.
pub const STATE_FILE: &str = "gpus.json";
/// The name the program answers to.
pub const PROGRAM: &str = "nvidia-smi";

/// An attempt's GPUs as the task sees them (numbered from 0, as `CUDA_VISIBLE_DEVICES` makes
/// them), when they were read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SmiState {
    /// RFC 3339.
    pub at: String,
    pub gpus: Vec<SmiGpu>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SmiGpu {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    /// Bytes.
    pub memory_total: u64,
    pub memory_used: u64,
    /// In [0, 1].
    pub util: f64,
    pub temperature: Option<u32>,
    pub power_w: Option<f64>,
}

/// What one call prints, and its exit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Answer {
    fn out(stdout: String) -> Self {
        Answer {
            code: 0,
            stdout,
            stderr: String::new(),
        }
    }

    fn fail(code: i32, stderr: String) -> Self {
        Answer {
            code,
            stdout: String::new(),
            stderr,
        }
    }
}

/// What the arguments ask for.
#[derive(Debug, Clone, PartialEq, Default)]
struct Request {
    list: bool,
    help: bool,
    ids: Option<Vec<String>>,
    query: Option<Vec<String>>,
    format: Option<Format>,
    loop_s: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Format {
    header: bool,
    units: bool,
}

fn usage() -> String {
    "nvidia-smi (simulated by autodl: this node's GPUs are simulated)\n\n\
     nvidia-smi [OPTION...]\n\
     \x20 -L, --list-gpus          list the GPUs\n\
     \x20 -i, --id=ID[,ID]         only these GPUs (index or UUID)\n\
     \x20 -l, --loop=SEC           repeat every SEC seconds\n\
     \x20 --query-gpu=FIELD[,...]  one line per GPU with these fields\n\
     \x20 --format=csv[,noheader][,nounits]\n\
     Fields: timestamp, count, index, name, uuid, pci.bus_id, driver_version, memory.total,\n\
     \x20 memory.used, memory.free, utilization.gpu, temperature.gpu, power.draw\n"
        .to_owned()
}

fn invalid(what: &str) -> Answer {
    Answer::fail(2, format!("{what}\nPlease run 'nvidia-smi -h' for help.\n"))
}

fn parse(args: &[String]) -> Result<Request, Answer> {
    let mut r = Request::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_owned())),
            _ => (a.as_str(), None),
        };
        let mut value = |name: &str| -> Result<String, Answer> {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| invalid(&format!("Option {name} needs a value.")))
        };
        match flag {
            "-h" | "--help" => r.help = true,
            "-L" | "--list-gpus" => r.list = true,
            "-i" | "--id" => {
                r.ids = Some(
                    value(flag)?
                        .split(',')
                        .map(|s| s.trim().to_owned())
                        .collect(),
                )
            }
            "-l" | "--loop" => {
                let v = value(flag)?;
                r.loop_s = Some(
                    v.parse::<u64>()
                        .ok()
                        .filter(|s| *s > 0)
                        .ok_or_else(|| invalid(&format!("Invalid loop interval \"{v}\".")))?,
                );
            }
            "--query-gpu" => {
                r.query = Some(
                    value(flag)?
                        .split(',')
                        .map(|s| s.trim().to_owned())
                        .filter(|s| !s.is_empty())
                        .collect(),
                )
            }
            "--format" => {
                let v = value(flag)?;
                let mut parts = v.split(',').map(str::trim);
                if parts.next() != Some("csv") {
                    return Err(invalid(&format!(
                        "Invalid format \"{v}\": only csv is known."
                    )));
                }
                let mut f = Format {
                    header: true,
                    units: true,
                };
                for p in parts {
                    match p {
                        "noheader" => f.header = false,
                        "nounits" => f.units = false,
                        other => {
                            return Err(invalid(&format!("Invalid format option \"{other}\".")))
                        }
                    }
                }
                r.format = Some(f);
            }
            other => {
                return Err(invalid(&format!(
                    "Option \"{other}\" is not known to this simulated nvidia-smi."
                )))
            }
        }
    }
    if r.query.is_some() != r.format.is_some() {
        return Err(invalid("--query-gpu and --format=csv go together."));
    }
    Ok(r)
}

/// The answer to `args` from `state` (`None`: the agent has not written it, or the node has
/// no GPUs for this task).
pub fn answer(args: &[String], state: Option<&SmiState>) -> Answer {
    let r = match parse(args) {
        Ok(r) => r,
        Err(a) => return a,
    };
    if r.help {
        return Answer::out(usage());
    }
    let Some(state) = state else {
        return Answer::fail(
            9,
            "NVIDIA-SMI has failed because this task holds no GPUs (simulated by autodl).\n".into(),
        );
    };
    let gpus: Vec<&SmiGpu> = match &r.ids {
        None => state.gpus.iter().collect(),
        Some(ids) => {
            let mut out = Vec::new();
            for id in ids {
                match state
                    .gpus
                    .iter()
                    .find(|g| g.index.to_string() == *id || g.uuid == *id)
                {
                    Some(g) => out.push(g),
                    None => {
                        return Answer::fail(
                            6,
                            format!("No devices were found with the ID \"{id}\".\n"),
                        )
                    }
                }
            }
            out
        }
    };
    if gpus.is_empty() {
        return Answer::fail(6, "No devices were found\n".into());
    }
    if r.list {
        let mut s = String::new();
        for g in &gpus {
            let _ = writeln!(s, "GPU {}: {} (UUID: {})", g.index, g.name, g.uuid);
        }
        return Answer::out(s);
    }
    match (&r.query, r.format) {
        (Some(fields), Some(f)) => query(fields, f, state, &gpus),
        _ => Answer::out(table(state, &gpus)),
    }
}

const MIB: u64 = 1 << 20;

fn query(fields: &[String], f: Format, state: &SmiState, gpus: &[&SmiGpu]) -> Answer {
    let mut columns = Vec::new();
    for name in fields {
        match column(name) {
            Some(c) => columns.push((name.as_str(), c)),
            None => {
                return Answer::fail(
                    2,
                    format!("Field \"{name}\" is not a valid field to query.\n"),
                )
            }
        }
    }
    let mut s = String::new();
    if f.header {
        let head: Vec<String> = columns
            .iter()
            .map(|(name, c)| match (c.unit, f.units) {
                (Some(u), true) => format!("{name} [{u}]"),
                _ => (*name).to_owned(),
            })
            .collect();
        let _ = writeln!(s, "{}", head.join(", "));
    }
    for g in gpus {
        let cells: Vec<String> = columns
            .iter()
            .map(|(_, c)| match ((c.value)(state, g), c.unit) {
                (None, _) => "[N/A]".to_owned(),
                (Some(v), Some(u)) if f.units => format!("{v} {u}"),
                (Some(v), _) => v,
            })
            .collect();
        let _ = writeln!(s, "{}", cells.join(", "));
    }
    Answer::out(s)
}

struct Column {
    unit: Option<&'static str>,
    value: fn(&SmiState, &SmiGpu) -> Option<String>,
}

fn column(name: &str) -> Option<Column> {
    let c = |unit, value| Some(Column { unit, value });
    match name {
        "timestamp" => c(None, |s, _| Some(timestamp(&s.at))),
        "count" => c(None, |s, _| Some(s.gpus.len().to_string())),
        "index" => c(None, |_, g| Some(g.index.to_string())),
        "name" | "gpu_name" => c(None, |_, g| Some(g.name.clone())),
        "uuid" | "gpu_uuid" => c(None, |_, g| Some(g.uuid.clone())),
        "pci.bus_id" | "gpu_bus_id" => c(None, |_, g| Some(bus_id(g.index))),
        "driver_version" => c(None, |_, _| Some("simulated".into())),
        "memory.total" => c(Some("MiB"), |_, g| Some((g.memory_total / MIB).to_string())),
        "memory.used" => c(Some("MiB"), |_, g| Some((g.memory_used / MIB).to_string())),
        "memory.free" => c(Some("MiB"), |_, g| {
            Some((g.memory_total.saturating_sub(g.memory_used) / MIB).to_string())
        }),
        "utilization.gpu" => c(Some("%"), |_, g| Some(percent(g.util).to_string())),
        "temperature.gpu" => c(None, |_, g| g.temperature.map(|t| t.to_string())),
        "power.draw" => c(Some("W"), |_, g| g.power_w.map(|w| format!("{w:.2}"))),
        _ => None,
    }
}

fn percent(util: f64) -> u32 {
    (util.clamp(0.0, 1.0) * 100.0).round() as u32
}

fn bus_id(index: u32) -> String {
    format!("00000000:{:02X}:00.0", 0x10 + index)
}

fn parsed(at: &str) -> Option<time::OffsetDateTime> {
    time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339).ok()
}

/// `2026/12/07 21:15:02.000`, as nvidia-smi prints its time.
fn timestamp(at: &str) -> String {
    parsed(at)
        .and_then(|t| {
            t.format(time::macros::format_description!(
                "[year]/[month]/[day] [hour]:[minute]:[second].[subsecond digits:3]"
            ))
            .ok()
        })
        .unwrap_or_else(|| at.to_owned())
}

fn table(state: &SmiState, gpus: &[&SmiGpu]) -> String {
    const WIDTH: usize = 79;
    let line = |s: &mut String, text: &str| {
        let _ = writeln!(s, "| {text:<width$}|", width = WIDTH - 3);
    };
    let rule = "+".to_owned() + &"-".repeat(WIDTH - 2) + "+";
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{}",
        parsed(&state.at)
            .and_then(|t| {
                t.format(time::macros::format_description!(
                    "[weekday repr:short] [month repr:short] [day padding:space] [hour]:[minute]:[second] [year]"
                ))
                .ok()
            })
            .unwrap_or_else(|| state.at.clone())
    );
    let _ = writeln!(s, "{rule}");
    line(
        &mut s,
        "NVIDIA-SMI simulated by autodl   Driver Version: none   CUDA Version: none",
    );
    line(
        &mut s,
        "These GPUs are simulated: no device or driver is here.",
    );
    let cols = "|-------------------------------+----------------------+----------------------|";
    let _ = writeln!(s, "{cols}");
    let _ = writeln!(
        s,
        "| GPU  Name                     | Bus-Id               | GPU-Util  Temp  Pwr  |"
    );
    let _ = writeln!(
        s,
        "|                               |         Memory-Usage |                      |"
    );
    let _ = writeln!(
        s,
        "|===============================+======================+======================|"
    );
    for (n, g) in gpus.iter().enumerate() {
        if n > 0 {
            let _ = writeln!(s, "{cols}");
        }
        let name: String = g.name.chars().take(24).collect();
        let temp = g.temperature.map_or("N/A".to_owned(), |t| format!("{t}C"));
        let power = g.power_w.map_or("N/A".to_owned(), |w| format!("{w:.0}W"));
        let _ = writeln!(
            s,
            "| {:>3}  {:<24} | {:>20} | {:>7}%  {:>4}  {:>4} |",
            g.index,
            name,
            bus_id(g.index),
            percent(g.util),
            temp,
            power
        );
        let memory = format!("{}MiB / {}MiB", g.memory_used / MIB, g.memory_total / MIB);
        let _ = writeln!(s, "| {:<29} | {memory:>20} | {:<20} |", "", "");
    }
    let _ = writeln!(s, "{rule}");
    let _ = writeln!(s);
    let _ = writeln!(s, "{rule}");
    line(&mut s, "Processes:");
    line(
        &mut s,
        " GPU   PID   Process name                          GPU Memory",
    );
    let _ = writeln!(s, "|{}|", "=".repeat(WIDTH - 2));
    line(&mut s, " No processes are shown for simulated GPUs");
    let _ = writeln!(s, "{rule}");
    s
}

/// Reads the state file named by [`STATE_VAR`].
pub fn read_state() -> Option<SmiState> {
    let path = std::env::var_os(STATE_VAR)?;
    let text = std::fs::read(path).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Runs as `nvidia-smi` when the process was called by that name (the agent's program shown
/// to a task under it), and exits; returns otherwise. Call first in `main`.
pub fn run_if_called() {
    let mut args = std::env::args_os();
    let called = args
        .next()
        .as_deref()
        .map(std::path::Path::new)
        .and_then(std::path::Path::file_name)
        .is_some_and(|n| n == PROGRAM);
    if !called {
        return;
    }
    let args: Vec<String> = args.map(|a| a.to_string_lossy().into_owned()).collect();
    let loop_s = parse(&args).ok().and_then(|r| r.loop_s);
    loop {
        let a = answer(&args, read_state().as_ref());
        print!("{}", a.stdout);
        eprint!("{}", a.stderr);
        match loop_s {
            Some(s) if a.code == 0 => {
                println!();
                std::thread::sleep(std::time::Duration::from_secs(s));
            }
            _ => std::process::exit(a.code),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> SmiState {
        SmiState {
            at: "2026-12-07T21:15:02Z".into(),
            gpus: vec![
                SmiGpu {
                    index: 0,
                    name: "NVIDIA A40".into(),
                    uuid: "GPU-sim-a".into(),
                    memory_total: 46_068 * MIB,
                    memory_used: 1_234 * MIB,
                    util: 0.87,
                    temperature: Some(61),
                    power_w: Some(212.4),
                },
                SmiGpu {
                    index: 1,
                    name: "NVIDIA A40".into(),
                    uuid: "GPU-sim-b".into(),
                    memory_total: 46_068 * MIB,
                    memory_used: 0,
                    util: 0.0,
                    temperature: None,
                    power_w: None,
                },
            ],
        }
    }

    fn run(args: &[&str]) -> Answer {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        answer(&args, Some(&state()))
    }

    #[test]
    fn lists_and_queries_as_scripts_expect() {
        assert_eq!(
            run(&["-L"]).stdout,
            "GPU 0: NVIDIA A40 (UUID: GPU-sim-a)\nGPU 1: NVIDIA A40 (UUID: GPU-sim-b)\n"
        );
        let a = run(&[
            "--query-gpu=index,name,memory.used,memory.total,utilization.gpu,power.draw",
            "--format=csv",
        ]);
        assert_eq!(
            a.stdout,
            "index, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%], power.draw [W]\n\
             0, NVIDIA A40, 1234 MiB, 46068 MiB, 87 %, 212.40 W\n\
             1, NVIDIA A40, 0 MiB, 46068 MiB, 0 %, [N/A]\n"
        );
        let a = run(&[
            "--query-gpu",
            "memory.free,temperature.gpu,count",
            "--format=csv,noheader,nounits",
            "-i",
            "0",
        ]);
        assert_eq!(a.stdout, "44834, 61, 2\n");
        assert_eq!(
            run(&["-i", "GPU-sim-b", "-L"]).stdout,
            "GPU 1: NVIDIA A40 (UUID: GPU-sim-b)\n"
        );
    }

    #[test]
    fn the_table_says_the_gpus_are_simulated() {
        let a = run(&[]);
        assert_eq!(a.code, 0);
        assert!(a.stdout.contains("simulated by autodl"), "{}", a.stdout);
        assert!(a.stdout.contains("1234MiB / 46068MiB"), "{}", a.stdout);
        assert!(a.stdout.contains("87%"), "{}", a.stdout);
        let widths: std::collections::BTreeSet<usize> = a
            .stdout
            .lines()
            .skip(1)
            .filter(|l| !l.is_empty())
            .map(|l| l.chars().count())
            .collect();
        assert_eq!(widths.len(), 1, "ragged table:\n{}", a.stdout);
    }

    #[test]
    fn bad_requests_are_said_with_nvidia_smi_s_codes() {
        assert_eq!(run(&["--query-gpu=nope", "--format=csv"]).code, 2);
        assert_eq!(run(&["--query-gpu=index"]).code, 2);
        assert_eq!(run(&["--format=json", "--query-gpu=index"]).code, 2);
        assert_eq!(run(&["-q"]).code, 2);
        assert_eq!(run(&["-i", "7"]).code, 6);
        assert_eq!(run(&["-l", "0"]).code, 2);
        assert_eq!(answer(&[], None).code, 9);
        assert!(run(&["-h"]).stdout.contains("simulated"));
    }
}
