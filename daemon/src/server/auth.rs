//! Token check and WebSocket origin check.
//!
//! A request is authorised by `Authorization: Bearer <token>` or by the console's session cookie
//! (`ringside_session_<port>`, see [`super::session`]), which the landing page sets (HttpOnly,
//! SameSite=Strict) in exchange for `?token=` on the first visit. The token found names an
//! [`Identity`] (its name and role), which the middleware puts in the request's extensions for
//! the routes. Comparison takes the same time whatever the input, so timing does not leak a
//! token.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::session::Sessions;
use super::{ApiError, App, SharedApp};
pub use crate::identity::Identity;
use crate::identity::{same_secret, Credential};

/// Whether a request brings a bearer token at all (right or wrong).
pub fn brings_bearer(headers: &HeaderMap) -> bool {
    bearer(headers).is_some()
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The credential whose secret `given` is; every credential is compared, so the time taken does
/// not tell which one matched.
pub fn credential_for<'a>(given: &str, credentials: &'a [Credential]) -> Option<&'a Credential> {
    let mut found = None;
    for credential in credentials {
        if same_secret(given.as_bytes(), credential.secret.as_bytes()) {
            found = Some(credential);
        }
    }
    found
}

pub fn authenticate(app: &App, headers: &HeaderMap) -> Option<Identity> {
    authenticate_how(&app.credentials, &app.sessions, headers).map(|(identity, _)| identity)
}

/// How a request proved who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proof {
    /// `Authorization: Bearer`: a program that holds the token.
    Bearer,
    /// The console's cookie, which a browser sends by itself, also with requests another page
    /// makes it send.
    Cookie,
}

pub fn authenticate_how(
    credentials: &[Credential],
    sessions: &Sessions,
    headers: &HeaderMap,
) -> Option<(Identity, Proof)> {
    let by_bearer = || bearer(headers).and_then(|given| credential_for(given, credentials));
    let by_cookie = || sessions.credential(headers, credentials, crate::clock::now_ms());
    by_bearer()
        .map(|c| (c, Proof::Bearer))
        .or_else(|| by_cookie().map(|c| (c, Proof::Cookie)))
        .map(|(c, proof)| (Identity { name: c.name.clone(), role: c.role }, proof))
}

/// Why a request that changes something, authenticated by the cookie alone, is refused: it must
/// come from the console's own origin (or one in `allowed_origins`), as a browser's `Origin`
/// says, with a JSON body; a page elsewhere on the host (another port counts: `SameSite` does
/// not separate ports) cannot send that. Bearer requests are not affected.
pub fn cross_site_refusal(method: &axum::http::Method, headers: &HeaderMap, allowed: &[String]) -> Option<String> {
    use axum::http::Method;
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return None;
    }
    let origin = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok());
    if origin.is_none() || !origin_allowed(headers, allowed) {
        return Some(format!(
            "a {method} authenticated by the console's cookie must come from the console itself (Origin {});              programs send `Authorization: Bearer <token>` instead",
            origin.unwrap_or("missing")
        ));
    }
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|c| c.to_str().ok())
        .is_some_and(|c| c.split(';').next().is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json")));
    (!json)
        .then(|| format!("a {method} authenticated by the console's cookie must send Content-Type: application/json"))
}

pub async fn require_token(State(app): State<SharedApp>, mut request: Request, next: Next) -> Response {
    if let Some((identity, proof)) = authenticate_how(&app.credentials, &app.sessions, request.headers()) {
        if proof == Proof::Cookie {
            if let Some(why) = cross_site_refusal(request.method(), request.headers(), &app.allowed_origins) {
                app.state.stats.auth_failures_total.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return ApiError::new(StatusCode::FORBIDDEN, why).into_response();
            }
        }
        trust_connection(&request);
        request.extensions_mut().insert(identity);
        return next.run(request).await;
    }
    if request.uri().path() == "/ws" {
        app.state.stats.ws_refused_total.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    let address = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|info| info.0.ip());
    if let Some(response) = failed(&app, address, request.uri().path()) {
        return response;
    }
    let mut response = ApiError::new(
        StatusCode::UNAUTHORIZED,
        "missing or wrong token: send `Authorization: Bearer <token>`, or open the console URL that ringsided printed",
    )
    .into_response();
    response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"ringside\""));
    response
}

/// Marks the request's connection as one that authenticated: it keeps its slot and may stay
/// open for the next request (see [`super::connections`]).
pub fn trust_connection(request: &Request) {
    if let Some(trust) = request.extensions().get::<super::connections::Trust>() {
        trust.grant();
    }
}

/// Answers to requests on connections that have not authenticated close them: such a client
/// does not keep a slot between its requests.
pub async fn close_untrusted(request: Request, next: Next) -> Response {
    let trust = request.extensions().get::<super::connections::Trust>().cloned();
    let mut response = next.run(request).await;
    if trust.is_some_and(|t| !t.granted()) {
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// Counts a failed authentication from `address` on `path`; `Some` (a 429) when the address is
/// over its budget.
pub fn failed(app: &App, address: Option<IpAddr>, path: &str) -> Option<Response> {
    use std::sync::atomic::Ordering::Relaxed;
    app.state.stats.auth_failures_total.fetch_add(1, Relaxed);
    match app.auth_failures.failed(address, path, std::time::Instant::now()) {
        super::throttle::Verdict::Refuse => None,
        super::throttle::Verdict::Throttle(wait) => {
            app.state.stats.auth_throttled_total.fetch_add(1, Relaxed);
            let mut response = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!("too many failed authentications from this address: try again in {} s", wait.as_secs()),
            )
            .into_response();
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(wait.as_secs()));
            Some(response)
        }
    }
}

/// Whether a WebSocket handshake's `Origin` may connect: the daemon's own origin (same host
/// and port as the request's `Host`), or one listed in `allowed_origins`. Clients that send no
/// `Origin` (not browsers) are let through: they still need the token.
pub fn origin_allowed(headers: &HeaderMap, allowed: &[String]) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let Ok(origin) = origin.to_str() else {
        return false;
    };
    if allowed.iter().any(|a| a.eq_ignore_ascii_case(origin)) {
        return true;
    }
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    let origin_host = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://"));
    origin_host.is_some_and(|h| h.eq_ignore_ascii_case(host))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringside_shared::Role;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(name.clone(), HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn token_from_bearer_or_session_cookie_names_the_identity() {
        let credentials = vec![
            Credential { name: "ana".into(), secret: "0123456789abcdef".into(), role: Role::Operator },
            Credential { name: "wall".into(), secret: "fedcba9876543210".into(), role: Role::Viewer },
        ];
        let sessions = Sessions::load(None, 9650, 0);
        let id = sessions.create(&credentials[1], crate::clock::now_ms()).unwrap();
        let authenticate = |h: &HeaderMap| authenticate_how(&credentials, &sessions, h).map(|(identity, _)| identity);
        let who = |pairs: &[(header::HeaderName, &str)]| authenticate(&headers(pairs)).map(|i| i.name);
        assert_eq!(who(&[(header::AUTHORIZATION, "Bearer 0123456789abcdef")]).as_deref(), Some("ana"));
        assert_eq!(who(&[(header::AUTHORIZATION, "bearer 0123456789abcdef")]).as_deref(), Some("ana"));
        let session = format!("a=b; ringside_session_9650={id}");
        assert_eq!(who(&[(header::COOKIE, &session)]).as_deref(), Some("wall"));
        let viewer = authenticate(&headers(&[(header::COOKIE, &session)]));
        assert_eq!(viewer.map(|i| i.role), Some(Role::Viewer));
        assert_eq!(who(&[(header::COOKIE, "ringside_token=fedcba9876543210")]), None, "the token is no cookie");
        assert_eq!(who(&[(header::AUTHORIZATION, "Basic 0123456789abcdef")]), None);
        assert_eq!(who(&[(header::AUTHORIZATION, "Bearer wrong")]), None);
        assert_eq!(who(&[]), None);
    }

    #[test]
    fn origins() {
        let allowed = vec!["https://console.example".to_string()];
        let check = |origin: &str| {
            origin_allowed(&headers(&[(header::HOST, "127.0.0.1:9650"), (header::ORIGIN, origin)]), &allowed)
        };
        assert!(check("http://127.0.0.1:9650"));
        assert!(check("https://console.example"));
        assert!(!check("http://evil.example"));
        assert!(!check("http://127.0.0.1:9651"));
        assert!(!check("null"));
        assert!(origin_allowed(&headers(&[(header::HOST, "127.0.0.1:9650")]), &allowed));
    }
}
