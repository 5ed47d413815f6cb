//! WebSocket messages. Every frame is a JSON text frame holding one object with a `"type"` field.
//!
//! Server to client: `hello`, then `snapshot`, then `update` every collection tick and alert and
//! kernel events as they happen. Client to server: `ack_alert` and `ping`. A command that cannot
//! be understood is answered with `error`; the connection stays open.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::decode::Decode;

use crate::alert::{Alert, Role};
use crate::readings::Readings;
use crate::snapshot::{ComponentHealth, HistoryPoint, KernelState, NodeIdentity, Snapshot};
use crate::UnixMillis;

/// Bumped on any change a v1 client could not read.
pub const PROTOCOL_VERSION: u32 = 1;

/// Largest client command the server reads; larger ones are answered with `message_too_large`.
pub const MAX_COMMAND_BYTES: usize = 16 * 1024;
/// Longest acknowledgement note, in characters.
pub const MAX_NOTE_CHARS: usize = 1000;
/// Longest `by` name, in characters.
pub const MAX_BY_CHARS: usize = 100;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerMessage {
    Hello(Hello),
    Snapshot(Box<Snapshot>),
    Update(Box<Update>),
    AlertRaised {
        alert: Alert,
    },
    AlertUpdated {
        alert: Alert,
    },
    AlertResolved {
        alert: Alert,
    },
    /// The silences changed (created, expired or ended): the whole list, as in the snapshot.
    SilencesChanged {
        silences: Vec<crate::Silence>,
    },
    /// A batch was sent to Alertmanager, or failed to be.
    Notified {
        notification: crate::Notification,
    },
    /// The incident bundles changed (one started recording, was written or dropped): the
    /// whole list, as in the snapshot.
    IncidentsChanged {
        incidents: Vec<crate::IncidentSummary>,
    },
    KernelStateChanged(KernelStateChange),
    Pong {
        nonce: Option<u64>,
        server_time_ms: UnixMillis,
    },
    Error {
        code: ErrorCode,
        message: String,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct Hello {
    pub protocol_version: u32,
    /// Name of the token this connection authenticated with.
    pub identity: String,
    /// What this connection may do; a viewer cannot acknowledge.
    pub role: Role,
    pub node: NodeIdentity,
    pub server_time_ms: UnixMillis,
    pub interval_ms: u64,
    /// `[server] fleet_job_url`: the fleet dashboard of a job, `{job_id}` standing for the job's
    /// id ([`fleet_job_link`]); absent when not configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet_job_url: Option<String>,
}

/// `template` with each `{job_id}` replaced by `job_id` percent-encoded (all but ASCII letters,
/// digits and `-._~`): a job id is written by the job's owner, so it can neither end the URL's
/// query value nor add a parameter.
pub fn fleet_job_link(template: &str, job_id: &str) -> String {
    template.replace("{job_id}", &percent_encode(job_id))
}

/// `text` with every byte but letters, digits and `-._~` written `%XX`: safe in any part of a
/// URL.
pub fn percent_encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// What changed in one collection tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct Update {
    pub seq: u64,
    pub taken_at_ms: UnixMillis,
    pub components: Vec<ComponentHealth>,
    /// What the sources measured this tick (at the top level of the frame).
    #[serde(flatten)]
    pub readings: Readings,
    /// The history point this tick appended, if the host was collected.
    pub point: Option<HistoryPoint>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct KernelStateChange {
    pub kernel_id: String,
    pub from: KernelState,
    pub to: KernelState,
    pub at_ms: UnixMillis,
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Decode, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The frame is not valid JSON, or not a JSON object.
    MalformedJson,
    /// The object has no string `type` field.
    MissingType,
    /// The `type` names no command this server knows.
    UnknownCommand,
    /// A known command with missing, extra or wrongly typed fields.
    InvalidCommand,
    MessageTooLarge,
    /// Binary frames are not part of the protocol.
    BinaryNotSupported,
    /// The alert named does not exist.
    AlertNotFound,
    /// The silence named does not exist, or has ended.
    SilenceNotFound,
    /// The client sent commands faster than the server answers them.
    RateLimited,
    /// The token's role does not allow the command (a viewer acknowledging).
    Forbidden,
    /// The server could not carry the command out (e.g. the alert store failed to write).
    Internal,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ClientCommand {
    AckAlert {
        id: u64,
        #[serde(default)]
        note: Option<String>,
        /// Name of the person acknowledging, shown beside the alert.
        #[serde(default)]
        by: Option<String>,
    },
    Ping {
        #[serde(default)]
        nonce: Option<u64>,
    },
    /// Silences alerts by matchers (operators only); answered by `silences_changed`.
    CreateSilence(crate::NewSilence),
    /// Ends a silence early (operators only).
    ExpireSilence {
        id: u64,
        #[serde(default)]
        by: Option<String>,
    },
}

/// Why a client frame was refused.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandError {
    pub code: ErrorCode,
    pub message: String,
}

impl CommandError {
    fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        CommandError { code, message: message.into() }
    }

    pub fn into_message(self) -> ServerMessage {
        ServerMessage::Error { code: self.code, message: self.message }
    }
}

impl ClientCommand {
    /// The `type` of every command, read from the type's own (serde) description: a variant
    /// added is known to [`parse`](Self::parse) and named in its errors at once.
    pub fn types() -> &'static [String] {
        static TYPES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
        TYPES.get_or_init(|| {
            let schema = serde_json::to_value(schemars::schema_for!(ClientCommand)).unwrap_or_default();
            let variants = schema["oneOf"].as_array().cloned().unwrap_or_default();
            variants.iter().filter_map(|v| v["properties"]["type"]["const"].as_str().map(String::from)).collect()
        })
    }

    /// Parses one text frame, telling apart malformed JSON, an unknown command and a known
    /// command with bad fields, so the client learns exactly what to fix.
    pub fn parse(text: &str) -> Result<ClientCommand, CommandError> {
        if text.len() > MAX_COMMAND_BYTES {
            return Err(CommandError::new(
                ErrorCode::MessageTooLarge,
                format!("command is {} bytes; the limit is {MAX_COMMAND_BYTES}", text.len()),
            ));
        }
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| CommandError::new(ErrorCode::MalformedJson, format!("not valid JSON: {e}")))?;
        let Some(object) = value.as_object() else {
            return Err(CommandError::new(ErrorCode::MalformedJson, "a command must be a JSON object"));
        };
        let kind = match object.get("type") {
            Some(serde_json::Value::String(kind)) => kind.clone(),
            Some(_) => return Err(CommandError::new(ErrorCode::MissingType, "field `type` must be a string")),
            None => return Err(CommandError::new(ErrorCode::MissingType, "field `type` is missing")),
        };
        if !Self::types().contains(&kind) {
            return Err(CommandError::new(
                ErrorCode::UnknownCommand,
                format!("unknown command `{}`; known commands: {}", truncate(&kind, 64), Self::types().join(", ")),
            ));
        }
        let command: ClientCommand = serde_json::from_value(value)
            .map_err(|e| CommandError::new(ErrorCode::InvalidCommand, format!("invalid `{kind}`: {e}")))?;
        command.validate()?;
        Ok(command)
    }

    fn validate(&self) -> Result<(), CommandError> {
        let invalid =
            |kind: &str, why: String| CommandError::new(ErrorCode::InvalidCommand, format!("invalid `{kind}`: {why}"));
        match self {
            ClientCommand::AckAlert { note, by, .. } => {
                check_ack_fields(note.as_deref(), by.as_deref()).map_err(|why| invalid("ack_alert", why))
            }
            ClientCommand::CreateSilence(new) => {
                check_ack_fields(Some(&new.comment), new.by.as_deref()).map_err(|why| invalid("create_silence", why))
            }
            ClientCommand::ExpireSilence { by, .. } => {
                check_ack_fields(None, by.as_deref()).map_err(|why| invalid("expire_silence", why))
            }
            ClientCommand::Ping { .. } => Ok(()),
        }
    }
}

/// The limits on an acknowledgement's note and name, wherever it comes from (WebSocket, REST).
pub fn check_ack_fields(note: Option<&str>, by: Option<&str>) -> Result<(), String> {
    if note.is_some_and(|n| n.chars().count() > MAX_NOTE_CHARS) {
        return Err(format!("note is longer than {MAX_NOTE_CHARS} characters"));
    }
    if by.is_some_and(|b| b.chars().count() > MAX_BY_CHARS) {
        return Err(format!("by is longer than {MAX_BY_CHARS} characters"));
    }
    Ok(())
}

fn truncate(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}
