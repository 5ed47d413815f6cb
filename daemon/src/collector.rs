//! The collection loop: every interval it runs each metrics source once
//! ([`pipeline::collect_all`]) on a blocking-pool thread — sources read `/proc`, BPF maps and
//! ring kernels, and may wait, which the async runtime serving clients must never do — and
//! hands the sample to [`NodeState::apply_tick`], which keeps history, runs the alert check and
//! broadcasts the update.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::pipeline::{self, MetricsSource};
use crate::state::NodeState;

/// Runs until `shutdown` turns true, then drops the sources (which stop their threads) off the
/// async runtime too.
pub async fn run(state: Arc<NodeState>, sources: Vec<Box<dyn MetricsSource>>, mut shutdown: watch::Receiver<bool>) {
    let mut ticker = tokio::time::interval(Duration::from_millis(state.interval_ms()));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut sources = Some(sources);
    let mut attribution = crate::attribution::IdleAttribution::default();
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => break,
        }
        let Some(mut taken) = sources.take() else { break };
        let started = std::time::Instant::now();
        let tick = tokio::task::spawn_blocking(move || {
            let collected = pipeline::collect_all(&mut taken, crate::clock::now_ms());
            (taken, collected)
        });
        match tick.await {
            Ok((back, (mut sample, components, failures))) => {
                sources = Some(back);
                attribution.update(&mut sample);
                state.apply_tick(sample, components, &failures, started.elapsed());
            }
            Err(e) => {
                // The sources went down with the panicking thread: nothing is collected any more.
                tracing::error!("a metrics source panicked; collection stopped: {e}");
                return;
            }
        }
    }
    if let Some(sources) = sources {
        let _ = tokio::task::spawn_blocking(move || drop(sources)).await;
    }
}
