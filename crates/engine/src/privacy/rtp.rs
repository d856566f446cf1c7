//! SFrame around an RTP packet's payload: the RTP header (with its CSRCs and extension)
//! stays in clear, so the rooms server still classifies, polices and forwards the packet,
//! and is authenticated as SFrame metadata, so nobody on the way can move a payload to
//! another sequence number, timestamp or SSRC, or change the format it declares.
//!
//! Sealing copies the header and seals the payload into a buffer the caller owns; opening
//! decrypts in place and moves the plaintext up against the header, so the result is an
//! ordinary RTP packet for the receiver. Neither allocates. Padded packets are refused
//! (netjam never pads): padding would sit outside what the tag covers.

use super::sframe::{Header, SframeError, SframeOpener, SframeSealer};
use crate::wire::{parse_rtp, RTP_HEADER_LEN};

/// Bytes of `packet` before its payload, or an error when it is not an unpadded RTP packet.
fn header_len(packet: &[u8]) -> Result<usize, SframeError> {
    let p = parse_rtp(packet).map_err(|_| SframeError::NotRtp)?;
    if packet[0] & 0x20 != 0 {
        return Err(SframeError::NotRtp);
    }
    Ok(RTP_HEADER_LEN + p.csrcs.len() + p.extension.map_or(0, |e| 4 + e.data.len()))
}

/// Seals `packet`'s payload into `out` after a copy of its header; returns the sealed
/// packet's length (the packet's plus [`SframeSealer::overhead`]).
pub fn seal_rtp(sealer: &mut SframeSealer, packet: &[u8], out: &mut [u8]) -> Result<usize, SframeError> {
    let h = header_len(packet)?;
    let need = packet.len() + sealer.overhead();
    if out.len() < need {
        return Err(SframeError::BufferTooSmall { need });
    }
    let (head, rest) = out.split_at_mut(h);
    head.copy_from_slice(&packet[..h]);
    let n = sealer.seal(head, &packet[h..], rest)?;
    Ok(h + n)
}

/// Opens the sealed payload of the RTP packet in `packet` in place; returns the length of
/// the plain RTP packet now at its start. On an error the packet must be dropped.
pub fn open_rtp(opener: &mut SframeOpener, packet: &mut [u8]) -> Result<usize, SframeError> {
    let h = header_len(packet)?;
    let (head, rest) = packet.split_at_mut(h);
    // The plaintext starts after the SFrame header and ends before the tag.
    let (_, at) = Header::parse(rest)?;
    let len = opener.open(head, rest)?.plaintext.len();
    rest.copy_within(at..at + len, 0);
    Ok(h + len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{format_extension, parse_rtp, write_rtp, AudioFormat, Codec, RtpHeader};

    fn packet(payload: &[u8]) -> Vec<u8> {
        let mut p = vec![0u8; 64 + payload.len()];
        let h = RtpHeader {
            marker: false,
            payload_type: 96,
            sequence: 7,
            timestamp: 640,
            ssrc: 0xabcd,
        };
        let fmt = AudioFormat::new(Codec::L16, 48_000, 2).expect("format");
        let mut ext = [0u8; 8];
        let ext = format_extension(&fmt, &mut ext);
        let n = write_rtp(&h, Some(ext), payload.len(), &mut p).expect("header");
        p.truncate(n + payload.len());
        p[n..].copy_from_slice(payload);
        p
    }

    #[test]
    fn header_clear_payload_sealed_and_restored() {
        let base = [3u8; 32];
        let mut s = SframeSealer::new(0x42, &base);
        let mut o = SframeOpener::new();
        o.install(0x42, &base);
        let payload: Vec<u8> = (0..276u32).map(|i| i as u8).collect();
        let p = packet(&payload);
        let mut out = [0u8; 400];
        let n = seal_rtp(&mut s, &p, &mut out).expect("seal");
        // KID 0x42 and counter 0: config byte, one KID byte, tag.
        assert_eq!(n, p.len() + 1 + 1 + 10);
        let sealed = parse_rtp(&out[..n]).expect("still RTP");
        assert_eq!((sealed.header.sequence, sealed.header.ssrc), (7, 0xabcd));
        assert!(!sealed.payload.windows(16).any(|w| w == &payload[..16]));
        let m = open_rtp(&mut o, &mut out[..n]).expect("open");
        assert_eq!(&out[..m], &p[..]);
    }

    #[test]
    fn a_changed_header_or_unsealed_packet_is_refused() {
        let base = [3u8; 32];
        let mut s = SframeSealer::new(1, &base);
        let mut o = SframeOpener::new();
        o.install(1, &base);
        let p = packet(b"0123456789abcdef");
        let mut out = [0u8; 100];
        let n = seal_rtp(&mut s, &p, &mut out).expect("seal");
        // The sequence number moved by someone on the way.
        let mut moved = out;
        moved[3] ^= 1;
        assert_eq!(open_rtp(&mut o, &mut moved[..n]), Err(SframeError::Forged));
        // A plain packet: its first payload byte is no header of a key we hold, or fails.
        let mut plain = p.clone();
        assert!(open_rtp(&mut o, &mut plain).is_err());
        assert_eq!(open_rtp(&mut o, &mut [0u8; 5]), Err(SframeError::NotRtp));
        assert_eq!(open_rtp(&mut o, &mut out[..n]), Ok(p.len()));
        assert_eq!(&out[..p.len()], &p[..]);
    }
}
