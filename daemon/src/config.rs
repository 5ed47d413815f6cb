//! Configuration: command-line flags over environment over the TOML file over defaults, checked
//! once at start-up so a wrong value stops the daemon with a message that names it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::Parser;
use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    ReadFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid `{key}` = {value}: {why}")]
    Invalid {
        key: &'static str,
        value: String,
        why: String,
    },
    #[error("cannot read token file {path}: {source}")]
    TokenFile {
        path: PathBuf,
        source: std::io::Error,
    },
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
    /// Directory for the daemon's state [default: /var/lib/ringside as root, else ~/.local/state/ringside].
    #[arg(long, env = "RINGSIDE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Collection interval in milliseconds [default: 1000].
    #[arg(long, env = "RINGSIDE_INTERVAL_MS")]
    pub interval_ms: Option<u64>,
    /// File holding the access token (first line). Env RINGSIDE_TOKEN gives the token itself.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
}

/// The `[thresholds]` table: when alerts are raised.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Thresholds {
    /// Drop rate (0-1) over the window for warning, error and critical.
    pub drop_rate_warning: f64,
    pub drop_rate_error: f64,
    pub drop_rate_critical: f64,
    /// Mean latency over the window for a warning; error and critical are multiples of it.
    pub latency_warning_ms: f64,
    pub latency_error_factor: f64,
    pub latency_critical_factor: f64,
    /// Queue depth as a share of capacity (0-1) that raises `queue_near_full`.
    pub queue_full_ratio: f64,
    /// Memory in use (total - available), in percent, for warning, error and critical.
    pub memory_used_pct_warning: f64,
    pub memory_used_pct_error: f64,
    pub memory_used_pct_critical: f64,
    /// `/proc/pressure/memory` "some avg10" (percent) that raises a memory-pressure warning.
    pub memory_stall_pct_warning: f64,
    /// Consecutive clear ticks before a standing alert is resolved.
    pub clear_after_ticks: u32,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            drop_rate_warning: 0.01,
            drop_rate_error: 0.05,
            drop_rate_critical: 0.10,
            latency_warning_ms: 10.0,
            latency_error_factor: 5.0,
            latency_critical_factor: 10.0,
            queue_full_ratio: 0.9,
            memory_used_pct_warning: 90.0,
            memory_used_pct_error: 95.0,
            memory_used_pct_critical: 98.0,
            memory_stall_pct_warning: 10.0,
            clear_after_ticks: 3,
        }
    }
}

/// The config file's shape. Every key is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct FileConfig {
    listen: Option<String>,
    data_dir: Option<PathBuf>,
    interval_ms: Option<u64>,
    token_file: Option<PathBuf>,
    history_len: Option<usize>,
    window_ms: Option<u64>,
    allowed_origins: Vec<String>,
    thresholds: Thresholds,
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
    pub token: String,
    pub token_origin: TokenOrigin,
}

pub const DEFAULT_LISTEN: &str = "127.0.0.1:9650";
pub const MIN_TOKEN_LEN: usize = 16;

impl Config {
    /// Builds the configuration from flags, the environment (`RINGSIDE_TOKEN` and the flags'
    /// variables, already folded into `cli` by clap) and the file named by `--config`.
    pub fn load(cli: &Cli, env_token: Option<String>) -> Result<Config, ConfigError> {
        let file = match &cli.config {
            Some(path) => read_file_config(path)?,
            None => FileConfig::default(),
        };
        let listen_text = cli
            .listen
            .clone()
            .or(file.listen)
            .unwrap_or_else(|| DEFAULT_LISTEN.to_string());
        let listen: SocketAddr = listen_text.parse().map_err(|e| ConfigError::Invalid {
            key: "listen",
            value: format!("{listen_text:?}"),
            why: format!("{e}; expected IP:PORT such as {DEFAULT_LISTEN}"),
        })?;
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
        for origin in &file.allowed_origins {
            if !(origin.starts_with("http://") || origin.starts_with("https://"))
                || origin.ends_with('/')
            {
                return Err(ConfigError::Invalid {
                    key: "allowed_origins",
                    value: format!("{origin:?}"),
                    why: "an origin is scheme://host[:port] with no path, e.g. https://console.example".into(),
                });
            }
        }
        check_thresholds(&file.thresholds)?;
        let data_dir = cli
            .data_dir
            .clone()
            .or(file.data_dir)
            .unwrap_or_else(default_data_dir);
        let token_file = cli.token_file.clone().or(file.token_file);
        let (token, token_origin) = match (env_token.filter(|t| !t.is_empty()), token_file) {
            (Some(token), _) => (token, TokenOrigin::Environment),
            (None, Some(path)) => (read_token_file(&path)?, TokenOrigin::File),
            (None, None) => (generate_token()?, TokenOrigin::Generated),
        };
        check_token(&token)?;
        Ok(Config {
            listen,
            data_dir,
            interval_ms,
            history_len,
            window_ms,
            allowed_origins: file.allowed_origins,
            thresholds: file.thresholds,
            token,
            token_origin,
        })
    }
}

fn read_file_config(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
        path: path.into(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.into(),
        message: e.to_string(),
    })
}

fn check_range(key: &'static str, value: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::Invalid {
            key,
            value: value.to_string(),
            why: format!("must be between {min} and {max}"),
        })
    }
}

fn check_thresholds(t: &Thresholds) -> Result<(), ConfigError> {
    let ordered = |key: &'static str, values: [f64; 3], max: f64| {
        let ok = values
            .iter()
            .all(|v| v.is_finite() && *v > 0.0 && *v <= max)
            && values[0] <= values[1]
            && values[1] <= values[2];
        if ok {
            Ok(())
        } else {
            Err(ConfigError::Invalid {
                key,
                value: format!("{values:?}"),
                why: format!("warning <= error <= critical, each in (0, {max}]"),
            })
        }
    };
    ordered(
        "thresholds.drop_rate_*",
        [t.drop_rate_warning, t.drop_rate_error, t.drop_rate_critical],
        1.0,
    )?;
    ordered(
        "thresholds.memory_used_pct_*",
        [
            t.memory_used_pct_warning,
            t.memory_used_pct_error,
            t.memory_used_pct_critical,
        ],
        100.0,
    )?;
    ordered(
        "thresholds.latency_*",
        [
            t.latency_warning_ms,
            t.latency_warning_ms * t.latency_error_factor,
            t.latency_warning_ms * t.latency_critical_factor,
        ],
        f64::MAX,
    )?;
    if !(t.latency_error_factor >= 1.0 && t.latency_critical_factor >= t.latency_error_factor) {
        return Err(ConfigError::Invalid {
            key: "thresholds.latency_*_factor",
            value: format!("{} / {}", t.latency_error_factor, t.latency_critical_factor),
            why: "need 1 <= error factor <= critical factor".into(),
        });
    }
    if !(t.queue_full_ratio > 0.0 && t.queue_full_ratio <= 1.0) {
        return Err(ConfigError::Invalid {
            key: "thresholds.queue_full_ratio",
            value: t.queue_full_ratio.to_string(),
            why: "must be in (0, 1]".into(),
        });
    }
    if !(t.memory_stall_pct_warning > 0.0 && t.memory_stall_pct_warning <= 100.0) {
        return Err(ConfigError::Invalid {
            key: "thresholds.memory_stall_pct_warning",
            value: t.memory_stall_pct_warning.to_string(),
            why: "must be in (0, 100]".into(),
        });
    }
    check_range(
        "thresholds.clear_after_ticks",
        u64::from(t.clear_after_ticks),
        1,
        1000,
    )
}

fn default_data_dir() -> PathBuf {
    let is_root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    if is_root {
        return PathBuf::from("/var/lib/ringside");
    }
    match std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        Some(state) => PathBuf::from(state).join("ringside"),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| ".".into()))
            .join(".local/state/ringside"),
    }
}

fn read_token_file(path: &Path) -> Result<String, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::TokenFile {
        path: path.into(),
        source,
    })?;
    Ok(text.lines().next().unwrap_or("").trim().to_string())
}

fn check_token(token: &str) -> Result<(), ConfigError> {
    if token.len() < MIN_TOKEN_LEN
        || !token.bytes().all(|b| b.is_ascii_graphic())
        || token.contains([';', ',', '"', '\\'])
    {
        return Err(ConfigError::Invalid {
            key: "token",
            value: "(hidden)".into(),
            why: format!(
                "a token needs at least {MIN_TOKEN_LEN} printable ASCII characters without spaces, quotes, ';', ',' or '\\'"
            ),
        });
    }
    Ok(())
}

/// 32 random bytes from the kernel, hex-encoded.
fn generate_token() -> Result<String, ConfigError> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(ConfigError::Random)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("ringsided").chain(args.iter().copied()))
            .expect("flags parse")
    }

    fn write(text: &str) -> tempfile_path::TempPath {
        tempfile_path::TempPath::with(text)
    }

    /// A file under the target temp dir, removed on drop.
    mod tempfile_path {
        pub struct TempPath(pub std::path::PathBuf);
        impl TempPath {
            pub fn with(text: &str) -> Self {
                use std::sync::atomic::{AtomicU32, Ordering};
                static N: AtomicU32 = AtomicU32::new(0);
                let path = std::env::temp_dir().join(format!(
                    "ringside-config-test-{}-{}.toml",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::write(&path, text).expect("write temp file");
                TempPath(path)
            }
        }
        impl Drop for TempPath {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }

    #[test]
    fn defaults_are_safe() {
        let config = Config::load(&cli(&[]), None).unwrap();
        assert_eq!(config.listen.to_string(), DEFAULT_LISTEN);
        assert!(config.listen.ip().is_loopback());
        assert_eq!(config.interval_ms, 1000);
        assert_eq!(config.token_origin, TokenOrigin::Generated);
        assert_eq!(config.token.len(), 64);
        assert_ne!(
            config.token,
            Config::load(&cli(&[]), None).unwrap().token,
            "tokens are random"
        );
        assert_eq!(config.thresholds, Thresholds::default());
    }

    #[test]
    fn flags_override_file_and_env_token_wins() {
        let file = write("listen = \"127.0.0.1:1000\"\ninterval_ms = 500\n[thresholds]\ndrop_rate_warning = 0.02\n");
        let path = file.0.to_str().unwrap();
        let config = Config::load(
            &cli(&["--config", path, "--listen", "127.0.0.1:2000"]),
            Some("a-token-from-the-env".into()),
        )
        .unwrap();
        assert_eq!(config.listen.port(), 2000);
        assert_eq!(config.interval_ms, 500);
        assert_eq!(config.thresholds.drop_rate_warning, 0.02);
        assert_eq!(config.thresholds.drop_rate_error, 0.05);
        assert_eq!(config.token, "a-token-from-the-env");
        assert_eq!(config.token_origin, TokenOrigin::Environment);
    }

    #[test]
    fn token_file_is_read() {
        let token = write("0123456789abcdef0123\n");
        let config =
            Config::load(&cli(&["--token-file", token.0.to_str().unwrap()]), None).unwrap();
        assert_eq!(config.token, "0123456789abcdef0123");
        assert_eq!(config.token_origin, TokenOrigin::File);
    }

    #[test]
    fn bad_values_are_named() {
        let message = |args: &[&str], env: Option<&str>| {
            Config::load(&cli(args), env.map(str::to_string))
                .unwrap_err()
                .to_string()
        };
        assert!(message(&["--listen", "localhost"], None).contains("`listen`"));
        assert!(message(&["--interval-ms", "5"], None).contains("interval_ms"));
        assert!(message(&[], Some("short")).contains("token"));
        assert!(
            message(&["--token-file", "/nonexistent/token"], None).contains("/nonexistent/token")
        );
        let unknown = write("intervl_ms = 5\n");
        let text = message(&["--config", unknown.0.to_str().unwrap()], None);
        assert!(text.contains("intervl_ms"), "{text}");
        let disordered = write("[thresholds]\ndrop_rate_warning = 0.5\ndrop_rate_error = 0.1\n");
        assert!(message(&["--config", disordered.0.to_str().unwrap()], None).contains("drop_rate"));
        let origin = write("allowed_origins = [\"console.example\"]\n");
        assert!(
            message(&["--config", origin.0.to_str().unwrap()], None).contains("allowed_origins")
        );
    }
}
