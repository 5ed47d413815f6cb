//! The server under abuse, on real sockets: clients that never finish their headers cannot
//! hold the daemon, the connection and WebSocket caps hold, and the console's cookie cannot be
//! used to change anything from another origin (another port of the same host included).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use ringside_tests::{Daemon, DaemonOptions};

fn metric(text: &str, name: &str) -> f64 {
    text.lines().find(|l| l.starts_with(name)).and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or(-1.0)
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// Raises this process's open-file limit to what it may (the hard limit); the new soft limit.
fn raise_file_limit() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1024;
        }
        limit.rlim_cur = limit.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        }
    }
    limit.rlim_cur
}

#[tokio::test]
async fn clients_that_never_finish_their_headers_cannot_hold_the_daemon() -> Result<()> {
    let daemon = Daemon::start(DaemonOptions {
        config: "[scheduler]\nenabled = false\n\n[server]\nmax_connections = 64\nheader_read_timeout_ms = 1000\n"
            .into(),
        ..DaemonOptions::default()
    })?;
    let baseline_fds = open_fds(daemon.pid());
    // 4000 connections that send half a request and wait (fewer where this process may not
    // hold that many sockets: said below).
    let attackers_wanted = 4000;
    let allowed = raise_file_limit().saturating_sub(256) as usize;
    let attackers_n = attackers_wanted.min(allowed);
    if attackers_n < attackers_wanted {
        println!("open-file limit {}: {attackers_n} attackers, not {attackers_wanted}", allowed + 256);
    }
    let started = Instant::now();
    let mut attackers = Vec::with_capacity(attackers_n);
    // The daemon's descriptors, looked at every 100 connections: evicted connections must be
    // closed before more are taken, not piled up behind the accept loop.
    let bound = baseline_fds + 64 + 8;
    let mut most_held = 0;
    for i in 0..attackers_n {
        if i % 100 == 0 {
            most_held = most_held.max(open_fds(daemon.pid()));
        }
        let mut stream = TcpStream::connect(&daemon.addr)?;
        // Refused at the cap: the daemon may close it before the half request is written.
        let _ = stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ");
        stream.set_nonblocking(true)?;
        attackers.push(stream);
    }
    let connected = started.elapsed();
    // Meanwhile the daemon stays bounded and, within the header timeout, answers again.
    most_held = most_held.max(open_fds(daemon.pid()));
    assert!(
        most_held <= bound,
        "at most max_connections held: up to {most_held} descriptors open during the attack, {baseline_fds} before"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    let answered = loop {
        match tokio::time::timeout(Duration::from_millis(500), daemon.get("/healthz")).await {
            Ok(Ok(response)) if response.status().is_success() => break started.elapsed(),
            _ => {}
        }
        ensure!(Instant::now() < deadline, "/healthz unanswered 5 s into the attack");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Every attacking connection is closed by the daemon: the ones over the cap at once, the
    // held ones at the header timeout.
    let mut buf = [0u8; 512];
    let deadline = Instant::now() + Duration::from_secs(8);
    let mut open = attackers.len();
    while open > 0 {
        ensure!(Instant::now() < deadline, "{open} of {attackers_n} half-open connections still open after 8 s");
        attackers.retain_mut(|s| match s.read(&mut buf) {
            Ok(0) => false,
            // A 408 answer, then the close.
            Ok(_) => true,
            Err(e) => matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
        });
        open = attackers.len();
        std::thread::sleep(Duration::from_millis(20));
    }
    let closed_in = started.elapsed();
    let metrics = daemon.get("/metrics").await?.text().await?;
    let refused = metric(&metrics, "ringside_http_connections_refused_total");
    let evicted = metric(&metrics, "ringside_http_connections_evicted_total");
    // Over the cap, each new connection evicts the oldest that has not authenticated (or is
    // refused where all are): most, not all, of them met a full cap.
    assert!(
        refused + evicted >= (attackers_n / 2) as f64,
        "connections over the cap were turned away: {refused} refused, {evicted} evicted"
    );
    assert!(open_fds(daemon.pid()) <= baseline_fds + 8, "the descriptors are given back");
    println!(
        "{attackers_n} half-header connections opened in {} ms: /healthz answered at {} ms, all closed at {} ms, {refused} refused and {evicted} evicted at the cap, at most {most_held} descriptors held ({baseline_fds} before)",
        connected.as_millis(),
        answered.as_millis(),
        closed_in.as_millis()
    );
    Ok(())
}

#[tokio::test]
async fn the_websocket_cap_holds() -> Result<()> {
    let daemon = Daemon::start(DaemonOptions {
        config: "[scheduler]\nenabled = false\n\n[server]\nmax_ws_sessions = 2\n".into(),
        ..DaemonOptions::default()
    })?;
    let _a = daemon.ws(None).await?;
    let _b = daemon.ws(None).await?;
    let third = daemon.ws(None).await;
    let why = format!("{:?}", third.err().map(|e| e.to_string()));
    assert!(why.contains("503"), "a third session over max_ws_sessions = 2 is refused: {why}");
    drop(_a);
    // Once one leaves, there is room again.
    let deadline = Instant::now() + Duration::from_secs(5);
    while daemon.ws(None).await.is_err() {
        ensure!(Instant::now() < deadline, "no room after a session closed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

#[tokio::test]
async fn the_cookie_changes_nothing_from_another_origin() -> Result<()> {
    let daemon =
        Daemon::start(DaemonOptions { config: "[scheduler]\nenabled = false\n".into(), ..DaemonOptions::default() })?;
    let own_origin = daemon.base.clone();
    let cookie = daemon.session_cookie().await?;
    let post = |origin: Option<&str>, json: bool, bearer: bool| {
        let mut request = daemon.http().post(format!("{}/api/alerts/999999/ack", daemon.base));
        if bearer {
            request = request.bearer_auth(&daemon.token);
        } else {
            request = request.header("Cookie", &cookie);
        }
        if let Some(origin) = origin {
            request = request.header("Origin", origin);
        }
        if json {
            request = request.header("Content-Type", "application/json").body("{}");
        }
        request.send()
    };
    // Another port of the same host (a notebook server, TensorBoard): refused before anything
    // is looked up.
    let other_port = own_origin.rsplit_once(':').map(|(host, _)| format!("{host}:8888")).unwrap_or_default();
    for (origin, json) in [(Some(other_port.as_str()), true), (None, true), (Some(own_origin.as_str()), false)] {
        let response = post(origin, json, false).await?;
        assert_eq!(response.status(), 403, "origin {origin:?}, json {json}");
        let text = response.text().await?;
        assert!(text.contains("cookie"), "{text}");
    }
    // From the console's own origin with JSON, and with the bearer token from anywhere, the
    // request goes through (the alert does not exist: 404).
    assert_eq!(post(Some(own_origin.as_str()), true, false).await?.status(), 404);
    assert_eq!(post(None, false, true).await?.status(), 404);
    assert_eq!(post(Some(other_port.as_str()), true, true).await?.status(), 404);
    // Reading with the cookie is fine from anywhere (the response goes to the browser that
    // holds the cookie, not to the other page).
    let read = daemon.http().get(format!("{}/api/alerts", daemon.base)).header("Cookie", &cookie).send().await?;
    assert_eq!(read.status(), 200);
    // And every answer says: no sniffing, no referrer; API answers are not to be stored.
    assert_eq!(read.headers()["x-content-type-options"], "nosniff");
    assert_eq!(read.headers()["referrer-policy"], "no-referrer");
    assert_eq!(read.headers()["cache-control"], "no-store");
    let health = daemon.http().get(format!("{}/healthz", daemon.base)).send().await?;
    assert_eq!(health.headers()["x-content-type-options"], "nosniff");
    let metrics = daemon.get("/metrics").await?.text().await?;
    assert!(metric(&metrics, "ringside_auth_failures_total") >= 3.0, "refusals are counted");
    Ok(())
}

#[tokio::test]
async fn a_corrupt_alert_database_is_moved_aside_and_the_daemon_serves() -> Result<()> {
    let scratch = ringside_tests::Scratch::new("corrupt-db");
    let data_dir = scratch.0.join("data");
    std::fs::create_dir_all(&data_dir)?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&data_dir, std::fs::Permissions::from_mode(0o700))?;
    }
    let garbage: Vec<u8> = (0..16_384u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(data_dir.join("alerts.db"), &garbage)?;
    let daemon = Daemon::start(DaemonOptions {
        config: "[scheduler]\nenabled = false\n".into(),
        data_dir: Some(data_dir.clone()),
        ..DaemonOptions::default()
    })?;
    let health = daemon.health().await?;
    let store = health["components"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "alert-store").cloned())
        .unwrap_or_default();
    assert_eq!(store["status"], "degraded", "{health}");
    let detail = store["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("moved aside") && detail.contains("alerts.db.corrupt-"), "{detail}");
    // The bad file is kept for inspection, byte for byte; a fresh store works.
    let aside: Vec<_> = std::fs::read_dir(&data_dir)?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("alerts.db.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1);
    assert_eq!(std::fs::read(aside[0].path())?, garbage);
    assert_eq!(daemon.get("/api/alerts").await?.status(), 200);
    assert!(data_dir.join("alerts.db").exists());
    Ok(())
}

#[tokio::test]
async fn an_address_guessing_tokens_is_held_back_and_the_right_token_is_not() -> Result<()> {
    let daemon = Daemon::start(DaemonOptions {
        config: "[scheduler]\nenabled = false\n[server]\nauth_failures_per_address = 5\n".into(),
        ..DaemonOptions::default()
    })?;
    let wrong =
        |path: &str| daemon.http().get(format!("{}{path}", daemon.base)).bearer_auth("wrong-wrong-wrong").send();
    for _ in 0..5 {
        assert_eq!(wrong("/api/alerts").await?.status(), 401);
    }
    let held = wrong("/api/snapshot").await?;
    assert_eq!(held.status(), 429, "the 6th failure within 10 s");
    let wait: u64 = held.headers()["retry-after"].to_str()?.parse()?;
    assert!((1..=10).contains(&wait), "Retry-After {wait}");
    let landing = daemon.http().get(format!("{}/?token=guess-guess-guess", daemon.base)).send().await?;
    assert_eq!(landing.status(), 429, "the console's landing page counts too");
    // The node's own users share the address: a valid token goes through meanwhile.
    assert_eq!(daemon.get("/api/alerts").await?.status(), 200);
    let metrics = daemon.get("/metrics").await?.text().await?;
    let value =
        |name: &str| metrics.lines().find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok()).unwrap_or(0.0);
    assert_eq!(value("ringside_auth_failures_total "), 7.0, "{metrics}");
    assert_eq!(value("ringside_auth_throttled_total "), 2.0, "{metrics}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_locked_alert_database_delays_nothing_and_acks_say_so() -> Result<()> {
    use ringside_shared::ServerMessage;
    let daemon = Daemon::start(DaemonOptions {
        config: format!("[scheduler]\nenabled = false\n{}", ringside_tests::memory_rules(2, "")),
        ..DaemonOptions::default()
    })?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let ids: Vec<u64> = loop {
        let list = daemon.get_json("/api/alerts").await?;
        let ids: Vec<u64> = list.as_array().into_iter().flatten().filter_map(|a| a["id"].as_u64()).collect();
        if ids.len() == 2 {
            break ids;
        }
        ensure!(Instant::now() < deadline, "two alerts within 10 s: {list}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Another process takes the database and keeps it.
    let mut sqlite = std::process::Command::new("sqlite3")
        .arg(daemon.data_dir().join("alerts.db"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let mut stdin = sqlite.stdin.take().expect("piped");
    writeln!(stdin, "BEGIN EXCLUSIVE;\nSELECT 'locked';")?;
    let mut stdout = sqlite.stdout.take().expect("piped");
    let mut seen = [0u8; 6];
    stdout.read_exact(&mut seen)?;
    ensure!(&seen == b"locked", "sqlite3 took the lock");

    // Updates keep their pace and /healthz answers at once meanwhile.
    let mut ws = daemon.ws(None).await?;
    let mut arrivals = Vec::new();
    let watch_until = Instant::now() + Duration::from_secs(2);
    let ack = {
        let http = daemon.http();
        let url = format!("{}/api/alerts/{}/ack", daemon.base, ids[0]);
        let token = daemon.token.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let response = http.post(url).bearer_auth(token).send().await;
            (started.elapsed(), response)
        })
    };
    let mut health_ms: Vec<u128> = Vec::new();
    while Instant::now() < watch_until {
        if let ServerMessage::Update(_) = ws.next(Duration::from_secs(2)).await? {
            arrivals.push(Instant::now());
        }
        let started = Instant::now();
        daemon.get("/healthz").await?;
        health_ms.push(started.elapsed().as_millis());
    }
    let gaps: Vec<u128> = arrivals.windows(2).map(|w| (w[1] - w[0]).as_millis()).collect();
    let worst_gap = gaps.iter().copied().max().unwrap_or(u128::MAX);
    let worst_health = health_ms.iter().copied().max().unwrap_or(u128::MAX);
    println!("while locked: update gaps {gaps:?} ms, /healthz worst {worst_health} ms");
    ensure!(worst_gap <= 200 + 250, "updates every 200 ms kept their pace: gaps {gaps:?} ms");
    ensure!(worst_health <= 250, "/healthz answered at once: {health_ms:?} ms");
    // The acknowledgement is refused after a bounded wait, with the reason, and not kept.
    let (took, response) = ack.await?;
    let response = response?;
    let status = response.status();
    let text = response.text().await?;
    println!("ack while locked: {status} after {took:?}: {text}");
    ensure!(status == 503 && text.contains("not acknowledged"), "{status} {text}");
    ensure!(took <= Duration::from_secs(4), "answered within the bounded wait: {took:?}");
    let store: serde_json::Value = daemon.get("/healthz").await?.json().await?;
    let health = ringside_tests::component(&store, "alert-store");
    ensure!(health["status"] == "degraded", "{health}");
    let listed = daemon.get_json("/api/alerts").await?;
    let first = listed.as_array().and_then(|a| a.iter().find(|a| a["id"] == ids[0]).cloned()).unwrap_or_default();
    ensure!(first["acknowledgement"].is_null(), "a refused ack is not shown: {first}");

    // The lock goes away: the store recovers and acknowledgements are written again.
    writeln!(stdin, "COMMIT;")?;
    drop(stdin);
    let _ = sqlite.wait();
    let acked = daemon
        .http()
        .post(format!("{}/api/alerts/{}/ack", daemon.base, ids[1]))
        .bearer_auth(&daemon.token)
        .send()
        .await?;
    ensure!(acked.status() == 200, "{}", acked.text().await?);
    daemon.component_when("alert-store", "up", 10).await?;
    Ok(())
}
