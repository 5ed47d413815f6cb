//! The collection loop: every interval it runs each metrics source once
//! ([`pipeline::collect_all`]) on a blocking-pool thread — sources read `/proc`, BPF maps and
//! ring kernels, and may wait, which the async runtime serving clients must never do — and
//! hands the sample to [`NodeState::apply_tick`], which keeps history, runs the alert check and
//! broadcasts the update.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use ringside_shared::ComponentStatus;

use crate::pipeline::{self, Component, MetricsSource};
use crate::state::NodeState;

/// The collection loop's name in health, once a tick has gone wrong.
const COMPONENT: Component = Component::Collector;

/// Runs until `shutdown` turns true, then drops the sources (which stop their threads) off the
/// async runtime too.
pub async fn run(state: Arc<NodeState>, sources: Vec<Box<dyn MetricsSource>>, mut shutdown: watch::Receiver<bool>) {
    let mut ticker = tokio::time::interval(Duration::from_millis(state.interval_ms()));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut sources = Some(sources);
    let mut attribution = crate::attribution::IdleAttribution::default();
    let mut panicked = false;
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
                // A panic folding the tick in (a bug) costs that tick: said in health, and the
                // next tick is tried as usual.
                let applied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    attribution.update(&mut sample);
                    state.apply_tick(sample, components, &failures, started.elapsed());
                }));
                match applied {
                    Ok(()) if panicked => {
                        panicked = false;
                        state.set_health(COMPONENT, ComponentStatus::Up, None);
                    }
                    Ok(()) => {}
                    Err(panic) => {
                        let what = crate::pipeline::panic_message(panic.as_ref()).to_string();
                        tracing::error!("a collection tick panicked: {what}; the next tick is tried");
                        let why = format!("a tick panicked: {what}; collecting on");
                        state.set_health(COMPONENT, ComponentStatus::Degraded, Some(why));
                        panicked = true;
                    }
                }
            }
            Err(e) => {
                // The sources went down with the panicking thread (each source's own panics are
                // caught in `collect_all`: this is the loop itself): nothing can be collected.
                tracing::error!("the collection loop panicked; collection stopped: {e}");
                state.set_health(COMPONENT, ComponentStatus::Down, Some(format!("collection stopped: {e}")));
                return;
            }
        }
    }
    if let Some(sources) = sources {
        let _ = tokio::task::spawn_blocking(move || drop(sources)).await;
    }
}
