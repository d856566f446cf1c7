//! Scripted link events: a path that changes while it runs.
//!
//! A [`LinkSchedule`] is a list of [`LinkEvent`]s, each at a time counted from the link's
//! event origin (see [`LinkModel::set_event_origin`](super::LinkModel::set_event_origin);
//! by default the time of the model's first packet):
//!
//! | spec                | effect                                                                                   |
//! |---------------------|------------------------------------------------------------------------------------------|
//! | `5s:stall=200ms`    | nothing arrives in `[5 s, 5.2 s)`; what would arrive then arrives at 5.2 s, in order     |
//! | `10s:delay=-10ms`   | packets sent from 10 s on have 10 ms less base delay (never below 0; FIFO is kept)       |
//! | `3s:jitter=30ms/2s` | packets sent in `[3 s, 5 s)` get a heavy-tailed (Pareto) extra delay of mean 30 ms       |
//! | `8s:rate=256kbit/1s`| packets sent in `[8 s, 9 s)` meet a 256 kbit/s cap (or the configured one if lower)     |
//! | `4s:loss=20%/500ms` | packets sent in `[4 s, 4.5 s)` are also lost with probability 0.2                       |
//!
//! Times and durations are a number (decimals allowed) followed by `ms` or `s`; rates by
//! `bit`, `kbit` or `Mbit`. A stall acts on arrival times (a stalled last hop, like Wi-Fi,
//! holds what reaches it); the other events act on packets by their send time. Events may
//! overlap: delay steps add up, jitter bursts add, the lowest rate wins, loss bursts combine.
//!
//! Parsing allocates; the schedule is built before a run. The per-packet queries the model
//! makes walk the sorted slice and never allocate, lock or block.

use std::fmt;
use std::str::FromStr;

const NS_PER_MS: f64 = 1e6;
const NS_PER_S: f64 = 1e9;
/// Longest time or duration a spec may give (about 104 days): beyond this f64 → u64
/// nanoseconds stops being exact and the schedule is surely a typo.
const MAX_NS: f64 = (1u64 << 53) as f64;

/// What an event does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LinkEventKind {
    /// Nothing is delivered for `duration_ns`; what would have arrived is released at the end.
    Stall { duration_ns: u64 },
    /// The base delay of packets sent from now on changes by `step_ns` (a route change).
    Delay { step_ns: i64 },
    /// Packets sent during `duration_ns` get an extra heavy-tailed delay of mean `mean_ns`.
    Jitter { mean_ns: u64, duration_ns: u64 },
    /// Packets sent during `duration_ns` meet a bandwidth cap of `bps` bits per second.
    Rate { bps: u64, duration_ns: u64 },
    /// Packets sent during `duration_ns` are also lost with probability `p` (0..=1).
    Loss { p: f64, duration_ns: u64 },
}

/// One scripted change of the link, `at_ns` after the event origin.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkEvent {
    pub at_ns: u64,
    pub kind: LinkEventKind,
}

impl LinkEvent {
    /// When the event's effect ends, or `None` for a delay step, which lasts.
    pub fn end_ns(&self) -> Option<u64> {
        match self.kind {
            LinkEventKind::Delay { .. } => None,
            LinkEventKind::Stall { duration_ns }
            | LinkEventKind::Jitter { duration_ns, .. }
            | LinkEventKind::Rate { duration_ns, .. }
            | LinkEventKind::Loss { duration_ns, .. } => Some(self.at_ns.saturating_add(duration_ns)),
        }
    }

    /// Whether a windowed event covers relative time `t_ns` (a delay step covers all after it).
    fn covers(&self, t_ns: u64) -> bool {
        t_ns >= self.at_ns && self.end_ns().map_or(true, |end| t_ns < end)
    }
}

/// What an event spec got wrong. Each message says what was expected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EventSpecError {
    #[error("`{spec}` has no time: write TIME:KIND=VALUE, e.g. 5s:stall=200ms")]
    NoTime { spec: String },
    #[error("`{text}` is not a time: write a number followed by ms or s, e.g. 500ms or 5s")]
    BadTime { text: String },
    #[error("`{spec}` has no KIND=VALUE after the time: e.g. 5s:stall=200ms")]
    NoValue { spec: String },
    #[error("unknown event `{kind}`: use stall, delay, jitter, rate or loss (e.g. 5s:stall=200ms)")]
    UnknownKind { kind: String },
    #[error("{kind}=`{value}`: {problem}; write e.g. {example}")]
    BadValue {
        kind: &'static str,
        value: String,
        problem: &'static str,
        example: &'static str,
    },
}

/// A bad line in a schedule file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("line {line} `{text}`: {error}")]
pub struct ScheduleError {
    /// 1-based line number.
    pub line: usize,
    pub text: String,
    pub error: EventSpecError,
}

/// A number followed by one of `units` (suffix, scale), the longest suffix tried first.
fn number_with_unit(text: &str, units: &[(&str, f64)]) -> Option<f64> {
    let lower = text.to_ascii_lowercase();
    let (num, scale) = units
        .iter()
        .find_map(|(suffix, scale)| lower.strip_suffix(suffix).map(|n| (n, *scale)))?;
    let num = num.trim();
    // f64's parser takes "inf", "nan" and exponents; a spec wants plain decimals.
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    let v: f64 = num.parse().ok()?;
    let scaled = v * scale;
    (scaled.is_finite() && scaled <= MAX_NS).then_some(scaled)
}

/// `500ms`, `5s`, `1.5s` in ns.
fn parse_duration(text: &str) -> Option<u64> {
    number_with_unit(text.trim(), &[("ms", NS_PER_MS), ("s", NS_PER_S)]).map(|ns| ns.round() as u64)
}

fn parse_time(text: &str) -> Result<u64, EventSpecError> {
    parse_duration(text).ok_or_else(|| EventSpecError::BadTime {
        text: text.trim().to_string(),
    })
}

impl FromStr for LinkEvent {
    type Err = EventSpecError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let spec = spec.trim();
        let (time, rest) = spec.split_once(':').ok_or_else(|| EventSpecError::NoTime {
            spec: spec.to_string(),
        })?;
        let at_ns = parse_time(time)?;
        let (kind, value) = rest.split_once('=').ok_or_else(|| EventSpecError::NoValue {
            spec: spec.to_string(),
        })?;
        let value = value.trim();
        let kind = match kind.trim().to_ascii_lowercase().as_str() {
            "stall" => parse_stall(value)?,
            "delay" => parse_delay(value)?,
            "jitter" => parse_jitter(value)?,
            "rate" => parse_rate(value)?,
            "loss" => parse_loss(value)?,
            other => {
                return Err(EventSpecError::UnknownKind {
                    kind: other.to_string(),
                })
            }
        };
        Ok(LinkEvent { at_ns, kind })
    }
}

fn bad(kind: &'static str, value: &str, problem: &'static str, example: &'static str) -> EventSpecError {
    EventSpecError::BadValue {
        kind,
        value: value.to_string(),
        problem,
        example,
    }
}

/// `SIZE/DURATION` with both present, or the error naming `kind`.
fn split_window<'a>(
    kind: &'static str,
    value: &'a str,
    example: &'static str,
) -> Result<(&'a str, u64), EventSpecError> {
    let (size, duration) = value
        .split_once('/')
        .ok_or_else(|| bad(kind, value, "needs a size and a duration separated by /", example))?;
    let duration_ns = parse_duration(duration).filter(|d| *d > 0).ok_or_else(|| {
        bad(
            kind,
            value,
            "the duration after / must be above 0 and end in ms or s",
            example,
        )
    })?;
    Ok((size.trim(), duration_ns))
}

fn parse_stall(value: &str) -> Result<LinkEventKind, EventSpecError> {
    const EX: &str = "5s:stall=200ms";
    if value.contains('/') {
        return Err(bad("stall", value, "takes one duration, no /", EX));
    }
    let duration_ns = parse_duration(value)
        .filter(|d| *d > 0)
        .ok_or_else(|| bad("stall", value, "must be a duration above 0 ending in ms or s", EX))?;
    Ok(LinkEventKind::Stall { duration_ns })
}

fn parse_delay(value: &str) -> Result<LinkEventKind, EventSpecError> {
    const EX: &str = "10s:delay=-10ms or 10s:delay=+25ms";
    if value.contains('/') {
        return Err(bad("delay", value, "is a lasting step and takes no duration", EX));
    }
    let (sign, magnitude) = match value.as_bytes().first() {
        Some(b'-') => (-1, &value[1..]),
        Some(b'+') => (1, &value[1..]),
        _ => (1, value),
    };
    let ns = parse_duration(magnitude)
        .filter(|d| *d > 0)
        .ok_or_else(|| bad("delay", value, "must be a nonzero step ending in ms or s", EX))?;
    Ok(LinkEventKind::Delay {
        step_ns: sign * ns as i64,
    })
}

fn parse_jitter(value: &str) -> Result<LinkEventKind, EventSpecError> {
    const EX: &str = "3s:jitter=30ms/2s (mean size / duration)";
    let (size, duration_ns) = split_window("jitter", value, EX)?;
    let mean_ns = parse_duration(size).filter(|d| *d > 0).ok_or_else(|| {
        bad(
            "jitter",
            value,
            "the size before / must be above 0 and end in ms or s",
            EX,
        )
    })?;
    Ok(LinkEventKind::Jitter { mean_ns, duration_ns })
}

fn parse_rate(value: &str) -> Result<LinkEventKind, EventSpecError> {
    const EX: &str = "8s:rate=256kbit/1s (bit, kbit or Mbit)";
    let (rate, duration_ns) = split_window("rate", value, EX)?;
    let bps = number_with_unit(rate, &[("kbit", 1e3), ("mbit", 1e6), ("bit", 1.0)])
        .map(|b| b.round() as u64)
        .filter(|b| *b > 0)
        .ok_or_else(|| {
            bad(
                "rate",
                value,
                "the rate before / must be above 0 and end in bit, kbit or Mbit (use stall for no traffic at all)",
                EX,
            )
        })?;
    Ok(LinkEventKind::Rate { bps, duration_ns })
}

fn parse_loss(value: &str) -> Result<LinkEventKind, EventSpecError> {
    const EX: &str = "4s:loss=20%/500ms";
    let (pct, duration_ns) = split_window("loss", value, EX)?;
    let p = number_with_unit(pct, &[("%", 0.01)])
        .filter(|p| *p > 0.0 && *p <= 1.0)
        .ok_or_else(|| {
            bad(
                "loss",
                value,
                "the rate before / must be a percentage above 0 and at most 100%",
                EX,
            )
        })?;
    Ok(LinkEventKind::Loss { p, duration_ns })
}

/// A time the way a spec writes it: whole seconds as `5s`, anything else in ms.
fn fmt_time(f: &mut fmt::Formatter<'_>, ns: u64) -> fmt::Result {
    if ns % 1_000_000_000 == 0 && ns > 0 {
        write!(f, "{}s", ns / 1_000_000_000)
    } else {
        write!(f, "{}ms", ns as f64 / NS_PER_MS)
    }
}

impl fmt::Display for LinkEvent {
    /// The event as a spec that parses back to it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt_time(f, self.at_ns)?;
        match self.kind {
            LinkEventKind::Stall { duration_ns } => {
                f.write_str(":stall=")?;
                fmt_time(f, duration_ns)
            }
            LinkEventKind::Delay { step_ns } => {
                f.write_str(if step_ns < 0 { ":delay=-" } else { ":delay=+" })?;
                fmt_time(f, step_ns.unsigned_abs())
            }
            LinkEventKind::Jitter { mean_ns, duration_ns } => {
                f.write_str(":jitter=")?;
                fmt_time(f, mean_ns)?;
                f.write_str("/")?;
                fmt_time(f, duration_ns)
            }
            LinkEventKind::Rate { bps, duration_ns } => {
                if bps % 1000 == 0 {
                    write!(f, ":rate={}kbit/", bps / 1000)?;
                } else {
                    write!(f, ":rate={bps}bit/")?;
                }
                fmt_time(f, duration_ns)
            }
            LinkEventKind::Loss { p, duration_ns } => {
                write!(f, ":loss={}%/", p * 100.0)?;
                fmt_time(f, duration_ns)
            }
        }
    }
}

/// The specs in a schedule file with their 1-based line numbers: what is left of each line
/// once a `#` comment and surrounding blanks are cut, empty lines skipped. For callers
/// that put something of their own in front of each spec.
pub fn spec_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines().enumerate().filter_map(|(i, raw)| {
        let line = raw.split_once('#').map_or(raw, |(before, _)| before).trim();
        (!line.is_empty()).then_some((i + 1, line))
    })
}

/// A moment where an event starts or stops acting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// Time from the event origin.
    pub at_ns: u64,
    /// Index into [`LinkSchedule::events`].
    pub event: usize,
    /// True when the event begins, false when it ends.
    pub begins: bool,
}

/// What the events in force at one send time do to a packet.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Effects {
    /// Sum of the delay steps taken so far.
    pub delay_step_ns: i64,
    /// Sum of the means of the jitter bursts in force.
    pub jitter_mean_ns: u64,
    /// Lowest rate cap in force.
    pub rate_bps: Option<u64>,
    /// Chance that at least one loss burst in force takes the packet.
    pub loss_p: f64,
}

/// Link events sorted by time (events at the same time keep the order they were given in).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LinkSchedule {
    events: Vec<LinkEvent>,
}

impl LinkSchedule {
    pub fn new(mut events: Vec<LinkEvent>) -> Self {
        events.sort_by_key(|e| e.at_ns);
        Self { events }
    }

    /// A schedule file: one event spec per line; `#` starts a comment; blank lines are fine.
    pub fn parse(text: &str) -> Result<Self, ScheduleError> {
        let mut events = Vec::new();
        for (line, spec) in spec_lines(text) {
            let event = spec.parse().map_err(|error| ScheduleError {
                line,
                text: spec.to_string(),
                error,
            })?;
            events.push(event);
        }
        Ok(Self::new(events))
    }

    pub fn events(&self) -> &[LinkEvent] {
        &self.events
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Every begin and end, in time order (a delay step only begins).
    pub fn transitions(&self) -> Vec<Transition> {
        let mut out: Vec<Transition> = Vec::with_capacity(self.events.len() * 2);
        for (event, e) in self.events.iter().enumerate() {
            out.push(Transition {
                at_ns: e.at_ns,
                event,
                begins: true,
            });
            if let Some(end) = e.end_ns() {
                out.push(Transition {
                    at_ns: end,
                    event,
                    begins: false,
                });
            }
        }
        // Ends before begins at the same instant: a window is half-open.
        out.sort_by_key(|t| (t.at_ns, t.begins));
        out
    }

    /// The events in force for a packet sent at `t_ns` after the origin.
    pub(crate) fn effects_at(&self, t_ns: u64) -> Effects {
        let mut fx = Effects::default();
        let mut keep = 1.0;
        for e in self.events.iter().take_while(|e| e.at_ns <= t_ns) {
            if !e.covers(t_ns) {
                continue;
            }
            match e.kind {
                LinkEventKind::Stall { .. } => {}
                LinkEventKind::Delay { step_ns } => {
                    fx.delay_step_ns = fx.delay_step_ns.saturating_add(step_ns)
                }
                LinkEventKind::Jitter { mean_ns, .. } => {
                    fx.jitter_mean_ns = fx.jitter_mean_ns.saturating_add(mean_ns)
                }
                LinkEventKind::Rate { bps, .. } => {
                    fx.rate_bps = Some(fx.rate_bps.map_or(bps, |r| r.min(bps)))
                }
                LinkEventKind::Loss { p, .. } => keep *= 1.0 - p,
            }
        }
        fx.loss_p = 1.0 - keep;
        fx
    }

    /// The first time after `t_ns` at which some event begins or ends (when the effects in
    /// force may change), if any.
    pub(crate) fn next_change_after(&self, t_ns: u64) -> Option<u64> {
        self.events
            .iter()
            .flat_map(|e| [Some(e.at_ns), e.end_ns()])
            .flatten()
            .filter(|&c| c > t_ns)
            .min()
    }

    /// When a packet that would arrive at `t_ns` after the origin arrives once the stalls
    /// have held it (unchanged if no stall covers it).
    pub(crate) fn after_stalls(&self, mut t_ns: u64) -> u64 {
        // Sorted by start, and a stall only moves the time later: one pass suffices.
        for e in &self.events {
            if e.at_ns > t_ns {
                break;
            }
            if let LinkEventKind::Stall { .. } = e.kind {
                if let Some(end) = e.end_ns().filter(|_| e.covers(t_ns)) {
                    t_ns = end;
                }
            }
        }
        t_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;

    fn ev(spec: &str) -> LinkEvent {
        spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"))
    }

    #[test]
    fn the_documented_specs_parse() {
        assert_eq!(
            ev("5s:stall=200ms"),
            LinkEvent {
                at_ns: 5 * S,
                kind: LinkEventKind::Stall {
                    duration_ns: 200 * MS
                }
            }
        );
        assert_eq!(
            ev("10s:delay=-10ms").kind,
            LinkEventKind::Delay {
                step_ns: -10 * MS as i64
            }
        );
        assert_eq!(
            ev("10s:delay=+10ms").kind,
            LinkEventKind::Delay {
                step_ns: 10 * MS as i64
            }
        );
        assert_eq!(
            ev("10s:delay=1.5s").kind,
            LinkEventKind::Delay {
                step_ns: 1500 * MS as i64
            }
        );
        assert_eq!(
            ev("3s:jitter=30ms/2s"),
            LinkEvent {
                at_ns: 3 * S,
                kind: LinkEventKind::Jitter {
                    mean_ns: 30 * MS,
                    duration_ns: 2 * S
                }
            }
        );
        assert_eq!(
            ev("8s:rate=256kbit/1s").kind,
            LinkEventKind::Rate {
                bps: 256_000,
                duration_ns: S
            }
        );
        assert_eq!(
            ev("8s:rate=1.5Mbit/1s").kind,
            LinkEventKind::Rate {
                bps: 1_500_000,
                duration_ns: S
            }
        );
        let LinkEventKind::Loss { p, duration_ns } = ev("4s:loss=20%/500ms").kind else {
            panic!("not a loss burst");
        };
        assert!((p - 0.2).abs() < 1e-12);
        assert_eq!(duration_ns, 500 * MS);
        // Spaces around the parts, fractional times, upper case.
        assert_eq!(ev(" 1.5s : STALL = 0.5ms ").at_ns, 1500 * MS);
        assert_eq!(ev("250ms:stall=1s").at_ns, 250 * MS);
        assert_eq!(ev("0s:stall=1s").at_ns, 0);
    }

    #[test]
    fn display_gives_back_a_spec_that_parses_to_the_same_event() {
        for spec in [
            "5s:stall=200ms",
            "10s:delay=-10ms",
            "10s:delay=+2s",
            "3s:jitter=30ms/2s",
            "8s:rate=256kbit/1s",
            "8s:rate=1500bit/1s",
            "4s:loss=20%/500ms",
            "1500ms:stall=0.25ms",
            "0ms:stall=1s",
        ] {
            let e = ev(spec);
            assert_eq!(e.to_string(), spec);
            assert_eq!(ev(&e.to_string()), e);
        }
    }

    #[test]
    fn garbage_is_refused_with_a_message_that_says_what_to_write() {
        let cases: &[(&str, &str)] = &[
            ("", "has no time"),
            ("stall=200ms", "has no time"),
            ("5:stall=200ms", "`5` is not a time"),
            ("5m:stall=200ms", "is not a time"),
            ("-5s:stall=200ms", "is not a time"),
            ("infs:stall=200ms", "is not a time"),
            ("nans:stall=200ms", "is not a time"),
            ("1e3s:stall=200ms", "is not a time"),
            ("99999999999s:stall=1s", "is not a time"),
            ("5s", "has no time"),
            ("5s:stall", "has no KIND=VALUE"),
            ("5s:freeze=200ms", "unknown event `freeze`"),
            ("5s:stall=", "stall=``"),
            ("5s:stall=200", "ending in ms or s"),
            ("5s:stall=0ms", "above 0"),
            ("5s:stall=200ms/1s", "no /"),
            ("5s:delay=10ms/1s", "takes no duration"),
            ("5s:delay=--10ms", "nonzero step"),
            ("5s:delay=0ms", "nonzero step"),
            ("5s:jitter=30ms", "size and a duration"),
            ("5s:jitter=30ms/", "duration after /"),
            ("5s:jitter=30/2s", "size before /"),
            ("5s:jitter=0ms/2s", "size before /"),
            ("5s:rate=256/1s", "bit, kbit or Mbit"),
            ("5s:rate=0kbit/1s", "above 0"),
            ("5s:rate=256kbit", "size and a duration"),
            ("5s:rate=256kbit/0s", "duration after /"),
            ("5s:loss=20/1s", "percentage"),
            ("5s:loss=120%/1s", "at most 100%"),
            ("5s:loss=0%/1s", "above 0"),
            ("5s:loss=20%", "size and a duration"),
        ];
        for (spec, says) in cases {
            let err = spec.parse::<LinkEvent>().expect_err(spec).to_string();
            assert!(err.contains(says), "{spec:?}: {err:?} does not say {says:?}");
            assert!(err.contains("e.g."), "{spec:?}: {err:?} gives no example");
        }
    }

    #[test]
    fn a_schedule_file_skips_comments_and_blanks_and_names_a_bad_line() {
        let text = "# a route change, then Wi-Fi trouble\n\n10s:delay=-10ms\n  5s:stall=200ms   # stalled AP\n3s:jitter=30ms/2s\n";
        let s = LinkSchedule::parse(text).expect("parses");
        let times: Vec<u64> = s.events().iter().map(|e| e.at_ns / S).collect();
        assert_eq!(times, [3, 5, 10], "sorted by time");
        let err = LinkSchedule::parse("5s:stall=200ms\n\n# fine\n6s:stal=1s\n").expect_err("bad line 4");
        assert_eq!(err.line, 4);
        assert_eq!(err.text, "6s:stal=1s");
        assert!(
            err.to_string().starts_with("line 4 `6s:stal=1s`: unknown event"),
            "{err}"
        );
        assert!(LinkSchedule::parse("# nothing\n\n").expect("empty").is_empty());
    }

    #[test]
    fn transitions_are_in_time_order_with_ends_before_begins() {
        let s = LinkSchedule::parse("1s:stall=1s\n2s:jitter=5ms/1s\n2s:delay=+1ms").expect("parses");
        let t: Vec<(u64, bool)> = s.transitions().iter().map(|t| (t.at_ns / MS, t.begins)).collect();
        assert_eq!(
            t,
            [
                (1000, true),
                (2000, false),
                (2000, true),
                (2000, true),
                (3000, false)
            ]
        );
    }

    #[test]
    fn effects_combine_overlapping_events() {
        let s = LinkSchedule::parse(
            "1s:delay=+10ms\n2s:delay=-4ms\n1s:rate=256kbit/2s\n1500ms:rate=64kbit/1s\n1s:loss=50%/1s\n1s:loss=50%/1s\n1s:jitter=5ms/1s\n1s:jitter=7ms/1s",
        )
        .expect("parses");
        assert_eq!(s.effects_at(999 * MS), Effects::default());
        let fx = s.effects_at(1600 * MS);
        assert_eq!(fx.delay_step_ns, 10 * MS as i64);
        assert_eq!(fx.rate_bps, Some(64_000));
        assert!((fx.loss_p - 0.75).abs() < 1e-12);
        assert_eq!(fx.jitter_mean_ns, 12 * MS);
        let fx = s.effects_at(2600 * MS);
        assert_eq!(fx.delay_step_ns, 6 * MS as i64);
        assert_eq!(fx.rate_bps, Some(256_000));
        assert_eq!(fx.loss_p, 0.0);
        assert_eq!(fx.jitter_mean_ns, 0);
        assert_eq!(s.effects_at(3 * S).rate_bps, None);
    }

    #[test]
    fn overlapping_stalls_hold_until_the_last_one_ends() {
        let s = LinkSchedule::parse("1s:stall=500ms\n1400ms:stall=300ms\n3s:stall=1s\n3200ms:stall=100ms")
            .expect("parses");
        assert_eq!(s.after_stalls(999 * MS), 999 * MS);
        assert_eq!(s.after_stalls(S), 1700 * MS);
        assert_eq!(s.after_stalls(1450 * MS), 1700 * MS);
        assert_eq!(s.after_stalls(1700 * MS), 1700 * MS, "the end is not inside");
        assert_eq!(s.after_stalls(3250 * MS), 4 * S);
    }
}
