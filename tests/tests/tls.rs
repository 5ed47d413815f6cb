//! HTTPS end to end: the real daemon serving a certificate made here with `openssl`, spoken to
//! by a rustls client that trusts exactly that certificate — the API, the console's cookie,
//! the WebSocket and `/metrics` — and refused where it must be: plain HTTP to the TLS port, a
//! client that does not trust the certificate, a key file other users can read, half a pair;
//! connections that never begin their handshake are evicted past the cap like any other.

use std::process::Command;

use anyhow::{ensure, Context, Result};
use futures_util::StreamExt;
use ringside_tests::{certificate, daemon_binary, https, tls_connector as connector, Daemon, DaemonOptions, Scratch};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn get(path: &str, token: Option<&str>) -> String {
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Connection: close\r\n\r\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_console_api_websocket_and_metrics_are_served_over_https_only() -> Result<()> {
    let dir = Scratch::new("tls");
    let (cert, key) = certificate(&dir.0)?;
    let daemon = Daemon::start(DaemonOptions {
        config: format!("tls_cert_file = {:?}\ntls_key_file = {:?}\n", cert, key),
        // Not loopback: allowed without --allow-plain-http, since the traffic is encrypted.
        listen: "0.0.0.0:0".into(),
        ..DaemonOptions::default()
    })?;
    ensure!(daemon.base.starts_with("https://"), "announced as {}", daemon.base);
    let addr = daemon.addr.clone();
    let trusted = connector(Some(&cert))?;

    let snapshot = https(&trusted, &addr, &get("/api/snapshot", Some(&daemon.token))).await?;
    ensure!(snapshot.starts_with("HTTP/1.1 200"), "{}", &snapshot[..snapshot.len().min(300)]);
    ensure!(snapshot.contains("\"schema_version\""), "a snapshot");
    let refused = https(&trusted, &addr, &get("/api/snapshot", None)).await?;
    ensure!(refused.starts_with("HTTP/1.1 401"), "still needs the token: {refused}");
    // The console's session cookie is never sent over plain HTTP.
    let console = https(&trusted, &addr, &get(&format!("/?token={}", daemon.token), None)).await?;
    let cookie = console.lines().find(|l| l.to_ascii_lowercase().starts_with("set-cookie:")).unwrap_or_default();
    ensure!(cookie.contains("HttpOnly") && cookie.contains("; Secure"), "{cookie}");

    // The WebSocket, over the same TLS: the session opens with its hello.
    let tcp = tokio::net::TcpStream::connect(&addr).await?;
    let tls = trusted.connect(ServerName::try_from("127.0.0.1")?.to_owned(), tcp).await?;
    let request = http_request(&format!("wss://{addr}/ws"), &daemon.token)?;
    let (mut socket, _) = tokio_tungstenite::client_async(request, tls).await?;
    let first = tokio::time::timeout(std::time::Duration::from_secs(10), socket.next())
        .await?
        .context("closed")??
        .into_text()?;
    ensure!(first.starts_with("{\"type\":\"hello\""), "{}", &first[..first.len().min(200)]);

    // `ringsided snapshot` over HTTPS, trusting the certificate given.
    let cli = Command::new(daemon_binary())
        .args(["snapshot", "--url", &daemon.base, "--ca-file"])
        .arg(&cert)
        .env("RINGSIDE_TOKEN", &daemon.token)
        .output()?;
    ensure!(cli.status.success(), "{}", String::from_utf8_lossy(&cli.stderr));
    ensure!(String::from_utf8_lossy(&cli.stdout).contains("\"schema_version\""));
    let untrusted = Command::new(daemon_binary())
        .args(["snapshot", "--url", &daemon.base])
        .env("RINGSIDE_TOKEN", &daemon.token)
        .output()?;
    let stderr = String::from_utf8_lossy(&untrusted.stderr);
    ensure!(!untrusted.status.success() && stderr.contains("certificate"), "{stderr}");

    // Plain HTTP to the TLS port gets no HTTP answer, and is counted.
    let mut plain = tokio::net::TcpStream::connect(&addr).await?;
    plain.write_all(get("/healthz", None).as_bytes()).await?;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), plain.read_to_end(&mut answer)).await;
    ensure!(!String::from_utf8_lossy(&answer).contains("HTTP/1.1 200"), "plain HTTP was served");
    // A client that does not trust the certificate does not get through.
    let untrusting = connector(None)?;
    ensure!(https(&untrusting, &addr, &get("/healthz", None)).await.is_err(), "an unknown certificate was accepted");
    let metrics = https(&trusted, &addr, &get("/metrics", Some(&daemon.token))).await?;
    let failures = metrics
        .lines()
        .find_map(|l| l.strip_prefix("ringside_tls_handshake_failures_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .context("the handshake failure counter")?;
    ensure!(failures >= 2.0, "both refused handshakes counted: {failures}");
    Ok(())
}

/// Connections that never begin their TLS handshake cannot hold the daemon either: past the cap
/// each new one evicts the oldest, which is closed at once, mid-handshake or not, and the
/// accept loop (which waits for an evicted socket to close) goes on at once.
#[tokio::test(flavor = "multi_thread")]
async fn connections_that_never_begin_their_handshake_are_evicted_at_once() -> Result<()> {
    let dir = Scratch::new("tls-evict");
    let (cert, key) = certificate(&dir.0)?;
    let daemon = Daemon::start(DaemonOptions {
        config: format!(
            "tls_cert_file = {cert:?}\ntls_key_file = {key:?}\n\n[scheduler]\nenabled = false\n\n\
             [server]\nmax_connections = 8\nmax_connections_per_address = 8\nheader_read_timeout_ms = 30000\n"
        ),
        listen: "0.0.0.0:0".into(),
        ..DaemonOptions::default()
    })?;
    let started = std::time::Instant::now();
    let mut idle = Vec::new();
    for _ in 0..100 {
        idle.push(tokio::net::TcpStream::connect(&daemon.addr).await?);
    }
    let trusted = connector(Some(&cert))?;
    let health =
        tokio::time::timeout(std::time::Duration::from_secs(10), https(&trusted, &daemon.addr, &get("/healthz", None)))
            .await
            .context("/healthz unanswered 10 s after 100 idle connections")??;
    // Answered: 200, or 503 while a component is not up yet (the point is that it answers).
    ensure!(health.starts_with("HTTP/1.1 "), "{}", &health[..health.len().min(200)]);
    // Closed by eviction, not by the handshake timeout (30 s): all but the newest few.
    let mut closed = 0;
    let mut buf = [0u8; 64];
    for stream in &mut idle {
        match tokio::time::timeout(std::time::Duration::from_millis(200), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => closed += 1,
            _ => {}
        }
    }
    ensure!(started.elapsed() < std::time::Duration::from_secs(30), "too slow to tell eviction from the timeout");
    ensure!(closed >= 100 - 8, "{closed} of 100 idle connections closed by the daemon");
    Ok(())
}

fn http_request(url: &str, token: &str) -> Result<tokio_tungstenite::tungstenite::http::Request<()>> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = url.into_client_request()?;
    request.headers_mut().insert("authorization", format!("Bearer {token}").parse()?);
    Ok(request)
}

#[test]
fn a_key_others_can_read_or_half_a_pair_stops_the_daemon_with_the_reason() -> Result<()> {
    let dir = Scratch::new("tls-refused");
    let (cert, key) = certificate(&dir.0)?;
    let start = |args: &[&std::ffi::OsStr]| -> Result<(bool, String)> {
        let out = Command::new(daemon_binary())
            .arg("--data-dir")
            .arg(dir.0.join("data"))
            .args(args)
            .env("RINGSIDE_TOKEN", ringside_tests::random_token())
            .output()?;
        Ok((out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned()))
    };
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644))?;
    let loopback: &std::ffi::OsStr = "127.0.0.1:0".as_ref();
    let (ok, stderr) = start(&[
        "--listen".as_ref(),
        loopback,
        "--tls-cert".as_ref(),
        cert.as_os_str(),
        "--tls-key".as_ref(),
        key.as_os_str(),
    ])?;
    ensure!(!ok && stderr.contains("key.pem") && stderr.contains("chmod 600"), "{stderr}");
    let (ok, stderr) = start(&["--listen".as_ref(), loopback, "--tls-cert".as_ref(), cert.as_os_str()])?;
    ensure!(!ok && stderr.contains("--tls-key"), "{stderr}");
    // Without TLS, a non-loopback address is still refused, now pointing at TLS.
    let (ok, stderr) = start(&["--listen".as_ref(), "0.0.0.0:0".as_ref()])?;
    ensure!(!ok && stderr.contains("--tls-cert"), "{stderr}");
    Ok(())
}

/// The certificate the server presents to a client that trusts `cert`.
async fn served_certificate(addr: &str, cert: &std::path::Path) -> Result<Vec<u8>> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let tls = connector(Some(cert))?.connect(ServerName::try_from("127.0.0.1")?.to_owned(), tcp).await?;
    let (_, session) = tls.get_ref();
    Ok(session.peer_certificates().and_then(|c| c.first()).context("no certificate")?.to_vec())
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_serves_a_renewed_certificate_and_keeps_the_old_one_when_the_new_is_broken() -> Result<()> {
    let dir = Scratch::new("tls-reload");
    let (cert, key) = certificate(&dir.0)?;
    let daemon = Daemon::start(DaemonOptions {
        config: format!("tls_cert_file = {:?}\ntls_key_file = {:?}\n", cert, key),
        ..DaemonOptions::default()
    })?;
    let first = served_certificate(&daemon.addr, &cert).await?;
    // Renewed in place, as certbot or an operator would: a new pair in the same files.
    let renewed = Scratch::new("tls-renewed");
    let (new_cert, new_key) = certificate(&renewed.0)?;
    std::fs::copy(&new_cert, &cert)?;
    std::fs::copy(&new_key, &key)?;
    let hup = |pid: u32| Command::new("kill").args(["-HUP", &pid.to_string()]).status();
    ensure!(hup(daemon.pid())?.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let second = loop {
        // Trusting the new certificate: a handshake with the old one fails until the reload.
        if let Ok(served) = served_certificate(&daemon.addr, &new_cert).await {
            break served;
        }
        ensure!(std::time::Instant::now() < deadline, "still the first certificate after SIGHUP");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    ensure!(second != first);
    // A broken renewal: the daemon keeps serving the pair it has, and says why.
    std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n")?;
    ensure!(hup(daemon.pid())?.success());
    let trusted = connector(Some(&new_cert))?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let health = https(&trusted, &daemon.addr, &get("/healthz", Some(&daemon.token))).await?;
        if health.contains("reload failed") {
            ensure!(health.contains("\"name\":\"tls\"") && health.contains("degraded"), "{health}");
            break;
        }
        ensure!(std::time::Instant::now() < deadline, "no failed reload reported: {health}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    ensure!(served_certificate(&daemon.addr, &new_cert).await? == second, "the renewed pair stays in use");
    Ok(())
}
