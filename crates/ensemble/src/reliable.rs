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

/// Messages in flight per stream (sender) and held out of order (receiver).
pub const RELIABLE_WINDOW: usize = 4096;

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
}

impl Default for OutStream {
    fn default() -> Self {
        Self {
            next_seq: 1,
            unacked: VecDeque::new(),
            retransmits: 0,
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

    /// Records a message sent at `now` under [`OutStream::next_seq`].
    pub fn sent(&mut self, now_ns: u64, rto_ns: u64, bytes: Vec<u8>) {
        self.unacked.push_back(Pending {
            seq: self.next_seq,
            bytes,
            next_send_ns: now_ns + rto_ns,
            tries: 1,
            acked: false,
        });
        self.next_seq += 1;
    }

    /// The receiver expects `next` (everything before it arrived) and has just received
    /// `got` (both wire form).
    pub fn ack(&mut self, next: u32, got: u32) {
        let next = widen(next, self.next_seq);
        let got = widen(got, self.next_seq);
        while self.unacked.front().is_some_and(|p| p.seq < next) {
            self.unacked.pop_front();
        }
        if let Some(first) = self.unacked.front().map(|p| p.seq) {
            if let Some(p) = got
                .checked_sub(first)
                .and_then(|i| self.unacked.get_mut(i as usize))
            {
                p.acked = true;
            }
        }
    }

    /// Messages due again at `now`, each pushed to `out`; backoff doubles the wait up to 8×.
    pub fn due(&mut self, now_ns: u64, rto_ns: u64, mut out: impl FnMut(&[u8])) {
        for p in self.unacked.iter_mut().filter(|p| !p.acked) {
            if p.next_send_ns <= now_ns {
                out(&p.bytes);
                self.retransmits += 1;
                p.tries += 1;
                p.next_send_ns = now_ns + (rto_ns << (p.tries - 1).min(3));
            }
        }
    }

    /// When [`OutStream::due`] has something next.
    pub fn next_due(&self) -> Option<u64> {
        self.unacked
            .iter()
            .filter(|p| !p.acked)
            .map(|p| p.next_send_ns)
            .min()
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
    expected: u64,
    early: BTreeMap<u64, Vec<u8>>,
    pub duplicates: u64,
}

impl Default for InStream {
    fn default() -> Self {
        Self {
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
        if base > self.expected {
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
            s.sent(0, 10, vec![k as u8]);
        }
        s.ack(2, 1);
        s.ack(2, 3);
        assert_eq!(s.in_flight(), 2);
        let mut again = Vec::new();
        s.due(10, 10, |b| again.push(b[0]));
        assert_eq!(again, vec![1]);
        assert_eq!(s.next_due(), Some(30));
        assert_eq!(s.base(), 2);
    }
}
