//! RTCP (RFC 3550 section 6): sender and receiver reports, source descriptions, BYE and
//! APP packets; NTP timestamps; and the receiver-side statistics that fill a report block
//! (RFC 3550 appendix A.1, A.3 and A.8) and turn LSR/DLSR into a round-trip time.
//!
//! The writers fill a caller's buffer, one packet each; a compound packet is several of
//! them written back to back. [`parse_rtcp`] walks a compound packet and borrows every
//! field from it. Nothing here allocates, reads a clock or panics on any input: times come
//! in as nanosecond counts and bad packets come out as typed [`RtcpError`]s.

use serde::{Deserialize, Serialize};

/// RTCP packet type of a sender report.
pub const RTCP_SR: u8 = 200;
/// RTCP packet type of a receiver report.
pub const RTCP_RR: u8 = 201;
/// RTCP packet type of a source description.
pub const RTCP_SDES: u8 = 202;
/// RTCP packet type of a goodbye.
pub const RTCP_BYE: u8 = 203;
/// RTCP packet type of an application-defined packet.
pub const RTCP_APP: u8 = 204;

/// SDES item type of the canonical name.
pub const SDES_CNAME: u8 = 1;
/// SDES item type of the user's display name.
pub const SDES_NAME: u8 = 2;

/// Most report blocks one SR or RR can carry (5-bit count).
pub const MAX_REPORT_BLOCKS: usize = 31;

const REPORT_BLOCK_LEN: usize = 24;
const SENDER_INFO_LEN: usize = 20;
const NS_PER_S: u64 = 1_000_000_000;
/// Seconds from the NTP epoch (1900) to the Unix epoch (1970).
const NTP_UNIX_OFFSET_S: u64 = 2_208_988_800;

/// A 64-bit NTP timestamp: seconds since 1900 in the high 32 bits, fraction in the low.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NtpTime(pub u64);

impl NtpTime {
    /// The NTP time of `ns` nanoseconds after the Unix epoch (wrapping in 2036 as NTP
    /// era 0 does).
    pub fn from_unix_ns(ns: u64) -> NtpTime {
        let secs = ns / NS_PER_S + NTP_UNIX_OFFSET_S;
        let frac = ((ns % NS_PER_S) << 32) / NS_PER_S;
        NtpTime((secs << 32) | frac)
    }

    /// Nanoseconds since the Unix epoch, reading seconds before 1970 as NTP era 1
    /// (after 2036).
    pub fn to_unix_ns(self) -> u64 {
        let mut secs = self.0 >> 32;
        if secs < NTP_UNIX_OFFSET_S {
            secs += 1 << 32;
        }
        let frac_ns = ((self.0 & 0xFFFF_FFFF) * NS_PER_S + (1 << 31)) >> 32;
        (secs - NTP_UNIX_OFFSET_S) * NS_PER_S + frac_ns
    }

    /// The middle 32 bits (16.16 fixed-point seconds), as used in LSR and for RTT.
    pub fn middle32(self) -> u32 {
        (self.0 >> 16) as u32
    }
}

/// Converts a duration in nanoseconds to RTCP's 1/65536-second units (as in DLSR),
/// saturating at `u32::MAX` (about 18 hours).
pub fn ns_to_ntp_short(ns: u64) -> u32 {
    let units = (u128::from(ns) << 16) / u128::from(NS_PER_S);
    u32::try_from(units).unwrap_or(u32::MAX)
}

/// Converts RTCP's 1/65536-second units to nanoseconds (rounded to nearest).
pub fn ntp_short_to_ns(units: u32) -> u64 {
    (u64::from(units) * NS_PER_S + (1 << 15)) >> 16
}

/// One reception report block (RFC 3550 section 6.4.1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReportBlock {
    /// The source this block reports on.
    pub ssrc: u32,
    /// Packets lost since the previous report, as a fraction of 256.
    pub fraction_lost: u8,
    /// Packets lost since reception started (negative with duplicates); 24-bit signed on
    /// the wire, so the writer clamps it to -8388608..=8388607.
    pub cumulative_lost: i32,
    /// Extended highest sequence number: cycles in the high 16 bits.
    pub highest_seq: u32,
    /// Interarrival jitter in RTP timestamp units.
    pub jitter: u32,
    /// Middle 32 bits of the NTP time of the last SR received from the source, 0 if none.
    pub lsr: u32,
    /// Delay since that SR in 1/65536 s, 0 if none.
    pub dlsr: u32,
}

impl ReportBlock {
    fn write(&self, out: &mut [u8]) {
        let lost = self.cumulative_lost.clamp(-0x80_0000, 0x7F_FFFF);
        let lost = lost.to_be_bytes();
        out[0..4].copy_from_slice(&self.ssrc.to_be_bytes());
        out[4] = self.fraction_lost;
        out[5..8].copy_from_slice(&lost[1..4]);
        out[8..12].copy_from_slice(&self.highest_seq.to_be_bytes());
        out[12..16].copy_from_slice(&self.jitter.to_be_bytes());
        out[16..20].copy_from_slice(&self.lsr.to_be_bytes());
        out[20..24].copy_from_slice(&self.dlsr.to_be_bytes());
    }

    fn read(b: &[u8]) -> ReportBlock {
        ReportBlock {
            ssrc: be32(b, 0),
            fraction_lost: b[4],
            // Sign-extend the 24-bit count.
            cumulative_lost: i32::from_be_bytes([b[5], b[6], b[7], 0]) >> 8,
            highest_seq: be32(b, 8),
            jitter: be32(b, 12),
            lsr: be32(b, 16),
            dlsr: be32(b, 20),
        }
    }
}

/// The sender information section of an SR.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SenderInfo {
    /// Wall-clock time the report was sent.
    pub ntp: NtpTime,
    /// The same instant in the stream's media time.
    pub rtp_timestamp: u32,
    pub packet_count: u32,
    /// Payload bytes sent.
    pub octet_count: u32,
}

/// Why bytes are not a valid RTCP packet, or a packet does not fit a buffer.
#[derive(Debug, thiserror::Error, Clone, Copy, PartialEq, Eq)]
pub enum RtcpError {
    #[error("RTCP packet too short: {len} bytes left, a header is 4")]
    TooShort { len: usize },
    #[error("RTCP version {0}: only version 2 exists")]
    BadVersion(u8),
    #[error("RTCP length field says {need} bytes but only {have} remain")]
    LengthPastEnd { need: usize, have: usize },
    #[error("RTCP padding count is zero or larger than the packet")]
    BadPadding,
    #[error("RTCP report blocks run past the end of the packet")]
    ReportsPastEnd,
    #[error("RTCP SDES chunk runs past the end of the packet")]
    SdesPastEnd,
    #[error("RTCP BYE sources or reason run past the end of the packet")]
    ByePastEnd,
    #[error("RTCP APP packet shorter than its 8-byte SSRC and name")]
    AppTooShort,
    #[error("{count} report blocks do not fit one RTCP packet (at most 31)")]
    TooManyReports { count: usize },
    #[error("buffer too small for the RTCP packet: {need} bytes needed, {have} available")]
    BufferTooSmall { need: usize, have: usize },
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Writes the 4-byte common header for a packet of `len` bytes (a multiple of 4).
fn write_common_header(out: &mut [u8], count: u8, packet_type: u8, len: usize) {
    out[0] = 0x80 | (count & 0x1f);
    out[1] = packet_type;
    // Callers keep packets far below 256 KiB, so the word count fits 16 bits.
    out[2..4].copy_from_slice(&((len / 4 - 1) as u16).to_be_bytes());
}

fn check_room(need: usize, out: &[u8]) -> Result<(), RtcpError> {
    if need > out.len() {
        Err(RtcpError::BufferTooSmall {
            need,
            have: out.len(),
        })
    } else {
        Ok(())
    }
}

fn check_reports(reports: &[ReportBlock]) -> Result<(), RtcpError> {
    if reports.len() > MAX_REPORT_BLOCKS {
        Err(RtcpError::TooManyReports { count: reports.len() })
    } else {
        Ok(())
    }
}

/// Writes a sender report (SR) and returns its length.
pub fn write_sender_report(
    ssrc: u32,
    info: &SenderInfo,
    reports: &[ReportBlock],
    out: &mut [u8],
) -> Result<usize, RtcpError> {
    check_reports(reports)?;
    let len = 8 + SENDER_INFO_LEN + REPORT_BLOCK_LEN * reports.len();
    check_room(len, out)?;
    write_common_header(out, reports.len() as u8, RTCP_SR, len);
    out[4..8].copy_from_slice(&ssrc.to_be_bytes());
    out[8..16].copy_from_slice(&info.ntp.0.to_be_bytes());
    out[16..20].copy_from_slice(&info.rtp_timestamp.to_be_bytes());
    out[20..24].copy_from_slice(&info.packet_count.to_be_bytes());
    out[24..28].copy_from_slice(&info.octet_count.to_be_bytes());
    for (r, o) in reports
        .iter()
        .zip(out[28..len].chunks_exact_mut(REPORT_BLOCK_LEN))
    {
        r.write(o);
    }
    Ok(len)
}

/// Writes a receiver report (RR) and returns its length.
pub fn write_receiver_report(ssrc: u32, reports: &[ReportBlock], out: &mut [u8]) -> Result<usize, RtcpError> {
    check_reports(reports)?;
    let len = 8 + REPORT_BLOCK_LEN * reports.len();
    check_room(len, out)?;
    write_common_header(out, reports.len() as u8, RTCP_RR, len);
    out[4..8].copy_from_slice(&ssrc.to_be_bytes());
    for (r, o) in reports.iter().zip(out[8..len].chunks_exact_mut(REPORT_BLOCK_LEN)) {
        r.write(o);
    }
    Ok(len)
}

/// The longest prefix of `s` of at most 255 bytes that ends on a character boundary.
fn item_text(s: &str) -> &[u8] {
    let mut end = s.len().min(255);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s.as_bytes()[..end]
}

fn round_up4(n: usize) -> usize {
    (n + 3) & !3
}

/// Writes a source description (SDES) with one chunk: CNAME and optionally NAME, each
/// cut to 255 bytes at a character boundary. Returns its length.
pub fn write_sdes(ssrc: u32, cname: &str, name: Option<&str>, out: &mut [u8]) -> Result<usize, RtcpError> {
    let cname = item_text(cname);
    let name = name.map(item_text);
    let items = 2 + cname.len() + name.map_or(0, |n| 2 + n.len());
    // Header, SSRC, items, at least one null octet, padded to a word.
    let len = round_up4(8 + items + 1);
    check_room(len, out)?;
    write_common_header(out, 1, RTCP_SDES, len);
    out[4..8].copy_from_slice(&ssrc.to_be_bytes());
    let mut pos = 8;
    for (kind, text) in [(SDES_CNAME, Some(cname)), (SDES_NAME, name)] {
        if let Some(text) = text {
            out[pos] = kind;
            out[pos + 1] = text.len() as u8;
            out[pos + 2..pos + 2 + text.len()].copy_from_slice(text);
            pos += 2 + text.len();
        }
    }
    out[pos..len].fill(0);
    Ok(len)
}

/// Writes a BYE for `ssrc` with an optional reason (cut to 255 bytes at a character
/// boundary). Returns its length.
pub fn write_bye(ssrc: u32, reason: Option<&str>, out: &mut [u8]) -> Result<usize, RtcpError> {
    let reason = reason.map(item_text);
    let len = round_up4(8 + reason.map_or(0, |r| 1 + r.len()));
    check_room(len, out)?;
    write_common_header(out, 1, RTCP_BYE, len);
    out[4..8].copy_from_slice(&ssrc.to_be_bytes());
    let mut pos = 8;
    if let Some(r) = reason {
        out[pos] = r.len() as u8;
        out[pos + 1..pos + 1 + r.len()].copy_from_slice(r);
        pos += 1 + r.len();
    }
    out[pos..len].fill(0);
    Ok(len)
}

/// The report blocks of an SR or RR, decoded as they are iterated.
#[derive(Debug, Clone)]
pub struct ReportBlocks<'a> {
    data: &'a [u8],
}

impl Iterator for ReportBlocks<'_> {
    type Item = ReportBlock;

    fn next(&mut self) -> Option<ReportBlock> {
        let block = self.data.get(..REPORT_BLOCK_LEN)?;
        self.data = &self.data[REPORT_BLOCK_LEN..];
        Some(ReportBlock::read(block))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.data.len() / REPORT_BLOCK_LEN;
        (n, Some(n))
    }
}

impl ExactSizeIterator for ReportBlocks<'_> {}

/// One SDES item with the source it describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SdesItem<'a> {
    pub ssrc: u32,
    /// Item type: [`SDES_CNAME`], [`SDES_NAME`], ...
    pub item_type: u8,
    pub value: &'a [u8],
}

impl<'a> SdesItem<'a> {
    /// The value as text, if it is valid UTF-8 (RFC 3550 says it must be).
    pub fn as_str(&self) -> Option<&'a str> {
        std::str::from_utf8(self.value).ok()
    }
}

/// The items of an SDES packet, all chunks in order. The parser has already checked the
/// structure, so iteration cannot fail.
#[derive(Debug, Clone)]
pub struct SdesChunks<'a> {
    data: &'a [u8],
    chunks_left: usize,
    /// SSRC of the chunk being read, `None` between chunks.
    ssrc: Option<u32>,
}

impl<'a> Iterator for SdesChunks<'a> {
    type Item = SdesItem<'a>;

    fn next(&mut self) -> Option<SdesItem<'a>> {
        loop {
            let ssrc = match self.ssrc {
                Some(s) => s,
                None => {
                    if self.chunks_left == 0 || self.data.len() < 4 {
                        return None;
                    }
                    self.chunks_left -= 1;
                    let s = be32(self.data, 0);
                    self.data = &self.data[4..];
                    self.ssrc = Some(s);
                    s
                }
            };
            match *self.data {
                [0, ..] => {
                    // End of chunk: skip the null octets up to the next word boundary.
                    let skip = sdes_chunk_tail(self.data.len());
                    self.data = self.data.get(skip..).unwrap_or(&[]);
                    self.ssrc = None;
                }
                [item_type, len, ref rest @ ..] => {
                    let len = usize::from(len);
                    let value = rest.get(..len)?;
                    self.data = &rest[len..];
                    return Some(SdesItem {
                        ssrc,
                        item_type,
                        value,
                    });
                }
                _ => return None,
            }
        }
    }
}

/// Bytes from a chunk's first null octet to the start of the next chunk, given the bytes
/// left in the packet body from that octet on (the body length is a multiple of 4).
fn sdes_chunk_tail(remaining: usize) -> usize {
    // The body is word-aligned, so the null octet sits at offset (len - remaining) and the
    // next chunk starts at the next multiple of 4 after it.
    match remaining % 4 {
        0 => 4,
        r => r,
    }
}

/// One packet of a compound RTCP packet.
#[derive(Debug, Clone)]
pub enum RtcpPacket<'a> {
    SenderReport {
        ssrc: u32,
        info: SenderInfo,
        reports: ReportBlocks<'a>,
    },
    ReceiverReport {
        ssrc: u32,
        reports: ReportBlocks<'a>,
    },
    Sdes(SdesChunks<'a>),
    Bye {
        /// Raw SSRC/CSRC list, 4 bytes per source.
        ssrcs: &'a [u8],
        reason: Option<&'a [u8]>,
    },
    App {
        subtype: u8,
        ssrc: u32,
        name: [u8; 4],
        data: &'a [u8],
    },
    /// A packet type netjam does not read (feedback, XR, ...); skipped whole.
    Other {
        packet_type: u8,
    },
}

/// Iterates the packets of a compound RTCP packet; see [`parse_rtcp`].
#[derive(Debug, Clone)]
pub struct RtcpIter<'a> {
    rest: &'a [u8],
    failed: bool,
}

/// Walks a compound RTCP packet. Each item is one packet or the error that ends the walk:
/// after the first error the iterator yields nothing more.
pub fn parse_rtcp(buf: &[u8]) -> RtcpIter<'_> {
    RtcpIter {
        rest: buf,
        failed: false,
    }
}

impl<'a> Iterator for RtcpIter<'a> {
    type Item = Result<RtcpPacket<'a>, RtcpError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.rest.is_empty() {
            return None;
        }
        let result = next_packet(self.rest);
        match result {
            Ok((packet, len)) => {
                self.rest = &self.rest[len..];
                Some(Ok(packet))
            }
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

/// Parses the packet at the start of `buf`; returns it and its length.
fn next_packet(buf: &[u8]) -> Result<(RtcpPacket<'_>, usize), RtcpError> {
    let [b0, packet_type, l0, l1, ..] = *buf else {
        return Err(RtcpError::TooShort { len: buf.len() });
    };
    let version = b0 >> 6;
    if version != 2 {
        return Err(RtcpError::BadVersion(version));
    }
    let count = usize::from(b0 & 0x1f);
    let len = (usize::from(u16::from_be_bytes([l0, l1])) + 1) * 4;
    let packet = buf.get(..len).ok_or(RtcpError::LengthPastEnd {
        need: len,
        have: buf.len(),
    })?;
    let mut body = &packet[4..];
    if b0 & 0x20 != 0 {
        let pad = usize::from(packet[len - 1]);
        if pad == 0 || pad > body.len() {
            return Err(RtcpError::BadPadding);
        }
        body = &body[..body.len() - pad];
    }
    let parsed = match packet_type {
        RTCP_SR => {
            let end = 4 + SENDER_INFO_LEN + REPORT_BLOCK_LEN * count;
            if body.len() < end {
                return Err(RtcpError::ReportsPastEnd);
            }
            RtcpPacket::SenderReport {
                ssrc: be32(body, 0),
                info: SenderInfo {
                    ntp: NtpTime((u64::from(be32(body, 4)) << 32) | u64::from(be32(body, 8))),
                    rtp_timestamp: be32(body, 12),
                    packet_count: be32(body, 16),
                    octet_count: be32(body, 20),
                },
                reports: ReportBlocks {
                    data: &body[4 + SENDER_INFO_LEN..end],
                },
            }
        }
        RTCP_RR => {
            let end = 4 + REPORT_BLOCK_LEN * count;
            if body.len() < end {
                return Err(RtcpError::ReportsPastEnd);
            }
            RtcpPacket::ReceiverReport {
                ssrc: be32(body, 0),
                reports: ReportBlocks { data: &body[4..end] },
            }
        }
        RTCP_SDES => {
            let data = check_sdes(body, count)?;
            RtcpPacket::Sdes(SdesChunks {
                data,
                chunks_left: count,
                ssrc: None,
            })
        }
        RTCP_BYE => {
            let ssrcs = body.get(..4 * count).ok_or(RtcpError::ByePastEnd)?;
            let reason = match body.get(4 * count) {
                None => None,
                Some(&n) => {
                    let start = 4 * count + 1;
                    Some(
                        body.get(start..start + usize::from(n))
                            .ok_or(RtcpError::ByePastEnd)?,
                    )
                }
            };
            RtcpPacket::Bye { ssrcs, reason }
        }
        RTCP_APP => {
            let [s0, s1, s2, s3, n0, n1, n2, n3, ref data @ ..] = *body else {
                return Err(RtcpError::AppTooShort);
            };
            RtcpPacket::App {
                subtype: b0 & 0x1f,
                ssrc: u32::from_be_bytes([s0, s1, s2, s3]),
                name: [n0, n1, n2, n3],
                data,
            }
        }
        other => RtcpPacket::Other { packet_type: other },
    };
    Ok((parsed, len))
}

/// Checks that `body` holds `count` well-formed SDES chunks and returns the part they use.
///
/// Each chunk is an SSRC, items of (type, length, value), and at least one null octet
/// padding the chunk to a 32-bit boundary.
fn check_sdes(body: &[u8], count: usize) -> Result<&[u8], RtcpError> {
    let mut pos = 0;
    for _ in 0..count {
        if body.len() < pos + 4 {
            return Err(RtcpError::SdesPastEnd);
        }
        pos += 4;
        loop {
            match body.get(pos) {
                None => return Err(RtcpError::SdesPastEnd),
                Some(0) => {
                    pos = round_up4(pos + 1);
                    if pos > body.len() {
                        return Err(RtcpError::SdesPastEnd);
                    }
                    break;
                }
                Some(_) => {
                    let &len = body.get(pos + 1).ok_or(RtcpError::SdesPastEnd)?;
                    pos += 2 + usize::from(len);
                }
            }
        }
    }
    Ok(&body[..pos])
}

/// Round-trip time from a report block (RFC 3550 section 6.4.1): `arrival - LSR - DLSR`,
/// all in 1/65536-second units, where `arrival_ntp_middle32` is the middle 32 bits of the
/// NTP time at which the report arrived. `None` if the block carries no SR reference
/// (`lsr == 0`) or the result would be negative (clock or report inconsistency).
pub fn rtt_ns(arrival_ntp_middle32: u32, lsr: u32, dlsr: u32) -> Option<u64> {
    if lsr == 0 {
        return None;
    }
    // Wrapping subtraction copes with the 18-hour wrap of the 16.16 clock.
    let since_sr = arrival_ntp_middle32.wrapping_sub(lsr);
    let rtt = since_sr.checked_sub(dlsr)?;
    if rtt > i32::MAX as u32 {
        // More than 9 hours: the arrival time is before the SR, i.e. negative.
        return None;
    }
    Some(ntp_short_to_ns(rtt))
}

/// A serializable snapshot of [`ReceptionStats`] for the CLI, JSON output and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ReceptionSnapshot {
    /// Packets expected (highest minus lowest sequence number plus one).
    pub expected: u64,
    /// Packets received, duplicates included.
    pub received: u64,
    /// Expected minus received; negative when duplicates outnumber losses.
    pub lost: i64,
    /// Fraction lost in the last completed report interval, out of 256.
    pub fraction_lost: u8,
    /// Interarrival jitter in RTP timestamp units.
    pub jitter: u32,
    /// Interarrival jitter in nanoseconds.
    pub jitter_ns: u64,
}

/// Receiver-side statistics of one source (RFC 3550 appendix A.1, A.3, A.8): packets
/// expected and received, cumulative and interval loss, and interarrival jitter.
///
/// Sans-IO: the caller passes each packet's extended sequence number (e.g. from
/// [`crate::wire::seq::SeqExtender`]), RTP timestamp and arrival time in nanoseconds.
#[derive(Debug, Clone)]
pub struct ReceptionStats {
    clock_rate: u32,
    /// Lowest and highest extended sequence numbers seen.
    base_seq: u64,
    max_seq: u64,
    /// Extended sequence value at which cycle 0 of the report's `highest_seq` begins.
    cycle_base: u64,
    received: u64,
    expected_prior: u64,
    received_prior: u64,
    /// Interarrival jitter in timestamp units (kept as a float; the RFC's integer version
    /// scales by 16 for the same purpose).
    jitter: f64,
    /// Arrival time and RTP timestamp of the previous packet.
    last: Option<(u64, u32)>,
    /// Fraction lost computed by the last [`ReceptionStats::report_block`].
    last_fraction_lost: u8,
}

impl ReceptionStats {
    /// Statistics for a source whose RTP clock runs at `clock_rate` Hz.
    pub fn new(clock_rate: u32) -> Self {
        Self {
            clock_rate: clock_rate.max(1),
            base_seq: 0,
            max_seq: 0,
            cycle_base: 0,
            received: 0,
            expected_prior: 0,
            received_prior: 0,
            jitter: 0.0,
            last: None,
            last_fraction_lost: 0,
        }
    }

    /// Records one received packet (duplicates and late packets included, as RFC 3550
    /// counts them).
    pub fn on_packet(&mut self, ext_seq: u64, rtp_timestamp: u32, arrival_ns: u64) {
        if self.received == 0 {
            self.base_seq = ext_seq;
            self.max_seq = ext_seq;
            self.cycle_base = ext_seq & !0xFFFF;
        } else {
            self.base_seq = self.base_seq.min(ext_seq);
            self.max_seq = self.max_seq.max(ext_seq);
        }
        self.received = self.received.saturating_add(1);

        if let Some((last_arrival, last_ts)) = self.last {
            // D(i-1, i) = (R_i - R_{i-1}) - (S_i - S_{i-1}), in timestamp units.
            let arrival_delta_ns = arrival_ns as f64 - last_arrival as f64;
            let arrival_delta = arrival_delta_ns * f64::from(self.clock_rate) / NS_PER_S as f64;
            let ts_delta = f64::from(rtp_timestamp.wrapping_sub(last_ts) as i32);
            let d = (arrival_delta - ts_delta).abs();
            self.jitter += (d - self.jitter) / 16.0;
        }
        self.last = Some((arrival_ns, rtp_timestamp));
    }

    /// Packets expected so far: highest minus lowest sequence number plus one.
    pub fn expected(&self) -> u64 {
        if self.received == 0 {
            0
        } else {
            (self.max_seq - self.base_seq).saturating_add(1)
        }
    }

    /// Packets received so far, duplicates included.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Packets lost so far: expected minus received (negative with duplicates).
    pub fn lost(&self) -> i64 {
        let lost = i128::from(self.expected()) - i128::from(self.received);
        lost.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
    }

    /// Interarrival jitter in RTP timestamp units, as a report block carries it.
    pub fn jitter(&self) -> u32 {
        self.jitter.round().min(f64::from(u32::MAX)) as u32
    }

    /// Interarrival jitter in nanoseconds.
    pub fn jitter_ns(&self) -> u64 {
        (self.jitter * NS_PER_S as f64 / f64::from(self.clock_rate)).round() as u64
    }

    /// The current counters, for display and tests.
    pub fn snapshot(&self) -> ReceptionSnapshot {
        ReceptionSnapshot {
            expected: self.expected(),
            received: self.received,
            lost: self.lost(),
            fraction_lost: self.last_fraction_lost,
            jitter: self.jitter(),
            jitter_ns: self.jitter_ns(),
        }
    }

    /// The report block for this source, and the start of a new reporting interval.
    ///
    /// `lsr` and `dlsr` come from the caller's record of the last SR received from the
    /// source (0 and 0 if none).
    pub fn report_block(&mut self, ssrc: u32, lsr: u32, dlsr: u32) -> ReportBlock {
        let expected = self.expected();
        let expected_interval = expected.saturating_sub(self.expected_prior);
        let received_interval = self.received.saturating_sub(self.received_prior);
        self.expected_prior = expected;
        self.received_prior = self.received;
        let fraction_lost = if expected_interval == 0 || received_interval >= expected_interval {
            0
        } else {
            let lost_interval = u128::from(expected_interval - received_interval);
            ((lost_interval << 8) / u128::from(expected_interval)).min(255) as u8
        };
        self.last_fraction_lost = fraction_lost;
        ReportBlock {
            ssrc,
            fraction_lost,
            cumulative_lost: self.lost().clamp(-0x80_0000, 0x7F_FFFF) as i32,
            highest_seq: self.max_seq.saturating_sub(self.cycle_base) as u32,
            jitter: self.jitter(),
            lsr,
            dlsr,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(n: u32) -> ReportBlock {
        ReportBlock {
            ssrc: 0x1000 + n,
            fraction_lost: n as u8,
            cumulative_lost: -(n as i32) * 1000,
            highest_seq: 70_000 + n,
            jitter: 7 * n,
            lsr: 0xABCD_0000 + n,
            dlsr: 0x0001_8000 + n,
        }
    }

    #[test]
    fn ntp_conversions() {
        // 1970-01-01 is NTP second 2208988800; half a second is fraction 2^31.
        let t = NtpTime::from_unix_ns(500_000_000);
        assert_eq!(t.0, (2_208_988_800u64 << 32) | (1 << 31));
        assert_eq!(t.middle32(), ((2_208_988_800u64 & 0xFFFF) << 16) as u32 | 0x8000);
        for ns in [
            0,
            1,
            999_999_999,
            1_700_000_000_123_456_789,
            4_000_000_000 * NS_PER_S,
        ] {
            let back = NtpTime::from_unix_ns(ns).to_unix_ns();
            assert!(back.abs_diff(ns) <= 1, "{ns} -> {back}");
        }
        assert_eq!(ns_to_ntp_short(1_500_000_000), 0x0001_8000);
        assert_eq!(ntp_short_to_ns(0x0001_8000), 1_500_000_000);
        assert_eq!(ns_to_ntp_short(u64::MAX), u32::MAX);
    }

    #[test]
    fn sender_report_round_trips_with_rfc_layout() {
        let info = SenderInfo {
            ntp: NtpTime(0x0102_0304_0506_0708),
            rtp_timestamp: 0x1111_2222,
            packet_count: 5,
            octet_count: 960,
        };
        let reports = [block(1), block(2)];
        let mut out = [0u8; 128];
        let n = write_sender_report(0xCAFE, &info, &reports, &mut out).expect("fits");
        assert_eq!(n, 28 + 48);
        // V=2, RC=2, PT=200, length = 76/4 - 1 = 18.
        assert_eq!(out[..4], [0x82, 200, 0, 18]);
        assert_eq!(out[8..16], [1, 2, 3, 4, 5, 6, 7, 8]);
        // Cumulative lost -1000 as 24-bit two's complement: 0xFFFC18.
        assert_eq!(out[28 + 5..28 + 8], [0xFF, 0xFC, 0x18]);
        let mut it = parse_rtcp(&out[..n]);
        match it.next() {
            Some(Ok(RtcpPacket::SenderReport {
                ssrc,
                info: got,
                reports: blocks,
            })) => {
                assert_eq!(ssrc, 0xCAFE);
                assert_eq!(got, info);
                assert_eq!(blocks.len(), 2);
                assert!(blocks.eq(reports.iter().copied()));
            }
            other => panic!("{other:?}"),
        }
        assert!(it.next().is_none());
    }

    #[test]
    fn compound_rr_sdes_bye_round_trips() {
        let mut out = [0u8; 1024];
        let mut n = write_receiver_report(7, &[block(3)], &mut out).expect("fits");
        n += write_sdes(7, "alice@seattle", Some("Alice ♪"), &mut out[n..]).expect("fits");
        n += write_bye(7, Some("set over"), &mut out[n..]).expect("fits");
        n += write_receiver_report(8, &[], &mut out[n..]).expect("fits");
        assert_eq!(n % 4, 0);
        let packets: Vec<_> = parse_rtcp(&out[..n]).collect();
        assert_eq!(packets.len(), 4);
        match &packets[0] {
            Ok(RtcpPacket::ReceiverReport { ssrc: 7, reports }) => {
                assert_eq!(reports.clone().collect::<Vec<_>>(), vec![block(3)]);
            }
            other => panic!("{other:?}"),
        }
        match &packets[1] {
            Ok(RtcpPacket::Sdes(chunks)) => {
                let items: Vec<_> = chunks.clone().collect();
                assert_eq!(items.len(), 2);
                assert_eq!(items[0].ssrc, 7);
                assert_eq!(items[0].item_type, SDES_CNAME);
                assert_eq!(items[0].as_str(), Some("alice@seattle"));
                assert_eq!(items[1].item_type, SDES_NAME);
                assert_eq!(items[1].as_str(), Some("Alice ♪"));
            }
            other => panic!("{other:?}"),
        }
        match &packets[2] {
            Ok(RtcpPacket::Bye { ssrcs, reason }) => {
                assert_eq!(*ssrcs, &[0, 0, 0, 7]);
                assert_eq!(*reason, Some(&b"set over"[..]));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            packets[3],
            Ok(RtcpPacket::ReceiverReport { ssrc: 8, .. })
        ));
    }

    #[test]
    fn sdes_and_bye_lengths_and_padding() {
        let mut out = [0u8; 600];
        // "ab": 8 + 2 + 2 + 1 null = 13 -> 16.
        let n = write_sdes(1, "ab", None, &mut out).expect("fits");
        assert_eq!(n, 16);
        assert_eq!(
            out[..n],
            [0x81, 202, 0, 3, 0, 0, 0, 1, 1, 2, b'a', b'b', 0, 0, 0, 0]
        );
        // "abcd" -> 8 + 6 + 1 = 15 -> 16 (exactly one null).
        let n = write_sdes(1, "abcd", None, &mut out).expect("fits");
        assert_eq!(n, 16);
        assert_eq!(out[15], 0);
        // Items are truncated to 255 bytes at a char boundary: 'é' is 2 bytes.
        let long = "é".repeat(200);
        let n = write_sdes(1, &long, None, &mut out).expect("fits");
        match parse_rtcp(&out[..n]).next() {
            Some(Ok(RtcpPacket::Sdes(mut c))) => {
                let item = c.next().expect("item");
                assert_eq!(item.value.len(), 254);
                assert_eq!(item.as_str(), Some("é".repeat(127).as_str()));
                assert!(c.next().is_none());
            }
            other => panic!("{other:?}"),
        }
        let n = write_bye(9, None, &mut out).expect("fits");
        assert_eq!(out[..n], [0x81, 203, 0, 1, 0, 0, 0, 9]);
        let n = write_bye(9, Some("bye"), &mut out).expect("fits");
        assert_eq!(out[..n], [0x81, 203, 0, 2, 0, 0, 0, 9, 3, b'b', b'y', b'e']);
    }

    #[test]
    fn multi_chunk_sdes_from_another_implementation_parses() {
        // Two chunks: SSRC 1 with CNAME "x" and one null octet; SSRC 2 with CNAME
        // "abcdef", an empty NAME and two null octets. Then an APP packet.
        let pkt = [
            0x82, 202, 0, 6, //
            0, 0, 0, 1, 1, 1, b'x', 0, //
            0, 0, 0, 2, 1, 6, b'a', b'b', b'c', b'd', b'e', b'f', 2, 0, 0, 0, //
            0x85, 204, 0, 3, 0, 0, 0, 3, b'N', b'J', b'A', b'M', 1, 2, 3, 4,
        ];
        let mut it = parse_rtcp(&pkt);
        let Some(Ok(RtcpPacket::Sdes(chunks))) = it.next() else {
            panic!("sdes")
        };
        let items: Vec<_> = chunks.map(|i| (i.ssrc, i.item_type, i.value.to_vec())).collect();
        assert_eq!(
            items,
            vec![(1, 1, b"x".to_vec()), (2, 1, b"abcdef".to_vec()), (2, 2, vec![])]
        );
        match it.next() {
            Some(Ok(RtcpPacket::App {
                subtype: 5,
                ssrc: 3,
                name,
                data,
            })) => {
                assert_eq!(&name, b"NJAM");
                assert_eq!(data, &[1, 2, 3, 4]);
            }
            other => panic!("{other:?}"),
        }
        assert!(it.next().is_none());
    }

    #[test]
    fn writers_check_buffer_and_report_count() {
        let mut out = [0u8; 40];
        assert_eq!(
            write_receiver_report(1, &[block(1), block(2)], &mut out),
            Err(RtcpError::BufferTooSmall { need: 56, have: 40 })
        );
        // 8 + 2 + 29 + 1 = 40 fits exactly; one byte more needs a whole extra word.
        assert_eq!(write_sdes(1, &"c".repeat(29), None, &mut out), Ok(40));
        assert_eq!(
            write_sdes(1, &"c".repeat(30), None, &mut out),
            Err(RtcpError::BufferTooSmall { need: 44, have: 40 })
        );
        let many = [block(0); 32];
        let mut big = [0u8; 2048];
        assert_eq!(
            write_receiver_report(1, &many, &mut big),
            Err(RtcpError::TooManyReports { count: 32 })
        );
        assert_eq!(
            write_sender_report(1, &SenderInfo::default(), &many[..31], &mut big),
            Ok(28 + 31 * 24)
        );
        assert_eq!(
            write_bye(1, Some("x"), &mut out[..11]),
            Err(RtcpError::BufferTooSmall { need: 12, have: 11 })
        );
    }

    #[test]
    fn cumulative_lost_is_clamped_to_24_bits() {
        let mut out = [0u8; 64];
        for (lost, wire) in [
            (i32::MAX, 0x7F_FFFF),
            (i32::MIN, -0x80_0000),
            (-1, -1),
            (0x7F_FFFF, 0x7F_FFFF),
        ] {
            let b = ReportBlock {
                cumulative_lost: lost,
                ..block(0)
            };
            let n = write_receiver_report(1, &[b], &mut out).expect("fits");
            let Some(Ok(RtcpPacket::ReceiverReport { mut reports, .. })) = parse_rtcp(&out[..n]).next()
            else {
                panic!("rr")
            };
            assert_eq!(reports.next().map(|r| r.cumulative_lost), Some(wire));
        }
    }

    #[test]
    fn hostile_rtcp_is_typed_errors_and_stops_the_walk() {
        let first_err = |b: &[u8]| parse_rtcp(b).find_map(|r| r.err());
        assert_eq!(first_err(&[0x80, 201]), Some(RtcpError::TooShort { len: 2 }));
        assert_eq!(
            first_err(&[0x40, 201, 0, 1, 0, 0, 0, 0]),
            Some(RtcpError::BadVersion(1))
        );
        assert_eq!(
            first_err(&[0x80, 201, 0xFF, 0xFF, 0, 0, 0, 0]),
            Some(RtcpError::LengthPastEnd {
                need: 65536 * 4,
                have: 8
            })
        );
        // RR claiming 31 blocks in 8 bytes.
        assert_eq!(
            first_err(&[0x9F, 201, 0, 1, 0, 0, 0, 0]),
            Some(RtcpError::ReportsPastEnd)
        );
        // SR with no room for sender info.
        assert_eq!(
            first_err(&[0x80, 200, 0, 1, 0, 0, 0, 0]),
            Some(RtcpError::ReportsPastEnd)
        );
        // Padding: zero count, count past the packet.
        assert_eq!(
            first_err(&[0xA0, 201, 0, 1, 0, 0, 0, 0]),
            Some(RtcpError::BadPadding)
        );
        assert_eq!(
            first_err(&[0xA0, 201, 0, 1, 0, 0, 0, 9]),
            Some(RtcpError::BadPadding)
        );
        // SDES: item length past the chunk; missing null terminator; chunk count too high.
        assert_eq!(
            first_err(&[0x81, 202, 0, 2, 0, 0, 0, 1, 1, 9, b'a', b'b']),
            Some(RtcpError::SdesPastEnd)
        );
        assert_eq!(
            first_err(&[0x81, 202, 0, 2, 0, 0, 0, 1, 1, 2, b'a', b'b']),
            Some(RtcpError::SdesPastEnd)
        );
        assert_eq!(
            first_err(&[0x82, 202, 0, 2, 0, 0, 0, 1, 1, 1, b'a', 0]),
            Some(RtcpError::SdesPastEnd)
        );
        // BYE: more sources than bytes; reason length past the end.
        assert_eq!(
            first_err(&[0x82, 203, 0, 1, 0, 0, 0, 1]),
            Some(RtcpError::ByePastEnd)
        );
        assert_eq!(
            first_err(&[0x81, 203, 0, 2, 0, 0, 0, 1, 4, b'a', b'b', b'c']),
            Some(RtcpError::ByePastEnd)
        );
        // APP without a name.
        assert_eq!(
            first_err(&[0x80, 204, 0, 1, 0, 0, 0, 1]),
            Some(RtcpError::AppTooShort)
        );
        // A valid RR followed by garbage: one packet, then one error, then nothing.
        let mut buf = [0u8; 16];
        let n = write_receiver_report(5, &[], &mut buf).expect("fits");
        buf[n..n + 4].copy_from_slice(&[0xFF, 0xFF, 0xFF, 0xFF]);
        let mut it = parse_rtcp(&buf[..n + 4]);
        assert!(matches!(it.next(), Some(Ok(_))));
        assert_eq!(it.next().and_then(|r| r.err()), Some(RtcpError::BadVersion(3)));
        assert!(it.next().is_none());
        // Unknown packet types are skipped whole.
        let pkt = [0x80, 206, 0, 2, 1, 2, 3, 4, 5, 6, 7, 8];
        assert!(matches!(
            parse_rtcp(&pkt).next(),
            Some(Ok(RtcpPacket::Other { packet_type: 206 }))
        ));
    }

    #[test]
    fn every_truncation_of_a_compound_packet_is_handled() {
        let mut out = [0u8; 256];
        let mut n = write_sender_report(1, &SenderInfo::default(), &[block(1)], &mut out).expect("fits");
        n += write_sdes(1, "cname", Some("name"), &mut out[n..]).expect("fits");
        n += write_bye(1, Some("bye"), &mut out[n..]).expect("fits");
        for len in 0..=n {
            let mut packets = 0;
            let mut errors = 0;
            for r in parse_rtcp(&out[..len]) {
                match r {
                    Ok(RtcpPacket::Sdes(c)) => packets += 1 + c.count(),
                    Ok(_) => packets += 1,
                    Err(_) => errors += 1,
                }
            }
            assert!(errors <= 1);
            if len == n {
                assert_eq!((packets, errors), (1 + 3 + 1, 0));
            }
        }
    }

    #[test]
    fn rtt_from_lsr_and_dlsr() {
        // RFC 3550 figure 2: A = 0xb710_8000 (46864.500 s), LSR = 0xb705_2000
        // (46853.125 s), DLSR = 0x0005_4000 (5.250 s) -> RTT = 6.125 s.
        assert_eq!(rtt_ns(0xb710_8000, 0xb705_2000, 0x0005_4000), Some(6_125_000_000));
        assert_eq!(rtt_ns(0xb710_8000, 0, 0x0005_4000), None);
        // Report claims more delay than has elapsed: negative.
        assert_eq!(rtt_ns(0xb710_8000, 0xb710_0000, 0x0001_0000), None);
        // Across the wrap of the 16.16 clock.
        assert_eq!(
            rtt_ns(0x0000_1000, 0xFFFF_F000, 0x0000_1000),
            Some(ntp_short_to_ns(0x1000))
        );
    }

    #[test]
    fn reception_stats_count_loss_duplicates_and_intervals() {
        let mut s = ReceptionStats::new(48_000);
        assert_eq!((s.expected(), s.lost()), (0, 0));
        let ns_per_packet = 1_000_000; // 48 frames
                                       // Sequence numbers 65536..=65545 with 65539 and 65540 lost.
        for i in 0..10u64 {
            if i == 3 || i == 4 {
                continue;
            }
            s.on_packet(65_536 + i, 48 * i as u32, i * ns_per_packet);
        }
        assert_eq!(s.expected(), 10);
        assert_eq!(s.received(), 8);
        assert_eq!(s.lost(), 2);
        let b = s.report_block(42, 0, 0);
        // Fraction: 2 lost of 10 expected = 0.2 * 256 = 51.2 -> 51.
        assert_eq!(b.fraction_lost, 51);
        let snap = s.snapshot();
        assert_eq!((snap.expected, snap.received, snap.lost), (10, 8, 2));
        assert_eq!(snap.fraction_lost, 51);
        let json = serde_json::to_string(&snap).expect("serialize");
        assert!(json.contains("\"fraction_lost\":51"), "{json}");
        assert_eq!(b.cumulative_lost, 2);
        // First packet 65536 is cycle 0 seq 0, highest 65545 -> 9.
        assert_eq!(b.highest_seq, 9);
        assert_eq!(b.jitter, 0);
        // Next interval: 5 packets expected (65546..=65550), one of them duplicated and one
        // arriving late from the previous interval: 7 received, none lost this interval.
        for i in 10..15u64 {
            s.on_packet(65_536 + i, 48 * i as u32, i * ns_per_packet);
        }
        s.on_packet(65_536 + 12, 48 * 12, 15 * ns_per_packet);
        s.on_packet(65_536 + 3, 48 * 3, 16 * ns_per_packet);
        let b = s.report_block(42, 0, 0);
        assert_eq!(b.fraction_lost, 0);
        assert_eq!(b.cumulative_lost, 0);
        assert_eq!(b.highest_seq, 14);
        // Third interval: nothing arrives: expected 0 -> fraction 0.
        assert_eq!(s.report_block(42, 0, 0).fraction_lost, 0);
        // Reordering below the first packet widens what is expected.
        s.on_packet(65_535, 0, 17 * ns_per_packet);
        assert_eq!(s.expected(), 16);
    }

    #[test]
    fn jitter_follows_the_rfc_3550_estimator() {
        // Clock 8000 Hz (1 unit = 125 us); packets 160 units (20 ms) apart in media time.
        // Arrivals at 0, 20, 45, 60, 80 ms:
        //   D(0,1) = 160 - 160 = 0      J = 0
        //   D(1,2) = 200 - 160 = 40     J = 0 + (40 - 0)/16 = 2.5
        //   D(2,3) = 120 - 160 = -40    J = 2.5 + (40 - 2.5)/16 = 4.84375
        //   D(3,4) = 160 - 160 = 0      J = 4.84375 - 4.84375/16 = 4.541015625
        // Reported as round(4.54) = 5 units; in ns 4.541015625 * 125000 = 567626.953 -> 567627.
        let mut s = ReceptionStats::new(8000);
        for (i, ms) in [0u64, 20, 45, 60, 80].into_iter().enumerate() {
            s.on_packet(i as u64, 1000 + 160 * i as u32, ms * 1_000_000);
        }
        assert_eq!(s.jitter(), 5);
        assert_eq!(s.jitter_ns(), 567_627);
        assert_eq!(s.report_block(1, 0, 0).jitter, 5);

        // RTP timestamps wrapping mid-stream do not disturb the estimate.
        let mut s = ReceptionStats::new(48_000);
        let start = u32::MAX - 100;
        for i in 0..100u32 {
            s.on_packet(u64::from(i), start.wrapping_add(48 * i), u64::from(i) * 1_000_000);
        }
        assert_eq!(s.jitter(), 0);
    }

    #[test]
    fn reception_stats_survive_extreme_inputs() {
        let mut s = ReceptionStats::new(0);
        s.on_packet(u64::MAX, u32::MAX, u64::MAX);
        s.on_packet(0, 0, 0);
        s.on_packet(u64::MAX / 2, 7, 3);
        let _ = s.expected();
        let _ = s.lost();
        let _ = s.jitter_ns();
        let b = s.report_block(0, 1, 2);
        assert!(b.cumulative_lost <= 0x7F_FFFF);
    }
}
