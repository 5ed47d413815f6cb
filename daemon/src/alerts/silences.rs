//! Silences and maintenance windows.
//!
//! A silence names alerts by matchers and holds from a start to an end, or until nothing it
//! matches is active (`until resolved`). Silences made over the API are kept in the alert
//! database; maintenance windows come from the config (`[[maintenance]]`): weekly days, a local
//! start time in a named time zone, and a duration. A silenced alert is still raised and
//! recorded; it is not forwarded to Alertmanager, not counted in the console's badge, and
//! carries what silences it.

use std::collections::BTreeMap;

use ringside_shared::{Alert, Matcher, NewSilence, Silence, Silenced};
use serde::Deserialize;

/// Ended silences listed (and loaded at start) besides those in force.
pub const ENDED_KEPT: usize = 100;
/// Silences in force or to come, at most.
pub const MAX_SILENCES: usize = 1000;
/// The longest silence the API takes: a year.
const MAX_SPAN_MS: u64 = 366 * 86_400_000;

/// A `[[maintenance]]` table: every week, on `days`, from `start` (local time in `time_zone`)
/// for `duration`, alerts matching `matchers` (all alerts where there are none) are silenced.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaintenanceConfig {
    pub name: String,
    /// `mon` … `sun`.
    pub days: Vec<String>,
    /// `HH:MM`, local time.
    pub start: String,
    /// `30m`, `2h`, … at most 7 days.
    pub duration: String,
    /// An IANA zone (`Europe/Berlin`); default UTC.
    #[serde(default = "utc")]
    pub time_zone: String,
    #[serde(default)]
    pub matchers: BTreeMap<String, String>,
    #[serde(default)]
    pub comment: String,
}

fn utc() -> String {
    "UTC".into()
}

/// A maintenance window, checked and ready to evaluate.
#[derive(Debug, Clone)]
pub struct Window {
    name: String,
    days: Vec<jiff::civil::Weekday>,
    start: (i8, i8),
    duration_ms: u64,
    zone: jiff::tz::TimeZone,
    matchers: Vec<Matcher>,
    comment: String,
}

const DAYS: [(&str, jiff::civil::Weekday); 7] = [
    ("mon", jiff::civil::Weekday::Monday),
    ("tue", jiff::civil::Weekday::Tuesday),
    ("wed", jiff::civil::Weekday::Wednesday),
    ("thu", jiff::civil::Weekday::Thursday),
    ("fri", jiff::civil::Weekday::Friday),
    ("sat", jiff::civil::Weekday::Saturday),
    ("sun", jiff::civil::Weekday::Sunday),
];

impl Window {
    pub fn from_config(c: &MaintenanceConfig) -> Result<Window, crate::invalid::Invalid> {
        let at = |why: String| crate::invalid::Invalid::new("maintenance", format!("{:?}", c.name), why);
        if c.name.is_empty() || c.name.len() > 128 {
            return Err(at("a name of 1 to 128 characters".into()));
        }
        let mut days = Vec::new();
        for day in &c.days {
            let found = DAYS.iter().find(|(name, _)| day.eq_ignore_ascii_case(name)).map(|(_, d)| *d);
            days.push(found.ok_or_else(|| at(format!("day {day:?}: one of mon, tue, wed, thu, fri, sat, sun")))?);
        }
        if days.is_empty() {
            return Err(at("days: at least one of mon … sun".into()));
        }
        let start = c
            .start
            .split_once(':')
            .and_then(|(h, m)| Some((h.parse::<i8>().ok()?, m.parse::<i8>().ok()?)))
            .filter(|(h, m)| (0..24).contains(h) && (0..60).contains(m) && c.start.len() == 5)
            .ok_or_else(|| at(format!("start {:?}: a local time HH:MM", c.start)))?;
        let duration_ms = super::rules::parse_duration_ms(&c.duration)
            .filter(|ms| (60_000..=7 * 86_400_000).contains(ms))
            .ok_or_else(|| at(format!("duration {:?}: 1m to 168h, e.g. \"2h\"", c.duration)))?;
        let zone =
            jiff::tz::TimeZone::get(&c.time_zone).map_err(|e| at(format!("time_zone {:?}: {e}", c.time_zone)))?;
        let matchers: Vec<Matcher> = c.matchers.iter().map(|(k, v)| Matcher::new(k, v)).collect();
        if matchers.len() > ringside_shared::silence::MAX_MATCHERS {
            return Err(at("too many matchers".into()));
        }
        Ok(Window { name: c.name.clone(), days, start, duration_ms, zone, matchers, comment: c.comment.clone() })
    }

    /// The occurrence in force at `now_ms` (start, end), if any.
    pub fn occurrence(&self, now_ms: u64) -> Option<(u64, u64)> {
        let now = jiff::Timestamp::from_millisecond(now_ms as i64).ok()?;
        let today = now.to_zoned_datetime(self.zone.clone()).date();
        // An occurrence that started up to 7 days ago may still run (durations are at most 7 days).
        for back in 0..=7i64 {
            let date = today.checked_sub(jiff::Span::new().days(back)).ok()?;
            if !self.days.contains(&date.weekday()) {
                continue;
            }
            // A start time a DST change skips or repeats is taken as the zone's rules say
            // (compatible disambiguation: later for a gap, earlier for a fold).
            let Ok(start) = date.at(self.start.0, self.start.1, 0, 0).to_zoned_datetime(self.zone.clone()) else {
                continue;
            };
            let start_ms = start.timestamp().as_millisecond().max(0) as u64;
            let end_ms = start_ms + self.duration_ms;
            if start_ms <= now_ms && now_ms < end_ms {
                return Some((start_ms, end_ms));
            }
        }
        None
    }

    /// The silence this window stands for at `now_ms`, if it is in force.
    pub fn silence(&self, now_ms: u64) -> Option<Silence> {
        let (start, end) = self.occurrence(now_ms)?;
        Some(Silence {
            id: 0,
            matchers: self.matchers.clone(),
            starts_at_ms: start,
            ends_at_ms: Some(end),
            comment: if self.comment.is_empty() {
                format!("maintenance window {}", self.name)
            } else {
                self.comment.clone()
            },
            created_by: "config".into(),
            created_at_ms: start,
            expired_at_ms: None,
            expired_by: None,
            maintenance: Some(self.name.clone()),
        })
    }

    fn matches(&self, alert: &Alert) -> bool {
        self.matchers.iter().all(|m| m.matches(alert))
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SilenceError {
    #[error("{0}")]
    Invalid(String),
    #[error("no silence with id {0}")]
    NotFound(u64),
    #[error("silence {0} has already ended")]
    Ended(u64),
    #[error("{MAX_SILENCES} silences are in force or to come: expire some first")]
    Full,
    #[error("token `{token}` is a {role}: silencing alerts needs an operator token")]
    Forbidden { token: String, role: &'static str },
    #[error("the silence could not be stored: {0}")]
    Store(String),
}

/// Every silence: those made over the API (kept in the database) and the config's windows.
#[derive(Default)]
pub struct Silences {
    stored: BTreeMap<u64, Silence>,
    next_id: u64,
    windows: Vec<Window>,
    /// What was in force at the last look: stored silence ids, window names (to say when
    /// that changes).
    in_force: (Vec<u64>, Vec<String>),
}

impl Silences {
    pub fn new(loaded: Vec<Silence>, windows: Vec<Window>) -> Silences {
        let next_id = loaded.iter().map(|s| s.id).max().unwrap_or(0) + 1;
        Silences {
            stored: loaded.into_iter().map(|s| (s.id, s)).collect(),
            next_id,
            windows,
            in_force: Default::default(),
        }
    }

    /// A silence from an API request, checked; not yet kept.
    pub fn make(&mut self, new: NewSilence, by: String, now_ms: u64) -> Result<Silence, SilenceError> {
        let in_force = self.stored.values().filter(|s| !s.is_over(now_ms)).count();
        if in_force >= MAX_SILENCES {
            return Err(SilenceError::Full);
        }
        let starts_at_ms = new.starts_at_ms.unwrap_or(now_ms);
        let ends_at_ms = match (new.ends_at_ms, new.duration_ms, new.until_resolved) {
            (Some(end), None, false) => Some(end),
            (None, Some(duration), false) => Some(starts_at_ms.saturating_add(duration)),
            (None, None, true) => None,
            _ => {
                return Err(SilenceError::Invalid(
                    "say how long: one of ends_at_ms, duration_ms, or until_resolved: true".into(),
                ))
            }
        };
        if ends_at_ms.is_some_and(|end| end <= now_ms || end.saturating_sub(starts_at_ms) > MAX_SPAN_MS) {
            return Err(SilenceError::Invalid("a silence must end in the future, within a year of its start".into()));
        }
        let silence = Silence {
            id: self.next_id,
            matchers: new.matchers,
            starts_at_ms,
            ends_at_ms,
            comment: new.comment.trim().to_string(),
            created_by: by,
            created_at_ms: now_ms,
            expired_at_ms: None,
            expired_by: None,
            maintenance: None,
        };
        silence.check().map_err(SilenceError::Invalid)?;
        self.next_id += 1;
        Ok(silence)
    }

    /// Keeps (or replaces) `silence`.
    pub fn put(&mut self, silence: Silence) {
        self.stored.insert(silence.id, silence);
        self.trim();
    }

    pub fn get(&self, id: u64) -> Option<&Silence> {
        self.stored.get(&id)
    }

    /// Forgets the oldest ended silences beyond [`ENDED_KEPT`] (the database keeps them).
    fn trim(&mut self) {
        let now = crate::clock::now_ms();
        let mut ended: Vec<(u64, u64)> = self
            .stored
            .values()
            .filter(|s| s.is_over(now))
            .map(|s| (s.expired_at_ms.or(s.ends_at_ms).unwrap_or(0), s.id))
            .collect();
        if ended.len() > ENDED_KEPT {
            ended.sort_unstable();
            for (_, id) in &ended[..ended.len() - ENDED_KEPT] {
                self.stored.remove(id);
            }
        }
    }

    /// `silence` expired at `now_ms` by `by`, not yet kept.
    pub fn expired(&self, id: u64, by: &str, now_ms: u64) -> Result<Silence, SilenceError> {
        let silence = self.stored.get(&id).ok_or(SilenceError::NotFound(id))?;
        if silence.is_over(now_ms) {
            return Err(SilenceError::Ended(id));
        }
        let mut expired = silence.clone();
        expired.expired_at_ms = Some(now_ms);
        expired.expired_by = Some(by.to_string());
        Ok(expired)
    }

    /// Silences in force or to come (the config's windows in force included), then ended ones,
    /// newest first.
    pub fn list(&self, now_ms: u64) -> Vec<Silence> {
        let mut list: Vec<Silence> = self.windows.iter().filter_map(|w| w.silence(now_ms)).collect();
        let mut stored: Vec<&Silence> = self.stored.values().collect();
        stored.sort_by_key(|s| (s.is_over(now_ms), std::cmp::Reverse(s.id)));
        list.extend(stored.into_iter().cloned());
        list
    }

    /// What silences alerts at `now_ms`: the stored silences in force and the windows in force,
    /// worked out once for a pass over many alerts (a window's local times are computed here,
    /// not per alert).
    pub fn silencer(&self, now_ms: u64) -> Silencer<'_> {
        Silencer {
            stored: self.stored.values().filter(|s| s.is_active(now_ms)).collect(),
            windows: self.windows.iter().filter_map(|w| Some((w, w.silence(now_ms)?))).collect(),
        }
    }

    /// What silences `alert` at `now_ms` (see [`Silencer::silencing`]).
    pub fn silencing(&self, alert: &Alert, now_ms: u64) -> Option<Silenced> {
        self.silencer(now_ms).silencing(alert)
    }

    /// Takes a removed silence out (one that could not be stored).
    pub fn remove(&mut self, id: u64) {
        self.stored.remove(&id);
    }

    /// Replaces the config's windows (at start, and when the config is read again).
    pub fn set_windows(&mut self, windows: Vec<Window>) {
        self.windows = windows;
    }

    /// Ends the `until resolved` silences in force that match no active alert: what ended,
    /// to be kept. Also says whether what is in force changed since the last look (a silence
    /// began, ended or was made; a maintenance window began or ended).
    pub fn end_resolved<'a>(
        &mut self,
        active: impl Iterator<Item = &'a Alert> + Clone,
        now_ms: u64,
    ) -> (Vec<Silence>, bool) {
        let mut ended = Vec::new();
        for silence in self.stored.values_mut() {
            if silence.ends_at_ms.is_none() && silence.is_active(now_ms) && !active.clone().any(|a| silence.matches(a))
            {
                silence.expired_at_ms = Some(now_ms);
                silence.expired_by = Some("resolved".into());
                ended.push(silence.clone());
            }
        }
        let in_force = (
            self.stored.values().filter(|s| s.is_active(now_ms)).map(|s| s.id).collect(),
            self.windows.iter().filter(|w| w.occurrence(now_ms).is_some()).map(|w| w.name.clone()).collect(),
        );
        let changed = in_force != self.in_force;
        self.in_force = in_force;
        (ended, changed)
    }

    /// [`Silences::list`], each with how many of `active` it matches (0 once over).
    pub fn listed(&self, active: &[&Alert], now_ms: u64) -> Vec<(Silence, usize)> {
        let silencer = self.silencer(now_ms);
        self.list(now_ms)
            .into_iter()
            .map(|s| {
                let matching = if !s.is_active(now_ms) {
                    0
                } else if let Some(name) = &s.maintenance {
                    let window = silencer.windows.iter().find(|(w, _)| &w.name == name).map(|(w, _)| *w);
                    active.iter().filter(|a| window.is_some_and(|w| w.matches(a))).count()
                } else {
                    active.iter().filter(|a| s.matches(a)).count()
                };
                (s, matching)
            })
            .collect()
    }
}

/// The silences in force at one instant (see [`Silences::silencer`]).
pub struct Silencer<'a> {
    stored: Vec<&'a Silence>,
    windows: Vec<(&'a Window, Silence)>,
}

impl Silencer<'_> {
    /// What silences `alert`: the oldest stored silence in force that matches it, else a
    /// maintenance window in force.
    pub fn silencing(&self, alert: &Alert) -> Option<Silenced> {
        if let Some(s) = self.stored.iter().find(|s| s.matches(alert)) {
            return Some(Silenced::from(*s));
        }
        self.windows.iter().find(|(w, _)| w.matches(alert)).map(|(_, s)| Silenced::from(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringside_shared::{AlertType, Severity};

    fn alert(id: u64, severity: Severity, job: &str) -> Alert {
        Alert {
            alert_type: AlertType::CollectiveHang,
            rule: None,
            source: format!("job:{job}"),
            labels: [("job".to_string(), job.to_string())].into(),
            ..crate::test_support::alert(id, severity, "m")
        }
    }

    fn new(matchers: &[(&str, &str)], duration_ms: Option<u64>, until_resolved: bool) -> NewSilence {
        NewSilence {
            matchers: matchers.iter().map(|(k, v)| Matcher::new(k, v)).collect(),
            starts_at_ms: None,
            ends_at_ms: None,
            duration_ms,
            until_resolved,
            comment: " reboot ".into(),
            by: None,
        }
    }

    #[test]
    fn matchers_times_and_until_resolved() {
        let mut silences = Silences::new(Vec::new(), Vec::new());
        let now = 1_000_000;
        let one = silences
            .make(new(&[("job", "train.py"), ("severity", "critical")], Some(3_600_000), false), "ana".into(), now)
            .unwrap();
        assert_eq!((one.id, one.ends_at_ms, one.comment.as_str()), (1, Some(now + 3_600_000), "reboot"));
        silences.put(one);
        let hit = alert(7, Severity::Critical, "train.py");
        let other_job = alert(8, Severity::Critical, "eval.py");
        let warning = alert(9, Severity::Warning, "train.py");
        assert_eq!(silences.silencing(&hit, now + 1).map(|s| (s.silence_id, s.by)), Some((1, "ana".into())));
        assert_eq!(silences.silencing(&other_job, now + 1), None);
        assert_eq!(silences.silencing(&warning, now + 1), None);
        assert_eq!(silences.silencing(&hit, now + 3_600_000), None, "over at its end");
        let listed = silences.listed(&[&hit, &other_job], now + 1);
        assert_eq!(listed.iter().map(|(s, n)| (s.id, *n)).collect::<Vec<_>>(), [(1, 1)]);

        // Until resolved: ends once nothing it matches is active.
        let until = silences.make(new(&[("alert_id", "8")], None, true), "bo".into(), now).unwrap();
        silences.put(until);
        assert!(silences.silencing(&other_job, now + 5).is_some_and(|s| s.until_ms.is_none()));
        let (ended, _) = silences.end_resolved([&other_job].into_iter(), now + 10);
        assert!(ended.is_empty());
        let (ended, _) = silences.end_resolved([&hit].into_iter(), now + 20);
        assert_eq!(ended.iter().map(|s| (s.id, s.expired_at_ms)).collect::<Vec<_>>(), [(2, Some(now + 20))]);
        silences.put(ended[0].clone());
        assert_eq!(silences.silencing(&other_job, now + 30), None);

        // Expired early; a second expiry is refused.
        let expired = silences.expired(1, "cy", now + 100).unwrap();
        silences.put(expired);
        assert_eq!(silences.silencing(&hit, now + 101), None);
        assert_eq!(silences.expired(1, "cy", now + 200), Err(SilenceError::Ended(1)));
        assert_eq!(silences.expired(99, "cy", now), Err(SilenceError::NotFound(99)));

        // Bad requests.
        for bad in [
            new(&[], Some(1000), false),
            new(&[("job", "x")], None, false),
            new(&[("job", "x")], Some(1000), true),
            new(&[("job", "x")], Some(MAX_SPAN_MS + 1), false),
            new(&[("", "x")], Some(1000), false),
        ] {
            assert!(matches!(silences.make(bad.clone(), "x".into(), now), Err(SilenceError::Invalid(_))), "{bad:?}");
        }
    }

    fn window(days: &[&str], start: &str, duration: &str, zone: &str) -> Result<Window, String> {
        Window::from_config(&MaintenanceConfig {
            name: "patch".into(),
            days: days.iter().map(|d| d.to_string()).collect(),
            start: start.into(),
            duration: duration.into(),
            time_zone: zone.into(),
            matchers: BTreeMap::from([("severity".to_string(), "warning".to_string())]),
            comment: String::new(),
        })
        .map_err(|e| e.to_string())
    }

    fn ms(text: &str) -> u64 {
        text.parse::<jiff::Timestamp>().unwrap().as_millisecond() as u64
    }

    #[test]
    fn weekly_windows_in_local_time() {
        // Saturdays 02:00-04:00 in Berlin: 01:00-03:00 UTC in winter (CET), 00:00-02:00 UTC in
        // summer (CEST).
        let w = window(&["sat"], "02:00", "2h", "Europe/Berlin").unwrap();
        // 2026-12-05 is a Saturday.
        assert_eq!(w.occurrence(ms("2026-12-05T00:59:59Z")), None);
        assert_eq!(
            w.occurrence(ms("2026-12-05T01:00:00Z")),
            Some((ms("2026-12-05T01:00:00Z"), ms("2026-12-05T03:00:00Z")))
        );
        assert!(w.occurrence(ms("2026-12-05T02:59:59Z")).is_some());
        assert_eq!(w.occurrence(ms("2026-12-05T03:00:00Z")), None);
        assert_eq!(w.occurrence(ms("2026-12-06T01:30:00Z")), None, "not on Sundays");
        assert!(w.occurrence(ms("2026-07-04T00:30:00Z")).is_some(), "summer time");
        assert_eq!(w.occurrence(ms("2026-07-04T02:30:00Z")), None);
        // Across midnight: Sunday 23:00 for 3 h in Tokyo (UTC+9) covers Monday 01:30 local.
        let late = window(&["sun"], "23:00", "3h", "Asia/Tokyo").unwrap();
        assert!(late.occurrence(ms("2026-12-06T16:30:00Z")).is_some());
        assert_eq!(late.occurrence(ms("2026-12-06T13:59:00Z")), None);

        let mut silences = Silences::new(Vec::new(), vec![w]);
        let warning = alert(1, Severity::Warning, "a");
        let critical = alert(2, Severity::Critical, "a");
        let at = ms("2026-12-05T01:30:00Z");
        let silenced = silences.silencing(&warning, at).unwrap();
        assert_eq!((silenced.silence_id, silenced.maintenance.as_deref()), (0, Some("patch")));
        assert_eq!(silenced.until_ms, Some(ms("2026-12-05T03:00:00Z")));
        assert_eq!(silences.silencing(&critical, at), None, "its matchers hold");
        assert_eq!(silences.list(at).len(), 1);
        let listed = silences.listed(&[&warning, &critical], at);
        assert_eq!(
            listed.iter().map(|(s, n)| (s.maintenance.as_deref(), *n)).collect::<Vec<_>>(),
            [(Some("patch"), 1)]
        );
        assert!(silences.end_resolved([&warning].into_iter(), at).1, "the window began");
        assert!(!silences.end_resolved([&warning].into_iter(), at + 1000).1);

        for (days, start, duration, zone, said) in [
            (&["someday"][..], "02:00", "2h", "UTC", "day"),
            (&[][..], "02:00", "2h", "UTC", "days"),
            (&["mon"][..], "2:00", "2h", "UTC", "start"),
            (&["mon"][..], "24:00", "2h", "UTC", "start"),
            (&["mon"][..], "02:00", "8d", "UTC", "duration"),
            (&["mon"][..], "02:00", "200h", "UTC", "duration"),
            (&["mon"][..], "02:00", "2h", "Mars/Olympus", "time_zone"),
        ] {
            let why = window(days, start, duration, zone).unwrap_err();
            assert!(why.contains(said), "{days:?} {start} {duration} {zone}: {why}");
        }
    }
}
