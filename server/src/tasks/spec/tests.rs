//! The spec's rules, each shown by the field it names.

use super::*;
use autodl_common::tasks::{GpuRequest, Resources, Size, TimeSpan};

#[test]
fn an_entry_point_is_a_script_and_its_arguments_checked_on_the_node() {
    let spec = normalise(
        TaskSpecInput {
            command: None,
            entry_point: Some("train.py --epochs 3 --note 'two words'".into()),
            ..base()
        },
        0,
    )
    .unwrap();
    assert_eq!(
        spec.command,
        ["python", "train.py", "--epochs", "3", "--note", "two words"]
    );
    let argv = launch_command(&spec);
    assert_eq!(&argv[..2], ["/bin/sh", "-c"]);
    assert_eq!(
        &argv[3..],
        [
            "autodl-entry-point",
            "train.py",
            "--epochs",
            "3",
            "--note",
            "two words"
        ]
    );
    // A command is run as given.
    let plain = normalise(base(), 0).unwrap();
    assert_eq!(launch_command(&plain), plain.command);
    let unclosed = normalise(
        TaskSpecInput {
            command: None,
            entry_point: Some("train.py 'oops".into()),
            ..base()
        },
        0,
    )
    .unwrap_err();
    assert!(
        format!("{unclosed:?}").contains("entry_point"),
        "{unclosed:?}"
    );
}

fn base() -> TaskSpecInput {
    TaskSpecInput {
        name: "train".into(),
        image: "pytorch:2".into(),
        command: Some(Command::Shell("python train.py".into())),
        ..Default::default()
    }
}

/// Clone and retry go spec -> request -> submit form -> request: every field of the spec
/// must come back as it was.
#[test]
fn every_spec_field_survives_the_submit_form() {
    use autodl_common::tasks::{Affinity, AfterFailure, AfterWhen, CheckpointInput, RetryPolicy};
    use autodl_frontend::form::FormValues;
    let now = 1_700_000_000;
    let full = TaskSpecInput {
        name: "sweep lr=3e-4".into(),
        image: "registry.example/lab/train:2".into(),
        command: Some(Command::Argv(vec![
            "python".into(),
            "train.py".into(),
            "--note".into(),
            "two words".into(),
            "it's \"quoted\"".into(),
            String::new(),
        ])),
        env: [
            ("EPOCHS".into(), "10".into()),
            ("MODE".into(), "a=b".into()),
            ("PS1".into(), "> ".into()),
            ("SCRIPT".into(), "set -e\nmake all\r\n".into()),
            ("QUOTED".into(), "\"a\" and \"b\"".into()),
            ("JSONISH".into(), "\"x\"".into()),
        ]
        .into(),
        resources: Resources {
            gpu: Some(GpuRequest {
                gpu_type: Some(OneOrMany::Many(vec!["A100".into(), "H100".into()])),
                count: Some(2),
                memory: Some(Size::Text("20GiB".into())),
            }),
            cpu: Some(6.5),
            memory: Some(Size::Bytes((48 << 30) + 12_345)),
        },
        num_workers: Some(autodl_common::tasks::WorkerCount::Fixed(2)),
        launcher: Some(autodl_common::tasks::Launcher::Torchrun),
        priority: Some(0.85),
        deadline: Some("2023-11-20T10:00:00Z".into()),
        estimated_runtime: Some(TimeSpan::Seconds(5_400)),
        time_limit: Some(TimeSpan::Seconds(9_000)),
        checkpoint: Some(CheckpointInput {
            interval: Some(TimeSpan::Text("10m".into())),
            save_to: Some("s3://ckpt/lab/run".into()),
            keep: Some(3),
        }),
        retry_policy: Some(RetryPolicy {
            max_retries: 4,
            oom_recovery: true,
        }),
        affinity: Some(Affinity {
            zone: Some("same".into()),
            bandwidth: Some("high".into()),
        }),
        data_path: Some("s3://data/imagenet".into()),
        code: Some(autodl_common::bundle::id_of(b"code")),
        setup: Some(autodl_common::tasks::Script::Lines(vec![
            "pip install -e .".into(),
            "make -C ext".into(),
        ])),
        requirements: Some("env/requirements.txt".into()),
        labels: [("team".into(), "vision".into())].into(),
        batch_size: Some(256),
        preemptible: Some(false),
        after: vec!["01a23773-4702-77c3-a2e8-b48ccd2749ca".into()],
        after_when: Some(AfterWhen::Any),
        after_failure: Some(AfterFailure::Fail),
        ..Default::default()
    };
    let default_checkpoints = TaskSpecInput {
        checkpoint: Some(CheckpointInput {
            interval: None,
            save_to: None,
            keep: None,
        }),
        labels: [("note".into(), " spaced ".into())].into(),
        ..base()
    };
    let cpu_only = TaskSpecInput {
        command: Some(Command::Shell(
            "echo \"$HOME\" && python -c 'print(1)'".into(),
        )),
        resources: Resources {
            gpu: Some(GpuRequest {
                count: Some(0),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..base()
    };
    for input in [full, default_checkpoints, cpu_only, base()] {
        let spec = normalise(input, now).unwrap();
        let form = FormValues::from_input(&spec.to_input());
        let back = normalise(form.to_input().unwrap(), now).unwrap();
        assert_eq!(back, spec);
    }
}

#[test]
fn sizes_and_defaults() {
    let mut i = base();
    i.resources = Resources {
        gpu: Some(GpuRequest {
            gpu_type: Some(OneOrMany::One("A100".into())),
            count: Some(2),
            memory: Some(Size::Text("20GiB".into())),
        }),
        cpu: Some(8.0),
        memory: Some(Size::Text("32GiB".into())),
    };
    let s = normalise(i, 1_700_000_000).unwrap();
    assert_eq!(s.gpu_memory, Some(20 << 30));
    assert_eq!(s.memory, 32 << 30);
    assert_eq!(s.gpus_per_worker, 2);
    assert_eq!(s.priority, 0.5);
    assert_eq!(s.command, vec!["/bin/sh", "-c", "python train.py"]);
    assert_eq!(s.retry_policy.max_retries, 0);
    // OOM recovery alone retries; a count given is kept.
    let mut i = base();
    i.retry_policy = Some(RetryPolicy {
        max_retries: 0,
        oom_recovery: true,
    });
    let s = normalise(i.clone(), 1_700_000_000).unwrap();
    assert_eq!(s.retry_policy.max_retries, DEFAULT_OOM_RETRIES);
    i.retry_policy.as_mut().unwrap().max_retries = 1;
    assert_eq!(normalise(i, 0).unwrap().retry_policy.max_retries, 1);
}

#[test]
fn spans_are_seconds_or_text() {
    let span = |s: &str| parse_span("time_limit", &TimeSpan::Text(s.into()));
    assert_eq!(span("2h30m").unwrap(), 9_000);
    assert_eq!(span("2h 30m").unwrap(), 9_000);
    assert_eq!(span("90m").unwrap(), 5_400);
    assert_eq!(span("1d 12h").unwrap(), 129_600);
    assert_eq!(span(" 45 ").unwrap(), 45);
    assert_eq!(
        parse_span("time_limit", &TimeSpan::Seconds(600)).unwrap(),
        600
    );
    for bad in ["soon", "0", "0s", "-5m", "400d"] {
        let e = span(bad).unwrap_err();
        assert!(
            matches!(&e, DomainError::Invalid { field, .. } if *field == "time_limit"),
            "{bad}: {e}"
        );
    }
    assert!(span("soon").unwrap_err().to_string().contains("\"2h30m\""));
}

#[test]
fn deadlines() {
    assert_eq!(parse_deadline("2024-03-20T18:00").unwrap(), 1710957600);
    assert_eq!(parse_deadline("2024-03-20T18:00:00Z").unwrap(), 1710957600);
    assert_eq!(
        parse_deadline("2024-03-20T19:00:00+01:00").unwrap(),
        1710957600
    );
    assert!(parse_deadline("tomorrow").is_err());
}

#[test]
fn rejects_bad_fields() {
    type Mutation = fn(&mut TaskSpecInput);
    let cases: Vec<(Mutation, &str)> = vec![
        (|i| i.name = " ".into(), "name"),
        (|i| i.priority = Some(1.5), "priority"),
        (
            |i| i.num_workers = Some(autodl_common::tasks::WorkerCount::Fixed(0)),
            "num_workers",
        ),
        (|i| i.command = None, "command"),
        (
            |i| {
                i.env.insert("AUTODL_TASK_ID".into(), "x".into());
            },
            "env",
        ),
        (
            |i| {
                i.env.insert("1BAD".into(), "x".into());
            },
            "env",
        ),
        (|i| i.deadline = Some("soon".into()), "deadline"),
        (
            |i| i.deadline = Some("2023-11-14T22:13:19Z".into()),
            "deadline",
        ),
        (|i| i.data_path = Some("datasets/x".into()), "data_path"),
        (|i| i.data_path = Some("/datasets/./x".into()), "data_path"),
        (
            |i| i.resources.memory = Some(Size::Text("lots".into())),
            "resources.memory",
        ),
        (
            |i| {
                i.affinity = Some(autodl_common::tasks::Affinity {
                    zone: Some("near".into()),
                    bandwidth: None,
                })
            },
            "affinity.zone",
        ),
        (
            |i| i.data_path = Some("s3://b/../other".into()),
            "data_path",
        ),
        (|i| i.batch_size = Some(0), "batch_size"),
    ];
    for (mutate, field) in cases {
        let mut i = base();
        mutate(&mut i);
        match normalise(i, 1_700_000_000) {
            Err(DomainError::Invalid { field: f, .. }) => assert_eq!(f, field),
            other => panic!("expected a validation error on {field}, got {other:?}"),
        }
    }
}

#[test]
fn num_workers_is_a_number_or_an_elastic_range() {
    use autodl_common::tasks::{TaskKind, WorkerCount, WorkerRange};
    let with = |n: WorkerCount| {
        normalise(
            TaskSpecInput {
                num_workers: Some(n),
                batch_size: Some(256),
                global_batch: Some(true),
                ..base()
            },
            0,
        )
    };
    let range = |min, max| WorkerCount::Range(WorkerRange { min, max });
    let s = with(range(2, 8)).unwrap();
    assert_eq!((s.num_workers, s.min_workers), (8, Some(2)));
    assert!(s.global_batch);
    let s = with(WorkerCount::Fixed(4)).unwrap();
    assert_eq!((s.num_workers, s.min_workers), (4, None));
    // A range of one width is that width.
    assert_eq!(with(range(3, 3)).unwrap().min_workers, None);
    for bad in [range(5, 2), range(0, 4), range(2, 65)] {
        let e = with(bad).unwrap_err();
        assert!(format!("{e:?}").contains("num_workers"), "{bad:?}: {e:?}");
    }
    // A session runs a fixed number.
    let e = normalise(
        TaskSpecInput {
            num_workers: Some(range(1, 2)),
            kind: Some(TaskKind::Session),
            ..base()
        },
        0,
    )
    .unwrap_err();
    assert!(format!("{e:?}").contains("num_workers"), "{e:?}");
    // A global batch needs a batch.
    let e = normalise(
        TaskSpecInput {
            global_batch: Some(true),
            ..base()
        },
        0,
    )
    .unwrap_err();
    assert!(format!("{e:?}").contains("global_batch"), "{e:?}");
    // The form's text and the wire's JSON.
    assert_eq!("2-8".parse::<WorkerCount>().unwrap(), range(2, 8));
    assert_eq!(range(2, 8).to_string(), "2-8");
    let json: WorkerCount = serde_json::from_str(r#"{"min": 2, "max": 8}"#).unwrap();
    assert_eq!(json, range(2, 8));
    assert!(serde_json::from_str::<WorkerCount>(r#"{"min": 2, "most": 8}"#).is_err());
}

#[test]
fn every_spec_handed_out_submits_the_same_task_again() {
    use autodl_common::tasks::{
        Affinity, CheckpointInput, RetryPolicy as RetryInput, TaskKind, WorkerCount, WorkerRange,
    };
    let inputs = [
        base(),
        TaskSpecInput {
            command: None,
            entry_point: Some("train.py --lr 3e-4".into()),
            num_workers: Some(WorkerCount::Range(WorkerRange { min: 2, max: 4 })),
            batch_size: Some(64),
            global_batch: Some(true),
            resources: Resources {
                gpu: Some(GpuRequest {
                    gpu_type: Some(OneOrMany::Many(vec!["A100".into(), "H100".into()])),
                    count: Some(2),
                    memory: Some(Size::Text("20GiB".into())),
                }),
                cpu: Some(4.0),
                memory: Some(Size::Text("32GiB".into())),
            },
            estimated_runtime: Some(TimeSpan::Text("2h30m".into())),
            time_limit: Some(TimeSpan::Seconds(36_000)),
            checkpoint: Some(CheckpointInput {
                interval: Some(TimeSpan::Text("10m".into())),
                save_to: None,
                keep: Some(3),
            }),
            retry_policy: Some(RetryInput {
                max_retries: 2,
                oom_recovery: true,
            }),
            affinity: Some(Affinity {
                zone: Some("same".into()),
                bandwidth: Some("high".into()),
            }),
            labels: [("team".to_string(), "vision".to_string())].into(),
            ..base()
        },
        TaskSpecInput {
            command: Some(Command::Argv(vec![
                "python".into(),
                "-c".into(),
                "print(1)".into(),
            ])),
            kind: Some(TaskKind::Session),
            ports: vec![8888],
            preemptible: Some(true),
            ..base()
        },
    ];
    for input in inputs {
        let spec = normalise(input.clone(), 0).unwrap();
        let again = normalise(spec.to_input(), 0)
            .unwrap_or_else(|e| panic!("{input:?} handed out as a spec it refuses: {e:?}"));
        assert_eq!(again, spec, "{input:?}");
    }
}

#[test]
fn an_environment_is_setup_commands_and_a_requirements_file_of_the_code() {
    let code = Some(autodl_common::bundle::id_of(b"code"));
    let spec = normalise(
        TaskSpecInput {
            code: code.clone(),
            setup: Some(autodl_common::tasks::Script::Lines(vec![
                "pip install -e .".into(),
                "echo ok".into(),
            ])),
            requirements: Some("requirements.txt".into()),
            ..base()
        },
        0,
    )
    .unwrap();
    assert_eq!(spec.setup.as_deref(), Some("pip install -e .\necho ok"));
    assert_eq!(spec.requirements.as_deref(), Some("requirements.txt"));
    // Empty is none.
    let none = normalise(
        TaskSpecInput {
            setup: Some(autodl_common::tasks::Script::Text("  ".into())),
            requirements: Some(String::new()),
            code: code.clone(),
            ..base()
        },
        0,
    )
    .unwrap();
    assert_eq!((none.setup, none.requirements), (None, None));
    for (input, field, says) in [
        (
            TaskSpecInput {
                setup: Some(autodl_common::tasks::Script::Lines(vec!["a\nb".into()])),
                ..base()
            },
            "setup",
            "one line",
        ),
        (
            TaskSpecInput {
                setup: Some(autodl_common::tasks::Script::Text("echo \u{7}".into())),
                ..base()
            },
            "setup",
            "control characters",
        ),
        (
            TaskSpecInput {
                code: code.clone(),
                requirements: Some("../secrets.txt".into()),
                ..base()
            },
            "requirements",
            "relative path",
        ),
        (
            TaskSpecInput {
                code: code.clone(),
                requirements: Some("/etc/passwd".into()),
                ..base()
            },
            "requirements",
            "relative path",
        ),
        (
            TaskSpecInput {
                requirements: Some("requirements.txt".into()),
                ..base()
            },
            "requirements",
            "give code",
        ),
    ] {
        match normalise(input, 0) {
            Err(DomainError::Invalid { field: f, message }) => {
                assert_eq!(f, field, "{message}");
                assert!(message.contains(says), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
}
