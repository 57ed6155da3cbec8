//! Turns a submitted `TaskSpecInput` into the normalised `TaskSpec`, or says precisely which
//! field is wrong.

use autodl_common::tasks::{
    CheckpointSpec, Command, OneOrMany, RetryPolicy, Script, TaskKind, TaskSpec, TaskSpecInput,
    WorkerCount,
};

use crate::domain::parse_gpu_type;
use crate::domain::DomainError;

#[cfg(test)]
mod tests;
mod values;

pub use values::{parse_deadline, parse_size, parse_span, parse_time_ms};
use values::{script, text};

const MAX_GPUS_PER_WORKER: u32 = 64;
const MAX_WORKERS: u32 = 64;
const DEFAULT_MEMORY: u64 = 4 << 30;

/// Retries given to `oom_recovery` without `max_retries`: 3 halvings take a batch to an eighth.
pub const DEFAULT_OOM_RETRIES: u32 = 3;

/// Checks a submission and fills in defaults. `now_s` (Unix seconds) judges the deadline.
/// Each part of the spec is checked by a rule of its own below, in the order a person reads
/// the form.
pub fn normalise(input: TaskSpecInput, now_s: i64) -> Result<TaskSpec, DomainError> {
    let name = text("name", &input.name, 128)?;
    let kind = input.kind.unwrap_or_default();
    let image = text("image", &input.image, 512)?;
    let command = command_of(&input, kind)?;
    let ports = ports(&input.ports)?;
    check_env(&input.env)?;
    let Resources {
        gpu_types,
        gpus_per_worker,
        gpu_memory,
        cpu,
        memory,
        num_workers,
        min_workers,
    } = resources_of(&input)?;
    if min_workers.is_some() && kind == TaskKind::Session {
        return Err(DomainError::invalid(
            "num_workers",
            "a session runs a fixed number of workers: give num_workers as a number",
        ));
    }
    let priority = input.priority.unwrap_or(0.5);
    if !priority.is_finite() || !(0.0..=1.0).contains(&priority) {
        return Err(DomainError::invalid(
            "priority",
            "priority must be between 0 and 1",
        ));
    }
    let deadline = deadline_of(input.deadline.as_deref(), now_s)?;
    let estimated_runtime = input
        .estimated_runtime
        .as_ref()
        .map(|s| parse_span("estimated_runtime", s))
        .transpose()?;
    let time_limit = input
        .time_limit
        .as_ref()
        .map(|s| parse_span("time_limit", s))
        .transpose()?;
    let rendezvous_timeout = input
        .rendezvous_timeout
        .as_ref()
        .map(|s| parse_span("rendezvous_timeout", s))
        .transpose()?;
    let after = after_ids(&input.after)?;
    let checkpoint = checkpoint_of(&input)?;
    let retry_policy = retry_policy_of(&input)?;
    let (zone_affinity, bandwidth) = affinity_of(&input)?;
    check_data_path(input.data_path.as_deref())?;
    check_code(input.code.as_deref())?;
    let (setup, requirements) = environment_of(&input)?;
    check_labels(&input.labels)?;
    if input.batch_size == Some(0) {
        return Err(DomainError::invalid(
            "batch_size",
            "batch_size must be at least 1",
        ));
    }
    let global_batch = input.global_batch.unwrap_or(false);
    if global_batch && input.batch_size.is_none() {
        return Err(DomainError::invalid(
            "global_batch",
            "global_batch needs a batch_size to share among the workers",
        ));
    }
    Ok(TaskSpec {
        name,
        image,
        command,
        entry_point: input.entry_point.map(|e| e.trim().to_owned()),
        env: input.env,
        gpu_types,
        gpus_per_worker,
        gpu_memory,
        cpu,
        memory,
        num_workers,
        min_workers,
        launcher: input.launcher.unwrap_or_default(),
        priority,
        deadline,
        estimated_runtime,
        time_limit,
        rendezvous_timeout,
        checkpoint,
        retry_policy,
        zone_affinity,
        bandwidth: bandwidth.to_owned(),
        data_path: input.data_path,
        code: input.code,
        setup,
        requirements,
        labels: input.labels,
        batch_size: input.batch_size,
        global_batch,
        // Someone works in a session: it is not taken away for a checkpoint unless its owner
        // says it may be.
        preemptible: input.preemptible.unwrap_or(kind == TaskKind::Batch),
        after,
        after_when: input.after_when.unwrap_or_default(),
        after_failure: input.after_failure.unwrap_or_default(),
        sweep: None,
        kind,
        ports,
    })
}

/// What the node runs: a shell script, an argument list, or an entry point run with Python
/// (a session may have nothing to run: it waits for its owner's shells).
fn command_of(input: &TaskSpecInput, kind: TaskKind) -> Result<Vec<String>, DomainError> {
    Ok(match (&input.command, &input.entry_point) {
        (Some(_), Some(_)) => {
            return Err(DomainError::invalid(
                "command",
                "give either command or entry_point, not both",
            ))
        }
        (Some(Command::Shell(s)), None) => {
            vec!["/bin/sh".into(), "-c".into(), script("command", s, 16_384)?]
        }
        (Some(Command::Argv(v)), None) => {
            if v.is_empty() || v[0].trim().is_empty() {
                return Err(DomainError::invalid("command", "command must not be empty"));
            }
            if v.len() > 1024 || v.iter().map(String::len).sum::<usize>() > 65_536 {
                return Err(DomainError::invalid("command", "command is too long"));
            }
            v.clone()
        }
        (None, Some(e)) => {
            // A script and its arguments, as a shell would split them.
            let words = shlex::split(&text("entry_point", e, 1024)?)
                .filter(|w| !w.is_empty())
                .ok_or_else(|| {
                    DomainError::invalid(
                        "entry_point",
                        "entry_point is a script and its arguments (\"train.py --epochs 3\"); this one has an unclosed quote",
                    )
                })?;
            std::iter::once("python".to_owned()).chain(words).collect()
        }
        // A session with nothing to run waits for its owner's shells.
        (None, None) if kind == TaskKind::Session => {
            SESSION_COMMAND.iter().map(|s| s.to_string()).collect()
        }
        (None, None) => {
            return Err(DomainError::invalid(
                "command",
                "command or entry_point is required",
            ))
        }
    })
}

/// The task's own environment variables: names a shell can set, none of the platform's.
fn check_env(env: &std::collections::BTreeMap<String, String>) -> Result<(), DomainError> {
    if env.len() > 256 {
        return Err(DomainError::invalid(
            "env",
            "at most 256 environment variables",
        ));
    }
    for (k, v) in env {
        if !crate::domain::names::is_env_name(k) {
            return Err(DomainError::invalid(
                "env",
                format!("{k:?} is not a valid environment variable name"),
            ));
        }
        if k.starts_with("AUTODL_") {
            return Err(DomainError::invalid(
                "env",
                format!("{k} is set by the platform; AUTODL_ names are reserved"),
            ));
        }
        if v.len() > 32_768 {
            return Err(DomainError::invalid(
                "env",
                format!("the value of {k} is too long"),
            ));
        }
    }
    Ok(())
}

/// What a task asks of a node, per worker, and how many workers.
struct Resources {
    gpu_types: Vec<String>,
    gpus_per_worker: u32,
    gpu_memory: Option<u64>,
    cpu: f64,
    memory: u64,
    num_workers: u32,
    min_workers: Option<u32>,
}

fn resources_of(input: &TaskSpecInput) -> Result<Resources, DomainError> {
    let gpu = input.resources.gpu.clone().unwrap_or_default();
    let gpu_types: Vec<String> = match gpu.gpu_type {
        None => vec![],
        Some(OneOrMany::One(t)) => vec![t],
        Some(OneOrMany::Many(v)) => v,
    };
    let gpu_types = gpu_types
        .iter()
        .map(|t| parse_gpu_type("resources.gpu.type", t))
        .collect::<Result<Vec<_>, _>>()?;
    let gpus_per_worker = input.gpu_per_worker.or(gpu.count).unwrap_or(1);
    if gpus_per_worker > MAX_GPUS_PER_WORKER {
        return Err(DomainError::invalid(
            "gpu_per_worker",
            format!("at most {MAX_GPUS_PER_WORKER} GPUs per worker"),
        ));
    }
    let gpu_memory = gpu
        .memory
        .as_ref()
        .map(|m| parse_size("resources.gpu.memory", m))
        .transpose()?;
    if gpu_memory.is_some() && gpus_per_worker == 0 {
        return Err(DomainError::invalid(
            "resources.gpu.memory",
            "GPU memory given for a task without GPUs",
        ));
    }
    let cpu = input.resources.cpu.unwrap_or(1.0);
    if !cpu.is_finite() || cpu <= 0.0 || cpu > 1024.0 {
        return Err(DomainError::invalid(
            "resources.cpu",
            "resources.cpu is a number of cores, more than 0 and at most 1024 (e.g. 8, or 0.5 for half a core)",
        ));
    }
    let memory = match &input.resources.memory {
        Some(m) => parse_size("resources.memory", m)?,
        None => DEFAULT_MEMORY,
    };
    let (min_workers, num_workers) = match input.num_workers.unwrap_or(WorkerCount::Fixed(1)) {
        WorkerCount::Fixed(n) => (None, n),
        WorkerCount::Range(r) => (Some(r.min), r.max),
    };
    if !(1..=MAX_WORKERS).contains(&num_workers) || min_workers.is_some_and(|m| m < 1) {
        return Err(DomainError::invalid(
            "num_workers",
            format!("num_workers must be between 1 and {MAX_WORKERS}"),
        ));
    }
    if min_workers.is_some_and(|m| m > num_workers) {
        return Err(DomainError::invalid(
            "num_workers",
            "num_workers.min must not be above num_workers.max",
        ));
    }
    // A range of one width is that width.
    let min_workers = min_workers.filter(|&m| m < num_workers);
    Ok(Resources {
        gpu_types,
        gpus_per_worker,
        gpu_memory,
        cpu,
        memory,
        num_workers,
        min_workers,
    })
}

/// A deadline, stored as RFC 3339; one already gone is refused.
fn deadline_of(deadline: Option<&str>, now_s: i64) -> Result<Option<String>, DomainError> {
    Ok(match deadline {
        Some(d) => {
            let secs = parse_deadline(d)?;
            // A deadline already gone would give the task the highest urgency for nothing.
            if secs <= now_s {
                return Err(DomainError::invalid(
                    "deadline",
                    format!(
                        "deadline {} is in the past (now is {})",
                        crate::domain::rfc3339(secs * 1000),
                        crate::domain::rfc3339(now_s * 1000)
                    ),
                ));
            }
            Some(crate::domain::rfc3339(secs * 1000))
        }
        None => None,
    })
}

/// How often the task saves, where to, and how many saves are kept.
fn checkpoint_of(input: &TaskSpecInput) -> Result<Option<CheckpointSpec>, DomainError> {
    let checkpoint = input
        .checkpoint
        .as_ref()
        .map(|c| {
            Ok::<_, DomainError>(CheckpointSpec {
                interval: c
                    .interval
                    .as_ref()
                    .map(|s| parse_span("checkpoint.interval", s))
                    .transpose()?,
                save_to: c.save_to.clone(),
                keep: c.keep,
            })
        })
        .transpose()?;
    if let Some(c) = &checkpoint {
        if c.interval.is_some_and(|i| !(10..=7 * 86_400).contains(&i)) {
            return Err(DomainError::invalid(
                "checkpoint.interval",
                "checkpoint.interval must be between 10 s and 7 days (e.g. \"10m\")",
            ));
        }
        if c.keep.is_some_and(|k| !(1..=100).contains(&k)) {
            return Err(DomainError::invalid(
                "checkpoint.keep",
                "checkpoint.keep must be between 1 and 100",
            ));
        }
        if let Some(to) = &c.save_to {
            text("checkpoint.save_to", to, 1024)?;
            if to.split('/').any(|p| p == "..") {
                return Err(DomainError::invalid(
                    "checkpoint.save_to",
                    "checkpoint.save_to must not contain '..'",
                ));
            }
            if to.starts_with('/') {
                autodl_common::tasks::checkpoint_mount_allowed(to).map_err(|m| {
                    DomainError::invalid("checkpoint.save_to", format!("checkpoint.save_to: {m}"))
                })?;
            }
        }
    }
    Ok(checkpoint)
}

fn retry_policy_of(input: &TaskSpecInput) -> Result<RetryPolicy, DomainError> {
    let mut retry_policy: RetryPolicy = input.retry_policy.clone().unwrap_or_default();
    // Asking for OOM recovery is asking for retries: without a count it would never retry.
    if retry_policy.oom_recovery && retry_policy.max_retries == 0 {
        retry_policy.max_retries = DEFAULT_OOM_RETRIES;
    }
    if retry_policy.max_retries > 20 {
        return Err(DomainError::invalid(
            "retry_policy.max_retries",
            "max_retries must be at most 20",
        ));
    }
    Ok(retry_policy)
}

/// Whether the task's workers must share a zone, and the bandwidth they need between them.
fn affinity_of(input: &TaskSpecInput) -> Result<(bool, &'static str), DomainError> {
    let affinity = input.affinity.clone().unwrap_or_default();
    let zone_affinity = match affinity.zone.as_deref() {
        None | Some("any") => false,
        Some("same") => true,
        Some(other) => {
            return Err(DomainError::invalid(
                "affinity.zone",
                format!("affinity.zone is \"same\" or \"any\", not {other:?}"),
            ))
        }
    };
    let bandwidth = match affinity.bandwidth.as_deref() {
        None | Some("normal") => "normal",
        Some("high") => "high",
        Some(other) => {
            return Err(DomainError::invalid(
                "affinity.bandwidth",
                format!("affinity.bandwidth is \"high\" or \"normal\", not {other:?}"),
            ))
        }
    };
    Ok((zone_affinity, bandwidth))
}

/// Platform storage (`s3://`) or a folder under a dataset root of the nodes.
fn check_data_path(data_path: Option<&str>) -> Result<(), DomainError> {
    if let Some(p) = data_path {
        text("data_path", p, 1024)?;
        if p.split('/').any(|s| s == "..") {
            return Err(DomainError::invalid(
                "data_path",
                "data_path must not contain '..'",
            ));
        }
        if !p.starts_with("s3://") && !super::access::is_clean_absolute(p) {
            return Err(DomainError::invalid(
                "data_path",
                "data_path is platform storage (s3://bucket/path) or an absolute folder under a dataset root of the nodes (e.g. /datasets/imagenet)",
            ));
        }
    }
    Ok(())
}

/// A code bundle's id, as `POST /api/v1/code` answered it.
fn check_code(code: Option<&str>) -> Result<(), DomainError> {
    if let Some(c) = code {
        if autodl_common::bundle::parse_id(c).is_none() {
            return Err(DomainError::invalid(
                "code",
                format!(
                    "code is the id POST /api/v1/code answered, \"sha256:\" and 64 hex digits (e.g. \"{}\"), not {c:?}",
                    autodl_common::bundle::id_of(b"")
                ),
            ));
        }
    }
    Ok(())
}

/// The task's environment: a setup script (a list of commands becomes one, a line each) and a
/// requirements file, which is in the task's code since that is all a node unpacks.
fn environment_of(input: &TaskSpecInput) -> Result<(Option<String>, Option<String>), DomainError> {
    let setup = match &input.setup {
        None => None,
        Some(Script::Text(s)) => Some(s.clone()),
        Some(Script::Lines(lines)) => {
            if lines.len() > 64 {
                return Err(DomainError::invalid(
                    "setup",
                    "setup is at most 64 commands; give a longer one as a script (one string)",
                ));
            }
            if let Some(l) = lines.iter().find(|l| l.chars().count() > 255) {
                return Err(DomainError::invalid(
                    "setup",
                    format!("each command of setup is at most 255 characters; give a script as one string instead of {:?}…", l.chars().take(40).collect::<String>()),
                ));
            }
            if let Some(l) = lines.iter().find(|l| l.contains(['\n', '\r'])) {
                return Err(DomainError::invalid(
                    "setup",
                    format!("each command of setup is one line; give a script as one string instead of {l:?}"),
                ));
            }
            Some(lines.join("\n"))
        }
    };
    let setup = match setup {
        Some(s) if s.trim().is_empty() => None,
        Some(s) => Some(script("setup", &s, 16_384)?),
        None => None,
    };
    if input.requirements.is_some() && input.code.is_none() {
        return Err(DomainError::invalid(
            "requirements",
            "requirements names a file in the task's code, and this task has none: give code (autodl run and the SDK upload the working folder)",
        ));
    }
    let requirements = match input.requirements.as_deref() {
        None | Some("") => None,
        Some(r) => {
            let plain = !r.starts_with('/')
                && r.chars().count() <= 512
                && r.split('/').all(|p| !p.is_empty() && p != "." && p != "..")
                && !r.chars().any(char::is_control);
            if !plain {
                return Err(DomainError::invalid(
                    "requirements",
                    format!("requirements is a file in the task's code, as a relative path (\"requirements.txt\", \"env/requirements.txt\"), not {r:?}"),
                ));
            }
            if input.code.is_none() {
                return Err(DomainError::invalid(
                    "requirements",
                    "requirements names a file in the task's code, and this task has none: give code (autodl run and the SDK upload the working folder)",
                ));
            }
            Some(r.to_owned())
        }
    };
    Ok((setup, requirements))
}

fn check_labels(labels: &std::collections::BTreeMap<String, String>) -> Result<(), DomainError> {
    if labels.len() > 32 {
        return Err(DomainError::invalid("labels", "at most 32 labels"));
    }
    for (k, v) in labels {
        if !crate::domain::names::is_label_key(k) {
            return Err(DomainError::invalid(
                "labels",
                format!("{k:?} is not a valid label name"),
            ));
        }
        if v.len() > 256 || v.chars().any(char::is_control) {
            return Err(DomainError::invalid(
                "labels",
                format!("the value of label {k} is too long or has control characters"),
            ));
        }
    }
    Ok(())
}

/// What a node runs for the task. An entry point runs with the image's `python` (`python3`
/// where there is none), once the node found the script where the task starts: a missing one
/// says where it was looked for and how code travels with a task, rather than Python's
/// "can't open file".
pub fn launch_command(spec: &TaskSpec) -> Vec<String> {
    const CHECKED: &str = r#"if [ ! -f "$1" ]; then echo "autodl: the entry point $1 is not in $(pwd): send the folder that holds it with the task (\"workdir\": \".\" in the SDK or the CLI, or a code bundle as \"code\"), or name a script of the image by its full path" >&2; exit 2; fi; if command -v python >/dev/null 2>&1; then exec python "$@"; fi; exec python3 "$@""#;
    match (&spec.entry_point, spec.command.split_first()) {
        (Some(_), Some((python, script_and_args))) if python == "python" => {
            ["/bin/sh", "-c", CHECKED, "autodl-entry-point"]
                .into_iter()
                .map(str::to_owned)
                .chain(script_and_args.iter().cloned())
                .collect()
        }
        _ => spec.command.clone(),
    }
}

/// What a session runs when its owner gave no command: nothing, until someone opens a shell.
pub const SESSION_COMMAND: [&str; 2] = ["sleep", "infinity"];

/// Most ports a task may declare.
const MAX_PORTS: usize = 16;

/// Declared ports, each once, in the order given.
fn ports(list: &[u16]) -> Result<Vec<u16>, DomainError> {
    if list.len() > MAX_PORTS {
        return Err(DomainError::invalid(
            "ports",
            format!("at most {MAX_PORTS} ports (e.g. [8888, 6006])"),
        ));
    }
    let mut out: Vec<u16> = Vec::with_capacity(list.len());
    for &p in list {
        if p == 0 {
            return Err(DomainError::invalid(
                "ports",
                "ports are TCP ports from 1 to 65535 (e.g. [8888, 6006])",
            ));
        }
        if !out.contains(&p) {
            out.push(p);
        }
    }
    Ok(out)
}

/// Most tasks one may wait for: a pipeline's stage waits for a few, a sweep's summary for its
/// trials.
pub const MAX_AFTER: usize = 1_000;

/// The ids in `after`, each once, in the order given.
fn after_ids(ids: &[String]) -> Result<Vec<String>, DomainError> {
    let mut out: Vec<String> = Vec::with_capacity(ids.len());
    for id in ids {
        let id = id.trim();
        if id.is_empty()
            || id.len() > 64
            || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            return Err(DomainError::invalid(
                "after",
                format!("after holds task ids (as the API returns them), not {id:?}"),
            ));
        }
        if !out.iter().any(|o| o == id) {
            out.push(id.to_owned());
        }
    }
    if out.len() > MAX_AFTER {
        return Err(DomainError::invalid(
            "after",
            format!("after names at most {MAX_AFTER} tasks"),
        ));
    }
    Ok(out)
}
