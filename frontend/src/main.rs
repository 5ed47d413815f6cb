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

/// A list of views, each as an `AnyView`. Leptos' list code (build, and the rebuild that matches
/// old items to new) is then one copy for every list of the console, where `collect_view` makes
/// one per item type: 23 KB of the wasm. A unit test keeps `collect_view` out.
pub trait CollectAny {
    fn collect_any(self) -> Vec<leptos::prelude::AnyView>;
}

impl<I: IntoIterator<Item = V>, V: leptos::prelude::IntoAny> CollectAny for I {
    fn collect_any(self) -> Vec<leptos::prelude::AnyView> {
        self.into_iter().map(V::into_any).collect()
    }
}

/// Marks a moment of the page's load (`performance.mark`), for `cargo xtask bench console`.
pub fn mark(name: &str) {
    if let Some(performance) = web_sys::window().and_then(|w| w.performance()) {
        let _ = performance.mark(name);
    }
}
