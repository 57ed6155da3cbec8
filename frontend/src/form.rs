//! What the submit form holds, as the text of its inputs, and the request it stands for.
//!
//! Kept apart from the page's signals so that clone and retry can be checked without a
//! browser: any task's spec, turned into a request, put in the form and read back, must ask
//! for the same task (the server's tests check every field).

use std::collections::BTreeMap;

use autodl_common::tasks::{
    Affinity, AfterFailure, AfterWhen, CheckpointInput, Command, GpuRequest, Launcher, OneOrMany,
    Resources, RetryPolicy, Script, Size, TaskKind, TaskSpecInput, TimeSpan, WorkerCount,
};

use crate::api::ApiErr;

/// One value per input of the submit form.
#[derive(Debug, Clone, PartialEq)]
pub struct FormValues {
    pub name: String,
    pub image: String,
    /// A shell script, or (when `argv`) the arguments quoted as a shell would read them.
    pub command: String,
    /// The command came as an argument list, and goes back as one (not through a shell).
    pub argv: bool,
    /// Acceptable GPU types, comma-separated; empty for any.
    pub gpu_type: String,
    /// GPUs per worker.
    pub gpu_count: String,
    pub workers: String,
    /// `workers`, `torchrun` or `none` (see [`Launcher`]).
    pub launcher: String,
    pub gpu_memory: String,
    pub cpu: String,
    pub memory: String,
    pub priority: String,
    pub deadline: String,
    /// Seconds, or text such as "2h30m" (as `time_limit`).
    pub estimated_runtime: String,
    pub time_limit: String,
    /// How long a gang's workers have to meet (as `time_limit`); empty: the platform's default.
    pub rendezvous_timeout: String,
    pub ckpt_interval: String,
    pub ckpt_to: String,
    pub ckpt_keep: String,
    /// Checkpointing asked for even with every checkpoint input empty (platform defaults).
    pub checkpointed: bool,
    pub retries: String,
    pub oom: bool,
    pub zone_same: bool,
    /// "normal" or "high".
    pub bandwidth: String,
    pub data_path: String,
    /// The code bundle (`sha256:...`) the task runs in; set by uploading an archive.
    pub code: String,
    /// Setup commands run once per node for each distinct environment.
    pub setup: String,
    /// A pip requirements file in the code.
    pub requirements: String,
    pub batch_size: String,
    /// The batch size is the global batch, shared among the workers.
    pub global_batch: bool,
    pub preemptible: bool,
    /// Task ids, separated by commas, spaces or lines.
    pub after: String,
    pub after_any: bool,
    pub after_fail: bool,
    /// `KEY=value` lines.
    pub env: String,
    pub labels: String,
    /// An interactive session (a shell, a notebook) rather than a batch job.
    pub session: bool,
    /// Ports the task listens on, separated by commas or spaces.
    pub ports: String,
}

impl Default for FormValues {
    /// A new task's form.
    fn default() -> Self {
        FormValues {
            name: String::new(),
            image: "pytorch/pytorch:2.1".into(),
            command: String::new(),
            argv: false,
            gpu_type: String::new(),
            gpu_count: "1".into(),
            workers: "1".into(),
            launcher: Launcher::default().as_str().into(),
            gpu_memory: String::new(),
            cpu: String::new(),
            memory: String::new(),
            priority: "0.5".into(),
            deadline: String::new(),
            estimated_runtime: String::new(),
            time_limit: String::new(),
            rendezvous_timeout: String::new(),
            ckpt_interval: String::new(),
            ckpt_to: String::new(),
            ckpt_keep: String::new(),
            checkpointed: false,
            retries: "0".into(),
            oom: false,
            zone_same: false,
            bandwidth: "normal".into(),
            data_path: String::new(),
            code: String::new(),
            setup: String::new(),
            requirements: String::new(),
            batch_size: String::new(),
            global_batch: false,
            preemptible: true,
            after: String::new(),
            after_any: false,
            after_fail: false,
            env: String::new(),
            labels: String::new(),
            session: false,
            ports: String::new(),
        }
    }
}

pub fn invalid(field: &str, message: impl Into<String>) -> ApiErr {
    ApiErr {
        status: 400,
        code: "validation".into(),
        message: message.into(),
        field: Some(field.into()),
    }
}

/// `KEY=value` lines; a value is kept exactly as written (spaces are part of it).
fn pairs(text: &str, field: &str) -> Result<BTreeMap<String, String>, ApiErr> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| invalid(field, format!("{:?} is not key=value", line.trim())))?;
        out.insert(k.trim().to_string(), unquote(v));
    }
    Ok(out)
}

/// One `key=value` per line; a value a line cannot hold as typed (a line break, surrounding
/// spaces, a leading quote) is written as a JSON string, which [`unquote`] reads back.
fn lines(m: &BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| {
            let plain = !v.contains(['\n', '\r']) && !v.starts_with('"') && v.trim() == v.as_str();
            if plain {
                format!("{k}={v}")
            } else {
                format!("{k}={}", serde_json::Value::from(v.as_str()))
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A value as typed, or the text of a JSON string (`"two\nlines"`), as `.env` files quote.
fn unquote(v: &str) -> String {
    let t = v.trim();
    if t.len() >= 2 && t.starts_with('"') && t.ends_with('"') {
        if let Ok(s) = serde_json::from_str::<String>(t) {
            return s;
        }
    }
    v.to_string()
}

pub fn opt_num<T: std::str::FromStr>(
    s: &str,
    field: &str,
    what: &str,
) -> Result<Option<T>, ApiErr> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .map_err(|_| invalid(field, format!("{what} must be a number")))
}

/// A length of time as typed: seconds, or text the server reads ("2h30m").
fn span(s: &str) -> Option<TimeSpan> {
    let s = s.trim();
    if s.is_empty() {
        None
    } else if let Ok(n) = s.parse::<u64>() {
        Some(TimeSpan::Seconds(n))
    } else {
        Some(TimeSpan::Text(s.to_string()))
    }
}

fn span_text(s: Option<&TimeSpan>) -> String {
    match s {
        Some(TimeSpan::Seconds(n)) => n.to_string(),
        Some(TimeSpan::Text(t)) => t.clone(),
        None => String::new(),
    }
}

fn size(s: &str) -> Option<Size> {
    let s = s.trim();
    if s.is_empty() {
        None
    } else if let Ok(n) = s.parse::<u64>() {
        Some(Size::Bytes(n))
    } else {
        Some(Size::Text(s.to_string()))
    }
}

fn size_text(s: &Size) -> String {
    match s {
        Size::Text(t) => t.clone(),
        Size::Bytes(b) => {
            const GIB: u64 = 1024 * 1024 * 1024;
            const MIB: u64 = 1024 * 1024;
            if *b > 0 && b % GIB == 0 {
                format!("{}GiB", b / GIB)
            } else if *b > 0 && b % MIB == 0 {
                format!("{}MiB", b / MIB)
            } else {
                b.to_string()
            }
        }
    }
}

/// Workers as a number, or a range such as `2-8` for an elastic task.
fn workers(s: &str) -> Result<Option<WorkerCount>, ApiErr> {
    opt_num(s, "num_workers", "Workers").map_err(|_| {
        invalid(
            "num_workers",
            "Workers must be a number, or a range such as 2-8 for a task that grows and shrinks",
        )
    })
}

fn text_of<T: ToString>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

fn trimmed(s: &str) -> Option<String> {
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

impl FormValues {
    /// The form showing `i` (a clone, a retry, a template).
    pub fn from_input(i: &TaskSpecInput) -> FormValues {
        let (command, argv) = match &i.command {
            Some(Command::Shell(s)) => (s.clone(), false),
            Some(Command::Argv(v)) => (
                shlex::try_join(v.iter().map(String::as_str)).unwrap_or_else(|_| v.join(" ")),
                true,
            ),
            None => (
                i.entry_point
                    .as_ref()
                    .map(|e| format!("python {e}"))
                    .unwrap_or_default(),
                false,
            ),
        };
        let gpu = i.resources.gpu.clone().unwrap_or_default();
        let ck = i.checkpoint.as_ref();
        let retry = i.retry_policy.clone().unwrap_or_default();
        let affinity = i.affinity.clone().unwrap_or_default();
        FormValues {
            name: i.name.clone(),
            image: i.image.clone(),
            command,
            argv,
            gpu_type: match gpu.gpu_type {
                Some(OneOrMany::One(t)) => t,
                Some(OneOrMany::Many(v)) => v.join(","),
                None => String::new(),
            },
            gpu_count: text_of(i.gpu_per_worker.or(gpu.count)),
            workers: text_of(i.num_workers.or(Some(WorkerCount::Fixed(1)))),
            launcher: i.launcher.unwrap_or_default().as_str().into(),
            gpu_memory: gpu.memory.as_ref().map(size_text).unwrap_or_default(),
            cpu: text_of(i.resources.cpu),
            memory: i
                .resources
                .memory
                .as_ref()
                .map(size_text)
                .unwrap_or_default(),
            priority: i.priority.map_or("0.5".into(), |p| p.to_string()),
            deadline: i.deadline.clone().unwrap_or_default(),
            estimated_runtime: span_text(i.estimated_runtime.as_ref()),
            time_limit: span_text(i.time_limit.as_ref()),
            rendezvous_timeout: span_text(i.rendezvous_timeout.as_ref()),
            ckpt_interval: span_text(ck.and_then(|c| c.interval.as_ref())),
            ckpt_to: ck.and_then(|c| c.save_to.clone()).unwrap_or_default(),
            ckpt_keep: text_of(ck.and_then(|c| c.keep)),
            checkpointed: ck.is_some(),
            retries: retry.max_retries.to_string(),
            oom: retry.oom_recovery,
            zone_same: affinity.zone.as_deref() == Some("same"),
            bandwidth: affinity.bandwidth.unwrap_or_else(|| "normal".into()),
            data_path: i.data_path.clone().unwrap_or_default(),
            code: i.code.clone().unwrap_or_default(),
            setup: match &i.setup {
                Some(Script::Text(s)) => s.clone(),
                Some(Script::Lines(l)) => l.join("\n"),
                None => String::new(),
            },
            requirements: i.requirements.clone().unwrap_or_default(),
            batch_size: text_of(i.batch_size),
            global_batch: i.global_batch.unwrap_or(false),
            preemptible: i.preemptible.unwrap_or(true),
            after: i.after.join(", "),
            after_any: i.after_when == Some(AfterWhen::Any),
            after_fail: i.after_failure == Some(AfterFailure::Fail),
            env: lines(&i.env),
            labels: lines(&i.labels),
            session: i.kind == Some(TaskKind::Session),
            ports: i
                .ports
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        }
    }

    /// The request the form describes, or the first input that cannot be read.
    pub fn to_input(&self) -> Result<TaskSpecInput, ApiErr> {
        let command = if self.command.trim().is_empty() {
            None
        } else if self.argv {
            let args = shlex::split(&self.command).ok_or_else(|| {
                invalid("command", "the command has an unclosed quote or a stray \\")
            })?;
            Some(Command::Argv(args))
        } else {
            Some(Command::Shell(self.command.clone()))
        };
        let types: Vec<String> = self
            .gpu_type
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .collect();
        let interval = span(&self.ckpt_interval);
        let keep: Option<u32> = opt_num(&self.ckpt_keep, "checkpoint.keep", "Checkpoints kept")?;
        let save_to = trimmed(&self.ckpt_to);
        Ok(TaskSpecInput {
            name: self.name.trim().to_string(),
            image: self.image.trim().to_string(),
            command,
            entry_point: None,
            env: pairs(&self.env, "env")?,
            resources: Resources {
                gpu: Some(GpuRequest {
                    gpu_type: match types.len() {
                        0 => None,
                        1 => Some(OneOrMany::One(types[0].clone())),
                        _ => Some(OneOrMany::Many(types)),
                    },
                    count: opt_num(&self.gpu_count, "resources.gpu.count", "GPU count")?,
                    memory: size(&self.gpu_memory),
                }),
                cpu: opt_num(&self.cpu, "resources.cpu", "CPU cores")?,
                memory: size(&self.memory),
            },
            num_workers: workers(&self.workers)?,
            gpu_per_worker: None,
            launcher: match self.launcher.as_str() {
                "torchrun" => Some(Launcher::Torchrun),
                "none" => Some(Launcher::None),
                _ => None,
            },
            priority: opt_num(&self.priority, "priority", "Priority")?,
            deadline: trimmed(&self.deadline),
            estimated_runtime: span(&self.estimated_runtime),
            time_limit: span(&self.time_limit),
            rendezvous_timeout: span(&self.rendezvous_timeout),
            checkpoint: (self.checkpointed
                || interval.is_some()
                || save_to.is_some()
                || keep.is_some())
            .then_some(CheckpointInput {
                interval,
                save_to,
                keep,
            }),
            retry_policy: Some(RetryPolicy {
                max_retries: opt_num(&self.retries, "retry_policy.max_retries", "Retries")?
                    .unwrap_or(0),
                oom_recovery: self.oom,
            }),
            affinity: Some(Affinity {
                zone: Some(if self.zone_same { "same" } else { "any" }.into()),
                bandwidth: trimmed(&self.bandwidth),
            }),
            data_path: trimmed(&self.data_path),
            code: trimmed(&self.code),
            setup: trimmed(&self.setup).map(Script::Text),
            requirements: trimmed(&self.requirements),
            labels: pairs(&self.labels, "labels")?,
            batch_size: opt_num(&self.batch_size, "batch_size", "Batch size")?,
            global_batch: self.global_batch.then_some(true),
            preemptible: Some(self.preemptible),
            after: self
                .after
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|id| !id.is_empty())
                .map(str::to_owned)
                .collect(),
            after_when: Some(if self.after_any {
                AfterWhen::Any
            } else {
                AfterWhen::Ok
            }),
            after_failure: Some(if self.after_fail {
                AfterFailure::Fail
            } else {
                AfterFailure::Cancel
            }),
            kind: Some(if self.session {
                TaskKind::Session
            } else {
                TaskKind::Batch
            }),
            ports: self
                .ports
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|p| !p.is_empty())
                .map(|p| {
                    p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
                        invalid(
                            "ports",
                            "ports are numbers from 1 to 65535, e.g. 8888, 6006",
                        )
                    })
                })
                .collect::<Result<_, _>>()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_arguments_survive_the_form() {
        let input = TaskSpecInput {
            command: Some(Command::Argv(vec![
                "python".into(),
                "train.py".into(),
                "--note".into(),
                "two words".into(),
                "it's".into(),
            ])),
            ..FormValues::default().to_input().unwrap()
        };
        let back = FormValues::from_input(&input).to_input().unwrap();
        assert_eq!(back.command, input.command);
    }

    #[test]
    fn an_unclosed_quote_is_a_field_error() {
        let form = FormValues {
            command: "python 'train.py".into(),
            argv: true,
            ..FormValues::default()
        };
        assert_eq!(
            form.to_input().unwrap_err().field.as_deref(),
            Some("command")
        );
    }
}
