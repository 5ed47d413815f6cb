//! Ringside's console: a Leptos app (client-side rendered, compiled to WebAssembly) that shows
//! one node live over the daemon's WebSocket.

mod alerts;
mod app;
mod chart;
mod connection;
mod format;
mod frame;
mod gpus;
mod jobs;
mod kernels;
mod scheduler;
mod store;
mod timeline;

fn main() {
    // The page painted before the WebAssembly arrived makes way for the console.
    if let Some(shell) = web_sys::window().and_then(|w| w.document()).and_then(|d| d.get_element_by_id("shell")) {
        shell.remove();
    }
    leptos::mount::mount_to_body(app::App);
}

/// Marks a moment of the page's load (`performance.mark`), for `cargo xtask bench console`.
pub fn mark(name: &str) {
    if let Some(performance) = web_sys::window().and_then(|w| w.performance()) {
        let _ = performance.mark(name);
    }
}
