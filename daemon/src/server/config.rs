//! The server's own settings: `[server]` (connection, session and throttling limits) and HTTPS
//! over the listening address. Parsed and checked here; the config gathers them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;

use super::tls::Tls;
use crate::invalid::Invalid;

/// `[server]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Open HTTP connections at most (WebSocket sessions not counted once upgraded).
    pub max_connections: usize,
    /// Open HTTP connections from one client address at most. Past it (or past
    /// `max_connections`), a new connection evicts the oldest that has not authenticated.
    pub max_connections_per_address: usize,
    /// Time a client has to send a request's headers, and that a kept-alive connection may
    /// sit idle.
    pub header_read_timeout_ms: u64,
    /// WebSocket sessions at most.
    pub max_ws_sessions: usize,
    /// Failed authentications one client address may make per 10 s; beyond them it is
    /// answered 429 until the 10 s have passed (valid tokens are never held back).
    pub auth_failures_per_address: u32,
    /// A console session unused this long ends (it lasts 30 days at most anyway).
    pub session_idle_hours: u64,
    /// Viewers also see the command lines and library paths of processes whose users are not
    /// admitted for alerting (`[scheduler.alerting]`); operators always do.
    pub viewers_see_untrusted: bool,
    /// The fleet dashboard of a job (Grafana's `ringside-job`, say), `{job_id}` standing for
    /// the job's id: the console links each job to it.
    pub fleet_job_url: Option<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_connections: 256,
            max_connections_per_address: 64,
            header_read_timeout_ms: 10_000,
            max_ws_sessions: 64,
            auth_failures_per_address: 30,
            session_idle_hours: 12,
            viewers_see_untrusted: false,
            fleet_job_url: None,
        }
    }
}

impl ServerConfig {
    pub fn check(&self) -> Result<(), Invalid> {
        Invalid::range("server.max_connections", self.max_connections, 1, 65_536)?;
        // At most max_connections.
        Invalid::range(
            "server.max_connections_per_address",
            self.max_connections_per_address,
            1,
            self.max_connections,
        )?;
        Invalid::range("server.header_read_timeout_ms", self.header_read_timeout_ms, 100, 300_000)?;
        Invalid::range("server.max_ws_sessions", self.max_ws_sessions, 1, 4096)?;
        // 30 days at most.
        Invalid::range("server.session_idle_hours", self.session_idle_hours, 1, 720)?;
        Invalid::range("server.auth_failures_per_address", self.auth_failures_per_address, 1, 1_000_000)?;
        if let Some(url) = &self.fleet_job_url {
            let scheme = url.starts_with("https://") || url.starts_with("http://");
            let odd =
                url.chars().any(|c| c.is_whitespace() || c.is_control() || matches!(c, '"' | '\'' | '<' | '>' | '`'));
            if !scheme || odd || !url.contains("{job_id}") || url.len() > 2048 {
                return Err(Invalid::new(
                    "server.fleet_job_url",
                    format!("{url:?}"),
                    "must be an http(s) URL holding {job_id}, at most 2048 characters, without spaces or quotes",
                ));
            }
        }
        Ok(())
    }
}

/// HTTPS from a certificate chain and its key (both or neither).
pub fn tls(cert: Option<PathBuf>, key: Option<PathBuf>) -> Result<Option<Arc<Tls>>, Invalid> {
    const KEY: &str = "tls_cert_file / tls_key_file";
    match (cert, key) {
        (None, None) => Ok(None),
        (Some(cert), Some(key)) => {
            Tls::load(&cert, &key).map(Some).map_err(|e| Invalid::new(KEY, cert.display(), e.to_string()))
        }
        (cert, _) => Err(Invalid::new(
            KEY,
            cert.map(|c| c.display().to_string()).unwrap_or_else(|| "(none)".into()),
            "HTTPS needs both a certificate (--tls-cert) and its key (--tls-key)",
        )),
    }
}

/// An address other than loopback without TLS sends the token and everything the console shows
/// in the clear: refused unless `allow_plain_http`.
pub fn check_exposure(listen: SocketAddr, tls: bool, allow_plain_http: bool) -> Result<(), Invalid> {
    if listen.ip().is_loopback() || allow_plain_http || tls {
        return Ok(());
    }
    let why = format!(
        "not a loopback address: the token and the console would cross the network in plain HTTP. \
         Serve HTTPS (--tls-cert and --tls-key), or reach the console through an SSH tunnel instead (`ssh -L 9650:127.0.0.1:{port} NODE`, then \
         open the console URL on http://127.0.0.1:9650), or pass --allow-plain-http on a network \
         you trust",
        port = listen.port()
    );
    Err(Invalid::new("listen", listen, why))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fleet_link_must_be_an_http_url_holding_the_job_id() {
        let with = |url: &str| ServerConfig { fleet_job_url: Some(url.into()), ..ServerConfig::default() }.check();
        assert!(with("https://grafana.example/d/ringside-job?var-job_id={job_id}").is_ok());
        assert!(with("http://grafana:3000/d/ringside-job?var-job_id={job_id}").is_ok());
        for bad in [
            "javascript:alert(1)//{job_id}",
            "https://grafana.example/d/ringside-job",
            "https://grafana.example/d/x?a=\"{job_id}\"",
            "https://grafana.example/d/x?a={job_id} b",
        ] {
            let err = with(bad).unwrap_err().to_string();
            assert!(err.contains("server.fleet_job_url"), "{bad}: {err}");
        }
        assert!(with(&format!("https://g.example/{}{{job_id}}", "x".repeat(2048))).is_err());
    }
}
