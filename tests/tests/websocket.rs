//! The WebSocket of the v1 contract, against the real daemon.

use std::time::Duration;

use futures_util::SinkExt;

use ringside_shared::{ErrorCode, ServerMessage, PROTOCOL_VERSION};
use ringside_tests::{Daemon, DaemonOptions, LOW_MEMORY_THRESHOLDS};
use serde_json::json;
use tokio_tungstenite::tungstenite::Error as WsError;

const WAIT: Duration = Duration::from_secs(10);

fn alerting() -> DaemonOptions {
    DaemonOptions { config: LOW_MEMORY_THRESHOLDS.into(), ..DaemonOptions::default() }
}

#[tokio::test]
async fn hello_then_snapshot_then_live_updates() -> anyhow::Result<()> {
    let daemon = Daemon::start(DaemonOptions::default())?;
    let mut client = daemon.ws(None).await?;
    let ServerMessage::Hello(hello) = client.next(WAIT).await? else { panic!("first frame must be hello") };
    assert_eq!(hello.protocol_version, PROTOCOL_VERSION);
    assert!(!hello.node.hostname.is_empty() && hello.node.cpus > 0);
    assert_eq!(hello.interval_ms, 200);
    let ServerMessage::Snapshot(snapshot) = client.next(WAIT).await? else { panic!("second frame must be snapshot") };
    assert_eq!(snapshot.node, hello.node);

    let mut seqs = Vec::new();
    while seqs.len() < 3 {
        if let ServerMessage::Update(update) = client.next(WAIT).await? {
            let host = update.readings.host.as_ref().expect("host metrics every tick");
            assert!(host.memory.total_bytes > 0);
            assert!(update.point.is_some());
            seqs.push(update.seq);
        }
    }
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "updates arrive in order without gaps: {seqs:?}");
    assert!(
        seqs[0] <= snapshot.seq + 1,
        "no update is lost between the snapshot and the stream: {} then {seqs:?}",
        snapshot.seq
    );
    Ok(())
}

#[tokio::test]
async fn acknowledgement_reaches_every_client_over_ws_and_rest() -> anyhow::Result<()> {
    let daemon = Daemon::start(alerting())?;
    let mut first = daemon.ws(None).await?;
    let mut second = daemon.ws(None).await?;
    // The memory-pressure alert from the real host: in the snapshot, or raised soon after.
    let id = first
        .wait_for(WAIT, |m| match m {
            ServerMessage::Snapshot(s) => s.alerts.iter().find(|a| a.is_active()).map(|a| a.id),
            ServerMessage::AlertRaised { alert } => Some(alert.id),
            _ => None,
        })
        .await?;

    first.send_json(json!({"type": "ack_alert", "id": id, "note": "looking into it", "by": "ana"})).await?;
    for client in [&mut first, &mut second] {
        let alert = client
            .wait_for(WAIT, |m| match m {
                ServerMessage::AlertUpdated { alert } if alert.id == id => Some(alert.clone()),
                _ => None,
            })
            .await?;
        let ack = alert.acknowledgement.expect("acknowledged");
        assert_eq!(ack.by, "ana");
        assert_eq!(ack.note.as_deref(), Some("looking into it"));
    }
    let alerts = daemon.get_json("/api/alerts").await?;
    let stored = alerts.as_array().unwrap().iter().find(|a| a["id"] == id).expect("alert listed");
    assert_eq!(stored["acknowledgement"]["by"], "ana");

    // A second daemon-side alert is not available, so check REST on a fresh daemon's alert.
    let daemon = Daemon::start(alerting())?;
    let mut watcher = daemon.ws(None).await?;
    let id = watcher
        .wait_for(WAIT, |m| match m {
            ServerMessage::Snapshot(s) => s.alerts.first().map(|a| a.id),
            ServerMessage::AlertRaised { alert } => Some(alert.id),
            _ => None,
        })
        .await?;
    let response = daemon
        .http()
        .post(format!("{}/api/alerts/{id}/ack", daemon.base))
        .bearer_auth(&daemon.token)
        .json(&json!({"note": "from a script"}))
        .send()
        .await?;
    assert_eq!(response.status(), 200);
    let body: serde_json::Value = response.json().await?;
    assert_eq!(body["acknowledgement"]["note"], "from a script");
    assert_eq!(body["acknowledgement"]["by"], "operator", "without a name, the token's name");
    assert_eq!(body["acknowledgement"]["token"], "operator");
    let seen = watcher
        .wait_for(WAIT, |m| match m {
            ServerMessage::AlertUpdated { alert } if alert.id == id => alert.acknowledgement.clone(),
            _ => None,
        })
        .await?;
    assert_eq!(seen.note.as_deref(), Some("from a script"));
    Ok(())
}

fn status_of(error: anyhow::Error) -> u16 {
    match error.downcast::<WsError>() {
        Ok(WsError::Http(response)) => response.status().as_u16(),
        other => panic!("expected an HTTP refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn wrong_token_and_foreign_origin_are_refused() -> anyhow::Result<()> {
    let daemon = Daemon::start(DaemonOptions::default())?;
    assert_eq!(status_of(daemon.ws_with(None, None).await.err().expect("no token refused")), 401);
    assert_eq!(
        status_of(daemon.ws_with(Some("not-the-token-at-all"), None).await.err().expect("wrong token refused")),
        401
    );
    let foreign = daemon.ws(Some("http://evil.example")).await.err().expect("foreign origin refused");
    assert_eq!(status_of(foreign), 403);
    let other_port = daemon.ws(Some("http://127.0.0.1:1")).await.err().expect("other port refused");
    assert_eq!(status_of(other_port), 403);
    // The daemon's own origin, as a browser on the console page sends it, is accepted.
    let own = format!("http://{}", daemon.addr);
    let mut client = daemon.ws(Some(&own)).await?;
    assert!(matches!(client.next(WAIT).await?, ServerMessage::Hello(_)));
    let metrics = daemon.get("/metrics").await?.text().await?;
    assert!(metrics.contains("ringside_ws_refused_total 4"), "refusals are counted:\n{metrics}");
    Ok(())
}

#[tokio::test]
async fn bad_frames_get_an_error_and_the_connection_survives() -> anyhow::Result<()> {
    let daemon = Daemon::start(DaemonOptions { interval_ms: 1000, ..DaemonOptions::default() })?;
    let mut client = daemon.ws(None).await?;
    client.next(WAIT).await?;
    client.next(WAIT).await?;

    let oversized = format!(r#"{{"type":"ping","pad":"{}"}}"#, "x".repeat(64 * 1024));
    let cases: Vec<(String, ErrorCode, &str)> = vec![
        ("{not json".into(), ErrorCode::MalformedJson, "JSON"),
        ("42".into(), ErrorCode::MalformedJson, "object"),
        (r#"{"id":3}"#.into(), ErrorCode::MissingType, "type"),
        (r#"{"type":"reboot"}"#.into(), ErrorCode::UnknownCommand, "reboot"),
        (r#"{"type":"ack_alert","id":"seven"}"#.into(), ErrorCode::InvalidCommand, "ack_alert"),
        (r#"{"type":"ack_alert","id":999999}"#.into(), ErrorCode::AlertNotFound, "999999"),
        (oversized, ErrorCode::MessageTooLarge, "limit"),
    ];
    for (frame, expected, mentions) in cases {
        client.send_text(&frame).await?;
        let (code, message) = client
            .wait_for(WAIT, |m| match m {
                ServerMessage::Error { code, message } => Some((*code, message.clone())),
                _ => None,
            })
            .await?;
        assert_eq!(code, expected, "for frame {:.60}", frame);
        assert!(message.contains(mentions), "error for {:.60} should mention {mentions}: {message}", frame);
    }
    client.socket.send(tokio_tungstenite::tungstenite::Message::Binary(vec![1, 2, 3].into())).await?;
    let code = client
        .wait_for(WAIT, |m| match m {
            ServerMessage::Error { code, .. } => Some(*code),
            _ => None,
        })
        .await?;
    assert_eq!(code, ErrorCode::BinaryNotSupported);

    // Still the same, healthy connection.
    client.send_json(json!({"type": "ping", "nonce": 77})).await?;
    let nonce = client
        .wait_for(WAIT, |m| match m {
            ServerMessage::Pong { nonce, .. } => Some(*nonce),
            _ => None,
        })
        .await?;
    assert_eq!(nonce, Some(77));
    Ok(())
}

#[tokio::test]
async fn sigterm_and_sigint_close_clients_and_exit_cleanly() -> anyhow::Result<()> {
    for signal in ["TERM", "INT"] {
        let mut daemon = Daemon::start(DaemonOptions::default())?;
        let mut client = daemon.ws(None).await?;
        client.next(WAIT).await?;
        let status = daemon.stop_with(signal)?;
        assert!(status.success(), "ringsided exits 0 on SIG{signal}, got {status}");
        let close = loop {
            match tokio::time::timeout(WAIT, futures_util::StreamExt::next(&mut client.socket)).await? {
                Some(Ok(tokio_tungstenite::tungstenite::Message::Close(frame))) => break frame,
                Some(Ok(_)) => continue,
                other => panic!("SIG{signal}: expected a close frame, got {other:?}"),
            }
        };
        let close = close.expect("close frame with a code");
        assert_eq!(u16::from(close.code), 1001, "SIG{signal}: going away");
    }
    Ok(())
}
