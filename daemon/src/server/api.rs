//! The REST routes of the v1 contract.

use axum::body::Bytes;
use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use ringside_shared::protocol::check_ack_fields;
use serde::Deserialize;

use super::auth::Identity;
use super::{ApiError, SharedApp};
use crate::alerts::incidents::store::ReadError;
use crate::alerts::silences::SilenceError;
use crate::alerts::store::AckError;
use crate::state::NodeState;

/// `ok` (200), `degraded` (503: a component is not up) or `down` (503: no collection tick for
/// three intervals, at least 3 s: the collector is stalled). Without the token only the word;
/// with it, what each component says, which can name URLs and errors.
pub async fn healthz(State(app): State<SharedApp>, request: axum::extract::Request) -> Response {
    let headers = request.headers();
    let components = app.state.components();
    let healthy = NodeState::is_healthy(&components);
    let stalled_after = (3 * app.state.interval_ms()).max(3_000);
    let (status, code) = if app.state.tick_age_ms() > stalled_after {
        ("down", StatusCode::SERVICE_UNAVAILABLE)
    } else if healthy {
        ("ok", StatusCode::OK)
    } else {
        ("degraded", StatusCode::SERVICE_UNAVAILABLE)
    };
    if super::auth::authenticate(&app, headers).is_none() {
        // A wrong token here counts against the address like anywhere else: the reply must not
        // be a free oracle for guessing one. No token at all is a plain health check.
        if super::auth::brings_bearer(headers) {
            let address = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|info| info.0.ip());
            if let Some(throttled) = super::auth::failed(&app, address, "/healthz") {
                return throttled;
            }
        }
        return (code, Json(serde_json::json!({ "status": status }))).into_response();
    }
    super::auth::trust_connection(&request);
    let started = app.state.node().daemon_started_at_ms;
    let body = Json(serde_json::json!({
        "status": status,
        "last_tick_age_ms": app.state.tick_age_ms(),
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_s": crate::clock::now_ms().saturating_sub(started) / 1000,
        "components": components,
        "scheduler": app.state.scheduler_backend().map(|(backend, scx)| serde_json::json!({
            "backend": backend,
            "sched_ext": scx,
        })),
    }));
    (code, body).into_response()
}

#[derive(Deserialize)]
pub struct SnapshotQuery {
    download: Option<String>,
}

impl SnapshotQuery {
    fn wants_download(&self) -> bool {
        matches!(self.download.as_deref(), Some("1" | "true" | "yes"))
    }
}

pub async fn snapshot(
    State(app): State<SharedApp>,
    Extension(identity): Extension<Identity>,
    Query(query): Query<SnapshotQuery>,
) -> Response {
    let snapshot = app.state.snapshot_for(identity.role);
    let download = query.wants_download();
    let body = match serde_json::to_vec_pretty(&snapshot) {
        Ok(body) => body,
        Err(e) => {
            return ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot encode the snapshot: {e}"))
                .into_response()
        }
    };
    let mut response = ([(header::CONTENT_TYPE, "application/json")], body).into_response();
    if download {
        let name = format!(
            "ringside-snapshot-{}-{}.json",
            file_name_safe(&snapshot.node.hostname),
            crate::clock::utc_compact(snapshot.taken_at_ms)
        );
        if let Ok(value) = HeaderValue::from_str(&format!("attachment; filename=\"{name}\"")) {
            response.headers_mut().insert(header::CONTENT_DISPOSITION, value);
        }
    }
    response
}

/// Keeps letters, digits, `-`, `_` and `.`; anything else in a hostname becomes `_`.
fn file_name_safe(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect()
}

pub async fn schema() -> Json<serde_json::Value> {
    Json(ringside_shared::snapshot_schema())
}

pub async fn alerts(State(app): State<SharedApp>) -> Json<Vec<ringside_shared::Alert>> {
    Json(app.state.alerts())
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct AckBody {
    note: Option<String>,
    by: Option<String>,
}

/// `POST /api/alerts/{id}/ack` with an optional JSON body `{"note": "...", "by": "..."}`.
pub async fn acknowledge(
    State(app): State<SharedApp>,
    Path(id): Path<String>,
    Extension(identity): Extension<Identity>,
    body: Bytes,
) -> Result<Json<ringside_shared::Alert>, ApiError> {
    let id: u64 = id
        .parse()
        .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, format!("alert id must be a number, got {id:?}")))?;
    let body: AckBody = if body.iter().all(u8::is_ascii_whitespace) {
        AckBody::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            ApiError::new(StatusCode::BAD_REQUEST, format!("body must be JSON like {{\"note\": \"...\"}}: {e}"))
        })?
    };
    check_ack_fields(body.note.as_deref(), body.by.as_deref())
        .map_err(|why| ApiError::new(StatusCode::BAD_REQUEST, why))?;
    app.state.acknowledge(id, &identity, body.by, body.note).await.map(Json).map_err(|e| match e {
        AckError::NotFound(_) => ApiError::new(StatusCode::NOT_FOUND, e.to_string()),
        AckError::Store(_) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        AckError::Forbidden { .. } => ApiError::new(StatusCode::FORBIDDEN, e.to_string()),
    })
}

fn silence_api_error(e: SilenceError) -> ApiError {
    let status = match &e {
        SilenceError::NotFound(_) => StatusCode::NOT_FOUND,
        SilenceError::Ended(_) => StatusCode::CONFLICT,
        SilenceError::Forbidden { .. } => StatusCode::FORBIDDEN,
        SilenceError::Invalid(_) | SilenceError::Full => StatusCode::BAD_REQUEST,
        SilenceError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    ApiError::new(status, e.to_string())
}

#[derive(Deserialize)]
pub struct NotificationQuery {
    alert_id: Option<u64>,
    limit: Option<usize>,
}

/// `GET /api/notifications[?alert_id=N][&limit=K]`: the batches sent to Alertmanager (or that
/// failed), newest first; 100 unless `limit` (at most 1000) says.
pub async fn notifications(
    State(app): State<SharedApp>,
    Query(query): Query<NotificationQuery>,
) -> Json<Vec<ringside_shared::Notification>> {
    let limit = query.limit.unwrap_or(100).min(crate::alerts::store::NOTIFICATIONS_KEPT);
    Json(app.state.notifications(query.alert_id, limit))
}

/// A silence as listed: with the number of active alerts it matches now.
#[derive(serde::Serialize)]
pub struct ListedSilence {
    #[serde(flatten)]
    silence: ringside_shared::Silence,
    matching_alerts: usize,
}

/// `GET /api/silences`: silences in force or to come (maintenance windows in force included),
/// then recently ended ones.
pub async fn silences(State(app): State<SharedApp>) -> Json<Vec<ListedSilence>> {
    let listed = app.state.silences_listed();
    Json(listed.into_iter().map(|(silence, matching_alerts)| ListedSilence { silence, matching_alerts }).collect())
}

/// `POST /api/silences` with a JSON body (`ringside_shared::NewSilence`): operators only.
pub async fn create_silence(
    State(app): State<SharedApp>,
    Extension(identity): Extension<Identity>,
    body: Bytes,
) -> Result<(StatusCode, Json<ringside_shared::Silence>), ApiError> {
    let new: ringside_shared::NewSilence = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("body must be JSON like {{\"matchers\": [{{\"name\": \"job\", \"value\": \"train.py\"}}], \"duration_ms\": 3600000, \"comment\": \"...\"}}: {e}"),
        )
    })?;
    check_ack_fields(Some(&new.comment), new.by.as_deref())
        .map_err(|why| ApiError::new(StatusCode::BAD_REQUEST, why))?;
    let silence = app.state.silence(&identity, new).await.map_err(silence_api_error)?;
    Ok((StatusCode::CREATED, Json(silence)))
}

/// `DELETE /api/silences/{id}`: ends the silence now (operators only).
pub async fn expire_silence(
    State(app): State<SharedApp>,
    Path(id): Path<String>,
    Extension(identity): Extension<Identity>,
) -> Result<Json<ringside_shared::Silence>, ApiError> {
    let id: u64 = id
        .parse()
        .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, format!("silence id must be a number, got {id:?}")))?;
    app.state.expire_silence(&identity, id, None).await.map(Json).map_err(silence_api_error)
}

#[derive(Deserialize)]
pub struct EndSessionsQuery {
    /// The name of a token whose every session ends (operators only).
    token: Option<String>,
}

/// `DELETE /api/sessions`: signs out — ends the session the request's cookie names, and tells
/// the browser to forget the cookie; with `?token=NAME` (operators), ends every session made
/// from that token, which revokes them without rotating the token. Answers `{"ended": N}`.
pub async fn end_sessions(
    State(app): State<SharedApp>,
    Query(query): Query<EndSessionsQuery>,
    Extension(identity): Extension<Identity>,
    headers: axum::http::HeaderMap,
) -> Response {
    match query.token {
        Some(name) => {
            if identity.role != ringside_shared::Role::Operator {
                return ApiError::new(StatusCode::FORBIDDEN, "only an operator may end a token's sessions")
                    .into_response();
            }
            let app = app.clone();
            let ended = tokio::task::spawn_blocking(move || app.sessions.end_token(&name)).await.unwrap_or(0);
            Json(serde_json::json!({ "ended": ended })).into_response()
        }
        None => {
            let sessions_app = app.clone();
            let ended =
                tokio::task::spawn_blocking(move || sessions_app.sessions.end_presented(&headers)).await.unwrap_or(0);
            let mut response = Json(serde_json::json!({ "ended": ended })).into_response();
            response.headers_mut().insert(header::SET_COOKIE, app.sessions.cleared_cookie());
            response
        }
    }
}

/// `GET /api/incidents`: incident bundles recording and kept, newest first.
pub async fn incidents(State(app): State<SharedApp>) -> Json<Vec<ringside_shared::IncidentSummary>> {
    Json(app.state.incidents())
}

pub async fn incident_schema() -> Json<serde_json::Value> {
    Json(ringside_shared::incident::incident_schema())
}

/// Bundle `id`'s JSON as `identity` may see it, read (or, while recording, assembled) off the
/// async runtime.
async fn incident_json(app: &SharedApp, identity: &Identity, id: &str) -> Result<(u64, Vec<u8>), ApiError> {
    let id: u64 = id
        .parse()
        .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, format!("incident id must be a number, got {id:?}")))?;
    let state = app.state.clone();
    let hide = state.hides_untrusted_from(identity.role);
    let read = tokio::task::spawn_blocking(move || {
        let bytes = state.incident(id).map_err(|e| match e {
            ReadError::NotFound(_) => ApiError::new(StatusCode::NOT_FOUND, e.to_string()),
            ReadError::Io(..) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        })?;
        // The flag is written only where true; without it there is nothing to hide.
        if !hide || !bytes.windows(UNTRUSTED.len()).any(|w| w == UNTRUSTED) {
            return Ok(bytes);
        }
        let failed =
            |e: serde_json::Error| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("incident {id}: {e}"));
        let mut bundle: ringside_shared::IncidentBundle = serde_json::from_slice(&bytes).map_err(failed)?;
        bundle.hide_untrusted_details();
        serde_json::to_vec(&bundle).map_err(failed)
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    read.map(|bytes| (id, bytes))
}

const UNTRUSTED: &[u8] = b"\"untrusted\":true";

/// A JSON body, as an attachment named `ringside-<what>-<host>-<id>.json` when `download` asks.
fn json_file(app: &SharedApp, body: Vec<u8>, download: bool, what: &str, id: u64) -> Response {
    let mut response = ([(header::CONTENT_TYPE, "application/json")], body).into_response();
    if download {
        let name = format!("ringside-{what}-{}-{id}.json", file_name_safe(&app.state.node().hostname));
        if let Ok(value) = HeaderValue::from_str(&format!("attachment; filename=\"{name}\"")) {
            response.headers_mut().insert(header::CONTENT_DISPOSITION, value);
        }
    }
    response
}

/// `GET /api/incidents/{id}[?download=1]`: the bundle as JSON (`/api/schema/incident`).
pub async fn incident(
    State(app): State<SharedApp>,
    Extension(identity): Extension<Identity>,
    Path(id): Path<String>,
    Query(query): Query<SnapshotQuery>,
) -> Result<Response, ApiError> {
    let (id, body) = incident_json(&app, &identity, &id).await?;
    Ok(json_file(&app, body, query.wants_download(), "incident", id))
}

/// `GET /api/incidents/{id}/trace[?download=1]`: the bundle as a Chrome trace event file.
pub async fn incident_trace(
    State(app): State<SharedApp>,
    Extension(identity): Extension<Identity>,
    Path(id): Path<String>,
    Query(query): Query<SnapshotQuery>,
) -> Result<Response, ApiError> {
    let (id, body) = incident_json(&app, &identity, &id).await?;
    let trace = tokio::task::spawn_blocking(move || {
        let bundle: ringside_shared::IncidentBundle = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
        serde_json::to_vec(&bundle.chrome_trace()).map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r)
    .map_err(|why| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("incident {id}: {why}")))?;
    Ok(json_file(&app, trace, query.wants_download(), "incident-trace", id))
}

pub async fn metrics(State(app): State<SharedApp>, Extension(identity): Extension<Identity>) -> Response {
    let body = crate::prometheus::render(&app.state, identity.role);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
}

/// The GPUs under dcgm-exporter's names and labels, for dashboards built on it.
pub async fn metrics_dcgm(State(app): State<SharedApp>) -> Response {
    let snapshot = app.state.snapshot();
    let devices = snapshot.readings.gpus.as_ref().map(|g| g.devices.as_slice()).unwrap_or_default();
    let processes = snapshot.readings.scheduler.as_ref().map(|s| s.processes.as_slice()).unwrap_or_default();
    let body = crate::prometheus::render_dcgm(devices, &snapshot.node.hostname, processes);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
}

/// The parameters of `GET /api/history`, read as text so that a wrong one gets our message.
#[derive(Deserialize)]
pub struct HistoryParams {
    series: Option<String>,
    from: Option<String>,
    to: Option<String>,
    points: Option<String>,
}

fn history_number<T: std::str::FromStr>(name: &str, text: Option<&str>) -> Result<Option<T>, ApiError> {
    text.map(|t| {
        t.parse()
            .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, format!("{name} must be a whole number, got {t:?}")))
    })
    .transpose()
}

/// `GET /api/history?series=<metric>@<source>,...&from=<ms>&to=<ms>&points=<n>`: each series
/// over the range, in `points` buckets of min/max/mean (see `HistoryResponse`).
pub async fn history(
    State(app): State<SharedApp>,
    Query(params): Query<HistoryParams>,
) -> Result<Json<ringside_shared::HistoryResponse>, ApiError> {
    let from = history_number("from", params.from.as_deref())?;
    let to = history_number("to", params.to.as_deref())?;
    let points = history_number("points", params.points.as_deref())?;
    let query = crate::history::Query::parse(params.series.as_deref(), from, to, points, crate::clock::now_ms())
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.0))?;
    let state = app.state.clone();
    tokio::task::spawn_blocking(move || {
        let history = state.history().ok_or_else(history_off)?;
        Ok(Json(history.query(&query)))
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
}

fn history_off() -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "history is not kept on this node (see /healthz, component history)")
}

/// `GET /api/history/series`: every series held, with the time it covers.
pub async fn history_series(State(app): State<SharedApp>) -> Result<Json<ringside_shared::HistoryCatalog>, ApiError> {
    let state = app.state.clone();
    tokio::task::spawn_blocking(move || Ok(Json(state.history().ok_or_else(history_off)?.catalog())))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
}

/// `GET /api/host`: the host's figures of the latest tick (see [`ringside_shared::HostNow`]).
pub async fn host(State(app): State<SharedApp>) -> Json<ringside_shared::HostNow> {
    Json(app.state.host_now())
}

pub async fn host_schema() -> Json<serde_json::Value> {
    Json(ringside_shared::host_schema())
}

pub async fn history_schema() -> Json<serde_json::Value> {
    Json(ringside_shared::history::history_schema())
}

#[derive(Deserialize)]
pub struct ExportParams {
    series: Option<String>,
    from: Option<String>,
    to: Option<String>,
    format: Option<String>,
    download: Option<String>,
}

/// `GET /api/history/export?from=<ms>&to=<ms>[&series=...][&format=trace][&download=1]`: a range
/// of every series (or those named) with the alerts active in it, as JSON (`HistoryExport`) or
/// as a Chrome trace.
pub async fn history_export(
    State(app): State<SharedApp>,
    Query(params): Query<ExportParams>,
) -> Result<Response, ApiError> {
    let from = history_number("from", params.from.as_deref())?;
    let to = history_number("to", params.to.as_deref())?;
    let trace = match params.format.as_deref() {
        None | Some("json") => false,
        Some("trace") => true,
        Some(other) => {
            return Err(ApiError::new(StatusCode::BAD_REQUEST, format!("format is json or trace, got {other:?}")));
        }
    };
    let download = matches!(params.download.as_deref(), Some("1" | "true" | "yes"));
    let state = app.state.clone();
    let body = tokio::task::spawn_blocking(move || -> Result<(Vec<u8>, u64, u64), ApiError> {
        let history = state.history().ok_or_else(history_off)?;
        let held = history.catalog().series.into_iter().map(|s| s.key).collect();
        let now = crate::clock::now_ms();
        let query = crate::history::Query::export(params.series.as_deref(), from, to, now, held)
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.0))?;
        let (from_ms, to_ms) = (query.from_ms, query.to_ms);
        let alerts = state
            .alerts()
            .into_iter()
            .filter(|a| a.raised_at_ms < to_ms && a.resolved_at_ms.is_none_or(|r| r >= from_ms))
            .collect();
        let export = ringside_shared::HistoryExport {
            hostname: state.node().hostname.clone(),
            exported_at_ms: now,
            history: history.query(&query),
            alerts,
        };
        let bytes = if trace { serde_json::to_vec(&export.chrome_trace()) } else { serde_json::to_vec(&export) };
        let bytes = bytes.map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        Ok((bytes, from_ms, to_ms))
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    let (bytes, from_ms, to_ms) = body;
    let mut response = ([(header::CONTENT_TYPE, "application/json")], bytes).into_response();
    if download {
        let what = if trace { "history-trace" } else { "history" };
        let name = format!(
            "ringside-{what}-{}-{}-{}.json",
            file_name_safe(&app.state.node().hostname),
            crate::clock::utc_compact(from_ms),
            crate::clock::utc_compact(to_ms)
        );
        if let Ok(value) = HeaderValue::from_str(&format!("attachment; filename=\"{name}\"")) {
            response.headers_mut().insert(header::CONTENT_DISPOSITION, value);
        }
    }
    Ok(response)
}
