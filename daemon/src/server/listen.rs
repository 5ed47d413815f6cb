//! The accept loop: each connection served by hyper's HTTP/1 server with a timer, so that a
//! client cannot hold the daemon's sockets, memory or file descriptors by being slow.
//!
//! - at most `max_connections` are open, `max_connections_per_address` from one address; past
//!   either, a new connection evicts the oldest one that has not authenticated, and is closed at
//!   once (and counted) only when every slot it could take is held by one that has (see
//!   [`super::connections`]); the answer to a request without a valid token closes its
//!   connection; after an eviction the loop takes no new connection until the evicted one's
//!   socket is closed (at most [`EVICTION_WAIT`]), so the descriptors held stay within the
//!   bound however fast connections arrive;
//! - the request headers must arrive within `header_read_timeout` (also between the requests
//!   of a kept-alive connection: an idle connection is closed after it);
//! - on shutdown, open connections finish the request in flight and close, within 5 s;
//! - with TLS, the handshake happens on the connection's own task and must also finish within
//!   `header_read_timeout`; a failed one closes the connection (and is counted), and a
//!   connection evicted during its handshake is closed at once.
//!
//! WebSocket sessions leave this count when they are upgraded; they have their own cap
//! (`max_ws_sessions`, in the WebSocket handler).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::{Extension, Router};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};

use super::connections::Connections;

use super::config::ServerConfig;
use crate::state::NodeState;

/// How long open connections get to finish when the daemon stops.
const DRAIN: Duration = Duration::from_secs(5);

/// How long the accept loop waits for an evicted connection's task to close its socket. The
/// task does nothing else once told, so this is a bound, not an expected time.
const EVICTION_WAIT: Duration = Duration::from_secs(1);

/// Serves one connection until it ends, is evicted (closed at once) or the daemon stops (then
/// drains it within [`DRAIN`]).
async fn connection<I>(
    io: I,
    service: Service,
    header_timeout: Duration,
    mut stop: watch::Receiver<bool>,
    evicted: oneshot::Receiver<()>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(header_timeout).keep_alive(true);
    let connection = builder.serve_connection(TokioIo::new(io), service).with_upgrades();
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => {}
        _ = evicted => {}
        _ = stop.changed() => {
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(DRAIN, connection).await;
        }
    }
}

type Service = TowerToHyperService<Router>;

/// Serves `router` on `listener` (over TLS when `tls` is given) until `shutdown` turns true.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    config: &ServerConfig,
    tls: Option<Arc<rustls::ServerConfig>>,
    state: Arc<NodeState>,
    mut shutdown: watch::Receiver<bool>,
) {
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    let stats = &state.stats;
    let table = Connections::new(config.max_connections, config.max_connections_per_address);
    let header_timeout = Duration::from_millis(config.header_read_timeout_ms);
    let mut refused_logged_at: Option<std::time::Instant> = None;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.changed() => break,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Out of file descriptors, or the like: wait a little rather than spin.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(mut admitted) = table.admit(peer.ip(), std::time::Instant::now()) else {
            stats.http_connections_refused_total.fetch_add(1, Ordering::Relaxed);
            // Said at most once a minute: the counter in /metrics has the number.
            if refused_logged_at.is_none_or(|at| at.elapsed() > Duration::from_secs(60)) {
                tracing::warn!(
                    %peer,
                    "every connection slot ({} in all, {} per address) is held by an authenticated client: \
                     closing new connections",
                    config.max_connections,
                    config.max_connections_per_address
                );
                refused_logged_at = Some(std::time::Instant::now());
            }
            drop(stream);
            continue;
        };
        stats.http_connections_evicted_total.fetch_add(admitted.closing.len() as u64, Ordering::Relaxed);
        stats.http_connections_total.fetch_add(1, Ordering::Relaxed);
        stats.http_connections_open.fetch_add(1, Ordering::Relaxed);
        let service = TowerToHyperService::new(
            router.clone().layer(Extension(ConnectInfo(peer))).layer(Extension(admitted.trust.clone())),
        );
        let evicted = std::mem::replace(&mut admitted.evicted, oneshot::channel().1);
        let closing = std::mem::take(&mut admitted.closing);
        let state = state.clone();
        let stop = shutdown.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let mut evicted = evicted;
            match tls {
                None => connection(stream, service, header_timeout, stop, evicted).await,
                Some(acceptor) => {
                    let handshake = tokio::time::timeout(header_timeout, acceptor.accept(stream));
                    // Evicted before its handshake ended: closed at once, like any other.
                    let handshake = tokio::select! {
                        done = handshake => Some(done),
                        _ = &mut evicted => None,
                    };
                    match handshake {
                        Some(Ok(Ok(stream))) => connection(stream, service, header_timeout, stop, evicted).await,
                        // A plain-HTTP client, a scanner, a certificate the client refused: closed.
                        Some(Ok(Err(e))) => {
                            state.stats.tls_handshake_failures_total.fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(%peer, "TLS handshake failed: {e}");
                        }
                        Some(Err(_)) => {
                            state.stats.tls_handshake_failures_total.fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(%peer, "TLS handshake not finished within {header_timeout:?}");
                        }
                        None => tracing::debug!(%peer, "evicted during its TLS handshake"),
                    }
                }
            }
            state.stats.http_connections_open.fetch_sub(1, Ordering::Relaxed);
            drop(admitted);
        });
        // The evicted connections' tasks close their sockets when next run: wait for that
        // here, or a burst of new connections would pile evicted sockets up faster than their
        // tasks run. The backlog waits in the kernel meanwhile, not in this process.
        for closed in closing {
            if tokio::time::timeout(EVICTION_WAIT, closed).await.is_err() {
                tracing::debug!("an evicted connection took over {EVICTION_WAIT:?} to close");
            }
        }
    }
}
