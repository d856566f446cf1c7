//! Widening of RTP's wrapping counters into values that never wrap.
//!
//! RTP sequence numbers are 16 bits and wrap every 65,536 packets (under a minute at
//! 48 kHz with 32-frame packets); RTP timestamps are 32 bits and wrap every ~25 hours at
//! 48 kHz, but start at a random value so the first wrap can come at any moment. Code
//! that orders packets, counts loss or schedules playout works on the widened `u64`
//! values from [`SeqExtender`] and [`TimestampExtender`] and never compares raw wire
//! counters.
//!
//! Each extender picks, for every new wire value, the widened value closest to the highest
//! one seen so far, so a packet may arrive up to half the counter range late or early and
//! still land in the right place. The first value is offset by one full cycle so that a
//! reordered packet from just before it still has a place to go without underflow.
//!
//! This module never allocates and never panics on any input.

/// The widening both extenders share, for a counter of `BITS` bits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Widener<const BITS: u32> {
    highest: Option<u64>,
}

impl<const BITS: u32> Widener<BITS> {
    fn widen(&mut self, raw: u64) -> u64 {
        let cycle = 1u64 << BITS;
        let value = match self.highest {
            None => raw + cycle,
            Some(highest) => {
                // The step from the highest value seen to the nearest candidate for `raw`,
                // as a signed BITS-bit number (exactly half a cycle counts as backwards).
                let diff = raw.wrapping_sub(highest) & (cycle - 1);
                let step = if diff >= cycle / 2 {
                    diff as i64 - cycle as i64
                } else {
                    diff as i64
                };
                highest.saturating_add_signed(step)
            }
        };
        self.highest = Some(self.highest.map_or(value, |h| h.max(value)));
        value
    }
}

/// Widens 16-bit RTP sequence numbers to `u64` values that never wrap.
///
/// The first sequence number `s` maps to `s + 65536`; after that each value maps to the
/// widened number nearest to the highest one seen (ties go backwards, i.e. a packet exactly
/// 32,768 behind counts as old rather than as a jump ahead).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SeqExtender(Widener<16>);

impl SeqExtender {
    /// An extender that has seen nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Widens `seq`. Call once per received packet, in arrival order.
    pub fn extend(&mut self, seq: u16) -> u64 {
        self.0.widen(u64::from(seq))
    }

    /// The highest widened value seen so far, if any.
    pub fn highest(&self) -> Option<u64> {
        self.0.highest
    }

    /// Forgets everything, e.g. when the sender's SSRC changes.
    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

/// Widens 32-bit RTP timestamps to `u64` values that never wrap.
///
/// Works like [`SeqExtender`] with a cycle of 2^32: the first timestamp `t` maps to
/// `t + 2^32`, later ones to the widened value nearest the highest seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TimestampExtender(Widener<32>);

impl TimestampExtender {
    /// An extender that has seen nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Widens `timestamp`. Call once per received packet, in arrival order.
    pub fn extend(&mut self, timestamp: u32) -> u64 {
        self.0.widen(u64::from(timestamp))
    }

    /// The highest widened value seen so far, if any.
    pub fn highest(&self) -> Option<u64> {
        self.0.highest
    }

    /// Forgets everything, e.g. when the sender's SSRC changes.
    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_value_is_offset_by_one_cycle_and_earlier_packets_do_not_underflow() {
        let mut s = SeqExtender::new();
        assert_eq!(s.extend(0), 65536);
        // A packet from just before the first one (reordered) lands below it.
        assert_eq!(s.extend(65535), 65535);
        assert_eq!(s.extend(65530), 65530);
        assert_eq!(s.highest(), Some(65536));
        assert_eq!(s.extend(1), 65537);
    }

    #[test]
    fn forward_wrap_keeps_counting_up() {
        let mut s = SeqExtender::new();
        let start = 65530u16;
        let base = s.extend(start);
        let mut seq = start;
        for i in 1..=200_000u64 {
            seq = seq.wrapping_add(1);
            assert_eq!(s.extend(seq), base + i);
        }
    }

    #[test]
    fn late_packet_across_the_wrap_goes_backwards() {
        let mut s = SeqExtender::new();
        assert_eq!(s.extend(65534), 65534 + 65536);
        assert_eq!(s.extend(65535), 65535 + 65536);
        assert_eq!(s.extend(0), 2 * 65536);
        assert_eq!(s.extend(2), 2 * 65536 + 2);
        // 65535 arrives again, late: it belongs to the previous cycle.
        assert_eq!(s.extend(65535), 65535 + 65536);
        // 1 arrives late but still in the current cycle.
        assert_eq!(s.extend(1), 2 * 65536 + 1);
        assert_eq!(s.highest(), Some(2 * 65536 + 2));
    }

    #[test]
    fn jumps_up_to_half_the_range_go_the_short_way() {
        let mut s = SeqExtender::new();
        let base = s.extend(100);
        assert_eq!(s.extend(100u16.wrapping_add(32767)), base + 32767);
        let mut s = SeqExtender::new();
        let base = s.extend(100);
        // Exactly half the range away: counted as old.
        assert_eq!(s.extend(100u16.wrapping_add(32768)), base - 32768);
    }

    #[test]
    fn reset_starts_over() {
        let mut s = SeqExtender::new();
        s.extend(10);
        s.extend(20);
        s.reset();
        assert_eq!(s.highest(), None);
        assert_eq!(s.extend(5), 5 + 65536);
    }

    #[test]
    fn timestamps_wrap_forward_and_backward() {
        let mut t = TimestampExtender::new();
        let first = u32::MAX - 100;
        let base = t.extend(first);
        assert_eq!(base, u64::from(first) + (1 << 32));
        assert_eq!(t.extend(first.wrapping_add(480)), base + 480);
        // A late packet from before the wrap.
        assert_eq!(t.extend(first.wrapping_add(20)), base + 20);
        assert_eq!(t.extend(first.wrapping_sub(960)), base - 960);
        // Keep going over several wraps in big steps.
        let mut ts = first.wrapping_add(480);
        let mut expect = base + 480;
        for _ in 0..10_000 {
            ts = ts.wrapping_add(1_000_000);
            expect += 1_000_000;
            assert_eq!(t.extend(ts), expect);
        }
        t.reset();
        assert_eq!(t.extend(0), 1 << 32);
        assert_eq!(t.extend(u32::MAX), (1 << 32) - 1);
    }
}
