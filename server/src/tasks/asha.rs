//! Asynchronous successive halving (ASHA, Li et al. 2020), as early stopping: a trial that
//! reaches a rung of its progress (`step` or `epoch` it reports) goes on only if the metric it
//! reports there is among the best `1/η` of the trials that reached the rung before it, itself
//! included. Pure: the same reports in the same order always stop the same trials, whenever
//! the server happens to look.

use autodl_common::tasks::{EarlyStopping, MetricGoal, SweepInput};
use serde::{Deserialize, Serialize};

use crate::domain::DomainError;

/// Most rungs a sweep may have: `max_resource / min_resource` up to `η^12`.
const MAX_RUNGS: usize = 12;

/// What a sweep optimises and, for ASHA, how it judges its trials (stored with the sweep).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Objective {
    pub metric: String,
    pub mode: MetricGoal,
    /// Set for ASHA sweeps only.
    pub asha: Option<Asha>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Asha {
    pub resource: String,
    pub min_resource: f64,
    pub max_resource: f64,
    pub reduction_factor: u32,
}

/// The verdict on a trial that reached a rung.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    GoesOn,
    /// Stopped: the sentence its sweep and timeline show.
    Stopped(String),
}

impl Objective {
    /// The objective a sweep's request names, checked: none when it names no metric (and is
    /// not ASHA, which needs one).
    pub fn of(input: &SweepInput) -> Result<Option<Objective>, DomainError> {
        let asha = input.method == autodl_common::tasks::SweepMethod::Asha;
        let Some(metric) = input.metric.as_deref().map(str::trim) else {
            if asha {
                return Err(DomainError::invalid(
                    "metric",
                    "an ASHA sweep needs the metric it judges trials by, e.g. \"metric\": \"val_loss\"",
                ));
            }
            return Ok(None);
        };
        if !crate::domain::names::is_metric_name(metric) {
            return Err(DomainError::invalid(
                "metric",
                format!("{metric:?} is not a metric name (letters, digits, _ . / -)"),
            ));
        }
        let mode = input.mode.unwrap_or(MetricGoal::Min);
        if !asha {
            for (field, set) in [
                ("resource", input.resource.is_some()),
                ("min_resource", input.min_resource.is_some()),
                ("max_resource", input.max_resource.is_some()),
                ("reduction_factor", input.reduction_factor.is_some()),
            ] {
                if set {
                    return Err(DomainError::invalid(
                        field,
                        format!("{field} is for \"method\": \"asha\""),
                    ));
                }
            }
            return Ok(Some(Objective {
                metric: metric.to_owned(),
                mode,
                asha: None,
            }));
        }
        let resource = input.resource.as_deref().unwrap_or("step").trim();
        if !crate::domain::names::is_metric_name(resource) || resource == metric {
            return Err(DomainError::invalid(
                "resource",
                "resource is the reported number that counts progress, e.g. \"step\" or \"epoch\" (not the metric)",
            ));
        }
        let min_resource = input.min_resource.unwrap_or(1.0);
        let max_resource = input.max_resource.ok_or_else(|| {
            DomainError::invalid(
                "max_resource",
                "an ASHA sweep needs max_resource: the step (or epoch) a trial that is never stopped reaches",
            )
        })?;
        if !(min_resource.is_finite() && min_resource > 0.0) {
            return Err(DomainError::invalid(
                "min_resource",
                "min_resource is a number above 0",
            ));
        }
        if !(max_resource.is_finite() && max_resource > min_resource) {
            return Err(DomainError::invalid(
                "max_resource",
                "max_resource is a number above min_resource",
            ));
        }
        let reduction_factor = input.reduction_factor.unwrap_or(3);
        if !(2..=10).contains(&reduction_factor) {
            return Err(DomainError::invalid(
                "reduction_factor",
                "reduction_factor is 2 to 10 (each rung keeps the best 1/reduction_factor)",
            ));
        }
        let a = Asha {
            resource: resource.to_owned(),
            min_resource,
            max_resource,
            reduction_factor,
        };
        if a.rungs().len() > MAX_RUNGS + 1 {
            return Err(DomainError::invalid(
                "min_resource",
                format!(
                    "max_resource / min_resource makes more than {MAX_RUNGS} rungs; raise min_resource"
                ),
            ));
        }
        Ok(Some(Objective {
            metric: metric.to_owned(),
            mode,
            asha: Some(a),
        }))
    }

    /// The value of `value` that is better, by the mode.
    pub fn better(&self, a: f64, b: f64) -> bool {
        match self.mode {
            MetricGoal::Min => a < b,
            MetricGoal::Max => a > b,
        }
    }
}

impl Asha {
    /// The progress at which trials are compared: `min_resource · η^k` below `max_resource`,
    /// then `max_resource` itself (where a trial has finished its budget and is not judged).
    pub fn rungs(&self) -> Vec<f64> {
        let eta = f64::from(self.reduction_factor);
        let mut out = Vec::new();
        let mut r = self.min_resource;
        while r < self.max_resource && out.len() <= MAX_RUNGS + 1 {
            out.push(r);
            r *= eta;
        }
        out.push(self.max_resource);
        out
    }

    /// The rungs (by index) a report at progress `reached` has passed.
    pub fn passed(&self, reached: f64) -> Vec<usize> {
        self.rungs()
            .iter()
            .enumerate()
            .filter(|(_, r)| reached >= **r)
            .map(|(k, _)| k)
            .collect()
    }

    /// As the sweep shows it.
    pub fn shown(&self) -> EarlyStopping {
        EarlyStopping {
            resource: self.resource.clone(),
            rungs: self.rungs(),
            reduction_factor: self.reduction_factor,
        }
    }

    /// The verdict on a trial that recorded `value` at rung `rung`, where `earlier` holds the
    /// values the trials that reached the rung before it recorded (not its own). It goes on
    /// if it is among the best `⌈n/η⌉` of the `n` values, its own included (ties go on); the
    /// last rung judges nobody.
    pub fn judge(
        &self,
        objective: &Objective,
        rung: usize,
        value: f64,
        earlier: &[f64],
    ) -> Verdict {
        let rungs = self.rungs();
        if rung + 1 >= rungs.len() {
            return Verdict::GoesOn;
        }
        let n = earlier.len() + 1;
        let kept = n.div_ceil(self.reduction_factor as usize).max(1);
        let better = earlier
            .iter()
            .filter(|e| objective.better(**e, value))
            .count();
        if better < kept {
            return Verdict::GoesOn;
        }
        let mut sorted: Vec<f64> = earlier.to_vec();
        sorted.sort_by(|a, b| {
            if objective.better(*a, *b) {
                std::cmp::Ordering::Less
            } else if objective.better(*b, *a) {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        });
        let cutoff = sorted[kept - 1];
        Verdict::Stopped(format!(
            "stopped early by ASHA: {} {} at {} {} is not among the best {kept} of {n} trials there (cutoff {})",
            objective.metric,
            shown(value),
            self.resource,
            shown(rungs[rung]),
            shown(cutoff),
        ))
    }
}

/// A number as people read it: enough significant digits to tell close values apart.
fn shown(v: f64) -> String {
    if v == v.trunc() && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.4e}");
        let parsed: f64 = s.parse().unwrap_or(v);
        format!("{parsed}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use autodl_common::tasks::SweepMethod;
    use proptest::prelude::*;

    fn objective(mode: MetricGoal, eta: u32) -> (Objective, Asha) {
        let a = Asha {
            resource: "step".into(),
            min_resource: 1.0,
            max_resource: 27.0,
            reduction_factor: eta,
        };
        (
            Objective {
                metric: "loss".into(),
                mode,
                asha: Some(a.clone()),
            },
            a,
        )
    }

    #[test]
    fn rungs_grow_by_the_reduction_factor_up_to_the_budget() {
        let (_, a) = objective(MetricGoal::Min, 3);
        assert_eq!(a.rungs(), vec![1.0, 3.0, 9.0, 27.0]);
        assert_eq!(a.passed(10.0), vec![0, 1, 2]);
        assert_eq!(a.passed(0.5), Vec::<usize>::new());
        let b = Asha {
            max_resource: 20.0,
            ..a
        };
        assert_eq!(b.rungs(), vec![1.0, 3.0, 9.0, 20.0]);
    }

    #[test]
    fn the_first_at_a_rung_goes_on_and_a_worse_second_is_stopped() {
        let (o, a) = objective(MetricGoal::Min, 3);
        assert_eq!(a.judge(&o, 0, 0.9, &[]), Verdict::GoesOn);
        assert!(matches!(a.judge(&o, 0, 1.2, &[0.9]), Verdict::Stopped(_)));
        assert_eq!(a.judge(&o, 0, 0.8, &[0.9]), Verdict::GoesOn);
        // A tie goes on.
        assert_eq!(a.judge(&o, 0, 0.9, &[0.9]), Verdict::GoesOn);
        // The last rung judges nobody.
        assert_eq!(a.judge(&o, 3, 99.0, &[0.1, 0.2]), Verdict::GoesOn);
        let (o, a) = objective(MetricGoal::Max, 3);
        assert!(matches!(a.judge(&o, 1, 0.5, &[0.9]), Verdict::Stopped(_)));
        match a.judge(&o, 1, 0.5, &[0.9, 0.7, 0.6]) {
            Verdict::Stopped(why) => assert!(
                why.contains("best 2 of 4") && why.contains("cutoff 0.7"),
                "{why}"
            ),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn requests_are_checked() {
        let base = SweepInput {
            name: "s".into(),
            template: Default::default(),
            parameters: Default::default(),
            method: SweepMethod::Asha,
            samples: None,
            seed: None,
            max_concurrency: None,
            metric: Some("val_loss".into()),
            mode: None,
            resource: None,
            min_resource: None,
            max_resource: Some(81.0),
            reduction_factor: None,
        };
        let o = Objective::of(&base).unwrap().unwrap();
        assert_eq!(o.mode, MetricGoal::Min);
        assert_eq!(o.asha.unwrap().rungs(), vec![1.0, 3.0, 9.0, 27.0, 81.0]);
        for (input, field) in [
            (
                SweepInput {
                    metric: None,
                    ..base.clone()
                },
                "metric",
            ),
            (
                SweepInput {
                    max_resource: None,
                    ..base.clone()
                },
                "max_resource",
            ),
            (
                SweepInput {
                    max_resource: Some(0.5),
                    ..base.clone()
                },
                "max_resource",
            ),
            (
                SweepInput {
                    reduction_factor: Some(1),
                    ..base.clone()
                },
                "reduction_factor",
            ),
            (
                SweepInput {
                    resource: Some("val_loss".into()),
                    ..base.clone()
                },
                "resource",
            ),
            (
                SweepInput {
                    min_resource: Some(1e-9),
                    ..base.clone()
                },
                "min_resource",
            ),
            (
                SweepInput {
                    method: SweepMethod::Grid,
                    ..base.clone()
                },
                "max_resource",
            ),
        ] {
            match Objective::of(&input) {
                Err(DomainError::Invalid { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
        let grid = SweepInput {
            method: SweepMethod::Grid,
            max_resource: None,
            ..base
        };
        assert_eq!(Objective::of(&grid).unwrap().unwrap().asha, None);
    }

    proptest! {
        /// Whatever the order and values, the best value reported at a rung so far is never
        /// stopped, and a trial that goes on is within the best ⌈n/η⌉ of the `n` there.
        #[test]
        fn the_best_so_far_always_goes_on(values in proptest::collection::vec(-1e6f64..1e6, 1..60), eta in 2u32..6, max in any::<bool>()) {
            let (o, a) = objective(if max { MetricGoal::Max } else { MetricGoal::Min }, eta);
            let mut earlier: Vec<f64> = Vec::new();
            for v in &values {
                let best_so_far = earlier.iter().all(|e| !o.better(*e, *v));
                let verdict = a.judge(&o, 0, *v, &earlier);
                if best_so_far {
                    prop_assert_eq!(&verdict, &Verdict::GoesOn);
                }
                let ahead = earlier.iter().filter(|e| o.better(**e, *v)).count();
                let kept = (earlier.len() + 1).div_ceil(eta as usize);
                prop_assert_eq!(verdict == Verdict::GoesOn, ahead < kept);
                earlier.push(*v);
            }
        }
    }
}
