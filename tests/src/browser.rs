//! Headless Chromium through ChromeDriver, for the console's tests: the driver, a browser
//! session, and the waits and reads the tests share.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use fantoccini::{Client, ClientBuilder, Locator};

use crate::workspace_root;

pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
pub const CHROMIUM: &str = "/usr/bin/chromium";

/// ChromeDriver on a free port; killed on drop, also when the test fails.
pub struct Driver(Child, u16);

impl Driver {
    pub fn start() -> Result<Driver> {
        for path in [CHROMEDRIVER, CHROMIUM] {
            anyhow::ensure!(
                Path::new(path).exists(),
                "{path} is missing: `cargo xtask setup --test` installs chromium and chromium-driver"
            );
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start chromedriver")?;
        let driver = Driver(child, port);
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                bail!("chromedriver did not listen within 20 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(driver)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub async fn browser(driver: &Driver, profile: &Path, downloads: &Path) -> Result<Client> {
    let capabilities = serde_json::json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": CHROMIUM,
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1400,1500",
                format!("--user-data-dir={}", profile.display()),
            ],
            "prefs": {
                "download.default_directory": downloads.display().to_string(),
                "download.prompt_for_download": false,
                "download.directory_upgrade": true,
            },
        },
    });
    let serde_json::Value::Object(capabilities) = capabilities else { unreachable!() };
    let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(capabilities)
        .connect(&format!("http://127.0.0.1:{}", driver.1))
        .await
        .context("cannot open a Chromium session")?;
    Ok(client)
}

/// Polls `check` until it returns something, or fails after `timeout` naming `what`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last_error = None;
    loop {
        match check().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(e) => last_error = Some(e),
        }
        if Instant::now() > deadline {
            bail!("{what} did not happen within {timeout:?} (last error: {last_error:?})");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub async fn text_of(client: &Client, css: &str) -> Result<Option<String>> {
    match client.find(Locator::Css(css)).await {
        Ok(element) => Ok(Some(element.text().await?)),
        Err(_) => Ok(None),
    }
}

/// Whether one of the chart lines matching `css` joins at least three points.
pub async fn draws_a_line(client: &Client, css: &str) -> Result<Option<()>> {
    Ok((segments(client, css).await? >= 2).then_some(()))
}

/// The most line segments (`L` commands) in the `d` of any path matching `css`. Read in one
/// script: a view drawn again each tick replaces its elements, and one found, then read, could
/// be gone by then.
pub async fn segments(client: &Client, css: &str) -> Result<u64> {
    let script = "return Math.max(0, ...Array.from(document.querySelectorAll(arguments[0])) \
                  .map((p) => (p.getAttribute('d') || '').split('L').length - 1));";
    Ok(client.execute(script, vec![css.into()]).await?.as_u64().unwrap_or(0))
}

/// Picks the last 15 minutes in the range bar, waits until `bands` (the min..max bands of a
/// chart drawn from the daemon's history) draw, then goes back to live.
pub async fn draws_history_bands(client: &Client, what: &str, bands: &str) -> Result<()> {
    client.find(Locator::XPath("//nav[@id='rangebar']//button[text()='15 min']")).await?.click().await?;
    eventually(what, Duration::from_secs(30), || async { Ok((segments(client, bands).await? >= 1).then_some(())) })
        .await?;
    client.find(Locator::XPath("//nav[@id='rangebar']//button[text()='Live']")).await?.click().await?;
    Ok(())
}

/// Closes the browser, with a screenshot `<name>.png` among the artifacts if the test failed.
pub async fn close(client: Client, failed: bool, name: &str) {
    if failed {
        if let Ok(png) = client.screenshot().await {
            let _ = std::fs::write(artifacts().join(format!("{name}.png")), png);
        }
    }
    let _ = client.close().await;
}

pub fn artifacts() -> PathBuf {
    let dir = workspace_root().join("artifacts");
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// A Chrome DevTools Protocol command, sent through ChromeDriver (`goog/cdp/execute`).
#[derive(Debug)]
pub struct Cdp {
    pub cmd: &'static str,
    pub params: serde_json::Value,
}

impl fantoccini::wd::WebDriverCompatibleCommand for Cdp {
    fn endpoint(&self, base_url: &url::Url, session_id: Option<&str>) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!("session/{}/goog/cdp/execute", session_id.unwrap_or_default()))
    }

    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(serde_json::json!({ "cmd": self.cmd, "params": self.params }).to_string()))
    }
}
