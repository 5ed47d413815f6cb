//! `ringsided`: Ringside's node daemon.
//!
//! Module map, from the top down: [`collector`] (the collection loop), [`server`] (HTTP,
//! WebSocket, console), [`prometheus`] (`/metrics`), [`state`] (the node state and its
//! broadcast), [`config`] (flags, file, env, gathering each subsystem's config); [`alerts`]
//! (conditions, rules, the alert store, Alertmanager forwarding, their config) over
//! [`metrics`] (every metric declared once: the exposition's, the rules' and the conditions'
//! readings); the sources [`gpu`] (NVML), [`attribution`] (why each GPU an ML job uses sits
//! idle), [`sched`] (the ML-aware scheduler: detection, phases, decisions, enforcement, its
//! trust boundary, its metrics source), [`kernels`] (ring kernels as metrics sources) and
//! [`host`]; [`history`] (every series kept 24 h at 1 s and 7 days at 1 min, on disk, and
//! downsampled for `/api/history`); the leaves [`pipeline`] (sources, samples, history, window aggregates),
//! [`clock`], [`identity`] (tokens, who is asking, how secrets compare), [`descriptors`] (the
//! daemon's open-file limit and what uprobes may take of it) and [`http_client`].
//!
//! Architecture invariants: modules import only modules below them (no circle); the server only
//! reads [`state::NodeState`] and calls its methods; metrics reach it only through the pipeline,
//! never from a route.

pub mod alerts;
pub mod attribution;
pub mod clock;
pub mod collector;
pub mod config;
pub mod descriptors;
pub mod gpu;
pub mod history;
pub mod host;
pub mod http_client;
pub mod identity;
pub mod invalid;
pub mod kernels;
pub mod metrics;
pub mod pipeline;
pub mod prometheus;
pub mod sched;
pub mod server;
pub mod state;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use ringside_shared::ComponentStatus;

use crate::config::{Config, TokenOrigin};
use crate::pipeline::Component;
use crate::state::NodeState;

/// SIGINT and SIGTERM, caught from the start of [`run`]: a stop asked for while the daemon is
/// still starting (its address not yet printed, the scheduler attaching) is kept and honoured
/// as soon as the server runs, with the same clean shutdown, instead of killing the process
/// with threads left changed.
struct StopSignals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn install() -> anyhow::Result<StopSignals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(StopSignals {
            interrupt: signal(SignalKind::interrupt()).context("cannot catch SIGINT")?,
            terminate: signal(SignalKind::terminate()).context("cannot catch SIGTERM")?,
        })
    }

    /// Resolves on the first SIGINT or SIGTERM received since [`StopSignals::install`].
    async fn recv(mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

/// Runs the daemon until SIGINT/SIGTERM.
pub async fn run(mut config: Config) -> anyhow::Result<()> {
    let stop = StopSignals::install()?;
    // Uprobe links, sockets and files are all descriptors: take what the hard limit allows.
    match descriptors::raise_soft_limit() {
        Ok((before, after)) if after > before => tracing::info!("open-file limit raised from {before} to {after}"),
        Ok(_) => {}
        Err(e) => tracing::warn!("cannot raise the open-file limit: {e}"),
    }
    prepare_data_dir(&config.data_dir)?;
    if matches!(config.token_origin, TokenOrigin::Generated) {
        config.tokens = generated_token(&config.data_dir.join(GENERATED_TOKEN_FILE), config.tokens)?;
    }
    let paths = host::HostPaths::default();
    let state = node_state(&config, host::node_identity(&paths, clock::now_ms()));
    let sources = metrics_sources(&config, &state, paths)?;

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (listener, local) = bind(config.listen).await?;
    // Before the address is announced: from then on SIGHUP reloads, it never ends the daemon.
    let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("cannot install the SIGHUP handler")?;
    announce(&config, local);

    let collector = tokio::spawn(collector::run(state.clone(), sources, stop_rx.clone()));
    if let Some(am) = &config.alertmanager {
        let scheme = if config.tls.is_some() { "https" } else { "http" };
        let generator = format!("{scheme}://{local}/");
        let forwarder = alerts::alertmanager::Forwarder::new(am.clone(), state.clone(), generator)
            .map_err(|e| anyhow::anyhow!("alertmanager: {e}"))?;
        let (tx, rx) = tokio::sync::mpsc::channel(alerts::alertmanager::QUEUE);
        state.set_forwarder(tx);
        state.set_health(Component::Alertmanager, ComponentStatus::Up, None);
        tokio::spawn(forwarder.run(rx, stop_rx.clone()));
    }
    let app = app(&config, state.clone(), local, stop_rx.clone());
    tokio::spawn(async move {
        stop.recv().await;
        tracing::info!("stopping");
        let _ = stop_tx.send(true);
    });
    let tls = config.tls.as_ref().map(|t| t.config.clone());
    tokio::spawn(reload_on_hangup(hangups, config.tls.clone(), state.clone()));
    server::listen::serve(listener, server::router(app), &config.server, tls, state.clone(), stop_rx).await;
    let _ = collector.await;
    finish(state).await;
    tracing::info!("stopped");
    Ok(())
}

/// The node state: the alert store (opened from the data directory, or set aside and started
/// afresh), the rules, the incident recorder and the console's health.
fn node_state(config: &Config, node: ringside_shared::NodeIdentity) -> Arc<NodeState> {
    let db_path = config.data_dir.join("alerts.db");
    let (mut store, store_note) = open_alert_store(config.alerts.lifecycle(), &db_path);
    store.set_maintenance(config.maintenance.clone());
    let mut rules = alerts::rules::RuleEngine::new(config.rules.clone());
    rules.resume(store.active());
    let settings = state::Settings {
        interval_ms: config.interval_ms,
        window_ms: config.window_ms,
        history_len: config.history_len,
        thresholds: config.thresholds.clone(),
        summary: config_summary(config),
        viewers_see_untrusted: config.server.viewers_see_untrusted,
    };
    let state = Arc::new(NodeState::new(node, settings, state::Alerting { store, rules }));
    if config.incidents.enabled {
        let c = &config.incidents;
        let store =
            alerts::incidents::store::BundleStore::open(&config.data_dir.join("incidents"), c.max_count, c.max_bytes);
        let recorder = alerts::incidents::Recorder::new(c.clone(), state.node().clone(), config.interval_ms, store);
        state.set_incidents(recorder);
    }
    if config.history.enabled {
        let dir = config.data_dir.join("history");
        match history::History::open(&config.history, &dir, clock::now_ms()) {
            Ok((history, notes)) => state.set_history(history, notes),
            Err(e) => {
                let why = format!("history is not kept: cannot use {}: {e}", dir.display());
                tracing::error!("{why}");
                state.set_health(Component::History, ComponentStatus::Degraded, Some(why));
            }
        }
    }
    if let Some(note) = store_note {
        tracing::error!("{note}");
        state.set_store_note(note);
    }
    if server::console::is_built() {
        state.set_health(Component::Console, ComponentStatus::Up, None);
    } else {
        let why = "this binary was built without the console: run `cargo xtask run`";
        state.set_health(Component::Console, ComponentStatus::Degraded, Some(why.into()));
    }
    state
}

/// Every metrics source the config turns on. The host source comes first in each tick's
/// sample: a `cpu_utilization` stats kernel reads its figures there. Run-queue samples go from
/// the scheduler to a stats kernel by their own feed, whatever the order.
fn metrics_sources(
    config: &Config,
    state: &NodeState,
    paths: host::HostPaths,
) -> anyhow::Result<Vec<Box<dyn pipeline::MetricsSource>>> {
    let mut sources: Vec<Box<dyn pipeline::MetricsSource>> = vec![Box::new(host::HostSource::new(paths))];
    let mut runq = None;
    if config.scheduler.enabled {
        let (numa, cpus) = (state.node().numa_nodes, state.node().cpus);
        let scheduler = sched::source::SchedulerSource::start(&config.scheduler, numa, cpus, &config.data_dir);
        runq = scheduler.runq_feed();
        sources.push(Box::new(scheduler));
    } else {
        // An earlier run with the scheduler on may have been killed with threads changed.
        if let Err(why) = sched::source::recover(&config.data_dir.join(sched::source::JOURNAL_FILE)) {
            tracing::warn!("{why}");
        }
    }
    if config.gpu.mode != gpu::GpuMode::Off {
        let interval = std::time::Duration::from_millis(config.interval_ms);
        sources.push(Box::new(gpu::GpuSource::start(&config.gpu, interval)));
    }
    for kernel in &config.kernels {
        let source = kernels::KernelSource::launch(kernel.clone(), runq.clone())
            .map_err(|e| anyhow::anyhow!("cannot launch ring kernel {}: {e}", kernel.id))?;
        sources.push(Box::new(source));
    }
    Ok(sources)
}

async fn bind(listen: std::net::SocketAddr) -> anyhow::Result<(tokio::net::TcpListener, std::net::SocketAddr)> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen} (in use? pass --listen ADDR)"))?;
    let local = listener.local_addr().context("listening socket has no address")?;
    if !local.ip().is_loopback() {
        tracing::warn!(
            "listening on {local}, reachable from other machines: anyone with the token can use the console"
        );
    }
    Ok((listener, local))
}

/// What the routes share: the state, the tokens, the sessions kept across restarts.
fn app(
    config: &Config,
    state: Arc<NodeState>,
    local: std::net::SocketAddr,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> Arc<server::App> {
    let sessions = server::session::Sessions::load(
        Some(config.data_dir.join(server::session::FILE)),
        local.port(),
        clock::now_ms(),
    )
    .secure(config.tls.is_some())
    .idle(config.server.session_idle_hours * 3_600_000);
    Arc::new(server::App {
        state,
        credentials: config.tokens.clone(),
        allowed_origins: config.allowed_origins.clone(),
        shutdown,
        max_ws_sessions: config.server.max_ws_sessions,
        sessions,
        auth_failures: server::throttle::AuthFailures::new(config.server.auth_failures_per_address),
        fleet_job_url: config.server.fleet_job_url.clone(),
    })
}

/// At stop: bundles still recording are written with what they hold, and the last alert
/// changes reach the disk before the process ends.
async fn finish(state: Arc<NodeState>) {
    let finishing = state.clone();
    let finished =
        tokio::task::spawn_blocking(move || finishing.finish_incidents(std::time::Duration::from_secs(10))).await;
    if !matches!(finished, Ok(true)) {
        tracing::error!("incident bundles still recording could not all be written before stopping");
    }
    let closing = state.clone();
    if tokio::task::spawn_blocking(move || closing.close_history()).await.is_err() {
        tracing::error!("the history's last minute could not be written before stopping");
    }
    let flushed = tokio::task::spawn_blocking(move || state.flush_alert_store(std::time::Duration::from_secs(5))).await;
    if !matches!(flushed, Ok(true)) {
        tracing::error!("alert changes of the last seconds could not be written before stopping");
    }
}

/// The alert store on `path`. A database that cannot be opened or read is moved aside
/// (`alerts.db.corrupt-<UTC>`, with its WAL files) and a fresh one started, so that alert history
/// never keeps the daemon from serving; one written by a newer ringsided is left as it is and
/// alerts are kept in memory. The note says what was done, for the store's health.
fn open_alert_store(
    lifecycle: alerts::store::Lifecycle,
    path: &std::path::Path,
) -> (alerts::store::AlertStore, Option<String>) {
    use alerts::db::{AlertDb, DbError};
    use alerts::store::AlertStore;
    let load = |lifecycle| AlertStore::open(lifecycle, Some(AlertDb::open(path)?));
    let why = match load(lifecycle.clone()) {
        Ok(store) => return (store, None),
        Err(e @ DbError::TooNew { .. }) => {
            let note =
                format!("{} was written by a newer ringsided ({e}): alerts are kept in memory only", path.display());
            return (AlertStore::in_memory(lifecycle), Some(note));
        }
        Err(e) => e.to_string(),
    };
    let aside = path.with_file_name(format!("alerts.db.corrupt-{}", clock::utc_compact(clock::now_ms())));
    let mut moved = std::fs::rename(path, &aside);
    for suffix in ["-wal", "-shm"] {
        let mut from = path.as_os_str().to_owned();
        from.push(suffix);
        let mut to = aside.as_os_str().to_owned();
        to.push(suffix);
        let _ = std::fs::rename(&from, &to);
    }
    if moved.is_ok() {
        if let Ok(store) = load(lifecycle.clone()) {
            let note = format!(
                "{} could not be read ({why}): moved aside to {} and started afresh; earlier alerts are in that file",
                path.display(),
                aside.display()
            );
            return (store, Some(note));
        }
        moved = Err(std::io::Error::other("the fresh database could not be opened either"));
    }
    let note = format!(
        "{} could not be read ({why}) nor moved aside ({}): alerts are kept in memory only",
        path.display(),
        moved.err().map(|e| e.to_string()).unwrap_or_default()
    );
    (AlertStore::in_memory(lifecycle), Some(note))
}

/// Creates the data dir readable by its owner only (it holds the alert store, the enforcement
/// journal and a generated token); an existing one open to others is closed, with a warning.
fn prepare_data_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).with_context(|| {
        format!("cannot create data dir {} (set --data-dir to a writable directory)", dir.display())
    })?;
    let meta = std::fs::metadata(dir).with_context(|| format!("cannot stat data dir {}", dir.display()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        tracing::warn!("data dir {} was open to others (mode {mode:o}): set to 0700", dir.display());
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot restrict data dir {} to its owner", dir.display()))?;
    }
    Ok(())
}

/// The generated token's file in the data dir.
pub const GENERATED_TOKEN_FILE: &str = "token";

/// The token generated by an earlier start (kept in the data dir, mode 0600, so the console's
/// URL survives a restart), or `fresh` written there.
fn generated_token(path: &std::path::Path, fresh: Vec<config::Credential>) -> anyhow::Result<Vec<config::Credential>> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if path.exists() {
        match config::read_token_file(path) {
            Ok(kept) if !kept.is_empty() => return Ok(kept),
            Ok(_) => tracing::warn!("{} holds no token: writing a new one", path.display()),
            Err(e) => tracing::warn!("{e}: writing a new token"),
        }
        std::fs::remove_file(path).with_context(|| format!("cannot replace {}", path.display()))?;
    }
    let secret = fresh.first().map(|t| t.secret.clone()).unwrap_or_default();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .with_context(|| format!("cannot write the generated token to {}", path.display()))?;
    file.write_all(format!("{secret}\n").as_bytes()).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(fresh)
}

/// The configuration as the snapshot shows it: tokens by name and role, never their secrets.
fn config_summary(config: &Config) -> ringside_shared::ConfigSummary {
    ringside_shared::ConfigSummary {
        listen: config.listen.to_string(),
        interval_ms: config.interval_ms,
        window_ms: config.window_ms,
        history_len: config.history_len as u64,
        thresholds: config.thresholds.by_key(),
        clear_for_ms: config.alerts.clear_for_ms,
        flap_window_ms: config.alerts.flap_window_ms,
        rules: config.rules.iter().map(|r| r.summary()).collect(),
        tokens: config.tokens.iter().map(|t| format!("{} ({})", t.name, t.role.as_str())).collect(),
        alertmanager_url: config.alertmanager.as_ref().map(|a| a.url.clone()),
        metrics: metrics::summaries(),
    }
}

/// `ringsided snapshot`: fetches `/api/snapshot` from a running daemon and prints it.
pub async fn fetch_snapshot(url: &str, token: &str, ca_file: Option<&std::path::Path>) -> anyhow::Result<String> {
    let base = http_client::Url::parse(url).map_err(|e| anyhow::anyhow!("--url {e}"))?;
    let auth = http_client::Auth::Bearer(token.to_string());
    let request = http_client::Request { method: "GET", path: "/api/snapshot", auth: Some(&auth), body: None };
    let client = http_client::Client::new(ca_file).map_err(|e| anyhow::anyhow!("--ca-file {e}"))?;
    let response = http_client::send(&client, &base, request, std::time::Duration::from_secs(30))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let body = String::from_utf8(response.body).context("the snapshot is not UTF-8")?;
    match response.status {
        200 => {
            serde_json::from_str::<ringside_shared::Snapshot>(&body)
                .context("the daemon answered with something that is not a Ringside snapshot")?;
            Ok(body)
        }
        401 => anyhow::bail!("the daemon refused the token (401): pass --token-file or set RINGSIDE_TOKEN"),
        status => anyhow::bail!("the daemon answered {status}: {}", body.chars().take(300).collect::<String>()),
    }
}

/// SIGHUP: the TLS certificate and key are read again (a renewed certificate is served to new
/// connections); one that does not load leaves the pair in use, and the `tls` component says
/// why until a reload succeeds. Without TLS there is nothing to reload, and SIGHUP no longer
/// ends the daemon.
async fn reload_on_hangup(
    mut hangups: tokio::signal::unix::Signal,
    tls: Option<Arc<server::tls::Tls>>,
    state: Arc<state::NodeState>,
) {
    if tls.is_some() {
        state.set_health(Component::Tls, ComponentStatus::Up, None);
    }
    while hangups.recv().await.is_some() {
        let Some(tls) = &tls else {
            tracing::info!("SIGHUP: no TLS certificate to reload");
            continue;
        };
        match tls.reload() {
            Ok(()) => {
                tracing::info!("SIGHUP: TLS certificate and key reloaded");
                state.set_health(Component::Tls, ComponentStatus::Up, None);
            }
            Err(e) => {
                tracing::error!("SIGHUP: TLS reload failed, the previous certificate stays in use: {e}");
                let why = format!("reload failed, the previous certificate stays in use: {e}");
                state.set_health(Component::Tls, ComponentStatus::Degraded, Some(why));
            }
        }
    }
}

fn announce(config: &Config, local: SocketAddr) {
    let host = if local.ip().is_unspecified() { "127.0.0.1".to_string() } else { local.ip().to_string() };
    let host = if local.is_ipv6() && !local.ip().is_unspecified() { format!("[{host}]") } else { host };
    let scheme = if config.tls.is_some() { "https" } else { "http" };
    let base = format!("{scheme}://{host}:{}", local.port());
    match config.token_origin {
        TokenOrigin::Generated => {
            let secret = config.tokens.first().map(|t| t.secret.as_str()).unwrap_or_default();
            let file = config.data_dir.join(GENERATED_TOKEN_FILE);
            println!("ringsided listening on {base}\ntoken: {} (mode 0600; kept across restarts)", file.display());
            println!("console: {base}/?token={secret}")
        }
        TokenOrigin::Environment => {
            println!("ringsided listening on {base}\nconsole: {base}/?token=$RINGSIDE_TOKEN")
        }
        TokenOrigin::File => {
            println!("ringsided listening on {base}\nconsole: {base}/?token=<your token from the token file>")
        }
    }
}

/// Scratch space for unit tests.
#[cfg(test)]
pub(crate) mod test_support {
    use std::path::{Path, PathBuf};

    /// A fresh directory under the system temp dir, removed on drop.
    pub struct ScratchDir(PathBuf);

    impl ScratchDir {
        pub fn new(label: &str) -> ScratchDir {
            use std::sync::atomic::{AtomicU32, Ordering};
            static N: AtomicU32 = AtomicU32::new(0);
            let n = N.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!("ringside-{label}-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("create scratch dir");
            ScratchDir(dir)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }

        /// Writes `text` to a new file in the directory and returns its path.
        pub fn file(&self, name: &str, text: &str) -> PathBuf {
            let path = self.0.join(name);
            std::fs::write(&path, text).expect("write scratch file");
            path
        }
    }

    /// An active `rule` alert on `host`, raised at 1 ms, with no transitions.
    pub fn alert(id: u64, severity: ringside_shared::Severity, message: &str) -> ringside_shared::Alert {
        ringside_shared::Alert {
            id,
            alert_type: ringside_shared::AlertType::Rule,
            rule: Some("r".into()),
            severity,
            source: "host".into(),
            labels: Default::default(),
            message: message.into(),
            value: 1.0,
            threshold: 0.0,
            raised_at_ms: 1,
            updated_at_ms: 1,
            resolved_at_ms: None,
            acknowledgement: None,
            occurrence: 1,
            flapping: false,
            transitions: Vec::new(),
            silenced: None,
        }
    }

    impl Drop for ScratchDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
