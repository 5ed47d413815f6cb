//! Who a job is, read from real cgroup v2 paths (a Slurm and a systemd-layout kubepods tree,
//! made in the node's cgroup2 hierarchy, the processes moved in through `cgroup.procs` before
//! they exec) and from their environments, one of them hostile (10,000 variables, a 64 KiB
//! value, bytes that are not UTF-8). CI runs as root: this runs for real.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use ringside_tests::fleet::Cgroups;
use ringside_tests::{ml_process, wait_for_file, workload_binary, Daemon, DaemonOptions, Scratch, Workload};

const CONTAINER: &str = "3f2a9c6e5b1d4c7a8e9f0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d";
const POD_UID: &str = "1b4e28ba-2fa1-11d2-883f-0016d3cca427";

/// `ml-workload`, moved into `cgroup` before it execs, with `env` added to its environment.
fn workload_in(cgroup: &Path, dir: &Path, env: &[(&std::ffi::OsStr, &std::ffi::OsStr)]) -> Result<Workload> {
    let ready = dir.join("ready");
    let script = format!(
        "echo $$ > '{}/cgroup.procs' && exec '{}' --phase-ms 300 --cycles 1000 --ready '{}'",
        cgroup.display(),
        workload_binary().display(),
        ready.display()
    );
    let mut command = Command::new("sh");
    command.args(["-c", &script]).stdout(Stdio::null());
    for (k, v) in env {
        command.env(k, v);
    }
    let workload = Workload(command.spawn().context("start ml-workload")?);
    wait_for_file(&ready, Duration::from_secs(10)).context("ml-workload did not get ready")?;
    Ok(workload)
}

#[tokio::test(flavor = "multi_thread")]
async fn identity_comes_from_real_cgroup_paths_and_a_bounded_environment() -> Result<()> {
    let mut cgroups = Cgroups::new("ringside-identity")?;
    let slurm = cgroups.make("slurm/uid_0/job_4242/step_0")?;
    let pod = cgroups.make(&format!(
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{CONTAINER}.scope",
        POD_UID.replace('-', "_")
    ))?;
    let daemon = Daemon::start(DaemonOptions {
        interval_ms: 200,
        config: "[scheduler]\nwindow_ms = 100\nscan_interval_ms = 200\n".into(),
        ..DaemonOptions::default()
    })?;

    // A Slurm rank: the path says job 4242 step 0, the environment its rank (its own
    // SLURM_JOB_ID, which disagrees, loses to the path).
    let slurm_dir = Scratch::new("identity-slurm");
    let os = |s: &'static str| std::ffi::OsStr::new(s);
    let rank = workload_in(
        &slurm,
        &slurm_dir.0,
        &[(os("SLURM_JOB_ID"), os("999")), (os("SLURM_PROCID"), os("3")), (os("WORLD_SIZE"), os("16"))],
    )?;
    // A pod's container, its environment hostile: 10,000 variables, a 64 KiB value, bytes
    // that are not UTF-8, and a pod name.
    let many: Vec<(String, String)> = (0..10_000).map(|i| (format!("V{i:05}"), "x".into())).collect();
    let big = "b".repeat(64 * 1024);
    let binary = std::ffi::OsStr::from_bytes(b"\xff\xfe\x01");
    let mut env: Vec<(&std::ffi::OsStr, &std::ffi::OsStr)> =
        vec![(os("HOSTNAME"), os("trainer-0")), (os("LOCAL_RANK"), os("1")), (os("BIG"), std::ffi::OsStr::new(&big))];
    env.push((os("BINARY"), binary));
    env.extend(many.iter().map(|(k, v)| (std::ffi::OsStr::new(k), std::ffi::OsStr::new(v))));
    let pod_dir = Scratch::new("identity-pod");
    let in_pod = workload_in(&pod, &pod_dir.0, &env)?;

    let (rank_pid, pod_pid) = (rank.pid(), in_pod.pid());
    let snapshot = daemon
        .wait_for("both processes tracked with an identity", 15, |s| {
            [rank_pid, pod_pid].iter().all(|pid| ml_process(s, *pid).is_some_and(|p| p["identity"].is_object()))
        })
        .await?;
    let identity = |pid| ml_process(&snapshot, pid).map(|p| p["identity"].clone()).unwrap_or_default();
    let slurm_id = identity(rank_pid);
    ensure!(slurm_id["slurm_job"] == "4242" && slurm_id["slurm_step"] == "0", "the path wins: {slurm_id}");
    ensure!(slurm_id["rank"] == 3 && slurm_id["world_size"] == 16, "{slurm_id}");
    let pod_id = identity(pod_pid);
    ensure!(pod_id["pod_uid"] == POD_UID && pod_id["container"] == CONTAINER, "{pod_id}");
    ensure!(pod_id["pod"] == "trainer-0" && pod_id["local_rank"] == 1, "{pod_id}");
    ensure!(pod_id.get("BIG").is_none() && !pod_id.to_string().contains("bbbb"), "{pod_id}");

    // On /metrics, and the hostile environment stalled nothing: the tick is current.
    let metrics = daemon.get("/metrics").await?.text().await?;
    let info = metrics
        .lines()
        .find(|l| l.starts_with("ringside_process_job_info{") && l.contains(&format!("pid=\"{rank_pid}\"")))
        .with_context(|| format!("no identity series:\n{metrics}"))?;
    ensure!(info.contains("job_id=\"4242.0\"") && info.contains("rank=\"3\""), "{info}");
    let health = daemon.get("/healthz").await?.json::<serde_json::Value>().await?;
    let age = health["last_tick_age_ms"].as_u64().unwrap_or(0);
    ensure!(age < 2_000, "the collection went on: latest tick {age} ms old");
    drop((rank, in_pod));
    Ok(())
}
