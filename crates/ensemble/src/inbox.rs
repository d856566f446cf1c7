//! Timed messages for the audio thread: the network thread hands a service's messages
//! over with their ensemble times ([`AudioSender`]); the audio thread takes the ones due
//! in each period ([`AudioInbox`]), each with the frame it falls on, so a message lands
//! in the period that contains its time, at the right frame.
//!
//! The handoff is `netjam-osc`'s lock-free message queue; the waiting room is
//! `netjam-osc`'s bounded [`Scheduler`], keyed on ensemble nanoseconds. Both allocate
//! only when built: taking due messages never allocates, locks or blocks. When the queue
//! or the scheduler is full, a message is delivered early (at once) and counted rather
//! than dropped or grown.

use netjam_osc::queue::{message_queue, Consumer, Producer};
use netjam_osc::schedule::Scheduler;
use netjam_osc::TimeTag;

/// Why the network thread could not hand a message over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InboxError {
    #[error("timed message of {len} bytes is larger than an audio inbox slot ({slot} bytes)")]
    TooLarge { len: usize, slot: usize },
    #[error("the audio inbox queue is full (the audio thread is not taking messages)")]
    Full,
}

/// The network thread's end.
#[derive(Debug)]
pub struct AudioSender {
    producer: Producer,
    slot_bytes: usize,
    scratch: Vec<u8>,
}

/// The audio thread's end.
#[derive(Debug)]
pub struct AudioInbox {
    consumer: Consumer,
    scheduler: Scheduler,
    buf: Box<[u8]>,
    /// Messages delivered before their time because the scheduler was full.
    pub early: u64,
}

/// An inbox holding up to `slots` messages of up to `slot_bytes` bytes each.
pub fn audio_inbox(slots: usize, slot_bytes: usize) -> (AudioSender, AudioInbox) {
    let (producer, consumer) = message_queue(slots.max(1) * (slot_bytes + 16));
    (
        AudioSender {
            producer,
            slot_bytes,
            scratch: Vec::with_capacity(slot_bytes + 8),
        },
        AudioInbox {
            consumer,
            scheduler: Scheduler::new(slots, slot_bytes),
            buf: vec![0u8; slot_bytes + 8].into_boxed_slice(),
            early: 0,
        },
    )
}

/// Ensemble nanoseconds as a scheduler key (0 and 1 both mean "now").
fn key(ns: u64) -> TimeTag {
    TimeTag(ns.max(2))
}

impl AudioSender {
    /// Hands `message` (one encoded OSC message) over, to be taken at ensemble time
    /// `time_ns` (0: at once).
    pub fn send(&mut self, time_ns: u64, message: &[u8]) -> Result<(), InboxError> {
        if message.len() > self.slot_bytes {
            return Err(InboxError::TooLarge {
                len: message.len(),
                slot: self.slot_bytes,
            });
        }
        self.scratch.clear();
        self.scratch.extend_from_slice(&time_ns.to_be_bytes());
        self.scratch.extend_from_slice(message);
        self.producer.push(&self.scratch).map_err(|_| InboxError::Full)
    }
}

impl AudioInbox {
    /// Calls `f(time, message)` for every message due at ensemble time `now_ns`, earliest
    /// first (a message with no time counts as due now). Never allocates.
    pub fn take_due(&mut self, now_ns: u64, mut f: impl FnMut(u64, &[u8])) {
        let now = key(now_ns);
        while let Ok(Some(m)) = self.consumer.pop(&mut self.buf) {
            let Some((t, msg)) = m.split_first_chunk::<8>() else {
                continue;
            };
            let t = u64::from_be_bytes(*t);
            // Delivered at once only if due: then with its own time (the key is at least 2).
            let mut on = |_: TimeTag, b: &[u8]| f(t, b);
            if self.scheduler.offer(now, key(t), msg, &mut on).is_err() {
                self.early += 1;
                f(t, msg);
            }
        }
        self.scheduler.drain_due(now, |t, b| f(t.0, b));
    }

    /// For an audio period of `frames` frames starting at ensemble time `start_ns` and
    /// lasting `period_ns`: calls `f(frame, time, message)` for every message due before
    /// the period ends, `frame` being where its time falls (0 for anything already late).
    pub fn take_period(
        &mut self,
        start_ns: u64,
        period_ns: u64,
        frames: u32,
        mut f: impl FnMut(u32, u64, &[u8]),
    ) {
        let end = start_ns + period_ns.max(1) - 1;
        self.take_due(end, |t, m| {
            let into = t.saturating_sub(start_ns) as u128;
            let frame = (into * frames as u128 / period_ns.max(1) as u128) as u32;
            f(frame.min(frames.saturating_sub(1)), t, m)
        });
    }

    /// Messages waiting for their time.
    pub fn held(&self) -> usize {
        self.scheduler.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_land_on_their_frame() {
        let (mut tx, mut rx) = audio_inbox(8, 64);
        // 48 kHz, 64-frame periods: 1_333_333 ns.
        let period = 1_333_333u64;
        tx.send(10_000_000 + 666_667, b"/a\0\0,\0\0\0").unwrap();
        tx.send(0, b"/now\0\0\0\0,\0\0\0").unwrap();
        let mut got = Vec::new();
        let mut start = 9_000_000u64;
        while got.len() < 2 {
            rx.take_period(start, period, 64, |frame, t, m| {
                got.push((start, frame, t, m.len()))
            });
            start += period;
        }
        assert_eq!(got[0], (9_000_000, 0, 0, 12));
        // 10.666667 ms lies 0.333334 ms into the period starting at 10.333333 ms: frame 16.
        assert_eq!(got[1].0, 9_000_000 + period);
        assert_eq!(got[1].1, 16);
        assert_eq!(rx.held(), 0);
        assert!(tx.send(0, &[0u8; 65]).is_err());
    }
}
