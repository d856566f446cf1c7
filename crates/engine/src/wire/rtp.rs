//! RTP packets (RFC 3550 section 5): the fixed header, CSRC list, header extension and
//! padding; demultiplexing of RTP, RTCP and other traffic sharing one port (RFC 5761);
//! and netjam's format extension, which tells a receiver the stream format in-band.
//!
//! [`parse_rtp`] borrows every field from the packet and checks every length against the
//! buffer; [`write_rtp`] fills a caller-owned buffer. Neither allocates, and no input makes
//! either panic: a bad packet is a typed [`RtpError`] that the stream counts and drops.
//!
//! # The format extension
//!
//! netjam senders put one RFC 8285 one-byte-header element (profile `0xBEDE`, element id 1)
//! in the RTP header extension so a receiver can learn the format without SDP:
//!
//! ```text
//!  byte 0: 0x11           id 1, length 2 (the length field holds length - 1)
//!  byte 1: codec << 4 | rate   codec: 1 = L16, 2 = L24, 3 = F32 (4 reserved for Opus)
//!                              rate:  1 = 44100, 2 = 48000, 3 = 96000, 4 = 8000,
//!                                     5 = 11025, 6 = 16000, 7 = 22050, 8 = 24000,
//!                                     9 = 32000, 10 = 88200, 11 = 176400, 12 = 192000,
//!                                     15 = written out in bytes 3-5
//!  byte 2: channels       1..=64
//!  byte 3: 0              padding to a 32-bit word
//! ```
//!
//! Any other rate from 8000 to 192000 Hz has rate code 15 and appends it (version 2):
//!
//! ```text
//!  byte 0: 0x14           id 1, length 5
//!  byte 1: codec << 4 | 15
//!  byte 2: channels
//!  bytes 3-5: rate in Hz, 24-bit big-endian
//!  bytes 6-7: 0           padding to a 32-bit word
//! ```
//!
//! Version 1 readers take the first two data bytes of an element of length 2 or more and
//! ignore the rest, so they see rate code 15 and say they do not know it; a later version
//! may only append bytes.

use crate::wire::payload::{AudioFormat, Codec, FormatError, RATE_CODE_EXPLICIT};

/// Length of the fixed RTP header, without CSRCs or extension.
pub const RTP_HEADER_LEN: usize = 12;

/// Profile value of an RFC 8285 one-byte-header extension block.
pub const ONE_BYTE_EXTENSION_PROFILE: u16 = 0xBEDE;

/// Element id of netjam's format element inside a one-byte-header extension.
pub const FORMAT_ELEMENT_ID: u8 = 1;

/// The fields of the fixed RTP header that netjam uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtpHeader {
    pub marker: bool,
    /// 7-bit payload type.
    pub payload_type: u8,
    pub sequence: u16,
    /// Media time of the first sample in the packet, in clock-rate units.
    pub timestamp: u32,
    pub ssrc: u32,
}

/// An RTP header extension: the 16-bit profile value and the data words after the length
/// field (`data.len()` is a multiple of 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtpExtension<'a> {
    pub profile: u16,
    pub data: &'a [u8],
}

/// A parsed RTP packet borrowing from the received buffer.
#[derive(Debug, Clone, Copy)]
pub struct RtpPacket<'a> {
    pub header: RtpHeader,
    /// The raw CSRC list: 4 bytes per contributing source.
    pub csrcs: &'a [u8],
    pub extension: Option<RtpExtension<'a>>,
    /// The payload with any padding removed.
    pub payload: &'a [u8],
}

impl RtpPacket<'_> {
    /// Number of contributing sources in [`RtpPacket::csrcs`].
    pub fn csrc_count(&self) -> usize {
        self.csrcs.len() / 4
    }

    /// The `i`th contributing source, if there is one.
    pub fn csrc(&self, i: usize) -> Option<u32> {
        let b = self
            .csrcs
            .get(i.checked_mul(4)?..i.checked_mul(4)?.checked_add(4)?)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// Why bytes are not a valid RTP packet, or a packet does not fit a buffer.
#[derive(Debug, thiserror::Error, Clone, Copy, PartialEq, Eq)]
pub enum RtpError {
    #[error("RTP packet too short: {len} bytes, the fixed header alone is 12")]
    TooShort { len: usize },
    #[error("RTP version {0}: only version 2 exists")]
    BadVersion(u8),
    #[error("RTP CSRC count points past the end of the packet")]
    CsrcPastEnd,
    #[error("RTP header extension runs past the end of the packet")]
    ExtensionPastEnd,
    #[error("RTP padding count is zero or larger than the payload")]
    BadPadding,
    #[error("buffer too small for the RTP packet: {need} bytes needed, {have} available")]
    BufferTooSmall { need: usize, have: usize },
    #[error("RTP payload type {0} does not fit in 7 bits (0 to 127)")]
    BadPayloadType(u8),
    #[error("RTP header extension data is {len} bytes: it must be a multiple of 4 and at most 262140")]
    BadExtensionLength { len: usize },
}

/// What a datagram arriving on a shared port is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacketKind {
    Rtp,
    Rtcp,
    /// Neither: e.g. netjam's probe packets (first byte ASCII `'N'`), STUN, garbage.
    Other,
}

/// Sorts a datagram into RTP, RTCP or other by its first two bytes (RFC 5761 section 4).
///
/// Version bits other than 2 mean [`PacketKind::Other`]. With version 2, a second byte in
/// 192..=223 (RTCP packet types; RTP payload types 64..=95 with the marker bit set, which
/// RFC 5761 forbids for RTP) means RTCP; anything else is RTP. This only sorts: the parser
/// still checks the packet.
pub fn classify(buf: &[u8]) -> PacketKind {
    match buf {
        [b0, b1, ..] if b0 >> 6 == 2 => {
            if (192..=223).contains(b1) {
                PacketKind::Rtcp
            } else {
                PacketKind::Rtp
            }
        }
        _ => PacketKind::Other,
    }
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Parses and checks an RTP packet.
///
/// Rejects: fewer than 12 bytes, a version other than 2, a CSRC list or header extension
/// running past the end, and padding whose count is zero or reaches into the header.
pub fn parse_rtp(buf: &[u8]) -> Result<RtpPacket<'_>, RtpError> {
    if buf.len() < RTP_HEADER_LEN {
        return Err(RtpError::TooShort { len: buf.len() });
    }
    let b0 = buf[0];
    let version = b0 >> 6;
    if version != 2 {
        return Err(RtpError::BadVersion(version));
    }
    let has_padding = b0 & 0x20 != 0;
    let has_extension = b0 & 0x10 != 0;
    let csrc_count = usize::from(b0 & 0x0f);
    let header = RtpHeader {
        marker: buf[1] & 0x80 != 0,
        payload_type: buf[1] & 0x7f,
        sequence: be16(buf, 2),
        timestamp: be32(buf, 4),
        ssrc: be32(buf, 8),
    };

    let csrc_end = RTP_HEADER_LEN + 4 * csrc_count;
    let csrcs = buf.get(RTP_HEADER_LEN..csrc_end).ok_or(RtpError::CsrcPastEnd)?;

    let mut header_end = csrc_end;
    let extension = if has_extension {
        let ext_head = buf
            .get(csrc_end..csrc_end + 4)
            .ok_or(RtpError::ExtensionPastEnd)?;
        let profile = u16::from_be_bytes([ext_head[0], ext_head[1]]);
        let words = usize::from(u16::from_be_bytes([ext_head[2], ext_head[3]]));
        let data_start = csrc_end + 4;
        let data_end = data_start + 4 * words;
        let data = buf.get(data_start..data_end).ok_or(RtpError::ExtensionPastEnd)?;
        header_end = data_end;
        Some(RtpExtension { profile, data })
    } else {
        None
    };

    let body = &buf[header_end..];
    let payload = if has_padding {
        let pad = match body.last() {
            Some(&p) => usize::from(p),
            None => return Err(RtpError::BadPadding),
        };
        if pad == 0 || pad > body.len() {
            return Err(RtpError::BadPadding);
        }
        &body[..body.len() - pad]
    } else {
        body
    };

    Ok(RtpPacket {
        header,
        csrcs,
        extension,
        payload,
    })
}

/// Writes an RTP header (version 2, no padding, no CSRCs) and `extension` into `out`.
///
/// Checks that the header plus `payload_len` payload bytes fit in `out` and returns the
/// header length; the caller writes the payload at `out[header_len..header_len +
/// payload_len]`. The extension data must be a whole number of 32-bit words.
pub fn write_rtp(
    header: &RtpHeader,
    extension: Option<RtpExtension<'_>>,
    payload_len: usize,
    out: &mut [u8],
) -> Result<usize, RtpError> {
    if header.payload_type > 0x7f {
        return Err(RtpError::BadPayloadType(header.payload_type));
    }
    let ext_len = match extension {
        Some(ext) => {
            let len = ext.data.len();
            if len % 4 != 0 || len / 4 > usize::from(u16::MAX) {
                return Err(RtpError::BadExtensionLength { len });
            }
            4 + len
        }
        None => 0,
    };
    let header_len = RTP_HEADER_LEN + ext_len;
    let need = header_len.saturating_add(payload_len);
    if need > out.len() {
        return Err(RtpError::BufferTooSmall {
            need,
            have: out.len(),
        });
    }
    out[0] = 0x80 | if extension.is_some() { 0x10 } else { 0 };
    out[1] = (u8::from(header.marker) << 7) | header.payload_type;
    out[2..4].copy_from_slice(&header.sequence.to_be_bytes());
    out[4..8].copy_from_slice(&header.timestamp.to_be_bytes());
    out[8..12].copy_from_slice(&header.ssrc.to_be_bytes());
    if let Some(ext) = extension {
        out[12..14].copy_from_slice(&ext.profile.to_be_bytes());
        // Fits: checked above that the word count is at most u16::MAX.
        out[14..16].copy_from_slice(&((ext.data.len() / 4) as u16).to_be_bytes());
        out[16..16 + ext.data.len()].copy_from_slice(ext.data);
    }
    Ok(header_len)
}

/// Fills `buf` with netjam's format extension for `fmt` (see the module docs) and returns
/// it, ready for [`write_rtp`].
///
/// `fmt` should come from [`AudioFormat::new`]; an out-of-range channel count is written
/// as 0 and a rate above 24 bits as 0 Hz, which receivers reject. A rate with a code takes
/// 4 bytes of `buf`, any other 8.
pub fn format_extension<'b>(fmt: &AudioFormat, buf: &'b mut [u8; 8]) -> RtpExtension<'b> {
    let channels = u8::try_from(fmt.channels).unwrap_or(0);
    let len = match fmt.rate_code() {
        Some(rate) => {
            buf[..4].copy_from_slice(&[
                (FORMAT_ELEMENT_ID << 4) | 1,
                (fmt.codec.wire_code() << 4) | rate,
                channels,
                0,
            ]);
            4
        }
        None => {
            let rate = if fmt.rate < 1 << 24 { fmt.rate } else { 0 };
            let [_, r0, r1, r2] = rate.to_be_bytes();
            *buf = [
                (FORMAT_ELEMENT_ID << 4) | 4,
                (fmt.codec.wire_code() << 4) | RATE_CODE_EXPLICIT,
                channels,
                r0,
                r1,
                r2,
                0,
                0,
            ];
            8
        }
    };
    RtpExtension {
        profile: ONE_BYTE_EXTENSION_PROFILE,
        data: &buf[..len],
    }
}

/// Finds netjam's format element in a one-byte-header extension and decodes it.
///
/// Returns `None` if the extension is not a one-byte-header block or holds no element with
/// id 1; other elements and padding bytes are skipped. Returns an error if the element is
/// there but shorter than 2 bytes, runs past the end, or names a format netjam does not
/// support.
pub fn parse_format_extension(ext: &RtpExtension<'_>) -> Option<Result<AudioFormat, FormatError>> {
    if ext.profile != ONE_BYTE_EXTENSION_PROFILE {
        return None;
    }
    let data = ext.data;
    let mut i = 0;
    while let Some(&b) = data.get(i) {
        if b == 0 {
            // Padding between elements.
            i += 1;
            continue;
        }
        let id = b >> 4;
        if id == 15 {
            // Reserved id: RFC 8285 says to stop processing the block here.
            return None;
        }
        let len = usize::from(b & 0x0f) + 1;
        let start = i + 1;
        let end = start + len;
        if id == FORMAT_ELEMENT_ID {
            let Some(element) = data.get(start..end) else {
                return Some(Err(FormatError::BadFormatElement {
                    len: data.len() - start,
                }));
            };
            return Some(decode_format_element(element));
        }
        i = end;
    }
    None
}

fn decode_format_element(element: &[u8]) -> Result<AudioFormat, FormatError> {
    let [codes, channels, ..] = *element else {
        return Err(FormatError::BadFormatElement { len: element.len() });
    };
    let codec = Codec::from_wire_code(codes >> 4)?;
    let rate = match codes & 0x0f {
        RATE_CODE_EXPLICIT => match *element {
            [_, _, r0, r1, r2, ..] => u32::from_be_bytes([0, r0, r1, r2]),
            _ => return Err(FormatError::BadFormatElement { len: element.len() }),
        },
        code => AudioFormat::rate_from_code(code)?,
    };
    AudioFormat::new(codec, rate, u16::from(channels))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> RtpHeader {
        RtpHeader {
            marker: true,
            payload_type: 97,
            sequence: 0xABCD,
            timestamp: 0x0102_0304,
            ssrc: 0xDEAD_BEEF,
        }
    }

    #[test]
    fn write_then_parse_round_trips_without_extension() {
        let mut buf = [0u8; 64];
        let n = write_rtp(&header(), None, 5, &mut buf).expect("fits");
        assert_eq!(n, 12);
        buf[n..n + 5].copy_from_slice(b"hello");
        assert_eq!(
            buf[..12],
            [0x80, 0x80 | 97, 0xAB, 0xCD, 1, 2, 3, 4, 0xDE, 0xAD, 0xBE, 0xEF]
        );
        let p = parse_rtp(&buf[..n + 5]).expect("valid");
        assert_eq!(p.header, header());
        assert_eq!(p.payload, b"hello");
        assert!(p.extension.is_none());
        assert!(p.csrcs.is_empty());
    }

    #[test]
    fn format_extension_round_trips_and_has_the_documented_bytes() {
        let fmt = AudioFormat::new(Codec::L24, 48_000, 2).expect("valid");
        let mut ext_buf = [0u8; 8];
        let ext = format_extension(&fmt, &mut ext_buf);
        assert_eq!(ext.data, [0x11, 0x22, 2, 0]);
        let mut buf = [0u8; 64];
        let n = write_rtp(&header(), Some(ext), 6, &mut buf).expect("fits");
        assert_eq!(n, 20);
        assert_eq!(buf[0], 0x90);
        assert_eq!(buf[12..20], [0xBE, 0xDE, 0, 1, 0x11, 0x22, 2, 0]);
        let p = parse_rtp(&buf[..n + 6]).expect("valid");
        let ext = p.extension.expect("extension");
        assert_eq!(ext.profile, 0xBEDE);
        assert_eq!(parse_format_extension(&ext), Some(Ok(fmt)));
        assert_eq!(p.payload.len(), 6);

        for codec in [Codec::L16, Codec::L24, Codec::F32] {
            for rate in [
                8_000, 11_025, 12_000, 44_100, 48_000, 50_000, 96_000, 176_400, 192_000,
            ] {
                for ch in [1, 2, 7, 64] {
                    let fmt = AudioFormat::new(codec, rate, ch).expect("valid");
                    let mut b = [0u8; 8];
                    let ext = format_extension(&fmt, &mut b);
                    assert_eq!(parse_format_extension(&ext), Some(Ok(fmt)));
                }
            }
        }
    }

    #[test]
    fn a_rate_without_a_code_is_written_out_in_full() {
        let fmt = AudioFormat::new(Codec::L16, 12_000, 2).expect("valid");
        let mut ext_buf = [0u8; 8];
        let ext = format_extension(&fmt, &mut ext_buf);
        // id 1, length 5; L16 with rate code 15; 2 channels; 12000 = 0x002EE0; padding.
        assert_eq!(ext.data, [0x14, 0x1F, 2, 0x00, 0x2E, 0xE0, 0, 0]);
        let mut buf = [0u8; 64];
        let n = write_rtp(&header(), Some(ext), 4, &mut buf).expect("fits");
        assert_eq!(n, 24);
        let p = parse_rtp(&buf[..n + 4]).expect("valid");
        assert_eq!(
            parse_format_extension(&p.extension.expect("extension")),
            Some(Ok(fmt))
        );
        // A version 1 reader sees only the codes and channels: rate code 15, unknown to it.
        assert_eq!(
            AudioFormat::rate_from_code(ext.data[1] & 0x0f),
            Err(FormatError::UnknownRateCode(15))
        );
        // The element cut short of its rate, and a rate outside 8-192 kHz.
        let short = RtpExtension {
            profile: 0xBEDE,
            data: &[0x12, 0x1F, 2, 0x00],
        };
        assert_eq!(
            parse_format_extension(&short),
            Some(Err(FormatError::BadFormatElement { len: 3 }))
        );
        let high = RtpExtension {
            profile: 0xBEDE,
            data: &[0x14, 0x1F, 2, 0x05, 0xDC, 0x00, 0, 0],
        };
        assert_eq!(
            parse_format_extension(&high),
            Some(Err(FormatError::UnsupportedRate(384_000)))
        );
    }

    #[test]
    fn format_element_is_found_among_other_elements_and_padding() {
        // Padding, id 3 with 3 bytes, padding, our element (longer, from a later version).
        let data = [0, 0x32, 9, 9, 9, 0, 0x13, 0x31, 1, 0xAA, 0xBB, 0, 0];
        let ext = RtpExtension {
            profile: 0xBEDE,
            data: &data[..12],
        };
        let fmt = AudioFormat::new(Codec::F32, 44_100, 1).expect("valid");
        assert_eq!(parse_format_extension(&ext), Some(Ok(fmt)));
        // Not there at all.
        let ext = RtpExtension {
            profile: 0xBEDE,
            data: &[0x20, 7, 0, 0],
        };
        assert_eq!(parse_format_extension(&ext), None);
        // Other profile (two-byte header or something foreign).
        let ext = RtpExtension {
            profile: 0x1000,
            data: &[0x11, 0x22, 2, 0],
        };
        assert_eq!(parse_format_extension(&ext), None);
        // Id 15 stops processing before our element.
        let ext = RtpExtension {
            profile: 0xBEDE,
            data: &[0xF0, 0x11, 0x22, 2],
        };
        assert_eq!(parse_format_extension(&ext), None);
    }

    #[test]
    fn bad_format_elements_are_errors() {
        let ext = |d: &'static [u8]| RtpExtension {
            profile: 0xBEDE,
            data: d,
        };
        assert_eq!(
            parse_format_extension(&ext(&[0x10, 0x22, 0, 0])),
            Some(Err(FormatError::BadFormatElement { len: 1 }))
        );
        assert_eq!(
            parse_format_extension(&ext(&[0, 0, 0x13, 0x22])),
            Some(Err(FormatError::BadFormatElement { len: 1 }))
        );
        assert_eq!(
            parse_format_extension(&ext(&[0x11, 0x52, 2, 0])),
            Some(Err(FormatError::UnknownCodecCode(5)))
        );
        assert_eq!(
            parse_format_extension(&ext(&[0x11, 0x2D, 2, 0])),
            Some(Err(FormatError::UnknownRateCode(13)))
        );
        assert_eq!(
            parse_format_extension(&ext(&[0x11, 0x22, 0, 0])),
            Some(Err(FormatError::UnsupportedChannels(0)))
        );
        assert_eq!(
            parse_format_extension(&ext(&[0x11, 0x22, 65, 0])),
            Some(Err(FormatError::UnsupportedChannels(65)))
        );
    }

    #[test]
    fn csrcs_extension_and_padding_are_parsed() {
        let mut p = vec![0xB2, 96, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3];
        p.extend_from_slice(&[0, 0, 0, 10, 0, 0, 0, 11]); // 2 CSRCs
        p.extend_from_slice(&[0x12, 0x34, 0, 1, 1, 2, 3, 4]); // extension, 1 word
        p.extend_from_slice(b"abc");
        p.extend_from_slice(&[0, 0, 3]); // 3 bytes of padding
        let r = parse_rtp(&p).expect("valid");
        assert_eq!(r.csrc_count(), 2);
        assert_eq!(r.csrc(0), Some(10));
        assert_eq!(r.csrc(1), Some(11));
        assert_eq!(r.csrc(2), None);
        assert_eq!(
            r.extension,
            Some(RtpExtension {
                profile: 0x1234,
                data: &[1, 2, 3, 4]
            })
        );
        assert_eq!(r.payload, b"abc");
        assert!(!r.header.marker);
        assert_eq!(r.header.payload_type, 96);
    }

    fn err(buf: &[u8]) -> Option<RtpError> {
        parse_rtp(buf).err()
    }

    #[test]
    fn every_truncation_of_a_valid_packet_is_an_error_or_a_shorter_payload() {
        let fmt = AudioFormat::new(Codec::L16, 48_000, 2).expect("valid");
        let mut eb = [0u8; 8];
        let ext = format_extension(&fmt, &mut eb);
        let mut buf = [0u8; 40];
        let n = write_rtp(&header(), Some(ext), 20, &mut buf).expect("fits");
        for len in 0..n + 20 {
            match parse_rtp(&buf[..len]) {
                Ok(p) => {
                    assert!(len >= n);
                    assert_eq!(p.payload.len(), len - n);
                }
                Err(e) if len < 12 => assert_eq!(e, RtpError::TooShort { len }),
                Err(e) => assert_eq!(e, RtpError::ExtensionPastEnd, "len {len}"),
            }
        }
    }

    #[test]
    fn hostile_packets_are_typed_errors() {
        let mut base = [0u8; 12];
        base[0] = 0x80;
        assert_eq!(err(&base[..11]), Some(RtpError::TooShort { len: 11 }));
        assert!(parse_rtp(&base).is_ok());
        for v in [0u8, 1, 3] {
            let mut b = base;
            b[0] = v << 6;
            assert_eq!(err(&b), Some(RtpError::BadVersion(v)));
        }
        // CSRC count 15 with no CSRCs present; 1 CSRC with only 3 bytes.
        let mut b = base;
        b[0] = 0x8F;
        assert_eq!(err(&b), Some(RtpError::CsrcPastEnd));
        let mut b = [0u8; 15];
        b[0] = 0x81;
        assert_eq!(err(&b), Some(RtpError::CsrcPastEnd));
        // Extension bit with no extension header; extension length 0xFFFF words.
        let mut b = base;
        b[0] = 0x90;
        assert_eq!(err(&b), Some(RtpError::ExtensionPastEnd));
        let mut b = [0u8; 20];
        b[0] = 0x90;
        b[14] = 0xFF;
        b[15] = 0xFF;
        assert_eq!(err(&b), Some(RtpError::ExtensionPastEnd));
        // Extension of 1 word needs 4 more bytes after its header.
        b[14] = 0;
        b[15] = 1;
        assert_eq!(err(&b[..19]), Some(RtpError::ExtensionPastEnd));
        assert!(parse_rtp(&b).is_ok());
        // Padding bit with nothing after the header, a zero count, a count past the header.
        let mut b = base;
        b[0] = 0xA0;
        assert_eq!(err(&b), Some(RtpError::BadPadding));
        let mut b = [0u8; 16];
        b[0] = 0xA0;
        b[15] = 0;
        assert_eq!(err(&b), Some(RtpError::BadPadding));
        b[15] = 5;
        assert_eq!(err(&b), Some(RtpError::BadPadding));
        b[15] = 255;
        assert_eq!(err(&b), Some(RtpError::BadPadding));
        // Padding exactly the whole payload is fine: empty payload.
        b[15] = 4;
        assert_eq!(parse_rtp(&b).expect("valid").payload.len(), 0);
    }

    #[test]
    fn writer_checks_buffer_payload_type_and_extension_length() {
        let mut small = [0u8; 20];
        assert_eq!(
            write_rtp(&header(), None, 9, &mut small),
            Err(RtpError::BufferTooSmall { need: 21, have: 20 })
        );
        assert_eq!(
            write_rtp(&header(), None, usize::MAX, &mut small),
            Err(RtpError::BufferTooSmall {
                need: usize::MAX,
                have: 20
            })
        );
        assert_eq!(write_rtp(&header(), None, 8, &mut small), Ok(12));
        let mut h = header();
        h.payload_type = 128;
        assert_eq!(
            write_rtp(&h, None, 0, &mut small),
            Err(RtpError::BadPayloadType(128))
        );
        let ext = RtpExtension {
            profile: 1,
            data: &[1, 2, 3],
        };
        assert_eq!(
            write_rtp(&header(), Some(ext), 0, &mut small),
            Err(RtpError::BadExtensionLength { len: 3 })
        );
        let msg = RtpError::BufferTooSmall { need: 21, have: 20 }.to_string();
        assert!(msg.contains("21") && msg.contains("20"), "{msg}");
    }

    #[test]
    fn classify_follows_rfc_5761() {
        assert_eq!(classify(&[0x80, 96, 0, 0]), PacketKind::Rtp);
        assert_eq!(classify(&[0x80, 0x80 | 10]), PacketKind::Rtp);
        assert_eq!(classify(&[0x80, 200, 0, 6]), PacketKind::Rtcp);
        assert_eq!(classify(&[0x81, 201]), PacketKind::Rtcp);
        assert_eq!(classify(&[0x80, 192]), PacketKind::Rtcp);
        assert_eq!(classify(&[0x80, 223]), PacketKind::Rtcp);
        assert_eq!(classify(&[0x80, 224]), PacketKind::Rtp);
        assert_eq!(classify(&[0x80, 191]), PacketKind::Rtp);
        assert_eq!(classify(b"NJP1...."), PacketKind::Other);
        assert_eq!(classify(&[0x40, 200]), PacketKind::Other);
        assert_eq!(classify(&[0x80]), PacketKind::Other);
        assert_eq!(classify(&[]), PacketKind::Other);
    }
}
