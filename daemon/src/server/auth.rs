//! Token check and WebSocket origin check.
//!
//! A request is authorised by `Authorization: Bearer <token>` or by the `ringside_token` cookie,
//! which the console's landing page sets (HttpOnly, SameSite=Strict) from `?token=` on the first
//! visit. Comparison takes the same time whatever the input, so timing does not leak the token.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{ApiError, SharedApp};

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

pub fn is_authorised(headers: &HeaderMap, token: &str) -> bool {
    [bearer(headers), cookie(headers)]
        .into_iter()
        .flatten()
        .any(|given| same_secret(given.as_bytes(), token.as_bytes()))
}

pub fn session_cookie(token: &str) -> HeaderValue {
    let cookie = format!(
        "{COOKIE_NAME}={token}; Path=/; HttpOnly; SameSite=Strict; Max-Age={COOKIE_MAX_AGE_S}"
    );
    // The token is checked to be printable ASCII without separators at start-up.
    HeaderValue::from_str(&cookie)
        .unwrap_or_else(|_| HeaderValue::from_static("ringside_token=invalid; Path=/"))
}

pub async fn require_token(State(app): State<SharedApp>, request: Request, next: Next) -> Response {
    if is_authorised(request.headers(), &app.token) {
        return next.run(request).await;
    }
    if request.uri().path() == "/ws" {
        app.state
            .stats
            .ws_refused_total
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    let mut response = ApiError::new(
        StatusCode::UNAUTHORIZED,
        "missing or wrong token: send `Authorization: Bearer <token>`, or open the console URL that ringsided printed",
    )
    .into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"ringside\""),
    );
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
    let origin_host = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    origin_host.is_some_and(|h| h.eq_ignore_ascii_case(host))
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn token_from_bearer_or_cookie() {
        let token = "0123456789abcdef";
        assert!(is_authorised(
            &headers(&[(header::AUTHORIZATION, "Bearer 0123456789abcdef")]),
            token
        ));
        assert!(is_authorised(
            &headers(&[(header::AUTHORIZATION, "bearer 0123456789abcdef")]),
            token
        ));
        assert!(is_authorised(
            &headers(&[(header::COOKIE, "a=b; ringside_token=0123456789abcdef")]),
            token
        ));
        assert!(!is_authorised(
            &headers(&[(header::COOKIE, "ringside_tokenx=0123456789abcdef")]),
            token
        ));
        assert!(!is_authorised(
            &headers(&[(header::AUTHORIZATION, "Basic 0123456789abcdef")]),
            token
        ));
        assert!(!is_authorised(
            &headers(&[(header::AUTHORIZATION, "Bearer wrong")]),
            token
        ));
        assert!(!is_authorised(&HeaderMap::new(), token));
    }

    #[test]
    fn origins() {
        let allowed = vec!["https://console.example".to_string()];
        let check = |origin: &str| {
            origin_allowed(
                &headers(&[(header::HOST, "127.0.0.1:9650"), (header::ORIGIN, origin)]),
                &allowed,
            )
        };
        assert!(check("http://127.0.0.1:9650"));
        assert!(check("https://console.example"));
        assert!(!check("http://evil.example"));
        assert!(!check("http://127.0.0.1:9651"));
        assert!(!check("null"));
        assert!(origin_allowed(
            &headers(&[(header::HOST, "127.0.0.1:9650")]),
            &allowed
        ));
    }
}
