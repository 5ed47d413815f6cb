//! The REST routes of the v1 contract, against the real daemon.

use std::io::Read;
use std::time::Duration;

use ringside_tests::{Daemon, DaemonOptions, LOW_MEMORY_THRESHOLDS};

async fn wait_for_ticks(daemon: &Daemon, ticks: u64) -> anyhow::Result<serde_json::Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let snapshot = daemon.get_json("/api/snapshot").await?;
        if snapshot["seq"].as_u64().unwrap_or(0) >= ticks {
            return Ok(snapshot);
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "daemon made no {ticks} ticks in 15 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn healthz_needs_no_token_and_says_what_is_up() -> anyhow::Result<()> {
    let daemon = Daemon::start(DaemonOptions::default())?;
    // Without the token: the word and a status code load balancers and probes can act on;
    // nothing more (component details can name URLs and errors).
    let anonymous = daemon.http().get(format!("{}/healthz", daemon.base)).send().await?;
    let code = anonymous.status().as_u16();
    let health: serde_json::Value = anonymous.json().await?;
    let word = health["status"].as_str().unwrap().to_string();
    assert!(["ok", "degraded"].contains(&word.as_str()), "{health}");
    assert_eq!(code, if word == "ok" { 200 } else { 503 });
    assert_eq!(health.as_object().map(|o| o.len()), Some(1), "only the status: {health}");
    // With it, every component and how old the latest tick is.
    let full = daemon.health().await?;
    let components = full["components"].as_array().unwrap();
    assert!(components.iter().any(|c| c["name"] == "console"));
    assert!(full["last_tick_age_ms"].as_u64().is_some_and(|ms| ms < 5_000), "{full}");
    Ok(())
}

#[tokio::test]
async fn every_api_route_needs_the_token() -> anyhow::Result<()> {
    let daemon = Daemon::start(DaemonOptions::default())?;
    let http = daemon.http();
    for path in
        ["/api/snapshot", "/api/host", "/api/schema/snapshot", "/api/alerts", "/metrics", "/pkg/ringside_frontend.js"]
    {
        let anonymous = http.get(format!("{}{path}", daemon.base)).send().await?;
        assert_eq!(anonymous.status(), 401, "{path} without token");
        let wrong = http.get(format!("{}{path}", daemon.base)).bearer_auth("wrong-token-0123456789").send().await?;
        assert_eq!(wrong.status(), 401, "{path} with a wrong token");
    }
    let post = http.post(format!("{}/api/alerts/1/ack", daemon.base)).send().await?;
    assert_eq!(post.status(), 401);
    assert_eq!(daemon.get("/api/snapshot").await?.status(), 200);
    Ok(())
}

#[tokio::test]
async fn first_visit_with_token_sets_a_strict_http_only_cookie() -> anyhow::Result<()> {
    let daemon = Daemon::start(DaemonOptions { token: None, ..DaemonOptions::default() })?;
    // The generated token is printed in the console URL.
    assert!(daemon.console_url.starts_with(&daemon.base) && daemon.token.len() >= 32);
    let http = daemon.http();
    let landing = http.get(&daemon.console_url).send().await?;
    assert_eq!(landing.status(), 303, "redirects to drop the token from the address bar");
    assert_eq!(landing.headers()["location"], "/");
    let cookie = landing.headers()["set-cookie"].to_str()?.to_string();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"), "{cookie}");
    let pair = cookie.split(';').next().unwrap().to_string();
    // A session of its own, named after the daemon's port; never the token itself.
    let port = daemon.base.rsplit(':').next().unwrap_or_default();
    let (name, id) = pair.split_once('=').unwrap_or_default();
    assert_eq!(name, format!("ringside_session_{port}"));
    assert!(id.len() == 64 && !cookie.contains(&daemon.token), "{cookie}");
    let sessions = std::fs::read_to_string(daemon.data_dir().join("sessions"))?;
    assert!(!sessions.contains(id) && !sessions.contains(&daemon.token), "digests only: {sessions}");
    // The token as a cookie, or the session under another daemon's name, opens nothing.
    for forged in [
        format!("ringside_token={}", daemon.token),
        format!("ringside_session_1={id}"),
        format!("{name}={}", daemon.token),
    ] {
        let refused = http.get(format!("{}/api/alerts", daemon.base)).header("cookie", &forged).send().await?;
        assert_eq!(refused.status(), 401, "{forged}");
    }

    let console = http.get(format!("{}/", daemon.base)).header("cookie", &pair).send().await?;
    assert_eq!(console.status(), 200);
    assert!(console.headers()["content-type"].to_str()?.starts_with("text/html"));
    assert!(console.headers().contains_key("content-security-policy"));
    assert!(console.text().await?.contains("/boot.js"));
    let api = http.get(format!("{}/api/alerts", daemon.base)).header("cookie", &pair).send().await?;
    assert_eq!(api.status(), 200, "the cookie authorises API calls");

    let no_cookie = http.get(format!("{}/", daemon.base)).send().await?;
    assert_eq!(no_cookie.status(), 401);
    let wrong = http.get(format!("{}/?token=nope-nope-nope-nope", daemon.base)).send().await?;
    assert_eq!(wrong.status(), 401);
    assert!(wrong.headers().get("set-cookie").is_none());
    Ok(())
}

#[tokio::test]
async fn console_files_are_served_typed_compressed_and_cached() -> anyhow::Result<()> {
    let daemon = Daemon::start(DaemonOptions::default())?;
    // `path` asked for with one request header.
    let ask = |path: &str, header: &'static str, value: &str| {
        daemon.http().get(format!("{}{path}", daemon.base)).bearer_auth(&daemon.token).header(header, value).send()
    };
    const WASM: &str = "/pkg/ringside_frontend_bg.wasm";
    let wasm = ask(WASM, "accept-encoding", "gzip").await?;
    assert_eq!(wasm.status(), 200);
    assert_eq!(wasm.headers()["content-type"], "application/wasm");
    assert_eq!(wasm.headers()["content-encoding"], "gzip");
    let etag = wasm.headers()["etag"].to_str()?.to_string();
    let gz = wasm.bytes().await?;
    let mut raw = Vec::new();
    flate2_decode(&gz, &mut raw)?;
    assert_eq!(&raw[..4], b"\0asm", "gzip body decodes to a wasm module");

    // Brotli where the browser takes it (every current one does over HTTPS and on localhost),
    // made at build time: smaller than the gzip copy, and the same module.
    let br = ask(WASM, "accept-encoding", "gzip, deflate, br, zstd").await?;
    assert_eq!(br.headers()["content-encoding"], "br");
    let br = br.bytes().await?;
    assert!(br.len() < gz.len(), "brotli {} bytes, gzip {}", br.len(), gz.len());
    let mut unbrotli = Vec::new();
    brotli::BrotliDecompress(&mut br.as_ref(), &mut unbrotli)?;
    assert_eq!(unbrotli, raw, "the brotli body decodes to the same module");
    let refused = ask(WASM, "accept-encoding", "br;q=0, gzip").await?;
    assert_eq!(refused.headers()["content-encoding"], "gzip", "br;q=0 refuses brotli");
    println!("console wasm, the first module: {} bytes raw, {} gzip, {} brotli", raw.len(), gz.len(), br.len());
    // The issue's budget for what every load waits for; `cargo xtask console` prints it too.
    assert!(gz.len() <= 150_000, "the console's first module is {} bytes gzip, over 150 KB", gz.len());

    let plain = daemon.get(WASM).await?;
    assert!(plain.headers().get("content-encoding").is_none(), "no gzip unless asked");
    assert_eq!(plain.bytes().await?.len(), raw.len());

    let again = ask(WASM, "if-none-match", &etag).await?;
    assert_eq!(again.status(), 304);

    // The panels below the first screen: a module of their own, and the script that fetches it.
    let second = daemon.second_module().await?;
    let split = ask(&second, "accept-encoding", "gzip").await?;
    assert_eq!(split.headers()["content-type"], "application/wasm");
    assert_eq!(split.headers()["content-encoding"], "gzip");
    let split_gz = split.bytes().await?;
    let mut split_raw = Vec::new();
    flate2_decode(&split_gz, &mut split_raw)?;
    assert_eq!(&split_raw[..4], b"\0asm", "the second module decodes to a wasm module");
    println!("console wasm, the second module ({second}): {} bytes raw, {} gzip", split_raw.len(), split_gz.len());
    for (path, content_type) in [
        ("/pkg/ringside_frontend.js", "text/javascript"),
        ("/pkg/__wasm_split.js", "text/javascript"),
        ("/style.css", "text/css"),
        ("/favicon.svg", "image/svg+xml"),
    ] {
        let response = daemon.get(path).await?;
        assert_eq!(response.status(), 200, "{path}");
        assert!(response.headers()["content-type"].to_str()?.starts_with(content_type), "{path}");
    }
    assert_eq!(daemon.get("/no/such/file").await?.status(), 404);
    Ok(())
}

/// Decodes a gzip member with nothing but std (the tests do not need a gzip crate).
fn flate2_decode(gz: &[u8], out: &mut Vec<u8>) -> anyhow::Result<()> {
    let mut child = std::process::Command::new("gzip")
        .args(["-dc"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    // Written from a thread of its own while the output is read: gzip blocks on a full output
    // pipe (64 KiB) long before it has read a large input.
    let mut stdin = child.stdin.take().unwrap();
    let input = gz.to_vec();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        stdin.write_all(&input)
    });
    child.stdout.take().unwrap().read_to_end(out)?;
    writer.join().map_err(|_| anyhow::anyhow!("the writer thread panicked"))??;
    anyhow::ensure!(child.wait()?.success(), "gzip -d failed");
    Ok(())
}

#[tokio::test]
async fn snapshot_download_is_an_attachment_valid_against_the_schema() -> anyhow::Result<()> {
    let daemon = Daemon::start(DaemonOptions { config: LOW_MEMORY_THRESHOLDS.into(), ..DaemonOptions::default() })?;
    wait_for_ticks(&daemon, 3).await?;
    let response = daemon.get("/api/snapshot?download=1").await?;
    assert_eq!(response.status(), 200);
    let disposition = response.headers()["content-disposition"].to_str()?.to_string();
    let snapshot: serde_json::Value = response.json().await?;
    let host = snapshot["node"]["hostname"].as_str().unwrap();
    let prefix = format!("attachment; filename=\"ringside-snapshot-{host}-");
    assert!(disposition.starts_with(&prefix), "{disposition}");
    let stamp = disposition.trim_start_matches(&prefix).trim_end_matches(".json\"");
    assert_eq!(stamp.len(), 16, "UTC time as YYYYMMDDTHHMMSSZ: {stamp}");
    assert!(stamp.ends_with('Z') && stamp.as_bytes()[8] == b'T');

    let schema = daemon.get_json("/api/schema/snapshot").await?;
    let validator = jsonschema::validator_for(&schema)?;
    let errors: Vec<String> =
        validator.iter_errors(&snapshot).map(|e| format!("{e} at {}", e.instance_path())).collect();
    assert!(errors.is_empty(), "snapshot does not match its schema: {errors:#?}");
    assert!(snapshot["history"].as_array().unwrap().len() >= 3);
    assert!(!snapshot["alerts"].as_array().unwrap().is_empty(), "the low threshold raised an alert");
    // The schema has teeth: a snapshot with a wrong type fails it.
    let mut broken = snapshot.clone();
    broken["seq"] = serde_json::json!("three");
    assert!(!validator.is_valid(&broken));
    // Without ?download it is plain JSON.
    assert!(daemon.get("/api/snapshot").await?.headers().get("content-disposition").is_none());
    Ok(())
}

#[tokio::test]
async fn host_figures_alone_match_the_snapshot_and_their_schema() -> anyhow::Result<()> {
    let daemon = Daemon::start(DaemonOptions::default())?;
    wait_for_ticks(&daemon, 2).await?;
    let response = daemon.get("/api/host").await?;
    assert_eq!(response.headers()["cache-control"].to_str()?, "no-store");
    let body = response.bytes().await?;
    let now: ringside_shared::HostNow = serde_json::from_slice(&body)?;
    let host = now.host.as_ref().expect("host figures after two ticks");
    assert!(now.seq >= 2 && now.interval_ms > 0, "{now:?}");
    assert!(host.memory.total_bytes > 0 && (0.0..=100.0).contains(&host.cpu_utilization_pct), "{host:?}");
    // A few hundred bytes, where the snapshot is tens of kilobytes.
    let snapshot = daemon.get("/api/snapshot").await?.bytes().await?;
    let interval = serde_json::from_slice::<serde_json::Value>(&snapshot)?["interval_ms"].as_u64();
    assert_eq!(interval, Some(now.interval_ms));
    assert!(body.len() * 10 < snapshot.len(), "{} bytes against the snapshot's {}", body.len(), snapshot.len());
    let schema = daemon.get_json("/api/schema/host").await?;
    let validator = jsonschema::validator_for(&schema)?;
    let value: serde_json::Value = serde_json::from_slice(&body)?;
    assert!(validator.is_valid(&value), "{value}");
    assert!(!validator.is_valid(&serde_json::json!({"seq": 1, "taken_at_ms": 2, "interval_ms": "x", "host": null})));
    Ok(())
}

#[tokio::test]
async fn rest_acknowledgement_errors_are_clear() -> anyhow::Result<()> {
    let daemon = Daemon::start(DaemonOptions::default())?;
    let http = daemon.http();
    let post = |path: &str, body: &'static str| {
        http.post(format!("{}{path}", daemon.base))
            .bearer_auth(&daemon.token)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let missing = post("/api/alerts/424242/ack", "").await?;
    assert_eq!(missing.status(), 404);
    assert!(missing.text().await?.contains("424242"));
    assert_eq!(post("/api/alerts/abc/ack", "").await?.status(), 400);
    let bad = post("/api/alerts/1/ack", "{\"note\": 5}").await?;
    assert_eq!(bad.status(), 400);
    assert!(bad.text().await?.contains("note"));
    let big = http
        .post(format!("{}/api/alerts/1/ack", daemon.base))
        .bearer_auth(&daemon.token)
        .body(vec![b' '; 64 * 1024])
        .send()
        .await?;
    assert_eq!(big.status(), 413, "bodies are bounded");
    Ok(())
}

#[tokio::test]
async fn metrics_are_valid_prometheus_text() -> anyhow::Result<()> {
    let daemon = Daemon::start(DaemonOptions { config: LOW_MEMORY_THRESHOLDS.into(), ..DaemonOptions::default() })?;
    wait_for_ticks(&daemon, 2).await?;
    let response = daemon.get("/metrics").await?;
    assert!(response.headers()["content-type"].to_str()?.starts_with("text/plain; version=0.0.4"));
    let text = response.text().await?;

    // Every sample belongs to a declared family and has a numeric value.
    let mut declared = std::collections::HashSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            declared.insert(parts.next().unwrap().to_string());
            assert!(matches!(parts.next(), Some("gauge" | "counter")), "{line}");
        } else if !line.starts_with('#') && !line.is_empty() {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(declared.contains(name), "undeclared sample: {line}");
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok() || value == "NaN", "bad value: {line}");
        }
    }
    for name in [
        "ringside_host_cpu_utilization_ratio",
        "ringside_host_memory_used_bytes",
        "ringside_alerts_active",
        "ringside_ws_clients",
    ] {
        assert!(declared.contains(name), "missing {name}");
    }
    assert!(text.contains("ringside_alerts_active{severity=\"error\"} 1"), "the memory alert is counted:\n{text}");
    let canary = text
        .lines()
        .find(|l| l.starts_with("ringside_kernel_messages_processed_total{kernel=\"canary\",backend=\"cpu\"}"))
        .unwrap_or_else(|| panic!("the default canary kernel is exported:\n{text}"));
    assert!(canary.rsplit(' ').next().unwrap().parse::<f64>().unwrap() >= 1.0, "{canary}");

    // And Prometheus' own linter accepts it.
    ringside_tests::promtool_check(&text)?;
    Ok(())
}

#[tokio::test]
async fn a_generated_token_is_kept_private_in_the_data_dir_and_survives_a_restart() -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let scratch = ringside_tests::Scratch::new("token-kept");
    let data_dir = scratch.0.join("data");
    let options = || DaemonOptions { token: None, data_dir: Some(data_dir.clone()), ..DaemonOptions::default() };
    let mut first = Daemon::start(options())?;
    let mode = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.permissions().mode() & 0o777);
    assert_eq!(mode(&data_dir)?, 0o700, "the data dir is its owner's only");
    let token_file = data_dir.join("token");
    assert_eq!(mode(&token_file)?, 0o600);
    assert_eq!(std::fs::read_to_string(&token_file)?.trim(), first.token);
    assert!(first.terminate()?.success());
    // A data dir opened up by hand is closed again; the token is the same after the restart.
    std::fs::set_permissions(&data_dir, std::fs::Permissions::from_mode(0o755))?;
    let second = Daemon::start(options())?;
    assert_eq!(second.token, first.token, "the console URL survives a restart");
    assert_eq!(mode(&data_dir)?, 0o700);
    assert_eq!(second.get("/api/alerts").await?.status(), 200);
    Ok(())
}

#[test]
fn a_token_file_every_user_can_read_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let scratch = ringside_tests::Scratch::new("token-open");
    let tokens = scratch.0.join("tokens");
    std::fs::write(&tokens, "a-token-that-everyone-can-read-here\n").unwrap();
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o644)).unwrap();
    let output = std::process::Command::new(ringside_tests::daemon_binary())
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(scratch.0.join("data"))
        .arg("--token-file")
        .arg(&tokens)
        .env_remove("RINGSIDE_TOKEN")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("open to every user") && stderr.contains("chmod 600"), "{stderr}");
    assert!(!stderr.contains("a-token-that-everyone"), "the secret is never printed: {stderr}");
}

/// A token file that is a symbolic link, or that another user owns, is refused at start (a
/// user able to place either could choose the node's token); the secret is never printed.
#[test]
fn a_token_file_behind_a_link_or_of_another_user_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let scratch = ringside_tests::Scratch::new("token-owner");
    let tokens = scratch.0.join("tokens");
    std::fs::write(&tokens, "a-token-nobody-else-should-have-1234\n").unwrap();
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).unwrap();
    let start = |path: &std::path::Path| {
        let output = std::process::Command::new(ringside_tests::daemon_binary())
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(scratch.0.join("data"))
            .arg("--token-file")
            .arg(path)
            .env_remove("RINGSIDE_TOKEN")
            .output()
            .unwrap();
        (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
    };
    let link = scratch.0.join("link");
    std::os::unix::fs::symlink(&tokens, &link).unwrap();
    let (code, stderr) = start(&link);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("is a symbolic link"), "{stderr}");
    std::os::unix::fs::chown(&tokens, Some(65534), None).unwrap();
    let (code, stderr) = start(&tokens);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("owned by uid 65534"), "{stderr}");
    assert!(!stderr.contains("a-token-nobody-else"), "the secret is never printed: {stderr}");
}
