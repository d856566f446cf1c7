//! A two-party session in virtual time: a [`Sender`] and a [`Receiver`] joined by two
//! [`LinkModel`]s (media one way, RTCP both ways). Deterministic for a seed; no sleeps.
#![allow(dead_code)]

pub mod timecode;

use std::sync::Arc;

use netjam_engine::codec::{DecoderFactory, FrameEncoder};
use netjam_engine::link::{LinkConfig, LinkModel};
use netjam_engine::receiver::{Receiver, ReceiverConfig, ReceiverEvent};
use netjam_engine::sender::{Sender, SenderConfig};
use netjam_engine::slip::SlipGuard;
use netjam_engine::synth::{Synth, SynthKind};
use netjam_engine::time::{frames_to_ns, ns_to_frames};
use netjam_engine::wire::rtp::{classify, parse_rtp, PacketKind};
use netjam_engine::wire::AudioFormat;

/// Makes a hostile datagram (or none) for a given step.
pub type GarbageSource = Box<dyn FnMut(u64) -> Option<Vec<u8>>>;

/// Fills one packet's interleaved frames with what the sender captures.
pub type CaptureSource = Box<dyn FnMut(&mut [f32])>;
/// How late the sender's device wakes for the capture period due at a time (ns): its
/// timeline stays whole, the packet leaves that much later.
pub type CaptureLate = Box<dyn FnMut(u64) -> u64>;
/// How much device time the sender's device loses before the capture period due at a
/// time (ns), with no frames for it.
pub type CaptureLost = Box<dyn FnMut(u64) -> u64>;

pub struct Session {
    pub sender: Sender,
    pub receiver: Receiver,
    pub up: LinkModel<Vec<u8>>,
    pub down: LinkModel<Vec<u8>>,
    pub synth: Synth,
    pub format: AudioFormat,
    pub frames: u32,
    pub period: usize,
    pub now: u64,
    next_capture: u64,
    next_play: u64,
    /// Everything the sender captured and everything the receiver played, interleaved.
    pub sent: Vec<f32>,
    pub played: Vec<f32>,
    /// Wall time of each played period's start.
    pub play_times: Vec<u64>,
    pub events: Vec<ReceiverEvent>,
    /// Hostile datagrams injected into the receiver, if set: every n-th step.
    pub garbage: Option<GarbageSource>,
    /// How fast the sender's sample clock runs against the receiver's, in ppm.
    pub sender_ppm: f64,
    /// The playing device's rate when it is not the stream's (the receiver must be told
    /// too, with `Receiver::set_output_rate`).
    pub device_rate: Option<u32>,
    /// What the sender captures, if not `synth`: fills one packet's interleaved frames.
    pub source: Option<CaptureSource>,
    /// The sender's device waking late (a JACK server that misses its deadlines): each
    /// capture period runs this much after it is due, and none before the one before it.
    pub capture_late: Option<CaptureLate>,
    /// The sender's device losing time (a JACK server that drops a cycle and counts on
    /// from where it stopped): before the capture period due at a time, this much passes
    /// with no frames for it, so that period and every later one come that much later.
    pub capture_lost: Option<CaptureLost>,
    /// Device time lost so far: the frames captured before each loss, and its length (ns).
    pub lost: Vec<(u64, u64)>,
    /// The playing device losing time (its JACK server dropping cycles and counting on from
    /// where it stopped): before the play period due at a time, this much passes with no
    /// period, and the receiver is told the frames it lost (`Receiver::device_skipped`), as
    /// the JACK shell's slip guard tells it. With `capture_lost` at the same times, one
    /// machine's hiccup that stalls both servers together.
    pub play_lost: Option<CaptureLost>,
    /// The sender's slip guard, run as the JACK shell runs it: each capture period's
    /// wake-up is checked against the frames accounted for, and time found lost is skipped
    /// in the stream's timeline.
    pub slip: Option<SlipGuard>,
    /// The sender's device counts the time it lost (JACK's frame clock moves on by the
    /// cycles it dropped): the stream's timeline skips it at the first period after the
    /// loss, as the JACK shell does, instead of when the slip guard finds it.
    pub capture_lost_counted: bool,
    /// When set, every RTP datagram the receiver is handed: its arrival and sequence number.
    pub arrivals: Option<Vec<(u64, u16)>>,
}

pub fn sender_config(format: AudioFormat, frames: u32, redundancy: usize, seed: u64) -> SenderConfig {
    SenderConfig {
        redundancy,
        seed,
        name: Some("Test Player".into()),
        ..SenderConfig::new(format, frames)
    }
}

impl Session {
    pub fn new(format: AudioFormat, frames: u32, redundancy: usize, link: LinkConfig, seed: u64) -> Self {
        Self::coded(format, frames, redundancy, link, seed, None, None)
    }

    /// The JACK bench's two players in virtual time: 32-bit float mono at `rate`, `frames`
    /// a packet and a period, on loopback (the bench's path reads 0.05–0.08 ms one way),
    /// drift correction on and the default (`tight`) policy.
    pub fn bench_loopback(rate: u32, frames: u32, seed: u64) -> Self {
        let format = AudioFormat::new(netjam_engine::wire::Codec::F32, rate, 1).expect("format");
        let link = LinkConfig {
            delay_ns: 60_000,
            ..LinkConfig::ideal()
        };
        let mut s = Self::new(format, frames, 0, link, seed);
        s.receiver.set_output_format(format);
        s.receiver.set_drift_correction(true);
        s
    }

    /// A session of a compressed format, with its encoder and the receiver's decoders.
    pub fn coded(
        format: AudioFormat,
        frames: u32,
        redundancy: usize,
        link: LinkConfig,
        seed: u64,
        encoder: Option<Box<dyn FrameEncoder>>,
        decoders: Option<Arc<dyn DecoderFactory>>,
    ) -> Self {
        let sender =
            Sender::with_encoder(sender_config(format, frames, redundancy, seed), encoder).expect("sender");
        let receiver = Receiver::new(ReceiverConfig {
            seed: seed + 1,
            decoders,
            ..ReceiverConfig::new(64)
        });
        let back = LinkConfig {
            loss: Default::default(),
            ..link.clone()
        };
        Self {
            sender,
            receiver,
            up: LinkModel::new(link, seed + 2),
            down: LinkModel::new(back, seed + 3),
            synth: Synth::new(
                SynthKind::Music { bpm: 120.0 },
                format.rate,
                format.channels as usize,
                seed,
            ),
            format,
            frames,
            period: 64,
            now: 0,
            next_capture: 0,
            next_play: 333_333,
            sent: Vec::new(),
            played: Vec::new(),
            play_times: Vec::new(),
            events: Vec::new(),
            garbage: None,
            arrivals: None,
            sender_ppm: 0.0,
            device_rate: None,
            source: None,
            capture_late: None,
            capture_lost: None,
            lost: Vec::new(),
            play_lost: None,
            slip: None,
            capture_lost_counted: false,
        }
    }

    /// Run the session for `ns` of virtual time.
    pub fn run(&mut self, ns: u64) {
        let end = self.now + ns;
        let ch = self.format.channels as usize;
        let capture_ns = (frames_to_ns(self.frames as u64, self.format.rate) as f64
            / (1.0 + self.sender_ppm * 1e-6))
            .round() as u64;
        let play_ns = frames_to_ns(self.period as u64, self.device_rate.unwrap_or(self.format.rate));
        let mut cap = vec![0.0; self.frames as usize * ch];
        let mut out =
            vec![0.0; self.period * self.receiver.output_format().map_or(ch, |f| f.channels as usize)];
        let mut rtcp = [0u8; 1500];
        let mut step = 0u64;
        // When the capture due at `next_capture` really runs.
        let mut late = self.capture_late.take();
        let mut wake =
            |due: u64, after: u64| due.saturating_add(late.as_mut().map_or(0, |l| l(due))).max(after);
        let mut lose = self.capture_lost.take();
        let mut lose_play = self.play_lost.take();
        let mut capture_at = wake(self.next_capture, self.now);
        while self.now < end {
            let next_link = self
                .up
                .next_delivery()
                .unwrap_or(u64::MAX)
                .min(self.down.next_delivery().unwrap_or(u64::MAX));
            self.now = capture_at.min(self.next_play).min(next_link).max(self.now);
            if self.now >= end {
                break;
            }
            step += 1;
            while let Some((at, bytes)) = self.up.poll(self.now) {
                if let (Some(log), PacketKind::Rtp) = (self.arrivals.as_mut(), classify(&bytes)) {
                    if let Ok(rtp) = parse_rtp(&bytes) {
                        log.push((at, rtp.header.sequence));
                    }
                }
                self.receiver.on_datagram(at, &bytes);
            }
            while let Some((at, bytes)) = self.down.poll(self.now) {
                self.sender.on_rtcp(at, &bytes);
            }
            if let Some(g) = self.garbage.as_mut() {
                if let Some(bad) = g(step) {
                    self.receiver.on_datagram(self.now, &bad);
                }
            }
            while let Some(ev) = self.receiver.poll_event() {
                self.events.push(ev);
            }
            if self.now >= capture_at {
                // The period that just ended was captured; packetize and send it.
                match self.source.as_mut() {
                    Some(fill) => fill(&mut cap),
                    None => self.synth.fill(&mut cap),
                }
                self.sent.extend_from_slice(&cap);
                let now = self.now;
                if let Some(g) = self.slip.as_mut() {
                    let skip = g.on_period(now, u64::from(self.frames));
                    if skip > 0 {
                        self.sender.skip_frames(skip);
                    }
                }
                let up = &mut self.up;
                self.sender.push_frames(now, &cap, |p| {
                    up.send(now, p.to_vec(), p.len());
                });
                if let Some(n) = self.sender.poll_rtcp(now, &mut rtcp) {
                    self.up.send(now, rtcp[..n].to_vec(), n);
                }
                self.next_capture += capture_ns;
                let lost = lose.as_mut().map_or(0, |l| l(self.next_capture));
                if lost > 0 {
                    self.lost.push(((self.sent.len() / ch) as u64, lost));
                    self.next_capture += lost;
                    if self.capture_lost_counted {
                        let frames = ns_to_frames(lost, self.format.rate);
                        self.sender.skip_frames(frames);
                        if let Some(g) = self.slip.as_mut() {
                            g.account_skipped(frames);
                        }
                    }
                }
                capture_at = wake(self.next_capture, self.now);
            }
            if self.now >= self.next_play {
                let lost = lose_play.as_mut().map_or(0, |l| l(self.next_play));
                if lost > 0 {
                    self.next_play += lost;
                    let rate = self.device_rate.unwrap_or(self.format.rate);
                    self.receiver.device_skipped(ns_to_frames(lost, rate));
                    continue;
                }
                match self.receiver.output_format() {
                    Some(f) => {
                        out.resize(self.period * f.channels as usize, 0.0);
                        self.receiver.play(self.now, &mut out);
                        self.played.extend_from_slice(&out);
                    }
                    None => {
                        // Before a stream fixes the output format the receiver plays one
                        // channel: one period of it, recorded on every channel, so that
                        // output frames count alike here and in the receiver's log.
                        out.resize(self.period * ch, 0.0);
                        self.receiver.play(self.now, &mut out[..self.period]);
                        for &x in &out[..self.period] {
                            self.played.extend(std::iter::repeat(x).take(ch));
                        }
                    }
                }
                self.play_times.push(self.now);
                if let Some(n) = self.receiver.poll_rtcp(self.now, &mut rtcp) {
                    self.down.send(self.now, rtcp[..n].to_vec(), n);
                }
                self.next_play += play_ns;
            }
        }
        self.capture_late = late;
        self.capture_lost = lose;
        self.play_lost = lose_play;
    }

    /// Start the device's first period `ns` after the sender's first capture (before
    /// `run`): the device's phase against the sender's packets.
    pub fn set_play_phase(&mut self, ns: u64) {
        self.next_play = self.now + ns;
    }

    /// Wall time at which output frame `frame` (counted from the first played) left.
    pub fn output_time_ns(&self, frame: usize) -> u64 {
        let period = self.period;
        self.play_times[frame / period] + frames_to_ns((frame % period) as u64, self.format.rate)
    }

    /// Resume capture and playout clocks at `t` (after a stretch driven by hand).
    pub fn reset_clocks_at(&mut self, t: u64) {
        self.now = t;
        self.next_capture = t;
        self.next_play = self
            .play_times
            .last()
            .map_or(t, |p| *p + frames_to_ns(self.period as u64, self.format.rate));
    }

    /// Offset (in frames) of the sent signal within the played one, found by exact match
    /// of a run of frames from the middle of what was sent.
    pub fn alignment(&self) -> Option<usize> {
        let ch = self.format.channels as usize;
        let sent_frames = self.sent.len() / ch;
        let probe_at = sent_frames / 2;
        let probe = &self.sent[probe_at * ch..(probe_at + 256) * ch];
        let played_frames = self.played.len() / ch;
        (0..played_frames.saturating_sub(256))
            .find(|&p| &self.played[p * ch..(p + 256) * ch] == probe)
            .map(|p| p - probe_at)
    }
}
