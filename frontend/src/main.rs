//! Ringside's console: a Leptos app (client-side rendered, compiled to WebAssembly) that shows
//! one node live over the daemon's WebSocket.

mod alerts;
mod chart;
mod connection;
mod kernels;
mod scheduler;
mod store;
mod views;

fn main() {
    leptos::mount::mount_to_body(views::App);
}
