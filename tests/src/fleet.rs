//! What the fleet tests share: cgroups made in the node's real cgroup2 hierarchy, and a real
//! Prometheus (Debian's) scraping daemons.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use crate::Scratch;

/// Where the cgroup2 hierarchy is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` in a
/// hybrid layout), from `/proc/mounts`.
pub fn cgroup2_root() -> Result<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts")?;
    mounts
        .lines()
        .find_map(|l| {
            let mut f = l.split_whitespace();
            let (_, at, kind) = (f.next()?, f.next()?, f.next()?);
            (kind == "cgroup2").then(|| PathBuf::from(at))
        })
        .context("no cgroup2 hierarchy is mounted")
}

/// Cgroups made for a test under one base (`<cgroup2>/<base>`), removed deepest first when it
/// ends (each is empty once its processes are gone).
pub struct Cgroups {
    pub base: PathBuf,
    made: Vec<PathBuf>,
}

impl Cgroups {
    /// A base named `label-<test pid>` at the top of the cgroup2 hierarchy.
    pub fn new(label: &str) -> Result<Cgroups> {
        Ok(Cgroups { base: cgroup2_root()?.join(format!("{label}-{}", std::process::id())), made: Vec::new() })
    }

    /// `relative` under the base, made with its parents.
    pub fn make(&mut self, relative: &str) -> Result<PathBuf> {
        let path = self.base.join(relative);
        std::fs::create_dir_all(&path).with_context(|| format!("mkdir {}", path.display()))?;
        self.made.push(path.clone());
        Ok(path)
    }

    /// The path a process in `cgroup` shows in `/proc/<pid>/cgroup` (relative to the root).
    pub fn path_of(&self, cgroup: &Path) -> Result<String> {
        let relative = cgroup.strip_prefix(cgroup2_root()?)?;
        Ok(format!("/{}", String::from_utf8_lossy(relative.as_os_str().as_bytes())))
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        for path in self.made.iter().rev() {
            let mut at = path.clone();
            while at.starts_with(&self.base) {
                let _ = std::fs::remove_dir(&at);
                if !at.pop() {
                    break;
                }
            }
        }
    }
}

/// Two daemons on this machine standing for two nodes, node-a and node-b: each watches its own
/// cgroup (`[scheduler.watch]`), where the ranks of each "node" are started.
pub struct TwoNodes {
    pub a: crate::Daemon,
    pub b: crate::Daemon,
    pub cgroup_a: PathBuf,
    pub cgroup_b: PathBuf,
    pub token: String,
    _cgroups: Cgroups,
}

impl TwoNodes {
    /// Cgroups under `<cgroup2>/<label>-<pid>`, and the daemons (`ringsided`, or
    /// `RINGSIDED_BIN`) collecting every `interval_ms`.
    pub fn start(label: &str, interval_ms: u64) -> Result<TwoNodes> {
        let mut cgroups = Cgroups::new(label)?;
        let (cgroup_a, cgroup_b) = (cgroups.make("node-a")?, cgroups.make("node-b")?);
        let token = crate::random_token();
        let node = |cgroup: &Path| -> Result<crate::Daemon> {
            crate::Daemon::start(crate::DaemonOptions {
                token: Some(token.clone()),
                interval_ms,
                config: format!(
                    "[scheduler]\nwindow_ms = 100\nscan_interval_ms = 200\n[scheduler.watch]\ncgroups = [\"{}\"]\n",
                    cgroups.path_of(cgroup)?
                ),
                ..crate::DaemonOptions::default()
            })
        };
        let (a, b) = (node(&cgroup_a)?, node(&cgroup_b)?);
        Ok(TwoNodes { a, b, cgroup_a, cgroup_b, token, _cgroups: cgroups })
    }
}

/// A Grafana dashboard in `deploy/grafana`, and the metric its variable `name` lists the
/// values of (`label_values(METRIC, label)`).
pub fn dashboard(file: &str, variable: &str) -> Result<(serde_json::Value, String)> {
    let path = crate::workspace_root().join("deploy/grafana").join(file);
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    let definition = dashboard["templating"]["list"]
        .as_array()
        .and_then(|l| l.iter().find(|v| v["name"] == variable))
        .and_then(|v| v["definition"].as_str())
        .with_context(|| format!("the {variable} variable of {file}"))?;
    let metric = definition.trim_start_matches("label_values(").split(',').next().unwrap_or_default().to_string();
    Ok((dashboard, metric))
}

/// A command run by `sh` after moving itself into `cgroup` (through `cgroup.procs`, before it
/// execs, so the program is in the cgroup from its first instruction).
pub fn in_cgroup(cgroup: &Path, program: &Path, args: &[String]) -> Command {
    let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
    let script =
        format!("echo $$ > '{}/cgroup.procs' && exec '{}' {}", cgroup.display(), program.display(), quoted.join(" "));
    let mut command = Command::new("sh");
    command.args(["-c", &script]).stdout(Stdio::null());
    command
}

/// One rank of a torchrun-style job (`TORCHELASTIC_RUN_ID`, `RANK`, `WORLD_SIZE`), a
/// `ddp-rank` in `cgroup` meeting the job's other ranks at `barrier`, with `extra` arguments;
/// returned once it is set up (its ready file in `dir`).
pub struct Rank<'a> {
    pub cgroup: &'a Path,
    pub run_id: &'a str,
    pub rank: u32,
    pub world: u32,
    pub barrier: &'a Path,
    pub dir: &'a Path,
}

impl Rank<'_> {
    pub fn start(&self, extra: &[String]) -> Result<crate::Reaped> {
        let ready = self.dir.join(format!("ready-{}-{}", self.run_id, self.rank));
        let mut args: Vec<String> = vec![
            "--rank".into(),
            self.rank.to_string(),
            "--world".into(),
            self.world.to_string(),
            "--barrier".into(),
            self.barrier.display().to_string(),
            "--ready".into(),
            ready.display().to_string(),
        ];
        args.extend(extra.iter().cloned());
        let mut command = in_cgroup(self.cgroup, &crate::ddp_rank_binary(), &args);
        command
            .env("TORCHELASTIC_RUN_ID", self.run_id)
            .env("RANK", self.rank.to_string())
            .env("WORLD_SIZE", self.world.to_string());
        crate::Reaped::start(&mut command, &ready).with_context(|| format!("rank {} of {}", self.rank, self.run_id))
    }
}

/// A real Prometheus scraping `targets` (with `token` as the bearer token) every second and
/// evaluating `rules` every second, stopped on drop.
pub struct Prometheus {
    child: Child,
    pub base: String,
    http: reqwest::Client,
    _scratch: Scratch,
}

impl Prometheus {
    pub fn start(rules: &str, targets: &[&str], token: &str, alertmanager: Option<&str>) -> Result<Prometheus> {
        let scratch = Scratch::new("prometheus");
        let credentials = scratch.0.join("token");
        crate::write_secret(&credentials, token)?;
        let rules_file = scratch.0.join("ringside.rules.yml");
        std::fs::write(&rules_file, rules)?;
        let alerting = alertmanager
            .map(|a| format!("alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['{a}']\n"))
            .unwrap_or_default();
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let config = scratch.0.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n{alerting}scrape_configs:\n  - job_name: ringside\n    authorization:\n      type: Bearer\n      credentials_file: {}\n    static_configs:\n      - targets: [{}]\n",
                rules_file.display(),
                credentials.display(),
                targets.join(", ")
            ),
        )?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new("/usr/bin/prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", scratch.0.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("/usr/bin/prometheus (Debian package prometheus; `cargo xtask setup --test`)")?;
        Ok(Prometheus {
            child,
            base: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
            _scratch: scratch,
        })
    }

    /// The series `promql` returns now; an expression Prometheus cannot run is an error.
    pub async fn query(&self, promql: &str) -> Result<Vec<serde_json::Value>> {
        let body: serde_json::Value = self
            .http
            .get(format!("{}/api/v1/query", self.base))
            .query(&[("query", promql)])
            .send()
            .await?
            .json()
            .await?;
        ensure!(body["status"] == "success", "{promql}: {body}");
        Ok(body["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// Every rule of every group, as `/api/v1/rules` lists them.
    pub async fn rules(&self) -> Result<Vec<serde_json::Value>> {
        let body: serde_json::Value = self.http.get(format!("{}/api/v1/rules", self.base)).send().await?.json().await?;
        Ok(body["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect())
    }

    /// Polls `promql` until `done` says its series are what is waited for, at most `secs`.
    pub async fn wait_for(
        &self,
        what: &str,
        secs: u64,
        promql: &str,
        done: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Result<Vec<serde_json::Value>> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let series = self.query(promql).await.unwrap_or_default();
            if done(&series) {
                return Ok(series);
            }
            ensure!(Instant::now() < deadline, "{what} within {secs} s: {promql} gave {series:?}");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
