//! The submit form (`/submit`): every task field, inline errors from the API, and the same
//! request as Python and as a CLI task file, updated as you type. `?from=ID` prefills it from a
//! task (clone); templates are kept in the browser's localStorage.

use std::collections::BTreeMap;

use autodl_common::tasks::{NodeInfo, Task, TaskSpecInput};
use leptos::prelude::*;
use leptos_router::hooks::{use_navigate, use_query_map};
use serde_json::Value;

use super::cluster::IsolationNotice;
use crate::api::{self, ApiErr};
use crate::fields::{general_error, Field};
use crate::form::{invalid, FormValues};
use crate::live;
use crate::paths;
use crate::session::RequireLogin;

const TEMPLATES_KEY: &str = "autodl.templates";

#[component]
pub fn SubmitPage() -> impl IntoView {
    view! { <RequireLogin><SubmitForm/></RequireLogin> }
}

/// The form's state, one signal per input (see [`FormValues`] for what each holds).
#[derive(Clone, Copy)]
struct Form {
    name: RwSignal<String>,
    image: RwSignal<String>,
    command: RwSignal<String>,
    gpu_type: RwSignal<String>,
    gpu_count: RwSignal<String>,
    workers: RwSignal<String>,
    launcher: RwSignal<String>,
    gpu_memory: RwSignal<String>,
    cpu: RwSignal<String>,
    memory: RwSignal<String>,
    priority: RwSignal<String>,
    deadline: RwSignal<String>,
    estimated_runtime: RwSignal<String>,
    time_limit: RwSignal<String>,
    rendezvous_timeout: RwSignal<String>,
    ckpt_interval: RwSignal<String>,
    ckpt_to: RwSignal<String>,
    ckpt_keep: RwSignal<String>,
    checkpointed: RwSignal<bool>,
    retries: RwSignal<String>,
    bandwidth: RwSignal<String>,
    data_path: RwSignal<String>,
    code: RwSignal<String>,
    setup: RwSignal<String>,
    requirements: RwSignal<String>,
    batch_size: RwSignal<String>,
    env: RwSignal<String>,
    labels: RwSignal<String>,
    argv: RwSignal<bool>,
    oom: RwSignal<bool>,
    global_batch: RwSignal<bool>,
    zone_same: RwSignal<bool>,
    preemptible: RwSignal<bool>,
    after: RwSignal<String>,
    after_any: RwSignal<bool>,
    after_fail: RwSignal<bool>,
    session: RwSignal<bool>,
    ports: RwSignal<String>,
}

impl Form {
    /// Whether a field under "Advanced" holds anything but its default (a cloned task's, a
    /// template's): the section opens, so nothing the task sets is hidden.
    fn uses_advanced(&self) -> bool {
        let d = FormValues::default();
        self.launcher.get() != d.launcher
            || self.rendezvous_timeout.get() != d.rendezvous_timeout
            || self.gpu_memory.get() != d.gpu_memory
            || self.batch_size.get() != d.batch_size
            || self.estimated_runtime.get() != d.estimated_runtime
            || self.deadline.get() != d.deadline
            || self.ckpt_to.get() != d.ckpt_to
            || self.ckpt_keep.get() != d.ckpt_keep
            || self.global_batch.get() != d.global_batch
            || self.zone_same.get() != d.zone_same
            || self.bandwidth.get() != d.bandwidth
            || !self.after.get().trim().is_empty()
            || self.after_any.get()
            || self.after_fail.get()
    }

    fn new() -> Self {
        let v = FormValues::default();
        Form {
            name: RwSignal::new(v.name.clone()),
            image: RwSignal::new(v.image.clone()),
            command: RwSignal::new(v.command.clone()),
            gpu_type: RwSignal::new(v.gpu_type.clone()),
            gpu_count: RwSignal::new(v.gpu_count.clone()),
            workers: RwSignal::new(v.workers.clone()),
            launcher: RwSignal::new(v.launcher.clone()),
            gpu_memory: RwSignal::new(v.gpu_memory.clone()),
            cpu: RwSignal::new(v.cpu.clone()),
            memory: RwSignal::new(v.memory.clone()),
            priority: RwSignal::new(v.priority.clone()),
            deadline: RwSignal::new(v.deadline.clone()),
            estimated_runtime: RwSignal::new(v.estimated_runtime.clone()),
            time_limit: RwSignal::new(v.time_limit.clone()),
            rendezvous_timeout: RwSignal::new(v.rendezvous_timeout.clone()),
            ckpt_interval: RwSignal::new(v.ckpt_interval.clone()),
            ckpt_to: RwSignal::new(v.ckpt_to.clone()),
            ckpt_keep: RwSignal::new(v.ckpt_keep.clone()),
            checkpointed: RwSignal::new(v.checkpointed),
            retries: RwSignal::new(v.retries.clone()),
            bandwidth: RwSignal::new(v.bandwidth.clone()),
            data_path: RwSignal::new(v.data_path.clone()),
            code: RwSignal::new(v.code.clone()),
            setup: RwSignal::new(v.setup.clone()),
            requirements: RwSignal::new(v.requirements.clone()),
            batch_size: RwSignal::new(v.batch_size.clone()),
            env: RwSignal::new(v.env.clone()),
            labels: RwSignal::new(v.labels.clone()),
            argv: RwSignal::new(v.argv),
            oom: RwSignal::new(v.oom),
            global_batch: RwSignal::new(v.global_batch),
            zone_same: RwSignal::new(v.zone_same),
            preemptible: RwSignal::new(v.preemptible),
            after: RwSignal::new(v.after.clone()),
            after_any: RwSignal::new(v.after_any),
            after_fail: RwSignal::new(v.after_fail),
            session: RwSignal::new(v.session),
            ports: RwSignal::new(v.ports.clone()),
        }
    }

    fn values(&self) -> FormValues {
        FormValues {
            name: self.name.get(),
            image: self.image.get(),
            command: self.command.get(),
            gpu_type: self.gpu_type.get(),
            gpu_count: self.gpu_count.get(),
            workers: self.workers.get(),
            launcher: self.launcher.get(),
            gpu_memory: self.gpu_memory.get(),
            cpu: self.cpu.get(),
            memory: self.memory.get(),
            priority: self.priority.get(),
            deadline: self.deadline.get(),
            estimated_runtime: self.estimated_runtime.get(),
            time_limit: self.time_limit.get(),
            rendezvous_timeout: self.rendezvous_timeout.get(),
            ckpt_interval: self.ckpt_interval.get(),
            ckpt_to: self.ckpt_to.get(),
            ckpt_keep: self.ckpt_keep.get(),
            checkpointed: self.checkpointed.get(),
            retries: self.retries.get(),
            bandwidth: self.bandwidth.get(),
            data_path: self.data_path.get(),
            code: self.code.get(),
            setup: self.setup.get(),
            requirements: self.requirements.get(),
            batch_size: self.batch_size.get(),
            env: self.env.get(),
            labels: self.labels.get(),
            argv: self.argv.get(),
            oom: self.oom.get(),
            global_batch: self.global_batch.get(),
            zone_same: self.zone_same.get(),
            preemptible: self.preemptible.get(),
            after: self.after.get(),
            after_any: self.after_any.get(),
            after_fail: self.after_fail.get(),
            session: self.session.get(),
            ports: self.ports.get(),
        }
    }

    /// The request the form describes, or the first field that cannot be read.
    fn build(&self) -> Result<TaskSpecInput, ApiErr> {
        self.values().to_input()
    }

    fn fill(&self, i: &TaskSpecInput) {
        let v = FormValues::from_input(i);
        self.name.set(v.name.clone());
        self.image.set(v.image.clone());
        self.command.set(v.command.clone());
        self.gpu_type.set(v.gpu_type.clone());
        self.gpu_count.set(v.gpu_count.clone());
        self.workers.set(v.workers.clone());
        self.launcher.set(v.launcher.clone());
        self.gpu_memory.set(v.gpu_memory.clone());
        self.cpu.set(v.cpu.clone());
        self.memory.set(v.memory.clone());
        self.priority.set(v.priority.clone());
        self.deadline.set(v.deadline.clone());
        self.estimated_runtime.set(v.estimated_runtime.clone());
        self.time_limit.set(v.time_limit.clone());
        self.rendezvous_timeout.set(v.rendezvous_timeout.clone());
        self.ckpt_interval.set(v.ckpt_interval.clone());
        self.ckpt_to.set(v.ckpt_to.clone());
        self.ckpt_keep.set(v.ckpt_keep.clone());
        self.checkpointed.set(v.checkpointed);
        self.retries.set(v.retries.clone());
        self.bandwidth.set(v.bandwidth.clone());
        self.data_path.set(v.data_path.clone());
        self.code.set(v.code.clone());
        self.setup.set(v.setup.clone());
        self.requirements.set(v.requirements.clone());
        self.batch_size.set(v.batch_size.clone());
        self.env.set(v.env.clone());
        self.labels.set(v.labels.clone());
        self.argv.set(v.argv);
        self.oom.set(v.oom);
        self.global_batch.set(v.global_batch);
        self.zone_same.set(v.zone_same);
        self.preemptible.set(v.preemptible);
        self.after.set(v.after.clone());
        self.after_any.set(v.after_any);
        self.after_fail.set(v.after_fail);
        self.session.set(v.session);
        self.ports.set(v.ports.clone());
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

/// The request as a `task.yaml`. Values are written as JSON (a JSON scalar or list is a YAML
/// one that reads back the same); keys through [`yaml_key`].
fn yaml(v: &Value, indent: usize, out: &mut String) {
    let pad = "  ".repeat(indent);
    if let Value::Object(m) = v {
        for (k, x) in m {
            let k = yaml_key(k);
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

/// A mapping key that reads back as the same string: plain only when no YAML reader could take
/// it for anything else (PyYAML, which the CLI uses, reads YAML 1.1, where `ON`, `yes` or `n`
/// are booleans, `~` and `null` nothing, and anything starting with a digit may be a number or a
/// time); every other key is double-quoted, as a JSON string, which is also a YAML one.
fn yaml_key(k: &str) -> String {
    const WORDS: [&str; 10] = [
        "y", "n", "yes", "no", "on", "off", "true", "false", "null", "nan",
    ];
    let plain = k
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !WORDS.contains(&k.to_ascii_lowercase().as_str());
    if plain {
        k.to_string()
    } else {
        serde_json::to_string(k).unwrap_or_default()
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
    let nodes = Resource::new(|| (), |_| api::get::<Vec<NodeInfo>>(paths::nodes()));
    // Clone: prefill from ?from=ID.
    let from = Memo::new(move |_| query.with(|q| q.get("from")));
    let source = Resource::new(
        move || from.get(),
        |from| async move {
            match from {
                Some(id) => api::get::<Task>(crate::paths::task(&id)).await.ok(),
                None => None,
            }
        },
    );
    Effect::new(move |_| {
        if let Some(Some(t)) = source.get() {
            let mut input = t.spec.to_input();
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
    let advanced = RwSignal::new(false);
    // The field an error is about may be far above the button or folded away: it is shown
    // (its section opened) and takes the focus; the button's side names it too.
    let reveal = move |field: Option<&str>| {
        if let Some(id) = field.and_then(input_id) {
            if ADVANCED.contains(&id) {
                advanced.set(true);
            }
            live::focus(id);
        }
    };
    Effect::new(move |_| {
        if form.uses_advanced() {
            advanced.set(true);
        }
    });
    let submit = Action::new_local(move |body: &Value| {
        let body = body.clone();
        async move { api::post::<_, Task>(paths::tasks(), &body).await }
    });
    Effect::new(move |_| match submit.value().get() {
        Some(Ok(t)) => navigate(&format!("/tasks/{}", t.id), Default::default()),
        Some(Err(e)) => {
            reveal(e.field.as_deref());
            error.set(Some(e))
        }
        None => {}
    });
    // What the chosen archive became: its files and size, or why it was refused.
    let code_note = RwSignal::new(None::<Result<String, String>>);
    let on_code = move |ev: leptos::ev::Event| {
        code_note.set(Some(Ok("Uploading…".into())));
        leptos::task::spawn_local(async move {
            match api::upload_code(ev).await {
                Ok(Some(b)) => {
                    form.code.set(b.id.clone());
                    code_note.set(Some(Ok(format!(
                        "Uploaded: {} files, {} ({})",
                        b.files.unwrap_or_default(),
                        super::tasks::bytes(b.size_bytes),
                        if b.stored { "new" } else { "already stored" }
                    ))));
                }
                Ok(None) => code_note.set(None),
                Err(e) => code_note.set(Some(Err(e.message))),
            }
        });
    };
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
            Err(e) => {
                reveal(e.field.as_deref());
                error.set(Some(e))
            }
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
        "setup",
        "requirements",
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
                <form class="task-form" method="post" on:submit=on_submit novalidate>
                    <Field label="Name" id="name" value=form.name error=ferr("name") placeholder="resnet50"/>
                    <Field label="Image" id="image" value=form.image error=ferr("image")/>
                    <div class="field wide" class:has-error=move || ferr("command").get().is_some()>
                        <label for="command">"Command"{move || form.argv.get().then_some(" (arguments, quoted as in a shell)")}</label>
                        <textarea id="command" name="command" rows="3" placeholder="python train.py --epochs 10" aria-describedby="command-error" bind:value=form.command></textarea>
                        <p class="field-error" id="command-error" role="alert">{move || ferr("command").get()}</p>
                    </div>
                    <div class="field" class:has-error=move || ferr("resources.gpu.type").get().is_some()>
                        <label for="gpu_type">"GPU type"</label>
                        <select id="gpu_type" aria-describedby="gpu_type-error" prop:value=move || form.gpu_type.get() on:change=move |ev| form.gpu_type.set(event_target_value(&ev))>
                            <option value="">"any type"</option>
                            {move || {
                                let current = form.gpu_type.get();
                                let types = gpu_types();
                                // A cloned task may ask for types no node has now (or several):
                                // show what it asks for rather than pretend "any".
                                let asked = (!current.is_empty() && !types.contains_key(&current)).then(|| {
                                    let c = current.clone();
                                    view! { <option value=c.clone() selected=true>{format!("{c} — as the task asked")}</option> }
                                });
                                let known = types.into_iter().map(|(t, (free, total))| {
                                    let selected = t == current;
                                    view! { <option value=t.clone() selected=selected>{format!("{t} — {free} of {total} free now")}</option> }
                                }).collect_view();
                                (asked, known)
                            }}
                        </select>
                        <p class="field-error" id="gpu_type-error" role="alert">{move || ferr("resources.gpu.type").get()}</p>
                    </div>
                    <Field label="GPUs per worker" id="gpu_count" kind="number" value=form.gpu_count error=count_err/>
                    <Field label="Workers" id="num_workers" value=form.workers error=ferr("num_workers") placeholder="4, or 2-8 to grow and shrink"/>
                    <Field label="CPU cores" id="cpu" kind="number" value=form.cpu error=ferr("resources.cpu") placeholder="1"/>
                    <Field label="RAM" id="memory" value=form.memory error=ferr("resources.memory") placeholder="4GiB"/>
                    <Field label="Data" id="data_path" value=form.data_path error=ferr("data_path") placeholder="s3://bucket/path or /datasets/…"/>
                    <div class="field" class:has-error=move || ferr("code").get().is_some() || matches!(code_note.get(), Some(Err(_)))>
                        <label for="code_upload">"Code: a .zip or .tar.gz of your project"</label>
                        <input id="code_upload" type="file" accept=".zip,.tar,.tar.gz,.tgz" on:change=on_code/>
                        <p class="hint" data-testid="code-note">
                            {move || match code_note.get() {
                                Some(Ok(note)) => note,
                                _ if !form.code.get().is_empty() => format!("Runs in {}", form.code.get()),
                                _ => "The task starts in it (entry point train.py finds train.py); the Python SDK and CLI pack a folder for you (workdir).".into(),
                            }}
                        </p>
                        <p class="field-error" role="alert">
                            {move || match code_note.get() {
                                Some(Err(e)) => Some(e),
                                _ => ferr("code").get(),
                            }}
                        </p>
                    </div>
                    <Field label="Requirements file in the code" id="requirements" value=form.requirements error=ferr("requirements") placeholder="requirements.txt (installed once per node, then reused)"/>
                    <div class="field" class:has-error=move || ferr("setup").get().is_some()>
                        <label for="setup">"Setup commands"</label>
                        <textarea id="setup" rows="2" placeholder="pip install -e ." aria-describedby="setup-error" bind:value=form.setup></textarea>
                        <p class="hint">"Run once per node in the task's environment ($AUTODL_ENV_DIR, a virtualenv), after the requirements; later tasks with the same setup reuse it."</p>
                        <p class="field-error" id="setup-error" role="alert">{move || ferr("setup").get()}</p>
                    </div>
                    <Field label="Time limit" id="time_limit" kind="text" value=form.time_limit error=ferr("time_limit") placeholder="none, or e.g. 12h"/>
                    <div class="field" class:has-error=move || ferr("priority").get().is_some()>
                        <label for="priority">"Priority: " <strong>{move || form.priority.get()}</strong></label>
                        <input id="priority" type="range" min="0" max="1" step="0.05" bind:value=form.priority/>
                        <p class="field-error" role="alert">{move || ferr("priority").get()}</p>
                    </div>
                    <Field label="Checkpoint every" id="checkpoint_interval" kind="text" value=form.ckpt_interval error=ferr("checkpoint.interval") placeholder="no checkpoints (e.g. 10m)"/>
                    <Field label="Retries" id="max_retries" kind="number" value=form.retries error=ferr("retry_policy.max_retries")/>
                    <div class="field checks">
                        <label class="check"><input type="checkbox" id="oom_recovery" bind:checked=form.oom/>" Retry out-of-memory with half the batch size"</label>
                        <label class="check"><input type="checkbox" id="preemptible" bind:checked=form.preemptible/>" May be preempted (stopped at a checkpoint for more urgent work)"</label>
                        // Someone works in a session: it is not taken away unless they say so.
                        <label class="check"><input type="checkbox" id="session" prop:checked=move || form.session.get()
                            on:change=move |ev| {
                                let on = event_target_checked(&ev);
                                form.session.set(on);
                                if on {
                                    form.preemptible.set(false);
                                }
                            }/>" Interactive session (a shell or notebook; stopped when its GPUs sit idle)"</label>
                    </div>
                    <Field label="Ports to reach (for notebooks, TensorBoard)" id="ports" value=form.ports error=ferr("ports") placeholder="none, or e.g. 8888, 6006"/>
                    // Fields most tasks leave alone, folded away; open when one holds a value
                    // (a cloned task's) or an error is about one.
                    <details class="advanced wide" data-testid="advanced" prop:open=move || advanced.get()>
                        // The signal decides (the browser's own toggle would leave it behind).
                        <summary on:click=move |ev| { ev.prevent_default(); advanced.update(|a| *a = !*a); }>"Advanced: workers' start, GPU sharing, batch, deadline, checkpoints' place, order"</summary>
                        <div class="task-form">
                    <div class="field">
                        <label for="launcher">"Start workers as"</label>
                        <select id="launcher" prop:value=move || form.launcher.get() on:change=move |ev| form.launcher.set(event_target_value(&ev))>
                            <option value="workers">"a process per worker (RANK, WORLD_SIZE, MASTER_ADDR set for env://)"</option>
                            <option value="torchrun">"one torchrun per node (its options in PET_* variables)"</option>
                            <option value="none">"one process per node (the command starts its workers)"</option>
                        </select>
                    </div>
                    <Field label="Workers meet within" id="rendezvous_timeout" kind="text" value=form.rendezvous_timeout error=ferr("rendezvous_timeout") placeholder="10m (a gang that has not formed by then ends)"/>
                    <Field label="GPU memory per GPU" id="gpu_memory" value=form.gpu_memory error=ferr("resources.gpu.memory") placeholder="whole GPU (or 20GiB)"/>
                    <Field label="Batch size" id="batch_size" kind="number" value=form.batch_size error=ferr("batch_size") placeholder="the program's own"/>
                    <Field label="Expected run time" id="estimated_runtime" kind="text" value=form.estimated_runtime error=ferr("estimated_runtime") placeholder="unknown, or e.g. 2h30m"/>
                    <Field label="Deadline" id="deadline" value=form.deadline error=ferr("deadline") placeholder="2026-12-24T18:00:00Z"/>
                    <Field label="Checkpoint destination" id="checkpoint_save_to" value=form.ckpt_to error=ferr("checkpoint.save_to") placeholder="s3://bucket/prefix"/>
                    <Field label="Checkpoints kept" id="checkpoint_keep" kind="number" value=form.ckpt_keep error=ferr("checkpoint.keep") placeholder="platform default"/>
                    <div class="field checks">
                        <label class="check"><input type="checkbox" id="global_batch" bind:checked=form.global_batch/>" The batch size is the global batch, shared among the workers"</label>
                        <label class="check"><input type="checkbox" id="zone_same" bind:checked=form.zone_same/>" Keep all workers in one zone"</label>
                        <label class="check"><input type="checkbox" id="high_bandwidth" prop:checked=move || form.bandwidth.get() == "high"
                            on:change=move |ev| form.bandwidth.set(if event_target_checked(&ev) { "high" } else { "normal" }.into())/>" Needs a fast network between workers"</label>
                    </div>
                    <Field label="Start after (task ids)" id="after" value=form.after error=ferr("after") placeholder="none: start when it fits"/>
                    <div class="field checks">
                        <label class="check"><input type="checkbox" id="after_any" bind:checked=form.after_any/>" Start once they ended, even if one failed"</label>
                        <label class="check"><input type="checkbox" id="after_fail" bind:checked=form.after_fail/>" If one fails first, mark this task failed (not cancelled)"</label>
                    </div>
                        </div>
                    </details>
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
                    <p class="field-error wide" data-testid="submit-field-error">{move || error.get().and_then(|e| {
                        let f = e.field.clone()?;
                        fields.contains(&f.as_str()).then(|| format!("{f}: {} (the field is marked above)", e.message))
                    })}</p>
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

/// The inputs under "Advanced".
const ADVANCED: [&str; 11] = [
    "launcher",
    "rendezvous_timeout",
    "gpu_memory",
    "batch_size",
    "estimated_runtime",
    "deadline",
    "checkpoint_save_to",
    "checkpoint_keep",
    "global_batch",
    "zone_same",
    "after",
];

/// The form's input for a field the API names in an error.
fn input_id(field: &str) -> Option<&'static str> {
    Some(match field {
        "name" => "name",
        "image" => "image",
        "command" => "command",
        "resources.gpu.type" => "gpu_type",
        "resources.gpu.count" | "gpu_per_worker" => "gpu_count",
        "resources.gpu.memory" => "gpu_memory",
        "resources.cpu" => "cpu",
        "resources.memory" => "memory",
        "num_workers" => "num_workers",
        "priority" => "priority",
        "deadline" => "deadline",
        "data_path" => "data_path",
        "requirements" => "requirements",
        "setup" => "setup",
        "batch_size" => "batch_size",
        "estimated_runtime" => "estimated_runtime",
        "time_limit" => "time_limit",
        "rendezvous_timeout" => "rendezvous_timeout",
        "env" => "env",
        "labels" => "labels",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_that_yaml_would_read_as_something_else_are_quoted() {
        for k in ["name", "gpu_type", "NCCL_DEBUG", "my-label", "_x"] {
            assert_eq!(yaml_key(k), k);
        }
        for k in [
            "ON", "yes", "N", "NULL", "~", "123", "1e3", "a b", "a:b", "é", "", "-x",
        ] {
            assert!(yaml_key(k).starts_with('"'), "{k} -> {}", yaml_key(k));
        }
    }

    /// The preview read back by the CLI's own loader (`autodl submit task.yaml`) is the task
    /// the form sends, keys and values alike.
    #[test]
    fn the_yaml_preview_reads_back_through_the_cli_as_the_request() {
        let Ok(python) = std::env::var("AUTODL_TEST_PYTHON") else {
            assert!(
                std::env::var_os("CI").is_none(),
                "AUTODL_TEST_PYTHON (a Python with the SDK) must be set in CI"
            );
            eprintln!("SKIPPED: AUTODL_TEST_PYTHON (a Python with the SDK) is not set");
            return;
        };
        let request = serde_json::json!({
            "name": "train: \"quoted\" # not a comment",
            "command": "python train.py --lr 1e-3",
            "gpu_count": 2,
            "env": {
                "ON": "1", "YES": "no", "NULL": "~", "123": "0x1F", "a b": "yes",
                "é": "12:30", "~": "null", "1e3": "true", "KEEP": "plain"
            },
            "labels": {"off": "on", "2024-01-01": "date"},
            "args": ["--flag", "on", "1"]
        });
        let mut text = String::new();
        yaml(&request, 0, &mut text);
        let file = std::env::temp_dir().join(format!("autodl-preview-{}.yaml", std::process::id()));
        std::fs::write(&file, &text).unwrap();
        let out = std::process::Command::new(python)
            .args([
                "-c",
                "import json, sys; from autodl.cli import _load_config; \
                 print(json.dumps(dict(_load_config(sys.argv[1]))))",
            ])
            .arg(&file)
            .output()
            .unwrap();
        let _ = std::fs::remove_file(&file);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let back: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(back, request, "the preview was:\n{text}");
    }
}
