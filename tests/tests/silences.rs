//! Silences over the API: a silenced alert is raised and recorded but never reaches a real
//! Alertmanager while an unsilenced one does; expiry restores forwarding; a viewer cannot
//! silence; silences survive `kill -9`.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use ringside_tests::{Alertmanager, Daemon, DaemonOptions, Scratch};

/// Two rules over the machine's real memory use, firing after 2 s: `quiet` (to be silenced)
/// and `loud`.
const RULES: &str = "[[rules]]\nname = \"quiet\"\nmetric = \"host.memory_used_pct\"\nop = \">\"\nthreshold = 0.001\nfor = \"2s\"\nseverity = \"warning\"\n\n\
[[rules]]\nname = \"loud\"\nmetric = \"host.memory_used_pct\"\nop = \">\"\nthreshold = 0.001\nfor = \"2s\"\nseverity = \"warning\"\n";

/// The alert names Alertmanager holds now.
async fn received(manager: &Alertmanager) -> Result<Vec<String>> {
    let (status, body) = manager.get_with(None, "/api/v2/alerts").await?;
    ensure!(status == 200, "Alertmanager answered {status}: {body}");
    let alerts: serde_json::Value = serde_json::from_str(&body)?;
    Ok(alerts
        .as_array()
        .map(|a| a.iter().filter_map(|a| a["labels"]["alertname"].as_str().map(String::from)).collect())
        .unwrap_or_default())
}

#[tokio::test]
async fn a_silenced_alert_is_recorded_not_forwarded_and_forwarded_again_once_expired() -> Result<()> {
    let manager = Alertmanager::start("route:\n  receiver: nowhere\nreceivers:\n  - name: nowhere\n").await?;
    let operator = ringside_tests::random_token();
    let viewer = ringside_tests::random_token();
    let data = Scratch::new("silences-data");
    let options = || DaemonOptions {
        token: Some(operator.clone()),
        token_file: Some(format!("ana:{operator}:operator\nvic:{viewer}:viewer\n")),
        config: format!(
            "[scheduler]\nenabled = false\n[alertmanager]\nurl = \"{}\"\nresend_interval_ms = 1000\n\n{RULES}",
            manager.url
        ),
        data_dir: Some(data.0.clone()),
        ..DaemonOptions::default()
    };
    let mut daemon = Daemon::start(options())?;
    let silences = format!("{}/api/silences", daemon.base);
    let body = serde_json::json!({
        "matchers": [{ "name": "alertname", "value": "quiet" }],
        "duration_ms": 3_600_000,
        "comment": "noisy during the test",
    });
    // A viewer cannot silence.
    let refused = daemon.http().post(&silences).bearer_auth(&viewer).json(&body).send().await?;
    ensure!(refused.status() == 403, "a viewer's silence answered {}", refused.status());
    // Bad requests say what is wrong.
    let bad = serde_json::json!({ "matchers": [], "duration_ms": 1000 });
    let answer = daemon.http().post(&silences).bearer_auth(&operator).json(&bad).send().await?;
    ensure!(answer.status() == 400, "{}", answer.status());
    ensure!(answer.text().await?.contains("matchers"), "the reason names the matchers");

    let made = daemon.http().post(&silences).bearer_auth(&operator).json(&body).send().await?;
    ensure!(made.status() == 201, "creating the silence answered {}", made.status());
    let made: serde_json::Value = made.json().await?;
    let id = made["id"].as_u64().context("silence id")?;
    assert_eq!(made["created_by"], "ana");

    // Both alerts are raised and recorded; only `loud` reaches Alertmanager.
    let alerts = daemon
        .alerts_when("both rules firing", 20, |a| {
            ["quiet", "loud"].iter().all(|r| a.as_array().is_some_and(|a| a.iter().any(|x| x["rule"] == *r)))
        })
        .await?;
    let quiet = alerts.as_array().unwrap().iter().find(|a| a["rule"] == "quiet").unwrap().clone();
    assert_eq!(quiet["silenced"]["silence_id"], id, "{quiet}");
    assert_eq!(quiet["silenced"]["by"], "ana");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !received(&manager).await?.contains(&"loud".to_string()) {
        ensure!(Instant::now() < deadline, "the unsilenced alert did not reach Alertmanager within 20 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Several resend intervals later, the silenced one has still not been sent.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let names = received(&manager).await?;
    ensure!(!names.contains(&"quiet".to_string()), "a silenced alert reached Alertmanager: {names:?}");
    let listed = daemon.get_json("/api/silences").await?;
    assert_eq!(listed[0]["id"], id, "{listed}");
    assert_eq!(listed[0]["matching_alerts"], 1, "{listed}");

    // kill -9 and start again: the silence is still there and still holds.
    daemon.kill_hard()?;
    let daemon = Daemon::start(options())?;
    let listed = daemon.get_json("/api/silences").await?;
    assert_eq!((listed[0]["id"].as_u64(), listed[0]["comment"].as_str()), (Some(id), Some("noisy during the test")));
    daemon
        .alerts_when("quiet silenced after the restart", 20, |a| {
            a.as_array().is_some_and(|a| a.iter().any(|x| x["rule"] == "quiet" && x["silenced"]["silence_id"] == id))
        })
        .await?;

    // A viewer cannot expire it either; the operator can, and forwarding resumes.
    let url = format!("{}/api/silences/{id}", daemon.base);
    let refused = daemon.http().delete(&url).bearer_auth(&viewer).send().await?;
    ensure!(refused.status() == 403, "a viewer's expiry answered {}", refused.status());
    let expired = daemon.http().delete(&url).bearer_auth(&operator).send().await?;
    ensure!(expired.status() == 200, "expiring answered {}", expired.status());
    let expired: serde_json::Value = expired.json().await?;
    assert_eq!(expired["expired_by"], "ana");
    let again = daemon.http().delete(&url).bearer_auth(&operator).send().await?;
    ensure!(again.status() == 409, "a second expiry answered {}", again.status());
    let deadline = Instant::now() + Duration::from_secs(20);
    while !received(&manager).await?.contains(&"quiet".to_string()) {
        ensure!(Instant::now() < deadline, "the alert did not reach Alertmanager within 20 s of the expiry");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let alerts = daemon.get_json("/api/alerts").await?;
    let quiet = alerts.as_array().unwrap().iter().find(|a| a["rule"] == "quiet").unwrap();
    assert!(quiet.get("silenced").is_none(), "{quiet}");
    Ok(())
}

#[tokio::test]
async fn a_maintenance_window_in_force_silences_what_it_matches() -> Result<()> {
    // Every day, from the start of this minute (UTC) for an hour: in force now.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let start = format!("{:02}:{:02}", now / 3600 % 24, now / 60 % 60);
    let window = format!(
        "[[maintenance]]\nname = \"patching\"\ndays = [\"mon\", \"tue\", \"wed\", \"thu\", \"fri\", \"sat\", \"sun\"]\nstart = \"{start}\"\nduration = \"1h\"\ntime_zone = \"UTC\"\nmatchers = {{ alertname = \"quiet\" }}\n"
    );
    let daemon = Daemon::start(DaemonOptions {
        config: format!("[scheduler]\nenabled = false\n{RULES}\n{window}"),
        ..DaemonOptions::default()
    })?;
    let alerts = daemon
        .alerts_when("both rules firing", 20, |a| {
            ["quiet", "loud"].iter().all(|r| a.as_array().is_some_and(|a| a.iter().any(|x| x["rule"] == *r)))
        })
        .await?;
    let by_rule = |rule: &str| alerts.as_array().unwrap().iter().find(|a| a["rule"] == rule).unwrap().clone();
    assert_eq!(by_rule("quiet")["silenced"]["maintenance"], "patching", "{alerts}");
    assert!(by_rule("loud").get("silenced").is_none(), "{alerts}");
    let listed = daemon.get_json("/api/silences").await?;
    assert_eq!(listed[0]["maintenance"], "patching", "{listed}");
    assert_eq!(listed[0]["matching_alerts"], 1, "{listed}");
    Ok(())
}
