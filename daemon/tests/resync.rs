//! A WebSocket client that stops reading falls behind the broadcast; when it reads again it
//! must get a fresh full snapshot, not a silent gap. Runs the real router on a loopback socket.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use ringside_daemon::alerts::rules::RuleEngine;
use ringside_daemon::alerts::store::{AlertStore, Lifecycle};
use ringside_daemon::config::{Credential, Thresholds};
use ringside_daemon::pipeline::Sample;
use ringside_daemon::server::{self, App};
use ringside_daemon::state::{Alerting, NodeState, Settings, BROADCAST_CAPACITY};
use ringside_shared::{KernelBackend, KernelState, RingKernelMetrics, Role, ServerMessage};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

const TOKEN: &str = "resync-test-token-0123";

/// Ring-kernel figures made up for this test (no kernels exist in this crate): they only make
/// each update frame large, so a client that does not read fills the socket buffers quickly.
fn made_up_kernels(tick: u64) -> Vec<RingKernelMetrics> {
    (0..60)
        .map(|i| RingKernelMetrics {
            id: format!("made-up-kernel-{i:02}"),
            kernel: "echo".into(),
            backend: KernelBackend::Cpu,
            state: KernelState::Active,
            messages_processed: tick * 100,
            messages_dropped: 0,
            total_latency_ns: tick * 100_000,
            min_latency_ns: Some(500),
            max_latency_ns: 9000,
            latency_p50_ns: None,
            latency_p90_ns: None,
            latency_p99_ns: None,
            latency_p999_ns: None,
            input_queue_depth: 1,
            input_queue_capacity: 1024,
            output_queue_depth: 0,
            output_queue_capacity: 1024,
            last_error: None,
            gpu_memory_used: 0,
            host_memory_bytes: 0,
            bytes_in: 0,
            bytes_out: 0,
            uptime_ms: 0,
            drop_rate: 0.0,
            output_stats: None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_client_is_resynchronised_with_a_snapshot() {
    let node = ringside_daemon::host::node_identity(&Default::default(), 0);
    let settings = Settings {
        interval_ms: 1000,
        window_ms: 10_000,
        history_len: 100,
        thresholds: Thresholds::default(),
        summary: Default::default(),
        viewers_see_untrusted: false,
    };
    let alerting = Alerting { store: AlertStore::in_memory(Lifecycle::default()), rules: RuleEngine::default() };
    let state = Arc::new(NodeState::new(node, settings, alerting));
    let credentials = vec![Credential { name: "test".into(), secret: TOKEN.into(), role: Role::Viewer }];
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    let app = Arc::new(App {
        state: state.clone(),
        credentials,
        allowed_origins: vec![],
        shutdown: shutdown.clone(),
        max_ws_sessions: 8,
        sessions: server::session::Sessions::load(None, 0, 0),
        auth_failures: server::throttle::AuthFailures::new(30),
        fleet_job_url: None,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state_for_server = state.clone();
    tokio::spawn(async move {
        // The daemon's own accept loop, as it serves.
        let config = ringside_daemon::config::ServerConfig::default();
        server::listen::serve(listener, server::router(app), &config, None, state_for_server, shutdown).await;
    });

    // A client with a tiny receive buffer that reads hello and snapshot, then stops reading.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let stream = socket.connect(addr).await.unwrap();
    let mut request = format!("ws://{addr}/ws").into_client_request().unwrap();
    request.headers_mut().insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    let (mut client, _) = tokio_tungstenite::client_async(request, stream).await.unwrap();
    let mut frames = Vec::new();
    while frames.len() < 2 {
        if let Some(Ok(Message::Text(text))) = client.next().await {
            frames.push(serde_json::from_str::<ServerMessage>(text.as_str()).unwrap());
        }
    }
    assert!(matches!(frames[1], ServerMessage::Snapshot(_)));

    // Far more ticks than the broadcast holds, each a large frame.
    let ticks = (BROADCAST_CAPACITY * 20) as u64;
    for tick in 1..=ticks {
        let sample = Sample {
            readings: ringside_shared::Readings { kernels: made_up_kernels(tick), ..Default::default() },
            ..Sample::new(tick * 1000)
        };
        state.apply_tick(sample, vec![], &[], Duration::ZERO);
    }

    // Reading again: somewhere after the gap comes a full snapshot, then updates resume.
    let mut resynced_at = None;
    let mut last_seq = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while last_seq < ticks {
        let frame =
            tokio::time::timeout_at(deadline, client.next()).await.expect("frames keep coming").unwrap().unwrap();
        let Message::Text(text) = frame else { continue };
        match serde_json::from_str::<ServerMessage>(text.as_str()).unwrap() {
            ServerMessage::Snapshot(snapshot) => {
                resynced_at.get_or_insert(snapshot.seq);
                last_seq = snapshot.seq;
            }
            ServerMessage::Update(update) => {
                assert!(
                    update.seq == last_seq + 1 || resynced_at.is_none(),
                    "after the resync, updates follow the snapshot without gaps"
                );
                last_seq = update.seq;
            }
            _ => {}
        }
    }
    // Nothing older than the snapshot follows it: the next frames are exactly the new ticks.
    for tick in ticks + 1..=ticks + 3 {
        let sample = Sample {
            readings: ringside_shared::Readings { kernels: made_up_kernels(tick), ..Default::default() },
            ..Sample::new(tick * 1000)
        };
        state.apply_tick(sample, vec![], &[], Duration::ZERO);
    }
    while last_seq < ticks + 3 {
        let frame =
            tokio::time::timeout_at(deadline, client.next()).await.expect("frames keep coming").unwrap().unwrap();
        let Message::Text(text) = frame else { continue };
        match serde_json::from_str::<ServerMessage>(text.as_str()).unwrap() {
            ServerMessage::Update(update) => {
                assert_eq!(update.seq, last_seq + 1, "no stale or missing update after the resync");
                last_seq = update.seq;
            }
            other => panic!("unexpected frame after the resync: {other:?}"),
        }
    }
    let resynced_at = resynced_at.expect("the lagging client got a fresh snapshot");
    assert!(resynced_at > 1 && resynced_at <= ticks);
    assert!(state.stats.ws_resyncs_total.load(Ordering::Relaxed) >= 1);
}
