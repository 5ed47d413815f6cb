//! Reads the daemon's WebSocket frames, as `ServerMessage`'s own `Deserialize` would, in a
//! fraction of the WebAssembly.
//!
//! `ServerMessage` is tagged by a field inside each frame (`"type"`): serde reads such an enum
//! through its generic buffered form, and its derived readers cost kilobytes per type in
//! WebAssembly. Here each frame's `type` is read alone (the rest skipped), then the variant's
//! fields from the same text by the shared crate's small reader (`ringside_shared::decode`),
//! derived from the same serde attributes.
//!
//! `frames_read_here_are_the_frames_serde_reads` checks every kind of frame against
//! `ServerMessage`'s own `Deserialize`.

use ringside_shared::decode::{from_str, Decode};
use ringside_shared::{
    Alert, ErrorCode, Hello, IncidentSummary, KernelStateChange, Notification, ServerMessage, Silence, Snapshot,
    UnixMillis, Update,
};

#[derive(Decode)]
struct Tag {
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Decode)]
struct AlertFields {
    alert: Alert,
}

#[derive(Decode)]
struct SilencesFields {
    silences: Vec<Silence>,
}

#[derive(Decode)]
struct NotifiedFields {
    notification: Notification,
}

#[derive(Decode)]
struct IncidentsFields {
    incidents: Vec<IncidentSummary>,
}

#[derive(Decode)]
struct PongFields {
    nonce: Option<u64>,
    server_time_ms: UnixMillis,
}

#[derive(Decode)]
struct ErrorFields {
    code: ErrorCode,
    message: String,
}

/// One frame's text as a [`ServerMessage`].
pub fn decode(text: &str) -> Result<ServerMessage, String> {
    fn read<T: Decode>(text: &str) -> Result<T, String> {
        from_str(text).map_err(|e| e.to_string())
    }
    let Tag { kind } = read(text)?;
    Ok(match kind.as_str() {
        "hello" => ServerMessage::Hello(read::<Hello>(text)?),
        "snapshot" => ServerMessage::Snapshot(read::<Box<Snapshot>>(text)?),
        "update" => ServerMessage::Update(read::<Box<Update>>(text)?),
        "alert_raised" => ServerMessage::AlertRaised { alert: read::<AlertFields>(text)?.alert },
        "alert_updated" => ServerMessage::AlertUpdated { alert: read::<AlertFields>(text)?.alert },
        "alert_resolved" => ServerMessage::AlertResolved { alert: read::<AlertFields>(text)?.alert },
        "silences_changed" => ServerMessage::SilencesChanged { silences: read::<SilencesFields>(text)?.silences },
        "notified" => ServerMessage::Notified { notification: read::<NotifiedFields>(text)?.notification },
        "incidents_changed" => ServerMessage::IncidentsChanged { incidents: read::<IncidentsFields>(text)?.incidents },
        "kernel_state_changed" => ServerMessage::KernelStateChanged(read::<KernelStateChange>(text)?),
        "pong" => {
            let PongFields { nonce, server_time_ms } = read(text)?;
            ServerMessage::Pong { nonce, server_time_ms }
        }
        "error" => {
            let ErrorFields { code, message } = read(text)?;
            ServerMessage::Error { code, message }
        }
        other => return Err(format!("unknown frame type \"{other}\"")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pinned(name: &str) -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/schemas").join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    fn frames_read_here_are_the_frames_serde_reads() {
        let snapshot = match serde_json::from_str(&pinned("example-snapshot-frame.json")).unwrap() {
            ServerMessage::Snapshot(snapshot) => snapshot,
            other => panic!("not a snapshot: {other:?}"),
        };
        let alert = snapshot.alerts.first().cloned().expect("the example holds an alert");
        let frames = vec![
            pinned("example-snapshot-frame.json"),
            pinned("example-update-frame.json"),
            serde_json::to_string(&ServerMessage::Hello(Hello {
                protocol_version: 1,
                identity: "ops".into(),
                role: ringside_shared::Role::Operator,
                node: snapshot.node.clone(),
                server_time_ms: 1,
                interval_ms: 1000,
                fleet_job_url: Some("https://grafana/d?job={job_id}".into()),
            }))
            .unwrap(),
            serde_json::to_string(&ServerMessage::AlertRaised { alert: alert.clone() }).unwrap(),
            serde_json::to_string(&ServerMessage::AlertUpdated { alert: alert.clone() }).unwrap(),
            serde_json::to_string(&ServerMessage::AlertResolved { alert }).unwrap(),
            serde_json::to_string(&ServerMessage::SilencesChanged { silences: snapshot.silences.clone() }).unwrap(),
            serde_json::to_string(&ServerMessage::IncidentsChanged { incidents: snapshot.incidents.clone() }).unwrap(),
            serde_json::to_string(&ServerMessage::KernelStateChanged(KernelStateChange {
                kernel_id: "canary".into(),
                from: ringside_shared::KernelState::Active,
                to: ringside_shared::KernelState::Terminated,
                at_ms: 5,
                reason: Some("asked".into()),
            }))
            .unwrap(),
            serde_json::to_string(&ServerMessage::Pong { nonce: Some(7), server_time_ms: 9 }).unwrap(),
            serde_json::to_string(&ServerMessage::Pong { nonce: None, server_time_ms: 9 }).unwrap(),
            serde_json::to_string(&ServerMessage::Error { code: ErrorCode::MessageTooLarge, message: "big".into() })
                .unwrap(),
        ];
        let notified = snapshot
            .notifications
            .first()
            .cloned()
            .map(|notification| serde_json::to_string(&ServerMessage::Notified { notification }).unwrap());
        for text in frames.iter().chain(&notified) {
            let theirs: ServerMessage = serde_json::from_str(text).unwrap();
            assert_eq!(decode(text).as_ref(), Ok(&theirs), "{text}");
        }
        assert!(notified.is_some(), "the example snapshot holds a notification");
    }

    #[test]
    fn wrong_frames_are_refused_with_the_reason() {
        let cases = [
            ("", "EOF"),
            ("[]", "expected an object"),
            ("{}", "missing field `type`"),
            (r#"{"type":"gossip"}"#, "unknown frame type \"gossip\""),
            (r#"{"type":"pong"}"#, "missing field `server_time_ms`"),
            (r#"{"type":"update","seq":"x"}"#, "invalid type: expected an unsigned integer"),
        ];
        for (text, why) in cases {
            let error = decode(text).unwrap_err();
            assert!(error.contains(why), "{text}: {error}");
            assert!(serde_json::from_str::<ServerMessage>(text).is_err(), "serde refuses {text} too");
        }
    }
}
