//! Job-aware alerts end to end: the real daemon with its BPF probe and `ml-workload` (the
//! labelled training loop over the CUDA and NCCL test doubles). A stalled rank makes the main
//! thread block in `ncclAllReduce`; a data-heavy loop is input-bound; a plain one raises
//! neither. CI runs as root: these run for real.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use ringside_tests::{ml_process, Daemon, DaemonOptions, Scratch, Workload};
use serde_json::Value;

/// One daemon at a time: each watches every ML process on the node.
static ONE_DAEMON: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const INTERVAL_MS: u64 = 200;
const WINDOW_MS: u64 = 100;
const HANG_S: u64 = 3;
/// The incident bundle's span: seconds before the alert fired, and after.
const BEFORE_S: u64 = 6;
const AFTER_S: u64 = 3;

fn daemon() -> Result<Daemon> {
    Daemon::start(DaemonOptions {
        interval_ms: INTERVAL_MS,
        config: format!(
            "[scheduler]\nwindow_ms = {WINDOW_MS}\nscan_interval_ms = 200\njob_window_s = 8\n\n\
             [thresholds]\ncollective_hang_s = {HANG_S}\ninput_bound_pct = 50\n\n[alerts]\nclear_for_ms = 1000\n\n\
             [incidents]\nbefore_s = {BEFORE_S}\nafter_s = {AFTER_S}\n"
        ),
        ..DaemonOptions::default()
    })
}

/// The job's alert of `alert_type` in `/api/alerts` (active or resolved), if any.
fn job_alert(alerts: &Value, pid: u32, alert_type: &str) -> Option<Value> {
    let source = format!("job:{pid}");
    alerts.as_array()?.iter().find(|a| a["source"] == source.as_str() && a["alert_type"] == alert_type).cloned()
}

/// `{"hang_start_ms","hang_end_ms"}` from the workload's log, once the blocked call returned.
fn hang_of(log: &std::path::Path) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find_map(|v| Some((v["hang_start_ms"].as_u64()?, v["hang_end_ms"].as_u64()?)))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_rank_raises_a_collective_hang_that_names_the_job_and_resolves() -> Result<()> {
    let _one = ONE_DAEMON.lock().await;
    let daemon = daemon()?;
    let dir = Scratch::new("jobs-hang");
    // The second cycle's collective waits 8 s for the other rank.
    let workload = Workload::start_with(&dir.0, 1500, 3, &["--hang-ms", "8000"])?;
    let pid = workload.pid();
    daemon
        .wait_for("the workload tracked with its NCCL library probed", 10, |s| {
            ml_process(s, pid).is_some_and(|p| {
                p["probed_libraries"].as_array().is_some_and(|l| l.iter().any(|l| l.as_str() == Some("libnccl.so.2")))
            })
        })
        .await?;
    let log = dir.0.join("truth.jsonl");
    ensure!(hang_of(&log).is_none(), "the libraries must be probed before the hang starts");

    let alerts = daemon
        .alerts_when("a collective_hang alert for the job", 25, |a| job_alert(a, pid, "collective_hang").is_some())
        .await?;
    let hang = job_alert(&alerts, pid, "collective_hang").unwrap();
    // While it lasts, /metrics says how long the job has been stalled.
    let metrics = daemon.get("/metrics").await?.text().await?;
    let stalled = metrics
        .lines()
        .find(|l| l.starts_with("ringside_job_collective_stalled_seconds{") && l.contains(&format!("job=\"{pid}\"")))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .with_context(|| format!("no stalled series for the job:\n{metrics}"))?;
    ensure!(stalled >= HANG_S as f64, "stalled {stalled} s");

    assert_eq!(hang["severity"], "critical", "{hang}");
    assert_eq!(hang["labels"]["job"], pid.to_string(), "{hang}");
    assert_eq!(hang["labels"]["comm"], "ml-workload", "{hang}");
    let command = hang["labels"]["command"].as_str().unwrap_or_default();
    assert!(command.contains("ml-workload") && command.contains("--hang-ms 8000"), "{hang}");
    assert!(hang["message"].as_str().unwrap_or_default().contains("NCCL collective"), "{hang}");
    // Critical: its incident bundle records from the moment it fired. The job's threads as
    // the scheduler lists them now, inside the bundle's span.
    let hang_id = hang["id"].as_u64().context("alert id")?;
    let incidents = daemon.get_json("/api/incidents").await?;
    let recording = incidents.as_array().and_then(|l| l.iter().find(|i| i["alert_id"] == hang_id)).cloned();
    let recording = recording.with_context(|| format!("no bundle recording for the hang: {incidents}"))?;
    assert_eq!(recording["recording"], true, "{recording}");
    let snapshot = daemon.get_json("/api/snapshot").await?;
    let listed_threads: Vec<u64> = snapshot["scheduler"]["tasks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["pid"] == pid)
        .filter_map(|t| t["tid"].as_u64())
        .collect();
    ensure!(listed_threads.contains(&u64::from(pid)), "the main thread listed: {listed_threads:?}");

    // Resolved once the call returns; then the latency, against the call's own start.
    let alerts = daemon
        .alerts_when("the hang alert resolved", 20, |a| {
            job_alert(a, pid, "collective_hang").is_some_and(|h| h["resolved_at_ms"].is_u64())
        })
        .await?;
    let hang = job_alert(&alerts, pid, "collective_hang").unwrap();
    let (start_ms, end_ms) = hang_of(&log).context("the blocked call's times")?;
    let raised_ms = hang["raised_at_ms"].as_u64().context("raised_at_ms")?;
    let resolved_ms = hang["resolved_at_ms"].as_u64().context("resolved_at_ms")?;
    let latency = raised_ms.saturating_sub(start_ms);
    eprintln!(
        "hang of {} ms: alert after {latency} ms (threshold {} ms), resolved {} ms after the call returned",
        end_ms - start_ms,
        HANG_S * 1000,
        resolved_ms.saturating_sub(end_ms)
    );
    // Within the threshold plus two collection intervals and one detection window.
    assert!(
        (HANG_S * 1000..=HANG_S * 1000 + 2 * INTERVAL_MS + WINDOW_MS).contains(&latency),
        "raised {latency} ms after the call blocked"
    );
    assert!(resolved_ms >= end_ms, "resolved after the call returned");
    ensure!(job_alert(&alerts, pid, "input_bound").is_none(), "a hang is not input-bound: {alerts}");
    incident_bundle_of_the_hang(&daemon, hang_id, pid, &listed_threads, (start_ms, end_ms)).await
}

/// The hang's incident bundle: written `AFTER_S` after the alert fired, its span and content
/// right, valid against its schema; its trace one track per ML thread.
async fn incident_bundle_of_the_hang(
    daemon: &Daemon,
    alert_id: u64,
    pid: u32,
    listed_threads: &[u64],
    (hang_start_ms, hang_end_ms): (u64, u64),
) -> Result<()> {
    let written = |l: &Value| {
        l.as_array().and_then(|l| l.iter().find(|i| i["alert_id"] == alert_id && i["recording"] == false).cloned())
    };
    let list = daemon.json_when("/api/incidents", "the hang's bundle written", 20, |l| written(l).is_some()).await?;
    let summary = written(&list).context("the bundle")?;
    let id = summary["id"].as_u64().context("bundle id")?;
    let response = daemon.get(&format!("/api/incidents/{id}?download=1")).await?;
    let disposition = response.headers().get("content-disposition").and_then(|v| v.to_str().ok()).unwrap_or("");
    ensure!(disposition.contains(&format!("-{id}.json")), "an attachment: {disposition:?}");
    let body = response.bytes().await?;
    assert_eq!(summary["bytes"].as_u64(), Some(body.len() as u64), "{summary}");
    let file = daemon.data_dir().join("incidents").join(format!("{id}.json"));
    assert_eq!(std::fs::metadata(&file)?.len(), body.len() as u64, "the file in the data dir is what is served");
    let bundle: Value = serde_json::from_slice(&body)?;
    let schema = daemon.get_json("/api/schema/incident").await?;
    let validator = jsonschema::validator_for(&schema)?;
    let errors: Vec<String> = validator.iter_errors(&bundle).map(|e| format!("{e} at {}", e.instance_path())).collect();
    assert!(errors.is_empty(), "the bundle does not match its schema: {errors:#?}");

    // The span: BEFORE_S before the alert fired (the daemon started long enough ago) to
    // AFTER_S after, the history covering it tick by tick.
    let field = |name: &str| bundle[name].as_u64().with_context(|| name.to_string());
    let (fired, start, end) = (field("fired_at_ms")?, field("start_ms")?, field("end_ms")?);
    let started = bundle["node"]["daemon_started_at_ms"].as_u64().context("daemon start")?;
    assert!(fired - started > BEFORE_S * 1000 + 1000, "the daemon ran {} ms before the hang", fired - started);
    assert_eq!((fired - start, end - fired), (BEFORE_S * 1000, AFTER_S * 1000), "{summary}");
    assert_eq!(bundle["complete"], true);
    assert_eq!(bundle["alert"]["id"], alert_id);
    let history: Vec<u64> =
        bundle["history"].as_array().into_iter().flatten().filter_map(|p| p["t_ms"].as_u64()).collect();
    let (first, last) = (history.first().copied().unwrap_or(0), history.last().copied().unwrap_or(0));
    assert!(
        first >= start && first < start + 2 * INTERVAL_MS && last <= end && last > end - 2 * INTERVAL_MS,
        "{history:?}"
    );
    let ticks = (end - start) / INTERVAL_MS;
    assert!(history.len() as u64 >= ticks - 2, "{} points over {ticks} ticks", history.len());

    // Each listed thread of the job has its timeline; the main thread's shows the collective
    // the hang blocked in.
    let threads = bundle["threads"].as_array().context("threads")?;
    let mine: Vec<&Value> = threads.iter().filter(|t| t["pid"] == pid).collect();
    for tid in listed_threads {
        ensure!(mine.iter().any(|t| t["tid"] == *tid), "thread {tid} of the job missing from {mine:?}");
    }
    let main = mine.iter().find(|t| t["tid"] == pid).context("the main thread")?;
    let in_collective = main["spans"].as_array().into_iter().flatten().any(|s| {
        s["phase"] == "nccl_collective"
            && s["start_ms"].as_u64().unwrap_or(u64::MAX) <= hang_start_ms + 1000
            && s["end_ms"].as_u64().unwrap_or(0) >= fired.min(hang_end_ms)
    });
    ensure!(in_collective, "the main thread in a collective through the hang: {main}");
    // At the scheduler's window resolution, not the tick's: the collective begins within a
    // window or two of the call, and the thread's phase changes fall between ticks.
    let spans: Vec<(&str, u64, u64)> = main["spans"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| Some((s["phase"].as_str()?, s["start_ms"].as_u64()?, s["end_ms"].as_u64()?)))
        .collect();
    let collective = spans
        .iter()
        .find(|(phase, _, end)| *phase == "nccl_collective" && *end >= fired.min(hang_end_ms))
        .map(|(_, begin, _)| *begin)
        .context("the collective span")?;
    ensure!(
        collective + WINDOW_MS >= hang_start_ms && collective <= hang_start_ms + 2 * WINDOW_MS,
        "the collective span starts at {collective}, the call at {hang_start_ms}: {spans:?}"
    );
    let ticks: std::collections::HashSet<u64> = history.iter().copied().collect();
    let changes: Vec<u64> = spans.iter().skip(1).map(|(_, begin, _)| *begin).collect();
    ensure!(
        changes.iter().any(|t| !ticks.contains(t)),
        "phase changes at the scheduler's windows, not only at ticks: {changes:?} vs ticks {history:?}"
    );
    let process =
        bundle["processes"].as_array().into_iter().flatten().find(|p| p["pid"] == pid).context("the process")?;
    ensure!(
        process["spans"].as_array().is_some_and(|s| s.iter().any(|s| s["phase"] == "nccl_collective")),
        "{process}"
    );
    let raised = bundle["alert_events"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|e| e["alert_id"] == alert_id && e["kind"] == "raised" && e["at_ms"] == fired);
    ensure!(raised, "the alert's raise among the events: {}", bundle["alert_events"]);

    // The trace: one named track per thread of the bundle, slices only on those.
    let trace = daemon.get_json(&format!("/api/incidents/{id}/trace")).await?;
    let events = trace["traceEvents"].as_array().context("traceEvents")?;
    let track = |e: &Value| (e["pid"].as_u64().unwrap_or(0), e["tid"].as_u64().unwrap_or(0));
    let named: std::collections::BTreeSet<(u64, u64)> =
        events.iter().filter(|e| e["ph"] == "M" && e["name"] == "thread_name").map(track).collect();
    let expected: std::collections::BTreeSet<(u64, u64)> = threads.iter().map(track).collect();
    assert_eq!(named, expected, "one track per ML thread");
    assert_eq!(named.len(), threads.len(), "no thread twice");
    let sliced: std::collections::BTreeSet<(u64, u64)> = events.iter().filter(|e| e["ph"] == "X").map(track).collect();
    assert_eq!(sliced, expected, "phases as slices on each track");
    for e in events {
        let ts_ok = e["ph"] == "M" || e["ts"].as_u64().is_some_and(|ts| ts >= start * 1000 && ts <= end * 1000 + 1);
        ensure!(ts_ok, "an event outside the span (µs): {e}");
    }
    // A track's slices must nest for a trace viewer to draw them: one after the other here.
    for (pid, tid) in &expected {
        let mut slices: Vec<(u64, u64)> = events
            .iter()
            .filter(|e| e["ph"] == "X" && track(e) == (*pid, *tid))
            .filter_map(|e| Some((e["ts"].as_u64()?, e["dur"].as_u64()?)))
            .collect();
        slices.sort_unstable();
        ensure!(slices.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0), "slices of {tid} overlap: {slices:?}");
    }
    eprintln!(
        "incident bundle {id}: {} bytes for {} s ({} threads, {} history points); trace {} events",
        body.len(),
        (end - start) / 1000,
        threads.len(),
        history.len(),
        events.len()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_data_heavy_loop_is_input_bound_and_a_plain_one_raises_nothing() -> Result<()> {
    let _one = ONE_DAEMON.lock().await;
    let daemon = daemon()?;
    let dir = Scratch::new("jobs-input");
    // Data loading 2.5 s of every 4 s: 62% of the job's time.
    let heavy = Workload::start_with(&dir.0, 500, 7, &["--data-weight", "5"])?;
    let pid = heavy.pid();
    let alerts = daemon
        .alerts_when("an input_bound alert for the job", 25, |a| job_alert(a, pid, "input_bound").is_some())
        .await?;
    let alert = job_alert(&alerts, pid, "input_bound").unwrap();
    assert_eq!(alert["severity"], "warning", "{alert}");
    let share = alert["value"].as_f64().unwrap_or(0.0);
    assert!((50.0..80.0).contains(&share), "data loading {share}% of the window: {alert}");
    assert!(job_alert(&alerts, pid, "collective_hang").is_none(), "{alerts}");
    drop(heavy);

    // A plain loop (a quarter of its time loading data), observed over more than the job
    // window: no job alert at all.
    let plain_dir = Scratch::new("jobs-plain");
    let plain = Workload::start(&plain_dir.0, 500, 7)?;
    let pid = plain.pid();
    daemon.wait_for("the plain workload tracked", 10, |s| ml_process(s, pid).is_some()).await?;
    tokio::time::sleep(Duration::from_secs(12)).await;
    let snapshot = daemon.get_json("/api/snapshot").await?;
    let process = ml_process(&snapshot, pid).context("still tracked")?;
    let loading = process["recent_phase_pct"]["data_loading"].as_f64().unwrap_or(0.0);
    assert!(loading > 10.0 && loading < 45.0, "about a quarter: {process}");
    let alerts = daemon.get_json("/api/alerts").await?;
    for alert_type in ["collective_hang", "input_bound", "step_time_regression"] {
        ensure!(job_alert(&alerts, pid, alert_type).is_none(), "{alert_type} on a healthy loop: {alerts}");
    }
    Ok(())
}

/// A user not admitted for alerting (no `[scheduler.alerting]`, nor `[scheduler.enforce]`)
/// runs a job that sits in `ncclAllReduce` past the hang threshold: the job is shown, marked as
/// not paging, and raises no alert — so no page, and no incident bundle to push real ones out.
/// Admitted, the same job's hang is raised.
#[tokio::test(flavor = "multi_thread")]
async fn a_hung_collective_of_a_user_not_admitted_for_alerting_pages_nobody() -> Result<()> {
    let _one = ONE_DAEMON.lock().await;
    let run_as_1000 =
        |dir: &std::path::Path| start_as_1000(dir, &["--phase-ms", "1500", "--cycles", "3", "--hang-ms", "8000"]);

    let daemon = daemon()?;
    let dir = Scratch::new("jobs-untrusted");
    let workload = run_as_1000(&dir.0)?;
    let pid = workload.pid();
    let shown = daemon
        .wait_for("the job shown, not paging", 10, |s| ml_process(s, pid).is_some_and(|p| p["untrusted"] == true))
        .await?;
    let paging = ml_process(&shown, pid).map(|p| p["paging"].clone()).unwrap_or_default();
    ensure!(paging.as_str().is_some_and(|p| p.starts_with("does not page")), "{paging}");
    // Through the hang (it starts in the second cycle) and past the threshold.
    let log = dir.0.join("truth.jsonl");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while hang_of(&log).is_none() {
        ensure!(std::time::Instant::now() < deadline, "the hang did not end within 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let alerts = daemon.get_json("/api/alerts").await?;
    ensure!(job_alert(&alerts, pid, "collective_hang").is_none(), "paged for an untrusted job: {alerts}");
    let incidents = daemon.get_json("/api/incidents").await?;
    ensure!(incidents.as_array().is_some_and(Vec::is_empty), "no bundle: {incidents}");
    // Nor can it page through the fleet's rules: its rank is shown, not exported as one.
    let identity = ml_process(&shown, pid).map(|p| p["identity"]["rank"].clone()).unwrap_or_default();
    ensure!(identity == 0, "its identity is shown: {identity}");
    let metrics = daemon.get("/metrics").await?.text().await?;
    let rank_series: Vec<&str> =
        metrics.lines().filter(|l| l.starts_with("ringside_rank_") && l.contains("run-of-1000")).collect();
    ensure!(rank_series.is_empty(), "no rank series for an untrusted job: {rank_series:?}");
    println!("uid 1000's hung collective: shown, {paging}; no alert, no bundle");
    drop(workload);
    drop(daemon);

    // Admitted for alerting, the same job's hang is raised.
    let admitted = Daemon::start(DaemonOptions {
        interval_ms: INTERVAL_MS,
        config: format!(
            "[scheduler]\nwindow_ms = {WINDOW_MS}\nscan_interval_ms = 200\n\n[scheduler.alerting]\nusers = [\"1000\"]\n\n\
             [thresholds]\ncollective_hang_s = {HANG_S}\n"
        ),
        ..DaemonOptions::default()
    })?;
    let dir = Scratch::new("jobs-admitted");
    let workload = run_as_1000(&dir.0)?;
    let pid = workload.pid();
    admitted
        .alerts_when("the admitted user's hang raised", 30, |a| job_alert(a, pid, "collective_hang").is_some())
        .await
        .map_err(|e| anyhow::anyhow!("{}", e.to_string().chars().take(300).collect::<String>()))?;
    let metrics = admitted.get("/metrics").await?.text().await?;
    ensure!(
        metrics.contains("ringside_rank_in_collective_seconds{job_id=\"run-of-1000\",rank=\"0\"}"),
        "an admitted user's rank is exported"
    );
    Ok(())
}

/// `ml-workload` as uid 1000 (a user of the node nobody admitted), logging into `dir`.
fn start_as_1000(dir: &std::path::Path, args: &[&str]) -> Result<ringside_tests::Reaped> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))?;
    let child = std::process::Command::new("setpriv")
        .args(["--reuid=1000", "--regid=1000", "--clear-groups"])
        .arg(ringside_tests::workload_binary())
        .args(args)
        // It claims a rank of a job across nodes.
        .env("TORCHELASTIC_RUN_ID", "run-of-1000")
        .env("RANK", "0")
        .arg("--log")
        .arg(dir.join("truth.jsonl"))
        .arg("--ready")
        .arg(dir.join("ready"))
        .stdout(std::process::Stdio::null())
        .spawn()
        .context("start ml-workload as uid 1000")?;
    let workload = ringside_tests::Reaped(child);
    ringside_tests::wait_for_file(&dir.join("ready"), Duration::from_secs(10))?;
    Ok(workload)
}

/// What a viewer token is shown of a job whose user is not admitted for alerting: the job, its
/// phases and numbers, but not its command line nor the paths in it — in the snapshot, the
/// WebSocket updates, `/metrics` and incident bundles — while an operator sees all of it, and a
/// root job's command line stays visible to both. `[server] viewers_see_untrusted` shows it.
#[tokio::test(flavor = "multi_thread")]
async fn a_viewer_is_not_shown_the_command_line_of_an_untrusted_job() -> Result<()> {
    let _one = ONE_DAEMON.lock().await;
    let (ops, wall) = (ringside_tests::random_token(), ringside_tests::random_token());
    let config = |extra: &str| {
        format!(
            "[scheduler]\nwindow_ms = {WINDOW_MS}\nscan_interval_ms = 200\n\n[server]\n{extra}\n\n\
             [[rules]]\nname = \"memory_in_use\"\nmetric = \"host.memory_used_pct\"\nop = \">\"\nthreshold = 0.001\n\
             for = \"1s\"\nseverity = \"critical\"\n\n[incidents]\nbefore_s = 3\nafter_s = 1\n"
        )
    };
    let start = |extra: &str| {
        Daemon::start(DaemonOptions {
            interval_ms: INTERVAL_MS,
            config: config(extra),
            token: Some(ops.clone()),
            token_file: Some(format!("ops:{ops}:operator\nwall:{wall}:viewer\n")),
            ..DaemonOptions::default()
        })
    };
    let daemon = start("")?;
    let theirs = Scratch::new("jobs-someone-elses-secret");
    let secret = theirs.0.to_string_lossy().to_string();
    let untrusted = start_as_1000(&theirs.0, &["--phase-ms", "400", "--cycles", "200"])?;
    let ours = Scratch::new("jobs-roots-own");
    let trusted = Workload::start_with(&ours.0, 400, 200, &[])?;
    let (them, us) = (untrusted.pid(), trusted.pid());
    let seen = daemon
        .wait_for("both jobs tracked", 15, |s| ml_process(s, them).is_some() && ml_process(s, us).is_some())
        .await?;
    let theirs_seen = ml_process(&seen, them).unwrap();
    ensure!(theirs_seen["untrusted"] == true && theirs_seen["cmdline"].as_str().is_some_and(|c| c.contains(&secret)));

    let viewer = |path: String| {
        let (daemon, wall) = (&daemon, wall.clone());
        async move {
            let response = daemon.http().get(format!("{}{path}", daemon.base)).bearer_auth(&wall).send().await?;
            ensure!(response.status() == 200, "viewer GET {path}: {}", response.status());
            Ok::<String, anyhow::Error>(response.text().await?)
        }
    };
    // The snapshot: the untrusted job listed and marked, its command line hidden; root's shown.
    let snapshot: Value = serde_json::from_str(&viewer("/api/snapshot".into()).await?)?;
    let hidden = ml_process(&snapshot, them).context("the viewer still sees the job")?;
    ensure!(hidden["cmdline"] == ringside_shared::HIDDEN_FROM_VIEWERS, "{hidden}");
    ensure!(!snapshot.to_string().contains(&secret), "the viewer's snapshot names the path");
    let root_job = ml_process(&snapshot, us).context("root's job")?;
    ensure!(root_job["cmdline"].as_str().is_some_and(|c| c.contains(&*ours.0.to_string_lossy())), "{root_job}");
    // `/metrics`: the operator's names the job's command, the viewer's does not.
    let operator_metrics = daemon.get("/metrics").await?.text().await?;
    ensure!(operator_metrics.contains(&secret), "the operator's /metrics labels the job with its command");
    ensure!(!viewer("/metrics".into()).await?.contains(&secret), "the viewer's /metrics names the path");
    // The WebSocket: the first snapshot and every update after it.
    let mut ws = daemon.ws_with(Some(&wall), None).await?;
    let mut updates = 0;
    while updates < 5 {
        let message = ws.next(Duration::from_secs(5)).await?;
        let text = serde_json::to_string(&message)?;
        ensure!(!text.contains(&secret), "a viewer's frame names the path");
        if let ringside_shared::ServerMessage::Update(update) = &message {
            if update.readings.scheduler.as_ref().is_some_and(|s| s.processes.iter().any(|p| p.pid == them)) {
                updates += 1;
            }
        }
    }
    // An incident bundle (the memory rule is critical) holds both jobs; the viewer's copy and
    // its trace do not name the path, the operator's does.
    let incidents = daemon
        .json_when("/api/incidents", "a bundle written", 20, |i| i.as_array().is_some_and(|a| !a.is_empty()))
        .await?;
    let id = incidents[0]["id"].as_u64().context("an incident id")?;
    let operator_bundle = daemon.get(&format!("/api/incidents/{id}")).await?.text().await?;
    ensure!(operator_bundle.contains(&secret), "the operator's bundle has the command line");
    let viewer_bundle = viewer(format!("/api/incidents/{id}")).await?;
    ensure!(!viewer_bundle.contains(&secret) && viewer_bundle.contains(ringside_shared::HIDDEN_FROM_VIEWERS));
    ensure!(
        !viewer(format!("/api/incidents/{id}/trace")).await?.contains(&secret),
        "the viewer's trace names the path"
    );
    drop(ws);
    drop(daemon);

    // Allowed by the config, the viewer sees it.
    let daemon = start("viewers_see_untrusted = true")?;
    daemon.wait_for("the job tracked", 15, |s| ml_process(s, them).is_some()).await?;
    let response = daemon.http().get(format!("{}/api/snapshot", daemon.base)).bearer_auth(&wall).send().await?;
    let snapshot: Value = response.json().await?;
    let shown = ml_process(&snapshot, them).context("the job")?;
    ensure!(shown["cmdline"].as_str().is_some_and(|c| c.contains(&secret)), "{shown}");
    Ok(())
}
