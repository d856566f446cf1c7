//! A time series of bounded size that covers a whole session evenly, however long it runs.
//!
//! The statistics files (`--stats-json`) keep a snapshot about every 100 ms; kept in a
//! plain `Vec`, an hour's session would hold 36,000 of them. [`BoundedSeries`] keeps at
//! most its capacity: when full it drops every other point and from then on keeps only
//! every second point offered (its stride doubles), so the points it holds stay evenly
//! spaced from the first to (nearly) the last, and the very last point offered is always
//! kept too. It allocates once, at construction, and never grows.

use serde::ser::{Serialize, SerializeSeq, Serializer};

/// Points a statistics file keeps by default: between half this and this many snapshots,
/// spread over the whole session.
pub const STATS_SERIES_POINTS: usize = 1000;

/// See the module docs.
#[derive(Debug, Clone)]
pub struct BoundedSeries<T> {
    points: Vec<T>,
    capacity: usize,
    /// Keep one point in this many offered.
    stride: u64,
    offered: u64,
    /// The newest point offered, when the stride skipped it.
    last: Option<T>,
}

impl<T> BoundedSeries<T> {
    /// A series of at most `capacity` points (rounded up to an even number, at least 2),
    /// plus the newest one.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(2).next_multiple_of(2);
        Self {
            points: Vec::with_capacity(capacity),
            capacity,
            stride: 1,
            offered: 0,
            last: None,
        }
    }

    /// Offer the next point, in time order.
    pub fn push(&mut self, point: T) {
        let index = self.offered;
        self.offered += 1;
        if index % self.stride != 0 {
            self.last = Some(point);
            return;
        }
        if self.points.len() == self.capacity {
            // Halve the resolution: keep points 0, 2, 4, ... of those held.
            let mut i = 0;
            self.points.retain(|_| {
                i += 1;
                i % 2 == 1
            });
            self.stride *= 2;
            if index % self.stride != 0 {
                self.last = Some(point);
                return;
            }
        }
        self.points.push(point);
        self.last = None;
    }

    /// Points kept, oldest first, not counting a newest point the stride skipped.
    pub fn kept(&self) -> &[T] {
        &self.points
    }

    /// How many points were offered for each one kept.
    pub fn stride(&self) -> u64 {
        self.stride
    }

    /// Points offered in all.
    pub fn offered(&self) -> u64 {
        self.offered
    }

    /// Every point held, oldest first, ending with the newest one offered.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.points.iter().chain(self.last.as_ref())
    }

    pub fn len(&self) -> usize {
        self.points.len() + usize::from(self.last.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T> Default for BoundedSeries<T> {
    fn default() -> Self {
        Self::new(STATS_SERIES_POINTS)
    }
}

/// Serialized as a plain sequence of the points held, oldest first.
impl<T: Serialize> Serialize for BoundedSeries<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.len()))?;
        for p in self.iter() {
            seq.serialize_element(p)?;
        }
        seq.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(capacity: usize, n: u64) -> BoundedSeries<u64> {
        let mut s = BoundedSeries::new(capacity);
        for i in 0..n {
            s.push(i);
        }
        s
    }

    #[test]
    fn keeps_everything_until_full() {
        let s = filled(10, 10);
        assert_eq!(s.iter().copied().collect::<Vec<_>>(), (0..10).collect::<Vec<_>>());
        assert_eq!(s.stride(), 1);
    }

    #[test]
    fn never_holds_more_than_its_capacity_plus_the_newest() {
        let mut s = BoundedSeries::new(16);
        for i in 0..100_000u64 {
            s.push(i);
            assert!(s.kept().len() <= 16, "{} points after {i}", s.kept().len());
            assert!(s.len() <= 17);
        }
        // Once full it holds at least half its capacity.
        assert!(s.kept().len() >= 8, "{}", s.kept().len());
        assert_eq!(s.offered(), 100_000);
    }

    #[test]
    fn covers_the_session_from_first_to_last_point_evenly_and_in_order() {
        for n in [1u64, 2, 17, 1000, 1001, 4095, 4096, 4097, 123_457] {
            let s = filled(64, n);
            let held: Vec<u64> = s.iter().copied().collect();
            assert_eq!(held.first(), Some(&0), "n {n}");
            assert_eq!(held.last(), Some(&(n - 1)), "n {n}");
            assert!(held.windows(2).all(|w| w[0] < w[1]), "n {n}: not in order");
            // The kept points lie on the stride's grid: evenly spaced.
            let stride = s.stride();
            assert!(
                s.kept().iter().enumerate().all(|(i, &p)| p == i as u64 * stride),
                "n {n}"
            );
            // The grid reaches within one stride of the end.
            let last_kept = *s.kept().last().expect("points");
            assert!(
                n - 1 - last_kept < stride,
                "n {n}: last kept {last_kept}, stride {stride}"
            );
        }
    }

    #[test]
    fn serializes_as_a_plain_list() {
        let s = filled(4, 7);
        let json = serde_json::to_string(&s).expect("json");
        assert_eq!(json, "[0,2,4,6]");
        let s = filled(4, 8);
        assert_eq!(serde_json::to_string(&s).expect("json"), "[0,2,4,6,7]");
    }
}
