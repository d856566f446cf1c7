//! Holding bundled messages until their time tag is due.
//!
//! [`Scheduler`] is a sans-IO, bounded store: the caller passes the current time in and
//! gets due messages back. It allocates its storage once at construction and never
//! again; when it is full, a message is handed back to be delivered at once (or
//! dropped) rather than growing memory. Scheduling can be switched off, in which case
//! every message is delivered immediately with its time tag. This module must never read
//! the clock itself.

use crate::time::TimeTag;

/// Why a message could not be held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// Every slot is in use.
    #[error("scheduler full: all {0} slots hold messages")]
    Full(usize),
    /// The message is larger than one slot.
    #[error("message of {len} bytes is larger than a scheduler slot ({slot} bytes)")]
    TooLarge {
        /// Message size.
        len: usize,
        /// Slot size.
        slot: usize,
    },
}

/// A bounded store of messages waiting for their time tags.
#[derive(Debug)]
pub struct Scheduler {
    enabled: bool,
    slot_bytes: usize,
    store: Box<[u8]>,
    /// Per slot: time tag and length; `None` when free.
    slots: Box<[Option<(TimeTag, usize)>]>,
    held: usize,
}

impl Scheduler {
    /// A scheduler holding up to `slots` messages of up to `slot_bytes` each.
    pub fn new(slots: usize, slot_bytes: usize) -> Self {
        Scheduler {
            enabled: true,
            slot_bytes,
            store: vec![0u8; slots * slot_bytes].into_boxed_slice(),
            slots: vec![None; slots].into_boxed_slice(),
            held: 0,
        }
    }

    /// A scheduler that delivers everything at once.
    pub fn disabled() -> Self {
        let mut s = Self::new(0, 0);
        s.enabled = false;
        s
    }

    /// Switches holding on or off (held messages stay until [`drain_due`](Self::drain_due)
    /// or [`drain_all`](Self::drain_all)).
    pub fn set_enabled(&mut self, on: bool) {
        self.enabled = on;
    }

    /// Whether messages with future time tags are held.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Messages currently held.
    pub fn len(&self) -> usize {
        self.held
    }

    /// Whether no message is held.
    pub fn is_empty(&self) -> bool {
        self.held == 0
    }

    /// Delivers `message` through `deliver` now if it is due (or holding is off),
    /// otherwise keeps a copy until its time. On error nothing was delivered or held.
    pub fn offer<F: FnMut(TimeTag, &[u8])>(
        &mut self,
        now: TimeTag,
        time: TimeTag,
        message: &[u8],
        mut deliver: F,
    ) -> Result<(), ScheduleError> {
        if !self.enabled || time.is_immediate() || time <= now {
            deliver(time, message);
            return Ok(());
        }
        if message.len() > self.slot_bytes {
            return Err(ScheduleError::TooLarge {
                len: message.len(),
                slot: self.slot_bytes,
            });
        }
        let Some(i) = self.slots.iter().position(Option::is_none) else {
            return Err(ScheduleError::Full(self.slots.len()));
        };
        let at = i * self.slot_bytes;
        self.store[at..at + message.len()].copy_from_slice(message);
        self.slots[i] = Some((time, message.len()));
        self.held += 1;
        Ok(())
    }

    /// Offers every message of an encoded packet with the time tag that applies to it
    /// (bundles flattened; a nested bundle earlier than its parent counts as the
    /// parent's). Returns how many messages could not be held (they were not delivered
    /// either), or the decode error for a malformed packet.
    pub fn offer_packet<F: FnMut(TimeTag, &[u8])>(
        &mut self,
        now: TimeTag,
        packet: &[u8],
        mut deliver: F,
    ) -> Result<usize, crate::DecodeError> {
        let p = crate::Packet::decode(packet)?;
        let mut refused = 0;
        p.for_each_message(|t, m| {
            if self.offer(now, t, m.as_bytes(), &mut deliver).is_err() {
                refused += 1;
            }
        });
        Ok(refused)
    }

    /// The earliest held time tag, to know how long to sleep.
    pub fn next_due(&self) -> Option<TimeTag> {
        self.slots.iter().flatten().map(|(t, _)| *t).min()
    }

    /// Delivers every held message whose time is `<= now`, earliest first.
    pub fn drain_due<F: FnMut(TimeTag, &[u8])>(&mut self, now: TimeTag, mut deliver: F) {
        while let Some((i, t, len)) = self.earliest() {
            if t > now {
                break;
            }
            self.release(i, t, len, &mut deliver);
        }
    }

    /// Delivers every held message, earliest first.
    pub fn drain_all<F: FnMut(TimeTag, &[u8])>(&mut self, mut deliver: F) {
        while let Some((i, t, len)) = self.earliest() {
            self.release(i, t, len, &mut deliver);
        }
    }

    fn earliest(&self) -> Option<(usize, TimeTag, usize)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.map(|(t, len)| (i, t, len)))
            .min_by_key(|(i, t, _)| (*t, *i))
    }

    fn release<F: FnMut(TimeTag, &[u8])>(&mut self, i: usize, t: TimeTag, len: usize, deliver: &mut F) {
        self.slots[i] = None;
        self.held -= 1;
        let at = i * self.slot_bytes;
        deliver(t, &self.store[at..at + len]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_until_due_in_time_order() {
        let mut s = Scheduler::new(4, 16);
        let now = TimeTag::new(100, 0);
        let mut got: Vec<(TimeTag, Vec<u8>)> = Vec::new();
        s.offer(now, TimeTag::new(102, 0), b"late", |t, m| {
            got.push((t, m.to_vec()))
        })
        .unwrap();
        s.offer(now, TimeTag::new(101, 0), b"soon", |t, m| {
            got.push((t, m.to_vec()))
        })
        .unwrap();
        s.offer(now, TimeTag::IMMEDIATELY, b"now", |t, m| {
            got.push((t, m.to_vec()))
        })
        .unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(s.next_due(), Some(TimeTag::new(101, 0)));
        s.drain_due(TimeTag::new(101, 5), |t, m| got.push((t, m.to_vec())));
        assert_eq!(got[1].1, b"soon");
        s.drain_due(TimeTag::new(103, 0), |t, m| got.push((t, m.to_vec())));
        assert_eq!(got[2].1, b"late");
        assert!(s.is_empty());
    }

    #[test]
    fn packets_are_flattened_with_their_time_tags() {
        let mut buf = [0u8; 128];
        let mut w = crate::BundleWriter::new(&mut buf, TimeTag::new(50, 0)).unwrap();
        w.message("/late", &[]).unwrap();
        w.open_bundle(TimeTag::new(10, 0)).unwrap();
        w.message("/nested", &[]).unwrap();
        w.close_bundle().unwrap();
        let n = w.finish().unwrap();
        let mut s = Scheduler::new(4, 64);
        let mut got = Vec::new();
        let refused = s
            .offer_packet(TimeTag::new(20, 0), &buf[..n], |t, m| got.push((t, m.len())))
            .unwrap();
        assert_eq!((refused, got.len(), s.len()), (0, 0, 2));
        s.drain_due(TimeTag::new(50, 0), |t, _| got.push((t, 0)));
        assert_eq!(got, vec![(TimeTag::new(50, 0), 0), (TimeTag::new(50, 0), 0)]);
    }

    #[test]
    fn bounded_and_can_be_switched_off() {
        let mut s = Scheduler::new(1, 4);
        let now = TimeTag::new(1, 0);
        let later = TimeTag::new(9, 0);
        assert_eq!(
            s.offer(now, later, b"12345", |_, _| {}),
            Err(ScheduleError::TooLarge { len: 5, slot: 4 })
        );
        s.offer(now, later, b"a", |_, _| {}).unwrap();
        assert_eq!(s.offer(now, later, b"b", |_, _| {}), Err(ScheduleError::Full(1)));
        let mut off = Scheduler::disabled();
        let mut n = 0;
        off.offer(now, later, b"x", |_, _| n += 1).unwrap();
        assert_eq!(n, 1);
    }
}
