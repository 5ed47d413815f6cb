//! Helpers for the end-to-end tests: the real `ringsided` process on a free loopback port,
//! WebSocket and HTTP clients aimed at it.

pub mod browser;
pub mod fleet;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use futures_util::{SinkExt, StreamExt};
use ringside_shared::ServerMessage;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// The daemon binary: `RINGSIDED_BIN`, else the workspace's debug build (`cargo xtask test`
/// builds it with the console inside).
pub fn daemon_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("RINGSIDED_BIN") {
        return PathBuf::from(path);
    }
    let path = target_dir().join("debug/ringsided");
    assert!(path.exists(), "{} is missing: run the tests with `cargo xtask test`", path.display());
    path
}

/// `ml-workload`, the labelled training loop (workspace debug build; `cargo test --workspace`
/// builds it with the `ringside-workload` package).
pub fn workload_binary() -> PathBuf {
    let path = target_dir().join("debug/ml-workload");
    assert!(path.exists(), "{} is missing: run the tests with `cargo xtask test`", path.display());
    path
}

/// `ddp-rank`, a rank of a data-parallel job on the test doubles (workspace debug build, with
/// the `ringside-workload` package).
pub fn ddp_rank_binary() -> PathBuf {
    let path = target_dir().join("debug/ddp-rank");
    assert!(path.exists(), "{} is missing: run the tests with `cargo xtask test`", path.display());
    path
}

/// `hostile-process`, the test double of a local user attacking the daemon (workspace debug
/// build, with the `ringside-workload` package).
pub fn hostile_binary() -> PathBuf {
    let path = target_dir().join("debug/hostile-process");
    assert!(path.exists(), "{} is missing: run the tests with `cargo xtask test`", path.display());
    path
}

/// `cuda-calls`, which drives a CUDA driver library through the entry points
/// `cuGetProcAddress_v2` hands out (workspace debug build, with the `ringside-workload` package).
pub fn cuda_calls_binary() -> PathBuf {
    let path = target_dir().join("debug/cuda-calls");
    assert!(path.exists(), "{} is missing: run the tests with `cargo xtask test`", path.display());
    path
}

/// Where `cargo xtask setup --test` unpacked NVIDIA's own libraries: `lib/libcuda.so.1`,
/// `lib/libnvidia-ml.so.1` (Debian non-free) and `nccl/libnccl.so.2` (PyPI).
/// `RINGSIDE_NVIDIA_DIR`, else `<cache>/ringside/nvidia`.
pub fn nvidia_dir() -> PathBuf {
    let dir = std::env::var_os("RINGSIDE_NVIDIA_DIR").map(PathBuf::from).unwrap_or_else(|| {
        std::env::var_os("RINGSIDE_CACHE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                std::env::var_os("XDG_CACHE_HOME")
                    .map(PathBuf::from)
                    .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                    .unwrap_or_else(|| PathBuf::from("/var/cache"))
                    .join("ringside")
            })
            .join("nvidia")
    });
    assert!(
        dir.join("lib/libcuda.so.1").exists(),
        "NVIDIA's libraries are missing from {}: `cargo xtask setup --test` fetches them",
        dir.display()
    );
    dir
}

/// Waits for a process under test to create `path` (its sign that it is set up).
pub fn wait_for_file(path: &Path, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    while !path.exists() {
        anyhow::ensure!(Instant::now() < deadline, "{} did not appear within {limit:?}", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// A process started for a test, killed (with its children, which die with it) on drop.
pub struct Reaped(pub Child);

impl Reaped {
    /// Starts `command` and waits for it to create `ready` (10 s at most).
    pub fn start(command: &mut Command, ready: &Path) -> Result<Reaped> {
        let child = Reaped(command.stdout(Stdio::null()).spawn().context("start the test process")?);
        wait_for_file(ready, Duration::from_secs(30))?;
        Ok(child)
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The ML process `pid` in a snapshot's scheduler telemetry.
pub fn ml_process(snapshot: &serde_json::Value, pid: u32) -> Option<&serde_json::Value> {
    snapshot["scheduler"]["processes"].as_array()?.iter().find(|p| p["pid"] == pid)
}

/// A process's resident memory (KiB), from `/proc/<pid>/status`.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse().ok()
}

/// The nice value of a thread, from `/proc`.
pub fn nice_of(pid: u32, tid: u32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    stat.rsplit(')').next()?.split_whitespace().nth(16)?.parse().ok()
}

/// The workspace's target directory (`CARGO_TARGET_DIR` if set).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace_root().join("target"))
}

/// A running `ml-workload`, reaped with its DataLoader worker on drop.
pub struct Workload(pub Child);

impl Workload {
    /// Starts it with `phase_ms` phases for `cycles` cycles, its ground truth in
    /// `dir/truth.jsonl`, and waits until it is set up (`dir/ready`).
    pub fn start(dir: &Path, phase_ms: u64, cycles: u32) -> Result<Workload> {
        Workload::start_with(dir, phase_ms, cycles, &[])
    }

    /// [`Workload::start`] with more arguments (`--hang-ms`, `--data-weight`).
    pub fn start_with(dir: &Path, phase_ms: u64, cycles: u32, extra: &[&str]) -> Result<Workload> {
        let child = Command::new(workload_binary())
            .args(["--phase-ms", &phase_ms.to_string(), "--cycles", &cycles.to_string()])
            .args(extra)
            .arg("--log")
            .arg(dir.join("truth.jsonl"))
            .arg("--ready")
            .arg(dir.join("ready"))
            .stdout(Stdio::null())
            .spawn()
            .context("start ml-workload")?;
        let workload = Workload(child);
        wait_for_file(&dir.join("ready"), Duration::from_secs(10)).context("ml-workload did not get ready")?;
        Ok(workload)
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = Command::new("pkill").args(["-KILL", "-P", &self.0.id().to_string()]).status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Prometheus' own linter (`promtool check metrics`) on an exposition.
pub fn promtool_check(text: &str) -> Result<()> {
    use std::io::Write;
    let promtool = ["/usr/bin/promtool", "/usr/local/bin/promtool"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .context("promtool is missing: `cargo xtask setup --test` installs it (Debian package prometheus)")?;
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child.stdin.take().context("stdin")?.write_all(text.as_bytes())?;
    let output = child.wait_with_output()?;
    anyhow::ensure!(
        output.status.success(),
        "promtool check metrics failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// A scratch directory under the target dir, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(label: &str) -> Scratch {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ringside-test-{label}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub struct DaemonOptions {
    /// Sent as RINGSIDE_TOKEN; `None` lets the daemon generate one.
    pub token: Option<String>,
    pub interval_ms: u64,
    /// Extra TOML for the config file.
    pub config: String,
    /// `--listen`; port 0 picks a free port.
    pub listen: String,
    /// `--data-dir`; a fresh scratch directory when `None`. Reuse one to test a restart.
    pub data_dir: Option<PathBuf>,
    /// Contents of a `--token-file` (used instead of `token` when set).
    pub token_file: Option<String>,
    /// A command the daemon is started under (e.g. `setpriv` dropping privileges); its scratch
    /// directory is then made writable for everyone.
    pub wrapper: Vec<String>,
    /// Extra environment for the daemon (e.g. `LD_LIBRARY_PATH` to a test double).
    pub env: Vec<(String, String)>,
}

impl Default for DaemonOptions {
    fn default() -> Self {
        DaemonOptions {
            token: Some(random_token()),
            interval_ms: 200,
            config: String::new(),
            listen: "127.0.0.1:0".into(),
            data_dir: None,
            token_file: None,
            wrapper: Vec::new(),
            env: Vec::new(),
        }
    }
}

/// A config that raises a memory-pressure alert from the machine's real memory use: any
/// running machine uses more than 0.02 % of its memory.
pub const LOW_MEMORY_THRESHOLDS: &str =
    "[thresholds]\nmemory_used_pct_warning = 0.01\nmemory_used_pct_error = 0.02\nmemory_used_pct_critical = 100\n";

/// `text`, cut to at most `limit` bytes (at a character boundary) with how long it was.
pub fn clipped(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &text[..end], text.len())
}

/// What a failed wait on the snapshot shows: the scheduler's state and each listed process's
/// pid, name, role, phase, trust and identity, not every timeline span and thread.
fn scheduler_summary(snapshot: &serde_json::Value) -> String {
    let s = &snapshot["scheduler"];
    if s.is_null() {
        return "no scheduler telemetry".into();
    }
    let processes: Vec<String> = s["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            format!(
                "{} {} ({} of {}, {}, untrusted {}, identity {})",
                p["pid"], p["comm"], p["role"], p["job"], p["phase"], p["untrusted"], p["identity"]
            )
        })
        .collect();
    format!(
        "scheduler: mode {}, {} ML threads, lost {}; processes: [{}]",
        s["mode"],
        s["ml_tasks"],
        s["lost"],
        processes.join("; ")
    )
}

/// Writes a secret (a token file) readable by its owner only, as the daemon demands.
pub fn write_secret(path: &Path, contents: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    file.write_all(contents.as_bytes())?;
    Ok(())
}

/// The wall clock in Unix milliseconds, as the daemon reads it.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

pub fn random_token() -> String {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)).expect("read /dev/urandom");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Rules that each raise an alert from the machine's real memory use (any running machine uses
/// more than 0.001 % of its memory): `count` alerts named `r00`, `r01`, ...
pub fn memory_rules(count: usize, labels: &str) -> String {
    (0..count)
        .map(|i| {
            format!(
                "[[rules]]\nname = \"r{i:02}\"\nmetric = \"host.memory_used_pct\"\nop = \">\"\nthreshold = 0.001\nseverity = \"warning\"\nlabels = {{ {labels} }}\n\n"
            )
        })
        .collect()
}

/// A real Prometheus Alertmanager (Debian's `prometheus-alertmanager`) on a loopback port,
/// stopped on drop.
pub struct Alertmanager {
    child: Child,
    pub url: String,
    /// `Authorization` of every request the test makes, where it requires basic authentication.
    authorization: Option<String>,
    _scratch: Scratch,
}

/// A user Alertmanager's web config lets in with basic authentication: the password, and its
/// bcrypt hash as the web config wants it.
pub struct BasicUser<'a> {
    pub user: &'a str,
    pub password: &'a str,
    pub bcrypt: &'a str,
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Alertmanager {
    pub const BINARY: &'static str = "/usr/bin/prometheus-alertmanager";

    /// GET `path` (over TLS with `tls`): status and body.
    pub async fn get_with(&self, tls: Option<&tokio_rustls::TlsConnector>, path: &str) -> Result<(u16, String)> {
        let addr = self.url.split_once("://").map_or(self.url.as_str(), |(_, a)| a);
        match tls {
            Some(connector) => {
                let authorization =
                    self.authorization.as_ref().map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
                let request =
                    format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{authorization}Connection: close\r\n\r\n");
                let response = https(connector, addr, &request).await?;
                let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
                let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
                Ok((status, body))
            }
            None => {
                let mut request = reqwest::Client::new().get(format!("{}{path}", self.url));
                if let Some(authorization) = &self.authorization {
                    request = request.header("Authorization", authorization);
                }
                let response = request.send().await?;
                Ok((response.status().as_u16(), response.text().await?))
            }
        }
    }

    /// Starts one with `config` (its YAML) and waits until it is ready (30 s at most).
    pub async fn start(config: &str) -> Result<Alertmanager> {
        Alertmanager::start_with(config, None, None).await
    }

    /// [`Alertmanager::start`], serving HTTPS with `tls` (certificate, key) when given, and
    /// letting in only `basic` when given.
    pub async fn start_with(
        config: &str,
        tls: Option<(&Path, &Path)>,
        basic: Option<BasicUser<'_>>,
    ) -> Result<Alertmanager> {
        anyhow::ensure!(
            Path::new(Self::BINARY).exists(),
            "{} is missing: `cargo xtask setup --test` installs prometheus-alertmanager",
            Self::BINARY
        );
        let scratch = Scratch::new("alertmanager");
        let file = scratch.0.join("alertmanager.yml");
        std::fs::write(&file, config)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut command = Command::new(Self::BINARY);
        let mut web = String::new();
        if let Some((cert, key)) = tls {
            web += &format!("tls_server_config:\n  cert_file: {}\n  key_file: {}\n", cert.display(), key.display());
        }
        if let Some(basic) = &basic {
            web += &format!("basic_auth_users:\n  {}: {:?}\n", basic.user, basic.bcrypt);
        }
        if !web.is_empty() {
            let file = scratch.0.join("web.yml");
            std::fs::write(&file, web)?;
            command.arg(format!("--web.config.file={}", file.display()));
        }
        let authorization = basic.map(|b| {
            use base64::Engine;
            format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", b.user, b.password)))
        });
        let child = command
            .arg(format!("--config.file={}", file.display()))
            .arg(format!("--storage.path={}", scratch.0.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--cluster.listen-address=")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start prometheus-alertmanager")?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let manager =
            Alertmanager { child, url: format!("{scheme}://127.0.0.1:{port}"), authorization, _scratch: scratch };
        let connector = tls.map(|(cert, _)| tls_connector(Some(cert))).transpose()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if manager.get_with(connector.as_ref(), "/-/ready").await.is_ok_and(|(status, _)| status == 200) {
                return Ok(manager);
            }
            if Instant::now() > deadline {
                bail!("Alertmanager did not become ready within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// A self-signed certificate for 127.0.0.1 and its key (mode 0600), made with `openssl`.
pub fn certificate(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let out = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
        .args(["-subj", "/CN=ringside-test", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"])
        // A server certificate, not a CA (a CA's certificate is refused as a server's).
        .args(["-addext", "basicConstraints=critical,CA:FALSE", "-addext", "extendedKeyUsage=serverAuth"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .context("openssl is missing: `cargo xtask setup --test` installs it")?;
    ensure!(out.status.success(), "openssl: {}", String::from_utf8_lossy(&out.stderr));
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
    Ok((cert, key))
}

/// A rustls client trusting `cert` only (or nothing, when `None`).
pub fn tls_connector(cert: Option<&Path>) -> Result<tokio_rustls::TlsConnector> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    if let Some(cert) = cert {
        for der in rustls::pki_types::CertificateDer::pem_file_iter(cert)? {
            roots.add(der?)?;
        }
    }
    #[allow(deprecated)]
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)))
}

/// One HTTPS request (`Connection: close`); the whole response as text.
pub async fn https(connector: &tokio_rustls::TlsConnector, addr: &str, request: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let mut tls = connector.connect(rustls::pki_types::ServerName::try_from("127.0.0.1")?.to_owned(), tcp).await?;
    tls.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    tls.read_to_end(&mut response).await?;
    Ok(String::from_utf8_lossy(&response).into_owned())
}

/// The environment that makes a daemon load the NVML test double (`tests/doubles/
/// nvml_test_double.c`, built by this crate's build script) in place of `libnvidia-ml.so.1`,
/// driven by the control file `control`.
pub fn nvml_double(control: &Path) -> Vec<(String, String)> {
    vec![
        ("LD_LIBRARY_PATH".into(), env!("RINGSIDE_NVML_DOUBLE_DIR").into()),
        ("RINGSIDE_NVML_DOUBLE".into(), control.display().to_string()),
    ]
}

/// The alert with `source` in an `/api/alerts` list (null if there is none).
pub fn alert(alerts: &serde_json::Value, source: &str) -> serde_json::Value {
    alerts.as_array().and_then(|a| a.iter().find(|a| a["source"] == source).cloned()).unwrap_or_default()
}

/// Component `name` in a snapshot's or `/healthz`'s `components` (null if there is none).
pub fn component(value: &serde_json::Value, name: &str) -> serde_json::Value {
    value["components"].as_array().and_then(|c| c.iter().find(|c| c["name"] == name).cloned()).unwrap_or_default()
}

/// A running `ringsided`; stopped (SIGTERM, then SIGKILL) on drop.
pub struct Daemon {
    child: Child,
    pub base: String,
    pub addr: String,
    pub token: String,
    /// The console URL printed at start-up.
    pub console_url: String,
    data_dir: PathBuf,
    _scratch: Scratch,
}

impl Daemon {
    pub fn start(options: DaemonOptions) -> Result<Daemon> {
        let scratch = Scratch::new("daemon");
        let config = scratch.0.join("ringside.toml");
        std::fs::write(&config, &options.config)?;
        let mut command = match options.wrapper.split_first() {
            Some((program, args)) => {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&scratch.0, std::fs::Permissions::from_mode(0o777))?;
                let mut command = Command::new(program);
                command.args(args).arg(daemon_binary());
                command
            }
            None => Command::new(daemon_binary()),
        };
        let data_dir = options.data_dir.clone().unwrap_or_else(|| scratch.0.join("data"));
        command
            .args(["--listen", &options.listen, "--interval-ms", &options.interval_ms.to_string()])
            .arg("--config")
            .arg(&config)
            .arg("--data-dir")
            .arg(&data_dir)
            .env_remove("RINGSIDE_TOKEN")
            .env("RINGSIDE_LOG", std::env::var("RINGSIDE_TEST_LOG").unwrap_or_else(|_| "error".into()))
            .envs(options.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        match (&options.token_file, &options.token) {
            (Some(contents), _) => {
                let path = scratch.0.join("tokens");
                write_secret(&path, contents)?;
                command.arg("--token-file").arg(path);
            }
            (None, Some(token)) => {
                command.env("RINGSIDE_TOKEN", token);
            }
            (None, None) => {}
        }
        let mut child = command.spawn().with_context(|| format!("cannot start {}", daemon_binary().display()))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut base = None;
        let mut console_url = None;
        let deadline = Instant::now() + Duration::from_secs(20);
        while base.is_none() || console_url.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match rx.recv_timeout(left) {
                Ok(line) => line,
                Err(_) => {
                    let _ = child.kill();
                    bail!("ringsided did not print its address within 20 s (exit: {:?})", child.try_wait());
                }
            };
            if let Some(url) = line.strip_prefix("ringsided listening on ") {
                base = Some(url.trim().to_string());
            }
            if let Some(url) = line.strip_prefix("console: ") {
                console_url = Some(url.trim().to_string());
            }
        }
        let base = base.unwrap_or_default();
        let console_url = console_url.unwrap_or_default();
        let token = match (options.token_file, options.token) {
            (Some(_), token) => token.unwrap_or_default(),
            (None, Some(token)) => token,
            (None, None) => {
                console_url.split_once("?token=").map(|(_, t)| t.to_string()).context("no token in console URL")?
            }
        };
        let addr = base.split_once("://").map_or(base.as_str(), |(_, a)| a).to_string();
        Ok(Daemon { child, base, addr, token, console_url, data_dir, _scratch: scratch })
    }

    /// Its data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: no chance to flush or clean up.
    pub fn kill_hard(&mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> Result<std::process::ExitStatus> {
        self.stop_with("TERM")
    }

    /// Sends SIG`signal` (`TERM`, `INT`) and waits for the exit status.
    pub fn stop_with(&mut self, signal: &str) -> Result<std::process::ExitStatus> {
        let status = Command::new("kill").args([&format!("-{signal}"), &self.child.id().to_string()]).status()?;
        if !status.success() {
            bail!("kill -{signal} failed");
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!("ringsided did not stop within 10 s of SIG{signal}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn http(&self) -> reqwest::Client {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(10))
            .build()
            .expect("HTTP client")
    }

    /// GET with the bearer token.
    /// A console session, as a browser gets it on its first visit: the `name=value` pair of
    /// the cookie the daemon sets for `/?token=`.
    pub async fn session_cookie(&self) -> Result<String> {
        let landing = self.http().get(format!("{}/?token={}", self.base, self.token)).send().await?;
        let set = landing.headers().get("set-cookie").context("the first visit sets no cookie")?.to_str()?;
        Ok(set.split(';').next().unwrap_or_default().to_string())
    }

    pub async fn get(&self, path: &str) -> Result<reqwest::Response> {
        Ok(self.http().get(format!("{}{path}", self.base)).bearer_auth(&self.token).send().await?)
    }

    /// The path of the console's second module (the panels below the first screen), named by its
    /// content where `__wasm_split.js` asks for it: `/pkg/split_below.<hash>.wasm`.
    pub async fn second_module(&self) -> Result<String> {
        let script = self.get("/pkg/__wasm_split.js").await?.error_for_status()?.text().await?;
        let start = script.find("\"./split_below.").context("__wasm_split.js asks for no split_below module")?;
        let name = &script[start + 3..];
        let end = name.find(".wasm\"").context("an unterminated module name in __wasm_split.js")?;
        Ok(format!("/pkg/{}.wasm", &name[..end]))
    }

    /// POST `/api/alerts/{id}/ack` with `token` and a JSON body.
    pub async fn ack_as(&self, token: &str, id: u64, body: serde_json::Value) -> Result<reqwest::Response> {
        Ok(self.http().post(format!("{}/api/alerts/{id}/ack", self.base)).bearer_auth(token).json(&body).send().await?)
    }

    /// Polls `/api/snapshot` until `ready` says so, within `secs`.
    pub async fn wait_for(
        &self,
        what: &str,
        secs: u64,
        ready: impl Fn(&serde_json::Value) -> bool,
    ) -> Result<serde_json::Value> {
        self.poll("/api/snapshot", what, secs, ready, scheduler_summary).await
    }

    /// Polls `/api/alerts` until `ready` accepts the list, within `secs`.
    pub async fn alerts_when(
        &self,
        what: &str,
        secs: u64,
        ready: impl Fn(&serde_json::Value) -> bool,
    ) -> Result<serde_json::Value> {
        self.poll("/api/alerts", what, secs, ready, |a| a.to_string()).await
    }

    /// Polls the JSON at `path` until `ready` accepts it, within `secs`.
    pub async fn json_when(
        &self,
        path: &str,
        what: &str,
        secs: u64,
        ready: impl Fn(&serde_json::Value) -> bool,
    ) -> Result<serde_json::Value> {
        self.poll(path, what, secs, ready, |v| v.to_string()).await
    }

    /// Polls the text at `path` until `ready` accepts it, within `secs`.
    pub async fn poll_text(&self, path: &str, what: &str, secs: u64, ready: impl Fn(&str) -> bool) -> Result<String> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let text = self.get(path).await?.text().await?;
            if ready(&text) {
                return Ok(text);
            }
            if Instant::now() >= deadline {
                bail!("{what}: not within {secs} s; last answer:\n{text}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Polls the snapshot until component `name` has `status`, within `secs`.
    pub async fn component_when(&self, name: &str, status: &str, secs: u64) -> Result<serde_json::Value> {
        let what = format!("component {name} {status}");
        self.poll(
            "/api/snapshot",
            &what,
            secs,
            |s| component(s, name)["status"] == status,
            |s| component(s, name).to_string(),
        )
        .await
    }

    /// Polls the JSON at `path` every 100 ms until `ready` accepts it; past `secs`, an error
    /// naming `what` with `shown` of the last answer.
    async fn poll(
        &self,
        path: &str,
        what: &str,
        secs: u64,
        ready: impl Fn(&serde_json::Value) -> bool,
        shown: impl Fn(&serde_json::Value) -> String,
    ) -> Result<serde_json::Value> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let value = self.get_json(path).await?;
            if ready(&value) {
                return Ok(value);
            }
            if Instant::now() > deadline {
                bail!("{what} not within {secs} s; {}", clipped(&shown(&value), 4096));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `/healthz` with the token (its details need it), whether it answers 200 (ok) or 503
    /// (degraded or down).
    pub async fn health(&self) -> Result<serde_json::Value> {
        let response = self.get("/healthz").await?;
        let status = response.status().as_u16();
        let body: serde_json::Value = response.json().await?;
        let word = body["status"].as_str().unwrap_or_default().to_string();
        anyhow::ensure!((status == 200) == (word == "ok"), "/healthz answered {status} for {word:?}");
        Ok(body)
    }

    pub async fn get_json(&self, path: &str) -> Result<serde_json::Value> {
        let response = self.get(path).await?;
        let status = response.status();
        let text = response.text().await?;
        if !status.is_success() {
            bail!("GET {path}: {status}: {text}");
        }
        Ok(serde_json::from_str(&text)?)
    }

    /// A WebSocket with the bearer token and, optionally, an `Origin`.
    pub async fn ws(&self, origin: Option<&str>) -> Result<Client> {
        self.ws_with(Some(&self.token), origin).await
    }

    pub async fn ws_with(&self, token: Option<&str>, origin: Option<&str>) -> Result<Client> {
        let mut request = format!("ws://{}/ws", self.addr).into_client_request()?;
        if let Some(token) = token {
            request.headers_mut().insert("authorization", HeaderValue::from_str(&format!("Bearer {token}"))?);
        }
        if let Some(origin) = origin {
            request.headers_mut().insert("origin", HeaderValue::from_str(origin)?);
        }
        let (socket, _) = tokio_tungstenite::connect_async(request).await?;
        Ok(Client { socket })
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub struct Client {
    pub socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

impl Client {
    pub async fn send_text(&mut self, text: &str) -> Result<()> {
        self.socket.send(Message::Text(text.into())).await?;
        Ok(())
    }

    pub async fn send_json(&mut self, value: serde_json::Value) -> Result<()> {
        self.send_text(&value.to_string()).await
    }

    /// The next server message, within `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> Result<ServerMessage> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let frame = tokio::time::timeout_at(deadline, self.socket.next())
                .await
                .context("no message in time")?
                .context("connection closed")??;
            match frame {
                Message::Text(text) => {
                    return serde_json::from_str(text.as_str()).with_context(|| format!("not a server message: {text}"))
                }
                Message::Close(frame) => bail!("server closed the connection: {frame:?}"),
                _ => continue,
            }
        }
    }

    /// Skips messages until `pick` returns something, within `timeout`.
    pub async fn wait_for<T>(
        &mut self,
        timeout: Duration,
        mut pick: impl FnMut(&ServerMessage) -> Option<T>,
    ) -> Result<T> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("the awaited message did not come within {timeout:?}");
            }
            let message = self.next(left).await?;
            if let Some(found) = pick(&message) {
                return Ok(found);
            }
        }
    }
}
