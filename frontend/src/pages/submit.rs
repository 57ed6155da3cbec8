//! The submit form (`/submit`): every task field, inline errors from the API, and the same
//! request as Python and as a CLI task file, updated as you type. `?from=ID` prefills it from a
//! task (clone); templates are kept in the browser's localStorage.

use std::collections::BTreeMap;

use autodl_common::tasks::{
    Affinity, CheckpointSpec, Command, GpuRequest, NodeInfo, OneOrMany, Resources, RetryPolicy,
    Size, Task, TaskSpecInput,
};
use leptos::prelude::*;
use leptos_router::hooks::{use_navigate, use_query_map};
use serde_json::Value;

use super::cluster::IsolationNotice;
use super::tasks::spec_to_input;
use crate::api::{self, ApiErr};
use crate::app::{general_error, Field, RequireLogin};
use crate::live;

const TEMPLATES_KEY: &str = "autodl.templates";

#[component]
pub fn SubmitPage() -> impl IntoView {
    view! { <RequireLogin><SubmitForm/></RequireLogin> }
}

/// The form's state, one signal per input.
#[derive(Clone, Copy)]
struct Form {
    name: RwSignal<String>,
    image: RwSignal<String>,
    command: RwSignal<String>,
    gpu_type: RwSignal<String>,
    gpu_count: RwSignal<String>,
    gpu_memory: RwSignal<String>,
    cpu: RwSignal<String>,
    memory: RwSignal<String>,
    priority: RwSignal<String>,
    deadline: RwSignal<String>,
    ckpt_interval: RwSignal<String>,
    ckpt_to: RwSignal<String>,
    retries: RwSignal<String>,
    oom: RwSignal<bool>,
    zone_same: RwSignal<bool>,
    env: RwSignal<String>,
    labels: RwSignal<String>,
}

fn invalid(field: &str, message: impl Into<String>) -> ApiErr {
    ApiErr {
        status: 400,
        code: "validation".into(),
        message: message.into(),
        field: Some(field.into()),
    }
}

fn pairs(text: &str, field: &str) -> Result<BTreeMap<String, String>, ApiErr> {
    let mut out = BTreeMap::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| invalid(field, format!("{line:?} is not key=value")))?;
        out.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(out)
}

fn opt_num<T: std::str::FromStr>(s: &str, field: &str, what: &str) -> Result<Option<T>, ApiErr> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .map_err(|_| invalid(field, format!("{what} must be a number")))
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
            if b % GIB == 0 {
                format!("{}GiB", b / GIB)
            } else if b % MIB == 0 {
                format!("{}MiB", b / MIB)
            } else {
                b.to_string()
            }
        }
    }
}

impl Form {
    fn new() -> Self {
        let s = |v: &str| RwSignal::new(v.to_string());
        Form {
            name: s(""),
            image: s("pytorch/pytorch:2.1"),
            command: s(""),
            gpu_type: s(""),
            gpu_count: s("1"),
            gpu_memory: s(""),
            cpu: s(""),
            memory: s(""),
            priority: s("0.5"),
            deadline: s(""),
            ckpt_interval: s(""),
            ckpt_to: s(""),
            retries: s("0"),
            oom: RwSignal::new(false),
            zone_same: RwSignal::new(false),
            env: s(""),
            labels: s(""),
        }
    }

    /// The request the form describes, or the first field that cannot be read.
    fn build(&self) -> Result<TaskSpecInput, ApiErr> {
        let command = self.command.get();
        let gpu_type = self.gpu_type.get();
        let interval: Option<u64> = opt_num(
            &self.ckpt_interval.get(),
            "checkpoint.interval",
            "The interval",
        )?;
        let save_to = self.ckpt_to.get().trim().to_string();
        let deadline = self.deadline.get().trim().to_string();
        Ok(TaskSpecInput {
            name: self.name.get().trim().to_string(),
            image: self.image.get().trim().to_string(),
            command: (!command.trim().is_empty()).then(|| Command::Shell(command.clone())),
            entry_point: None,
            env: pairs(&self.env.get(), "env")?,
            resources: Resources {
                gpu: Some(GpuRequest {
                    gpu_type: (!gpu_type.is_empty()).then_some(OneOrMany::One(gpu_type)),
                    count: opt_num(&self.gpu_count.get(), "resources.gpu.count", "GPU count")?,
                    memory: size(&self.gpu_memory.get()),
                }),
                cpu: opt_num(&self.cpu.get(), "resources.cpu", "CPU cores")?,
                memory: size(&self.memory.get()),
            },
            num_workers: None,
            gpu_per_worker: None,
            priority: opt_num(&self.priority.get(), "priority", "Priority")?,
            deadline: (!deadline.is_empty()).then_some(deadline),
            estimated_runtime: None,
            checkpoint: (interval.is_some() || !save_to.is_empty()).then(|| CheckpointSpec {
                interval,
                save_to: (!save_to.is_empty()).then_some(save_to),
                keep: None,
            }),
            retry_policy: Some(RetryPolicy {
                max_retries: opt_num(&self.retries.get(), "retry_policy.max_retries", "Retries")?
                    .unwrap_or(0),
                oom_recovery: self.oom.get(),
            }),
            affinity: self.zone_same.get().then(|| Affinity {
                zone: Some("same".into()),
                bandwidth: None,
            }),
            data_path: None,
            labels: pairs(&self.labels.get(), "labels")?,
            batch_size: None,
            preemptible: None,
        })
    }

    fn fill(&self, i: &TaskSpecInput) {
        self.name.set(i.name.clone());
        self.image.set(i.image.clone());
        self.command.set(match &i.command {
            Some(Command::Shell(s)) => s.clone(),
            Some(Command::Argv(v)) => v.join(" "),
            None => i
                .entry_point
                .as_ref()
                .map(|e| format!("python {e}"))
                .unwrap_or_default(),
        });
        let gpu = i.resources.gpu.clone().unwrap_or_default();
        self.gpu_type.set(match gpu.gpu_type {
            Some(OneOrMany::One(t)) => t,
            Some(OneOrMany::Many(v)) => v.first().cloned().unwrap_or_default(),
            None => String::new(),
        });
        self.gpu_count
            .set(gpu.count.map(|c| c.to_string()).unwrap_or_default());
        self.gpu_memory
            .set(gpu.memory.as_ref().map(size_text).unwrap_or_default());
        self.cpu
            .set(i.resources.cpu.map(|c| c.to_string()).unwrap_or_default());
        self.memory.set(
            i.resources
                .memory
                .as_ref()
                .map(size_text)
                .unwrap_or_default(),
        );
        self.priority
            .set(i.priority.map(|p| p.to_string()).unwrap_or("0.5".into()));
        self.deadline.set(i.deadline.clone().unwrap_or_default());
        let ck = i.checkpoint.clone();
        self.ckpt_interval.set(
            ck.as_ref()
                .and_then(|c| c.interval)
                .map(|n| n.to_string())
                .unwrap_or_default(),
        );
        self.ckpt_to
            .set(ck.and_then(|c| c.save_to).unwrap_or_default());
        let rp = i.retry_policy.clone().unwrap_or_default();
        self.retries.set(rp.max_retries.to_string());
        self.oom.set(rp.oom_recovery);
        self.zone_same.set(
            i.affinity
                .as_ref()
                .and_then(|a| a.zone.as_deref())
                .is_some_and(|z| z == "same"),
        );
        let kv = |m: &BTreeMap<String, String>| {
            m.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        self.env.set(kv(&i.env));
        self.labels.set(kv(&i.labels));
    }
}

/// The request as JSON without nulls and empty objects.
fn clean(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, v)| (k, clean(v)))
                .filter(|(_, v)| !v.is_null() && !matches!(v, Value::Object(o) if o.is_empty()))
                .collect(),
        ),
        other => other,
    }
}

fn python(v: &Value, indent: usize) -> String {
    let pad = "    ".repeat(indent + 1);
    let end = "    ".repeat(indent);
    match v {
        Value::Null => "None".into(),
        Value::Bool(b) => if *b { "True" } else { "False" }.into(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => serde_json::to_string(s).unwrap_or_default(),
        Value::Array(a) => format!(
            "[{}]",
            a.iter()
                .map(|x| python(x, indent))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Value::Object(m) => {
            let body = m
                .iter()
                .map(|(k, x)| {
                    format!(
                        "{pad}{}: {},\n",
                        serde_json::to_string(k).unwrap_or_default(),
                        python(x, indent + 1)
                    )
                })
                .collect::<String>();
            format!("{{\n{body}{end}}}")
        }
    }
}

fn yaml(v: &Value, indent: usize, out: &mut String) {
    let pad = "  ".repeat(indent);
    if let Value::Object(m) = v {
        for (k, x) in m {
            match x {
                Value::Object(_) => {
                    out.push_str(&format!("{pad}{k}:\n"));
                    yaml(x, indent + 1, out);
                }
                other => out.push_str(&format!("{pad}{k}: {}\n", other)),
            }
        }
    }
}

fn load_templates() -> BTreeMap<String, TaskSpecInput> {
    live::load_local(TEMPLATES_KEY)
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default()
}

#[component]
fn SubmitForm() -> impl IntoView {
    let form = Form::new();
    let error = RwSignal::new(None::<ApiErr>);
    let navigate = use_navigate();
    let query = use_query_map();
    let nodes = Resource::new(|| (), |_| api::get::<Vec<NodeInfo>>("/api/v1/nodes"));
    // Clone: prefill from ?from=ID.
    let from = Memo::new(move |_| query.with(|q| q.get("from")));
    let source = Resource::new(
        move || from.get(),
        |from| async move {
            match from {
                Some(id) => api::get::<Task>(&format!("/api/v1/tasks/{id}")).await.ok(),
                None => None,
            }
        },
    );
    Effect::new(move |_| {
        if let Some(Some(t)) = source.get() {
            let mut input = spec_to_input(&t.spec);
            input.name = format!("{} (copy)", t.name);
            form.fill(&input);
        }
    });
    let templates = RwSignal::new(BTreeMap::<String, TaskSpecInput>::new());
    Effect::new(move |_| templates.set(load_templates()));
    let template_name = RwSignal::new(String::new());

    let built = Memo::new(move |_| form.build());
    let json = Memo::new(move |_| {
        built
            .get()
            .ok()
            .and_then(|b| serde_json::to_value(b).ok())
            .map(clean)
    });
    // An answer from the server is about what was sent: editing the form clears it.
    Effect::new(move |prev: Option<()>| {
        built.track();
        if prev.is_some() {
            error.set(None);
        }
    });
    let submit = Action::new_local(move |body: &Value| {
        let body = body.clone();
        async move { api::post::<_, Task>("/api/v1/tasks", &body).await }
    });
    Effect::new(move |_| match submit.value().get() {
        Some(Ok(t)) => navigate(&format!("/tasks/{}", t.id), Default::default()),
        Some(Err(e)) => error.set(Some(e)),
        None => {}
    });
    let on_submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        match built.get_untracked() {
            Ok(input) => {
                error.set(None);
                let body = serde_json::to_value(input)
                    .map(clean)
                    .unwrap_or(Value::Null);
                submit.dispatch(body);
            }
            Err(e) => error.set(Some(e)),
        }
    };
    let ferr = move |f: &'static str| {
        Signal::derive(move || {
            error
                .get()
                .and_then(|e| e.for_field(f))
                .or_else(|| built.get().err().and_then(|e| e.for_field(f)))
        })
    };
    let gpu_types = move || {
        let mut types: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        for n in nodes.get().and_then(|r| r.ok()).unwrap_or_default() {
            for g in &n.gpus {
                let e = types.entry(g.gpu_type.clone()).or_default();
                e.1 += 1;
                if n.schedulable && g.tasks.is_empty() {
                    e.0 += 1;
                }
            }
        }
        types
    };
    let save_template = move |_| {
        let name = template_name.get_untracked().trim().to_string();
        if name.is_empty() {
            error.set(Some(invalid("template", "Name the template first")));
            return;
        }
        if let Ok(input) = built.get_untracked() {
            templates.update(|t| {
                t.insert(name, input);
            });
            live::save_local(
                TEMPLATES_KEY,
                &serde_json::to_string(&templates.get_untracked()).unwrap_or_default(),
            );
        }
    };
    let fields = [
        "name",
        "image",
        "command",
        "resources.gpu.type",
        "resources.gpu.count",
        "gpu_per_worker",
        "resources.gpu.memory",
        "resources.cpu",
        "resources.memory",
        "priority",
        "deadline",
        "checkpoint.interval",
        "checkpoint.save_to",
        "retry_policy.max_retries",
        "env",
        "labels",
        "template",
    ];
    let count_err = Signal::derive(move || {
        ferr("resources.gpu.count")
            .get()
            .or_else(|| ferr("gpu_per_worker").get())
    });

    view! {
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
        <div class="submit-layout">
            <section class="card">
                <h1>"Submit a task"</h1>
                <IsolationNotice nodes=Signal::derive(move || nodes.get().and_then(|r| r.ok()).unwrap_or_default())/>
                <div class="inline-form templates">
                    <div class="field">
                        <label for="template-pick">"Start from template"</label>
                        <select id="template-pick" data-testid="template-pick" on:change=move |ev| {
                            let name = event_target_value(&ev);
                            if let Some(t) = templates.get_untracked().get(&name) { form.fill(t); }
                        }>
                            <option value="">"—"</option>
                            {move || templates.get().into_keys().map(|k| view! { <option value=k.clone()>{k.clone()}</option> }).collect_view()}
                        </select>
                    </div>
                    <Field label="Template name" id="template" value=template_name error=ferr("template") placeholder="my-resnet"/>
                    <button type="button" class="secondary small" data-testid="save-template" on:click=save_template>"Save as template"</button>
                </div>
                <form class="task-form" on:submit=on_submit novalidate>
                    <Field label="Name" id="name" value=form.name error=ferr("name") placeholder="resnet50"/>
                    <Field label="Image" id="image" value=form.image error=ferr("image")/>
                    <div class="field wide" class:has-error=move || ferr("command").get().is_some()>
                        <label for="command">"Command"</label>
                        <textarea id="command" name="command" rows="3" placeholder="python train.py --epochs 10" aria-describedby="command-error" bind:value=form.command></textarea>
                        <p class="field-error" id="command-error" role="alert">{move || ferr("command").get()}</p>
                    </div>
                    <div class="field" class:has-error=move || ferr("resources.gpu.type").get().is_some()>
                        <label for="gpu_type">"GPU type"</label>
                        <select id="gpu_type" aria-describedby="gpu_type-error" prop:value=move || form.gpu_type.get() on:change=move |ev| form.gpu_type.set(event_target_value(&ev))>
                            <option value="">"any type"</option>
                            {move || {
                                let current = form.gpu_type.get();
                                gpu_types().into_iter().map(|(t, (free, total))| {
                                    let selected = t == current;
                                    view! { <option value=t.clone() selected=selected>{format!("{t} — {free} of {total} free now")}</option> }
                                }).collect_view()
                            }}
                        </select>
                        <p class="field-error" id="gpu_type-error" role="alert">{move || ferr("resources.gpu.type").get()}</p>
                    </div>
                    <Field label="GPUs" id="gpu_count" kind="number" value=form.gpu_count error=count_err/>
                    <Field label="GPU memory per GPU" id="gpu_memory" value=form.gpu_memory error=ferr("resources.gpu.memory") placeholder="whole GPU (or 20GiB)"/>
                    <Field label="CPU cores" id="cpu" kind="number" value=form.cpu error=ferr("resources.cpu") placeholder="1"/>
                    <Field label="RAM" id="memory" value=form.memory error=ferr("resources.memory") placeholder="4GiB"/>
                    <div class="field" class:has-error=move || ferr("priority").get().is_some()>
                        <label for="priority">"Priority: " <strong>{move || form.priority.get()}</strong></label>
                        <input id="priority" type="range" min="0" max="1" step="0.05" bind:value=form.priority/>
                        <p class="field-error" role="alert">{move || ferr("priority").get()}</p>
                    </div>
                    <Field label="Deadline (UTC)" id="deadline" kind="datetime-local" value=form.deadline error=ferr("deadline")/>
                    <Field label="Checkpoint every (seconds)" id="checkpoint_interval" kind="number" value=form.ckpt_interval error=ferr("checkpoint.interval") placeholder="no checkpoints"/>
                    <Field label="Checkpoint destination" id="checkpoint_save_to" value=form.ckpt_to error=ferr("checkpoint.save_to") placeholder="s3://bucket/prefix"/>
                    <Field label="Retries" id="max_retries" kind="number" value=form.retries error=ferr("retry_policy.max_retries")/>
                    <div class="field checks">
                        <label class="check"><input type="checkbox" id="oom_recovery" bind:checked=form.oom/>" Retry out-of-memory with half the batch size"</label>
                        <label class="check"><input type="checkbox" id="zone_same" bind:checked=form.zone_same/>" Keep all workers in one zone"</label>
                    </div>
                    <div class="field" class:has-error=move || ferr("env").get().is_some()>
                        <label for="env">"Environment (KEY=value per line)"</label>
                        <textarea id="env" rows="3" placeholder="EPOCHS=10" bind:value=form.env></textarea>
                        <p class="field-error" role="alert">{move || ferr("env").get()}</p>
                    </div>
                    <div class="field" class:has-error=move || ferr("labels").get().is_some()>
                        <label for="labels">"Labels (key=value per line)"</label>
                        <textarea id="labels" rows="3" placeholder="team=vision" bind:value=form.labels></textarea>
                        <p class="field-error" role="alert">{move || ferr("labels").get()}</p>
                    </div>
                    <p class="banner error wide" role="alert" data-testid="submit-error">{move || general_error(error.get(), &fields)}</p>
                    <div class="actions wide">
                        <button type="submit" data-testid="submit" disabled=move || submit.pending().get()>"Submit task"</button>
                        <a class="button secondary" href="/tasks">"Cancel"</a>
                    </div>
                </form>
            </section>
            <aside class="card snippets">
                <h2>"Same request, in code"</h2>
                <p class="muted small">"Python SDK"</p>
                <pre class="code" data-testid="python-snippet">{move || match json.get() {
                    Some(v) => format!("import autodl\n\nautodl.Client().submit_task({})", python(&v, 0)),
                    None => "# fix the form's errors first".into(),
                }}</pre>
                <p class="muted small">"CLI: " <code>"autodl submit task.yaml"</code></p>
                <pre class="code" data-testid="yaml-snippet">{move || match json.get() {
                    Some(v) => { let mut s = String::from("# task.yaml\n"); yaml(&v, 0, &mut s); s }
                    None => "# fix the form's errors first".into(),
                }}</pre>
            </aside>
        </div>
        </Transition>
    }
}
