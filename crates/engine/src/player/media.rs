//! [`Media`], the player's audio half: what you play goes out through one [`Sender`], every
//! other member is heard through a receiver of its own ([`MemberReceivers`]) and mixed with
//! its gain, pan and mute, your own signal is added as a local monitor, and the whole mix
//! goes through a master gain and the output limiter, so what you hear never exceeds full
//! scale.
//!
//! It runs on the audio thread: everything is reserved in [`Media::new`], and
//! [`Media::handle`], [`Media::process`], [`Media::apply`] and [`Media::report`] never
//! allocate, lock or block (`tests/no_alloc_room.rs` in the binary counts it).

use crate::limiter::LimiterStats;
use crate::members::{MemberId, MemberReceivers, MembersConfig, MembersStats};
use crate::mixer::{fader_gain, Level, Mixer, StripParams};
use crate::privacy::seal::{MediaSeal, SealStats};
use crate::receiver::{ReceiverConfig, ReceiverStats};
use crate::room::ROOM_SEATS;
use crate::roundtrip::RoundTripMeter;
use crate::sender::{Sender, SenderStats};
use crate::wire::PacketKind;

use super::{Command, Transmit};

/// Frames of send scratch reserved per channel (longer periods are sent in parts).
const SEND_SCRATCH_FRAMES: usize = 4096;
/// The largest RTCP packet the receivers write.
const RTCP_BYTES: usize = 1500;

/// How a [`Media`] is set up.
#[derive(Debug, Clone)]
pub struct MediaConfig {
    /// Members heard at once (1..=[`ROOM_SEATS`]).
    pub capacity: usize,
    /// Channels of the output (device) the mix is played into.
    pub out_channels: usize,
    /// Every member's receiver is made from this (`max_channels`: the most a member may
    /// send; `buffer`, `decoders` as for `jam`).
    pub receiver: ReceiverConfig,
    /// Follow each member's clock by resampling.
    pub drift_correction: bool,
    /// Hear any SSRC that arrives, up to `capacity`, without an `Assign` (peer-to-peer or
    /// tests; a room leaves it off so that only the roster is heard).
    pub admit_unknown: bool,
    /// A two-player jam: the one other player, heard as this member whatever its SSRC
    /// (see [`crate::members::MembersConfig::one_peer`]; `capacity` is then 1).
    pub one_peer: Option<MemberId>,
}

impl MediaConfig {
    /// `capacity` members of up to two channels each, into `out_channels`; drift
    /// correction on, unknown SSRCs dropped.
    pub fn new(capacity: usize, out_channels: usize) -> Self {
        Self {
            capacity,
            out_channels,
            receiver: ReceiverConfig::new(2),
            drift_correction: true,
            admit_unknown: false,
            one_peer: None,
        }
    }
}

/// One member as the audio half last saw it.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct MemberReport {
    /// Whether the slot is held (the rest is meaningful only then).
    pub active: bool,
    pub ssrc: u32,
    pub member: MemberId,
    /// Its mix settings.
    pub mix: StripParams,
    /// What it sent since the last report, before its gain.
    pub level: Level,
    pub heard: ReceiverStats,
    /// Round trip to this member (through the server in a room), from its reports on your
    /// stream; ms.
    pub rtt_ms: Option<f64>,
}

impl MemberReport {
    /// Mouth to ear, from this member's playing to your hearing, in ms: half the round trip
    /// to it (the one-way network and forwarding delay), what its jitter buffer adds, and
    /// `fixed_ms` (a packet of audio, the devices' periods, resamplers at the edges: what
    /// the caller knows of its setup); `None` before the first round trip is known.
    pub fn mouth_to_ear_ms(&self, fixed_ms: f64) -> Option<f64> {
        let jb = &self.heard.jitter_buffer;
        self.rtt_ms.map(|rtt| rtt / 2.0 + fixed_ms + jb.added_latency_ms)
    }
}

/// The in-band round trip as the meter last measured it (see [`Media::measure_round_trip`]).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct RoundTrip {
    /// The last round trip found, ms.
    pub ms: Option<f64>,
    /// Bursts the meter found, and lost.
    pub found: u64,
    pub lost: u64,
    /// How long the packet heard when the last burst was found had waited in its member's
    /// jitter buffer, so the stages of that round trip can be set beside it, ms.
    pub buffer_ms: Option<f64>,
}

/// What the audio half reports: what you send, and each member you hear.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct MediaReport {
    pub sent: SenderStats,
    pub routing: MembersStats,
    /// By slot; see [`MediaReport::active_members`].
    pub members: [MemberReport; ROOM_SEATS],
    /// Your own signal since the last report, before the monitor gain.
    pub monitor: Level,
    pub monitor_mix: StripParams,
    /// Linear gain on the whole mix, before the limiter.
    pub master_gain: f32,
    /// The gain on what you send as set, dB (−∞: silence), and whether your send is muted
    /// (the stream flows on, silent).
    pub send_gain_db: f32,
    pub send_mute: bool,
    /// What the mix's output limiter did (its most gain reduction is since the last
    /// report).
    pub limiter: LimiterStats,
    /// Commands applied, and those refused (no free slot, or no such member or SSRC).
    pub commands: u64,
    pub command_errors: u64,
    /// The in-band mouth-to-ear round trip through the room when measuring (see
    /// [`Media::measure_round_trip`]), ms.
    pub round_trip_ms: Option<f64>,
    /// Bursts the round-trip meter found, and lost.
    pub round_trip_found: u64,
    pub round_trip_lost: u64,
    /// A private room's SFrame stage (`None`: the room has no password).
    pub sframe: Option<SealStats>,
    /// `None`: nothing records; else whether the recording runs (see [`Media::recording`]).
    pub recording: Option<bool>,
}

impl MediaReport {
    /// The members heard.
    pub fn active_members(&self) -> impl Iterator<Item = &MemberReport> {
        self.members.iter().filter(|m| m.active)
    }
}

/// See the module docs.
pub struct Media {
    sender: Sender,
    members: MemberReceivers,
    mixer: Mixer,
    out_channels: usize,
    commands_applied: u64,
    command_errors: u64,
    /// Linear gain on what is sent now, and where the ramp is going.
    send_gain: f32,
    send_target: f32,
    send_db: f32,
    send_mute: bool,
    /// What is sent when the gain is not unity (reserved at start; longer periods go in parts).
    send_scratch: Vec<f32>,
    /// Who sits at each control seat (from [`Command::Seat`]).
    seats: [Option<MemberId>; ROOM_SEATS],
    meter: RoundTripMeter,
    measuring: bool,
    /// The heard packet's wait in its jitter buffer when the meter last found its burst.
    buffer_at_round_trip_ms: Option<f64>,
    /// What is sent while measuring: the input plus the meter's burst (reserved at start).
    measure_scratch: Vec<f32>,
    /// A private room's sealing of what is sent and opening of what is heard.
    seal: Option<MediaSeal>,
    /// The receivers' RTCP, written here before it is transmitted.
    rtcp: Vec<u8>,
    /// `None`: nothing records; else whether the recording is running.
    recording: Option<bool>,
}

impl std::fmt::Debug for Media {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Media")
            .field("sender", &self.sender)
            .field("members", &self.members)
            .finish_non_exhaustive()
    }
}

impl Media {
    /// Reserve everything for `config` around `sender` (the only allocation).
    pub fn new(sender: Sender, config: MediaConfig) -> Self {
        let rate = sender.format().rate;
        let channels_in = usize::from(sender.format().channels.max(1));
        let capacity = config.capacity.clamp(1, ROOM_SEATS);
        let out_channels = config.out_channels.max(1);
        let mut members = MemberReceivers::new(MembersConfig {
            capacity,
            receiver: config.receiver,
            rate,
            admit_unknown: config.admit_unknown,
            one_peer: config.one_peer,
        });
        members.set_reporter_ssrc(sender.ssrc());
        members.set_drift_correction(config.drift_correction);
        Self {
            sender,
            members,
            mixer: Mixer::new(capacity, out_channels, rate),
            out_channels,
            commands_applied: 0,
            command_errors: 0,
            send_gain: 1.0,
            send_target: 1.0,
            send_db: 0.0,
            send_mute: false,
            send_scratch: vec![0.0; SEND_SCRATCH_FRAMES * channels_in],
            seats: [None; ROOM_SEATS],
            meter: RoundTripMeter::new(u64::from(rate), u64::from(rate) / 2),
            measuring: false,
            buffer_at_round_trip_ms: None,
            measure_scratch: vec![0.0; crate::jitter::MAX_PERIOD * channels_in],
            seal: None,
            rtcp: vec![0; RTCP_BYTES],
            recording: None,
        }
    }

    /// Make this a private room's player: seal what it sends and open what it hears with
    /// `seal`; set before the stream starts, before any `Assign`. A member's packets that do
    /// not open are dropped and counted.
    pub fn set_seal(&mut self, seal: MediaSeal) {
        self.seal = Some(seal);
    }

    /// Something records this player (the caller's recorder follows
    /// [`Media::recording`]): [`Command::Record`] is accepted from now on, and the
    /// recording runs until it says otherwise.
    pub fn allow_recording(&mut self) {
        self.recording = Some(true);
    }

    /// Whether the recording runs (`None`: nothing records).
    pub fn recording(&self) -> Option<bool> {
        self.recording
    }

    /// Measure the mouth-to-ear round trip through the room in band: once a second a short
    /// quiet burst goes out on the first channel of what you send and is looked for in the
    /// first channel of the members' mix (before your own monitor is added). It comes back
    /// when another member sends you what they hear (a player monitoring through): the
    /// figure is then your device, the server both ways, their jitter buffer and device,
    /// and yours. A member muted in your mix blinds it.
    pub fn measure_round_trip(&mut self, on: bool) {
        self.measuring = on;
    }

    pub fn sender(&self) -> &Sender {
        &self.sender
    }

    /// The members' receivers (statistics, events).
    pub fn members(&self) -> &MemberReceivers {
        &self.members
    }

    /// The members' receivers, to set them up before the stream starts (buffer policy).
    pub fn members_mut(&mut self) -> &mut MemberReceivers {
        &mut self.members
    }

    pub fn mixer(&self) -> &Mixer {
        &self.mixer
    }

    /// The member at each control seat, as the audio half knows it.
    pub fn seats(&self) -> &[Option<MemberId>; ROOM_SEATS] {
        &self.seats
    }

    /// Apply one command; `false` when it was refused (counted in the report).
    pub fn apply(&mut self, command: Command) -> bool {
        let ok = match command {
            Command::Assign { ssrc, member } => {
                let new = self.members.slot_of(ssrc).is_none()
                    || self.members.slot_of_member(member) != self.members.slot_of(ssrc);
                match self.members.assign(ssrc, member) {
                    Ok(slot) => {
                        if new {
                            self.mixer.reset_strip(slot);
                        }
                        if let Some(seal) = &mut self.seal {
                            seal.assign(slot, ssrc);
                        }
                        true
                    }
                    Err(_) => false,
                }
            }
            Command::Release { ssrc } => {
                if let Some(owner) = self.members.slot_of(ssrc).and_then(|s| self.members.owner(s)) {
                    for seat in &mut self.seats {
                        if *seat == Some(owner.member) {
                            *seat = None;
                        }
                    }
                }
                self.members.release(ssrc).is_some()
            }
            Command::Rekey { epoch, key } => match &mut self.seal {
                Some(seal) => {
                    seal.rekey(key, epoch);
                    true
                }
                None => false,
            },
            Command::Seat { member, seat } => match self.seats.get_mut(usize::from(seat)) {
                Some(at) => {
                    *at = Some(member);
                    for (s, other) in self.seats.iter_mut().enumerate() {
                        if s != usize::from(seat) && *other == Some(member) {
                            *other = None;
                        }
                    }
                    true
                }
                None => false,
            },
            Command::Gain { member, db } => self.with_member(member, |m, s| m.set_gain_db(s, db)),
            Command::Pan { member, pan } => self.with_member(member, |m, s| m.set_pan(s, pan)),
            Command::Mute { member, mute } => self.with_member(member, |m, s| m.set_mute(s, mute)),
            Command::Solo { member, solo } => self.with_member(member, |m, s| m.set_solo(s, solo)),
            Command::MonitorGain { db } => {
                self.mixer.set_monitor_gain_db(db);
                true
            }
            Command::MonitorPan { pan } => {
                self.mixer.set_monitor_pan(pan);
                true
            }
            Command::MonitorMute { mute } => {
                self.mixer.set_monitor_mute(mute);
                true
            }
            Command::MasterGain { db } => {
                self.mixer.set_master_gain_db(db);
                true
            }
            Command::SendGain { db } => {
                self.send_db = db;
                self.send_target = send_linear(db, self.send_mute);
                true
            }
            Command::SendMute { mute } => {
                self.send_mute = mute;
                self.send_target = send_linear(self.send_db, mute);
                true
            }
            Command::Latency { policy } => {
                self.members.set_latency_policy(policy);
                true
            }
            Command::Record { on } => match &mut self.recording {
                Some(running) => {
                    *running = on;
                    true
                }
                None => false,
            },
        };
        if ok {
            self.commands_applied += 1;
        } else {
            self.command_errors += 1;
        }
        ok
    }

    fn with_member(&mut self, member: MemberId, f: impl FnOnce(&mut Mixer, usize)) -> bool {
        match self.members.slot_of_member(member) {
            Some(slot) => {
                f(&mut self.mixer, slot);
                true
            }
            None => false,
        }
    }

    /// One datagram that arrived at `now_ns` (RTP or RTCP from the room or a member; the
    /// caller has taken control messages away), of the `kind` the socket sorted it into
    /// ([`crate::room::Demux::media_kind`]; nothing here sorts it again). Opened in place
    /// in a private room, so `datagram` is the caller's buffer. Whatever it is, it never
    /// panics: what does not parse, open or belong to a member is dropped and counted.
    pub fn handle(&mut self, now_ns: u64, kind: PacketKind, datagram: &mut [u8]) {
        let len = match (&mut self.seal, kind) {
            // A private room: a member's packet is heard only if it opens.
            (Some(seal), PacketKind::Rtp) => {
                let ssrc = datagram
                    .get(8..12)
                    .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                match seal.open(ssrc.and_then(|s| self.members.slot_of(s)), datagram) {
                    Some(n) => n,
                    None => return,
                }
            }
            _ => datagram.len(),
        };
        let bytes = &datagram[..len];
        if kind == PacketKind::Rtcp {
            self.sender.on_rtcp(now_ns, bytes);
        }
        self.members.receive(now_ns, kind, bytes);
    }

    /// One device period at `now_ns`: send `input` (interleaved, the sender's channels)
    /// and fill `output` (interleaved, [`MediaConfig::out_channels`]) with the mix; every
    /// datagram it makes goes to `tx`. Call [`Media::apply`] and [`Media::handle`] for what
    /// came in since the last period first: a member assigned now is heard from this
    /// period's packets on.
    pub fn process(&mut self, now_ns: u64, input: &[f32], output: &mut [f32], tx: &mut impl Transmit) {
        let in_channels = usize::from(self.sender.format().channels.max(1));
        if self.measuring && input.len() <= self.measure_scratch.len() {
            // Taken and put back: no allocation.
            let mut scratch = std::mem::take(&mut self.measure_scratch);
            let outgoing = &mut scratch[..input.len()];
            outgoing.copy_from_slice(input);
            self.meter.on_outgoing(outgoing, in_channels);
            self.send_input(now_ns, outgoing, tx);
            self.measure_scratch = scratch;
        } else {
            self.send_input(now_ns, input, tx);
        }
        let frames = output.len() / self.out_channels;
        self.members.render(now_ns, frames);
        self.mixer.begin(output);
        for slot in 0..self.members.capacity() {
            if let Some((heard, channels)) = self.members.output(slot) {
                self.mixer.add(slot, heard, channels, output);
            }
        }
        if self.measuring {
            // The members' mix, before your own monitor is added.
            let found = self.meter.counts().0;
            self.meter.on_incoming(output, self.out_channels);
            if self.meter.counts().0 != found {
                let held = (0..self.members.capacity()).find(|&s| self.members.owner(s).is_some());
                self.buffer_at_round_trip_ms = held
                    .and_then(|s| self.members.receiver(s))
                    .and_then(|r| r.last_residence_ms());
            }
        }
        self.mixer.add_monitor(input, in_channels, output);
        self.mixer.finish(output);
        while let Some(n) = self.members.poll_rtcp(now_ns, &mut self.rtcp) {
            tx.transmit(now_ns, &self.rtcp[..n]);
        }
        // Stream starts and goodbyes are in each member's counters; the roster, not the
        // media, decides who is in the room.
        while self.members.poll_event().is_some() {}
    }

    /// The device lost `frames` of time without counting them (see
    /// [`crate::slip`]): the stream skips as much, and what was due meanwhile is dropped.
    pub fn skipped(&mut self, frames: u64) {
        self.sender.skip_frames(frames);
        self.members.device_skipped(frames);
    }

    /// Send a final report and BYE.
    pub fn finish(&mut self, now_ns: u64, tx: &mut impl Transmit) {
        if let Some(n) = self.sender.bye(now_ns, &mut self.rtcp) {
            tx.transmit(now_ns, &self.rtcp[..n]);
        }
    }

    /// Send what `input` holds through the send gain: as it is at unity, else scaled
    /// (ramping from the last gain to the new one over the period) in reserved parts.
    fn send_input(&mut self, now_ns: u64, input: &[f32], tx: &mut impl Transmit) {
        if self.send_gain == 1.0 && self.send_target == 1.0 {
            self.send_frames(now_ns, input, tx);
            return;
        }
        let channels = usize::from(self.sender.format().channels.max(1));
        let frames = input.len() / channels;
        let (from, to) = (self.send_gain, self.send_target);
        let mut scratch = std::mem::take(&mut self.send_scratch);
        let mut done = 0;
        for chunk in input.chunks(scratch.len()) {
            let out = &mut scratch[..chunk.len()];
            for (k, (o, x)) in out.iter_mut().zip(chunk).enumerate() {
                let frame = (done + k) / channels;
                let g = from + (to - from) * (frame + 1) as f32 / frames.max(1) as f32;
                *o = x * g;
            }
            done += chunk.len();
            self.send_frames(now_ns, &scratch[..chunk.len()], tx);
        }
        self.send_scratch = scratch;
        self.send_gain = to;
    }

    /// Packetize `input` (sealed in a private room) and the sender's RTCP, out to `tx`.
    fn send_frames(&mut self, now_ns: u64, input: &[f32], tx: &mut impl Transmit) {
        let seal = &mut self.seal;
        self.sender.push_frames(now_ns, input, |p| {
            let p = match seal {
                Some(seal) => match seal.seal(p) {
                    Some(sealed) => sealed,
                    None => return,
                },
                None => p,
            };
            tx.transmit(now_ns, p);
        });
        if let Some(n) = self.sender.poll_rtcp(now_ns, &mut self.rtcp) {
            tx.transmit(now_ns, &self.rtcp[..n]);
        }
    }

    /// Fill `per_seat` extra output ports per control seat ([`ROOM_SEATS`] seats, seat by
    /// seat: seat s, channel c is port `s × per_seat + c`, each `frames` long in `outputs`):
    /// the member at the seat as its receiver rendered it in the last [`Media::process`]
    /// (before your gain, pan and mute, like a recording), silence where nobody sits. A
    /// mono member is on every port of its seat, a stereo one on a single port as the mean
    /// of its channels; otherwise port c carries channel c (silence past its last).
    pub fn member_ports(&self, frames: usize, per_seat: usize, outputs: &mut [f32]) {
        if per_seat == 0 || frames == 0 {
            outputs.fill(0.0);
            return;
        }
        let mut ports = outputs.chunks_exact_mut(frames);
        for seat in 0..ROOM_SEATS {
            let heard = self.seats[seat]
                .and_then(|m| self.members.slot_of_member(m))
                .and_then(|slot| self.members.output(slot));
            for c in 0..per_seat {
                let Some(port) = ports.next() else { return };
                member_port(heard, per_seat, c, port);
            }
        }
        for port in ports {
            port.fill(0.0);
        }
    }

    /// The in-band round trip (see [`Media::measure_round_trip`]).
    pub fn round_trip(&self) -> RoundTrip {
        let (found, lost) = self.meter.counts();
        let rate = f64::from(self.sender.format().rate);
        RoundTrip {
            ms: self.meter.last_rtt_frames().map(|f| f as f64 * 1000.0 / rate),
            found,
            lost,
            buffer_ms: self.buffer_at_round_trip_ms,
        }
    }

    /// Everything a report holds, taking the meters' readings (allocation-free).
    pub fn report(&mut self) -> MediaReport {
        let round_trip = self.round_trip();
        let mut s = MediaReport {
            sent: self.sender.stats(),
            routing: self.members.stats(),
            monitor: self.mixer.take_monitor_level(),
            monitor_mix: self.mixer.monitor_params(),
            master_gain: self.mixer.master_gain(),
            send_gain_db: self.send_db,
            send_mute: self.send_mute,
            limiter: self.mixer.take_limiter(),
            commands: self.commands_applied,
            command_errors: self.command_errors,
            round_trip_ms: round_trip.ms,
            round_trip_found: round_trip.found,
            round_trip_lost: round_trip.lost,
            sframe: self.seal.as_ref().map(MediaSeal::stats),
            recording: self.recording,
            ..MediaReport::default()
        };
        for (slot, m) in s.members.iter_mut().enumerate().take(self.members.capacity()) {
            let level = self.mixer.take_level(slot);
            if let Some((owner, heard)) = self.members.member_stats(slot) {
                *m = MemberReport {
                    active: true,
                    ssrc: owner.ssrc,
                    member: owner.member,
                    mix: self.mixer.params(slot).unwrap_or_default(),
                    level,
                    heard,
                    rtt_ms: self.sender.rtt_to_ms(owner.ssrc),
                };
            }
        }
        s
    }
}

/// A send gain in dB, or silence when muted.
fn send_linear(db: f32, mute: bool) -> f32 {
    fader_gain(db.min(12.0), mute || db.is_nan())
}

/// Port `c` of `per_seat` for one seat: what the member there rendered (interleaved, its
/// own channel count), or silence (see [`Media::member_ports`]).
fn member_port(heard: Option<(&[f32], usize)>, per_seat: usize, c: usize, port: &mut [f32]) {
    let Some((audio, channels)) = heard.filter(|(_, ch)| *ch > 0) else {
        port.fill(0.0);
        return;
    };
    let frames = port.len().min(audio.len() / channels);
    if channels == 1 {
        port[..frames].copy_from_slice(&audio[..frames]);
    } else if per_seat == 1 {
        let scale = 1.0 / channels as f32;
        for (x, frame) in port.iter_mut().zip(audio.chunks_exact(channels)) {
            *x = frame.iter().sum::<f32>() * scale;
        }
    } else if c < channels {
        for (x, frame) in port.iter_mut().zip(audio.chunks_exact(channels)) {
            *x = frame[c];
        }
    } else {
        port[..frames].fill(0.0);
    }
    port[frames..].fill(0.0);
}

#[cfg(test)]
mod tests {
    use super::{member_port, Command, Media, MediaConfig};
    use crate::sender::{Sender, SenderConfig};
    use crate::wire::{AudioFormat, Codec};

    #[test]
    fn the_report_says_the_send_gain_and_mute_as_set() {
        let format = AudioFormat::new(Codec::L16, 48_000, 1).expect("format");
        let sender = Sender::new(SenderConfig::new(format, 64)).expect("sender");
        let mut media = Media::new(sender, MediaConfig::new(2, 1));
        let r = media.report();
        assert_eq!((r.send_gain_db, r.send_mute), (0.0, false));
        media.apply(Command::SendGain { db: -6.5 });
        media.apply(Command::SendMute { mute: true });
        let r = media.report();
        assert_eq!((r.send_gain_db, r.send_mute), (-6.5, true));
        // Unmuted, the gain set before the mute is back.
        media.apply(Command::SendMute { mute: false });
        let r = media.report();
        assert_eq!((r.send_gain_db, r.send_mute), (-6.5, false));
    }

    #[test]
    fn a_seats_ports_carry_its_members_channels() {
        let mut port = [9.0f32; 3];
        // Nobody: silence.
        member_port(None, 2, 0, &mut port);
        assert_eq!(port, [0.0; 3]);
        // Mono on every port of the seat.
        member_port(Some((&[0.1, 0.2, 0.3], 1)), 2, 1, &mut port);
        assert_eq!(port, [0.1, 0.2, 0.3]);
        let stereo: &[f32] = &[0.1, -0.1, 0.2, -0.2, 0.3, -0.3];
        member_port(Some((stereo, 2)), 2, 1, &mut port);
        assert_eq!(port, [-0.1, -0.2, -0.3]);
        // Stereo on a single port: the mean of its channels.
        member_port(Some((&[0.5, 0.1, 0.2, 0.2, 0.0, 1.0], 2)), 1, 0, &mut port);
        assert_eq!(port, [0.3, 0.2, 0.5]);
        // Stereo on a seat of three ports: the third is silent.
        member_port(Some((stereo, 2)), 3, 2, &mut port);
        assert_eq!(port, [0.0; 3]);
        // A short block is padded with silence.
        member_port(Some((&[0.7], 1)), 1, 0, &mut port);
        assert_eq!(port, [0.7, 0.0, 0.0]);
    }
}
