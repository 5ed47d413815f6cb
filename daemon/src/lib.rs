//! `ringsided`: Ringside's node daemon.
//!
//! Module map: [`config`] (flags, file, env), [`host`] (the host metrics source), [`pipeline`]
//! (sources, collection loop, history, window aggregates), [`alerts`] (conditions and the alert
//! store), [`state`] (the node state and its broadcast), [`server`] (HTTP, WebSocket, console),
//! [`prometheus`] (`/metrics`).
//!
//! Architecture invariant: the server only reads [`state::NodeState`] and calls its methods;
//! metrics reach it only through the pipeline, never from a route.

pub mod alerts;
pub mod config;
pub mod host;
pub mod pipeline;
pub mod prometheus;
pub mod server;
pub mod state;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use ringside_shared::{ComponentHealth, ComponentStatus};

use crate::config::{Config, TokenOrigin};
use crate::state::NodeState;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `YYYYMMDDTHHMMSSZ` for a Unix time in milliseconds (UTC), as used in download file names.
pub fn utc_compact(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Resolves on SIGINT or SIGTERM.
async fn stop_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = interrupt => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = interrupt.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}

/// Runs the daemon until SIGINT/SIGTERM.
pub async fn run(config: Config) -> anyhow::Result<()> {
    std::fs::create_dir_all(&config.data_dir).with_context(|| {
        format!(
            "cannot create data dir {} (set --data-dir to a writable directory)",
            config.data_dir.display()
        )
    })?;

    let started = now_ms();
    let paths = host::HostPaths::default();
    let node = host::node_identity(&paths, started);
    let console = if server::console::is_built() {
        ComponentHealth {
            name: "console".into(),
            status: ComponentStatus::Up,
            detail: None,
        }
    } else {
        ComponentHealth {
            name: "console".into(),
            status: ComponentStatus::Degraded,
            detail: Some("this binary was built without the console: run `cargo xtask run`".into()),
        }
    };
    let state = Arc::new(NodeState::new(
        node,
        config.interval_ms,
        config.window_ms,
        config.history_len,
        config.thresholds.clone(),
        vec![console],
    ));
    let sources: Vec<Box<dyn pipeline::MetricsSource>> =
        vec![Box::new(host::HostSource::new(paths))];

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (in use? pass --listen ADDR)",
                config.listen
            )
        })?;
    let local = listener
        .local_addr()
        .context("listening socket has no address")?;
    if !local.ip().is_loopback() {
        tracing::warn!("listening on {local}, reachable from other machines: anyone with the token can use the console");
    }
    announce(&config, local);

    let collector = tokio::spawn(pipeline::run(state.clone(), sources, stop_rx.clone()));
    let app = Arc::new(server::App {
        state,
        token: config.token.clone(),
        allowed_origins: config.allowed_origins.clone(),
        shutdown: stop_rx,
    });
    let service = server::router(app).into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, service)
        .with_graceful_shutdown(async move {
            stop_signal().await;
            tracing::info!("stopping");
            let _ = stop_tx.send(true);
        })
        .await
        .context("server failed")?;
    let _ = collector.await;
    tracing::info!("stopped");
    Ok(())
}

fn announce(config: &Config, local: SocketAddr) {
    let host = if local.ip().is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        local.ip().to_string()
    };
    let host = if local.is_ipv6() && !local.ip().is_unspecified() {
        format!("[{host}]")
    } else {
        host
    };
    let base = format!("http://{host}:{}", local.port());
    match config.token_origin {
        TokenOrigin::Generated => println!(
            "ringsided listening on {base}\nconsole: {base}/?token={}",
            config.token
        ),
        TokenOrigin::Environment => {
            println!("ringsided listening on {base}\nconsole: {base}/?token=$RINGSIDE_TOKEN")
        }
        TokenOrigin::File => println!(
            "ringsided listening on {base}\nconsole: {base}/?token=<contents of the token file>"
        ),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_file_time() {
        assert_eq!(super::utc_compact(0), "19700101T000000Z");
        assert_eq!(super::utc_compact(1_796_210_705_000), "20261202T112505Z");
        assert_eq!(super::utc_compact(951_782_400_000), "20000229T000000Z");
    }
}
