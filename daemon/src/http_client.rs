//! The daemon's HTTP client: hyper's HTTP/1.1 client (the stack the server already runs on),
//! one request per connection (`Connection: close`), over `http://`, or `https://` with rustls
//! (the server's certificate checked against a CA file given, else the system's bundle); the
//! reply bounded in size and the whole exchange in time. Used by `ringsided snapshot` and
//! Alertmanager forwarding.

use std::time::Duration;

/// Largest response body read.
const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// Why a URL is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum UrlError {
    #[error("{0:?}: only http:// and https:// URLs are supported")]
    NotHttp(String),
    #[error(
        "credentials in the URL are refused (they would be logged and shown): put a token in \
         [alertmanager] bearer_token_file"
    )]
    Credentials,
    #[error("{url:?}: bad port {port:?}")]
    BadPort { url: String, port: String },
    #[error("{0:?}: no host")]
    NoHost(String),
}

/// Why a request got no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("no answer from {host}:{port} within {timeout:?}")]
    Timeout { host: String, port: u16, timeout: Duration },
    #[error("cannot connect to {host}:{port}: {source}")]
    Connect { host: String, port: u16, source: std::io::Error },
    #[error("{host}:{port}: {source}")]
    Io { host: String, port: u16, source: std::io::Error },
    /// The server answered with something that is not an HTTP/1.1 response within bounds.
    #[error("{0}")]
    Malformed(String),
    /// An `https://` URL, and no certificate authorities to check the server against.
    #[error("{0}")]
    Trust(String),
    #[error("TLS with {host}:{port}: {source}")]
    Tls { host: String, port: u16, source: std::io::Error },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Url {
    /// `https://`.
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// Path prefix without a trailing slash ("" for the root).
    pub base_path: String,
}

impl Url {
    pub fn parse(text: &str) -> Result<Url, UrlError> {
        let (tls, rest) = match (text.strip_prefix("http://"), text.strip_prefix("https://")) {
            (Some(rest), _) => (false, rest),
            (_, Some(rest)) => (true, rest),
            _ => return Err(UrlError::NotHttp(text.into())),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.contains('@') {
            return Err(UrlError::Credentials);
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) if !host.ends_with(']') || authority.starts_with('[') => {
                (host, port.parse::<u16>().map_err(|_| UrlError::BadPort { url: text.into(), port: port.into() })?)
            }
            _ => (authority, if tls { 443 } else { 80 }),
        };
        if host.is_empty() {
            return Err(UrlError::NoHost(text.into()));
        }
        Ok(Url {
            tls,
            host: host.trim_start_matches('[').trim_end_matches(']').to_string(),
            port,
            base_path: path.trim_end_matches('/').to_string(),
        })
    }

    fn host_header(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub auth: Option<&'a Auth>,
    /// (content type, body)
    pub body: Option<(&'a str, &'a [u8])>,
}

/// How a request proves who sends it.
#[derive(Clone, PartialEq)]
pub enum Auth {
    /// `Authorization: Bearer <token>`.
    Bearer(String),
    /// `Authorization: Basic` (RFC 7617) with a user and a password.
    Basic { user: String, password: String },
}

impl Auth {
    fn header_value(&self) -> String {
        use base64::Engine;
        match self {
            Auth::Bearer(token) => format!("Bearer {token}"),
            Auth::Basic { user, password } => {
                format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))
            }
        }
    }
}

/// Never prints the secret.
impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::Bearer(_) => f.write_str("Bearer(…)"),
            Auth::Basic { user, .. } => write!(f, "Basic({user:?}, …)"),
        }
    }
}

/// The TLS crypto provider of the daemon's server and client: ring, which builds with the C
/// compiler the rest of the daemon already needs (aws-lc-rs would bring post-quantum key
/// exchange, at the price of a much larger native build, also for the static guest binary).
pub fn crypto_provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    #[allow(deprecated)]
    std::sync::Arc::new(rustls::crypto::ring::default_provider())
}

/// Certificate bundles of the usual distributions, the first found is the system's trust.
const SYSTEM_BUNDLES: [&str; 2] = ["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"];

/// What `https://` URLs are checked against: the certificates of `ca_file` (PEM), else the
/// system's bundle. Built once; cheap to clone.
#[derive(Clone, Default)]
pub struct Client {
    tls: Option<tokio_rustls::TlsConnector>,
    /// Why there is no TLS (said when an `https://` URL is used).
    no_tls: Option<String>,
}

impl Client {
    pub fn new(ca_file: Option<&std::path::Path>) -> Result<Client, HttpError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::CertificateDer;
        let file = match ca_file {
            Some(file) => file.to_path_buf(),
            None => match SYSTEM_BUNDLES.iter().map(std::path::Path::new).find(|p| p.exists()) {
                Some(bundle) => bundle.to_path_buf(),
                None => {
                    let why = format!("no CA file given and no system bundle ({})", SYSTEM_BUNDLES.join(", "));
                    return Ok(Client { tls: None, no_tls: Some(why) });
                }
            },
        };
        let trust = |why: String| HttpError::Trust(format!("{}: {why}", file.display()));
        let mut roots = rustls::RootCertStore::empty();
        for der in CertificateDer::pem_file_iter(&file).map_err(|e| trust(e.to_string()))? {
            // A bundle may hold certificates this TLS stack cannot use: those are skipped.
            let _ = roots.add(der.map_err(|e| trust(e.to_string()))?);
        }
        if roots.is_empty() {
            return Err(trust("no usable certificate".into()));
        }
        let config = rustls::ClientConfig::builder_with_provider(crypto_provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| trust(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Client { tls: Some(tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))), no_tls: None })
    }
}

/// Sends one request and reads the whole response, within `timeout`.
pub async fn send(client: &Client, url: &Url, request: Request<'_>, timeout: Duration) -> Result<Response, HttpError> {
    tokio::time::timeout(timeout, exchange(client, url, request)).await.map_err(|_| HttpError::Timeout {
        host: url.host.clone(),
        port: url.port,
        timeout,
    })?
}

async fn exchange(client: &Client, url: &Url, request: Request<'_>) -> Result<Response, HttpError> {
    let stream = tokio::net::TcpStream::connect((url.host.as_str(), url.port))
        .await
        .map_err(|source| HttpError::Connect { host: url.host.clone(), port: url.port, source })?;
    if !url.tls {
        return over(stream, url, request).await;
    }
    let Some(connector) = &client.tls else {
        return Err(HttpError::Trust(client.no_tls.clone().unwrap_or_else(|| "TLS is not set up".into())));
    };
    let name = rustls::pki_types::ServerName::try_from(url.host.clone())
        .map_err(|e| HttpError::Trust(format!("{:?} cannot name a TLS server: {e}", url.host)))?;
    let tls = connector.connect(name, stream).await.map_err(|source| HttpError::Tls {
        host: url.host.clone(),
        port: url.port,
        source,
    })?;
    over(tls, url, request).await
}

/// The request and its response over an open connection, spoken by hyper's HTTP/1 client.
async fn over<S>(stream: S, url: &Url, request: Request<'_>) -> Result<Response, HttpError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use http_body_util::BodyExt;
    use hyper::header;
    let target = format!("{}{}", url.base_path, request.path);
    let mut builder = hyper::Request::builder()
        .method(request.method)
        .uri(&target)
        .header(header::HOST, url.host_header())
        .header(header::CONNECTION, "close")
        .header(header::USER_AGENT, concat!("ringsided/", env!("CARGO_PKG_VERSION")))
        .header(header::ACCEPT, "application/json");
    if let Some(auth) = request.auth {
        builder = builder.header(header::AUTHORIZATION, auth.header_value());
    }
    let body = match request.body {
        Some((content_type, body)) => {
            builder = builder.header(header::CONTENT_TYPE, content_type);
            bytes::Bytes::copy_from_slice(body)
        }
        None => bytes::Bytes::new(),
    };
    let request = builder
        .body(http_body_util::Full::new(body))
        .map_err(|e| HttpError::Malformed(format!("cannot form a request for {target:?}: {e}")))?;
    let failed = |e: hyper::Error| HttpError::Malformed(format!("{}:{}: {e}", url.host, url.port));
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.map_err(failed)?;
    let exchange = async {
        let response = sender.send_request(request).await.map_err(failed)?;
        let status = response.status().as_u16();
        let limited = http_body_util::Limited::new(response.into_body(), MAX_RESPONSE_BYTES);
        let body = limited.collect().await.map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                HttpError::Malformed(format!("reply larger than {MAX_RESPONSE_BYTES} bytes"))
            } else {
                HttpError::Malformed(format!("{}:{}: reply body: {e}", url.host, url.port))
            }
        })?;
        Ok(Response { status, body: body.to_bytes().to_vec() })
    };
    // The connection is driven beside the exchange, in this task: nothing outlives the
    // caller's timeout. Its end (the server closing) leaves the reply already read standing.
    let (mut exchange, mut connection) = (std::pin::pin!(exchange), std::pin::pin!(connection));
    let mut connected = true;
    loop {
        tokio::select! {
            outcome = &mut exchange => return outcome,
            _ = &mut connection, if connected => connected = false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let url = Url::parse("http://127.0.0.1:9093").unwrap();
        assert_eq!((url.host.as_str(), url.port, url.base_path.as_str()), ("127.0.0.1", 9093, ""));
        let url = Url::parse("http://am.example/prefix/").unwrap();
        assert_eq!((url.host.as_str(), url.port, url.base_path.as_str()), ("am.example", 80, "/prefix"));
        let url = Url::parse("http://[::1]:9650").unwrap();
        assert_eq!((url.host.as_str(), url.port), ("::1", 9650));
        let url = Url::parse("https://am.example").unwrap();
        assert_eq!((url.tls, url.port), (true, 443));
        assert!(!Url::parse("http://x").unwrap().tls);
        assert!(Url::parse("ftp://x").is_err());
        assert!(Url::parse("http://x:notaport").is_err());
        assert!(Url::parse("http://").is_err());
    }

    /// Serves one canned `reply` to one connection on loopback, after reading the request head;
    /// the head read comes back through the handle.
    async fn canned(reply: Vec<u8>) -> (Url, tokio::task::JoinHandle<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let served = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && socket.read(&mut byte).await.unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let _ = socket.write_all(&reply).await;
            let _ = socket.shutdown().await;
            String::from_utf8_lossy(&head).into_owned()
        });
        (Url::parse(&format!("http://127.0.0.1:{port}/base")).unwrap(), served)
    }

    async fn fetch(reply: &[u8], auth: Option<&Auth>) -> (Result<Response, HttpError>, String) {
        let (url, served) = canned(reply.to_vec()).await;
        let request = Request { method: "POST", path: "/api/v2/alerts", auth, body: Some(("application/json", b"[]")) };
        let outcome = send(&Client::default(), &url, request, Duration::from_secs(5)).await;
        (outcome, served.await.unwrap())
    }

    #[tokio::test]
    async fn replies_good_and_hostile() {
        let basic = Auth::Basic { user: "ringside".into(), password: "p\u{e4}ss:word".into() };
        let (plain, head) = fetch(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", Some(&basic)).await;
        let plain = plain.unwrap();
        assert_eq!((plain.status, plain.body.as_slice()), (200, &b"hello"[..]));
        assert!(head.starts_with("POST /base/api/v2/alerts HTTP/1.1\r\n"), "{head}");
        // "ringside:päss:word" in base64.
        assert!(head.contains("authorization: Basic cmluZ3NpZGU6cMOkc3M6d29yZA==\r\n"), "{head}");
        assert!(head.to_ascii_lowercase().contains("content-length: 2\r\n"), "{head}");

        let bearer = Auth::Bearer("t0ken".into());
        let (chunked, head) = fetch(
            b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
            Some(&bearer),
        )
        .await;
        let chunked = chunked.unwrap();
        assert_eq!((chunked.status, chunked.body.as_slice()), (404, &b"abcde"[..]));
        assert!(head.to_ascii_lowercase().contains("authorization: bearer t0ken\r\n"), "{head}");
        assert_eq!(format!("{basic:?} {bearer:?}"), "Basic(\"ringside\", …) Bearer(…)");

        // Cut short, garbage, chunk sizes that would overflow or exceed the bound, a chunk
        // without its CRLF, a declared length over the bound: errors, never panics.
        let mut hostile: Vec<Vec<u8>> = vec![
            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort".to_vec(),
            b"garbage".to_vec(),
            b"".to_vec(),
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY0\r\n\r\n".to_vec(),
            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\nabc", MAX_RESPONSE_BYTES + 1).into_bytes(),
        ];
        for size in ["ffffffffffffffff", "fffffffffffffffe", "4000001"] {
            let reply = format!("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{size}\r\nabc\r\n0\r\n\r\n");
            hostile.push(reply.into_bytes());
        }
        for reply in hostile {
            let (outcome, _) = fetch(&reply, None).await;
            assert!(outcome.is_err(), "{:?} was taken: {outcome:?}", String::from_utf8_lossy(&reply));
        }
    }

    #[tokio::test]
    async fn a_server_that_never_answers_is_a_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        let request = Request { method: "GET", path: "/", auth: None, body: None };
        let outcome = send(&Client::default(), &url, request, Duration::from_millis(300)).await;
        assert!(matches!(outcome, Err(HttpError::Timeout { .. })), "{outcome:?}");
        drop(listener);
    }
}
