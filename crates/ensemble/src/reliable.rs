//! Reliable, ordered delivery between one sender and one receiver: numbered messages,
//! acknowledgements (cumulative, plus the one just received, so a single loss does not
//! make everything after it go again), retransmission with backoff, duplicates dropped and
//! early arrivals held until the gap before them is filled.
//!
//! Sequence numbers are 64-bit here (they never wrap) and 32-bit on the wire, widened
//! against the next expected number. Both ends are bounded: a sender refuses new
//! messages when [`RELIABLE_WINDOW`] are unacknowledged, a receiver holds at most that
//! many early ones. Sans-IO: times are passed in; nothing here reads a clock.

use std::collections::{BTreeMap, VecDeque};

/// Messages queued or in flight per stream (sender) and held out of order (receiver).
pub const RELIABLE_WINDOW: usize = 4096;
/// Messages sent and not yet acknowledged per stream; the rest of the window waits its
/// turn. A burst larger than the receiver's socket buffer (a few hundred datagrams by
/// default on Linux) would otherwise be lost whole and sent again and again.
pub const SEND_WINDOW: usize = 128;

/// Widens a 32-bit wire sequence number to the 64-bit one nearest `reference`.
pub fn widen(wire: u32, reference: u64) -> u64 {
    let delta = wire.wrapping_sub(reference as u32) as i32 as i64;
    (reference as i64 + delta).max(0) as u64
}

#[derive(Debug)]
struct Pending {
    seq: u64,
    /// The whole encoded envelope, ready to send again.
    bytes: Vec<u8>,
    first_sent_ns: u64,
    next_send_ns: u64,
    tries: u32,
    /// Acknowledged on its own while an earlier one is missing: not sent again.
    acked: bool,
}

/// The sending end of one stream.
#[derive(Debug)]
pub struct OutStream {
    next_seq: u64,
    unacked: VecDeque<Pending>,
    pub retransmits: u64,
    /// Smoothed round trip and its variation (RFC 6298), from messages acknowledged
    /// without a retransmission (Karn); 0 until the first sample.
    srtt_ns: u64,
    rttvar_ns: u64,
    /// Entries sent and neither acknowledged nor released.
    outstanding: usize,
}

/// Longest wait before a retransmission.
const MAX_RTO_NS: u64 = 2_000_000_000;

impl Default for OutStream {
    fn default() -> Self {
        Self {
            next_seq: 1,
            unacked: VecDeque::new(),
            retransmits: 0,
            srtt_ns: 0,
            rttvar_ns: 0,
            outstanding: 0,
        }
    }
}

impl OutStream {
    /// The sequence number the next message gets, or `None` while the window is full.
    pub fn next_seq(&self) -> Option<u64> {
        (self.unacked.len() < RELIABLE_WINDOW).then_some(self.next_seq)
    }

    /// The oldest sequence number not yet acknowledged (the next one if none is).
    pub fn base(&self) -> u64 {
        self.unacked.front().map_or(self.next_seq, |p| p.seq)
    }

    /// The wait before a retransmission: the smoothed round trip plus four times its
    /// variation, never less than `min_rto` nor more than 2 s.
    pub fn rto(&self, min_rto_ns: u64) -> u64 {
        (self.srtt_ns + 4 * self.rttvar_ns).clamp(min_rto_ns.min(MAX_RTO_NS), MAX_RTO_NS)
    }

    fn sample(&mut self, rtt: u64) {
        if self.srtt_ns == 0 {
            self.srtt_ns = rtt.max(1);
            self.rttvar_ns = rtt / 2;
        } else {
            let dev = self.srtt_ns.abs_diff(rtt);
            self.rttvar_ns = (3 * self.rttvar_ns + dev) / 4;
            self.srtt_ns = (7 * self.srtt_ns + rtt) / 8;
        }
    }

    /// Queues a message under [`OutStream::next_seq`] at `now`; returns whether to send it
    /// now (the send window has room) — otherwise [`OutStream::due`] hands it out when
    /// acknowledgements make room.
    pub fn sent(&mut self, now_ns: u64, min_rto_ns: u64, bytes: Vec<u8>) -> bool {
        let rto = self.rto(min_rto_ns);
        let now = self.outstanding < SEND_WINDOW;
        self.unacked.push_back(Pending {
            seq: self.next_seq,
            bytes,
            first_sent_ns: now_ns,
            next_send_ns: now_ns + rto,
            tries: u32::from(now),
            acked: false,
        });
        self.outstanding += usize::from(now);
        self.next_seq += 1;
        now
    }

    /// At `now`, the receiver expects `next` (everything before it arrived) and has just
    /// received `got` (both wire form).
    pub fn ack(&mut self, now_ns: u64, next: u32, got: u32) {
        let next = widen(next, self.next_seq);
        let got = widen(got, self.next_seq);
        let mut rtt = None;
        while let Some(p) = self.unacked.front() {
            if p.seq >= next {
                break;
            }
            if p.seq == got && p.tries == 1 {
                rtt = Some(now_ns.saturating_sub(p.first_sent_ns));
            }
            if p.tries > 0 && !p.acked {
                self.outstanding -= 1;
            }
            self.unacked.pop_front();
        }
        if let Some(first) = self.unacked.front().map(|p| p.seq) {
            if let Some(p) = got
                .checked_sub(first)
                .and_then(|i| self.unacked.get_mut(i as usize))
            {
                if !p.acked && p.tries == 1 {
                    rtt = Some(now_ns.saturating_sub(p.first_sent_ns));
                }
                if !p.acked && p.tries > 0 {
                    p.acked = true;
                    self.outstanding -= 1;
                }
            }
        }
        if let Some(r) = rtt {
            self.sample(r);
        }
    }

    /// Messages to send at `now`, each pushed to `out`: those due again (backoff doubles
    /// the wait up to 8×), then queued ones while the send window has room.
    pub fn due(&mut self, now_ns: u64, min_rto_ns: u64, mut out: impl FnMut(&[u8])) {
        let rto_ns = self.rto(min_rto_ns);
        for p in self.unacked.iter_mut().filter(|p| !p.acked) {
            if p.tries == 0 {
                if self.outstanding >= SEND_WINDOW {
                    break;
                }
                self.outstanding += 1;
                p.tries = 1;
                p.first_sent_ns = now_ns;
                p.next_send_ns = now_ns + rto_ns;
                out(&p.bytes);
            } else if p.next_send_ns <= now_ns {
                out(&p.bytes);
                self.retransmits += 1;
                p.tries += 1;
                p.next_send_ns = now_ns + (rto_ns << (p.tries - 1).min(3));
            }
        }
    }

    /// When [`OutStream::due`] has something next: a retransmission, or at once when
    /// queued messages fit the send window.
    pub fn next_due(&self) -> Option<u64> {
        let mut t = None;
        for p in self.unacked.iter().filter(|p| !p.acked) {
            if p.tries == 0 {
                if self.outstanding < SEND_WINDOW {
                    return Some(0);
                }
                break;
            }
            t = Some(t.map_or(p.next_send_ns, |x: u64| x.min(p.next_send_ns)));
        }
        t
    }

    pub fn in_flight(&self) -> usize {
        self.unacked.len()
    }
}

/// What the receiving end made of one arrival.
#[derive(Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Deliver it now (and then whatever [`InStream::pop_ready`] gives).
    Deliver,
    /// Held until the gap before it is filled.
    Held,
    /// Seen before, or beyond the window: dropped.
    Dropped,
}

/// The receiving end of one stream.
#[derive(Debug)]
pub struct InStream {
    /// Whether anything arrived yet (a fresh end takes the sender's base as it is).
    started: bool,
    expected: u64,
    early: BTreeMap<u64, Vec<u8>>,
    pub duplicates: u64,
}

impl Default for InStream {
    fn default() -> Self {
        Self {
            started: false,
            expected: 1,
            early: BTreeMap::new(),
            duplicates: 0,
        }
    }
}

impl InStream {
    /// Takes message `seq` with `payload`, the sender's oldest unacknowledged being `base`
    /// (wire forms); see [`Arrival`]. A base beyond what this end expects means it lost
    /// the stream's state (or the sender gave up on earlier messages): it moves up to it.
    pub fn arrive(&mut self, seq: u32, base: u32, payload: &[u8]) -> Arrival {
        let base = widen(base, self.expected);
        let seq_w = widen(seq, self.expected);
        // A base must not lie beyond its own message, and a running stream moves at most
        // a window at a time (a forged base cannot throw it far ahead).
        let plausible = base <= seq_w && (!self.started || base - self.expected <= RELIABLE_WINDOW as u64);
        self.started = true;
        if base > self.expected && plausible {
            self.early = self.early.split_off(&base);
            self.expected = base;
        }
        let seq = widen(seq, self.expected);
        if seq < self.expected || self.early.contains_key(&seq) {
            self.duplicates += 1;
            return Arrival::Dropped;
        }
        if seq == self.expected {
            self.expected += 1;
            return Arrival::Deliver;
        }
        if seq - self.expected >= RELIABLE_WINDOW as u64 {
            return Arrival::Dropped;
        }
        self.early.insert(seq, payload.to_vec());
        Arrival::Held
    }

    /// The next held message now in order, if any.
    pub fn pop_ready(&mut self) -> Option<Vec<u8>> {
        let p = self.early.remove(&self.expected)?;
        self.expected += 1;
        Some(p)
    }

    /// The acknowledgement to send: the next sequence number expected (wire form).
    pub fn ack(&self) -> u32 {
        self.expected as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beyond_the_send_window_messages_wait_for_acknowledgements() {
        let mut s = OutStream::default();
        for k in 0..SEND_WINDOW + 2 {
            assert_eq!(s.sent(0, 10, vec![k as u8]), k < SEND_WINDOW);
        }
        let mut out = Vec::new();
        s.due(1, 10, |b| out.push(b[0]));
        assert!(out.is_empty());
        assert_eq!(s.next_due(), Some(10));
        s.ack(2, 3, 2);
        assert_eq!(s.next_due(), Some(0));
        s.due(2, 10, |b| out.push(b[0]));
        assert_eq!(out, vec![SEND_WINDOW as u8, SEND_WINDOW as u8 + 1]);
    }

    #[test]
    fn widening_follows_the_reference_across_the_wrap() {
        assert_eq!(widen(5, 3), 5);
        assert_eq!(widen(2, (1 << 32) + 1), (1 << 32) + 2);
        assert_eq!(widen(u32::MAX, 1 << 32), (1 << 32) - 1);
        assert_eq!(widen(u32::MAX, 0), 0);
    }

    #[test]
    fn out_of_order_duplicates_and_gaps() {
        let mut r = InStream::default();
        assert_eq!(r.arrive(2, 1, b"b"), Arrival::Held);
        assert_eq!(r.arrive(2, 1, b"b"), Arrival::Dropped);
        assert_eq!(r.arrive(1, 1, b"a"), Arrival::Deliver);
        assert_eq!(r.pop_ready().as_deref(), Some(&b"b"[..]));
        assert_eq!(r.pop_ready(), None);
        assert_eq!(r.arrive(1, 1, b"a"), Arrival::Dropped);
        assert_eq!(r.ack(), 3);
        assert_eq!(r.duplicates, 2);
        // A receiver that forgot the stream picks it up at the sender's base.
        let mut fresh = InStream::default();
        assert_eq!(fresh.arrive(41, 40, b"y"), Arrival::Held);
        assert_eq!(fresh.arrive(40, 40, b"x"), Arrival::Deliver);
        assert_eq!(fresh.pop_ready().as_deref(), Some(&b"y"[..]));
        assert_eq!(fresh.ack(), 42);

        let mut s = OutStream::default();
        for k in 0..3 {
            assert_eq!(s.next_seq(), Some(k + 1));
            assert!(s.sent(0, 10, vec![k as u8]));
        }
        s.ack(4, 2, 1);
        s.ack(4, 2, 3);
        assert_eq!(s.in_flight(), 2);
        let mut again = Vec::new();
        s.due(10, 10, |b| again.push(b[0]));
        assert_eq!(again, vec![1]);
        assert_eq!(s.next_due(), Some(30));
        assert_eq!(s.base(), 2);
        // Two samples of 4 ns: srtt 4, variation 2 then 1: 4 + 4, or the minimum.
        assert_eq!(s.rto(1), 8);
        assert_eq!(s.rto(10), 10);
        assert_eq!(s.rto(1 << 40), MAX_RTO_NS);
    }
}
