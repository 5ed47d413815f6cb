//! Token check and WebSocket origin check.
//!
//! A request is authorised by `Authorization: Bearer <token>` or by the `ringside_token` cookie,
//! which the console's landing page sets (HttpOnly, SameSite=Strict) from `?token=` on the first
//! visit. The token found names an [`Identity`] (its name and role), which the middleware puts
//! in the request's extensions for the routes. Comparison takes the same time whatever the
//! input, so timing does not leak a token.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{ApiError, SharedApp};
use crate::identity::Credential;
pub use crate::identity::Identity;

pub const COOKIE_NAME: &str = "ringside_token";
/// How long the browser keeps the cookie: 30 days.
const COOKIE_MAX_AGE_S: u64 = 30 * 24 * 3600;

/// Equal-time comparison of two byte strings.
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    let mut difference = (a.len() ^ b.len()) as u8 | u8::from(a.len() != b.len());
    for (i, x) in a.iter().enumerate() {
        difference |= x ^ b.get(i).copied().unwrap_or(0);
    }
    difference == 0
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(COOKIE_NAME)?.strip_prefix('='))
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

pub fn authenticate(headers: &HeaderMap, credentials: &[Credential]) -> Option<Identity> {
    authenticate_how(headers, credentials).map(|(identity, _)| identity)
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

pub fn authenticate_how(headers: &HeaderMap, credentials: &[Credential]) -> Option<(Identity, Proof)> {
    [(bearer(headers), Proof::Bearer), (cookie(headers), Proof::Cookie)]
        .into_iter()
        .filter_map(|(given, proof)| Some((given?, proof)))
        .find_map(|(given, proof)| credential_for(given, credentials).map(|c| (c, proof)))
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

pub fn session_cookie(token: &str) -> HeaderValue {
    let cookie = format!("{COOKIE_NAME}={token}; Path=/; HttpOnly; SameSite=Strict; Max-Age={COOKIE_MAX_AGE_S}");
    // The token is checked to be printable ASCII without separators at start-up.
    HeaderValue::from_str(&cookie).unwrap_or_else(|_| HeaderValue::from_static("ringside_token=invalid; Path=/"))
}

pub async fn require_token(State(app): State<SharedApp>, mut request: Request, next: Next) -> Response {
    if let Some((identity, proof)) = authenticate_how(request.headers(), &app.credentials) {
        if proof == Proof::Cookie {
            if let Some(why) = cross_site_refusal(request.method(), request.headers(), &app.allowed_origins) {
                app.state.stats.auth_failures_total.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return ApiError::new(StatusCode::FORBIDDEN, why).into_response();
            }
        }
        request.extensions_mut().insert(identity);
        return next.run(request).await;
    }
    app.state.stats.auth_failures_total.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if request.uri().path() == "/ws" {
        app.state.stats.ws_refused_total.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    let mut response = ApiError::new(
        StatusCode::UNAUTHORIZED,
        "missing or wrong token: send `Authorization: Bearer <token>`, or open the console URL that ringsided printed",
    )
    .into_response();
    response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"ringside\""));
    response
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
    fn secrets_compare() {
        assert!(same_secret(b"abcdef", b"abcdef"));
        assert!(!same_secret(b"abcdef", b"abcdeg"));
        assert!(!same_secret(b"abc", b"abcdef"));
        assert!(!same_secret(b"abcdef", b"abc"));
        assert!(!same_secret(b"", b"a"));
    }

    #[test]
    fn token_from_bearer_or_cookie_names_the_identity() {
        let credentials = vec![
            Credential { name: "ana".into(), secret: "0123456789abcdef".into(), role: Role::Operator },
            Credential { name: "wall".into(), secret: "fedcba9876543210".into(), role: Role::Viewer },
        ];
        let who = |pairs: &[(header::HeaderName, &str)]| authenticate(&headers(pairs), &credentials).map(|i| i.name);
        assert_eq!(who(&[(header::AUTHORIZATION, "Bearer 0123456789abcdef")]).as_deref(), Some("ana"));
        assert_eq!(who(&[(header::AUTHORIZATION, "bearer 0123456789abcdef")]).as_deref(), Some("ana"));
        assert_eq!(who(&[(header::COOKIE, "a=b; ringside_token=fedcba9876543210")]).as_deref(), Some("wall"));
        let viewer = authenticate(&headers(&[(header::COOKIE, "ringside_token=fedcba9876543210")]), &credentials);
        assert_eq!(viewer.map(|i| i.role), Some(Role::Viewer));
        assert_eq!(who(&[(header::COOKIE, "ringside_tokenx=0123456789abcdef")]), None);
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
