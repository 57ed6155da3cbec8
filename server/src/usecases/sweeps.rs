//! Sweeps: one request makes a task per trial (all stored in one transaction, or none), one
//! request cancels them all; a sweep is listed and compared as one.

use std::collections::BTreeMap;

use autodl_common::tasks::{Sweep, SweepInput, SweepMethod, SweepTrial, SweepTrialRow};

use crate::auth::secrets::time_ordered_id;
use crate::auth::Caller;
use crate::domain::rfc3339;
use crate::domain::DomainError;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{CancelOutcome, NewTask, SweepRecord, SweepWithUser, TaskFilter};
use crate::tasks::asha::{Objective, Verdict};
use crate::tasks::{spec, sweep};
use crate::usecases::submit::{new_record, vet};

/// Reported samples read per trial for its newest metric values.
const METRIC_SAMPLES: i64 = 50;

pub async fn create(
    state: &AppState,
    caller: &Caller,
    input: SweepInput,
) -> Result<Sweep, ApiError> {
    let name = input.name.trim().to_owned();
    if name.is_empty() || name.len() > 100 || name.chars().any(char::is_control) {
        return Err(ApiError::invalid(
            "name",
            "name is required: 1 to 100 characters, e.g. \"lr-sweep\"",
        ));
    }
    let objective = Objective::of(&input)?;
    let mut template = input.template.clone();
    crate::usecases::submit::name_after(state, caller, &mut template.after).await?;
    let now = state.clock.now_ms();
    let seed = input.seed.unwrap_or(now as u64);
    let trials = sweep::trials(&input.parameters, input.method, input.samples, seed)?;
    let names: Vec<&String> = input.parameters.keys().collect();
    sweep::check_used(&input.template, &names)?;
    let max_concurrency = match input.max_concurrency {
        None => trials.len() as u32,
        Some(0) => {
            return Err(ApiError::invalid(
                "max_concurrency",
                "max_concurrency is at least 1 (trials running at once)",
            ))
        }
        Some(n) => n,
    };
    let id = time_ordered_id();
    let mut batch = Vec::with_capacity(trials.len());
    for (i, params) in trials.iter().enumerate() {
        let input = sweep::trial_input(&template, &id, &name, i, params);
        let mut spec = spec::normalise(input, now / 1000).map_err(|e| in_template(e, i))?;
        crate::usecases::submit::session_rules(state, caller, &mut spec).await?;
        spec.sweep = Some(SweepTrial {
            sweep_id: id.clone(),
            trial: i as u32,
            max_concurrency,
            params: params.clone(),
        });
        let rec = new_record(caller, &spec, None, now)?;
        if i == 0 {
            // Trials differ only in their command, env and name: what is checked is the same.
            vet(state, caller, &rec, &spec, trials.len() as i64).await?;
        }
        let labels = spec
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        batch.push(NewTask {
            task: rec,
            labels,
            kind: spec.kind,
            // The sweep's trials are counted together above, and stored all or none.
            caps: Default::default(),
        });
    }
    let record = SweepRecord {
        id: id.clone(),
        tenant_id: caller.tenant_id().to_owned(),
        user_id: caller.user.id.clone(),
        name,
        method: method_str(input.method).into(),
        parameters: serde_json::to_string(&input.parameters).map_err(anyhow::Error::from)?,
        max_concurrency: i64::from(max_concurrency),
        trials: trials.len() as i64,
        created_at: now,
        objective: objective
            .as_ref()
            .map(serde_json::to_string)
            .transpose()
            .map_err(anyhow::Error::from)?,
    };
    state.store.create_sweep(&record, &batch).await?;
    state.scheduler.wake();
    show(state, caller, &id).await
}

/// A template's error names its field inside the template.
fn in_template(e: DomainError, trial: usize) -> ApiError {
    match e {
        DomainError::Invalid { field, message } => ApiError::Validation {
            field: Some(format!("template.{field}").into()),
            message: format!("trial {trial}: {message}"),
        },
        other => other.into(),
    }
}

fn method_str(m: SweepMethod) -> &'static str {
    match m {
        SweepMethod::Grid => "grid",
        SweepMethod::Random => "random",
        SweepMethod::Asha => "asha",
    }
}

/// What a stored sweep optimises.
fn objective_of(r: &SweepRecord) -> Option<Objective> {
    r.objective
        .as_deref()
        .and_then(|o| serde_json::from_str(o).ok())
}

fn header(s: &SweepWithUser) -> Sweep {
    let r = &s.sweep;
    let parameters: BTreeMap<String, serde_json::Value> =
        serde_json::from_str(&r.parameters).unwrap_or_default();
    let objective = objective_of(r);
    Sweep {
        id: r.id.clone(),
        name: r.name.clone(),
        user_email: s.user_email.clone(),
        method: match r.method.as_str() {
            "random" => SweepMethod::Random,
            "asha" => SweepMethod::Asha,
            _ => SweepMethod::Grid,
        },
        max_concurrency: r.max_concurrency as u32,
        trials: r.trials as u32,
        created_at: rfc3339(r.created_at),
        parameters: parameters.into_keys().collect(),
        metric: objective.as_ref().map(|o| o.metric.clone()),
        mode: objective.as_ref().map(|o| o.mode),
        early_stopping: objective
            .as_ref()
            .and_then(|o| o.asha.as_ref())
            .map(|a| a.shown()),
        states: BTreeMap::new(),
        items: Vec::new(),
    }
}

async fn trials_of(
    state: &AppState,
    tenant_id: &str,
    id: &str,
) -> Result<Vec<crate::store::TaskWithUser>, ApiError> {
    Ok(state
        .store
        .list_tasks(&TaskFilter {
            tenant_id: tenant_id.to_owned(),
            state: None,
            user_id: None,
            label: Some(("sweep".into(), id.to_owned())),
            before: None,
            limit: sweep::MAX_TRIALS as i64,
        })
        .await?)
}

/// The sweep with every trial: its parameters, state and newest metric values.
pub async fn show(state: &AppState, caller: &Caller, id: &str) -> Result<Sweep, ApiError> {
    let found = state
        .store
        .sweep(caller.tenant_id(), id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no sweep {id} in your organization")))?;
    let mut out = header(&found);
    let stopped: BTreeMap<String, String> =
        state.store.sweep_stops(id).await?.into_iter().collect();
    let mut rows = Vec::new();
    for t in trials_of(state, caller.tenant_id(), id).await? {
        let spec = &t.task.spec;
        let Some(trial) = &spec.sweep else { continue };
        *out.states
            .entry(t.task.state.as_str().to_owned())
            .or_default() += 1;
        let mut metrics = BTreeMap::new();
        for m in state
            .store
            .task_metrics(&t.task.id, 0, METRIC_SAMPLES)
            .await?
        {
            let values: BTreeMap<String, f64> = serde_json::from_str(&m.sample).unwrap_or_default();
            metrics.extend(
                values
                    .into_iter()
                    .map(|(k, v)| (k, autodl_common::metrics::json_number(v))),
            );
        }
        rows.push(SweepTrialRow {
            trial: trial.trial,
            task_id: t.task.id.clone(),
            state: t.task.state,
            params: trial.params.clone(),
            metrics,
            stopped_early: stopped.get(&t.task.id).cloned(),
        });
    }
    rows.sort_by_key(|r| r.trial);
    out.items = rows;
    Ok(out)
}

/// The organization's sweeps, newest first, with how many trials are in each state.
pub async fn list(state: &AppState, caller: &Caller, limit: i64) -> Result<Vec<Sweep>, ApiError> {
    let found = state.store.list_sweeps(caller.tenant_id(), limit).await?;
    let ids: Vec<String> = found.iter().map(|s| s.sweep.id.clone()).collect();
    let counts = state.store.sweep_states(caller.tenant_id(), &ids).await?;
    Ok(found
        .iter()
        .map(|s| {
            let mut out = header(s);
            for (sid, st, n) in &counts {
                if *sid == out.id {
                    *out.states.entry(st.as_str().to_owned()).or_default() += *n as u32;
                }
            }
            out
        })
        .collect())
}

/// Cancels every trial that has not ended; answers how many were cancelled.
pub async fn cancel(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<(SweepWithUser, u32), ApiError> {
    let Some(sweep) = state.store.sweep(caller.tenant_id(), id).await? else {
        return Err(ApiError::NotFound(format!(
            "no sweep {id} in your organization"
        )));
    };
    let now = state.clock.now_ms();
    let mut cancelled = 0;
    for t in trials_of(state, caller.tenant_id(), id).await? {
        if t.task.state.is_finished() {
            continue;
        }
        if matches!(
            state
                .store
                .cancel_task(caller.tenant_id(), &t.task.id, now)
                .await?,
            CancelOutcome::Cancelled
        ) {
            cancelled += 1;
        }
    }
    state.scheduler.wake();
    Ok((sweep, cancelled))
}

/// After a trial of an ASHA sweep reported `values`: the rungs its progress passed are
/// recorded with its metric, and at the highest new one it is judged against the trials that
/// reached that rung before it; one that is not among the best is stopped (cancelled, its
/// timeline and the sweep saying why). A report that lacks the progress or the metric, and
/// any task that is not such a trial, pass untouched.
pub async fn judge_trial(
    state: &AppState,
    task: &crate::store::TaskRecord,
    values: &BTreeMap<String, serde_json::Value>,
    now: i64,
) -> Result<(), ApiError> {
    let Some(trial) = &task.spec.sweep else {
        return Ok(());
    };
    let Some(sweep) = state.store.sweep(&task.tenant_id, &trial.sweep_id).await? else {
        return Ok(());
    };
    let Some(objective) = objective_of(&sweep.sweep) else {
        return Ok(());
    };
    let Some(asha) = &objective.asha else {
        return Ok(());
    };
    let number = |k: &str| values.get(k).and_then(serde_json::Value::as_f64);
    let (Some(reached), Some(value)) = (number(&asha.resource), number(&objective.metric)) else {
        return Ok(());
    };
    let passed: Vec<(i64, f64)> = asha
        .passed(reached)
        .into_iter()
        .map(|k| (k as i64, value))
        .collect();
    let new = state
        .store
        .record_rungs(&trial.sweep_id, &task.id, &passed, now)
        .await?;
    let Some(rung) = new.into_iter().max() else {
        return Ok(());
    };
    let earlier = state
        .store
        .rung_values_before(&trial.sweep_id, rung, &task.id)
        .await?;
    let Verdict::Stopped(why) = asha.judge(&objective, rung as usize, value, &earlier) else {
        return Ok(());
    };
    if matches!(
        state
            .store
            .cancel_task(&task.tenant_id, &task.id, now)
            .await?,
        CancelOutcome::Cancelled
    ) {
        state
            .store
            .record_stop(&trial.sweep_id, &task.id, &why, now)
            .await?;
        state
            .store
            .add_event(&task.id, "stopped_early", &why, now)
            .await?;
        state.scheduler.wake();
    }
    Ok(())
}
