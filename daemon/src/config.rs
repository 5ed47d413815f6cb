//! Configuration: command-line flags over environment over the TOML file over defaults, checked
//! once at start-up so a wrong value stops the daemon with a message that names it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};
use ringside_shared::Role;
use serde::Deserialize;

pub use crate::alerts::config::{AlertmanagerConfig, AlertsConfig, Thresholds};
use crate::alerts::rules::{self, Rule, RuleConfig};
use crate::gpu::GpuConfig;
pub use crate::identity::Credential;
use crate::kernels::KernelConfig;
use crate::sched::source::SchedulerConfig;
use crate::server::config as server_config;
pub use crate::server::config::ServerConfig;
use crate::server::tls::Tls;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    ReadFile { path: PathBuf, source: std::io::Error },
    #[error("config file {path} is not valid: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid `{key}` = {value}: {why}")]
    Invalid { key: &'static str, value: String, why: String },
    /// A section's own check refused a value.
    #[error(transparent)]
    Section(#[from] crate::invalid::Invalid),
    #[error("cannot read token file {path}: {source}")]
    TokenFile { path: PathBuf, source: std::io::Error },
    #[error("cannot generate a token: {0}")]
    Random(std::io::Error),
}

/// `ringsided` — Ringside's node daemon: host telemetry, alerts and the web console.
#[derive(Debug, Parser)]
#[command(name = "ringsided", version, about)]
pub struct Cli {
    /// TOML configuration file; flags and environment override its values.
    #[arg(long, env = "RINGSIDE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:9650].
    #[arg(long, env = "RINGSIDE_LISTEN")]
    pub listen: Option<String>,
    /// Listen on an address other than loopback without TLS: the token and everything the
    /// console shows then cross the network in the clear. Prefer TLS or an SSH tunnel.
    #[arg(long)]
    pub allow_plain_http: bool,
    /// Serve HTTPS with this PEM certificate chain (with --tls-key).
    #[arg(long, env = "RINGSIDE_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's PEM private key; a key file other users can read is refused.
    #[arg(long, env = "RINGSIDE_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Directory for the daemon's state [default: /var/lib/ringside as root, else ~/.local/state/ringside].
    #[arg(long, env = "RINGSIDE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Collection interval in milliseconds [default: 1000].
    #[arg(long, env = "RINGSIDE_INTERVAL_MS")]
    pub interval_ms: Option<u64>,
    /// File holding the access token, or several named ones as `name:secret[:role]` lines
    /// (role `operator` or `viewer`). Env RINGSIDE_TOKEN gives a single token itself.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// What carries out the scheduler's decisions: auto (sched_ext where the kernel has it,
    /// else setattr), scx, setattr or observe [default: observe; `[scheduler] backend`].
    #[arg(long, env = "RINGSIDE_SCHED_BACKEND", value_enum)]
    pub sched_backend: Option<crate::sched::source::BackendChoice>,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Fetch the node's snapshot from a running ringsided and print it as JSON.
    Snapshot {
        /// Base URL of the daemon.
        #[arg(long, default_value = "http://127.0.0.1:9650")]
        url: String,
        /// File holding the token (a bare secret, or `name:secret[:role]` lines: the first is used).
        /// Without it, env RINGSIDE_TOKEN.
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// For an https:// URL: the PEM certificates to check the daemon's against [default:
        /// the system's bundle].
        #[arg(long)]
        ca_file: Option<PathBuf>,
    },
}

/// The config file's shape. Every key is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct FileConfig {
    listen: Option<String>,
    data_dir: Option<PathBuf>,
    interval_ms: Option<u64>,
    token_file: Option<PathBuf>,
    tls_cert_file: Option<PathBuf>,
    tls_key_file: Option<PathBuf>,
    history_len: Option<usize>,
    window_ms: Option<u64>,
    allowed_origins: Vec<String>,
    thresholds: Thresholds,
    alerts: AlertsConfig,
    rules: Vec<RuleConfig>,
    maintenance: Vec<crate::alerts::silences::MaintenanceConfig>,
    incidents: crate::alerts::incidents::IncidentsConfig,
    history: crate::history::HistoryConfig,
    alertmanager: Option<AlertmanagerConfig>,
    kernels: Option<Vec<KernelConfig>>,
    scheduler: SchedulerConfig,
    gpu: GpuConfig,
    server: ServerConfig,
}

/// Where the access token came from; the URL with the token is printed only when generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenOrigin {
    Environment,
    File,
    Generated,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub interval_ms: u64,
    pub history_len: usize,
    pub window_ms: u64,
    /// Origins besides the daemon's own that may open the WebSocket (e.g. behind a proxy).
    pub allowed_origins: Vec<String>,
    pub thresholds: Thresholds,
    pub alerts: AlertsConfig,
    pub rules: Vec<Rule>,
    /// `[[maintenance]]`: weekly windows that silence alerts.
    pub maintenance: Vec<crate::alerts::silences::Window>,
    /// `[incidents]`: the evidence kept when an alert fires.
    pub incidents: crate::alerts::incidents::IncidentsConfig,
    /// `[history]`: what is kept of every series, in memory and under the data directory.
    pub history: crate::history::HistoryConfig,
    pub alertmanager: Option<AlertmanagerConfig>,
    /// Ring kernels to run: the config's `[[kernels]]`, else one `echo` canary.
    pub kernels: Vec<KernelConfig>,
    pub scheduler: SchedulerConfig,
    /// `[gpu]`: the NVML source.
    pub gpu: GpuConfig,
    /// `[server]`: connection limits.
    pub server: ServerConfig,
    pub tokens: Vec<Credential>,
    pub token_origin: TokenOrigin,
    /// HTTPS: the certificate and key files and the server's TLS configuration over them.
    pub tls: Option<std::sync::Arc<Tls>>,
}

/// The name a single, unnamed token (env, bare file, generated) goes by.
pub const SINGLE_TOKEN_NAME: &str = "operator";

pub const DEFAULT_LISTEN: &str = "127.0.0.1:9650";
pub const MIN_TOKEN_LEN: usize = 16;

impl Config {
    /// Builds the configuration from flags, the environment (`RINGSIDE_TOKEN` and the flags'
    /// variables, already folded into `cli` by clap) and the file named by `--config`.
    pub fn load(cli: &Cli, env_token: Option<String>) -> Result<Config, ConfigError> {
        let (mut file, file_text, file_path) = match &cli.config {
            Some(path) => {
                let (file, text) = read_file_config(path)?;
                (file, text, path.clone())
            }
            None => (FileConfig::default(), String::new(), PathBuf::new()),
        };
        let (listen, tls) = listener(cli, &file)?;
        let timing = Timing::resolve(cli, &file)?;
        check_origins(&file.allowed_origins)?;
        let rules = std::mem::take(&mut file.rules);
        let alerting = Alerting::resolve(&file, rules, (&file_text, &file_path), timing.interval_ms)?;
        let (kernels, scheduler) = workers(cli, &file)?;
        file.server.check()?;
        file.history.check()?;
        let data_dir = cli.data_dir.clone().or(file.data_dir).unwrap_or_else(default_data_dir);
        let (tokens, token_origin) = tokens(cli, env_token, file.token_file)?;
        Ok(Config {
            listen,
            data_dir,
            interval_ms: timing.interval_ms,
            history_len: timing.history_len,
            window_ms: timing.window_ms,
            allowed_origins: file.allowed_origins,
            thresholds: file.thresholds,
            alerts: file.alerts,
            rules: alerting.rules,
            maintenance: alerting.maintenance,
            incidents: file.incidents,
            history: file.history,
            alertmanager: alerting.alertmanager,
            kernels,
            scheduler,
            gpu: file.gpu,
            server: file.server,
            tokens,
            token_origin,
            tls,
        })
    }
}

/// The address to listen on and HTTPS over it; an address other than loopback needs TLS or
/// `--allow-plain-http`.
fn listener(cli: &Cli, file: &FileConfig) -> Result<(SocketAddr, Option<std::sync::Arc<Tls>>), ConfigError> {
    let listen_text = cli.listen.clone().or(file.listen.clone()).unwrap_or_else(|| DEFAULT_LISTEN.to_string());
    let listen: SocketAddr = listen_text.parse().map_err(|e| ConfigError::Invalid {
        key: "listen",
        value: format!("{listen_text:?}"),
        why: format!("{e}; expected IP:PORT such as {DEFAULT_LISTEN}"),
    })?;
    let cert = cli.tls_cert.clone().or(file.tls_cert_file.clone());
    let key = cli.tls_key.clone().or(file.tls_key_file.clone());
    let tls = server_config::tls(cert, key)?;
    server_config::check_exposure(listen, tls.is_some(), cli.allow_plain_http)?;
    Ok((listen, tls))
}

/// How often the daemon collects, and how much it keeps.
struct Timing {
    interval_ms: u64,
    history_len: usize,
    window_ms: u64,
}

impl Timing {
    fn resolve(cli: &Cli, file: &FileConfig) -> Result<Timing, ConfigError> {
        let interval_ms = cli.interval_ms.or(file.interval_ms).unwrap_or(1000);
        check_range("interval_ms", interval_ms, 100, 60_000)?;
        let history_len = file.history_len.unwrap_or(600);
        check_range("history_len", history_len as u64, 10, 100_000)?;
        let window_ms = file.window_ms.unwrap_or(10_000);
        if window_ms < interval_ms || window_ms > 3_600_000 {
            return Err(ConfigError::Invalid {
                key: "window_ms",
                value: window_ms.to_string(),
                why: format!("must be between interval_ms ({interval_ms}) and 3600000"),
            });
        }
        Ok(Timing { interval_ms, history_len, window_ms })
    }
}

fn check_origins(origins: &[String]) -> Result<(), ConfigError> {
    for origin in origins {
        if !(origin.starts_with("http://") || origin.starts_with("https://")) || origin.ends_with('/') {
            return Err(ConfigError::Invalid {
                key: "allowed_origins",
                value: format!("{origin:?}"),
                why: "an origin is scheme://host[:port] with no path, e.g. https://console.example".into(),
            });
        }
    }
    Ok(())
}

/// The alerting sections, checked: `[thresholds]`, `[alerts]`, `[incidents]`, `[[maintenance]]`,
/// `[alertmanager]` (its secrets read) and `[[rules]]` (compiled).
struct Alerting {
    rules: Vec<Rule>,
    maintenance: Vec<crate::alerts::silences::Window>,
    alertmanager: Option<AlertmanagerConfig>,
}

impl Alerting {
    fn resolve(
        file: &FileConfig,
        rules: Vec<RuleConfig>,
        (text, path): (&str, &Path),
        interval_ms: u64,
    ) -> Result<Alerting, ConfigError> {
        file.thresholds.check()?;
        check_alerts(&file.alerts)?;
        file.incidents.check(interval_ms)?;
        let mut maintenance = Vec::new();
        for window in &file.maintenance {
            maintenance.push(crate::alerts::silences::Window::from_config(window)?);
        }
        let alertmanager = file.alertmanager.clone().map(alertmanager).transpose()?;
        let rules = rules::compile(rules, text).map_err(|message| ConfigError::Parse { path: path.into(), message })?;
        Ok(Alerting { rules, maintenance, alertmanager })
    }
}

/// `[alertmanager]`: its URL checked (never echoed when it holds credentials) and its
/// secrets read.
fn alertmanager(mut am: AlertmanagerConfig) -> Result<AlertmanagerConfig, ConfigError> {
    let parsed = crate::http_client::Url::parse(&am.url);
    if parsed.is_err() || am.url.ends_with('/') {
        let credentials = parsed.as_ref().err() == Some(&crate::http_client::UrlError::Credentials);
        return Err(ConfigError::Invalid {
            key: "alertmanager.url",
            value: if credentials { "(not shown: it holds credentials)".into() } else { format!("{:?}", am.url) },
            why: match parsed {
                Err(e) if credentials => e.to_string(),
                _ => "an http:// or https:// base URL without a trailing slash, e.g. http://127.0.0.1:9093".into(),
            },
        });
    }
    check_range("alertmanager.resend_interval_ms", am.resend_interval_ms, 1000, 3_600_000)?;
    am.auth = alertmanager_auth(&am)?;
    Ok(am)
}

/// The ring kernels (`[[kernels]]`, else one `echo` canary) and the scheduler, checked
/// together: a stats kernel fed run-queue samples needs the scheduler that takes them.
fn workers(cli: &Cli, file: &FileConfig) -> Result<(Vec<KernelConfig>, SchedulerConfig), ConfigError> {
    let kernels = file.kernels.clone().unwrap_or_else(|| vec![KernelConfig::canary()]);
    crate::kernels::check_all(&kernels)?;
    let mut scheduler = file.scheduler.clone();
    if let Some(backend) = cli.sched_backend {
        scheduler.backend = Some(backend);
    }
    scheduler.check()?;
    let fed = |k: &&KernelConfig| {
        k.kernel == ringside_shared::KernelKind::Stats && k.input == ringside_shared::StatsInput::RunqLatency
    };
    if let Some(k) = kernels.iter().find(fed).filter(|_| !scheduler.enabled) {
        return Err(ConfigError::Invalid {
            key: "kernels",
            value: format!("{:?} (input = \"runq_latency\")", k.id),
            why: "run-queue samples come from the scheduler, which [scheduler] enabled = false turns off; \
                  enable it or set input = \"cpu_utilization\""
                .into(),
        });
    }
    Ok((kernels, scheduler))
}

/// The tokens: `--token-file`, then `RINGSIDE_TOKEN`, then the file's `token_file`, else one
/// generated (whose URL is printed).
fn tokens(
    cli: &Cli,
    env_token: Option<String>,
    file_token: Option<PathBuf>,
) -> Result<(Vec<Credential>, TokenOrigin), ConfigError> {
    let single = |secret: String| vec![Credential { name: SINGLE_TOKEN_NAME.into(), secret, role: Role::Operator }];
    let env_token = env_token.filter(|t| !t.is_empty());
    let (env_token, token_file) = match (&cli.token_file, env_token) {
        (Some(flag), _) => (None, Some(flag.clone())),
        (None, Some(token)) => (Some(token), None),
        (None, None) => (None, file_token),
    };
    match (env_token, token_file) {
        (Some(token), _) => {
            check_secret(&token).map_err(|why| ConfigError::Invalid { key: "token", value: "(hidden)".into(), why })?;
            Ok((single(token), TokenOrigin::Environment))
        }
        (None, Some(path)) => Ok((read_token_file(&path)?, TokenOrigin::File)),
        (None, None) => Ok((single(generate_token()?), TokenOrigin::Generated)),
    }
}

fn read_file_config(path: &Path) -> Result<(FileConfig, String), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile { path: path.into(), source })?;
    let file = toml::from_str(&text).map_err(|e| ConfigError::Parse { path: path.into(), message: e.to_string() })?;
    Ok((file, text))
}

fn check_alerts(a: &AlertsConfig) -> Result<(), ConfigError> {
    check_range("alerts.clear_for_ms", a.clear_for_ms, 0, 86_400_000)?;
    check_range("alerts.flap_window_ms", a.flap_window_ms, 0, 86_400_000)?;
    check_range("alerts.flap_threshold", u64::from(a.flap_threshold), 2, 1000)?;
    check_range("alerts.resolved_kept", a.resolved_kept as u64, 1, 10_000)
}

fn check_range(key: &'static str, value: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::Invalid { key, value: value.to_string(), why: format!("must be between {min} and {max}") })
    }
}

fn default_data_dir() -> PathBuf {
    let is_root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false);
    if is_root {
        return PathBuf::from("/var/lib/ringside");
    }
    match std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        Some(state) => PathBuf::from(state).join("ringside"),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| ".".into())).join(".local/state/ringside"),
    }
}

/// A token file: one bare secret, or `name:secret[:role]` lines (`#` comments and blank lines
/// ignored; role defaults to operator). Errors name the line, never the secret.
///
/// A token file anyone on the machine may read (or write) is refused; one its group may read is
/// used with a warning.
pub fn read_token_file(path: &Path) -> Result<Vec<Credential>, ConfigError> {
    let text = read_secret_file(path, "token_file")?;
    parse_tokens(&text).map_err(|why| ConfigError::Invalid {
        key: "token_file",
        value: path.display().to_string(),
        why,
    })
}

/// A file holding secrets (at most 1 MiB of it): refused if every user on the machine may read
/// or write it, used with a warning if its group may.
/// The credentials `[alertmanager]` names: a bearer token file, or a user and a password file
/// (one of the two ways); each secret one line of printable ASCII.
fn alertmanager_auth(
    am: &crate::alerts::config::AlertmanagerConfig,
) -> Result<Option<crate::http_client::Auth>, ConfigError> {
    use crate::http_client::Auth;
    let secret = |path: &Path, key: &'static str| -> Result<String, ConfigError> {
        let text = read_secret_file(path, key)?;
        let secret = text.trim_end_matches(['\r', '\n']).trim();
        if secret.is_empty() || secret.len() > 4096 || !secret.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ConfigError::Invalid {
                key,
                value: path.display().to_string(),
                why: "must hold one secret: printable ASCII without spaces, at most 4096 characters".into(),
            });
        }
        Ok(secret.to_string())
    };
    match (&am.bearer_token_file, &am.basic_auth_user, &am.basic_auth_password_file) {
        (None, None, None) => Ok(None),
        (Some(path), None, None) => Ok(Some(Auth::Bearer(secret(path, "alertmanager.bearer_token_file")?))),
        (None, Some(user), Some(path)) => {
            if user.is_empty() || user.len() > 256 || user.contains(':') || user.chars().any(char::is_control) {
                return Err(ConfigError::Invalid {
                    key: "alertmanager.basic_auth_user",
                    value: format!("{user:?}"),
                    why: "a user name of 1 to 256 characters, without ':' or control characters".into(),
                });
            }
            let password = secret(path, "alertmanager.basic_auth_password_file")?;
            Ok(Some(Auth::Basic { user: user.clone(), password }))
        }
        (None, Some(_), None) | (None, None, Some(_)) => Err(ConfigError::Invalid {
            key: "alertmanager.basic_auth_user",
            value: "[alertmanager]".into(),
            why: "basic authentication needs both basic_auth_user and basic_auth_password_file".into(),
        }),
        (Some(_), _, _) => Err(ConfigError::Invalid {
            key: "alertmanager.bearer_token_file",
            value: "[alertmanager]".into(),
            why: "one way to authenticate: a bearer token file, or basic_auth_user with basic_auth_password_file"
                .into(),
        }),
    }
}

fn read_secret_file(path: &Path, key: &'static str) -> Result<String, ConfigError> {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    let invalid = |why: String| ConfigError::Invalid { key, value: path.display().to_string(), why };
    let (file, meta) = crate::identity::open_secret_file(path).map_err(|e| match e {
        crate::identity::SecretFileError::Open { source, .. } => ConfigError::TokenFile { path: path.into(), source },
        refused => invalid(refused.to_string()),
    })?;
    let mode = meta.permissions().mode();
    if mode & 0o006 != 0 {
        return Err(invalid(format!(
            "it is open to every user on this machine (mode {:o}): run `chmod 600 {}`",
            mode & 0o777,
            path.display()
        )));
    }
    if mode & 0o060 != 0 {
        tracing::warn!("{key} {} is open to its group (mode {:o}): consider `chmod 600`", path.display(), mode & 0o777);
    }
    let mut text = String::new();
    file.take(MAX_TOKEN_FILE_BYTES)
        .read_to_string(&mut text)
        .map_err(|source| ConfigError::TokenFile { path: path.into(), source })?;
    Ok(text)
}

pub fn parse_tokens(text: &str) -> Result<Vec<Credential>, String> {
    let lines: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
        .collect();
    if let [(line, secret)] = lines[..] {
        if !secret.contains(':') {
            check_secret(secret).map_err(|why| format!("line {line}: {why}"))?;
            return Ok(vec![Credential {
                name: SINGLE_TOKEN_NAME.into(),
                secret: secret.into(),
                role: Role::Operator,
            }]);
        }
    }
    let mut tokens: Vec<Credential> = Vec::new();
    for (line, text) in lines {
        let mut parts = text.split(':');
        let (Some(name), Some(secret)) = (parts.next(), parts.next()) else {
            return Err(format!("line {line}: expected name:secret[:role]"));
        };
        let role = match parts.next().map(str::trim) {
            None | Some("operator") => Role::Operator,
            Some("viewer") => Role::Viewer,
            Some(other) => return Err(format!("line {line}: role {other:?} must be operator or viewer")),
        };
        if parts.next().is_some() {
            return Err(format!("line {line}: expected name:secret[:role], found more fields"));
        }
        let (name, secret) = (name.trim(), secret.trim());
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c)) {
            return Err(format!("line {line}: token name {name:?} must be letters, digits, '-', '_', '.' or '@'"));
        }
        check_secret(secret).map_err(|why| format!("line {line}: {why}"))?;
        if tokens.iter().any(|t| t.name == name) {
            return Err(format!("line {line}: token name {name:?} appears twice"));
        }
        if tokens.iter().any(|t| t.secret == secret) {
            return Err(format!("line {line}: this secret is already used by another token"));
        }
        tokens.push(Credential { name: name.into(), secret: secret.into(), role });
    }
    if tokens.is_empty() {
        return Err("no token in the file".into());
    }
    Ok(tokens)
}

fn check_secret(secret: &str) -> Result<(), String> {
    if secret.len() < MIN_TOKEN_LEN
        || !secret.bytes().all(|b| b.is_ascii_graphic())
        || secret.contains([';', ',', '"', '\\', ':'])
    {
        return Err(format!(
            "a token needs at least {MIN_TOKEN_LEN} printable ASCII characters without spaces, quotes, ':', ';', ',' or '\\'"
        ));
    }
    Ok(())
}

/// Token files are read up to this size (thousands of named tokens fit).
const MAX_TOKEN_FILE_BYTES: u64 = 1 << 20;

/// 32 random bytes from the kernel, hex-encoded.
pub fn generate_token() -> Result<String, ConfigError> {
    crate::identity::generate_token().map_err(ConfigError::Random)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("ringsided").chain(args.iter().copied())).expect("flags parse")
    }

    /// A config file in its own scratch directory, held so it is removed with the file.
    struct TempPath(std::path::PathBuf, #[allow(dead_code)] crate::test_support::ScratchDir);

    fn write(text: &str) -> TempPath {
        let dir = crate::test_support::ScratchDir::new("config-test");
        TempPath(dir.file("ringside.toml", text), dir)
    }

    #[test]
    fn defaults_are_safe() {
        let config = Config::load(&cli(&[]), None).unwrap();
        assert_eq!(config.listen.to_string(), DEFAULT_LISTEN);
        assert!(config.listen.ip().is_loopback());
        assert_eq!(config.interval_ms, 1000);
        assert_eq!(config.token_origin, TokenOrigin::Generated);
        assert_eq!(config.tokens.len(), 1);
        assert_eq!(config.tokens[0].secret.len(), 64);
        assert_eq!((config.tokens[0].name.as_str(), config.tokens[0].role), (SINGLE_TOKEN_NAME, Role::Operator));
        assert_ne!(
            config.tokens[0].secret,
            Config::load(&cli(&[]), None).unwrap().tokens[0].secret,
            "tokens are random"
        );
        assert_eq!(config.thresholds, Thresholds::default());
    }

    #[test]
    fn flags_override_file_and_env_token_wins() {
        let file = write("listen = \"127.0.0.1:1000\"\ninterval_ms = 500\n[thresholds]\ndrop_rate_warning = 0.02\n");
        let path = file.0.to_str().unwrap();
        let config =
            Config::load(&cli(&["--config", path, "--listen", "127.0.0.1:2000"]), Some("a-token-from-the-env".into()))
                .unwrap();
        assert_eq!(config.listen.port(), 2000);
        assert_eq!(config.interval_ms, 500);
        use crate::alerts::kinds::{DROP_RATE_ERROR, DROP_RATE_WARNING};
        assert_eq!(config.thresholds.get(&DROP_RATE_WARNING), 0.02);
        assert_eq!(config.thresholds.get(&DROP_RATE_ERROR), 0.05);
        assert_eq!(config.tokens[0].secret, "a-token-from-the-env");
        assert_eq!(config.token_origin, TokenOrigin::Environment);
        // The flag beats the environment, as every other flag does.
        let token = write(
            "ana:0123456789abcdef0123
wall:bbbbbbbbbbbbbbbb2:viewer
",
        );
        private(&token.0);
        let config =
            Config::load(&cli(&["--token-file", token.0.to_str().unwrap()]), Some("a-token-from-the-env".into()))
                .unwrap();
        assert_eq!((config.tokens.len(), config.token_origin), (2, TokenOrigin::File));
    }

    /// Makes a file readable by its owner only, as token files must be.
    fn private(path: &std::path::Path) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    #[test]
    fn token_file_is_read() {
        let token = write("0123456789abcdef0123\n");
        // Open to every user: refused, naming the fix and never the secret.
        let open = Config::load(&cli(&["--token-file", token.0.to_str().unwrap()]), None).unwrap_err().to_string();
        assert!(open.contains("chmod 600") && !open.contains("0123456789abcdef0123"), "{open}");
        private(&token.0);
        let config = Config::load(&cli(&["--token-file", token.0.to_str().unwrap()]), None).unwrap();
        assert_eq!(config.tokens[0].secret, "0123456789abcdef0123");
        assert_eq!(config.token_origin, TokenOrigin::File);
    }

    #[test]
    fn named_tokens_with_roles() {
        let text = "# the on-call team\nana:aaaaaaaaaaaaaaaa1\n\nwall:bbbbbbbbbbbbbbbb2:viewer\nbo:cccccccccccccccc3:operator\n";
        let tokens = parse_tokens(text).unwrap();
        let summary: Vec<(&str, Role)> = tokens.iter().map(|t| (t.name.as_str(), t.role)).collect();
        assert_eq!(summary, vec![("ana", Role::Operator), ("wall", Role::Viewer), ("bo", Role::Operator)]);
        assert_eq!(tokens[1].secret, "bbbbbbbbbbbbbbbb2");
        let error = |text: &str| parse_tokens(text).unwrap_err();
        assert!(error("ana:aaaaaaaaaaaaaaaa1\nbo:short\n").starts_with("line 2:"));
        assert!(error("ana:aaaaaaaaaaaaaaaa1:admin\n").contains("operator or viewer"));
        assert!(error("ana:aaaaaaaaaaaaaaaa1\nana:bbbbbbbbbbbbbbbb2\n").contains("twice"));
        assert!(error("ana:aaaaaaaaaaaaaaaa1\nbo:aaaaaaaaaaaaaaaa1\n").contains("already used"));
        assert!(!error("ana:aaaaaaaaaaaaaaaa1\nbo:short\n").contains("short"), "errors never echo a secret");
        assert!(error("# nothing\n").contains("no token"));
    }

    #[test]
    fn scheduler_section_is_checked() {
        let file = write(
            "[scheduler]\nmode = \"enforce\"\nwindow_ms = 50\n[scheduler.policy.optimizer_step]\nnice = -10\nslice_us = 500\n",
        );
        let config = Config::load(&cli(&["--config", file.0.to_str().unwrap()]), None).unwrap();
        assert_eq!((config.scheduler.mode.as_str(), config.scheduler.window_ms), ("enforce", 50));
        assert_eq!(config.scheduler.policy.optimizer_step.nice, -10);
        assert_eq!(
            config.scheduler.policy.optimizer_step.cpus,
            crate::sched::policy::CpuChoice::GpuNode,
            "unset keys keep their defaults"
        );
        assert_eq!(config.scheduler.policy.data_loading.nice, -5, "unset phases keep theirs");
        use crate::sched::source::BackendChoice;
        assert_eq!(config.scheduler.backend(), BackendChoice::Auto, "enforce without a backend: the best one there is");
        let flagged = Config::load(&cli(&["--config", file.0.to_str().unwrap(), "--sched-backend", "setattr"]), None);
        assert_eq!(flagged.unwrap().scheduler.backend(), BackendChoice::Setattr, "the flag overrides the file");
        let wrong = Cli::try_parse_from(["ringsided", "--sched-backend", "cfs"]).unwrap_err().to_string();
        assert!(wrong.contains("'cfs'") && wrong.contains("auto, scx, setattr, observe"), "{wrong}");
        for (text, expected) in [
            ("[scheduler]\nmode = \"enforced\"\n", "unknown variant `enforced`, expected `observe` or `enforce`"),
            ("[scheduler]\nwindow_ms = 5\n", "invalid `scheduler.window_ms` = 5: must be from 20 to 10000"),
            ("[scheduler]\nbackend = \"bpf\"\n", "expected one of `auto`, `scx`, `setattr`, `observe`"),
            ("[scheduler.policy.gpu_compute]\nnice = 0\nsched_policy = \"fifo\"\n", "sched_policy = \"fifo\""),
            ("[scheduler.policy.gpu_compute]\nnice = 40\n", "`scheduler.policy.gpu_compute.nice` = 40"),
            ("[scheduler]\nwindows_ms = 100\n", "windows_ms"),
            (
                "[scheduler]\nenabled = false\n\n[[kernels]]\nid = \"runq\"\nkernel = \"stats\"\n",
                "enable it or set input = \"cpu_utilization\"",
            ),
        ] {
            let bad = write(text);
            let message = Config::load(&cli(&["--config", bad.0.to_str().unwrap()]), None).unwrap_err().to_string();
            assert!(message.contains(expected), "{text}: {message}");
        }
    }

    #[test]
    fn rules_alerts_and_alertmanager_sections() {
        let file = write(
            "[alerts]\nclear_for_ms = 5000\n\n[alertmanager]\nurl = \"http://127.0.0.1:9093\"\n\n[[rules]]\nname = \"hot\"\nmetric = \"host.load1\"\nop = \">\"\nthreshold = 8\nfor = \"1m\"\nseverity = \"warning\"\n",
        );
        let config = Config::load(&cli(&["--config", file.0.to_str().unwrap()]), None).unwrap();
        assert_eq!(config.alerts.clear_for_ms, 5000);
        assert_eq!(config.alerts.flap_threshold, 3);
        assert_eq!(config.alertmanager.as_ref().unwrap().resend_interval_ms, 60_000);
        assert_eq!(config.rules.len(), 1);
        assert_eq!(config.rules[0].for_ms, 60_000);
        let bad = write(
            "\n\n[[rules]]\nname = \"x\"\nmetric = \"host.nope\"\nop = \">\"\nthreshold = 1\nseverity = \"info\"\n",
        );
        let message = Config::load(&cli(&["--config", bad.0.to_str().unwrap()]), None).unwrap_err().to_string();
        assert!(message.contains("line 5") && message.contains("host.nope"), "{message}");
        let am = write("[alertmanager]\nurl = \"alertmanager:9093\"\n");
        let message = Config::load(&cli(&["--config", am.0.to_str().unwrap()]), None).unwrap_err().to_string();
        assert!(message.contains("alertmanager.url"), "{message}");
        // Credentials go in a file, never in the URL (which is logged and shown).
        let am = write("[alertmanager]\nurl = \"http://ops:hunter2@127.0.0.1:9093\"\n");
        let message = Config::load(&cli(&["--config", am.0.to_str().unwrap()]), None).unwrap_err().to_string();
        assert!(message.contains("bearer_token_file") && !message.contains("hunter2"), "{message}");
        use std::os::unix::fs::PermissionsExt;
        let token = am.0.with_file_name("am-token");
        std::fs::write(&token, "s3cr3t-am-token\n").unwrap();
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
        let text =
            format!("[alertmanager]\nurl = \"http://127.0.0.1:9093\"\nbearer_token_file = \"{}\"\n", token.display());
        let am = write(&text);
        let config = Config::load(&cli(&["--config", am.0.to_str().unwrap()]), None).unwrap();
        let loaded = config.alertmanager.unwrap();
        assert_eq!(loaded.auth, Some(crate::http_client::Auth::Bearer("s3cr3t-am-token".into())));
        assert!(!format!("{loaded:?}").contains("s3cr3t"), "never printed");
        // Basic authentication: a user, and the password from a file.
        let basic = format!(
            "[alertmanager]\nurl = \"https://127.0.0.1:9093\"\nbasic_auth_user = \"ringside\"\nbasic_auth_password_file = \"{}\"\n",
            token.display()
        );
        let basic_file = write(&basic);
        let loaded =
            Config::load(&cli(&["--config", basic_file.0.to_str().unwrap()]), None).unwrap().alertmanager.unwrap();
        let expected = crate::http_client::Auth::Basic { user: "ringside".into(), password: "s3cr3t-am-token".into() };
        assert_eq!(loaded.auth, Some(expected));
        assert!(!format!("{loaded:?}").contains("s3cr3t"), "never printed");
        for (text, expected) in [
            (format!("{text}basic_auth_user = \"ringside\"\n"), "one way to authenticate"),
            ("[alertmanager]\nurl = \"http://127.0.0.1:9093\"\nbasic_auth_user = \"x\"\n".into(), "needs both"),
            (basic.replace("\"ringside\"", "\"a:b\""), "without ':'"),
        ] {
            let bad = write(&text);
            let message = Config::load(&cli(&["--config", bad.0.to_str().unwrap()]), None).unwrap_err().to_string();
            assert!(message.contains(expected), "{text}: {message}");
        }
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
        let message = Config::load(&cli(&["--config", am.0.to_str().unwrap()]), None).unwrap_err().to_string();
        assert!(message.contains("every user"), "{message}");
    }

    #[test]
    fn bad_values_are_named() {
        let message = |args: &[&str], env: Option<&str>| {
            Config::load(&cli(args), env.map(str::to_string)).unwrap_err().to_string()
        };
        assert!(message(&["--listen", "localhost"], None).contains("`listen`"));
        // Beyond loopback only with TLS (not yet) or an explicit, informed choice.
        let outside = message(&["--listen", "0.0.0.0:9650"], None);
        assert!(outside.contains("SSH tunnel") && outside.contains("--allow-plain-http"), "{outside}");
        let allowed = Config::load(&cli(&["--listen", "0.0.0.0:9650", "--allow-plain-http"]), None).unwrap();
        assert_eq!(allowed.listen.to_string(), "0.0.0.0:9650");
        assert!(Config::load(&cli(&["--listen", "[::1]:9650"]), None).is_ok(), "IPv6 loopback");
        assert!(message(&["--interval-ms", "5"], None).contains("interval_ms"));
        assert!(message(&[], Some("short")).contains("token"));
        assert!(message(&["--token-file", "/nonexistent/token"], None).contains("/nonexistent/token"));
        let unknown = write("intervl_ms = 5\n");
        let text = message(&["--config", unknown.0.to_str().unwrap()], None);
        assert!(text.contains("intervl_ms"), "{text}");
        let disordered = write("[thresholds]\ndrop_rate_warning = 0.5\ndrop_rate_error = 0.1\n");
        assert!(message(&["--config", disordered.0.to_str().unwrap()], None).contains("drop_rate"));
        let origin = write("allowed_origins = [\"console.example\"]\n");
        assert!(message(&["--config", origin.0.to_str().unwrap()], None).contains("allowed_origins"));
    }
}
