//! The control tree: every port of [`Surface`], its metadata, and the handler that checks a
//! value, delivers its [`ControlCommand`] and answers queries.
//!
//! Building allocates; the handlers run on the control thread only (they lock the shared
//! [`ControlState`](super::ControlState) and format error reasons), never on the audio thread.

use netjam_engine::delay::LatencyPolicy;
use netjam_osc::dispatch::BuildError;
use netjam_osc::{Arg, Meta, Request, Scale, Tree, TreeBuilder};

use super::{bump, ControlCommand, ControlState, Ctx, Surface, GAIN_MAX_DB, GAIN_MIN_DB, MAX_REDUNDANCY};

/// A number: no argument (query) or one of `f i d h`.
const NUMBER: &str = "::f:i:d:h";
/// A switch: `i` 0/1, `T`/`F`, or `f` 0.0/1.0 (what toggles on touch screens send).
const SWITCH: &str = "::i:T:F:f";
/// A whole number: `i`, `h`, or an integral `f`.
const WHOLE: &str = "::i:h:f";
/// A named option: its name (`s`/`S`) or its index (`i`).
const CHOICE: &str = "::s:S:i";
/// Read-only: queries only.
const READ_ONLY: &str = ":";

/// A value a query answers.
#[derive(Debug, Clone, Copy)]
enum Value {
    Float(f32),
    Int(i32),
    Text(&'static str),
}

impl Value {
    fn arg(self) -> Arg<'static> {
        match self {
            Value::Float(v) => Arg::Float(v),
            Value::Int(v) => Arg::Int(v),
            Value::Text(v) => Arg::Str(v),
        }
    }
}

/// A settable port: how its argument is read, what command it makes, where the control
/// thread records the new value and how a query reads it (`usize` is the member seat).
struct Param<T> {
    spec: String,
    meta: Meta,
    parse: fn(Arg<'_>) -> Result<T, String>,
    command: fn(u16, T) -> ControlCommand,
    store: fn(&mut ControlState, usize, T),
    load: fn(&ControlState, usize) -> Option<Value>,
}

impl Ctx {
    /// Answers a query from the port's concrete address.
    fn answer(&self, r: &mut Request<'_, '_>, args: &[Arg<'_>]) {
        bump(&self.shared.counters.queries);
        if r.reply_here(args).is_err() {
            bump(&self.shared.counters.reply_failures);
        }
    }

    /// Refuses a set for its value.
    fn refuse(&self, r: &mut Request<'_, '_>, why: &str) {
        bump(&self.shared.counters.refused);
        self.error(r, why);
    }

    /// Replies `/error ,ss ADDRESS REASON`.
    fn error(&self, r: &mut Request<'_, '_>, why: &str) {
        let mut buf = [0u8; 256];
        let address = r.concrete_address(&mut buf).unwrap_or("");
        if r.reply("/error", &[Arg::Str(address), Arg::Str(why)]).is_err() {
            bump(&self.shared.counters.reply_failures);
        }
    }

    /// Delivers `command`; records the new value only if it was taken.
    fn set(
        &mut self,
        r: &mut Request<'_, '_>,
        command: ControlCommand,
        record: impl FnOnce(&mut ControlState),
    ) {
        match self.sink.deliver(command) {
            Ok(()) => {
                bump(&self.shared.counters.commands);
                record(&mut self.shared.state());
            }
            Err(_) => {
                bump(&self.shared.counters.ring_full);
                self.error(
                    r,
                    "the audio side's command queue is full: nothing was changed; send it again",
                );
            }
        }
    }
}

fn param<T: Copy + 'static>(b: &mut TreeBuilder<Ctx>, p: Param<T>) {
    let Param {
        spec,
        meta,
        parse,
        command,
        store,
        load,
    } = p;
    b.port(&spec, meta, move |c: &mut Ctx, r: &mut Request<'_, '_>| {
        let seat = r.index(0) as usize;
        match r.arg(0) {
            None => {
                let value = load(&c.shared.state(), seat);
                match value {
                    Some(v) => c.answer(r, &[v.arg()]),
                    None => c.error(r, "no such seat"),
                }
            }
            Some(a) => match parse(a) {
                Ok(v) => c.set(r, command(seat as u16, v), |s| store(s, seat, v)),
                Err(why) => c.refuse(r, &why),
            },
        }
    });
}

fn gain(a: Arg<'_>) -> Result<f32, String> {
    in_range(a, GAIN_MIN_DB, GAIN_MAX_DB, "a gain", " dB")
}

fn pan(a: Arg<'_>) -> Result<f32, String> {
    in_range(a, -1.0, 1.0, "a pan", " (-1 left, 1 right)")
}

fn in_range(a: Arg<'_>, min: f32, max: f32, what: &str, unit: &str) -> Result<f32, String> {
    match a.as_f32() {
        Some(v) if (min..=max).contains(&v) => Ok(v),
        Some(v) => Err(format!("{what} is {min} to {max}{unit}, not {v}")),
        None => Err(format!("{what} is a number")),
    }
}

fn switch(a: Arg<'_>) -> Result<bool, String> {
    match a {
        Arg::True | Arg::Int(1) => Ok(true),
        Arg::False | Arg::Int(0) => Ok(false),
        Arg::Float(1.0) => Ok(true),
        Arg::Float(0.0) => Ok(false),
        Arg::Int(v) => Err(format!("a switch is 0 or 1, not {v}")),
        Arg::Float(v) => Err(format!("a switch is 0 or 1, not {v}")),
        _ => Err("a switch is 0 or 1 (or T/F)".into()),
    }
}

fn redundancy(a: Arg<'_>) -> Result<u8, String> {
    let v = match a {
        Arg::Int(v) => Some(i64::from(v)),
        Arg::Long(v) => Some(v),
        Arg::Float(v) if v.fract() == 0.0 && v.abs() < 1e9 => Some(v as i64),
        _ => None,
    };
    match v {
        Some(v) if (0..=i64::from(MAX_REDUNDANCY)).contains(&v) => Ok(v as u8),
        _ => Err(format!(
            "redundancy is a whole number of packets from 0 to {MAX_REDUNDANCY}"
        )),
    }
}

const POLICIES: [(&str, LatencyPolicy); 2] = [("tight", LatencyPolicy::Tight), ("safe", LatencyPolicy::Safe)];

fn policy_name(p: LatencyPolicy) -> &'static str {
    POLICIES.iter().find(|(_, q)| *q == p).map_or("tight", |(n, _)| n)
}

fn latency(a: Arg<'_>) -> Result<LatencyPolicy, String> {
    let found = match a {
        Arg::Str(s) | Arg::Symbol(s) => POLICIES.iter().find(|(n, _)| n.eq_ignore_ascii_case(s.trim())),
        Arg::Int(i) => usize::try_from(i).ok().and_then(|i| POLICIES.get(i)),
        _ => None,
    };
    found
        .map(|(_, p)| *p)
        .ok_or_else(|| "the latency policy is \"tight\" (0) or \"safe\" (1)".into())
}

fn saturate(v: u64) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

fn gain_meta(doc: &str, short: &str) -> Meta {
    Meta::new()
        .doc(doc)
        .short(short)
        .range(f64::from(GAIN_MIN_DB), f64::from(GAIN_MAX_DB))
        .default_number(0.0)
        .unit("dB")
        .scale(Scale::Linear)
}

fn switch_meta(doc: &str, short: &str) -> Meta {
    Meta::new()
        .doc(doc)
        .short(short)
        .range(0.0, 1.0)
        .default_bool(false)
        .unit("switch")
        .options(&["off", "on"])
}

/// The tree for `s`.
pub(super) fn build(s: &Surface) -> Result<Tree<Ctx>, BuildError> {
    let mut b = TreeBuilder::<Ctx>::new();
    let seats = s.members;
    let member = |port: &str, args: &str| format!("/member#{seats}/{port}{args}");
    let seat = |st: &ControlState, i: usize| st.members.get(i).cloned();

    param(
        &mut b,
        Param {
            spec: member("gain", NUMBER),
            meta: gain_meta(
                "Gain of this member in your own mix (only you hear the change), dB",
                "gain",
            ),
            parse: gain,
            command: |member, db| ControlCommand::MemberGain { member, db },
            store: |st, i, v| {
                if let Some(m) = st.members.get_mut(i) {
                    m.gain_db = v;
                }
            },
            load: |st, i| st.members.get(i).map(|m| Value::Float(m.gain_db)),
        },
    );
    if s.pan {
        param(
            &mut b,
            Param {
                spec: member("pan", NUMBER),
                meta: Meta::new()
                    .doc("Where this member sits in your stereo mix: -1 left, 0 centre, 1 right")
                    .short("pan")
                    .range(-1.0, 1.0)
                    .default_number(0.0)
                    .unit("position")
                    .scale(Scale::Linear),
                parse: pan,
                command: |member, pan| ControlCommand::MemberPan { member, pan },
                store: |st, i, v| {
                    if let Some(m) = st.members.get_mut(i) {
                        m.pan = v;
                    }
                },
                load: |st, i| st.members.get(i).map(|m| Value::Float(m.pan)),
            },
        );
    }
    param(
        &mut b,
        Param {
            spec: member("mute", SWITCH),
            meta: switch_meta(
                "1 silences this member in your own mix, 0 brings them back (T/F and 0.0/1.0 too); a query answers 0 or 1",
                "mute",
            ),
            parse: switch,
            command: |member, mute| ControlCommand::MemberMute { member, mute },
            store: |st, i, v| {
                if let Some(m) = st.members.get_mut(i) {
                    m.mute = v;
                }
            },
            load: |st, i| st.members.get(i).map(|m| Value::Int(m.mute.into())),
        },
    );
    if s.solo {
        param(
            &mut b,
            Param {
                spec: member("solo", SWITCH),
                meta: switch_meta(
                    "1 solos this member in your own mix: while any member is soloed you hear only the soloed ones (and your own monitor); 0 lifts it",
                    "solo",
                ),
                parse: switch,
                command: |member, solo| ControlCommand::MemberSolo { member, solo },
                store: |st, i, v| {
                    if let Some(m) = st.members.get_mut(i) {
                        m.solo = v;
                    }
                },
                load: |st, i| st.members.get(i).map(|m| Value::Int(m.solo.into())),
            },
        );
    }
    b.port(
        &member("name", READ_ONLY),
        Meta::new()
            .doc("Read-only: the name of the member in this seat (empty while the seat is free)")
            .short("name")
            .unit("text"),
        move |c: &mut Ctx, r: &mut Request<'_, '_>| {
            let m = seat(&c.shared.state(), r.index(0) as usize);
            let name = m.and_then(|m| m.name).unwrap_or_default();
            c.answer(r, &[Arg::Str(&name)]);
        },
    );
    b.port(
        &member("stats", READ_ONLY),
        Meta::new()
            .doc("Read-only: ,fiif estimated one-way latency from this member to you (ms; nil until measured), their packets lost, concealment events, their jitter buffer (ms)")
            .short("stats")
            .unit("ms, packets, events, ms"),
        move |c: &mut Ctx, r: &mut Request<'_, '_>| {
            let st = seat(&c.shared.state(), r.index(0) as usize)
                .map(|m| m.stats)
                .unwrap_or_default();
            let latency = st.latency_ms.map_or(Arg::Nil, Arg::Float);
            c.answer(
                r,
                &[
                    latency,
                    Arg::Int(saturate(st.lost)),
                    Arg::Int(saturate(st.concealed)),
                    Arg::Float(st.buffer_ms),
                ],
            );
        },
    );
    if s.send {
        param(
            &mut b,
            Param {
                spec: format!("/send/gain{NUMBER}"),
                meta: gain_meta("Gain of what you send to the others, dB", "send"),
                parse: gain,
                command: |_, db| ControlCommand::SendGain(db),
                store: |st, _, v| st.send.gain_db = v,
                load: |st, _| Some(Value::Float(st.send.gain_db)),
            },
        );
        param(
            &mut b,
            Param {
                spec: format!("/send/mute{SWITCH}"),
                meta: switch_meta(
                    "1 sends silence to the others (they keep hearing your stream's timing), 0 sends what you play",
                    "send mute",
                ),
                parse: switch,
                command: |_, v| ControlCommand::SendMute(v),
                store: |st, _, v| st.send.mute = v,
                load: |st, _| Some(Value::Int(st.send.mute.into())),
            },
        );
    }
    if s.monitor {
        param(
            &mut b,
            Param {
                spec: format!("/monitor/gain{NUMBER}"),
                meta: gain_meta(
                    "Gain of your own signal heard locally (never over the network), dB",
                    "monitor",
                ),
                parse: gain,
                command: |_, db| ControlCommand::MonitorGain(db),
                store: |st, _, v| st.monitor.gain_db = v,
                load: |st, _| Some(Value::Float(st.monitor.gain_db)),
            },
        );
        param(
            &mut b,
            Param {
                spec: format!("/monitor/mute{SWITCH}"),
                meta: switch_meta(
                    "1 stops you hearing yourself locally, 0 brings your own signal back",
                    "monitor mute",
                ),
                parse: switch,
                command: |_, v| ControlCommand::MonitorMute(v),
                store: |st, _, v| st.monitor.mute = v,
                load: |st, _| Some(Value::Int(st.monitor.mute.into())),
            },
        );
    }
    if s.master {
        param(
            &mut b,
            Param {
                spec: format!("/master/gain{NUMBER}"),
                meta: gain_meta(
                    "Gain of the whole mix you hear, before the limiter that keeps it under full scale, dB",
                    "master",
                ),
                parse: gain,
                command: |_, db| ControlCommand::MasterGain(db),
                store: |st, _, v| st.master_gain_db = v,
                load: |st, _| Some(Value::Float(st.master_gain_db)),
            },
        );
    }
    if s.latency {
        param(
            &mut b,
            Param {
                spec: format!("/buffer/latency{CHOICE}"),
                meta: Meta::new()
                    .doc("Jitter buffer policy: \"tight\" gives latency back within a second of a transient; \"safe\" covers delay peaks up to 60 ms for ten seconds (name or index)")
                    .short("latency")
                    .range(0.0, (POLICIES.len() - 1) as f64)
                    .default_text("tight")
                    .unit("policy")
                    .options(&POLICIES.map(|(n, _)| n)),
                parse: latency,
                command: |_, p| ControlCommand::Latency(p),
                store: |st, _, v| st.latency = v,
                load: |st, _| Some(Value::Text(policy_name(st.latency))),
            },
        );
    }
    if s.redundancy {
        param(
            &mut b,
            Param {
                spec: format!("/redundancy{WHOLE}"),
                meta: Meta::new()
                    .doc("Earlier packets carried again in each packet you send (RFC 2198): each one hides a lost packet at the cost of that much more bandwidth")
                    .short("redundancy")
                    .range(0.0, f64::from(MAX_REDUNDANCY))
                    .default_number(0.0)
                    .unit("packets"),
                parse: redundancy,
                command: |_, n| ControlCommand::Redundancy(n),
                store: |st, _, v| st.redundancy = v,
                load: |st, _| Some(Value::Int(st.redundancy.into())),
            },
        );
    }
    if s.record {
        param(
            &mut b,
            Param {
                spec: format!("/record{SWITCH}"),
                meta: switch_meta(
                    "1 records the session (one WAV per member plus the mix), 0 stops recording",
                    "record",
                ),
                parse: switch,
                command: |_, v| ControlCommand::Record(v),
                store: |st, _, v| st.record = v,
                load: |st, _| Some(Value::Int(st.record.into())),
            },
        );
    }
    if s.password {
        b.port(
            "/password:s:S",
            Meta::new()
                .doc("Write-only: a private room's new password. Changes the room's password when you have the one in force; takes the new one after another member changed it. The answer is on the player's terminal")
                .short("password")
                .unit("text"),
            |c: &mut Ctx, r: &mut Request<'_, '_>| {
                let given = r.arg(0).and_then(|a| a.as_str().map(str::to_owned));
                match given.as_deref() {
                    Some("") => c.refuse(r, "an empty password: a private room keeps one"),
                    Some(p) => match c.passwords.as_ref().map(|tx| tx.send(p.to_owned())) {
                        Some(Ok(())) => bump(&c.shared.counters.commands),
                        _ => c.error(r, "this player is stopping"),
                    },
                    None => c.refuse(r, "give the new password as a string"),
                }
            },
        );
    }
    b.port(
        &format!("/stats{READ_ONLY}"),
        Meta::new()
            .doc("Read-only: the latest statistics snapshot, as one JSON string")
            .short("stats")
            .unit("json"),
        |c: &mut Ctx, r: &mut Request<'_, '_>| {
            let json = c.shared.state().stats_json.clone();
            c.answer(r, &[Arg::Str(&json)]);
        },
    );
    b.port(
        &format!("/roster{READ_ONLY}"),
        Meta::new()
            .doc("Read-only: one /roster ,is SEAT NAME per member present, then /roster/end ,i COUNT")
            .short("roster")
            .range(0.0, f64::from(seats))
            .unit("members"),
        |c: &mut Ctx, r: &mut Request<'_, '_>| {
            let st = c.shared.state().clone();
            let mut count = 0;
            let mut failed = false;
            for (i, name) in st
                .members
                .iter()
                .enumerate()
                .filter_map(|(i, m)| Some((i, m.name.as_deref()?)))
            {
                count += 1;
                failed |= r
                    .reply("/roster", &[Arg::Int(saturate(i as u64)), Arg::Str(name)])
                    .is_err();
            }
            failed |= r.reply("/roster/end", &[Arg::Int(count)]).is_err();
            bump(&c.shared.counters.queries);
            if failed {
                bump(&c.shared.counters.reply_failures);
            }
        },
    );
    b.build()
}
