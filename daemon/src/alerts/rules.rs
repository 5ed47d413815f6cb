//! Alert rules written in the config's `[[rules]]` tables:
//!
//! ```toml
//! [[rules]]
//! name = "cpu_saturated"
//! metric = "host.cpu_utilization_pct"
//! op = ">"
//! threshold = 95
//! for = "30s"          # how long it must hold before the alert fires (default: at once)
//! severity = "warning"
//! labels = { team = "ml-infra" }
//! ```
//!
//! `metric` is one of the rule names of the metric registry ([`crate::metrics`]; listed in
//! `docs/metrics.md`). A rule is checked every tick for each source its metric has (the host,
//! each ring kernel, each GPU, each job's GPU);
//! it fires once its comparison has held for `for`, and clears as soon as it stops holding (the
//! store's `clear_for_ms` then decides when the alert resolves).

use std::collections::{BTreeMap, HashMap};

use ringside_shared::{AlertType, RuleOp, RuleSummary, Severity};
use serde::Deserialize;

use super::Condition;
use crate::metrics::{RuleMetric, View};
use crate::pipeline::Sample;

#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub name: String,
    /// A metric of the registry ([`crate::metrics`]), by one of its rule names.
    pub metric: RuleMetric,
    pub op: RuleOp,
    pub threshold: f64,
    pub for_ms: u64,
    pub severity: Severity,
    pub labels: BTreeMap<String, String>,
}

impl Rule {
    pub fn summary(&self) -> RuleSummary {
        RuleSummary {
            name: self.name.clone(),
            metric: self.metric.name().into(),
            op: self.op,
            threshold: self.threshold,
            for_ms: self.for_ms,
            severity: self.severity,
            labels: self.labels.clone(),
        }
    }
}

/// A `[[rules]]` table as written; spans locate errors in the file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    name: toml::Spanned<String>,
    metric: toml::Spanned<String>,
    op: RuleOp,
    threshold: toml::Spanned<f64>,
    #[serde(default, rename = "for")]
    for_: Option<toml::Spanned<String>>,
    severity: Severity,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

/// A value for people: 4 significant digits at most, no trailing zeros.
pub fn readable(value: f64) -> String {
    if !value.is_finite() || value == 0.0 {
        return format!("{value}");
    }
    let digits = (3 - value.abs().log10().floor() as i32).clamp(0, 6) as usize;
    let text = format!("{value:.digits$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

/// Parses `30s`, `500ms`, `2m`, `1h` (or a bare number of seconds) to milliseconds.
pub fn parse_duration_ms(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok().filter(|n: &f64| n.is_finite() && *n >= 0.0)?;
    let factor = match unit.trim() {
        "ms" => 1.0,
        "" | "s" => 1000.0,
        "m" => 60_000.0,
        "h" => 3_600_000.0,
        _ => return None,
    };
    Some((number * factor).round() as u64)
}

/// Line number (1-based) of a byte offset in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Checks every rule, naming the config line of the first problem.
pub fn compile(configs: Vec<RuleConfig>, file_text: &str) -> Result<Vec<Rule>, String> {
    let mut rules: Vec<Rule> = Vec::new();
    for c in configs {
        let at = |span: std::ops::Range<usize>| format!("line {}", line_of(file_text, span.start));
        let name = c.name.get_ref().trim().to_string();
        let valid_name =
            !name.is_empty() && name.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-');
        if !valid_name {
            return Err(format!(
                "{}: rule name {:?} must be letters, digits, '_' or '-'",
                at(c.name.span()),
                c.name.get_ref()
            ));
        }
        if rules.iter().any(|r| r.name == name) {
            return Err(format!("{}: a rule named {name:?} is already defined", at(c.name.span())));
        }
        let metric = RuleMetric::find(c.metric.get_ref()).ok_or_else(|| {
            let known: Vec<&str> = RuleMetric::names().collect();
            format!(
                "{}: rule {name}: unknown metric {:?}; known metrics: {}",
                at(c.metric.span()),
                c.metric.get_ref(),
                known.join(", ")
            )
        })?;
        let threshold = *c.threshold.get_ref();
        if !threshold.is_finite() {
            return Err(format!("{}: rule {name}: threshold must be a finite number", at(c.threshold.span())));
        }
        let for_ms = match &c.for_ {
            None => 0,
            Some(text) => parse_duration_ms(text.get_ref()).filter(|ms| *ms <= 86_400_000).ok_or_else(|| {
                format!(
                    "{}: rule {name}: `for` {:?} must be a duration such as \"30s\", \"500ms\" or \"5m\" (at most 24h)",
                    at(text.span()),
                    text.get_ref()
                )
            })?,
        };
        rules.push(Rule { name, metric, op: c.op, threshold, for_ms, severity: c.severity, labels: c.labels });
    }
    Ok(rules)
}

/// Evaluates the rules tick by tick, remembering since when each (rule, source) has held.
#[derive(Debug, Default)]
pub struct RuleEngine {
    rules: Vec<Rule>,
    holding_since: HashMap<(usize, String), u64>,
}

impl RuleEngine {
    pub fn new(rules: Vec<Rule>) -> Self {
        RuleEngine { rules, holding_since: HashMap::new() }
    }

    /// Picks up where the previous run left off: a rule alert still active in the store had
    /// held for its `for` already, so if its condition still holds at the first tick it goes on
    /// firing at once. Without this, a restart would resolve it during the `for` and reopen it
    /// afterwards, losing its acknowledgement.
    pub fn resume<'a>(&mut self, active: impl IntoIterator<Item = &'a ringside_shared::Alert>) {
        for alert in active {
            let Some(name) = alert.rule.as_deref().filter(|_| alert.alert_type == AlertType::Rule) else {
                continue;
            };
            if let Some((index, rule)) = self.rules.iter().enumerate().find(|(_, r)| r.name == name) {
                let since = alert.raised_at_ms.saturating_sub(rule.for_ms);
                self.holding_since.insert((index, alert.source.clone()), since);
            }
        }
    }

    pub fn conditions(&mut self, sample: &Sample) -> Vec<Condition> {
        let now = sample.taken_at_ms;
        let mut found = Vec::new();
        let mut holding = HashMap::new();
        let view = View::of_sample(sample);
        for (index, rule) in self.rules.iter().enumerate() {
            for (source, value) in rule.metric.values(&view) {
                if !rule.op.holds(value, rule.threshold) {
                    continue;
                }
                let key = (index, source.to_string());
                let since = self.holding_since.get(&key).copied().unwrap_or(now);
                holding.insert(key, since);
                if now.saturating_sub(since) < rule.for_ms {
                    continue;
                }
                let held = if rule.for_ms > 0 {
                    format!(" for {} s", now.saturating_sub(since) / 1000)
                } else {
                    String::new()
                };
                found.push(Condition {
                    alert_type: AlertType::Rule,
                    rule: Some(rule.name.clone()),
                    labels: rule.labels.clone(),
                    source: source.clone(),
                    severity: rule.severity,
                    value,
                    threshold: rule.threshold,
                    message: format!(
                        "{}: {} on {source} is {} ({} {}){held}",
                        rule.name,
                        rule.metric.name(),
                        readable(value),
                        rule.op.as_str(),
                        readable(rule.threshold)
                    ),
                });
            }
        }
        // A (rule, source) that stopped holding starts its `for` afresh next time.
        self.holding_since = holding;
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct File {
        #[serde(default)]
        rules: Vec<RuleConfig>,
    }

    fn compile_text(text: &str) -> Result<Vec<Rule>, String> {
        let file: File = toml::from_str(text).map_err(|e| e.to_string())?;
        compile(file.rules, text)
    }

    #[test]
    fn readable_values() {
        assert_eq!(readable(4.565333786211921), "4.565");
        assert_eq!(readable(97.5), "97.5");
        assert_eq!(readable(1234.567), "1235");
        assert_eq!(readable(0.001), "0.001");
        assert_eq!(readable(90.0), "90");
        assert_eq!(readable(0.0), "0");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("30s"), Some(30_000));
        assert_eq!(parse_duration_ms("500ms"), Some(500));
        assert_eq!(parse_duration_ms("2m"), Some(120_000));
        assert_eq!(parse_duration_ms("1.5h"), Some(5_400_000));
        assert_eq!(parse_duration_ms("10"), Some(10_000));
        assert_eq!(parse_duration_ms("soon"), None);
        assert_eq!(parse_duration_ms("5 parsecs"), None);
    }

    #[test]
    fn errors_name_the_line() {
        let text = "interval_ms = 1000\n\n[[rules]]\nname = \"a\"\nmetric = \"host.cpu_utilization_pct\"\nop = \">\"\nthreshold = 90\nseverity = \"warning\"\n\n[[rules]]\nname = \"b\"\nmetric = \"host.cpu_temperature\"\nop = \">\"\nthreshold = 90\nseverity = \"warning\"\n";
        let error = compile_text(text).unwrap_err();
        assert!(error.starts_with("line 12: rule b: unknown metric \"host.cpu_temperature\""), "{error}");
        assert!(error.contains("host.memory_used_pct"), "lists the known metrics: {error}");
        // Ops and severities are refused by the config's own parser, at their line.
        let bad_op =
            text.replace("metric = \"host.cpu_temperature\"\nop = \">\"", "metric = \"host.load1\"\nop = \"=>\"");
        let error = compile_text(&bad_op).unwrap_err();
        assert!(
            error.contains("line 13") && error.contains("unknown variant `=>`") && error.contains("`>=`"),
            "{error}"
        );
        let bad_severity = text
            .replace("host.cpu_temperature", "host.load1")
            .replace("severity = \"warning\"\n\n[[rules]]", "severity = \"loud\"\n\n[[rules]]");
        let error = compile_text(&bad_severity).unwrap_err();
        assert!(
            error.contains("line 8") && error.contains("unknown variant `loud`") && error.contains("`critical`"),
            "{error}"
        );
        let duplicate = text.replace("host.cpu_temperature", "host.load1").replace("name = \"b\"", "name = \"a\"");
        assert!(compile_text(&duplicate).unwrap_err().starts_with("line 11: a rule named \"a\""));
        let bad_for = "[[rules]]\nname = \"a\"\nmetric = \"host.load1\"\nop = \">\"\nthreshold = 1\nfor = \"a while\"\nseverity = \"info\"\n";
        assert!(compile_text(bad_for).unwrap_err().starts_with("line 6: rule a: `for`"));
        let unknown_key = "[[rules]]\nname = \"a\"\nmetirc = \"host.load1\"\n";
        assert!(compile_text(unknown_key).unwrap_err().contains("metirc"));
    }

    #[test]
    fn gpu_and_job_idle_rules_name_their_gpu_and_job() {
        use ringside_shared::{GpuDevice, GpuIdleAttribution, GpuTelemetry, PhaseValues};
        let text = "[[rules]]\nname = \"starved\"\nmetric = \"job.gpu_idle_data_loading_pct\"\nop = \">\"\nthreshold = 25\nfor = \"1s\"\nseverity = \"warning\"\n\n[[rules]]\nname = \"full\"\nmetric = \"gpu.memory_used_pct\"\nop = \">\"\nthreshold = 90\nseverity = \"error\"\n";
        let mut engine = RuleEngine::new(compile_text(text).unwrap());
        let sample = |t_ms: u64| {
            let mut s = Sample::new(t_ms);
            s.readings.gpus = Some(GpuTelemetry {
                available: true,
                devices: vec![
                    GpuDevice {
                        index: 0,
                        memory_used_bytes: Some(95),
                        memory_total_bytes: Some(100),
                        ..GpuDevice::default()
                    },
                    GpuDevice {
                        index: 1,
                        memory_used_bytes: Some(5),
                        memory_total_bytes: Some(100),
                        ..GpuDevice::default()
                    },
                ],
                idle: vec![GpuIdleAttribution {
                    job: 42,
                    gpu: 1,
                    idle_pct: 40.0,
                    idle_by_phase_pct: PhaseValues { data_loading: 30.0, ..PhaseValues::default() },
                    ..GpuIdleAttribution::default()
                }],
                ..GpuTelemetry::default()
            });
            s
        };
        let first: Vec<String> = engine.conditions(&sample(0)).into_iter().map(|c| c.source.to_string()).collect();
        assert_eq!(first, ["gpu:0"], "the memory rule at once, the idle rule after its 1 s");
        let later = engine.conditions(&sample(1500));
        let idle = later.iter().find(|c| c.rule.as_deref() == Some("starved")).expect("the idle rule fires");
        assert_eq!(idle.source, crate::metrics::Source::JobGpu { job: 42, gpu: 1 });
        assert!(idle.message.contains("job.gpu_idle_data_loading_pct on job:42/gpu:1 is 30"), "{}", idle.message);
    }

    fn host_sample(t_ms: u64, cpu: f64) -> Sample {
        let mut source = crate::host::HostSource::new(Default::default());
        let mut sample = Sample::new(t_ms);
        crate::pipeline::MetricsSource::collect(&mut source, &mut sample).unwrap();
        if let Some(h) = sample.readings.host.as_mut() {
            h.cpu_utilization_pct = cpu;
        }
        sample
    }

    #[test]
    fn a_rule_fires_after_holding_for_its_duration() {
        let text = "[[rules]]\nname = \"hot\"\nmetric = \"host.cpu_utilization_pct\"\nop = \">=\"\nthreshold = 90\nfor = \"2s\"\nseverity = \"error\"\nlabels = { team = \"ml\" }\n";
        let mut engine = RuleEngine::new(compile_text(text).unwrap());
        assert!(engine.conditions(&host_sample(0, 95.0)).is_empty(), "held 0 s");
        assert!(engine.conditions(&host_sample(1000, 95.0)).is_empty(), "held 1 s");
        let fired = engine.conditions(&host_sample(2000, 95.0));
        assert_eq!(fired.len(), 1);
        let c = &fired[0];
        assert_eq!(
            (c.rule.as_deref(), c.source.to_string().as_str(), c.severity),
            (Some("hot"), "host", Severity::Error)
        );
        assert_eq!(c.labels.get("team").map(String::as_str), Some("ml"));
        assert!(c.message.contains("host.cpu_utilization_pct") && c.message.contains("95"), "{}", c.message);
        // Dropping below resets the clock.
        assert!(engine.conditions(&host_sample(3000, 50.0)).is_empty());
        assert!(engine.conditions(&host_sample(4000, 95.0)).is_empty());
        assert_eq!(engine.conditions(&host_sample(6000, 90.0)).len(), 1);
    }

    #[test]
    fn a_rule_alert_still_active_at_start_fires_at_once_if_it_holds() {
        let text = "[[rules]]\nname = \"hot\"\nmetric = \"host.cpu_utilization_pct\"\nop = \">=\"\nthreshold = 90\nfor = \"30s\"\nseverity = \"error\"\n";
        let mut before = RuleEngine::new(compile_text(text).unwrap());
        assert!(before.conditions(&host_sample(0, 95.0)).is_empty());
        let fired = before.conditions(&host_sample(30_000, 95.0));
        assert_eq!(fired.len(), 1);
        let alert = ringside_shared::Alert {
            rule: Some("hot".into()),
            value: 95.0,
            threshold: 90.0,
            raised_at_ms: 30_000,
            updated_at_ms: 30_000,
            ..crate::test_support::alert(1, Severity::Error, &fired[0].message)
        };
        // Restarted: a fresh engine, resumed from the store, goes on firing at its first tick.
        let mut after = RuleEngine::new(compile_text(text).unwrap());
        let mut other = alert.clone();
        other.rule = Some("gone".into());
        after.resume([&alert, &other]);
        let fired = after.conditions(&host_sample(40_000, 95.0));
        assert_eq!(fired.len(), 1, "no 30 s gap after a restart");
        assert!(fired[0].message.contains("for 40 s"), "{}", fired[0].message);
        // Once it stops holding, the clock starts afresh as usual.
        assert!(after.conditions(&host_sample(41_000, 50.0)).is_empty());
        assert!(after.conditions(&host_sample(42_000, 95.0)).is_empty());
        // Without resuming, the restart would leave it without a condition for 30 s.
        let mut fresh = RuleEngine::new(compile_text(text).unwrap());
        assert!(fresh.conditions(&host_sample(40_000, 95.0)).is_empty());
    }
}
