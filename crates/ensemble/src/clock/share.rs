//! Ensemble time for the audio thread: the network thread publishes the current mapping
//! from local to ensemble time ([`ClockSegment`]); the audio thread reads it without
//! locks, allocation or system calls.
//!
//! Two slots, each guarded by a sequence number (a seqlock per slot): the single writer
//! fills the slot readers are not pointed at, then points them at it. A writer preempted
//! in the middle of a write therefore never holds a reader up; a reader retries only if
//! the writer published twice while it was reading, and gives up (returns `None`) after
//! a bounded number of tries rather than spin. Everything is atomics, no `unsafe`.
//!
//! Reading must never allocate, lock or block; publishing happens off the audio thread.

use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// One straight piece of the local → ensemble time mapping:
/// `ensemble = ensemble_origin + (local − local_origin) × (1 + rate)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClockSegment {
    pub local_origin_ns: u64,
    pub ensemble_origin_ns: u64,
    /// Ensemble nanoseconds per local nanosecond, minus one (e.g. −200e-6).
    pub rate: f64,
}

impl ClockSegment {
    /// Ensemble time at local time `local_ns` (saturating at 0 and `u64::MAX`).
    /// Non-decreasing in `local_ns` for any rate above −1.
    pub fn map(&self, local_ns: u64) -> u64 {
        let dt = local_ns as i128 - self.local_origin_ns as i128;
        let adj = (dt as f64 * self.rate).round() as i128;
        let e = self.ensemble_origin_ns as i128 + dt + adj;
        e.clamp(0, u64::MAX as i128) as u64
    }
}

/// Tries a reader makes before it reports that no consistent segment could be read.
const READ_TRIES: usize = 16;

#[derive(Debug, Default)]
struct Slot {
    /// Odd while being written.
    seq: AtomicU64,
    local: AtomicU64,
    ensemble: AtomicU64,
    rate_bits: AtomicU64,
}

#[derive(Debug, Default)]
struct Shared {
    slots: [Slot; 2],
    /// The slot readers use; `usize::MAX` until the first publish.
    active: AtomicUsize,
    published: AtomicU64,
}

/// The writing side (one per clock; not `Clone`): call [`ClockPublisher::publish`] from
/// the network thread whenever the clock's segment changes.
#[derive(Debug)]
pub struct ClockPublisher {
    shared: Arc<Shared>,
}

/// The reading side, for the audio thread (cheap to clone: one per reader).
#[derive(Debug, Clone)]
pub struct ClockReader {
    shared: Arc<Shared>,
}

/// A publisher and a reader of one shared ensemble time; nothing is readable until the
/// first publish.
pub fn clock_share() -> (ClockPublisher, ClockReader) {
    let shared = Arc::new(Shared {
        active: AtomicUsize::new(usize::MAX),
        ..Shared::default()
    });
    (
        ClockPublisher {
            shared: Arc::clone(&shared),
        },
        ClockReader { shared },
    )
}

impl ClockPublisher {
    /// Make `segment` the mapping readers use from now on.
    pub fn publish(&mut self, segment: ClockSegment) {
        let s = &self.shared;
        let next = match s.active.load(Ordering::Relaxed) {
            0 => 1,
            _ => 0,
        };
        let slot = &s.slots[next];
        let seq = slot.seq.load(Ordering::Relaxed);
        slot.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        slot.local.store(segment.local_origin_ns, Ordering::Relaxed);
        slot.ensemble.store(segment.ensemble_origin_ns, Ordering::Relaxed);
        slot.rate_bits.store(segment.rate.to_bits(), Ordering::Relaxed);
        slot.seq.store(seq.wrapping_add(2), Ordering::Release);
        s.active.store(next, Ordering::Release);
        s.published.fetch_add(1, Ordering::Relaxed);
    }
}

impl ClockReader {
    /// The segment in force, or `None` before the first publish (or, rarely, when the
    /// writer kept publishing over the slot while this read was under way).
    pub fn segment(&self) -> Option<ClockSegment> {
        let s = &self.shared;
        for _ in 0..READ_TRIES {
            let idx = s.active.load(Ordering::Acquire);
            let slot = s.slots.get(idx)?;
            let before = slot.seq.load(Ordering::Acquire);
            if before % 2 == 1 {
                continue;
            }
            let seg = ClockSegment {
                local_origin_ns: slot.local.load(Ordering::Relaxed),
                ensemble_origin_ns: slot.ensemble.load(Ordering::Relaxed),
                rate: f64::from_bits(slot.rate_bits.load(Ordering::Relaxed)),
            };
            fence(Ordering::Acquire);
            if slot.seq.load(Ordering::Relaxed) == before {
                return Some(seg);
            }
        }
        None
    }

    /// Ensemble time at the local monotonic time `local_ns`; `None` until the clock locked.
    pub fn ensemble_ns(&self, local_ns: u64) -> Option<u64> {
        self.segment().map(|s| s.map(local_ns))
    }

    /// How many segments were published so far.
    pub fn published(&self) -> u64 {
        self.shared.published.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_before_the_first_publish_then_the_latest_segment() {
        let (mut w, r) = clock_share();
        assert_eq!(r.ensemble_ns(5), None);
        for k in 0..5u64 {
            w.publish(ClockSegment {
                local_origin_ns: 100 * k,
                ensemble_origin_ns: 1_000_000 + k,
                rate: 1e-3,
            });
            assert_eq!(r.ensemble_ns(100 * k + 1000), Some(1_000_000 + k + 1001));
        }
        assert_eq!(r.published(), 5);
    }

    #[test]
    fn a_reader_never_sees_a_torn_segment() {
        // Every published segment satisfies ensemble = 3 × local and rate = local; a torn
        // read would mix fields of two segments.
        let (mut w, r) = clock_share();
        let reader = std::thread::spawn(move || {
            let mut seen = 0u64;
            while seen < 20_000 {
                if let Some(s) = r.segment() {
                    assert_eq!(s.ensemble_origin_ns, 3 * s.local_origin_ns, "{s:?}");
                    assert_eq!(s.rate, s.local_origin_ns as f64, "{s:?}");
                    seen += 1;
                }
                if r.published() >= 200_000 {
                    // The writer is done: this read cannot be overtaken, so a reader that
                    // was starved of every consistent read while it ran still checks one.
                    let s = r.segment().expect("a segment once the writer stopped");
                    assert_eq!(s.ensemble_origin_ns, 3 * s.local_origin_ns, "{s:?}");
                    seen += 1;
                    break;
                }
            }
            seen
        });
        for k in 1..=200_000u64 {
            w.publish(ClockSegment {
                local_origin_ns: k,
                ensemble_origin_ns: 3 * k,
                rate: k as f64,
            });
        }
        assert!(reader.join().unwrap() > 0);
    }

    #[test]
    fn mapping_is_monotonic_and_saturates() {
        let s = ClockSegment {
            local_origin_ns: 1_000,
            ensemble_origin_ns: 10,
            rate: -0.4,
        };
        let v: Vec<u64> = (0..3_000).map(|l| s.map(l)).collect();
        assert!(v.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(v[0], 0);
        assert_eq!(s.map(2_000), 610);
    }
}
