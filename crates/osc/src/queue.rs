//! A pre-allocated, lock-free single-producer single-consumer queue of whole OSC
//! messages (variable-length byte strings), for the handoff between a non-realtime
//! thread and the audio thread.
//!
//! Realtime promise: after [`message_queue`] returns, [`Producer::push`] and
//! [`Consumer::pop`] never allocate, lock, block or make system calls; a full queue
//! hands the message back instead of waiting. The ring is built from atomic words in a
//! boxed slice, so this module needs no `unsafe` code. It must never grow its storage.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

/// Why a message was not queued; it is handed back in [`PushError::message`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct PushError<'m> {
    /// The message that was not queued.
    pub message: &'m [u8],
    /// Why.
    pub reason: PushErrorReason,
}

/// Why [`Producer::push`] refused a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PushErrorReason {
    /// Not enough free space now; retry after the consumer caught up.
    #[error("queue full")]
    Full,
    /// The message is larger than the whole queue could ever hold.
    #[error("message larger than the queue's capacity")]
    TooLarge,
}

/// Why [`Consumer::pop`] could not return the next message (it stays queued).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("output buffer of {available} bytes too small for the next message of {needed} bytes")]
pub struct PopError {
    /// Size of the next message.
    pub needed: usize,
    /// Size of the buffer given.
    pub available: usize,
}

#[repr(align(64))]
#[derive(Debug)]
struct CachePadded(AtomicUsize);

#[derive(Debug)]
struct Ring {
    words: Box<[AtomicU32]>,
    mask: usize,
    /// Words ever written (producer-owned).
    head: CachePadded,
    /// Words ever consumed (consumer-owned).
    tail: CachePadded,
}

/// The sending end of a message queue. Exactly one thread may own it.
#[derive(Debug)]
pub struct Producer {
    ring: Arc<Ring>,
    head: usize,
    cached_tail: usize,
}

/// The receiving end of a message queue. Exactly one thread may own it.
#[derive(Debug)]
pub struct Consumer {
    ring: Arc<Ring>,
    tail: usize,
    cached_head: usize,
}

/// Creates a queue able to hold at least `capacity_bytes` bytes of messages (each
/// message also costs 4 bytes of length header and up to 3 bytes of padding).
/// This is the only call that allocates.
pub fn message_queue(capacity_bytes: usize) -> (Producer, Consumer) {
    let words = (capacity_bytes.div_ceil(4) + 1).next_power_of_two().max(2);
    let ring = Arc::new(Ring {
        words: (0..words).map(|_| AtomicU32::new(0)).collect(),
        mask: words - 1,
        head: CachePadded(AtomicUsize::new(0)),
        tail: CachePadded(AtomicUsize::new(0)),
    });
    (
        Producer {
            ring: ring.clone(),
            head: 0,
            cached_tail: 0,
        },
        Consumer {
            ring,
            tail: 0,
            cached_head: 0,
        },
    )
}

/// A pair of queues, one per direction, between two threads.
#[derive(Debug)]
pub struct Duplex {
    /// Sends to the other side.
    pub tx: Producer,
    /// Receives from the other side.
    pub rx: Consumer,
}

/// Creates two queues of `capacity_bytes` each and returns the two ends, e.g. one for
/// the control thread and one for the audio thread.
pub fn duplex(capacity_bytes: usize) -> (Duplex, Duplex) {
    let (a_tx, b_rx) = message_queue(capacity_bytes);
    let (b_tx, a_rx) = message_queue(capacity_bytes);
    (Duplex { tx: a_tx, rx: a_rx }, Duplex { tx: b_tx, rx: b_rx })
}

impl Producer {
    /// Capacity in bytes of payload plus headers.
    pub fn capacity_bytes(&self) -> usize {
        self.ring.words.len() * 4
    }

    /// Queues a copy of `message`. Never blocks: if there is no room the message is
    /// handed back in the error.
    pub fn push<'m>(&mut self, message: &'m [u8]) -> Result<(), PushError<'m>> {
        let ring = &*self.ring;
        let cap = ring.words.len();
        let need = 1 + message.len().div_ceil(4);
        if need > cap || message.len() > u32::MAX as usize {
            return Err(PushError {
                message,
                reason: PushErrorReason::TooLarge,
            });
        }
        if self.head - self.cached_tail + need > cap {
            self.cached_tail = ring.tail.0.load(Ordering::Acquire);
            if self.head - self.cached_tail + need > cap {
                return Err(PushError {
                    message,
                    reason: PushErrorReason::Full,
                });
            }
        }
        let mut at = self.head;
        ring.words[at & ring.mask].store(message.len() as u32, Ordering::Relaxed);
        at += 1;
        let mut chunks = message.chunks_exact(4);
        for c in &mut chunks {
            let w = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
            ring.words[at & ring.mask].store(w, Ordering::Relaxed);
            at += 1;
        }
        let rem = chunks.remainder();
        if !rem.is_empty() {
            let mut b = [0u8; 4];
            b[..rem.len()].copy_from_slice(rem);
            ring.words[at & ring.mask].store(u32::from_ne_bytes(b), Ordering::Relaxed);
            at += 1;
        }
        self.head = at;
        ring.head.0.store(at, Ordering::Release);
        Ok(())
    }

    /// Whether the consumer has been dropped.
    pub fn is_abandoned(&self) -> bool {
        Arc::strong_count(&self.ring) < 2
    }

    /// Queues every outbox entry for `route` (e.g. the [`Route::Forward`] entries a
    /// realtime dispatch produced, for the control thread). Returns how many were queued
    /// and how many did not fit. Never blocks or allocates.
    ///
    /// [`Route::Forward`]: crate::Route::Forward
    pub fn push_outbox(&mut self, outbox: &crate::Outbox<'_>, route: crate::Route) -> (u32, u32) {
        let (mut queued, mut refused) = (0, 0);
        for (r, msg) in outbox.entries() {
            if r == route {
                match self.push(msg) {
                    Ok(()) => queued += 1,
                    Err(_) => refused += 1,
                }
            }
        }
        (queued, refused)
    }
}

impl Consumer {
    /// Length of the next message, if any.
    pub fn peek_len(&mut self) -> Option<usize> {
        let ring = &*self.ring;
        if self.tail == self.cached_head {
            self.cached_head = ring.head.0.load(Ordering::Acquire);
            if self.tail == self.cached_head {
                return None;
            }
        }
        Some(ring.words[self.tail & ring.mask].load(Ordering::Relaxed) as usize)
    }

    /// Copies the next message into `out` and returns it. `Ok(None)` when the queue is
    /// empty; an error (message left queued) when `out` is too small.
    pub fn pop<'o>(&mut self, out: &'o mut [u8]) -> Result<Option<&'o [u8]>, PopError> {
        let Some(len) = self.peek_len() else {
            return Ok(None);
        };
        if len > out.len() {
            return Err(PopError {
                needed: len,
                available: out.len(),
            });
        }
        let ring = &*self.ring;
        let mut at = self.tail + 1;
        let dst = &mut out[..len];
        let mut chunks = dst.chunks_exact_mut(4);
        for c in &mut chunks {
            c.copy_from_slice(&ring.words[at & ring.mask].load(Ordering::Relaxed).to_ne_bytes());
            at += 1;
        }
        let rem = chunks.into_remainder();
        if !rem.is_empty() {
            let w = ring.words[at & ring.mask].load(Ordering::Relaxed).to_ne_bytes();
            let n = rem.len();
            rem.copy_from_slice(&w[..n]);
            at += 1;
        }
        self.tail = at;
        ring.tail.0.store(at, Ordering::Release);
        Ok(Some(&out[..len]))
    }

    /// Whether the producer has been dropped.
    pub fn is_abandoned(&self) -> bool {
        Arc::strong_count(&self.ring) < 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_pop_in_order() {
        let (mut tx, mut rx) = message_queue(64);
        let mut out = [0u8; 64];
        assert_eq!(rx.pop(&mut out), Ok(None));
        tx.push(b"hello").unwrap();
        tx.push(b"").unwrap();
        tx.push(b"abcd").unwrap();
        assert_eq!(rx.pop(&mut out).unwrap(), Some(&b"hello"[..]));
        assert_eq!(rx.pop(&mut out).unwrap(), Some(&b""[..]));
        assert_eq!(rx.pop(&mut out).unwrap(), Some(&b"abcd"[..]));
        assert_eq!(rx.pop(&mut out), Ok(None));
    }

    #[test]
    fn full_hands_message_back() {
        let (mut tx, mut rx) = message_queue(16);
        let cap = tx.capacity_bytes();
        let big = vec![7u8; cap];
        assert_eq!(tx.push(&big).unwrap_err().reason, PushErrorReason::TooLarge);
        let msg = [1u8; 12];
        let mut pushed = 0;
        let e = loop {
            match tx.push(&msg) {
                Ok(()) => pushed += 1,
                Err(e) => break e,
            }
        };
        assert_eq!(e.reason, PushErrorReason::Full);
        assert_eq!(e.message, &msg);
        let mut out = [0u8; 4];
        assert_eq!(
            rx.pop(&mut out),
            Err(PopError {
                needed: 12,
                available: 4
            })
        );
        let mut out = [0u8; 16];
        for _ in 0..pushed {
            assert_eq!(rx.pop(&mut out).unwrap(), Some(&msg[..]));
        }
        tx.push(&msg).unwrap();
    }

    #[test]
    fn wraps_around_many_times() {
        let (mut tx, mut rx) = message_queue(40);
        let mut out = [0u8; 64];
        for i in 0..1000u32 {
            let len = (i % 13) as usize;
            let msg: Vec<u8> = (0..len).map(|k| (i as usize + k) as u8).collect();
            tx.push(&msg).unwrap();
            assert_eq!(rx.pop(&mut out).unwrap(), Some(&msg[..]));
        }
    }

    #[test]
    fn threads_see_every_message_in_order() {
        let (mut tx, mut rx) = message_queue(256);
        let n = 20_000u32;
        let t = std::thread::spawn(move || {
            for i in 0..n {
                let bytes = i.to_be_bytes();
                let len = 1 + (i % 4) as usize;
                while tx.push(&bytes[..len]).is_err() {
                    std::thread::yield_now();
                }
            }
        });
        let mut out = [0u8; 8];
        let mut i = 0u32;
        while i < n {
            match rx.pop(&mut out).unwrap() {
                Some(m) => {
                    let len = 1 + (i % 4) as usize;
                    assert_eq!(m, &i.to_be_bytes()[..len]);
                    i += 1;
                }
                None => std::thread::yield_now(),
            }
        }
        t.join().unwrap();
    }

    #[test]
    fn outbox_entries_cross_over() {
        let mut ob = [0u8; 128];
        let mut out = crate::Outbox::new(&mut ob);
        out.push(crate::Route::Forward, "/f", &[]).unwrap();
        out.push(crate::Route::Reply, "/r", &[]).unwrap();
        let (mut tx, mut rx) = message_queue(64);
        assert_eq!(tx.push_outbox(&out, crate::Route::Forward), (1, 0));
        let mut buf = [0u8; 16];
        assert_eq!(rx.pop(&mut buf).unwrap(), Some(&b"/f\0\0,\0\0\0"[..]));
        assert_eq!(rx.pop(&mut buf).unwrap(), None);
    }

    #[test]
    fn duplex_both_ways() {
        let (mut a, mut b) = duplex(64);
        a.tx.push(b"to b").unwrap();
        b.tx.push(b"to a").unwrap();
        let mut out = [0u8; 8];
        assert_eq!(b.rx.pop(&mut out).unwrap(), Some(&b"to b"[..]));
        assert_eq!(a.rx.pop(&mut out).unwrap(), Some(&b"to a"[..]));
    }
}
