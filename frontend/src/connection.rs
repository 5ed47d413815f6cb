//! The WebSocket to the daemon: connects, feeds every frame to the [`Store`], and reconnects by
//! itself with exponential backoff (1 s doubling to 30 s, with jitter) when the link drops.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use leptos::prelude::*;
use ringside_shared::ClientCommand;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{CloseEvent, MessageEvent, WebSocket};

use crate::store::{Connection, Store};

const MAX_BACKOFF_S: u32 = 30;

struct Live {
    socket: WebSocket,
    // Kept alive as long as the socket may call them.
    _on_open: Closure<dyn FnMut()>,
    _on_message: Closure<dyn FnMut(MessageEvent)>,
    _on_close: Closure<dyn FnMut(CloseEvent)>,
}

/// The console's one connection, shared by the components that send commands.
pub type LinkHandle = leptos::prelude::StoredValue<Link, leptos::prelude::LocalStorage>;

/// Owns the current socket; cloning shares it.
#[derive(Clone)]
pub struct Link {
    store: Store,
    live: Rc<RefCell<Option<Live>>>,
    attempt: Rc<RefCell<u32>>,
}

fn ws_url() -> Result<String, String> {
    let location = window().location();
    let protocol = location.protocol().map_err(|_| "no page location".to_string())?;
    let host = location.host().map_err(|_| "no page host".to_string())?;
    let scheme = if protocol == "https:" { "wss" } else { "ws" };
    Ok(format!("{scheme}://{host}/ws"))
}

impl Link {
    pub fn start(store: Store) -> Link {
        let link = Link { store, live: Rc::new(RefCell::new(None)), attempt: Rc::new(RefCell::new(0)) };
        link.connect();
        link
    }

    /// Sends a command as one JSON text frame; false when not connected.
    pub fn send(&self, command: &ClientCommand) -> bool {
        let Ok(text) = serde_json::to_string(command) else { return false };
        match self.live.borrow().as_ref() {
            Some(live) if live.socket.ready_state() == WebSocket::OPEN => live.socket.send_with_str(&text).is_ok(),
            _ => false,
        }
    }

    fn connect(&self) {
        let attempt = {
            let mut attempt = self.attempt.borrow_mut();
            *attempt += 1;
            *attempt
        };
        self.store.connection.set(Connection::Connecting { attempt });
        let socket = match ws_url().and_then(|url| WebSocket::new(&url).map_err(|e| crate::format::js_error(&e))) {
            Ok(socket) => socket,
            Err(why) => return self.retry_later(why),
        };

        let store = self.store;
        let attempts = self.attempt.clone();
        let on_open = Closure::<dyn FnMut()>::new(move || {
            *attempts.borrow_mut() = 0;
            store.connection.set(Connection::Live);
        });
        let on_message = Closure::<dyn FnMut(MessageEvent)>::new(move |event: MessageEvent| {
            let Some(text) = event.data().as_string() else {
                return;
            };
            match crate::frame::decode(&text) {
                Ok(message) => store.apply(message),
                Err(e) => store.server_error.set(Some(format!("could not read a message from the daemon: {e}"))),
            }
        });
        let link = self.clone();
        let on_close = Closure::<dyn FnMut(CloseEvent)>::new(move |event: CloseEvent| {
            let why = match (event.code(), event.reason()) {
                (1001, reason) if !reason.is_empty() => reason,
                (1006, _) => "the daemon cannot be reached (stopped, restarting, or the token was refused)".to_string(),
                (code, reason) if reason.is_empty() => format!("connection closed (code {code})"),
                (code, reason) => format!("connection closed (code {code}): {reason}"),
            };
            link.retry_later(why);
        });
        socket.set_onopen(Some(on_open.as_ref().unchecked_ref()));
        socket.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
        socket.set_onclose(Some(on_close.as_ref().unchecked_ref()));
        let previous = self.live.borrow_mut().replace(Live {
            socket,
            _on_open: on_open,
            _on_message: on_message,
            _on_close: on_close,
        });
        if let Some(old) = previous {
            detach(&old.socket);
        }
    }

    fn retry_later(&self, why: String) {
        if let Some(old) = self.live.borrow_mut().take() {
            detach(&old.socket);
            // Dropping the closures later: the browser may still be inside one of them now.
            let keep = RefCell::new(Some(old));
            set_timeout(move || drop(keep.take()), Duration::from_millis(0));
        }
        let attempt = (*self.attempt.borrow()).max(1);
        let base = 1u32 << (attempt - 1).min(5);
        let jitter = (js_sys::Math::random() * 0.3 + 0.85) as f32;
        let delay_s = ((base.min(MAX_BACKOFF_S) as f32) * jitter).round().max(1.0) as u32;
        self.countdown(attempt, delay_s, why);
    }

    /// Shows the seconds left before the next attempt, then reconnects.
    fn countdown(&self, attempt: u32, left_s: u32, why: String) {
        if left_s == 0 {
            return self.connect();
        }
        self.store.connection.set(Connection::Waiting { attempt, retry_in_s: left_s, why: why.clone() });
        let link = self.clone();
        set_timeout(move || link.countdown(attempt, left_s - 1, why), Duration::from_secs(1));
    }
}

fn detach(socket: &WebSocket) {
    socket.set_onopen(None);
    socket.set_onmessage(None);
    socket.set_onclose(None);
    let _ = socket.close();
}
