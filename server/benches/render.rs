//! Server time to answer what the dashboard, the task list and a task's page need, with
//! 10,000 tasks in the tenant: each server-rendered page with its data (the server reads the
//! API as the signed-in caller while it renders; the bench checks the data is in the HTML),
//! and the API reads behind it on their own. Timed from the client, one request at a time,
//! after a warm-up.
//!
//!   cargo bench -p autodl-server --bench render
//!   (AUTODL_BENCH_TASKS, default 10000; AUTODL_BENCH_ROUNDS, default 200;
//!    AUTODL_BENCH_PG_URL=postgres://… for PostgreSQL)

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod support;
use support::env_num;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n_tasks = env_num("AUTODL_BENCH_TASKS", 10_000);
    let rounds = env_num("AUTODL_BENCH_ROUNDS", 200) as usize;
    // No scheduler: the tasks stay where this bench puts them (pending or cancelled).
    let server = support::start_with(|s| s.run_scheduler = false).await?;
    let (base, backend) = (server.base.clone(), server.backend);

    let http = reqwest::Client::builder().cookie_store(true).build()?;
    let op_token = support::operator(&server, &reqwest::Client::new()).await?;
    reqwest::Client::new()
        .post(format!("{base}/api/v1/admin/nodes"))
        .bearer_auth(&op_token)
        .json(&json!({"id": "node-a", "cpu": 64, "memory": "512GiB", "gpus": {"type": "A100-40G", "count": 8, "memory": "40GiB"}}))
        .send()
        .await?
        .error_for_status()?;
    // The researcher signs up in the client that keeps cookies, as a browser would.
    let user = support::signup(&http, &base, "ada@example.com", "Lab").await?;
    let token = Arc::new(user["token"].as_str().unwrap_or_default().to_owned());
    // Fill the tenant: submissions from 16 clients; four in five are then cancelled so the
    // list holds a realistic mix of finished and waiting work.
    let fill = Instant::now();
    let mut workers = Vec::new();
    for c in 0..16u64 {
        let (base, token) = (base.clone(), token.clone());
        workers.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut ids = Vec::new();
            let mut i = c;
            while i < n_tasks {
                let body = json!({"name": format!("run-{i}"), "image": "pytorch:2", "command": "python train.py",
                                  "labels": {"sweep": format!("s{}", i % 20)},
                                  "resources": {"gpu": {"type": "A100-40G", "count": 1}}});
                let r = http
                    .post(format!("{base}/api/v1/tasks"))
                    .bearer_auth(token.as_str())
                    .json(&body)
                    .send()
                    .await?;
                if r.status().as_u16() != 201 {
                    anyhow::bail!("submission {i}: {} {}", r.status(), r.text().await?);
                }
                let t: Value = r.json().await?;
                if i % 5 != 0 {
                    ids.push(t["id"].as_str().unwrap_or_default().to_owned());
                }
                i += 16;
            }
            for id in ids {
                http.post(format!("{base}/api/v1/tasks/{id}/cancel"))
                    .bearer_auth(token.as_str())
                    .send()
                    .await?
                    .error_for_status()?;
            }
            anyhow::Ok(())
        }));
    }
    for w in workers {
        w.await??;
    }
    eprintln!(
        "{backend}: {n_tasks} tasks stored in {:.1} s",
        fill.elapsed().as_secs_f64()
    );

    let first: Value = http
        .get(format!("{base}/api/v1/tasks?limit=25"))
        .bearer_auth(token.as_str())
        .send()
        .await?
        .json()
        .await?;
    let cursor = first["next_cursor"].as_str().unwrap_or_default().to_owned();
    let newest = &first["items"][0];
    let (task_id, task_name) = (
        newest["id"].as_str().unwrap_or_default().to_owned(),
        newest["name"].as_str().unwrap_or_default().to_owned(),
    );
    let waiting: Value = http
        .get(format!("{base}/api/v1/tasks?limit=1&state=pending&user=me"))
        .bearer_auth(token.as_str())
        .send()
        .await?
        .json()
        .await?;
    let waiting_name = waiting["items"][0]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    // (what, where, an API read, what a rendered page must hold)
    let targets: Vec<(&str, String, bool, Option<&str>)> = vec![
        (
            "dashboard page (SSR)",
            format!("{base}/"),
            false,
            Some(waiting_name.as_str()),
        ),
        (
            "  running tasks (API)",
            format!("{base}/api/v1/tasks?user=me&state=running&limit=50"),
            true,
            None,
        ),
        (
            "  waiting tasks (API)",
            format!("{base}/api/v1/tasks?user=me&state=pending&limit=50"),
            true,
            None,
        ),
        (
            "  tenant quota (API)",
            format!("{base}/api/v1/tenant/quota"),
            true,
            None,
        ),
        (
            "task list page (SSR)",
            format!("{base}/tasks"),
            false,
            Some(task_name.as_str()),
        ),
        (
            "  first 25 (API)",
            format!("{base}/api/v1/tasks?limit=25"),
            true,
            None,
        ),
        (
            "  page 2 (API)",
            format!("{base}/api/v1/tasks?limit=25&cursor={cursor}"),
            true,
            None,
        ),
        (
            "  state=cancelled (API)",
            format!("{base}/api/v1/tasks?limit=25&state=cancelled"),
            true,
            None,
        ),
        (
            "  label sweep=s7 (API)",
            format!("{base}/api/v1/tasks?limit=25&label=sweep%3Ds7"),
            true,
            None,
        ),
        (
            "task page (SSR)",
            format!("{base}/tasks/{task_id}"),
            false,
            Some(task_name.as_str()),
        ),
        (
            "  the task (API)",
            format!("{base}/api/v1/tasks/{task_id}"),
            true,
            None,
        ),
    ];
    println!("{backend}, {n_tasks} tasks in the tenant, {rounds} requests each:");
    println!(
        "{:<26} {:>9} {:>9} {:>9} {:>9}",
        "", "p50 ms", "p95 ms", "max ms", "bytes"
    );
    for (name, url, api, holds) in targets {
        let mut size = 0;
        let mut times = Vec::with_capacity(rounds);
        for round in 0..rounds + 10 {
            let mut req = http.get(&url);
            if api {
                req = req.bearer_auth(token.as_str());
            }
            let t = Instant::now();
            let res = req.send().await?;
            let status = res.status();
            let body = res.bytes().await?;
            let took = t.elapsed();
            if !status.is_success() || body.is_empty() {
                anyhow::bail!("{url}: {status}");
            }
            if let Some(text) = holds {
                if !String::from_utf8_lossy(&body).contains(text) {
                    anyhow::bail!("{url} was rendered without its data ({text:?} missing)");
                }
            }
            size = body.len();
            if round >= 10 {
                times.push(took);
            }
        }
        times.sort();
        let pct = |p: f64| times[((times.len() as f64 * p) as usize).min(times.len() - 1)];
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "{name:<26} {:>9.2} {:>9.2} {:>9.2} {:>9}",
            ms(pct(0.50)),
            ms(pct(0.95)),
            ms(*times.last().unwrap_or(&Duration::ZERO)),
            size
        );
    }
    Ok(())
}
