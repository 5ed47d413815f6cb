//! A minimal HTTP/1.1 client over tokio: one request per connection (`Connection: close`),
//! `http://`, or `https://` with rustls (the server's certificate checked against a CA file
//! given, else the system's bundle). Enough for `ringsided snapshot` and Alertmanager
//! forwarding, without pulling a second HTTP stack into the daemon.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
    pub bearer: Option<&'a str>,
    /// (content type, body)
    pub body: Option<(&'a str, &'a [u8])>,
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

/// The request and its response over an open connection.
async fn over<S>(mut stream: S, url: &Url, request: Request<'_>) -> Result<Response, HttpError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut head = format!(
        "{} {}{} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nUser-Agent: ringsided/{}\r\nAccept: application/json\r\n",
        request.method,
        url.base_path,
        request.path,
        url.host_header(),
        env!("CARGO_PKG_VERSION")
    );
    if let Some(token) = request.bearer {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    let body = match request.body {
        Some((content_type, body)) => {
            head.push_str(&format!("Content-Type: {content_type}\r\nContent-Length: {}\r\n", body.len()));
            body
        }
        None => {
            head.push_str("Content-Length: 0\r\n");
            &[]
        }
    };
    head.push_str("\r\n");
    let io = |source| HttpError::Io { host: url.host.clone(), port: url.port, source };
    stream.write_all(head.as_bytes()).await.map_err(io)?;
    stream.write_all(body).await.map_err(io)?;
    let mut raw = Vec::new();
    let read = (&mut stream).take(MAX_RESPONSE_BYTES as u64 + 64 * 1024).read_to_end(&mut raw).await;
    match read {
        Ok(_) => {}
        // A TLS peer that closes without `close_notify` after a whole response: the response
        // stands (it says its own length); a cut one fails to parse below.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
        Err(e) => return Err(io(e)),
    }
    parse_response(&raw).map_err(HttpError::Malformed)
}

fn parse_response(raw: &[u8]) -> Result<Response, String> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or("response has no header end")?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| "response head is not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let mut chunked = false;
    let mut length = None;
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            let value = value.trim();
            if name.eq_ignore_ascii_case("transfer-encoding") && value.eq_ignore_ascii_case("chunked") {
                chunked = true;
            } else if name.eq_ignore_ascii_case("content-length") {
                length = value.parse::<usize>().ok();
            }
        }
    }
    let rest = &raw[end + 4..];
    let body = if chunked {
        dechunk(rest)?
    } else {
        match length {
            Some(n) if n <= rest.len() => rest[..n].to_vec(),
            Some(n) => return Err(format!("response body cut short: {} of {n} bytes", rest.len())),
            None => rest.to_vec(),
        }
    };
    if body.len() > MAX_RESPONSE_BYTES {
        return Err(format!("response larger than {MAX_RESPONSE_BYTES} bytes"));
    }
    Ok(Response { status, body })
}

fn dechunk(mut data: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n").ok_or("bad chunk header")?;
        let size_text = std::str::from_utf8(&data[..line_end]).map_err(|_| "bad chunk size")?;
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| "bad chunk size")?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        // A size near usize::MAX (a hostile or broken server) must not overflow the bound.
        if size > MAX_RESPONSE_BYTES || out.len() + size > MAX_RESPONSE_BYTES {
            return Err(format!("chunk of {size} bytes: over the {MAX_RESPONSE_BYTES}-byte reply limit"));
        }
        if data.len() < size + 2 || &data[size..size + 2] != b"\r\n" {
            return Err("chunk cut short".into());
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
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

    #[test]
    fn responses() {
        let plain = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello").unwrap();
        assert_eq!((plain.status, plain.body.as_slice()), (200, &b"hello"[..]));
        let chunked = parse_response(
            b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((chunked.status, chunked.body.as_slice()), (404, &b"abcde"[..]));
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort").is_err());
        assert!(parse_response(b"garbage").is_err());
        // Sizes that would overflow or exceed the bound are errors, not panics.
        for size in ["ffffffffffffffff", "fffffffffffffffe", "4000001"] {
            let reply = format!("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{size}\r\nabc\r\n0\r\n\r\n");
            assert!(parse_response(reply.as_bytes()).is_err(), "{size}");
        }
        let no_crlf = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY0\r\n\r\n";
        assert!(parse_response(no_crlf).is_err(), "a chunk must end with CRLF");
    }
}
