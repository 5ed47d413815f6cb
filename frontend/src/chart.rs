//! A time-series line chart drawn as SVG: time axis with clock labels, value axis with units,
//! grid, a legend with each series' latest value, and gaps where samples are missing.

use leptos::prelude::*;

use crate::format::fixed;
use crate::CollectAny;

const W: f64 = 460.0;
const H: f64 = 180.0;
const LEFT: f64 = 52.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 12.0;
const BOTTOM: f64 = 26.0;

#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: &'static str,
    /// CSS class giving the stroke colour.
    pub class: &'static str,
    /// (time in ms, value), oldest first.
    pub points: Vec<(u64, f64)>,
    /// Its name in the daemon's history (`<metric>@<source>`), and what its values there are
    /// multiplied by to be in this chart's unit.
    pub history: Option<(String, f64)>,
}

impl Series {
    pub fn new(name: &'static str, class: &'static str, points: Vec<(u64, f64)>) -> Self {
        Series { name, class, points, history: None }
    }

    /// Kept in the daemon's history as `key`, in units `scale` times this chart's.
    pub fn kept_as(mut self, key: impl Into<String>, scale: f64) -> Self {
        self.history = Some((key.into(), scale));
        self
    }
}

/// Points kept per key (a rank's process, a job on a GPU) for a live chart: five minutes at 1 s
/// ticks.
pub const LIVE_POINTS: usize = 300;

/// A few values by key (the ranks of this node's jobs, its GPUs' jobs), in the order first
/// seen: a list searched in full, which at these counts costs less, in time and in the console's
/// code, than a hash map.
pub struct Keyed<K, V>(Vec<(K, V)>);

impl<K, V> Default for Keyed<K, V> {
    fn default() -> Self {
        Keyed(Vec::new())
    }
}

impl<K: PartialEq, V> Keyed<K, V> {
    pub fn get(&self, key: &K) -> Option<&V> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The value of `key`, a default one added where there is none.
    pub fn entry(&mut self, key: K) -> &mut V
    where
        V: Default,
    {
        let at = match self.0.iter().position(|(k, _)| *k == key) {
            Some(at) => at,
            None => {
                self.0.push((key, V::default()));
                self.0.len() - 1
            }
        };
        &mut self.0[at].1
    }

    /// Forgets the keys `keep` refuses.
    pub fn retain(&mut self, keep: impl Fn(&K) -> bool) {
        self.0.retain(|(key, _)| keep(key));
    }
}

/// The latest values of `N` charted series per key, for live charts of things that come and go:
/// at most [`LIVE_POINTS`] per key, oldest first.
pub struct LivePoints<K, const N: usize> {
    points: Keyed<K, std::collections::VecDeque<(u64, [f64; N])>>,
}

impl<K, const N: usize> Default for LivePoints<K, N> {
    fn default() -> Self {
        LivePoints { points: Keyed::default() }
    }
}

impl<K: PartialEq, const N: usize> LivePoints<K, N> {
    /// Forgets the keys `keep` refuses.
    pub fn retain(&mut self, keep: impl Fn(&K) -> bool) {
        self.points.retain(keep);
    }

    /// Adds `values` at `t_ms` for `key`, unless it holds a point as late already.
    pub fn push(&mut self, key: K, t_ms: u64, values: [f64; N]) {
        let points = self.points.entry(key);
        if points.back().is_some_and(|p| p.0 >= t_ms) {
            return;
        }
        points.push_back((t_ms, values));
        if points.len() > LIVE_POINTS {
            points.pop_front();
        }
    }

    /// Series `i`'s points for `key`, oldest first (none for a key not held).
    pub fn line(&self, key: &K, i: usize) -> Vec<(u64, f64)> {
        self.points.get(key).map(|p| p.iter().map(|(t, v)| (*t, v[i])).collect()).unwrap_or_default()
    }
}

/// One series of a range from the daemon's history: its mean per bucket and the band from the
/// bucket's min to its max.
#[derive(Debug, Clone, PartialEq)]
struct Kept {
    name: &'static str,
    class: &'static str,
    mean: Vec<(u64, f64)>,
    band: Vec<(u64, f64, f64)>,
}

/// What a chart shows of a fixed range.
#[derive(Debug, Clone, PartialEq)]
struct Fetched {
    from_ms: u64,
    to_ms: u64,
    step_ms: u64,
    series: Vec<Kept>,
}

/// Buckets asked for: about one per unit of the plot's width.
const POINTS: usize = 400;

/// The shown span of time: the last `span_ms`, or less while history is short.
fn time_range(series: &[Series], span_ms: u64) -> Option<(u64, u64)> {
    let last = series.iter().filter_map(|s| s.points.last().map(|p| p.0)).max()?;
    let first = series.iter().filter_map(|s| s.points.first().map(|p| p.0)).min()?;
    let start = first.max(last.saturating_sub(span_ms));
    Some(if last > start { (start, last) } else { (last.saturating_sub(60_000), last) })
}

/// A "nice" step (1, 2, 2.5 or 5 times a power of ten) giving about `ticks` intervals.
pub fn nice_step(max: f64, ticks: f64) -> f64 {
    let raw = (max / ticks).max(f64::MIN_POSITIVE);
    // The largest power of ten not above `raw`, stepped to (`powf` and `log10` would bring their
    // own code into the wasm), at most 700 steps whatever `raw` is.
    let mut magnitude = 1.0;
    for _ in 0..700 {
        if magnitude > raw {
            magnitude /= 10.0;
        } else if magnitude * 10.0 <= raw {
            magnitude *= 10.0;
        } else {
            break;
        }
    }
    let fraction = raw / magnitude;
    let nice = if fraction <= 1.0 {
        1.0
    } else if fraction <= 2.0 {
        2.0
    } else if fraction <= 2.5 {
        2.5
    } else if fraction <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * magnitude
}

pub fn clock(ms: u64) -> String {
    let date = js_sys::Date::new(&wasm_bindgen::JsValue::from_f64(ms as f64));
    format!("{:02}:{:02}:{:02}", date.get_hours(), date.get_minutes(), date.get_seconds())
}

/// A time axis label fit for a span: seconds within ten minutes, the day beyond a day.
fn axis_label(ms: u64, span_ms: u64) -> String {
    let date = js_sys::Date::new(&wasm_bindgen::JsValue::from_f64(ms as f64));
    if span_ms <= 600_000 {
        clock(ms)
    } else if span_ms <= 86_400_000 {
        format!("{:02}:{:02}", date.get_hours(), date.get_minutes())
    } else {
        format!("{}/{} {:02}:{:02}", date.get_date(), date.get_month() + 1, date.get_hours(), date.get_minutes())
    }
}

/// Time between axis labels: at most 5 over `span_ms`.
fn time_step(span_ms: u64) -> u64 {
    [
        5_000u64, 10_000, 15_000, 30_000, 60_000, 120_000, 300_000, 600_000, 1_800_000, 3_600_000, 10_800_000,
        21_600_000, 43_200_000, 86_400_000,
    ]
    .into_iter()
    .find(|s| span_ms / s <= 5)
    .unwrap_or(172_800_000)
}

fn x_of(t: u64, t0: u64, t1: u64) -> f64 {
    LEFT + (t.saturating_sub(t0)) as f64 / (t1 - t0).max(1) as f64 * (W - LEFT - RIGHT)
}

fn y_of(v: f64, top: f64) -> f64 {
    TOP + (1.0 - (v / top).clamp(0.0, 1.0)) * (H - TOP - BOTTOM)
}

/// Path data for the band of each run of buckets: along the max, back along the min.
fn band_path(band: &[(u64, f64, f64)], t0: u64, t1: u64, top: f64, gap_ms: u64) -> String {
    let mut d = String::new();
    let mut run: Vec<(u64, f64, f64)> = Vec::new();
    let flush = |run: &mut Vec<(u64, f64, f64)>, d: &mut String| {
        if run.is_empty() {
            return;
        }
        for (i, (t, _, max)) in run.iter().enumerate() {
            d.push_str(&format!(
                "{}{},{}",
                if i == 0 { 'M' } else { 'L' },
                fixed(x_of(*t, t0, t1), 1),
                fixed(y_of(*max, top), 1)
            ));
        }
        for (t, min, _) in run.iter().rev() {
            d.push_str(&format!("L{},{}", fixed(x_of(*t, t0, t1), 1), fixed(y_of(*min, top), 1)));
        }
        d.push('Z');
        run.clear();
    };
    for &p in band {
        if run.last().is_some_and(|last| p.0.saturating_sub(last.0) > gap_ms) {
            flush(&mut run, &mut d);
        }
        run.push(p);
    }
    flush(&mut run, &mut d);
    d
}

/// The value of `points` at or just before `t` (within `gap_ms`).
fn value_at(points: &[(u64, f64)], t: u64, gap_ms: u64) -> Option<f64> {
    let i = points.partition_point(|p| p.0 <= t);
    let p = points.get(i.checked_sub(1)?)?;
    (t - p.0 <= gap_ms).then_some(p.1)
}

/// A coordinate in an SVG drawing (charts, phase timelines), to a tenth of a unit.
pub fn px(v: f64) -> String {
    fixed(v, 1).to_string()
}

/// A value with its unit, short enough for an axis label: thousands as `k`, millions as `M`.
pub fn format_value(value: f64, unit: &str) -> String {
    if value.abs() >= 1e6 {
        return format!("{}M{unit}", fixed(value / 1e6, 1));
    }
    if value.abs() >= 1e4 {
        return format!("{}k{unit}", fixed(value / 1e3, 0));
    }
    let digits = if value.abs() >= 100.0 {
        0
    } else if value.abs() >= 10.0 {
        1
    } else {
        2
    };
    format!("{}{unit}", fixed(value, digits))
}

/// Path data for one series; a gap longer than `gap_ms` starts a new segment.
fn path(points: &[(u64, f64)], t0: u64, t1: u64, y_max: f64, gap_ms: u64) -> String {
    let plot_w = W - LEFT - RIGHT;
    let plot_h = H - TOP - BOTTOM;
    let mut d = String::new();
    let mut previous: Option<u64> = None;
    for &(t, v) in points.iter().filter(|(t, _)| *t >= t0) {
        let x = LEFT + (t - t0) as f64 / (t1 - t0).max(1) as f64 * plot_w;
        let y = TOP + (1.0 - (v / y_max).clamp(0.0, 1.0)) * plot_h;
        let command = match previous {
            Some(p) if t.saturating_sub(p) <= gap_ms => 'L',
            _ => 'M',
        };
        d.push_str(&format!("{command}{},{}", fixed(x, 1), fixed(y, 1)));
        previous = Some(t);
    }
    d
}

/// `(x in the viewBox)` of a mouse event over the chart's SVG.
fn pointer_x(ev: &web_sys::MouseEvent) -> Option<f64> {
    use wasm_bindgen::JsCast;
    let svg: web_sys::Element = ev.current_target()?.dyn_into().ok()?;
    let rect = svg.get_bounding_client_rect();
    (rect.width() > 0.0).then(|| (ev.client_x() as f64 - rect.left()) / rect.width() * W)
}

/// The time at viewBox `x` over `[t0, t1]`.
fn t_at(x: f64, t0: u64, t1: u64) -> u64 {
    let f = ((x - LEFT) / (W - LEFT - RIGHT)).clamp(0.0, 1.0);
    t0 + (f * (t1 - t0) as f64) as u64
}

/// Asks the daemon's history for the chart's series over a fixed range.
fn fetch(
    series: &[Series],
    (from_ms, to_ms, points): (u64, u64, usize),
    done: impl FnOnce(Result<Fetched, String>) + 'static,
) {
    let kept: Vec<(&'static str, &'static str, String, f64)> =
        series.iter().filter_map(|s| s.history.clone().map(|(key, scale)| (s.name, s.class, key, scale))).collect();
    if kept.is_empty() {
        return done(Err("this chart is not kept in the history".into()));
    }
    let keys: Vec<String> = kept.iter().map(|k| ringside_shared::percent_encode(&k.2)).collect();
    let url = format!("/api/history?series={}&from={from_ms}&to={to_ms}&points={points}", keys.join(","));
    // A panel drawn again each tick (the GPUs') asks again for the same range: answered here.
    if let Some(answer) = ANSWERS.with_borrow(|a| a.iter().find(|(u, _)| *u == url).map(|(_, r)| r.clone())) {
        return done(Ok(kept_of(kept, &answer)));
    }
    let asked = url.clone();
    crate::timeline::fetch_json(&asked, move |answer: Result<ringside_shared::HistoryResponse, String>| {
        if let Ok(r) = &answer {
            ANSWERS.with_borrow_mut(|a| {
                if a.len() >= ANSWERS_KEPT {
                    a.remove(0);
                }
                a.push((url, r.clone()));
            });
        }
        done(answer.map(|r| kept_of(kept, &r)))
    });
}

/// History answers kept for a fixed range, newest last.
const ANSWERS_KEPT: usize = 32;

thread_local! {
    static ANSWERS: std::cell::RefCell<Vec<(String, ringside_shared::HistoryResponse)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// The chart's series of a history answer, in its units.
fn kept_of(kept: Vec<(&'static str, &'static str, String, f64)>, r: &ringside_shared::HistoryResponse) -> Fetched {
    let series = kept
        .into_iter()
        .zip(&r.series)
        .map(|((name, class, _, scale), s)| Kept {
            name,
            class,
            mean: s.buckets(r.from_ms, r.step_ms).map(|(t, _, _, mean)| (t, mean * scale)).collect(),
            band: s.buckets(r.from_ms, r.step_ms).map(|(t, min, max, _)| (t, min * scale, max * scale)).collect(),
        })
        .collect();
    Fetched { from_ms: r.from_ms, to_ms: r.to_ms, step_ms: r.step_ms, series }
}

#[component]
pub fn TimeSeriesChart(
    title: &'static str,
    /// Unit after each value, e.g. "%".
    unit: &'static str,
    /// Fixed top of the value axis; when absent it follows the data.
    #[prop(optional)]
    y_max: Option<f64>,
    series: Signal<Vec<Series>>,
    interval_ms: Signal<u64>,
    /// How much time the chart shows live, in ms.
    #[prop(default = 300_000)]
    span_ms: u64,
    /// Alerts about this source (`host`, `gpu:0`, `kernel:<id>`) are drawn as bands.
    #[prop(optional, into)]
    source: Option<String>,
) -> impl IntoView {
    let timeline = expect_context::<crate::timeline::Timeline>();
    let store = expect_context::<crate::store::Store>();
    let plot_h = H - TOP - BOTTOM;
    // A fixed range comes from the daemon's history; the answer to an older request is dropped.
    // Live, the history fills the span before the points the snapshot brought (the span's end
    // rounded up to 10 s, so that a chart drawn again soon asks the same).
    let fetched = RwSignal::new(None::<Result<Fetched, String>>);
    let backfill = RwSignal::new(None::<Fetched>);
    let request = StoredValue::new(0u64);
    Effect::new(move |_| {
        let id = request.get_value() + 1;
        request.set_value(id);
        let crate::timeline::Range::Fixed { from_ms, to_ms } = timeline.range.get() else {
            fetched.set(None);
            let end = crate::timeline::now_ms().div_ceil(10_000) * 10_000;
            let range = (end.saturating_sub(span_ms), end, (span_ms / 1000).max(1) as usize);
            series.with_untracked(|s| {
                fetch(s, range, move |answer| {
                    if request.get_value() == id {
                        backfill.set(answer.ok());
                    }
                })
            });
            return;
        };
        fetched.set(None);
        series.with_untracked(|s| {
            fetch(s, (from_ms, to_ms, POINTS), move |answer| {
                if request.get_value() == id {
                    fetched.set(Some(answer));
                }
            })
        });
    });
    // The range drawn last, and a drag in progress (viewBox x where it started, and now).
    let drawn = StoredValue::new((0u64, 1u64));
    let drag = RwSignal::new(None::<(f64, f64)>);

    let body = move || {
        let live = timeline.range.get() == crate::timeline::Range::Live;
        // Each series' line (and band, from the history), the range, and the gap that breaks a line.
        let (t0, t1, gap_ms, lines): (u64, u64, u64, Vec<Kept>) = if live {
            let mut all = series.get();
            // What the history holds from before the first live point, ahead of the live points.
            backfill.with(|b| {
                let Some(b) = b.as_ref().filter(|b| b.series.len() == all.len()) else { return };
                for (s, kept) in all.iter_mut().zip(&b.series) {
                    let first = s.points.first().map_or(u64::MAX, |p| p.0);
                    let mut points: Vec<(u64, f64)> = kept.mean.iter().copied().filter(|p| p.0 < first).collect();
                    points.append(&mut s.points);
                    s.points = points;
                }
            });
            let Some((t0, t1)) = time_range(&all, span_ms) else {
                return view! { <p class="chart-empty">"Waiting for the first samples…"</p> }.into_any();
            };
            // Points from the history are a second apart.
            let step = if backfill.with(Option::is_some) { interval_ms.get().max(1000) } else { interval_ms.get() };
            let gap = step.max(100) * 3;
            let lines = all
                .into_iter()
                .map(|s| {
                    let points: Vec<(u64, f64)> = s.points.into_iter().filter(|p| p.0 >= t0).collect();
                    Kept { name: s.name, class: s.class, mean: points, band: Vec::new() }
                })
                .collect();
            (t0, t1, gap, lines)
        } else {
            match fetched.get() {
                None => return view! { <p class="chart-empty">"Loading history…"</p> }.into_any(),
                Some(Err(why)) => {
                    return view! { <p class="chart-empty">{format!("No history: {why}")}</p> }.into_any()
                }
                Some(Ok(f)) => (f.from_ms, f.to_ms, f.step_ms * 3 / 2, f.series),
            }
        };
        drawn.set_value((t0, t1));
        let data_max =
            lines.iter().flat_map(|l| l.mean.iter().map(|p| p.1).chain(l.band.iter().map(|b| b.2))).fold(0.0, f64::max);
        let (top, step) = match y_max {
            Some(max) => (max, nice_step(max, 4.0)),
            None => {
                let step = nice_step((data_max * 1.15).max(1e-9), 4.0).max(0.05);
                (((data_max * 1.15) / step).ceil().max(1.0) * step, step)
            }
        };

        let y_ticks = (0..=((top / step).round() as usize))
            .map(|i| {
                let v = i as f64 * step;
                let y = TOP + (1.0 - v / top) * plot_h;
                view! {
                    <line class="grid" x1=px(LEFT) x2=px(W - RIGHT) y1=px(y) y2=px(y) />
                    <text class="tick" x=px(LEFT - 6.0) y=px(y + 4.0) text-anchor="end">{format_value(v, unit)}</text>
                }
            })
            .collect_any();

        let span = t1 - t0;
        let t_step = time_step(span);
        let first_tick = t0.div_ceil(t_step) * t_step;
        let x_ticks = (0..)
            .map(|i| first_tick + i * t_step)
            .take_while(|t| *t <= t1)
            .map(|t| {
                let x = x_of(t, t0, t1);
                view! {
                    <line class="grid" x1=px(x) x2=px(x) y1=px(TOP) y2=px(H - BOTTOM) />
                    <text class="tick" x=px(x) y=px(H - 8.0) text-anchor="middle">{axis_label(t, span)}</text>
                }
            })
            .collect_any();

        let bands = source.clone().map(|source| {
            let prefix = format!("{source}/");
            store.alerts.with(|alerts| {
                alerts
                    .iter()
                    .filter(|a| a.source == source || a.source.starts_with(&prefix))
                    .filter(|a| a.raised_at_ms < t1 && a.resolved_at_ms.is_none_or(|r| r > t0))
                    .map(|a| {
                        let x0 = x_of(a.raised_at_ms.max(t0), t0, t1);
                        let x1 = x_of(a.resolved_at_ms.unwrap_or(t1).min(t1), t0, t1);
                        view! {
                            <rect class=format!("alert-band sev-{}", a.severity.as_str()) x=px(x0) y=px(TOP)
                                width=px((x1 - x0).max(1.5)) height=px(plot_h)>
                                <title>{format!("{} ({}): {}", a.name(), a.severity.as_str(), a.message)}</title>
                            </rect>
                        }
                    })
                    .collect_any()
            })
        });

        let drawn_lines = lines
            .iter()
            .map(|Kept { class, mean, band, .. }| {
                let band = (!band.is_empty()).then(|| {
                    view! { <path class=format!("band {class}") d=band_path(band, t0, t1, top, gap_ms) /> }
                });
                view! {
                    {band}
                    <path class=format!("line {class}") d=path(mean, t0, t1, top, gap_ms) />
                }
            })
            .collect_any();

        let crosshair = timeline.hover_ms.get().filter(|t| (t0..=t1).contains(t)).map(|t| {
            let x = x_of(t, t0, t1);
            view! {
                <line class="crosshair" x1=px(x) x2=px(x) y1=px(TOP) y2=px(H - BOTTOM) />
                <text class="tick crosshair-label" x=px(x) y=px(TOP - 2.0) text-anchor="middle">{axis_label(t, span.min(86_400_000))}</text>
            }
        });
        let selection = drag.get().filter(|(a, b)| (a - b).abs() > 1.0).map(|(a, b)| {
            view! { <rect class="selection" x=px(a.min(b)) y=px(TOP) width=px((a - b).abs()) height=px(plot_h) /> }
        });
        let legend = lines
            .iter()
            .map(|Kept { name, class, mean, .. }| {
                let shown = match timeline.hover_ms.get() {
                    Some(t) if (t0..=t1).contains(&t) => value_at(mean, t, gap_ms),
                    _ => mean.last().map(|p| p.1),
                };
                let text = shown.map(|v| format_value(v, unit)).unwrap_or_else(|| "–".into());
                view! {
                    <span class="legend-item">
                        <span class=format!("swatch {class}")></span>
                        {*name}" "<b>{text}</b>
                    </span>
                }
            })
            .collect_any();

        view! {
            <span class="legend">{legend}</span>
            <svg
                class="chart"
                data-from=t0
                data-to=t1
                viewBox=format!("0 0 {} {}", px(W), px(H))
                role="img"
                aria-label=title
                on:mousemove=move |ev| {
                    let Some(x) = pointer_x(&ev) else { return };
                    let (t0, t1) = drawn.get_value();
                    timeline.hover_ms.set(Some(t_at(x, t0, t1)));
                    if let Some((a, _)) = drag.get_untracked() {
                        drag.set(Some((a, x)));
                    }
                }
                on:mouseleave=move |_| {
                    timeline.hover_ms.set(None);
                    drag.set(None);
                }
                on:mousedown=move |ev| {
                    ev.prevent_default();
                    drag.set(pointer_x(&ev).map(|x| (x, x)));
                }
                on:mouseup=move |ev| {
                    let started = drag.get_untracked();
                    drag.set(None);
                    if let (Some((a, _)), Some(b)) = (started, pointer_x(&ev)) {
                        if (a - b).abs() > 4.0 {
                            let (t0, t1) = drawn.get_value();
                            timeline.show(t_at(a.min(b), t0, t1), t_at(a.max(b), t0, t1));
                        }
                    }
                }
            >
                {bands}
                {y_ticks}
                {x_ticks}
                <line class="axis" x1=px(LEFT) x2=px(LEFT) y1=px(TOP) y2=px(H - BOTTOM) />
                <line class="axis" x1=px(LEFT) x2=px(W - RIGHT) y1=px(H - BOTTOM) y2=px(H - BOTTOM) />
                {drawn_lines}
                {crosshair}
                {selection}
            </svg>
        }
        .into_any()
    };
    view! {
        <figure class="chart-card" data-chart=title>
            <figcaption>
                <span class="chart-title">{title}</span>
            </figcaption>
            {body}
        </figure>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_points_keep_the_latest_per_key_and_forget_keys_gone() {
        let mut live = LivePoints::<(u32, u32), 2>::default();
        for t in 0..(LIVE_POINTS as u64 + 5) {
            live.push((0, 7), t, [t as f64, 1.0]);
            live.push((1, 7), t, [2.0, t as f64]);
        }
        // A point no later than the last is not taken.
        live.push((0, 7), 3, [-1.0, -1.0]);
        let line = live.line(&(0, 7), 0);
        assert_eq!(line.len(), LIVE_POINTS);
        assert_eq!(line.first(), Some(&(5, 5.0)));
        assert_eq!(live.line(&(1, 7), 1).last(), Some(&(LIVE_POINTS as u64 + 4, (LIVE_POINTS + 4) as f64)));
        live.retain(|k| k.0 == 1);
        assert!(live.line(&(0, 7), 0).is_empty());
        assert_eq!(live.line(&(1, 7), 0).len(), LIVE_POINTS);
        assert!(live.line(&(2, 7), 0).is_empty());
    }

    #[test]
    fn steps_are_nice() {
        assert_eq!(nice_step(100.0, 4.0), 25.0);
        assert_eq!(nice_step(3.0, 4.0), 1.0);
        assert_eq!(nice_step(7.0, 4.0), 2.0);
        assert_eq!(nice_step(0.3, 4.0), 0.1);
        assert_eq!(nice_step(4e9, 4.0), 1e9);
        assert!((1e-309..1e-300).contains(&nice_step(0.0, 4.0)));
        assert!(nice_step(f64::INFINITY, 4.0).is_infinite());
    }

    #[test]
    fn values_fit_an_axis() {
        assert_eq!(format_value(12_600.0, " µs"), "13k µs");
        assert_eq!(format_value(2_500_000.0, ""), "2.5M");
        assert_eq!(format_value(250.0, " %"), "250 %");
        assert_eq!(format_value(2.5, ""), "2.50");
    }

    #[test]
    fn gaps_split_the_line() {
        let d = path(&[(0, 0.0), (1000, 50.0), (10_000, 100.0)], 0, 10_000, 100.0, 3000);
        assert_eq!(d.matches('M').count(), 2);
        assert_eq!(d.matches('L').count(), 1);
    }
}
