//! One task per WebSocket client.
//!
//! The session subscribes to the broadcast before it builds the first snapshot, so nothing
//! that happens in between is lost (at worst an event is seen twice, which the client's
//! upsert-by-id absorbs). A client that falls more than [`BROADCAST_CAPACITY`] frames behind
//! gets a fresh full snapshot instead of the frames it missed. A client that does not take a
//! frame within [`SEND_TIMEOUT`] is disconnected, so one slow browser never holds memory or the
//! pipeline.
//!
//! [`BROADCAST_CAPACITY`]: crate::state::BROADCAST_CAPACITY

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use ringside_shared::{ClientCommand, ErrorCode, Hello, ServerMessage, PROTOCOL_VERSION};
use tokio::sync::broadcast::error::RecvError;

use super::auth::{self, Identity};
use super::{ApiError, SharedApp};
use crate::alerts::silences::SilenceError;
use crate::alerts::store::AckError;
use crate::state::{encode, Frame};

/// Frames above this size close the connection (1009); commands above
/// [`ringside_shared::protocol::MAX_COMMAND_BYTES`] get an error frame and the connection stays.
pub const MAX_WS_MESSAGE_BYTES: usize = 1024 * 1024;
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// Commands a client may send per second on average, and in a burst.
const COMMANDS_PER_S: f64 = 20.0;
const COMMAND_BURST: f64 = 40.0;

pub async fn upgrade(
    ws: WebSocketUpgrade,
    State(app): State<SharedApp>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(identity): Extension<Identity>,
    headers: HeaderMap,
) -> Response {
    if !auth::origin_allowed(&headers, &app.allowed_origins) {
        app.state.stats.ws_refused_total.fetch_add(1, Ordering::Relaxed);
        let origin = headers.get(axum::http::header::ORIGIN).and_then(|o| o.to_str().ok()).unwrap_or("?");
        tracing::warn!(%peer, origin, "WebSocket refused: foreign origin");
        return ApiError::new(
            StatusCode::FORBIDDEN,
            format!("origin {origin} may not open this WebSocket; add it to allowed_origins in the config to allow it"),
        )
        .into_response();
    }
    let Some(slot) = SessionSlot::reserve(&app) else {
        app.state.stats.ws_refused_total.fetch_add(1, Ordering::Relaxed);
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "{} WebSocket sessions are open, the most this daemon serves ([server] max_ws_sessions)",
                app.max_ws_sessions
            ),
        )
        .into_response();
    };
    ws.max_message_size(MAX_WS_MESSAGE_BYTES)
        .max_frame_size(MAX_WS_MESSAGE_BYTES)
        .on_upgrade(move |socket| session(socket, app, peer, identity, slot))
}

/// Refills at `COMMANDS_PER_S`, holds at most `COMMAND_BURST`.
struct CommandBudget {
    tokens: f64,
    at: Instant,
}

impl CommandBudget {
    fn take(&mut self) -> bool {
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64() * COMMANDS_PER_S).min(COMMAND_BURST);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

struct Gone;

async fn send(socket: &mut WebSocket, frame: Frame) -> Result<(), Gone> {
    match tokio::time::timeout(SEND_TIMEOUT, socket.send(Message::Text(frame.as_ref().into()))).await {
        Ok(Ok(())) => Ok(()),
        _ => Err(Gone),
    }
}

/// A WebSocket session's place under `max_ws_sessions`, taken at the handshake (so two
/// handshakes at once cannot both take the last one) and given back when dropped: at the end
/// of the session, or with the upgrade if it never completes.
struct SessionSlot(SharedApp);

impl SessionSlot {
    fn reserve(app: &SharedApp) -> Option<SessionSlot> {
        let cap = app.max_ws_sessions as u64;
        app.state
            .stats
            .ws_clients
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| (open < cap).then_some(open + 1))
            .ok()
            .map(|_| SessionSlot(app.clone()))
    }
}

impl Drop for SessionSlot {
    fn drop(&mut self) {
        self.0.state.stats.ws_clients.fetch_sub(1, Ordering::AcqRel);
    }
}

async fn session(mut socket: WebSocket, app: SharedApp, peer: SocketAddr, identity: Identity, slot: SessionSlot) {
    app.state.stats.ws_connections_total.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(%peer, "WebSocket client connected");
    let _ = run_session(&mut socket, &app, peer, &identity).await;
    drop(slot);
    tracing::debug!(%peer, "WebSocket client left");
}

async fn run_session(
    socket: &mut WebSocket,
    app: &SharedApp,
    peer: SocketAddr,
    identity: &Identity,
) -> Result<(), Gone> {
    let state = &app.state;
    let mut events = state.subscribe();
    let mut shutdown = app.shutdown.clone();
    let hello = ServerMessage::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        identity: identity.name.clone(),
        role: identity.role,
        node: state.node().clone(),
        server_time_ms: crate::clock::now_ms(),
        interval_ms: state.interval_ms(),
        fleet_job_url: app.fleet_job_url.clone(),
    });
    send(socket, encode(&hello)).await?;
    send(socket, encode(&ServerMessage::Snapshot(Box::new(state.live_snapshot_for(identity.role))))).await?;
    let mut budget = CommandBudget { tokens: COMMAND_BURST, at: Instant::now() };

    loop {
        tokio::select! {
            event = events.recv() => match event {
                Ok(frames) => send(socket, frames.for_role(identity.role)).await?,
                Err(RecvError::Lagged(missed)) => {
                    // Skip what is still queued (older than the snapshot below), keep what comes next.
                    events = events.resubscribe();
                    state.stats.ws_resyncs_total.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%peer, missed, "client lagged; resynchronising with a snapshot");
                    send(socket, encode(&ServerMessage::Snapshot(Box::new(state.live_snapshot_for(identity.role))))).await?;
                }
                Err(RecvError::Closed) => return Ok(()),
            },
            incoming = socket.recv() => {
                let reply = match incoming {
                    None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return Ok(()),
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                    Some(Ok(_)) if !budget.take() => Some(error(ErrorCode::RateLimited, format!(
                        "more than {COMMANDS_PER_S} commands per second; this one was dropped"
                    ))),
                    Some(Ok(Message::Binary(_))) => Some(error(ErrorCode::BinaryNotSupported, "send commands as JSON text frames".into())),
                    Some(Ok(Message::Text(text))) => handle_command(app, identity, text.as_str()).await,
                };
                if let Some(reply) = reply {
                    if matches!(reply, ServerMessage::Error { .. }) {
                        state.stats.ws_error_frames_total.fetch_add(1, Ordering::Relaxed);
                    }
                    send(socket, encode(&reply)).await?;
                }
            }
            _ = shutdown.changed() => {
                let close = CloseFrame { code: 1001, reason: "ringsided is stopping".into() };
                let _ = tokio::time::timeout(Duration::from_secs(1), socket.send(Message::Close(Some(close)))).await;
                return Ok(());
            }
        }
    }
}

fn error(code: ErrorCode, message: String) -> ServerMessage {
    ServerMessage::Error { code, message }
}

/// The reply to one command, if it has one (an acknowledgement is answered by the broadcast
/// `alert_updated` every client receives).
async fn handle_command(app: &SharedApp, identity: &Identity, text: &str) -> Option<ServerMessage> {
    let command = match ClientCommand::parse(text) {
        Ok(command) => command,
        Err(e) => return Some(e.into_message()),
    };
    match command {
        ClientCommand::Ping { nonce } => Some(ServerMessage::Pong { nonce, server_time_ms: crate::clock::now_ms() }),
        ClientCommand::AckAlert { id, note, by } => match app.state.acknowledge(id, identity, by, note).await {
            Ok(_) => None,
            Err(e @ AckError::NotFound(_)) => Some(error(ErrorCode::AlertNotFound, e.to_string())),
            Err(e @ AckError::Store(_)) => Some(error(ErrorCode::Internal, e.to_string())),
            Err(e @ AckError::Forbidden { .. }) => Some(error(ErrorCode::Forbidden, e.to_string())),
        },
        ClientCommand::CreateSilence(new) => app.state.silence(identity, new).await.err().map(silence_error),
        ClientCommand::ExpireSilence { id, by } => {
            app.state.expire_silence(identity, id, by).await.err().map(silence_error)
        }
    }
}

fn silence_error(e: SilenceError) -> ServerMessage {
    let code = match &e {
        SilenceError::NotFound(_) | SilenceError::Ended(_) => ErrorCode::SilenceNotFound,
        SilenceError::Forbidden { .. } => ErrorCode::Forbidden,
        SilenceError::Invalid(_) | SilenceError::Full => ErrorCode::InvalidCommand,
        SilenceError::Store(_) => ErrorCode::Internal,
    };
    error(code, e.to_string())
}
