//! The console's time and place: live or a fixed range (shared by every chart), the crosshair
//! every chart draws at the same moment, the range bar, and the address that holds the view
//! (`?from=&to=&panel=&gpu=&job=&theme=`), so that a link reopens it and the browser's back and
//! forward move between views.

use leptos::prelude::*;
use ringside_shared::percent_encode;
use wasm_bindgen::{JsCast, JsValue};

use crate::CollectAny;

/// What the charts show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Range {
    /// The live feed (the last minutes the console holds), moving with each tick.
    Live,
    /// A fixed range, Unix ms, from the daemon's history.
    Fixed { from_ms: u64, to_ms: u64 },
}

/// The presets of the range bar: label, span.
const PRESETS: [(&str, u64); 5] =
    [("15 min", 900_000), ("1 h", 3_600_000), ("6 h", 21_600_000), ("24 h", 86_400_000), ("7 days", 604_800_000)];

/// The shortest range a zoom may make.
const MIN_SPAN_MS: u64 = 10_000;
/// The longest range the daemon keeps.
const MAX_SPAN_MS: u64 = 7 * 86_400_000;

#[derive(Clone, Copy)]
pub struct Timeline {
    pub range: RwSignal<Range>,
    /// The time under the pointer on any chart: every chart draws its crosshair there.
    pub hover_ms: RwSignal<Option<u64>>,
    /// The panel the view is about (`host`, `alerts`, `scheduler`, `gpus`, `kernels`).
    pub panel: RwSignal<Option<String>>,
    pub gpu: RwSignal<Option<u32>>,
    pub job: RwSignal<Option<String>>,
    pub theme: RwSignal<String>,
    /// The view names a panel, GPU or job that was not drawn yet when it was to be scrolled to.
    unscrolled: RwSignal<bool>,
}

/// The view an address holds.
#[derive(Debug, Clone, Default, PartialEq)]
struct Place {
    range: Option<(u64, u64)>,
    panel: Option<String>,
    gpu: Option<u32>,
    job: Option<String>,
    theme: Option<String>,
}

impl Place {
    fn parse(search: &str) -> Place {
        let mut place = Place::default();
        let (mut from, mut to) = (None, None);
        for pair in search.trim_start_matches('?').split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = decode(value);
            match key {
                "from" => from = value.parse::<u64>().ok(),
                "to" => to = value.parse::<u64>().ok(),
                "panel" if PANELS.contains(&value.as_str()) => place.panel = Some(value),
                "gpu" => place.gpu = value.parse().ok(),
                "job" if !value.is_empty() && value.len() <= 128 => place.job = Some(value),
                "theme" if matches!(value.as_str(), "auto" | "dark" | "light") => place.theme = Some(value),
                _ => {}
            }
        }
        if let (Some(from), Some(to)) = (from, to) {
            if from < to && to - from <= MAX_SPAN_MS + 86_400_000 {
                place.range = Some((from, to));
            }
        }
        place
    }

    fn search(&self) -> String {
        let mut parts = Vec::new();
        if let Some((from, to)) = self.range {
            parts.push(format!("from={from}"));
            parts.push(format!("to={to}"));
        }
        if let Some(p) = &self.panel {
            parts.push(format!("panel={}", percent_encode(p)));
        }
        if let Some(g) = self.gpu {
            parts.push(format!("gpu={g}"));
        }
        if let Some(j) = &self.job {
            parts.push(format!("job={}", percent_encode(j)));
        }
        if let Some(t) = self.theme.as_ref().filter(|t| *t != "auto") {
            parts.push(format!("theme={t}"));
        }
        if parts.is_empty() {
            String::new()
        } else {
            format!("?{}", parts.join("&"))
        }
    }
}

/// `%XX` escapes (and `+`) undone; what is not UTF-8 afterwards is replaced.
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The panels a view may name, by their section ids (`<name>-panel`).
pub const PANELS: [&str; 5] = ["host", "alerts", "scheduler", "gpus", "kernels"];

/// Sets the address to `search` (a step of the browser's history where `push`), unless it
/// says that already.
fn write_address(search: &str, push: bool) {
    if search == location_search() {
        return;
    }
    let url = if search.is_empty() { "/".to_string() } else { format!("/{search}") };
    if let Some(history) = web_sys::window().and_then(|w| w.history().ok()) {
        let _ = if push {
            history.push_state_with_url(&JsValue::NULL, "", Some(&url))
        } else {
            history.replace_state_with_url(&JsValue::NULL, "", Some(&url))
        };
    }
}

fn location_search() -> String {
    web_sys::window().and_then(|w| w.location().search().ok()).unwrap_or_default()
}

impl Timeline {
    /// The view the address holds (the theme remembered in this browser where it holds none),
    /// kept in the address from now on.
    pub fn start() -> Timeline {
        let place = Place::parse(&location_search());
        let saved = crate::store::storage().and_then(|s| s.get_item("ringside-theme").ok().flatten());
        let timeline = Timeline {
            range: RwSignal::new(Range::Live),
            hover_ms: RwSignal::new(None),
            panel: RwSignal::new(None),
            gpu: RwSignal::new(None),
            job: RwSignal::new(None),
            theme: RwSignal::new(saved.unwrap_or_else(|| "auto".into())),
            unscrolled: RwSignal::new(false),
        };
        timeline.go_to(place);
        // Each change of view is a step of the browser's history; a step back or forward (or
        // an address opened) is a change of view, and not a step again.
        Effect::new(move |_| {
            let place = timeline.place();
            write_address(&place.search(), true);
        });
        // What the address left out (the theme of an address without one) stays as it is, and
        // the address is made to say so, in place.
        let _ = window_event_listener(leptos::ev::popstate, move |_| {
            timeline.go_to(Place::parse(&location_search()));
            write_address(&timeline.place_untracked().search(), false);
        });
        timeline
    }

    fn place(&self) -> Place {
        self.range.track();
        self.panel.track();
        self.gpu.track();
        self.job.track();
        self.theme.track();
        self.place_untracked()
    }

    fn place_untracked(&self) -> Place {
        Place {
            range: match self.range.get_untracked() {
                Range::Live => None,
                Range::Fixed { from_ms, to_ms } => Some((from_ms, to_ms)),
            },
            panel: self.panel.get_untracked(),
            gpu: self.gpu.get_untracked(),
            job: self.job.get_untracked(),
            theme: Some(self.theme.get_untracked()),
        }
    }

    fn go_to(&self, place: Place) {
        self.range.set(match place.range {
            Some((from_ms, to_ms)) => Range::Fixed { from_ms, to_ms },
            None => Range::Live,
        });
        let moved = self.panel.get_untracked() != place.panel
            || self.gpu.get_untracked() != place.gpu
            || self.job.get_untracked() != place.job;
        self.panel.set(place.panel);
        self.gpu.set(place.gpu);
        self.job.set(place.job);
        if let Some(theme) = place.theme {
            self.theme.set(theme);
        }
        if moved {
            self.scroll_soon();
        }
    }

    /// Scrolls the named panel (or GPU) into view once it is drawn.
    pub fn scroll_soon(&self) {
        let timeline = *self;
        set_timeout(move || timeline.scroll(), std::time::Duration::from_millis(300));
    }

    fn scroll(&self) {
        let Some(document) = web_sys::window().and_then(|w| w.document()) else { return };
        // A job id is the job's own (its scheduler's) text: compared, never put in a selector.
        let job = self.job.get_untracked().and_then(|job| {
            let jobs = document.get_elements_by_class_name("fleet-job");
            (0..jobs.length())
                .filter_map(|i| jobs.item(i))
                .find(|e| e.get_attribute("data-job-id").as_deref() == Some(&job))
        });
        let target = match (job, self.gpu.get_untracked(), self.panel.get_untracked()) {
            (Some(job), ..) => Some(job),
            (None, Some(gpu), _) => document.query_selector(&format!("[data-gpu-index=\"{gpu}\"]")).ok().flatten(),
            (None, None, Some(panel)) => document.get_element_by_id(&format!("{panel}-panel")),
            _ => None,
        };
        let named = self.job.with_untracked(Option::is_some)
            || self.gpu.with_untracked(Option::is_some)
            || self.panel.with_untracked(Option::is_some);
        self.unscrolled.set(named && target.is_none());
        if let Some(element) = target {
            element.scroll_into_view();
        }
    }

    /// Views drawn after the page's start (the panels of the console's second module): what the
    /// view names is scrolled to now where it was not drawn when the view was scrolled before.
    pub fn drawn(&self) {
        if self.unscrolled.get_untracked() {
            self.scroll_soon();
        }
    }

    /// Shows `[from, to)` (clamped to what the daemon can keep).
    pub fn show(&self, from_ms: u64, to_ms: u64) {
        let span = to_ms.saturating_sub(from_ms).clamp(MIN_SPAN_MS, MAX_SPAN_MS);
        let middle = from_ms / 2 + to_ms / 2;
        let from_ms = middle.saturating_sub(span / 2);
        self.range.set(Range::Fixed { from_ms, to_ms: from_ms + span });
    }

    /// The range shown now: a fixed one, or the live feed's last `live_span_ms` to `now_ms`.
    pub fn bounds(&self, now_ms: u64, live_span_ms: u64) -> (u64, u64) {
        match self.range.get() {
            Range::Fixed { from_ms, to_ms } => (from_ms, to_ms),
            Range::Live => (now_ms.saturating_sub(live_span_ms), now_ms),
        }
    }
}

/// The browser's clock (Unix ms).
pub fn now_ms() -> u64 {
    js_sys::Date::now() as u64
}

/// `2026-12-07 03:12:00` in the browser's time zone, for a range's ends.
pub fn date_time(ms: u64) -> String {
    let d = js_sys::Date::new(&JsValue::from_f64(ms as f64));
    format!(
        "{}-{:02}-{:02} {:02}:{:02}:{:02}",
        d.get_full_year(),
        d.get_month() + 1,
        d.get_date(),
        d.get_hours(),
        d.get_minutes(),
        d.get_seconds()
    )
}

/// `2026-12-07T03:12` for a `datetime-local` input.
fn input_value(ms: u64) -> String {
    date_time(ms).replacen(' ', "T", 1)[..16].to_string()
}

/// A `datetime-local` input's value as Unix ms (in the browser's time zone).
fn parse_input(value: &str) -> Option<u64> {
    let ms = js_sys::Date::new(&JsValue::from_str(value)).get_time();
    (ms.is_finite() && ms > 0.0).then_some(ms as u64)
}

/// GETs `url` and hands its JSON (or why not) to `done`.
pub fn fetch_json<T: ringside_shared::decode::Decode + 'static>(
    url: &str,
    done: impl FnOnce(Result<T, String>) + 'static,
) {
    use wasm_bindgen::closure::Closure;
    let Some(window) = web_sys::window() else { return done(Err("no window".into())) };
    let done = std::rc::Rc::new(std::cell::RefCell::new(Some(done)));
    let fail = {
        let done = done.clone();
        move |why: String| {
            if let Some(done) = done.borrow_mut().take() {
                done(Err(why));
            }
        }
    };
    let on_text = {
        let done = done.clone();
        move |text: JsValue| {
            let text = text.as_string().unwrap_or_default();
            if let Some(done) = done.borrow_mut().take() {
                done(ringside_shared::decode::from_str(&text).map_err(|e| format!("{e}: {}", prefix(&text, 200))));
            }
        }
    };
    let fail_response = fail.clone();
    // Each callback runs at most once; both of a pair are kept (forgotten) since either may.
    let on_response = Closure::<dyn FnMut(JsValue)>::once(move |response: JsValue| {
        let response: web_sys::Response = response.unchecked_into();
        if !response.ok() {
            return fail_response(format!("the daemon answered {}", response.status()));
        }
        match response.text() {
            Ok(promise) => {
                let fail_text = fail_response.clone();
                let ok = Closure::<dyn FnMut(JsValue)>::once(on_text);
                let err = Closure::<dyn FnMut(JsValue)>::once(move |e: JsValue| fail_text(crate::format::js_error(&e)));
                let _ = promise.then2(&ok, &err);
                ok.forget();
                err.forget();
            }
            Err(e) => fail_response(crate::format::js_error(&e)),
        }
    });
    let on_error = Closure::<dyn FnMut(JsValue)>::once(move |e: JsValue| fail(crate::format::js_error(&e)));
    let _ = window.fetch_with_str(url).then2(&on_response, &on_error);
    on_response.forget();
    on_error.forget();
}

/// The range bar: live or a preset, a custom range, earlier/later/zoom out, export, and the
/// panels to jump to.
#[component]
pub fn RangeBar() -> impl IntoView {
    let timeline = expect_context::<Timeline>();
    let live = move || timeline.range.get() == Range::Live;
    let span = move || match timeline.range.get() {
        Range::Live => None,
        Range::Fixed { from_ms, to_ms } => Some(to_ms - from_ms),
    };
    let presets = PRESETS
        .into_iter()
        .map(|(label, ms)| {
            let pressed = move || (span() == Some(ms)).to_string();
            view! {
                <button class="range-preset" aria-pressed=pressed on:click=move |_| {
                    let now = now_ms();
                    timeline.range.set(Range::Fixed { from_ms: now - ms, to_ms: now });
                }>{label}</button>
            }
        })
        .collect_any();
    let shift = move |direction: i64| {
        if let Range::Fixed { from_ms, to_ms } = timeline.range.get_untracked() {
            let step = (to_ms - from_ms) as i64 / 2 * direction;
            let (from, to) = ((from_ms as i64 + step).max(0) as u64, (to_ms as i64 + step).max(1) as u64);
            timeline.range.set(Range::Fixed { from_ms: from, to_ms: to.min(now_ms().max(from + MIN_SPAN_MS)) });
        }
    };
    let zoom_out = move |_| {
        let (from, to) = timeline.bounds(now_ms(), 600_000);
        let span = to - from;
        timeline.show(from.saturating_sub(span / 2), (to + span / 2).min(now_ms()));
    };
    let from_input = NodeRef::<leptos::html::Input>::new();
    let to_input = NodeRef::<leptos::html::Input>::new();
    let custom_error = RwSignal::new(None::<String>);
    let apply_custom = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let read = |r: NodeRef<leptos::html::Input>| r.get().and_then(|i| parse_input(&i.value()));
        match (read(from_input), read(to_input)) {
            (Some(from), Some(to)) if from < to => {
                custom_error.set(None);
                timeline.show(from, to);
            }
            _ => custom_error.set(Some("a start before the end".into())),
        }
    };
    let text = move || match timeline.range.get() {
        Range::Live => "Live · the last 10 minutes".to_string(),
        Range::Fixed { from_ms, to_ms } => format!("{} – {}", date_time(from_ms), date_time(to_ms)),
    };
    let export = move |format: &'static str| {
        let (from, to) = timeline.bounds(now_ms(), 600_000);
        format!("/api/history/export?from={from}&to={to}&download=1{format}")
    };
    let initial = move || timeline.bounds(now_ms(), 3_600_000);
    let panels = PANELS
        .into_iter()
        .map(|p| {
            let label = match p {
                "host" => "Host",
                "alerts" => "Alerts",
                "scheduler" => "Scheduler",
                "gpus" => "GPUs",
                _ => "Kernels",
            };
            view! {
                <a class="panel-link" href=format!("#{p}-panel") on:click=move |ev| {
                    ev.prevent_default();
                    timeline.gpu.set(None);
                    timeline.panel.set(Some(p.to_string()));
                    timeline.scroll_soon();
                }>{label}</a>
            }
        })
        .collect_any();
    view! {
        <nav class="rangebar" id="rangebar" aria-label="Time range">
            <div class="range-buttons" role="group" aria-label="Range">
                <button id="range-live" class="range-preset" aria-pressed=move || live().to_string()
                    on:click=move |_| timeline.range.set(Range::Live)>"Live"</button>
                {presets}
            </div>
            <span id="range-text" class="range-text" aria-live="polite">{text}</span>
            <div class="range-buttons" role="group" aria-label="Move">
                <button id="range-earlier" disabled=live on:click=move |_| shift(-1)>"◀ Earlier"</button>
                <button id="range-later" disabled=live on:click=move |_| shift(1)>"Later ▶"</button>
                <button id="range-zoom-out" on:click=zoom_out>"Zoom out"</button>
            </div>
            <form class="range-custom" on:submit=apply_custom>
                <label>"From "<input type="datetime-local" node_ref=from_input value=move || input_value(initial().0) /></label>
                <label>"to "<input type="datetime-local" node_ref=to_input value=move || input_value(initial().1) /></label>
                <button type="submit" id="range-apply">"Show"</button>
                {move || custom_error.get().map(|e| view! { <span class="range-error" role="alert">{e}</span> })}
            </form>
            <div class="range-buttons">
                <a id="export-json" class="button" href=move || export("") download="">"Export JSON"</a>
                <a id="export-trace" class="button" href=move || export("&format=trace") download="">"Export trace"</a>
            </div>
            <div class="panel-links">{panels}</div>
        </nav>
    }
}

/// At most `max` bytes of `text`, cut at a character's boundary.
fn prefix(text: &str, max: usize) -> &str {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_quoted_in_an_error_is_cut_between_characters() {
        assert_eq!(prefix("ééé", 3), "é");
        assert_eq!(prefix("abc", 200), "abc");
        assert_eq!(prefix("", 5), "");
    }

    #[test]
    fn a_place_reads_back_what_it_wrote_and_ignores_the_rest() {
        let place = Place {
            range: Some((1_796_000_000_000, 1_796_003_600_000)),
            panel: Some("gpus".into()),
            gpu: Some(3),
            job: None,
            theme: Some("dark".into()),
        };
        assert_eq!(place.search(), "?from=1796000000000&to=1796003600000&panel=gpus&gpu=3&theme=dark");
        let back = Place::parse("?from=1796000000000&to=1796003600000&panel=gpus&gpu=3&theme=dark&token=x");
        assert_eq!(back, place);
        let wrong = Place::parse("?from=5&to=4&panel=evil&theme=purple&gpu=x");
        assert_eq!(wrong, Place::default());
        let job = Place { job: Some("slurm 42/ä&x=%".into()), ..Place::default() };
        assert_eq!(job.search(), "?job=slurm%2042%2F%C3%A4%26x%3D%25");
        assert_eq!(Place::parse(&job.search()), job);
        assert_eq!(decode("a%2"), "a%2");
        assert_eq!(decode("%zz+b"), "%zz b");
    }
}
