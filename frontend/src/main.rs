//! Ringside's console: a Leptos app (client-side rendered, compiled to WebAssembly) that shows
//! one node live over the daemon's WebSocket.

mod alerts;
mod app;
mod chart;
mod connection;
mod format;
mod gpus;
mod jobs;
mod kernels;
mod scheduler;
mod store;
mod timeline;

fn main() {
    leptos::mount::mount_to_body(app::App);
}
