//! The sign a test or benchmark gives a workload to start: a file appearing (once the daemon
//! has found and probed the process). Shared by the workload's binaries.

use std::path::Path;
use std::time::{Duration, Instant};

/// Waits until `go` exists, at most a minute; no file to wait for: at once.
pub fn wait_for(go: Option<&Path>) -> Result<(), String> {
    let Some(go) = go else { return Ok(()) };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !go.exists() {
        if Instant::now() > deadline {
            return Err(format!("{} did not appear within a minute", go.display()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}
