//! Sweeps: the trials a parameter grid or random search makes, and each trial's task. Pure:
//! the same request (and seed) always makes the same trials, in the same order.

use std::collections::BTreeMap;

use autodl_common::tasks::{Command, SweepMethod, SweepValues, TaskSpecInput};
use rand::{Rng, SeedableRng};
use serde_json::Value;

use crate::domain::DomainError;

/// Most trials one sweep may make.
pub const MAX_TRIALS: usize = 1000;
const MAX_PARAMETERS: usize = 16;

/// One trial's value of each parameter.
pub type Params = BTreeMap<String, Value>;

/// The trials of a sweep, in order: every combination of a grid (the last parameter
/// changing fastest), or `samples` draws of a random search.
pub fn trials(
    parameters: &BTreeMap<String, SweepValues>,
    method: SweepMethod,
    samples: Option<u32>,
    seed: u64,
) -> Result<Vec<Params>, DomainError> {
    // ASHA stops trials early; which trials there are is a grid's, or random draws'.
    let method = match (method, samples) {
        (SweepMethod::Asha, Some(_)) => SweepMethod::Random,
        (SweepMethod::Asha, None) => SweepMethod::Grid,
        (m, _) => m,
    };
    if parameters.is_empty() || parameters.len() > MAX_PARAMETERS {
        return Err(DomainError::invalid(
            "parameters",
            format!(
                "parameters names 1 to {MAX_PARAMETERS} parameters, e.g. {{\"lr\": [0.1, 0.01]}}"
            ),
        ));
    }
    for (name, values) in parameters {
        check_name(name)?;
        match values {
            SweepValues::List(v) if v.is_empty() => {
                return Err(DomainError::invalid(
                    "parameters",
                    format!("parameters.{name} lists no values"),
                ))
            }
            SweepValues::List(v) => {
                if let Some(bad) = v
                    .iter()
                    .find(|x| !(x.is_number() || x.is_string() || x.is_boolean()))
                {
                    return Err(DomainError::invalid(
                        "parameters",
                        format!("parameters.{name}: {bad} is not a number, text or true/false"),
                    ));
                }
            }
            SweepValues::Range(r) => {
                let ok = r.min.is_finite()
                    && r.max.is_finite()
                    && r.min <= r.max
                    && (!r.log || r.min > 0.0)
                    && (!r.integer || r.min.ceil() <= r.max.floor());
                if !ok {
                    return Err(DomainError::invalid(
                        "parameters",
                        format!(
                            "parameters.{name} is a range with min <= max{}{} (e.g. {{\"min\": 1e-5, \"max\": 1e-1, \"log\": true}})",
                            if r.log { ", both above 0 for log" } else { "" },
                            if r.integer { ", holding a whole number" } else { "" }
                        ),
                    ));
                }
                if method == SweepMethod::Grid {
                    return Err(DomainError::invalid(
                        "parameters",
                        format!("parameters.{name} is a range, which only random draws can take from; list the values for a grid, or set \"samples\" (\"method\": \"random\" or \"asha\")"),
                    ));
                }
            }
        }
    }
    match method {
        SweepMethod::Grid => {
            let total = parameters.values().try_fold(1usize, |n, v| match v {
                SweepValues::List(l) => n.checked_mul(l.len()),
                SweepValues::Range(_) => None,
            });
            match total {
                Some(n) if n <= MAX_TRIALS => {}
                _ => {
                    return Err(DomainError::invalid(
                        "parameters",
                        format!("the grid makes more than {MAX_TRIALS} trials; list fewer values or use a random sweep"),
                    ))
                }
            }
            let mut out: Vec<Params> = vec![Params::new()];
            for (name, values) in parameters {
                let SweepValues::List(values) = values else {
                    continue;
                };
                out = out
                    .into_iter()
                    .flat_map(|p| {
                        values.iter().map(move |v| {
                            let mut p = p.clone();
                            p.insert(name.clone(), v.clone());
                            p
                        })
                    })
                    .collect();
            }
            Ok(out)
        }
        SweepMethod::Random | SweepMethod::Asha => {
            let n = samples.ok_or_else(|| {
                DomainError::invalid(
                    "samples",
                    "a random sweep needs samples: how many trials to draw",
                )
            })? as usize;
            if n == 0 || n > MAX_TRIALS {
                return Err(DomainError::invalid(
                    "samples",
                    format!("samples is between 1 and {MAX_TRIALS}"),
                ));
            }
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            Ok((0..n)
                .map(|_| {
                    parameters
                        .iter()
                        .map(|(name, values)| (name.clone(), draw(values, &mut rng)))
                        .collect()
                })
                .collect())
        }
    }
}

fn draw(values: &SweepValues, rng: &mut impl Rng) -> Value {
    match values {
        SweepValues::List(v) => v[rng.gen_range(0..v.len())].clone(),
        SweepValues::Range(r) => {
            let x = if r.min == r.max {
                r.min
            } else if r.log {
                (rng.gen_range(r.min.ln()..=r.max.ln())).exp()
            } else {
                rng.gen_range(r.min..=r.max)
            };
            if r.integer {
                Value::from(x.round().clamp(r.min.ceil(), r.max.floor()) as i64)
            } else {
                // Six significant digits: `lr=0.000316228` reads better than 17 digits.
                let rounded: f64 = format!("{x:.6e}").parse().unwrap_or(x);
                serde_json::Number::from_f64(rounded).map_or(Value::Null, Value::Number)
            }
        }
    }
}

fn check_name(name: &str) -> Result<(), DomainError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(DomainError::invalid(
            "parameters",
            format!("{name:?} is not a parameter name: letters, digits and _ (as in ${{lr}})"),
        ))
    }
}

/// How a value is written into a command: text as is, numbers as JSON writes them.
fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `${name}` replaced by the trial's value, for each parameter; any other `${...}` (a shell
/// variable) is left for the shell.
fn substitute(text: &str, params: &Params) -> String {
    let mut out = text.to_owned();
    for (name, value) in params {
        out = out.replace(&format!("${{{name}}}"), &text_of(value));
    }
    out
}

/// Every parameter must appear as `${name}` in the template's command, env or name: one that
/// does not would make identical trials.
pub fn check_used(template: &TaskSpecInput, parameters: &[&String]) -> Result<(), DomainError> {
    let mut texts: Vec<&str> = vec![&template.name];
    match &template.command {
        Some(Command::Shell(s)) => texts.push(s),
        Some(Command::Argv(a)) => texts.extend(a.iter().map(String::as_str)),
        None => {}
    }
    if let Some(e) = &template.entry_point {
        texts.push(e);
    }
    texts.extend(template.env.values().map(String::as_str));
    for name in parameters {
        let mark = format!("${{{name}}}");
        if !texts.iter().any(|t| t.contains(&mark)) {
            return Err(DomainError::invalid(
                "parameters",
                format!(
                    "parameter {name} is not used: write {mark} in the template's command or env"
                ),
            ));
        }
    }
    Ok(())
}

/// The task of one trial: the template with the trial's values in its command, entry point,
/// env and name (`<sweep>-<trial>` unless the name uses a parameter), and the sweep's label.
pub fn trial_input(
    template: &TaskSpecInput,
    sweep_id: &str,
    sweep_name: &str,
    trial: usize,
    params: &Params,
) -> TaskSpecInput {
    let mut t = template.clone();
    t.command = t.command.map(|c| match c {
        Command::Shell(s) => Command::Shell(substitute(&s, params)),
        Command::Argv(a) => Command::Argv(a.iter().map(|x| substitute(x, params)).collect()),
    });
    t.entry_point = t.entry_point.map(|e| substitute(&e, params));
    for v in t.env.values_mut() {
        *v = substitute(v, params);
    }
    t.name = if t.name.contains("${") {
        substitute(&t.name, params)
    } else {
        format!("{sweep_name}-{trial}")
    };
    t.labels.insert("sweep".into(), sweep_id.to_owned());
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use autodl_common::tasks::SweepRange;
    use proptest::prelude::*;
    use serde_json::json;

    fn list(v: Value) -> SweepValues {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_grid_is_every_combination_in_order() {
        let p = BTreeMap::from([
            ("bs".to_string(), list(json!([32, 64]))),
            ("lr".to_string(), list(json!([0.1, 0.01, "1e-3"]))),
        ]);
        let t = trials(&p, SweepMethod::Grid, None, 0).unwrap();
        assert_eq!(t.len(), 6);
        assert_eq!(
            t[0],
            Params::from([("bs".into(), json!(32)), ("lr".into(), json!(0.1))])
        );
        assert_eq!(
            t[5],
            Params::from([("bs".into(), json!(64)), ("lr".into(), json!("1e-3"))])
        );
    }

    #[test]
    fn values_go_into_command_env_and_name_but_shell_variables_stay() {
        let template: TaskSpecInput = serde_json::from_value(json!({
            "name": "t", "image": "i",
            "command": "python train.py --lr ${lr} --out $HOME/${RUN}",
            "env": {"LR": "${lr}", "HOME2": "${HOME}"}
        }))
        .unwrap();
        let params = Params::from([("lr".into(), json!(0.001))]);
        let t = trial_input(&template, "sw1", "lr-sweep", 3, &params);
        assert_eq!(
            t.command,
            Some(Command::Shell(
                "python train.py --lr 0.001 --out $HOME/${RUN}".into()
            ))
        );
        assert_eq!(t.env["LR"], "0.001");
        assert_eq!(t.env["HOME2"], "${HOME}");
        assert_eq!(t.name, "lr-sweep-3");
        assert_eq!(t.labels["sweep"], "sw1");
        assert!(check_used(&template, &[&"lr".to_string()]).is_ok());
        let e = check_used(&template, &[&"bs".to_string()]).unwrap_err();
        assert!(e.to_string().contains("${bs}"), "{e}");
    }

    #[test]
    fn bad_requests_name_the_field() {
        let too_big = BTreeMap::from([
            ("a".to_string(), list(json!((0..40).collect::<Vec<_>>()))),
            ("b".to_string(), list(json!((0..40).collect::<Vec<_>>()))),
        ]);
        assert!(trials(&too_big, SweepMethod::Grid, None, 0).is_err());
        let range = BTreeMap::from([(
            "lr".to_string(),
            SweepValues::Range(SweepRange {
                min: 1e-5,
                max: 1e-1,
                log: true,
                integer: false,
            }),
        )]);
        assert!(trials(&range, SweepMethod::Grid, None, 0).is_err());
        assert!(trials(&range, SweepMethod::Random, None, 0).is_err());
        assert!(trials(
            &BTreeMap::from([("x y".to_string(), list(json!([1])))]),
            SweepMethod::Grid,
            None,
            0
        )
        .is_err());
        assert!(trials(
            &BTreeMap::from([("x".to_string(), list(json!([])))]),
            SweepMethod::Grid,
            None,
            0
        )
        .is_err());
    }

    proptest! {
        /// Random draws are repeatable by seed, and stay inside their ranges and lists.
        #[test]
        fn random_draws_stay_in_range(seed in any::<u64>(), n in 1u32..50, lo in -1e3f64..1e3, width in 1f64..1e3) {
            let p = BTreeMap::from([
                ("x".to_string(), SweepValues::Range(SweepRange { min: lo, max: lo + width, log: false, integer: false })),
                ("k".to_string(), SweepValues::Range(SweepRange { min: lo, max: lo + width, log: false, integer: true })),
                ("lr".to_string(), SweepValues::Range(SweepRange { min: 1e-5, max: 1e-1, log: true, integer: false })),
                ("opt".to_string(), list(json!(["adam", "sgd"]))),
            ]);
            let a = trials(&p, SweepMethod::Random, Some(n), seed).unwrap();
            prop_assert_eq!(&a, &trials(&p, SweepMethod::Random, Some(n), seed).unwrap());
            prop_assert_eq!(a.len(), n as usize);
            for t in &a {
                let x = t["x"].as_f64().unwrap();
                prop_assert!(x >= lo - 1e-6 * lo.abs().max(1.0) && x <= lo + width + 1e-6 * (lo + width).abs().max(1.0));
                let k = t["k"].as_i64().unwrap() as f64;
                prop_assert!(k >= lo.ceil() && k <= (lo + width).floor());
                let lr = t["lr"].as_f64().unwrap();
                prop_assert!((1e-5 * 0.999..=1e-1 * 1.001).contains(&lr));
                prop_assert!(t["opt"] == json!("adam") || t["opt"] == json!("sgd"));
            }
        }
    }
}
