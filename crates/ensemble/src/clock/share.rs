//! Ensemble time for the audio thread: the network thread publishes the current mapping
//! from local to ensemble time ([`ClockSegment`]); the audio thread reads it without
//! locks, allocation or system calls.
//!
//! The segment crosses through the crate's one lock-free publisher ([`crate::publish`]).
//!
//! Reading must never allocate, lock or block; publishing happens off the audio thread.

use crate::publish::{self, Publisher, Reader, Words};

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

impl Words for ClockSegment {
    type Packed = [u64; 3];
    fn pack(&self) -> [u64; 3] {
        [self.local_origin_ns, self.ensemble_origin_ns, self.rate.to_bits()]
    }
    fn unpack(w: &[u64; 3]) -> Self {
        Self {
            local_origin_ns: w[0],
            ensemble_origin_ns: w[1],
            rate: f64::from_bits(w[2]),
        }
    }
}

/// The writing side (one per clock; not `Clone`): call [`Publisher::publish`] from the
/// network thread whenever the clock's segment changes.
pub type ClockPublisher = Publisher<ClockSegment>;

/// The reading side, for the audio thread (cheap to clone: one per reader).
pub type ClockReader = Reader<ClockSegment>;

/// A publisher and a reader of one shared ensemble time; nothing is readable until the
/// first publish.
pub fn clock_share() -> (ClockPublisher, ClockReader) {
    publish::share()
}

impl Reader<ClockSegment> {
    /// The segment in force, or `None` before the first publish (or, rarely, when the
    /// writer kept publishing over the slot while this read was under way).
    pub fn segment(&self) -> Option<ClockSegment> {
        self.get()
    }

    /// Ensemble time at the local monotonic time `local_ns`; `None` until the clock locked.
    pub fn ensemble_ns(&self, local_ns: u64) -> Option<u64> {
        self.segment().map(|s| s.map(local_ns))
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
