//! The wire format: RTP/RTCP (RFC 3550), linear PCM payloads (RFC 3551 / RFC 3190),
//! redundancy (RFC 2198) and SDP. Parsers borrow from the packet and never allocate;
//! writers fill a caller's buffer.
//!
//! Nothing here does I/O, reads a clock or keeps more state than the counters of
//! [`seq`]; no input, however hostile, may make a parser panic or allocate.

pub mod fuzz;
pub mod payload;
pub mod red;
pub mod rtcp;
pub mod rtp;
pub mod sdp;
pub mod seq;

pub use payload::{decode, encode, AudioFormat, Codec, FormatError, RED_PAYLOAD_TYPE};
pub use red::{parse_red, write_red, RedBlock, RedError, RedPayload, MAX_RED_BLOCKS};
pub use rtcp::{
    parse_rtcp, rtt_ns, write_bye, write_receiver_report, write_sdes, write_sender_report, NtpTime,
    ReceptionSnapshot, ReceptionStats, ReportBlock, RtcpError, RtcpPacket, SenderInfo,
};
pub use rtp::{
    classify, format_extension, parse_format_extension, parse_rtp, write_rtp, PacketKind, RtpError,
    RtpExtension, RtpHeader, RtpPacket, RTP_HEADER_LEN,
};
pub use sdp::{parse_sdp, write_sdp, SdpError, SdpStream};
pub use seq::{SeqExtender, TimestampExtender};
