//! Hearing many senders at once: one pre-allocated [`Receiver`] per room member, keyed by
//! SSRC.
//!
//! A room client hears every other member through a receiver of its own (jitter buffer,
//! concealment, drift correction), so one member's loss or clock never disturbs another's
//! playout. [`MemberReceivers`] holds a fixed number of receivers, all built in
//! [`MemberReceivers::new`]; the control side hands a slot to a member's SSRC
//! ([`MemberReceivers::assign`]) and takes it back ([`MemberReceivers::release`]). A slot
//! handed to another member is cleared first ([`Receiver::clear`]): nothing of the previous
//! member is heard again.
//!
//! [`MemberReceivers::receive`] routes each datagram by the SSRC it comes from: RTP by its
//! header's SSRC, RTCP by the sender SSRC of its first packet. An RTP datagram from an SSRC
//! that holds no slot is counted and dropped — unless the set admits unknown senders
//! ([`MembersConfig::admit_unknown`], for tests and peer-to-peer use), which then take free
//! slots until none is left. RTCP from an SSRC that is no member (e.g. another member's
//! report about our own stream) is counted apart: it is for the caller's sender. A
//! two-player jam hears one peer whatever its SSRC ([`MembersConfig::one_peer`]): a single
//! slot takes every datagram, and its receiver treats a new SSRC as the peer restarting.
//!
//! Each period [`MemberReceivers::render`] plays every member into its own pre-allocated
//! buffer, in the member's own channel count, for a [`crate::mixer::Mixer`] to sum.
//!
//! Realtime: every method after `new` runs on the audio thread and never allocates, locks
//! or blocks (a member's compressed stream makes its decoder when it starts, as
//! [`Receiver`] does). Every datagram may be hostile: it is counted and dropped, never a
//! panic.

use crate::delay::{BufferMode, LatencyPolicy};
use crate::jitter::MAX_PERIOD;
use crate::receiver::{Receiver, ReceiverConfig, ReceiverEvent, ReceiverStats};
use crate::wire::PacketKind;

/// Who a slot belongs to, as the control side names room members.
pub type MemberId = u32;

/// Why a member could not be given a slot.
#[derive(Debug, thiserror::Error, Clone, Copy, PartialEq, Eq)]
pub enum MembersError {
    #[error("all {capacity} member slots are taken: release one first")]
    Full { capacity: usize },
}

/// How [`MemberReceivers`] is built.
#[derive(Debug, Clone)]
pub struct MembersConfig {
    /// Slots (members heard at once).
    pub capacity: usize,
    /// Every slot's receiver is made from this (slot `i` with seed `receiver.seed + i`);
    /// `receiver.max_channels` is the most channels a member may send.
    pub receiver: ReceiverConfig,
    /// The output (device) rate: members sending at another rate are refused.
    pub rate: u32,
    /// Give a free slot to the first RTP packet of an unknown SSRC (its member id is then
    /// the SSRC). Off for a room, where the roster decides who is heard.
    pub admit_unknown: bool,
    /// A two-player jam: one slot, held by this member from the start, that takes every
    /// datagram whatever its SSRC (the receiver hears a new SSRC as the peer restarting);
    /// `capacity` and `admit_unknown` are then beside the point.
    pub one_peer: Option<MemberId>,
}

impl MembersConfig {
    /// `capacity` members of up to `max_channels` at `rate`, unknown SSRCs dropped.
    pub fn new(capacity: usize, max_channels: usize, rate: u32) -> Self {
        Self {
            capacity,
            receiver: ReceiverConfig::new(max_channels),
            rate,
            admit_unknown: false,
            one_peer: None,
        }
    }
}

/// Counters of what the set routed (each member's receiver counts the rest).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MembersStats {
    pub datagrams: u64,
    /// RTP from an SSRC that holds no slot: dropped.
    pub unknown_ssrc: u64,
    /// RTCP whose sender holds no slot (a report about our own stream, or a stray).
    pub unrouted_rtcp: u64,
    /// Neither RTP nor RTCP, or too short to name its SSRC.
    pub not_rtp: u64,
    /// Unknown SSRCs given a slot ([`MembersConfig::admit_unknown`]).
    pub admitted: u64,
    /// Unknown SSRCs refused because every slot was taken.
    pub refused_full: u64,
    pub assigned: u64,
    pub released: u64,
    /// Periods a member was not played because it sends more channels than reserved.
    pub too_many_channels: u64,
}

/// One member's slot: who holds it, its receiver, what it played this period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SlotOwner {
    pub ssrc: u32,
    pub member: MemberId,
}

#[derive(Debug)]
struct Slot {
    receiver: Receiver,
    owner: Option<SlotOwner>,
    out: Vec<f32>,
    /// Channels of what `out` holds this period (0: nothing played).
    channels: usize,
    frames: usize,
}

/// See the module docs.
#[derive(Debug)]
pub struct MemberReceivers {
    slots: Vec<Slot>,
    max_channels: usize,
    admit_unknown: bool,
    /// See [`MembersConfig::one_peer`].
    one_peer: bool,
    /// Where the round-robin of RTCP reports and events resumes.
    next_rtcp: usize,
    stats: MembersStats,
}

impl MemberReceivers {
    /// Build every slot's receiver and buffers (the only allocation).
    pub fn new(config: MembersConfig) -> Self {
        let max_channels = config.receiver.max_channels.clamp(1, 64);
        let capacity = if config.one_peer.is_some() {
            1
        } else {
            config.capacity
        };
        let mut slots: Vec<Slot> = (0..capacity)
            .map(|i| {
                let mut receiver = Receiver::new(ReceiverConfig {
                    seed: config.receiver.seed.wrapping_add(i as u64),
                    ..config.receiver.clone()
                });
                receiver.set_output_rate(config.rate);
                Slot {
                    receiver,
                    owner: None,
                    out: vec![0.0; MAX_PERIOD * max_channels],
                    channels: 0,
                    frames: 0,
                }
            })
            .collect();
        if let (Some(member), Some(slot)) = (config.one_peer, slots.first_mut()) {
            slot.owner = Some(SlotOwner { ssrc: 0, member });
        }
        Self {
            slots,
            max_channels,
            admit_unknown: config.admit_unknown,
            one_peer: config.one_peer.is_some(),
            next_rtcp: 0,
            stats: MembersStats::default(),
        }
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Slots held.
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.owner.is_some()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Let unknown SSRCs take free slots (see [`MembersConfig::admit_unknown`]).
    pub fn set_admit_unknown(&mut self, on: bool) {
        self.admit_unknown = on;
    }

    /// Every receiver reports (RTCP RR, SDES) under `ssrc`: the client's sender's SSRC.
    pub fn set_reporter_ssrc(&mut self, ssrc: u32) {
        self.slots.iter_mut().for_each(|s| s.receiver.set_ssrc(ssrc));
    }

    /// Follow each sender's clock by resampling (see [`Receiver::set_drift_correction`]).
    pub fn set_drift_correction(&mut self, on: bool) {
        self.slots
            .iter_mut()
            .for_each(|s| s.receiver.set_drift_correction(on));
    }

    pub fn set_buffer_mode(&mut self, mode: BufferMode) {
        self.slots
            .iter_mut()
            .for_each(|s| s.receiver.set_buffer_mode(mode));
    }

    pub fn set_latency_policy(&mut self, policy: LatencyPolicy) {
        self.slots
            .iter_mut()
            .for_each(|s| s.receiver.set_latency_policy(policy));
    }

    /// Hear `ssrc` as `member` in a slot of its own; returns the slot. An SSRC that holds a
    /// slot keeps it (under the new member id; a different member starts clean). A free slot
    /// is cleared before it is handed out.
    pub fn assign(&mut self, ssrc: u32, member: MemberId) -> Result<usize, MembersError> {
        if let Some(i) = self.slot_of(ssrc) {
            let slot = &mut self.slots[i];
            if slot.owner.is_some_and(|o| o.member != member) {
                slot.receiver.clear();
            }
            slot.owner = Some(SlotOwner { ssrc, member });
            return Ok(i);
        }
        let Some(i) = self.slots.iter().position(|s| s.owner.is_none()) else {
            return Err(MembersError::Full {
                capacity: self.slots.len(),
            });
        };
        let slot = &mut self.slots[i];
        slot.receiver.clear();
        slot.owner = Some(SlotOwner { ssrc, member });
        slot.channels = 0;
        self.stats.assigned += 1;
        Ok(i)
    }

    /// Stop hearing `ssrc`: its slot falls silent at once and is free. Returns the slot.
    pub fn release(&mut self, ssrc: u32) -> Option<usize> {
        let i = self.slot_of(ssrc)?;
        let slot = &mut self.slots[i];
        slot.owner = None;
        slot.receiver.clear();
        slot.channels = 0;
        self.stats.released += 1;
        Some(i)
    }

    /// The slot `ssrc` holds.
    pub fn slot_of(&self, ssrc: u32) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.owner.is_some_and(|o| o.ssrc == ssrc))
    }

    /// The slot `member` holds.
    pub fn slot_of_member(&self, member: MemberId) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.owner.is_some_and(|o| o.member == member))
    }

    /// Who holds `slot`.
    pub fn owner(&self, slot: usize) -> Option<SlotOwner> {
        self.slots.get(slot).and_then(|s| s.owner)
    }

    pub fn receiver(&self, slot: usize) -> Option<&Receiver> {
        self.slots.get(slot).map(|s| &s.receiver)
    }

    pub fn receiver_mut(&mut self, slot: usize) -> Option<&mut Receiver> {
        self.slots.get_mut(slot).map(|s| &mut s.receiver)
    }

    /// A held slot's receiver statistics.
    pub fn member_stats(&self, slot: usize) -> Option<(SlotOwner, ReceiverStats)> {
        let s = self.slots.get(slot)?;
        Some((s.owner?, s.receiver.stats()))
    }

    pub fn stats(&self) -> MembersStats {
        self.stats
    }

    /// Take one datagram of the `kind` its socket found ([`crate::room::demux`], or
    /// [`crate::wire::classify`] where nothing sorted it yet) that arrived at `now_ns`, and
    /// hand it to the receiver of the member that sent it; returns that slot, or `None`
    /// when it was dropped (see the module docs).
    pub fn receive(&mut self, now_ns: u64, kind: PacketKind, bytes: &[u8]) -> Option<usize> {
        self.stats.datagrams += 1;
        let (kind, at) = match kind {
            PacketKind::Rtp => (PacketKind::Rtp, 8),
            PacketKind::Rtcp => (PacketKind::Rtcp, 4),
            PacketKind::Other => {
                self.stats.not_rtp += 1;
                return None;
            }
        };
        let Some(ssrc) = bytes
            .get(at..at + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        else {
            self.stats.not_rtp += 1;
            return None;
        };
        if self.one_peer {
            if let Some(slot) = self.slots.first_mut() {
                if let (PacketKind::Rtp, Some(owner)) = (kind, &mut slot.owner) {
                    owner.ssrc = ssrc;
                }
                slot.receiver.on_packet(now_ns, kind, bytes);
                return Some(0);
            }
        }
        let slot = match (self.slot_of(ssrc), kind) {
            (Some(i), _) => i,
            (None, PacketKind::Rtcp) => {
                self.stats.unrouted_rtcp += 1;
                return None;
            }
            (None, _) if !self.admit_unknown => {
                self.stats.unknown_ssrc += 1;
                return None;
            }
            (None, _) => match self.assign(ssrc, ssrc) {
                Ok(i) => {
                    self.stats.admitted += 1;
                    i
                }
                Err(MembersError::Full { .. }) => {
                    self.stats.unknown_ssrc += 1;
                    self.stats.refused_full += 1;
                    return None;
                }
            },
        };
        self.slots[slot].receiver.on_packet(now_ns, kind, bytes);
        Some(slot)
    }

    /// The output device lost `frames` frames of time: every member's receiver drops the
    /// audio that was due meanwhile (see [`Receiver::device_skipped`]). Realtime-safe.
    pub fn device_skipped(&mut self, frames: u64) {
        for slot in self.slots.iter_mut().filter(|s| s.owner.is_some()) {
            slot.receiver.device_skipped(frames);
        }
    }

    /// Play `frames` frames (at most [`MAX_PERIOD`]) due at `now_ns` from every held slot
    /// into its buffer; read them with [`Self::output`].
    pub fn render(&mut self, now_ns: u64, frames: usize) {
        let frames = frames.min(MAX_PERIOD);
        for slot in &mut self.slots {
            slot.channels = 0;
            slot.frames = frames;
            if slot.owner.is_none() {
                continue;
            }
            let Some(format) = slot.receiver.output_format() else {
                continue;
            };
            let ch = format.channels as usize;
            if ch > self.max_channels {
                self.stats.too_many_channels += 1;
                continue;
            }
            slot.receiver.play(now_ns, &mut slot.out[..frames * ch]);
            slot.channels = ch;
        }
    }

    /// What `slot` played in the last [`Self::render`] (interleaved) and its channel count;
    /// `None` for a free slot or a member whose stream has not started.
    pub fn output(&self, slot: usize) -> Option<(&[f32], usize)> {
        let s = self.slots.get(slot)?;
        (s.channels > 0).then(|| (&s.out[..s.frames * s.channels], s.channels))
    }

    /// When one of the members' reports is due, write it (RR + SDES) into `out` and return
    /// its length. Call until `None` each period: reports go round the slots.
    pub fn poll_rtcp(&mut self, now_ns: u64, out: &mut [u8]) -> Option<usize> {
        let n = self.slots.len();
        for k in 0..n {
            let i = (self.next_rtcp + k) % n;
            let slot = &mut self.slots[i];
            if slot.owner.is_none() {
                continue;
            }
            if let Some(len) = slot.receiver.poll_rtcp(now_ns, out) {
                self.next_rtcp = (i + 1) % n;
                return Some(len);
            }
        }
        None
    }

    /// Take the oldest pending event of the first slot that has one, with that slot.
    pub fn poll_event(&mut self) -> Option<(usize, ReceiverEvent)> {
        self.slots
            .iter_mut()
            .enumerate()
            .filter(|(_, s)| s.owner.is_some())
            .find_map(|(i, s)| s.receiver.poll_event().map(|e| (i, e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sender::{Sender, SenderConfig};
    use crate::wire::{classify, AudioFormat, Codec};

    fn sender(ssrc_seed: u64) -> Sender {
        let format = AudioFormat::new(Codec::L16, 48_000, 1).expect("format");
        Sender::new(SenderConfig {
            seed: ssrc_seed,
            ..SenderConfig::new(format, 64)
        })
        .expect("sender")
    }

    fn packets(sender: &mut Sender, now: u64, value: f32) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        sender.push_frames(now, &[value; 64], |p| out.push(p.to_vec()));
        out
    }

    #[test]
    fn routes_by_ssrc_and_counts_strangers() {
        let mut m = MemberReceivers::new(MembersConfig::new(2, 2, 48_000));
        let (mut a, mut b, mut c) = (sender(1), sender(2), sender(3));
        assert_eq!(m.assign(a.ssrc(), 10), Ok(0));
        assert_eq!(m.assign(b.ssrc(), 11), Ok(1));
        assert_eq!(m.assign(c.ssrc(), 12), Err(MembersError::Full { capacity: 2 }));
        for p in packets(&mut a, 0, 0.5) {
            assert_eq!(m.receive(1_000, classify(&p), &p), Some(0));
        }
        for p in packets(&mut b, 0, 0.25) {
            assert_eq!(m.receive(1_000, classify(&p), &p), Some(1));
        }
        for p in packets(&mut c, 0, 0.1) {
            assert_eq!(m.receive(1_000, classify(&p), &p), None);
        }
        assert_eq!(m.receive(1_000, classify(&[0x80]), &[0x80]), None);
        assert_eq!(m.receive(1_000, classify(b"garbage"), b"garbage"), None);
        let st = m.stats();
        assert_eq!((st.unknown_ssrc, st.not_rtp), (1, 2), "{st:?}");
        assert_eq!(
            m.member_stats(0).map(|(o, s)| (o.member, s.received)),
            Some((10, 1))
        );
        assert_eq!(
            m.member_stats(1).map(|(o, s)| (o.member, s.received)),
            Some((11, 1))
        );
        assert_eq!(m.release(a.ssrc()), Some(0));
        assert_eq!(m.assign(c.ssrc(), 12), Ok(0));
        assert_eq!(m.member_stats(0).map(|(_, s)| s.received), Some(0), "cleared");
    }

    #[test]
    fn one_peer_is_heard_whatever_its_ssrc() {
        let mut m = MemberReceivers::new(MembersConfig {
            one_peer: Some(7),
            ..MembersConfig::new(4, 2, 48_000)
        });
        assert_eq!((m.capacity(), m.len()), (1, 1), "one slot, held from the start");
        // The peer, then the peer restarted under a new SSRC: both are heard in slot 0.
        for (seed, start) in [(1, 0), (2, 1_000_000_000)] {
            let mut s = sender(seed);
            for k in 0..10u64 {
                let at = start + k * 1_333_333;
                for p in packets(&mut s, at, 0.5) {
                    assert_eq!(m.receive(at, classify(&p), &p), Some(0));
                }
            }
            let owner = m.owner(0).expect("held");
            assert_eq!((owner.member, owner.ssrc), (7, sender(seed).ssrc()));
        }
        let st = m.stats();
        assert_eq!(
            (st.admitted, st.unknown_ssrc, st.refused_full),
            (0, 0, 0),
            "{st:?}"
        );
        let heard = m.member_stats(0).map(|(_, s)| (s.received, s.stream_starts));
        assert!(heard.is_some_and(|(n, starts)| n > 0 && starts == 2), "{heard:?}");
    }

    #[test]
    fn admits_unknown_senders_up_to_capacity() {
        let mut m = MemberReceivers::new(MembersConfig {
            admit_unknown: true,
            ..MembersConfig::new(2, 2, 48_000)
        });
        for seed in 1..=3 {
            let mut s = sender(seed);
            for p in packets(&mut s, 0, 0.5) {
                m.receive(0, classify(&p), &p);
            }
        }
        let st = m.stats();
        assert_eq!(
            (st.admitted, st.refused_full, st.unknown_ssrc),
            (2, 1, 1),
            "{st:?}"
        );
        assert_eq!(m.len(), 2);
        assert_eq!(m.owner(0).map(|o| o.member), Some(sender(1).ssrc()));
    }

    #[test]
    fn a_stream_at_a_rate_too_far_to_convert_is_refused() {
        let mut m = MemberReceivers::new(MembersConfig::new(1, 2, 96_000));
        let mut a = sender(1);
        m.assign(a.ssrc(), 1).expect("slot");
        for p in packets(&mut a, 0, 0.5) {
            m.receive(0, classify(&p), &p);
        }
        m.render(10_000_000, 64);
        assert!(m.output(0).is_none());
        assert_eq!(m.member_stats(0).map(|(_, s)| s.rate_mismatch), Some(1));
    }

    #[test]
    fn a_stream_at_44_1_khz_is_converted_for_a_48_khz_mix_and_back() {
        for mix_rate in [44_100, 52_000] {
            // The members' sender runs at 48 kHz; 52 kHz is no rate a device runs at, but
            // within the conversion range the other way.
            let mut m = MemberReceivers::new(MembersConfig::new(1, 2, mix_rate));
            let mut a = sender(1);
            m.assign(a.ssrc(), 1).expect("slot");
            for p in packets(&mut a, 0, 0.5) {
                m.receive(0, classify(&p), &p);
            }
            m.render(10_000_000, 64);
            assert_eq!(
                m.output(0).map(|(o, ch)| (o.len(), ch)),
                Some((64, 1)),
                "{mix_rate}"
            );
            let (_, st) = m.member_stats(0).expect("held");
            assert_eq!(st.rate_mismatch, 0, "{mix_rate}: {st:?}");
            let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
            assert!(
                events.iter().any(|(slot, e)| *slot == 0
                    && matches!(e, ReceiverEvent::Converting { rate: 48_000, output_rate, .. } if *output_rate == mix_rate)),
                "{mix_rate}: {events:?}"
            );
        }
    }
}
