//! The agent protocol (docs/agent-protocol.md): the wire types are the server's own, from
//! `autodl_common::agent`, so the two sides cannot drift apart.

pub use autodl_common::agent::*;
pub use autodl_common::tasks::CheckpointSpec;

/// Current time as the protocol writes it.
pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_answer_from_the_protocol_doc_parses() {
        let body = r#"{"assignments": [{
           "task_id": "t1", "attempt": 2, "image": "pytorch/pytorch:2.1",
           "command": ["python", "train.py"], "env": {"KEY": "value", "AUTODL_BATCH_SIZE": "32"},
           "gpu_indices": [0, 1], "gpu_memory": null, "cpu": 8.0, "memory": 34359738368,
           "data_path": null, "checkpoint": {"interval": 600, "save_to": "s3://x"}
         }],
         "stop": [{"task_id": "t0", "attempt": 1, "grace_s": 30, "reason": "preempted"}],
         "heartbeat_s": 5}"#;
        let r: PollResponse = serde_json::from_str(body).unwrap();
        assert_eq!(r.assignments[0].gpu_indices, vec![0, 1]);
        assert_eq!(r.assignments[0].memory, 34359738368);
        assert_eq!(r.stop[0].grace_s, 30);
        assert_eq!(r.heartbeat_s, 5);
        let empty: PollResponse = serde_json::from_str("{}").unwrap();
        assert!(empty.assignments.is_empty() && empty.stop.is_empty());
        let sparse: Assignment = serde_json::from_str(r#"{"task_id": "t", "attempt": 1}"#).unwrap();
        assert_eq!(sparse.image, "");
    }

    #[test]
    fn reports_serialise_as_documented() {
        let f = FinishedReport {
            attempt: 2,
            exit_code: Some(137),
            reason: ExitReason::Oom,
            detail: None,
            uploading: vec![],
            not_kept: None,
        };
        assert_eq!(
            serde_json::to_value(&f).unwrap(),
            serde_json::json!({"attempt": 2, "exit_code": 137, "reason": "oom"})
        );
        let g = AgentGpu {
            index: 0,
            gpu_type: "A100-40G".into(),
            uuid: Some("GPU-1".into()),
            memory: 42949672960,
        };
        assert_eq!(
            serde_json::to_value(&g).unwrap(),
            serde_json::json!({"index": 0, "type": "A100-40G", "uuid": "GPU-1", "memory": 42949672960u64})
        );
        let l = AgentLogLine {
            at: "2024-01-01T00:00:00Z".into(),
            stream: Stream::Stderr,
            line: "x".into(),
            rank: None,
        };
        assert_eq!(serde_json::to_value(&l).unwrap()["stream"], "stderr");
        // The agent stamps `sent_at` when it sends; the batch itself leaves it out.
        let b = LogBatch {
            attempt: 1,
            lines: vec![],
            sent_at: None,
        };
        assert!(serde_json::to_value(&b).unwrap().get("sent_at").is_none());
    }
}
