use super::*;
use serde_json::json;

fn node() -> NodeIdentity {
    NodeIdentity {
        hostname: "gpu-07".into(),
        kernel: "6.18.0".into(),
        os: "Debian GNU/Linux 12 (bookworm)".into(),
        architecture: "x86_64".into(),
        cpus: 2,
        numa_nodes: 1,
        gpus: vec![GpuInfo {
            index: 0,
            pci_address: "0000:17:00.0".into(),
            vendor: "nvidia".into(),
            name: Some("H200".into()),
            numa_node: Some(0),
        }],
        daemon_version: "0.1.0".into(),
        daemon_started_at_ms: 1_700_000_000_000,
    }
}

fn host() -> HostMetrics {
    HostMetrics {
        cpu_utilization_pct: 12.5,
        per_cpu_utilization_pct: vec![10.0, 15.0],
        iowait_pct: 0.5,
        load1: 0.3,
        load5: 0.2,
        load15: 0.1,
        memory: MemoryMetrics {
            total_bytes: 24 << 30,
            available_bytes: 20 << 30,
            used_bytes: 4 << 30,
            used_pct: 16.7,
            cached_bytes: 1 << 30,
            swap_total_bytes: 0,
            swap_used_bytes: 0,
        },
        pressure: Some(PressureMetrics {
            cpu_some_avg10: 0.1,
            memory_some_avg10: 0.0,
            memory_full_avg10: 0.0,
            io_some_avg10: 0.0,
        }),
        numa: vec![NumaNodeMetrics { node: 0, cpus: vec![0, 1], mem_total_bytes: 24 << 30, mem_free_bytes: 20 << 30 }],
        uptime_s: 1234.5,
        procs_running: 1,
        procs_blocked: 0,
        context_switches_total: 99,
    }
}

fn alert() -> Alert {
    Alert {
        id: 7,
        alert_type: AlertType::HighDropRate,
        rule: None,
        severity: Severity::Error,
        source: "kernel:echo0".into(),
        labels: [("team".to_string(), "ml".to_string())].into(),
        message: "drop rate 6.0% over 10 s".into(),
        value: 0.06,
        threshold: 0.05,
        raised_at_ms: 1,
        updated_at_ms: 2,
        resolved_at_ms: None,
        acknowledgement: Some(Acknowledgement {
            by: "ana".into(),
            token: "ops".into(),
            at_ms: 3,
            note: Some("looking".into()),
        }),
        occurrence: 1,
        flapping: false,
        transitions: vec![
            AlertTransition {
                at_ms: 1,
                kind: TransitionKind::Raised,
                severity: Severity::Error,
                value: 0.06,
                by: None,
                note: None,
            },
            AlertTransition {
                at_ms: 3,
                kind: TransitionKind::Acknowledged,
                severity: Severity::Error,
                value: 0.06,
                by: Some("ana".into()),
                note: Some("looking".into()),
            },
        ],
        silenced: Some(crate::Silenced {
            silence_id: 4,
            by: "bo".into(),
            until_ms: Some(3_600_000),
            comment: "known".into(),
            maintenance: None,
        }),
    }
}

fn silence() -> crate::Silence {
    crate::Silence {
        id: 4,
        matchers: vec![crate::Matcher::new("source", "kernel:echo0")],
        starts_at_ms: 1,
        ends_at_ms: Some(3_600_000),
        comment: "known".into(),
        created_by: "bo".into(),
        created_at_ms: 1,
        expired_at_ms: None,
        expired_by: None,
        maintenance: None,
    }
}

#[test]
fn a_job_id_is_percent_encoded_into_the_fleet_link() {
    let template = "https://grafana.example/d/ringside-job?orgId=1&var-job_id={job_id}";
    assert_eq!(
        crate::fleet_job_link(template, "4242.0"),
        "https://grafana.example/d/ringside-job?orgId=1&var-job_id=4242.0"
    );
    // What the owner wrote cannot end the value nor add a parameter.
    assert_eq!(
        crate::fleet_job_link(template, "x&var-other=1#é"),
        "https://grafana.example/d/ringside-job?orgId=1&var-job_id=x%26var-other%3D1%23%C3%A9"
    );
}

#[test]
fn silence_commands_parse_and_silences_match() {
    let command = ClientCommand::parse(
        r#"{"type":"create_silence","matchers":[{"name":"alert_id","value":"7"}],"duration_ms":3600000,"comment":"c"}"#,
    )
    .unwrap();
    let ClientCommand::CreateSilence(new) = command else { panic!("{command:?}") };
    assert_eq!(
        (new.matchers[0].name.as_str(), new.duration_ms, new.until_resolved),
        ("alert_id", Some(3_600_000), false)
    );
    let unknown = ClientCommand::parse(r#"{"type":"create_silence","matchers":[],"forever":true}"#).unwrap_err();
    assert_eq!(unknown.code, crate::ErrorCode::InvalidCommand, "{unknown:?}");
    let expire = ClientCommand::parse(r#"{"type":"expire_silence","id":4}"#).unwrap();
    assert_eq!(expire, ClientCommand::ExpireSilence { id: 4, by: None });
    let s = silence();
    assert!(s.matches(&alert()) && s.is_active(2) && !s.is_active(3_600_000) && s.is_over(3_600_000));
    let other = crate::Silence { matchers: vec![crate::Matcher::new("team", "infra")], ..silence() };
    assert!(!other.matches(&alert()));
    let labelled = crate::Silence {
        matchers: vec![crate::Matcher::new("team", "ml"), crate::Matcher::new("alertname", "high_drop_rate")],
        ..silence()
    };
    assert!(labelled.matches(&alert()));
    assert!(!crate::Silence { matchers: vec![], ..silence() }.matches(&alert()), "no matchers match nothing");
}

fn kernel() -> RingKernelMetrics {
    RingKernelMetrics {
        id: "echo0".into(),
        kernel: "echo".into(),
        backend: KernelBackend::Cpu,
        state: KernelState::Active,
        messages_processed: 94,
        messages_dropped: 6,
        total_latency_ns: 94_000,
        min_latency_ns: None,
        max_latency_ns: 3000,
        latency_p50_ns: None,
        latency_p90_ns: None,
        latency_p99_ns: None,
        latency_p999_ns: None,
        input_queue_depth: 3,
        input_queue_capacity: 1024,
        output_queue_depth: 0,
        output_queue_capacity: 1024,
        last_error: None,
        gpu_memory_used: 0,
        host_memory_bytes: 0,
        bytes_in: 0,
        bytes_out: 0,
        uptime_ms: 0,
        drop_rate: 0.06,
        output_stats: None,
    }
}

/// One GPU as NVML reports it, with fields it does not support left out and said why.
fn gpus() -> GpuTelemetry {
    GpuTelemetry {
        available: true,
        reason: None,
        driver_version: Some("580.159.04".into()),
        cuda_driver_version: Some("13.0".into()),
        nvml_version: Some("13.580.159.04".into()),
        sampled_at_ms: Some(1_700_000_002_900),
        xid_events: true,
        idle: vec![GpuIdleAttribution {
            job: 4242,
            comm: "train".into(),
            gpu: 0,
            uuid: "GPU-00000000-1111-2222-3333-444444444444".into(),
            window_ms: 60_000,
            idle_pct: 38.0,
            idle_by_phase_pct: PhaseValues { data_loading: 30.0, optimizer_step: 8.0, ..PhaseValues::default() },
            idle_waiting_for_cpu_pct: 0.0,
            until_ms: 1_700_000_002_700,
            last_step: Some(GpuStepIdle {
                start_ms: 1_700_000_000_000,
                end_ms: 1_700_000_002_000,
                anchor: Phase::DataLoading,
                idle_pct: 40.0,
                idle_by_phase_pct: PhaseValues { data_loading: 35.0, ..PhaseValues::default() },
                idle_waiting_for_cpu_pct: 5.0,
            }),
            aligned: true,
        }],
        devices: vec![GpuDevice {
            index: 0,
            name: "NVIDIA H200".into(),
            uuid: "GPU-00000000-1111-2222-3333-444444444444".into(),
            pci_bus_id: "00000000:18:00.0".into(),
            numa_node: Some(0),
            compute_capability: Some("9.0".into()),
            utilization_gpu_pct: Some(97.0),
            memory_used_bytes: Some(80 << 30),
            throttle_reasons: Some(vec![ThrottleReason::SwPowerCap]),
            nvlink_links: None,
            unsupported: [("nvlink_links".to_string(), "not supported by this GPU or driver".to_string())].into(),
            ..GpuDevice::default()
        }],
    }
}

pub(crate) fn snapshot() -> Snapshot {
    Snapshot {
        schema_version: PROTOCOL_VERSION,
        seq: 3,
        taken_at_ms: 1_700_000_003_000,
        interval_ms: 1000,
        node: node(),
        config: ConfigSummary {
            listen: "127.0.0.1:9650".into(),
            interval_ms: 1000,
            window_ms: 10_000,
            history_len: 600,
            thresholds: [("drop_rate_warning".to_string(), 0.01)].into(),
            clear_for_ms: 3000,
            flap_window_ms: 300_000,
            rules: vec![RuleSummary {
                name: "hot".into(),
                metric: "host.cpu_utilization_pct".into(),
                op: RuleOp::Gt,
                threshold: 90.0,
                for_ms: 30_000,
                severity: Severity::Warning,
                labels: Default::default(),
            }],
            tokens: vec!["ops (operator)".into()],
            alertmanager_url: None,
            metrics: vec![MetricSummary {
                name: "gpu.utilization_pct".into(),
                prometheus: "ringside_gpu_utilization_ratio".into(),
                select: Default::default(),
                unit: "ratio".into(),
                scale: 100.0,
                help: "Share of the last sample period the GPU was busy.".into(),
            }],
        },
        components: vec![ComponentHealth { name: "host".into(), status: ComponentStatus::Up, detail: None }],
        readings: Readings {
            host: Some(host()),
            scheduler: Some(SchedulerTelemetry {
                total_tracked_tasks: 10,
                threads_capacity: 65_536,
                ml_tasks: 4,
                decisions_made: 12,
                phase_transitions: 30,
                phase_distribution: PhaseValues {
                    data_loading: 1,
                    gpu_compute: 2,
                    nccl_collective: 0,
                    optimizer_step: 1,
                    unknown: 0,
                },
                phase_time_pct: PhaseValues {
                    data_loading: 25.0,
                    gpu_compute: 50.0,
                    nccl_collective: 0.0,
                    optimizer_step: 25.0,
                    unknown: 0.0,
                },
                numa_nodes: 1,
                total_cpus: 2,
                mode: SchedulerMode::Enforce,
                window_ms: 100,
                job_window_ms: 300_000,
                attach_mode: Some(ProbeAttach::TpBtf),
                programs: vec![ProbeProgram {
                    name: "sched_switch".into(),
                    attach: ProbeAttach::TpBtf,
                    state: ProgramState::Attached,
                    detail: None,
                }],
                processes: vec![MlProcessInfo {
                    pid: 4242,
                    job: 4242,
                    comm: "python3".into(),
                    role: ProcessRole::Main,
                    reason: "maps libcuda.so.1".into(),
                    phase: Phase::GpuCompute,
                    phase_since_ms: 1_700_000_000_000,
                    threads: 12,
                    gpus: vec![0],
                    numa_node: Some(0),
                    probed_libraries: vec!["libcuda.so.1".into(), "libnccl.so.2".into()],
                    libraries: vec![LibraryStatus {
                        path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
                        state: LibraryState::Probed,
                        detail: "5 entry points probed".into(),
                    }],
                    uid: Some(1000),
                    admitted: true,
                    admission: "admitted: user 1000".into(),
                    phase_ms: PhaseValues { data_loading: 300, gpu_compute: 900, ..PhaseValues::default() },
                    timeline: vec![PhaseSpan {
                        phase: Phase::GpuCompute,
                        start_ms: 1_699_999_999_000,
                        end_ms: 1_700_000_000_000,
                        waiting_for_cpu: false,
                    }],
                    cmdline: "python3 train.py --epochs 3".into(),
                    untrusted: false,
                    paging: "pages: user 1000".into(),
                    collective_waiting_since_ms: None,
                    collective_returned_ms: Some(1_699_999_999_500),
                    collective_calls: 12,
                    collective_ms: 3400,
                    cpu_wait_ms: 80,
                    recent_phase_pct: PhaseValues { data_loading: 25.0, gpu_compute: 75.0, ..PhaseValues::default() },
                    recent_observed_ms: 1200,
                    steps: Some(StepTimes {
                        anchor: Phase::DataLoading,
                        last_ms: 1200,
                        recent_count: 1,
                        recent_p50_ms: 1200,
                        recent_p99_ms: 1200,
                        hour_count: 0,
                        hour_p50_ms: 0,
                        hour_p99_ms: 0,
                    }),
                    identity: JobIdentity {
                        slurm_job: Some("4242".into()),
                        slurm_step: Some("0".into()),
                        rank: Some(3),
                        local_rank: Some(1),
                        world_size: Some(16),
                        ..JobIdentity::default()
                    },
                }],
                processes_not_shown: 0,
                processes_not_tracked: 0,
                refused_evidence: vec![RefusedEvidence {
                    pid: 77,
                    comm: "hog".into(),
                    path: "/tmp/libtorch_x.so".into(),
                    why: "/tmp is writable by everyone".into(),
                }],
                exited_ranks: vec![crate::ExitedRank {
                    job_id: "4242.0".into(),
                    rank: 3,
                    pid: 4300,
                    at_ms: 1_699_999_990_000,
                    status: Some(9),
                }],
                enforcement_inactive: None,
                tasks: vec![MlTaskInfo {
                    pid: 4242,
                    tid: 4243,
                    comm: "pt_main_thread".into(),
                    phase: Phase::GpuCompute,
                    phase_ms: PhaseValues { gpu_compute: 900, ..PhaseValues::default() },
                    on_cpu_pct: 8.5,
                    runq_p50_ns: Some(4000),
                    runq_p99_ns: Some(90_000),
                    features: [("sync".to_string(), 0.82)].into_iter().collect(),
                    last_decision: Some("nice -5, normal, any cpu (applied)".into()),
                    calls: CallCounts { syncs: 120, copies: 8, nccl: 40, launches: 0 },
                }],
                decisions: vec![Decision {
                    at_ms: 1_700_000_000_000,
                    pid: 4242,
                    tid: 4243,
                    comm: "pt_main_thread".into(),
                    phase: Phase::GpuCompute,
                    action: "nice -5, normal, any cpu".into(),
                    reason: "entered gpu_compute".into(),
                    applied: true,
                    error: None,
                    nice: -5,
                    weight: 3121,
                    slice_us: 5000,
                    cpus: String::new(),
                }],
                lost: ProbeLosses::default(),
                backend: SchedulerBackend::Scx,
                scx: Some(ScxStatus {
                    state: ScxState::Enabled,
                    ops: Some("ringside".into()),
                    running: true,
                    nodes: 1,
                    decided_threads: 3,
                    counters: ScxCounters { enqueued: 10, decided: 4, preempted: 2, ..ScxCounters::default() },
                    error: None,
                    exit: None,
                }),
            }),
            kernels: vec![kernel()],
            gpus: Some(gpus()),
            window: WindowAggregates {
                window_ms: 10_000,
                covered_ms: 3000,
                cpu_avg_pct: Some(11.0),
                cpu_max_pct: Some(12.5),
                context_switches_per_s: Some(400.0),
                kernels: vec![KernelWindow {
                    id: "echo0".into(),
                    processed: 94,
                    dropped: 6,
                    drop_rate: Some(0.06),
                    throughput_per_s: 31.3,
                    avg_latency_ns: Some(1000.0),
                }],
                scheduler: None,
            },
        },
        alerts: vec![alert()],
        silences: vec![silence()],
        notifications: vec![crate::Notification {
            seq: 1,
            at_ms: 5,
            alerts: vec![crate::NotifiedAlert { id: 7, name: "high_drop_rate".into(), resolved: false }],
            ok: true,
            outcome: "HTTP 200".into(),
        }],
        incidents: vec![incident_summary()],
        history: vec![HistoryPoint {
            t_ms: 1,
            cpu_pct: 1.0,
            iowait_pct: 0.0,
            mem_used_pct: 16.0,
            load1: 0.3,
            kernels: vec![],
            gpus: vec![GpuPoint { index: 0, utilization_pct: Some(97.0), ..GpuPoint::default() }],
        }],
    }
}

fn incident_summary() -> crate::IncidentSummary {
    crate::IncidentSummary {
        id: 4,
        alert_id: 7,
        alert_type: AlertType::CollectiveHang,
        rule: None,
        severity: Severity::Critical,
        source: "job:4242".into(),
        message: "job 4242 (python): waiting in an NCCL collective".into(),
        fired_at_ms: 10_000,
        start_ms: 5_000,
        end_ms: 13_000,
        recording: false,
        complete: true,
        bytes: 48_213,
        threads: 5,
    }
}

fn round_trip(message: ServerMessage) {
    let text = serde_json::to_string(&message).expect("serialise");
    let value: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    assert!(value["type"].is_string(), "every frame carries a type: {text}");
    let back: ServerMessage = serde_json::from_str(&text).expect("deserialise");
    assert_eq!(back, message);
}

#[test]
fn every_server_message_round_trips() {
    round_trip(ServerMessage::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        identity: "ops".into(),
        role: Role::Operator,
        node: node(),
        server_time_ms: 5,
        interval_ms: 1000,
        fleet_job_url: Some("https://grafana.example/d/ringside-job?var-job_id={job_id}".into()),
    }));
    round_trip(ServerMessage::Snapshot(Box::new(snapshot())));
    round_trip(ServerMessage::Update(Box::new(Update {
        seq: 4,
        taken_at_ms: 9,
        components: vec![],
        readings: Readings {
            host: Some(host()),
            scheduler: None,
            kernels: vec![kernel()],
            gpus: Some(gpus()),
            window: WindowAggregates::default(),
        },
        point: None,
    })));
    round_trip(ServerMessage::AlertRaised { alert: alert() });
    round_trip(ServerMessage::AlertUpdated { alert: alert() });
    round_trip(ServerMessage::AlertResolved { alert: Alert { resolved_at_ms: Some(10), ..alert() } });
    round_trip(ServerMessage::KernelStateChanged(KernelStateChange {
        kernel_id: "echo0".into(),
        from: KernelState::Active,
        to: KernelState::Failed,
        at_ms: 11,
        reason: Some("device stopped answering".into()),
    }));
    round_trip(ServerMessage::Pong { nonce: Some(1), server_time_ms: 12 });
    round_trip(ServerMessage::IncidentsChanged { incidents: vec![incident_summary()] });
    round_trip(ServerMessage::Error { code: ErrorCode::UnknownCommand, message: "x".into() });
}

#[test]
fn wire_names_are_the_documented_ones() {
    let value = serde_json::to_value(ServerMessage::Snapshot(Box::new(snapshot()))).unwrap();
    assert_eq!(value["type"], "snapshot");
    let scheduler = &value["scheduler"];
    for field in ["total_tracked_tasks", "ml_tasks", "decisions_made", "phase_transitions", "numa_nodes", "total_cpus"]
    {
        assert!(scheduler.get(field).is_some(), "scheduler field {field}");
    }
    for phase in Phase::ALL {
        assert!(scheduler["phase_distribution"].get(phase.as_str()).is_some());
        assert!(scheduler["phase_time_pct"].get(phase.as_str()).is_some());
    }
    let kernel = &value["kernels"][0];
    for field in [
        "messages_processed",
        "messages_dropped",
        "total_latency_ns",
        "min_latency_ns",
        "max_latency_ns",
        "input_queue_depth",
        "output_queue_depth",
        "last_error",
        "gpu_memory_used",
        "drop_rate",
    ] {
        assert!(kernel.get(field).is_some(), "kernel field {field}");
    }
    assert_eq!(value["alerts"][0]["alert_type"], "high_drop_rate");
    assert_eq!(value["alerts"][0]["severity"], "error");
    let alert_event = serde_json::to_value(ServerMessage::AlertRaised { alert: alert() }).unwrap();
    assert_eq!(alert_event["type"], "alert_raised");
}

#[test]
fn enum_names_parse_back() {
    for s in Severity::ALL {
        assert_eq!(Severity::parse(s.as_str()), Some(s));
    }
    for t in AlertType::ALL {
        assert_eq!(AlertType::parse(t.as_str()), Some(t));
        assert_eq!(serde_json::to_value(t).unwrap(), t.as_str());
    }
    for k in TransitionKind::ALL {
        assert_eq!(TransitionKind::parse(k.as_str()), Some(k));
        assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
    }
    assert_eq!(Severity::parse("loud"), None);
}

#[test]
fn commands_parse() {
    assert_eq!(
        ClientCommand::parse(r#"{"type":"ack_alert","id":3,"note":"on it"}"#).unwrap(),
        ClientCommand::AckAlert { id: 3, note: Some("on it".into()), by: None }
    );
    assert_eq!(ClientCommand::parse(r#"{"type":"ping"}"#).unwrap(), ClientCommand::Ping { nonce: None });
    assert_eq!(ClientCommand::parse(r#"{"type":"ping","nonce":9}"#).unwrap(), ClientCommand::Ping { nonce: Some(9) });
    // The v1 commands stay; a command added later is known without being listed here.
    for v1 in ["ack_alert", "ping", "create_silence", "expire_silence"] {
        assert!(ClientCommand::types().iter().any(|t| t == v1), "{v1} in {:?}", ClientCommand::types());
    }
    // What the console sends is the type serialised: every command reads back as itself.
    let silence = crate::NewSilence {
        matchers: vec![crate::Matcher::new("alert_id", "7")],
        starts_at_ms: None,
        ends_at_ms: None,
        duration_ms: None,
        until_resolved: true,
        comment: "from the console".into(),
        by: Some("ana".into()),
    };
    for command in [
        ClientCommand::AckAlert { id: 7, note: Some("on it".into()), by: None },
        ClientCommand::Ping { nonce: None },
        ClientCommand::CreateSilence(silence),
        ClientCommand::ExpireSilence { id: 3, by: Some("ana".into()) },
    ] {
        let text = serde_json::to_string(&command).unwrap();
        assert_eq!(ClientCommand::parse(&text).as_ref(), Ok(&command), "{text}");
    }
}

#[test]
fn bad_commands_say_what_is_wrong() {
    let code = |text: &str| ClientCommand::parse(text).unwrap_err().code;
    assert_eq!(code("{not json"), ErrorCode::MalformedJson);
    assert_eq!(code("[1,2]"), ErrorCode::MalformedJson);
    assert_eq!(code(r#"{"id":1}"#), ErrorCode::MissingType);
    assert_eq!(code(r#"{"type":5}"#), ErrorCode::MissingType);
    assert_eq!(code(r#"{"type":"reboot"}"#), ErrorCode::UnknownCommand);
    assert_eq!(code(r#"{"type":"ack_alert"}"#), ErrorCode::InvalidCommand);
    assert_eq!(code(r#"{"type":"ack_alert","id":"x"}"#), ErrorCode::InvalidCommand);
    assert_eq!(code(r#"{"type":"ack_alert","id":1,"colour":"red"}"#), ErrorCode::InvalidCommand);
    let long_note = json!({"type": "ack_alert", "id": 1, "note": "n".repeat(protocol::MAX_NOTE_CHARS + 1)});
    assert_eq!(code(&long_note.to_string()), ErrorCode::InvalidCommand);
    let huge = format!(r#"{{"type":"ping","pad":"{}"}}"#, "x".repeat(protocol::MAX_COMMAND_BYTES));
    assert_eq!(code(&huge), ErrorCode::MessageTooLarge);
    let unknown = ClientCommand::parse(r#"{"type":"reboot"}"#).unwrap_err();
    assert!(unknown.message.contains("reboot") && unknown.message.contains("ack_alert"), "{}", unknown.message);
}

#[test]
fn schema_describes_the_snapshot() {
    let schema = snapshot_schema();
    let properties = schema["properties"].as_object().expect("object schema");
    for field in ["node", "host", "scheduler", "kernels", "alerts", "history", "window", "components"] {
        assert!(properties.contains_key(field), "schema lacks {field}");
    }
    let required: Vec<&str> = schema["required"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
    assert!(required.contains(&"node") && required.contains(&"alerts"));
}

/// The scheduler's part of an update with every list at its bound and every text a user can
/// choose at its clipped length: it must fit [`SchedulerTelemetry::FRAME_BUDGET`].
#[test]
fn worst_case_scheduler_telemetry_fits_the_frame_budget() {
    let base = snapshot().readings.scheduler.expect("the fixture has a scheduler");
    let long = |c: char| clip(&c.to_string().repeat(4096), SchedulerTelemetry::MAX_TEXT);
    assert_eq!(long('x').chars().count(), SchedulerTelemetry::MAX_TEXT);
    assert!(long('x').starts_with('…'));
    let spans = SchedulerTelemetry::MAX_SPANS / SchedulerTelemetry::MAX_PROCESSES;
    let process = MlProcessInfo {
        comm: "c".repeat(15),
        cmdline: "m".repeat(SchedulerTelemetry::MAX_CMDLINE),
        reason: long('r'),
        gpus: (0..8).collect(),
        probed_libraries: (0..SchedulerTelemetry::MAX_LIBRARIES).map(|_| long('p')).collect(),
        libraries: (0..SchedulerTelemetry::MAX_LIBRARIES)
            .map(|_| LibraryStatus { path: long('l'), state: LibraryState::Refused, detail: long('d') })
            .collect(),
        uid: Some(u32::MAX),
        admission: long('a'),
        paging: clip(&"g".repeat(4096), SchedulerTelemetry::MAX_SHORT_TEXT),
        timeline: (0..spans)
            .map(|i| PhaseSpan {
                phase: Phase::NcclCollective,
                start_ms: 1_800_000_000_000 + i as u64,
                end_ms: 1_800_000_000_100 + i as u64,
                waiting_for_cpu: true,
            })
            .collect(),
        identity: {
            let text = |c: char| Some(c.to_string().repeat(JobIdentity::MAX_VALUE));
            JobIdentity {
                slurm_job: Some("1000000".into()),
                slurm_step: Some("1000000".into()),
                slurm_job_name: text('n'),
                slurm_node: Some(1_000_000),
                run_id: text('r'),
                rank: Some(1_000_000),
                local_rank: Some(1_000_000),
                world_size: Some(1_000_000),
                local_world_size: Some(1_000_000),
                group_rank: Some(1_000_000),
                pod_uid: Some("1b4e28ba-2fa1-11d2-883f-0016d3cca427".into()),
                pod: text('p'),
                container: text('c'),
                unit: text('u'),
            }
        },
        collective_calls: u64::MAX,
        collective_ms: u64::MAX,
        cpu_wait_ms: u64::MAX,
        ..base.processes[0].clone()
    };
    let task = MlTaskInfo {
        comm: "t".repeat(15),
        features: ["cpu", "read", "iowait", "futex", "sync", "nccl", "ioctl", "driver", "launches_per_s"]
            .into_iter()
            .map(|k| (k.to_string(), 123456.789))
            .collect(),
        last_decision: Some(clip(&"s".repeat(4096), SchedulerTelemetry::MAX_SHORT_TEXT)),
        calls: CallCounts { launches: u64::MAX, syncs: u64::MAX, copies: u64::MAX, nccl: u64::MAX },
        ..base.tasks[0].clone()
    };
    let decision = Decision {
        comm: "t".repeat(15),
        action: long('x'),
        reason: long('y'),
        error: Some(long('e')),
        cpus: "0-95,192-287".into(),
        ..base.decisions[0].clone()
    };
    let worst = SchedulerTelemetry {
        processes: vec![process; SchedulerTelemetry::MAX_PROCESSES],
        tasks: vec![task; SchedulerTelemetry::MAX_TASKS],
        decisions: vec![decision; SchedulerTelemetry::MAX_DECISIONS],
        refused_evidence: vec![
            RefusedEvidence { pid: u32::MAX, comm: "c".repeat(15), path: long('q'), why: long('w') };
            SchedulerTelemetry::MAX_REFUSED
        ],
        programs: vec![base.programs[0].clone(); 24],
        enforcement_inactive: Some(long('i')),
        exited_ranks: vec![
            crate::ExitedRank {
                job_id: "j".repeat(JobIdentity::MAX_VALUE),
                rank: 1_000_000,
                pid: u32::MAX,
                at_ms: 1_800_000_000_000,
                status: Some(i32::MIN),
            };
            SchedulerTelemetry::MAX_EXITED_RANKS
        ],
        ..base
    };
    let bytes = serde_json::to_string(&worst).unwrap().len();
    println!("worst-case scheduler telemetry: {bytes} bytes");
    assert!(bytes <= SchedulerTelemetry::FRAME_BUDGET, "{bytes} bytes");
}

/// Every wire enum's JSON name is its `as_str`, and parses back: the console and the daemon's
/// texts say the same names the wire carries.
#[test]
fn scheduler_wire_enums_say_their_names() {
    fn check<T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug + Copy>(
        values: &[T],
        name: impl Fn(T) -> &'static str,
    ) {
        for v in values {
            let json = serde_json::to_value(v).unwrap();
            assert_eq!(json, name(*v), "{v:?}");
            assert_eq!(serde_json::from_value::<T>(json).unwrap(), *v);
        }
    }
    check(&[SchedulerMode::Observe, SchedulerMode::Enforce], SchedulerMode::as_str);
    check(&[SchedulerBackend::Observe, SchedulerBackend::Setattr, SchedulerBackend::Scx], SchedulerBackend::as_str);
    check(&[ProcessRole::Main, ProcessRole::Worker], ProcessRole::as_str);
    check(&[LibraryState::Pending, LibraryState::Probed, LibraryState::Refused], LibraryState::as_str);
    check(&[ProgramState::Attached, ProgramState::Fallback, ProgramState::Failed], ProgramState::as_str);
    {
        use crate::KernelState::*;
        check(&[Created, Launched, Active, Deactivated, Terminating, Terminated, Failed], crate::KernelState::as_str);
    }
    use ProbeAttach::*;
    check(&[TpBtf, RawTp, Tracepoint, SchedSwitch, Uprobe], ProbeAttach::as_str);
    let states =
        [ScxState::Enabled, ScxState::Disabled, ScxState::Enabling, ScxState::Disabling, ScxState::Unavailable];
    check(&states, ScxState::as_str);
    for state in states {
        assert_eq!(ScxState::parse(&format!("{state}\n")), state, "sysfs ends its line");
    }
    assert_eq!(ScxState::parse("exploded"), ScxState::Unavailable);
    let exits: Vec<ScxExitKind> = [1, 64, 65, 66, 67, 1024, 1025, 1026, 7].into_iter().map(ScxExitKind::of).collect();
    check(&exits, ScxExitKind::as_str);
    assert_eq!(
        exits.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(" "),
        "done unregistered unregistered_bpf unregistered_kernel sysrq error error_bpf watchdog_stall unknown"
    );
    check(&KernelKind::ALL, KernelKind::as_str);
    let ops = [RuleOp::Gt, RuleOp::Ge, RuleOp::Lt, RuleOp::Le, RuleOp::Eq, RuleOp::Ne];
    check(&ops, RuleOp::as_str);
    assert!(RuleOp::Ge.holds(1.0, 1.0) && !RuleOp::Gt.holds(1.0, 1.0) && RuleOp::Ne.holds(0.0, 1.0));
    assert!(serde_json::from_str::<SchedulerBackend>("\"cfs\"").is_err());
}

#[test]
fn a_snapshot_from_before_the_gpu_source_still_reads() {
    let mut value = serde_json::to_value(snapshot()).unwrap();
    value.as_object_mut().unwrap().remove("gpus");
    let read: Snapshot = serde_json::from_value(value).unwrap();
    assert_eq!(read.readings.gpus, None);
    // And an unsupported field is null on the wire, not 0.
    let wire = serde_json::to_value(gpus()).unwrap();
    assert!(wire["devices"][0]["nvlink_links"].is_null());
    assert_eq!(wire["devices"][0]["unsupported"]["nvlink_links"], "not supported by this GPU or driver");
}

#[test]
fn idle_attribution_reads_as_a_sentence() {
    let g = gpus();
    assert_eq!(
        g.idle[0].describe(),
        "GPU 0 idle 38% of the last minute: 30% waiting for data, 8% in the optimizer step"
    );
}

/// A viewer's copy keeps every untrusted process in place, without its command line and with
/// paths cut to file names; trusted processes and the numbers are left as they were.
#[test]
fn untrusted_details_are_hidden_from_viewers() {
    assert_eq!(
        file_names_only("directory /home/ana/proj/x is writable by everyone"),
        "directory …/x is writable by everyone"
    );
    assert_eq!(file_names_only("maps libcuda.so.1"), "maps libcuda.so.1");
    let base = snapshot().readings.scheduler.expect("the fixture has a scheduler");
    let trusted = base.processes[0].clone();
    let untrusted = MlProcessInfo {
        pid: 777,
        untrusted: true,
        cmdline: "python /home/ana/secret-project/train.py --key=hunter2".into(),
        identity: JobIdentity {
            slurm_job_name: Some("ana-secret-project".into()),
            rank: Some(1),
            ..trusted.identity.clone()
        },
        probed_libraries: vec!["/home/ana/venv/lib/libnccl.so.2".into()],
        libraries: vec![LibraryStatus {
            path: "/home/ana/venv/lib/libcudart.so.12".into(),
            state: LibraryState::Refused,
            detail: "directory /home/ana/venv is writable by its group".into(),
        }],
        ..trusted.clone()
    };
    let mut telemetry = SchedulerTelemetry {
        processes: vec![trusted.clone(), untrusted.clone()],
        refused_evidence: vec![RefusedEvidence {
            pid: 778,
            comm: "x".into(),
            path: "/tmp/ana/libcuda.so.1".into(),
            why: "/tmp/ana is writable by everyone".into(),
        }],
        ..base
    };
    assert!(telemetry.has_untrusted_details());
    assert_eq!(telemetry.hide_untrusted_details(), 2);
    let text = serde_json::to_string(&telemetry).unwrap();
    assert!(!text.contains("/home/ana") && !text.contains("hunter2") && !text.contains("/tmp/ana"), "{text}");
    assert!(!text.contains("ana-secret-project"), "{text}");
    assert_eq!(telemetry.processes[0], trusted);
    let hidden = &telemetry.processes[1];
    assert_eq!(hidden.cmdline, HIDDEN_FROM_VIEWERS);
    assert_eq!(
        (hidden.identity.slurm_job_name.as_deref(), hidden.identity.rank),
        (None, Some(1)),
        "names go, ranks stay"
    );
    assert_eq!(hidden.probed_libraries, vec!["…/libnccl.so.2".to_string()]);
    assert_eq!(hidden.libraries[0].path, "…/libcudart.so.12");
    assert_eq!(
        (hidden.phase, hidden.threads, &hidden.timeline),
        (untrusted.phase, untrusted.threads, &untrusted.timeline)
    );
    assert_eq!(telemetry.refused_evidence[0].path, "…/libcuda.so.1");
    let clean = SchedulerTelemetry { processes: vec![trusted], refused_evidence: vec![], ..telemetry };
    assert!(!clean.has_untrusted_details());
}

/// The wire format is a contract (v1): the JSON Schemas of what the daemon sends are committed
/// under `shared/schemas/`, and a change to a type that changes them fails here. Where the change
/// is meant (a new optional field), `RINGSIDE_BLESS=1 cargo test -p ringside-shared` rewrites
/// the files, and the diff shows it in review.
#[test]
fn the_wire_format_is_the_committed_one() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas");
    let snapshot = snapshot();
    let update = Update {
        seq: snapshot.seq,
        taken_at_ms: snapshot.taken_at_ms,
        components: snapshot.components.clone(),
        readings: snapshot.readings.clone(),
        point: snapshot.history.last().cloned(),
    };
    // Frames as sent, byte for byte (field order included), beside the schemas.
    let frame = |m: ServerMessage| serde_json::to_string_pretty(&m).unwrap();
    let schema = |v: serde_json::Value| serde_json::to_string_pretty(&v).unwrap();
    let schemas = [
        ("example-snapshot-frame.json", frame(ServerMessage::Snapshot(Box::new(snapshot)))),
        ("example-update-frame.json", frame(ServerMessage::Update(Box::new(update)))),
        ("snapshot.json", schema(snapshot_schema())),
        ("client-command.json", schema(serde_json::to_value(schemars::schema_for!(ClientCommand)).unwrap())),
        ("server-message.json", schema(serde_json::to_value(schemars::schema_for!(ServerMessage)).unwrap())),
        ("incident-bundle.json", schema(crate::incident::incident_schema())),
        ("history.json", schema(crate::history::history_schema())),
        ("history-export.json", schema(serde_json::to_value(schemars::schema_for!(crate::HistoryExport)).unwrap())),
        ("history-series.json", schema(serde_json::to_value(schemars::schema_for!(crate::HistoryCatalog)).unwrap())),
        ("host.json", schema(crate::host_schema())),
    ];
    let bless = std::env::var_os("RINGSIDE_BLESS").is_some();
    let mut changed = Vec::new();
    // Compared as text: a frame's keys are in the order they are sent, a schema's are sorted.
    for (name, text) in schemas {
        let path = dir.join(name);
        let text = text + "\n";
        if bless {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, text).unwrap();
            continue;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if committed != text {
            changed.push(name);
        }
    }
    assert!(changed.is_empty(), "the wire format changed: {changed:?} (RINGSIDE_BLESS=1 rewrites them if meant)");
}

/// Reads `text` with serde and with `decode`, and requires the same value.
fn reads_alike<T>(text: &str) -> T
where
    T: crate::decode::Decode + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let theirs: T = serde_json::from_str(text).unwrap_or_else(|e| panic!("serde: {e}: {text}"));
    let ours: T = crate::decode::from_str(text).unwrap_or_else(|e| panic!("decode: {e}: {text}"));
    assert_eq!(ours, theirs, "{text}");
    ours
}

/// Every type the console reads, from every fixture here, compact and pretty, reads as serde
/// reads it: the names, defaults and flattening `Decode` derives from the serde attributes.
#[test]
fn decode_reads_what_serde_reads() {
    let snapshot = snapshot();
    for text in [serde_json::to_string(&snapshot).unwrap(), serde_json::to_string_pretty(&snapshot).unwrap()] {
        reads_alike::<Snapshot>(&text);
    }
    let update = Update {
        seq: 4,
        taken_at_ms: 9,
        components: snapshot.components.clone(),
        readings: Readings { gpus: Some(gpus()), ..snapshot.readings.clone() },
        point: snapshot.history.last().cloned(),
    };
    reads_alike::<Update>(&serde_json::to_string(&update).unwrap());
    // The pinned frames, as the daemon sends them (a `type` the structs do not hold is skipped).
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas");
    reads_alike::<Snapshot>(&std::fs::read_to_string(dir.join("example-snapshot-frame.json")).unwrap());
    reads_alike::<Update>(&std::fs::read_to_string(dir.join("example-update-frame.json")).unwrap());
    reads_alike::<Alert>(&serde_json::to_string(&Alert { resolved_at_ms: Some(10), ..alert() }).unwrap());
    reads_alike::<crate::Silence>(&serde_json::to_string(&silence()).unwrap());
    reads_alike::<crate::IncidentSummary>(&serde_json::to_string(&incident_summary()).unwrap());
    reads_alike::<GpuTelemetry>(&serde_json::to_string(&gpus()).unwrap());
    let history = crate::HistoryResponse {
        from_ms: 1_000,
        to_ms: 4_000,
        step_ms: 1_000,
        points: 3,
        series: vec![crate::HistorySeries {
            key: "gpu.utilization_pct@gpu0".into(),
            resolution_ms: 1_000,
            known: true,
            min: vec![Some(1.5), None, Some(-0.25)],
            max: vec![Some(1e300), None, Some(5e-324)],
            mean: vec![Some(0.1), None, Some(2.0 / 3.0)],
        }],
    };
    reads_alike::<crate::HistoryResponse>(&serde_json::to_string(&history).unwrap());
    // An older daemon's snapshot, without the GPUs: absent `Option`s read as `None`.
    let mut value = serde_json::to_value(&snapshot).unwrap();
    value.as_object_mut().unwrap().remove("gpus");
    value.as_object_mut().unwrap().remove("silences");
    let read = reads_alike::<Snapshot>(&value.to_string());
    assert_eq!((read.readings.gpus, read.silences.len()), (None, 0));
    // Every name of every wire enum.
    for severity in Severity::ALL {
        reads_alike::<Severity>(&serde_json::to_string(&severity).unwrap());
    }
    for kind in AlertType::ALL {
        reads_alike::<AlertType>(&serde_json::to_string(&kind).unwrap());
    }
    for phase in [Phase::DataLoading, Phase::GpuCompute, Phase::NcclCollective, Phase::OptimizerStep, Phase::Unknown] {
        reads_alike::<Phase>(&serde_json::to_string(&phase).unwrap());
    }
}

/// The scheduler's telemetry at its bounds: the longest texts (multi-byte ellipses included).
#[test]
fn decode_reads_the_largest_scheduler_telemetry() {
    let mut telemetry = snapshot().readings.scheduler.unwrap();
    telemetry.processes[0].cmdline = "ü\"\\/\u{8}\u{c}\n\r\t\u{1}😀".repeat(50);
    reads_alike::<SchedulerTelemetry>(&serde_json::to_string(&telemetry).unwrap());
}

/// Strings and numbers at JSON's edges read as serde_json reads them, or are refused as it
/// refuses them.
#[test]
fn decode_reads_json_edges_as_serde_json() {
    for text in [
        r#""""#,
        r#""plain""#,
        r#""\u00e9\u0041\n\t\"\\\/\b\f\r""#,
        r#""\ud83d\ude00 and \uD83D\uDE00""#,
        "\"ü and 😀 unescaped\"",
    ] {
        reads_alike::<String>(text);
    }
    for text in [r#""\ud83d""#, r#""\ud83d\u0041""#, r#""\x""#, r#""\u12""#, "\"tab\there\"", r#""open"#] {
        assert!(serde_json::from_str::<String>(text).is_err(), "serde refuses {text}");
        assert!(crate::decode::from_str::<String>(text).is_err(), "decode refuses {text}");
    }
    for text in ["0", "7", "18446744073709551615", " 42 "] {
        reads_alike::<u64>(text);
    }
    for text in ["0", "-0", "1.5", "-2.5e3", "1E-7", "1e+2", "5e-324", "1.7976931348623157e308", "0.1", "123456789"] {
        reads_alike::<f64>(text);
    }
    for text in ["-1", "-0", "1.0", "1e2", "18446744073709551616", "01", "", "x", "\"1\"", "1 2"] {
        assert!(serde_json::from_str::<u64>(text).is_err(), "serde refuses {text}");
        assert!(crate::decode::from_str::<u64>(text).is_err(), "decode refuses {text}");
    }
    for text in ["-0", "-0.0", "9223372036854775808"] {
        assert!(serde_json::from_str::<i64>(text).is_err(), "serde refuses {text}");
        assert!(crate::decode::from_str::<i64>(text).is_err(), "decode refuses {text}");
    }
    reads_alike::<i64>("-9223372036854775808");
    for text in ["1.", ".5", "-", "1e", "+1", "NaN", "Infinity", "null", "1..2"] {
        assert!(serde_json::from_str::<f64>(text).is_err(), "serde refuses {text}");
        assert!(crate::decode::from_str::<f64>(text).is_err(), "decode refuses {text}");
    }
    for text in ["300", "-1", "4294967296"] {
        assert!(crate::decode::from_str::<u8>(text).is_err(), "{text} is no u8");
    }
    reads_alike::<Vec<Option<i32>>>("[null, -3, 2147483647, -2147483648]");
    reads_alike::<std::collections::BTreeMap<String, f64>>(r#"{"b": 1, "a": 2.5, "c\u0041": -0.5}"#);
    reads_alike::<Vec<bool>>("[true,false , true]");
}

/// The reader's fast path for numbers (exact digits times an exact power of ten) and its way
/// out to the platform's reader give the same bits as `str::parse`, which rounds correctly.
#[test]
fn decode_reads_floats_to_the_same_bits_as_std() {
    let same = |text: &str| {
        let ours = crate::decode::from_str::<f64>(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let std = text.parse::<f64>().unwrap();
        assert_eq!(ours.to_bits(), std.to_bits(), "{text}: {ours} against {std}");
    };
    for text in [
        "0",
        "-0",
        "-0.0",
        "0e400",
        "0.000",
        "1e22",
        "1e23",
        "-1e-22",
        "1e-23",
        "999999999999999",
        "9999999999999999",
        "123456789012345e-22",
        "1234567890123456e-22",
        "0.000000000000000000000000001",
        "33.333333333333336",
        "0.30000000000000004",
        "4.9406564584124654e-324",
        "2.2250738585072014e-308",
        "1.7976931348623157e308",
        "1e-99999999999999999999",
        "0e99999999999999999999",
        "12.500",
        "100000000000000000000000",
        "7E+3",
    ] {
        same(text);
    }
    // A sweep of digits and exponents on both sides of the fast path's bounds.
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    for _ in 0..20_000 {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let digits = (state >> 11) % 10u64.pow(1 + (state % 17) as u32);
        let exponent = (state >> 40) as i64 % 60 - 30;
        let point = (state >> 50) % 6;
        let text = match point {
            0 => format!("{digits}e{exponent}"),
            1 => format!("-{digits}.5E{exponent}"),
            _ => {
                let s = digits.to_string();
                let at = s.len().saturating_sub(point as usize).max(1);
                format!("{}.{}", &s[..at], if at < s.len() { &s[at..] } else { "0" })
            }
        };
        same(&text);
    }
    // Beyond `f64`, as before: refused.
    assert!(crate::decode::from_str::<f64>("1e309").is_err());
    assert!(crate::decode::from_str::<f64>("1e99999999999999999999").is_err());
}

/// What serde refuses, decode refuses, with the reason and where.
#[test]
fn decode_says_what_is_wrong_and_where() {
    let wrong = [
        (r#"{"id": 1}"#, "missing field `key`"),
        (r#"{"key": "k", "resolution_ms": "1000"}"#, "expected an unsigned integer, found `\"`"),
        (
            r#"{"key": "k", "resolution_ms": 1000, "known": true, "min": [], "max": [], "mean": [1,]}"#,
            "expected a number, found `]`",
        ),
        (r#"{"key": "k" "resolution_ms": 1}"#, "expected `,` or the end"),
        (r#"{"key": "k", "#, "EOF while expecting a key"),
        (
            r#"{"key": "k", "resolution_ms": 1, "known": true, "min": [], "max": [], "mean": []} x"#,
            "trailing characters",
        ),
        (r#"["key"]"#, "expected an object, found `[`"),
    ];
    for (text, why) in wrong {
        assert!(serde_json::from_str::<crate::HistorySeries>(text).is_err(), "serde refuses {text}");
        let error = crate::decode::from_str::<crate::HistorySeries>(text).unwrap_err();
        assert!(error.to_string().contains(why), "{text}: {error}");
        assert!(error.at <= text.len(), "{text}: {error:?}");
    }
    let error = crate::decode::from_str::<Severity>(r#""catastrophic""#).unwrap_err();
    assert_eq!(error.message, "unknown variant `catastrophic`");
    // Deep nesting is refused, not followed down the stack, in values skipped too.
    let deep = format!(r#"{{"key": "k", "extra": {}{}}}"#, "[".repeat(200), "]".repeat(200));
    let error = crate::decode::from_str::<crate::HistorySeries>(&deep).unwrap_err();
    assert_eq!(error.message, "recursion limit exceeded");
    // 128 levels are read, as serde_json reads them; beyond, refused even in a value skipped
    // (which serde_json skips without a limit).
    let valid = r#""resolution_ms": 1, "known": true, "min": [], "max": [], "mean": []"#;
    for (depth, read) in [(126, true), (127, true), (128, false)] {
        let text = format!(r#"{{"key": "k", {valid}, "extra": {}{}}}"#, "[".repeat(depth), "]".repeat(depth));
        assert!(serde_json::from_str::<crate::HistorySeries>(&text).is_ok(), "nesting {depth}");
        assert_eq!(crate::decode::from_str::<crate::HistorySeries>(&text).is_ok(), read, "nesting {depth}");
    }
    // A key given twice is refused, as serde refuses it.
    let twice = format!(r#"{{"key": "k", {valid}, "key": "j"}}"#);
    assert!(serde_json::from_str::<crate::HistorySeries>(&twice).is_err());
    let error = crate::decode::from_str::<crate::HistorySeries>(&twice).unwrap_err();
    assert_eq!(error.message, "duplicate field `key`");
    // A number no f64 holds.
    let error = crate::decode::from_str::<f64>("1e400").unwrap_err();
    assert_eq!(error.message, "number out of range");
    assert!(serde_json::from_str::<f64>("1e400").is_err());
    // A type that denies unknown keys names the key.
    let error = crate::decode::from_str::<crate::NewSilence>(r#"{"matchers": [], "hours": 2}"#).unwrap_err();
    assert_eq!(error.message, "unknown field `hours`");
}
