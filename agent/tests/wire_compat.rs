//! The agent keeps its own protocol types (it must not pull the server's dependencies), so
//! this test pins them to the server's definitions in `autodl-common`: every body the agent
//! sends must parse as the server's type (which rejects unknown fields), and every answer the
//! server builds must parse as the agent's type.

use std::collections::BTreeMap;

use autodl_agent::protocol::{
    Assignment, ExitReason, FinishedReport, GpuInfo, HostReport, LogBatch, LogLine, MetricSample,
    MetricsBatch, NodeReport, PollRequest, PollResponse, ProcessMem, RegisterRequest,
    RegisterResponse, RunningTask, StartedReport, Stream,
};
use autodl_common::agent as server;
use serde::de::DeserializeOwned;
use serde::Serialize;

fn as_server<A: Serialize, S: DeserializeOwned>(ours: &A) -> S {
    let v = serde_json::to_value(ours).unwrap();
    serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("server cannot read {v}: {e}"))
}

fn gpu() -> GpuInfo {
    GpuInfo {
        index: 0,
        gpu_type: "A100-40G".into(),
        uuid: "GPU-1".into(),
        memory: 42949672960,
    }
}

fn host() -> HostReport {
    HostReport {
        runtime: "process".into(),
        isolation: "sandbox".into(),
        data_roots: vec!["/datasets".into()],
    }
}

#[test]
fn agent_requests_parse_as_server_types() {
    let reg = RegisterRequest {
        token: "adlreg_x".into(),
        node: NodeReport {
            id: "n1".into(),
            zone: "z1".into(),
            labels: BTreeMap::from([("rack".into(), "3".into())]),
            cpu: 64,
            memory: 1 << 39,
            gpus: vec![gpu()],
            host: host(),
        },
    };
    let s: server::RegisterRequest = as_server(&reg);
    assert_eq!(s.node.cpu, 64.0);
    assert_eq!(s.node.host.as_ref().unwrap().isolation, "sandbox");
    assert_eq!(s.node.host.unwrap().data_roots, ["/datasets"]);
    assert_eq!(s.node.gpus[0].uuid.as_deref(), Some("GPU-1"));

    let poll = PollRequest {
        running: vec![RunningTask {
            task_id: "t".into(),
            attempt: 2,
        }],
        gpus: vec![gpu()],
        host: host(),
    };
    let s: server::PollRequest = as_server(&poll);
    assert_eq!(s.running[0].attempt, 2);
    assert_eq!(s.host.unwrap().runtime, "process");

    let _: server::AttemptRef = as_server(&StartedReport { attempt: 2 });
    let s: server::LogBatch = as_server(&LogBatch {
        attempt: 2,
        lines: vec![LogLine {
            at: "2026-01-01T00:00:00Z".into(),
            stream: Stream::Stderr,
            line: "x".into(),
        }],
    });
    assert_eq!(s.lines[0].stream, "stderr");
    for (reason, code) in [
        (ExitReason::Success, Some(0)),
        (ExitReason::Oom, Some(1)),
        (ExitReason::Stopped, Some(137)),
        (ExitReason::Error, None),
    ] {
        let s: server::FinishedReport = as_server(&FinishedReport {
            attempt: 2,
            exit_code: code,
            reason,
        });
        assert_eq!(s.reason, reason.as_str());
        assert_eq!(s.exit_code, code.map(i64::from));
    }
    let s: server::MetricBatch = as_server(&MetricsBatch {
        samples: vec![MetricSample {
            at: "2026-01-01T00:00:00Z".into(),
            gpu_index: 0,
            util: 0.9,
            mem_used: 1,
            mem_total: 2,
            temperature: Some(61),
            power_w: Some(250.5),
            processes: vec![ProcessMem {
                pid: 1,
                mem_used: 1,
            }],
            task_id: Some("t".into()),
        }],
    });
    assert_eq!(s.samples[0].temperature, Some(61.0));
}

#[test]
fn server_answers_parse_as_agent_types() {
    let resp = server::PollResponse {
        assignments: vec![server::Assignment {
            task_id: "t".into(),
            attempt: 3,
            image: "img".into(),
            command: vec!["python".into(), "train.py".into()],
            env: BTreeMap::from([("RANK".into(), "0".into())]),
            gpu_indices: vec![0, 1],
            gpu_memory: Some(10 << 30),
            cpu: 8.0,
            memory: 1 << 35,
            data_path: Some("/data".into()),
            checkpoint: Some(autodl_common::tasks::CheckpointSpec {
                interval: Some(600),
                save_to: Some("s3://b".into()),
                keep: Some(2),
            }),
            restore: Some(autodl_common::agent::RestoreRef {
                checkpoint_id: "c1".into(),
                attempt: 2,
                step: Some(40),
                files: vec![autodl_common::agent::ArtifactFile {
                    path: "model/w.pt".into(),
                    size: 12,
                }],
            }),
        }],
        stop: vec![server::StopOrder {
            task_id: "u".into(),
            attempt: 1,
            grace_s: 30,
            reason: "drained".into(),
        }],
        heartbeat_s: 5,
    };
    let ours: PollResponse = serde_json::from_value(serde_json::to_value(&resp).unwrap()).unwrap();
    let a: &Assignment = &ours.assignments[0];
    assert_eq!(a.gpu_memory, Some(10 << 30));
    assert_eq!(a.cpu, Some(8.0));
    assert_eq!(a.checkpoint.as_ref().unwrap().interval, Some(600));
    let r = a.restore.as_ref().unwrap();
    assert_eq!((r.checkpoint_id.as_str(), r.attempt), ("c1", 2));
    assert_eq!(r.files[0].path, "model/w.pt");
    assert_eq!(ours.stop[0].grace_s, 30);
    assert_eq!(ours.heartbeat_s, Some(5));

    let r: RegisterResponse = serde_json::from_value(
        serde_json::to_value(server::RegisterResponse {
            node_id: "n1".into(),
            credential: "adln_x".into(),
        })
        .unwrap(),
    )
    .unwrap();
    assert_eq!(r.credential, "adln_x");
}
