//! The console's files, embedded at build time (see `build.rs`), served with their content
//! type, an ETag, and the brotli or gzip copy made at build time when the browser accepts it
//! (brotli first: the wasm is a fifth smaller in it).

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::Extension;

use super::auth;
use super::SharedApp;

pub struct Asset {
    pub path: &'static str,
    pub content_type: &'static str,
    pub etag: &'static str,
    pub body: &'static [u8],
    pub gzip: Option<&'static [u8]>,
    pub brotli: Option<&'static [u8]>,
}

include!(concat!(env!("OUT_DIR"), "/console_assets.rs"));

/// Whether this binary was built with the console inside.
pub fn is_built() -> bool {
    find("/index.html").is_some()
}

fn find(path: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|a| a.path == path)
}

fn serve(asset: &Asset, request_headers: &HeaderMap) -> Response {
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
    headers.insert(header::ETAG, HeaderValue::from_static(asset.etag));
    // Names are not content-hashed: revalidate every time, which the ETag makes cheap.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    if asset.path.ends_with(".html") {
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(
                "default-src 'self'; script-src 'self' 'wasm-unsafe-eval'; style-src 'self' 'unsafe-inline'; \
                 img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'",
            ),
        );
    }
    let not_modified = request_headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|tags| tags.split(',').any(|t| t.trim() == asset.etag));
    if not_modified {
        return (StatusCode::NOT_MODIFIED, headers).into_response();
    }
    let accepts = |coding: &str| {
        request_headers.get_all(header::ACCEPT_ENCODING).iter().filter_map(|v| v.to_str().ok()).any(|v| {
            v.split(',').any(|e| {
                let mut parts = e.trim().split(';');
                // `br;q=0` says no.
                parts.next() == Some(coding)
                    && !parts.any(|p| matches!(p.trim(), "q=0" | "q=0.0" | "q=0.00" | "q=0.000"))
            })
        })
    };
    let (coding, body) = match (asset.brotli, asset.gzip) {
        (Some(br), _) if accepts("br") => ("br", br),
        (_, Some(gz)) if accepts("gzip") => ("gzip", gz),
        _ => return (headers, asset.body).into_response(),
    };
    headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static(coding));
    (headers, body).into_response()
}

const PAGE_STYLE: &str = "body{font:16px/1.5 system-ui,sans-serif;max-width:40rem;margin:4rem auto;padding:0 1rem;color:#1d2430}\
code{background:#eef1f5;padding:.1rem .3rem;border-radius:4px}@media(prefers-color-scheme:dark){body{background:#0f141b;color:#dfe6ee}code{background:#1d2632}}";

/// Text made safe to put in a page (token names are the operator's, but never trusted as HTML).
fn html_escape(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '<' => "&lt;".to_string(),
            '>' => "&gt;".to_string(),
            '&' => "&amp;".to_string(),
            '"' => "&quot;".to_string(),
            '\'' => "&#39;".to_string(),
            c => c.to_string(),
        })
        .collect()
}

fn page(status: StatusCode, title: &str, body: &str) -> Response {
    let html = format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>{title} · Ringside</title><style>{PAGE_STYLE}</style></head>\
         <body><h1>{title}</h1>{body}</body></html>"
    );
    (status, Html(html)).into_response()
}

#[derive(serde::Deserialize)]
pub struct IndexQuery {
    token: Option<String>,
}

/// `GET /`: with a valid `?token=` sets the session cookie and redirects to `/` (so the token
/// leaves the address bar and history); with the cookie serves the console.
pub async fn index(
    State(app): State<SharedApp>,
    Query(query): Query<IndexQuery>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    trust: Option<Extension<super::connections::Trust>>,
    headers: HeaderMap,
) -> Response {
    if let Some(given) = query.token {
        let Some(credential) = auth::credential_for(&given, &app.credentials) else {
            if let Some(throttled) = auth::failed(&app, peer.map(|p| p.0 .0.ip()), "/") {
                return throttled;
            }
            return page(
                StatusCode::UNAUTHORIZED,
                "Wrong token",
                "<p>The token in this link is not the one this daemon uses. Open the URL that <code>ringsided</code> printed at start-up, \
                 or the one built from <code>RINGSIDE_TOKEN</code> / <code>--token-file</code>.</p>",
            );
        };
        // A browser already signed in keeps its session: a link made elsewhere must not sign it
        // in as someone else (login CSRF), and the same token needs no second session.
        match app.sessions.presented(&headers, &app.credentials, crate::clock::now_ms()) {
            super::session::Presented::Valid(held) if held.name != credential.name => {
                return page(
                    StatusCode::CONFLICT,
                    "Already signed in",
                    &format!(
                        "<p>This browser is signed in to this node as <code>{}</code>. A link with another token \
                         does not replace that: sign out first (the console's <b>Sign out</b>), then open the link \
                         again.</p>",
                        html_escape(&held.name)
                    ),
                );
            }
            super::session::Presented::Valid(_) => {
                if let Some(Extension(trust)) = &trust {
                    trust.grant();
                }
                return Redirect::to("/").into_response();
            }
            super::session::Presented::None | super::session::Presented::Invalid => {}
        }
        // The token is exchanged for a session (a file write, off the async workers).
        let (credential, sessions_app) = (credential.clone(), app.clone());
        let created =
            tokio::task::spawn_blocking(move || sessions_app.sessions.create(&credential, crate::clock::now_ms()))
                .await;
        let id = match created {
            Ok(Ok(id)) => id,
            Ok(Err(e)) => {
                return page(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "No session",
                    &format!("<p>No session could be made: {e}.</p>"),
                );
            }
            Err(_) => return page(StatusCode::INTERNAL_SERVER_ERROR, "No session", "<p>No session could be made.</p>"),
        };
        if let Some(Extension(trust)) = &trust {
            trust.grant();
        }
        let mut response = Redirect::to("/").into_response();
        response.headers_mut().insert(header::SET_COOKIE, app.sessions.cookie(&id));
        return response;
    }
    if auth::authenticate(&app, &headers).is_some() {
        if let Some(Extension(trust)) = &trust {
            trust.grant();
        }
    } else {
        return page(
            StatusCode::UNAUTHORIZED,
            "Sign-in needed",
            "<p>This console needs the node's access token. Open the URL that <code>ringsided</code> printed at start-up \
             (it ends in <code>/?token=…</code>); the browser then keeps a cookie for this node.</p>",
        );
    }
    match find("/index.html") {
        Some(asset) => serve(asset, &headers),
        None => page(
            StatusCode::SERVICE_UNAVAILABLE,
            "Console not built",
            "<p>This <code>ringsided</code> was built without its console. Build it with <code>cargo xtask run</code> \
             (or <code>cargo xtask console</code> and rebuild the daemon). The API works meanwhile: \
             <code>/api/snapshot</code>, <code>/metrics</code>, <code>/ws</code>.</p>",
        ),
    }
}

/// Every other path: a console file, or 404.
pub async fn asset(uri: Uri, headers: HeaderMap) -> Response {
    match find(uri.path()) {
        Some(asset) if asset.path != "/index.html" => serve(asset, &headers),
        _ => super::ApiError::new(StatusCode::NOT_FOUND, format!("no such path: {}", uri.path())).into_response(),
    }
}
