//! What ASHA saves: a sweep whose trials report a learning curve each step, run once as a
//! plain grid (every trial its whole budget) and once with ASHA stopping the trials behind,
//! on the same GPUs with the same curves. The judge is the server's own
//! (`tasks::asha`); the trials' order of arrival at each rung is the simulated time's, as the
//! server sees reports arrive.
//!
//! Run: `cargo bench -p autodl-server --bench asha [-- SWEEPS]` (default 20 sweeps, each with
//! its own noise). Prints GPU-hours for both, and whether ASHA found the grid's best trial.

use std::collections::BTreeMap;

use autodl_common::tasks::MetricGoal;
use autodl_server::tasks::asha::{Asha, Objective, Verdict};
use rand::{Rng, SeedableRng};

#[derive(Clone, Copy, Debug)]
enum Curves {
    Coherent,
    Crossing,
}

/// One configuration of the grid and the learning curve it follows.
#[derive(Clone)]
struct Config {
    lr: f64,
    width: f64,
    dropout: f64,
}

impl Config {
    /// A validation loss curve: a floor set by how good the configuration is, approached at
    /// a rate. `Curves::Coherent`: a good configuration also learns faster (the usual shape
    /// of a learning-rate and width search). `Curves::Crossing`: a high learning rate learns
    /// fast and settles high, a low one slowly and low, so early leaders are not the final
    /// ones: what makes stopping early a risk.
    fn loss(&self, curves: Curves, step: u32, noise: f64) -> f64 {
        let off = (self.lr / 1e-3).log10();
        let floor = 0.20
            + 0.08 * off * off
            + 0.03 * (256.0 / self.width - 1.0)
            + 0.2 * (self.dropout - 0.1).abs();
        let rate = match curves {
            Curves::Coherent => 0.6 - 0.15 * off.abs() + 0.05 * self.width / 256.0,
            Curves::Crossing => 0.35 + 0.25 * off.clamp(-1.5, 1.5),
        };
        floor + 2.0 * f64::from(step).powf(-rate.max(0.1)) + noise
    }

    /// GPU time of one step, in hours (a wider model is slower).
    fn step_hours(&self) -> f64 {
        self.width / 128.0 / 60.0
    }
}

fn grid() -> Vec<Config> {
    let mut out = Vec::new();
    for lr in [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2] {
        for width in [64.0, 128.0, 256.0] {
            for dropout in [0.0, 0.1, 0.3] {
                out.push(Config { lr, width, dropout });
            }
        }
    }
    out
}

struct Outcome {
    gpu_hours: f64,
    /// (trial, final loss) of the best trial that ran its budget.
    best: (usize, f64),
    stopped: usize,
    /// Hours from the first start to the last end.
    makespan: f64,
}

/// Runs the sweep on `gpus` GPUs, trials started in order as GPUs free up; `asha` judges
/// each report that reaches a rung, as the server does.
fn run(
    configs: &[Config],
    curves: Curves,
    noise: &[Vec<f64>],
    max_steps: u32,
    gpus: usize,
    asha: Option<(&Objective, &Asha)>,
) -> Outcome {
    // (time of its next report, trial, step it reports)
    let mut running: Vec<(f64, usize, u32)> = Vec::new();
    let mut next = 0usize;
    let mut now = 0.0f64;
    let mut used = 0.0f64;
    let mut finals: BTreeMap<usize, f64> = BTreeMap::new();
    // rung → values in the order they were recorded
    let mut rungs: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    let mut recorded: BTreeMap<usize, usize> = BTreeMap::new();
    let mut stopped = 0;
    loop {
        while running.len() < gpus && next < configs.len() {
            running.push((now + configs[next].step_hours(), next, 1));
            next += 1;
        }
        // The earliest report; ties in trial order.
        let Some(i) = (0..running.len()).min_by(|a, b| {
            running[*a]
                .0
                .total_cmp(&running[*b].0)
                .then(running[*a].1.cmp(&running[*b].1))
        }) else {
            break;
        };
        let (at, trial, step) = running[i];
        now = at;
        used += configs[trial].step_hours();
        let loss = configs[trial].loss(curves, step, noise[trial][step as usize - 1]);
        let ended = step == max_steps;
        if let Some((objective, a)) = asha {
            let done = recorded.get(&trial).copied().unwrap_or(0);
            let passed = a.passed(f64::from(step));
            if passed.len() > done {
                let top = passed.len() - 1;
                for k in done..passed.len() {
                    rungs.entry(k).or_default();
                }
                let earlier = rungs[&top].clone();
                for k in done..passed.len() {
                    rungs.get_mut(&k).expect("made above").push(loss);
                }
                recorded.insert(trial, passed.len());
                if let Verdict::Stopped(_) = a.judge(objective, top, loss, &earlier) {
                    stopped += 1;
                    running.swap_remove(i);
                    continue;
                }
            }
        }
        if ended {
            finals.insert(trial, loss);
            running.swap_remove(i);
        } else {
            running[i] = (at + configs[trial].step_hours(), trial, step + 1);
        }
    }
    let best = finals
        .iter()
        .map(|(t, l)| (*t, *l))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap_or((usize::MAX, f64::NAN));
    Outcome {
        gpu_hours: used,
        best,
        stopped,
        makespan: now,
    }
}

fn main() {
    let sweeps: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(20);
    let configs = grid();
    let max_steps = 81;
    let gpus = 8;
    let a = Asha {
        resource: "step".into(),
        min_resource: 1.0,
        max_resource: f64::from(max_steps),
        reduction_factor: 3,
    };
    let objective = Objective {
        metric: "val_loss".into(),
        mode: MetricGoal::Min,
        asha: Some(a.clone()),
    };
    println!(
        "{} trials (6 lr x 3 width x 3 dropout), {max_steps} steps each, {gpus} GPUs, rungs {:?}, reduction factor 3",
        configs.len(),
        a.rungs()
    );
    for curves in [Curves::Coherent, Curves::Crossing] {
        println!("\n{curves:?} learning curves");
        println!("sweep  grid GPU-h  ASHA GPU-h  saved  stopped  grid best (trial, loss)  ASHA best  same  grid h  ASHA h");
        let (mut saved_all, mut same, mut regret) = (Vec::new(), 0, Vec::new());
        for seed in 0..sweeps {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let noise: Vec<Vec<f64>> = configs
                .iter()
                .map(|_| (0..max_steps).map(|_| rng.gen_range(-0.01..0.01)).collect())
                .collect();
            let g = run(&configs, curves, &noise, max_steps, gpus, None);
            let s = run(
                &configs,
                curves,
                &noise,
                max_steps,
                gpus,
                Some((&objective, &a)),
            );
            let saved = 1.0 - s.gpu_hours / g.gpu_hours;
            saved_all.push(saved);
            if s.best.0 == g.best.0 {
                same += 1;
            }
            regret.push(s.best.1 - g.best.1);
            println!(
                "{seed:>5}  {:>10.1}  {:>10.1}  {:>4.0}%  {:>7}  ({:>2}, {:.4})             ({:>2}, {:.4})  {}  {:>6.1}  {:>6.1}",
                g.gpu_hours,
                s.gpu_hours,
                saved * 100.0,
                s.stopped,
                g.best.0,
                g.best.1,
                s.best.0,
                s.best.1,
                if s.best.0 == g.best.0 { "yes " } else { "no  " },
                g.makespan,
                s.makespan
            );
        }
        saved_all.sort_by(f64::total_cmp);
        regret.sort_by(f64::total_cmp);
        println!(
            "{curves:?} curves: ASHA saved {:.0}% of the grid's GPU-hours (median; {:.0}% to {:.0}%), found the grid's best trial in {same} of {sweeps} sweeps, worst gap to the grid's best loss {:.4}",
            saved_all[saved_all.len() / 2] * 100.0,
            saved_all[0] * 100.0,
            saved_all[saved_all.len() - 1] * 100.0,
            regret.last().copied().unwrap_or(0.0)
        );
    }
}
