//! A private room's SFrame stage on the audio thread: every RTP packet the player sends is
//! sealed after packetizing, and every member's packet is opened before that member's
//! jitter buffer, with keys derived from the room's password (see
//! [`super::keys`]). The RTP header stays clear, so the rooms server polices
//! and forwards as before without being able to hear anything; RTCP is not sealed.
//!
//! A packet that does not open (another key, altered, replayed, not sealed at all) is
//! dropped and counted in [`SealStats`]; the member's stream plays on around it.
//!
//! Everything is reserved in [`MediaSeal::new`]: sealing and opening never allocate.
//! Installing a member's key when the roster assigns it costs one HKDF on the audio
//! thread (microseconds), and allocates nothing either.

use super::rtp::{open_rtp, seal_rtp};
use super::{kid, MediaKey, SframeError, SframeOpener, SframeSealer};
use crate::sender::MAX_DATAGRAM;

/// What the SFrame stage did, since the start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SealStats {
    /// Packets sealed and sent.
    pub sealed: u64,
    /// Packets that could not be sealed (too large), not sent.
    pub seal_failed: u64,
    /// Members' packets opened and played.
    pub opened: u64,
    /// Members' packets dropped: the sum of the four below.
    pub rejected: u64,
    /// Whose tag did not verify: altered, or sealed under another password.
    pub forged: u64,
    /// Already opened, or too old for the replay window.
    pub replayed: u64,
    /// From an SSRC or KID with no key (not in the roster, or another epoch).
    pub no_key: u64,
    /// Not an SFrame packet at all (sent in clear, truncated).
    pub malformed: u64,
    /// The media epoch sealed and opened in now (the password's generation).
    pub epoch: u32,
    /// Times the keys changed to another epoch's.
    pub rekeys: u64,
}

/// Sealing for the player's own stream and opening for each member slot.
pub struct MediaSeal {
    media: MediaKey,
    epoch: u32,
    sealer: SframeSealer,
    /// The sealed packet, reserved for the largest datagram.
    buf: Vec<u8>,
    /// One opener per member slot, holding the key of the SSRC assigned there.
    openers: Vec<SframeOpener>,
    /// The SSRC last assigned to each slot, to key it again in a new epoch.
    assigned: Vec<Option<u32>>,
    /// This player's own SSRC.
    ssrc: u32,
    stats: SealStats,
}

impl std::fmt::Debug for MediaSeal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MediaSeal")
            .field("epoch", &self.epoch)
            .field("sealer", &self.sealer)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl MediaSeal {
    /// Seals what is sent with SSRC `ssrc` under `media` in `epoch`, and opens what
    /// `slots` member slots receive. The only allocation.
    pub fn new(media: MediaKey, epoch: u32, ssrc: u32, slots: usize) -> Self {
        Self {
            sealer: media.sealer(kid(epoch, ssrc)),
            media,
            epoch,
            buf: vec![0; MAX_DATAGRAM],
            openers: (0..slots).map(|_| SframeOpener::new()).collect(),
            assigned: vec![None; slots],
            ssrc,
            stats: SealStats {
                epoch,
                ..SealStats::default()
            },
        }
    }

    /// The sealed form of the RTP packet `packet`, or `None` (counted) if it cannot be.
    pub fn seal(&mut self, packet: &[u8]) -> Option<&[u8]> {
        match seal_rtp(&mut self.sealer, packet, &mut self.buf) {
            Ok(n) => {
                self.stats.sealed += 1;
                Some(&self.buf[..n])
            }
            Err(_) => {
                self.stats.seal_failed += 1;
                None
            }
        }
    }

    /// The member sending with `ssrc` now has `slot`: its key goes there. The same SSRC
    /// assigned again keeps its replay window.
    pub fn assign(&mut self, slot: usize, ssrc: u32) {
        let k = kid(self.epoch, ssrc);
        if let Some(o) = self.openers.get_mut(slot) {
            if !o.has(k) {
                *o = SframeOpener::new();
                self.media.install(o, k);
            }
            self.assigned[slot] = Some(ssrc);
        }
    }

    /// From now on seal and open in `epoch` with `media` (the room's password changed, or
    /// this player took the new one): every member slot is keyed again, and a member still
    /// sealing under the earlier password is heard no more. The sealer's counter goes on.
    /// A few HKDF runs (one per member); allocates nothing.
    pub fn rekey(&mut self, media: MediaKey, epoch: u32) {
        if media == self.media && epoch == self.epoch {
            return;
        }
        self.media = media;
        self.epoch = epoch;
        let k = kid(epoch, self.ssrc);
        self.sealer.rekey(k, &media.sender_base_key(k));
        for (o, ssrc) in self.openers.iter_mut().zip(&self.assigned) {
            *o = SframeOpener::new();
            if let Some(s) = ssrc {
                media.install(o, kid(epoch, *s));
            }
        }
        self.stats.epoch = epoch;
        self.stats.rekeys += 1;
    }

    /// Opens the sealed RTP packet in `packet` in place, for the member slot its SSRC has
    /// (`None`: no member has it); returns the plain packet's length, or `None` (counted)
    /// when it must be dropped.
    pub fn open(&mut self, slot: Option<usize>, packet: &mut [u8]) -> Option<usize> {
        let Some(opener) = slot.and_then(|s| self.openers.get_mut(s)) else {
            self.stats.no_key += 1;
            self.stats.rejected += 1;
            return None;
        };
        match open_rtp(opener, packet) {
            Ok(n) => {
                self.stats.opened += 1;
                Some(n)
            }
            Err(e) => {
                match e {
                    SframeError::Forged => self.stats.forged += 1,
                    SframeError::Replayed(_) => self.stats.replayed += 1,
                    SframeError::UnknownKey(_) => self.stats.no_key += 1,
                    _ => self.stats.malformed += 1,
                }
                self.stats.rejected += 1;
                None
            }
        }
    }

    /// What it did so far.
    pub fn stats(&self) -> SealStats {
        self.stats
    }
}
