//! A time-series line chart drawn as SVG: time axis with clock labels, value axis with units,
//! grid, a legend with each series' latest value, and gaps where samples are missing.

use leptos::prelude::*;

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
}

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
    let magnitude = 10f64.powf(raw.log10().floor());
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

/// A value with its unit, short enough for an axis label: thousands as `k`, millions as `M`.
pub fn format_value(value: f64, unit: &str) -> String {
    if value.abs() >= 1e6 {
        return format!("{:.1}M{unit}", value / 1e6);
    }
    if value.abs() >= 1e4 {
        return format!("{:.0}k{unit}", value / 1e3);
    }
    let digits = if value.abs() >= 100.0 {
        0
    } else if value.abs() >= 10.0 {
        1
    } else {
        2
    };
    format!("{value:.digits$}{unit}")
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
        d.push_str(&format!("{command}{x:.1},{y:.1}"));
        previous = Some(t);
    }
    d
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
    /// How much time the chart shows, in ms.
    #[prop(default = 300_000)]
    span_ms: u64,
) -> impl IntoView {
    let plot_w = W - LEFT - RIGHT;
    let plot_h = H - TOP - BOTTOM;
    let body = move || {
        let all = series.get();
        let Some((t0, t1)) = time_range(&all, span_ms) else {
            return view! { <p class="chart-empty">"Waiting for the first samples…"</p> }.into_any();
        };
        let data_max = all.iter().flat_map(|s| s.points.iter().filter(|p| p.0 >= t0).map(|p| p.1)).fold(0.0, f64::max);
        let (top, step) = match y_max {
            Some(max) => (max, nice_step(max, 4.0)),
            None => {
                let step = nice_step((data_max * 1.15).max(1e-9), 4.0).max(0.05);
                (((data_max * 1.15) / step).ceil().max(1.0) * step, step)
            }
        };
        let gap_ms = interval_ms.get().max(100) * 3;

        let y_ticks = (0..=((top / step).round() as usize))
            .map(|i| {
                let v = i as f64 * step;
                let y = TOP + (1.0 - v / top) * plot_h;
                view! {
                    <line class="grid" x1=LEFT x2=W - RIGHT y1=y y2=y />
                    <text class="tick" x=LEFT - 6.0 y=y + 4.0 text-anchor="end">{format_value(v, unit)}</text>
                }
            })
            .collect_view();

        let span = t1 - t0;
        let t_step = [5_000u64, 10_000, 15_000, 30_000, 60_000, 120_000, 300_000, 600_000, 1_800_000]
            .into_iter()
            .find(|s| span / s <= 5)
            .unwrap_or(3_600_000);
        let first_tick = t0.div_ceil(t_step) * t_step;
        let x_ticks = (0..)
            .map(|i| first_tick + i * t_step)
            .take_while(|t| *t <= t1)
            .map(|t| {
                let x = LEFT + (t - t0) as f64 / span.max(1) as f64 * plot_w;
                view! {
                    <line class="grid" x1=x x2=x y1=TOP y2=H - BOTTOM />
                    <text class="tick" x=x y=H - 8.0 text-anchor="middle">{clock(t)}</text>
                }
            })
            .collect_view();

        let lines = all
            .iter()
            .map(|s| {
                let d = path(&s.points, t0, t1, top, gap_ms);
                view! { <path class=format!("line {}", s.class) d=d /> }
            })
            .collect_view();

        view! {
            <svg class="chart" viewBox=format!("0 0 {W} {H}") role="img" aria-label=title>
                {y_ticks}
                {x_ticks}
                <line class="axis" x1=LEFT x2=LEFT y1=TOP y2=H - BOTTOM />
                <line class="axis" x1=LEFT x2=W - RIGHT y1=H - BOTTOM y2=H - BOTTOM />
                {lines}
            </svg>
        }
        .into_any()
    };
    let legend = move || {
        series
            .get()
            .into_iter()
            .map(|s| {
                let latest = s.points.last().map(|p| format_value(p.1, unit)).unwrap_or_else(|| "–".into());
                view! {
                    <span class="legend-item">
                        <span class=format!("swatch {}", s.class)></span>
                        {s.name}" "<b>{latest}</b>
                    </span>
                }
            })
            .collect_view()
    };
    view! {
        <figure class="chart-card">
            <figcaption>
                <span class="chart-title">{title}</span>
                <span class="legend">{legend}</span>
            </figcaption>
            {body}
        </figure>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_nice() {
        assert_eq!(nice_step(100.0, 4.0), 25.0);
        assert_eq!(nice_step(3.0, 4.0), 1.0);
        assert_eq!(nice_step(7.0, 4.0), 2.0);
        assert_eq!(nice_step(0.3, 4.0), 0.1);
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
