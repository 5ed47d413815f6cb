//! The HTTP and WebSocket server: one router, built here, over one shared [`App`].
//!
//! Everything but `/healthz` and the console's landing page needs the token (see [`auth`]).

mod api;
pub mod auth;
pub mod config;
pub mod connections;
pub mod console;
pub mod listen;
pub mod session;
pub mod throttle;
pub mod tls;
mod ws;

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{middleware, Json, Router};
use tokio::sync::watch;
use tower_http::compression::CompressionLayer;
use tower_http::limit::RequestBodyLimitLayer;

use crate::state::NodeState;

/// Largest request body the REST API reads.
pub const MAX_BODY_BYTES: usize = 16 * 1024;

pub struct App {
    pub state: Arc<NodeState>,
    pub credentials: Vec<crate::identity::Credential>,
    /// Origins besides the daemon's own that may open the WebSocket.
    pub allowed_origins: Vec<String>,
    /// Turns true when the daemon stops; WebSocket sessions close with 1001 then.
    pub shutdown: watch::Receiver<bool>,
    /// WebSocket sessions at most (`[server] max_ws_sessions`).
    pub max_ws_sessions: usize,
    /// The console's sign-in sessions.
    pub sessions: session::Sessions,
    /// Failed authentications per client address.
    pub auth_failures: throttle::AuthFailures,
    /// `[server] fleet_job_url`, told to the console.
    pub fleet_job_url: Option<String>,
}

pub type SharedApp = Arc<App>;

pub fn router(app: SharedApp) -> Router {
    let json_routes = Router::new()
        .route("/api/snapshot", get(api::snapshot))
        .route("/api/host", get(api::host))
        .route("/api/schema/host", get(api::host_schema))
        .route("/api/schema/snapshot", get(api::schema))
        .route("/api/alerts", get(api::alerts))
        .route("/api/alerts/{id}/ack", post(api::acknowledge))
        .route("/api/silences", get(api::silences).post(api::create_silence))
        .route("/api/silences/{id}", delete(api::expire_silence))
        .route("/api/notifications", get(api::notifications))
        .route("/api/sessions", delete(api::end_sessions))
        .route("/api/incidents", get(api::incidents))
        .route("/api/incidents/{id}", get(api::incident))
        .route("/api/incidents/{id}/trace", get(api::incident_trace))
        .route("/api/schema/incident", get(api::incident_schema))
        .route("/api/history", get(api::history))
        .route("/api/history/series", get(api::history_series))
        .route("/api/history/export", get(api::history_export))
        .route("/api/schema/history", get(api::history_schema))
        .route("/metrics", get(api::metrics))
        .route("/metrics/dcgm", get(api::metrics_dcgm))
        .layer(CompressionLayer::new())
        .layer(middleware::map_response(no_store));
    // WebSocket upgrades and the pre-compressed console files stay out of the compression layer.
    let protected = Router::new()
        .merge(json_routes)
        .route("/ws", get(ws::upgrade))
        .fallback(console::asset)
        .layer(middleware::from_fn_with_state(app.clone(), auth::require_token));
    Router::new()
        .route("/healthz", get(api::healthz))
        .route("/", get(console::index))
        .merge(protected)
        .layer(RequestBodyLimitLayer::new(MAX_BODY_BYTES))
        .layer(middleware::map_response(security_headers))
        .layer(middleware::from_fn(auth::close_untrusted))
        .with_state(app)
}

/// On every response: no MIME sniffing, no referrer (the console URL carries the token on the
/// first visit).
async fn security_headers(mut response: Response) -> Response {
    use axum::http::{header, HeaderValue};
    let headers = response.headers_mut();
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    response
}

/// API answers are the node's state now: never kept by a browser or a proxy.
async fn no_store(mut response: Response) -> Response {
    use axum::http::{header, HeaderValue};
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// An error answered as JSON `{"error": "..."}` with its status.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into() }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(serde_json::json!({ "error": self.message }))).into_response()
    }
}
