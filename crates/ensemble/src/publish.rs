//! One value that a single writer publishes and any number of readers (the audio thread)
//! read without locks, allocation, system calls or waiting: the ensemble clock's mapping
//! ([`crate::clock::ClockReader`]) and the shared beat's tempo ([`crate::beat::TempoReader`])
//! both travel this way.
//!
//! A value crosses as a fixed number of 64-bit words ([`Words`]). Two slots, each guarded
//! by a sequence number (a seqlock per slot): the writer fills the slot readers are not
//! pointed at, then points them at it. A writer preempted in the middle of a write
//! therefore never holds a reader up; a reader retries only if the writer published twice
//! while it was reading, and gives up (returns `None`) after a bounded number of tries
//! rather than spin. Everything is atomics, no `unsafe`. Two reads in a row may see the
//! newest value and then the one before it (the first read can find the new slot filled
//! while its own load of the pointer still saw the old one), never anything older, and
//! never a torn value.
//!
//! Reading must never allocate, lock or block; the slots are allocated once, in [`share`],
//! and publishing happens off the audio thread.

use std::marker::PhantomData;
use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// A `Copy` value that can cross as a fixed number of 64-bit words.
pub trait Words: Copy {
    /// The words (a `[u64; N]`).
    type Packed: Copy + Default + AsRef<[u64]> + AsMut<[u64]>;
    /// The value as words.
    fn pack(&self) -> Self::Packed;
    /// The value back from the words [`Words::pack`] made.
    fn unpack(words: &Self::Packed) -> Self;
}

/// Tries a reader makes before it reports that no consistent value could be read.
const READ_TRIES: usize = 16;

#[derive(Debug)]
struct Slot {
    /// Odd while being written.
    seq: AtomicU64,
    words: Box<[AtomicU64]>,
}

#[derive(Debug)]
struct Shared<T> {
    slots: [Slot; 2],
    /// The slot readers use; `usize::MAX` until the first publish.
    active: AtomicUsize,
    published: AtomicU64,
    value: PhantomData<fn() -> T>,
}

/// The writing side (one per value; not `Clone`): call [`Publisher::publish`] from the
/// network thread whenever the value changes.
#[derive(Debug)]
pub struct Publisher<T> {
    shared: Arc<Shared<T>>,
}

/// The reading side, for the audio thread (cheap to clone: one per reader).
#[derive(Debug)]
pub struct Reader<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Clone for Reader<T> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

/// A publisher and a reader of one value; nothing is readable until the first publish.
/// The only allocation of the pair.
pub fn share<T: Words>() -> (Publisher<T>, Reader<T>) {
    let n = T::Packed::default().as_ref().len();
    let slot = || Slot {
        seq: AtomicU64::new(0),
        words: (0..n).map(|_| AtomicU64::new(0)).collect(),
    };
    let shared = Arc::new(Shared {
        slots: [slot(), slot()],
        active: AtomicUsize::new(usize::MAX),
        published: AtomicU64::new(0),
        value: PhantomData,
    });
    (
        Publisher {
            shared: Arc::clone(&shared),
        },
        Reader { shared },
    )
}

impl<T: Words> Publisher<T> {
    /// Make `value` what readers see from now on.
    pub fn publish(&mut self, value: T) {
        let s = &self.shared;
        let next = match s.active.load(Ordering::Relaxed) {
            0 => 1,
            _ => 0,
        };
        let slot = &s.slots[next];
        let seq = slot.seq.load(Ordering::Relaxed);
        slot.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        for (w, v) in slot.words.iter().zip(value.pack().as_ref()) {
            w.store(*v, Ordering::Relaxed);
        }
        slot.seq.store(seq.wrapping_add(2), Ordering::Release);
        s.active.store(next, Ordering::Release);
        s.published.fetch_add(1, Ordering::Relaxed);
    }
}

impl<T: Words> Reader<T> {
    /// The value in force, or `None` before the first publish (or, rarely, when the
    /// writer kept publishing over the slot while this read was under way).
    pub fn get(&self) -> Option<T> {
        let s = &self.shared;
        for _ in 0..READ_TRIES {
            let idx = s.active.load(Ordering::Acquire);
            let slot = s.slots.get(idx)?;
            let before = slot.seq.load(Ordering::Acquire);
            if before % 2 == 1 {
                continue;
            }
            let mut w = T::Packed::default();
            for (x, a) in w.as_mut().iter_mut().zip(slot.words.iter()) {
                *x = a.load(Ordering::Relaxed);
            }
            fence(Ordering::Acquire);
            if slot.seq.load(Ordering::Relaxed) == before {
                return Some(T::unpack(&w));
            }
        }
        None
    }

    /// How many values were published so far.
    pub fn published(&self) -> u64 {
        self.shared.published.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three words that must always agree: `b = 3a`, `c = a + 1`.
    #[derive(Debug, Clone, Copy, PartialEq)]
    struct Triple(u64);

    impl Words for Triple {
        type Packed = [u64; 3];
        fn pack(&self) -> [u64; 3] {
            [self.0, 3 * self.0, self.0 + 1]
        }
        fn unpack(w: &[u64; 3]) -> Self {
            assert_eq!((w[1], w[2]), (3 * w[0], w[0] + 1), "torn read: {w:?}");
            Triple(w[0])
        }
    }

    #[test]
    fn nothing_before_the_first_publish_then_the_latest_value() {
        let (mut w, r) = share::<Triple>();
        assert_eq!(r.get(), None);
        for k in 0..5 {
            w.publish(Triple(k));
            assert_eq!(r.clone().get(), Some(Triple(k)));
        }
        assert_eq!(r.published(), 5);
    }

    #[test]
    fn a_reader_never_sees_a_torn_value() {
        let (mut w, r) = share::<Triple>();
        let reader = std::thread::spawn(move || {
            let mut seen = 0u64;
            let mut last = 0;
            loop {
                let done = r.published() >= 200_000;
                if let Some(Triple(k)) = r.get() {
                    // A reader can see a slot's new value before the switch of `active` to
                    // it (on x86 the writer's stores reach it in order, but its own load of
                    // `active` may come first), and then the other slot, one value older:
                    // never torn, never back by more than one.
                    assert!(k + 1 >= last, "went back from {last} to {k}");
                    last = k;
                    seen += 1;
                }
                // Once the writer is done a read cannot be overtaken: even a reader
                // starved of every consistent read while it ran checks one.
                if done || seen >= 20_000 {
                    return (seen, last);
                }
            }
        });
        for k in 1..=200_000 {
            w.publish(Triple(k));
        }
        let (seen, _) = reader.join().unwrap();
        assert!(seen > 0);
    }
}
