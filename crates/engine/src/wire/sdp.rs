//! Session descriptions (SDP, RFC 8866 / RFC 4566) for one audio stream.
//!
//! [`write_sdp`] produces a description that GStreamer (`sdpdemux`, `filesrc ! sdpdemux`)
//! and ffmpeg (`ffplay -protocol_whitelist file,udp,rtp stream.sdp`) can open to listen to
//! a netjam L16 or L24 stream; [`parse_sdp`] reads the first audio stream of a description
//! written by netjam or another tool. Only the subset netjam needs is understood: one
//! audio stream, its address, port, payload type, `a=rtpmap` and `a=ptime`.
//!
//! This runs at setup time, not on the audio path, so it may allocate; it must still
//! never panic on any text.

use std::fmt::Write as _;
use std::net::IpAddr;

use crate::wire::payload::{AudioFormat, Codec, FormatError};

/// One audio stream as an SDP describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SdpStream {
    pub format: AudioFormat,
    /// RTP payload type the stream uses (usually [`AudioFormat::payload_type`]).
    pub payload_type: u8,
    /// Where the stream is sent (unicast receiver or multicast group).
    pub address: IpAddr,
    pub port: u16,
    /// Frames per packet, announced as `a=ptime` in milliseconds.
    pub frames_per_packet: Option<u32>,
}

/// Why a text is not an SDP netjam can use.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum SdpError {
    #[error("the SDP has no audio stream (no \"m=audio\" line)")]
    NoAudio,
    #[error("bad SDP media line {0:?}: expected \"m=audio <port> RTP/AVP <payload type>\" (SRTP is not supported)")]
    BadMediaLine(String),
    #[error("the SDP's audio stream has no connection address (\"c=IN IP4 <address>\")")]
    NoConnection,
    #[error("bad SDP connection line {0:?}: expected \"c=IN IP4 <address>\" or \"c=IN IP6 <address>\"")]
    BadConnection(String),
    #[error(
        "the SDP has no \"a=rtpmap:{0} ...\" line and {0} is not a static payload type netjam knows (10, 11)"
    )]
    NoRtpmap(u8),
    #[error("bad SDP rtpmap line {0:?}: expected \"a=rtpmap:<pt> <encoding>/<rate>[/<channels>]\"")]
    BadRtpmap(String),
    #[error("the SDP's audio stream uses codec {0:?}: netjam supports L16, L24, opus and X-NJ-F32 (its own 32-bit float)")]
    UnsupportedCodec(String),
    #[error("bad SDP ptime line {0:?}: expected \"a=ptime:<milliseconds>\"")]
    BadPtime(String),
    #[error("the SDP's audio format is not supported: {0}")]
    Format(#[from] FormatError),
}

/// Removes characters that would break the line structure of an SDP.
fn one_line(text: &str) -> String {
    text.chars().filter(|c| !c.is_control()).collect()
}

/// `frames` at `rate` as milliseconds with up to three decimals and no trailing zeros.
fn ptime_text(frames: u32, rate: u32) -> String {
    let micros = (u64::from(frames) * 1_000_000 + u64::from(rate) / 2) / u64::from(rate.max(1));
    let whole = micros / 1000;
    let frac = micros % 1000;
    if frac == 0 {
        whole.to_string()
    } else {
        let s = format!("{whole}.{frac:03}");
        s.trim_end_matches('0').to_string()
    }
}

/// Writes an SDP describing `s` to a receiver. Lines end in CRLF as RFC 8866 asks.
///
/// An IPv4 multicast address gets a TTL of 32 on its `c=` line, as the RFC requires.
pub fn write_sdp(s: &SdpStream, session_name: &str) -> String {
    let (family, addr) = match s.address {
        IpAddr::V4(a) if a.is_multicast() => ("IP4", format!("{a}/32")),
        IpAddr::V4(a) => ("IP4", a.to_string()),
        IpAddr::V6(a) => ("IP6", a.to_string()),
    };
    let origin = match s.address {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => a.to_string(),
    };
    let mut name = one_line(session_name);
    if name.trim().is_empty() {
        name = "netjam".to_string();
    }
    let pt = s.payload_type;
    let f = &s.format;
    let mut out = String::with_capacity(256);
    // Writing to a String cannot fail.
    let _ = write!(
        out,
        "v=0\r\n\
         o=- 0 0 IN {family} {origin}\r\n\
         s={name}\r\n\
         c=IN {family} {addr}\r\n\
         t=0 0\r\n\
         m=audio {port} RTP/AVP {pt}\r\n\
         a=rtpmap:{pt} {codec}/{rate}/{channels}\r\n",
        port = s.port,
        codec = f.codec.sdp_name(),
        rate = f.rate,
        // RFC 7587: Opus is always announced as two channels; fmtp says if it is stereo.
        channels = if f.codec == Codec::Opus { 2 } else { f.channels },
    );
    if f.codec == Codec::Opus {
        let stereo = u8::from(f.channels == 2);
        let _ = write!(out, "a=fmtp:{pt} stereo={stereo}; sprop-stereo={stereo}\r\n");
    }
    if let Some(frames) = s.frames_per_packet {
        let _ = write!(out, "a=ptime:{}\r\n", ptime_text(frames, f.rate));
    }
    out.push_str("a=recvonly\r\n");
    out
}

fn parse_connection(value: &str) -> Result<IpAddr, SdpError> {
    let bad = || SdpError::BadConnection(value.chars().take(80).collect());
    let mut parts = value.split_whitespace();
    let (Some("IN"), Some(family), Some(addr)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad());
    };
    // Strip a multicast TTL and/or address count ("224.2.1.1/127/3").
    let addr = addr.split('/').next().unwrap_or(addr);
    let ip: IpAddr = addr.parse().map_err(|_| bad())?;
    match (family, ip) {
        ("IP4", IpAddr::V4(_)) | ("IP6", IpAddr::V6(_)) => Ok(ip),
        _ => Err(bad()),
    }
}

/// Parses `<pt> <encoding>/<rate>[/<channels>]` for payload type `pt`; `None` if the
/// line is for another payload type.
fn parse_rtpmap(value: &str, pt: u8) -> Option<Result<AudioFormat, SdpError>> {
    let bad = || SdpError::BadRtpmap(value.chars().take(80).collect());
    let (pt_text, rest) = value.trim().split_once(char::is_whitespace)?;
    if pt_text.parse::<u8>().ok()? != pt {
        return None;
    }
    let mut fields = rest.trim().split('/');
    let name = fields.next().unwrap_or("");
    let Some(rate) = fields.next().and_then(|r| r.trim().parse::<u32>().ok()) else {
        return Some(Err(bad()));
    };
    let channels = match fields.next() {
        None => 1,
        Some(c) => match c.trim().parse::<u16>() {
            Ok(c) => c,
            Err(_) => return Some(Err(bad())),
        },
    };
    let Some(codec) = Codec::from_sdp_name(name.trim()) else {
        return Some(Err(SdpError::UnsupportedCodec(name.chars().take(40).collect())));
    };
    Some(AudioFormat::new(codec, rate, channels).map_err(SdpError::from))
}

/// Frames in `ptime` milliseconds at `rate`, rounded; `None` if not a positive number.
fn ptime_frames(ptime: &str, rate: u32) -> Option<u32> {
    let ms: f64 = ptime.trim().parse().ok()?;
    if !(ms.is_finite() && ms > 0.0 && ms <= 10_000.0) {
        return None;
    }
    let frames = (ms * f64::from(rate) / 1000.0).round();
    (frames >= 1.0).then_some(frames as u32)
}

/// Reads the first audio stream of an SDP: its address, port, first payload type, that
/// payload type's `a=rtpmap` (or RFC 3551's static L16 types 10 and 11), and `a=ptime`.
pub fn parse_sdp(text: &str) -> Result<SdpStream, SdpError> {
    let mut session_addr = None;
    let mut session_ptime = None;
    // Filled in once the first m=audio line is found.
    let mut media: Option<(u16, u8)> = None;
    let mut media_addr = None;
    let mut rtpmap = None;
    let mut ptime = None;
    let mut fmtp: Option<&str> = None;

    // Lines before any m= line are session-level; lines in media sections other than
    // ours are skipped.
    let mut in_other_media = false;
    for line in text.lines() {
        let line = line.trim_end_matches('\r');
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if key == "m" {
            if media.is_some() {
                break; // the next stream begins: done with ours
            }
            if !value.starts_with("audio ") {
                in_other_media = true;
                continue;
            }
            in_other_media = false;
            let bad = || SdpError::BadMediaLine(line.chars().take(80).collect());
            let mut parts = value.split_whitespace().skip(1);
            let port = parts
                .next()
                .and_then(|p| p.split('/').next())
                .and_then(|p| p.parse::<u16>().ok())
                .ok_or_else(bad)?;
            // Plain RTP only: netjam does not do SRTP (RTP/SAVP) or DTLS.
            let proto = parts.next().ok_or_else(bad)?;
            if proto != "RTP/AVP" && proto != "RTP/AVPF" {
                return Err(bad());
            }
            let pt = parts
                .next()
                .and_then(|p| p.parse::<u8>().ok())
                .filter(|&p| p <= 127)
                .ok_or_else(bad)?;
            media = Some((port, pt));
            continue;
        }
        if in_other_media {
            continue;
        }
        let in_media = media.is_some();
        match key {
            "c" => {
                let addr = parse_connection(value)?;
                if in_media {
                    media_addr = Some(addr);
                } else {
                    session_addr = Some(addr);
                }
            }
            "a" => {
                if let Some(v) = value.strip_prefix("ptime:") {
                    if in_media {
                        ptime = Some(v);
                    } else {
                        session_ptime = Some(v);
                    }
                } else if let (Some(v), Some((_, pt))) = (value.strip_prefix("rtpmap:"), media) {
                    if rtpmap.is_none() {
                        rtpmap = parse_rtpmap(v, pt);
                    }
                } else if let (Some(v), Some((_, pt))) = (value.strip_prefix("fmtp:"), media) {
                    if let Some((p, params)) = v.trim().split_once(char::is_whitespace) {
                        if p.parse::<u8>().ok() == Some(pt) {
                            fmtp = Some(params);
                        }
                    }
                }
            }
            _ => {}
        }
    }

    let (port, payload_type) = media.ok_or(SdpError::NoAudio)?;
    let address = media_addr.or(session_addr).ok_or(SdpError::NoConnection)?;
    let format = match rtpmap {
        // RFC 7587: "opus/48000/2" always; the fmtp parameters say whether it is stereo.
        Some(Ok(f)) if f.codec == Codec::Opus => {
            let stereo = fmtp.is_some_and(|params| {
                params.split(';').any(|p| {
                    matches!(p.trim().split_once('='), Some((k, v)) if (k.trim() == "stereo" || k.trim() == "sprop-stereo") && v.trim() == "1")
                })
            });
            AudioFormat::new(Codec::Opus, f.rate, if stereo { 2 } else { 1 })?
        }
        Some(result) => result?,
        None => match payload_type {
            10 => AudioFormat::new(Codec::L16, 44_100, 2)?,
            11 => AudioFormat::new(Codec::L16, 44_100, 1)?,
            other => return Err(SdpError::NoRtpmap(other)),
        },
    };
    let frames_per_packet = match ptime.or(session_ptime) {
        None => None,
        Some(p) => Some(
            ptime_frames(p, format.rate).ok_or_else(|| SdpError::BadPtime(p.chars().take(40).collect()))?,
        ),
    };
    Ok(SdpStream {
        format,
        payload_type,
        address,
        port,
        frames_per_packet,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn stream() -> SdpStream {
        SdpStream {
            format: AudioFormat::new(Codec::L24, 48_000, 2).expect("valid"),
            payload_type: 97,
            address: IpAddr::V4(Ipv4Addr::new(192, 168, 1, 20)),
            port: 5004,
            frames_per_packet: Some(32),
        }
    }

    #[test]
    fn writes_the_lines_players_need() {
        let sdp = write_sdp(&stream(), "Seattle\r\nVermont");
        assert_eq!(
            sdp,
            "v=0\r\n\
             o=- 0 0 IN IP4 192.168.1.20\r\n\
             s=SeattleVermont\r\n\
             c=IN IP4 192.168.1.20\r\n\
             t=0 0\r\n\
             m=audio 5004 RTP/AVP 97\r\n\
             a=rtpmap:97 L24/48000/2\r\n\
             a=ptime:0.667\r\n\
             a=recvonly\r\n"
        );
    }

    #[test]
    fn round_trips_v4_v6_multicast_and_every_codec() {
        let mut s = stream();
        assert_eq!(parse_sdp(&write_sdp(&s, "x")), Ok(s.clone()));
        s.address = IpAddr::V6(Ipv6Addr::LOCALHOST);
        s.format = AudioFormat::new(Codec::F32, 96_000, 8).expect("valid");
        s.payload_type = 98;
        s.frames_per_packet = Some(96);
        let text = write_sdp(&s, "");
        assert!(text.contains("c=IN IP6 ::1\r\n"));
        assert!(text.contains("a=rtpmap:98 X-NJ-F32/96000/8\r\n"));
        assert!(text.contains("a=ptime:1\r\n"));
        assert!(text.contains("s=netjam\r\n"));
        assert_eq!(parse_sdp(&text), Ok(s.clone()));
        s.address = IpAddr::V4(Ipv4Addr::new(239, 1, 2, 3));
        s.format = AudioFormat::new(Codec::L16, 44_100, 1).expect("valid");
        s.payload_type = 11;
        s.frames_per_packet = None;
        let text = write_sdp(&s, "m");
        assert!(text.contains("c=IN IP4 239.1.2.3/32\r\n"));
        assert!(!text.contains("ptime"));
        assert_eq!(parse_sdp(&text), Ok(s));
    }

    #[test]
    fn reads_descriptions_written_by_other_tools() {
        // Media-level connection, static payload type without rtpmap, LF line ends, a
        // video stream before the audio one and a second audio stream after it.
        let text = "v=0\n\
                    o=- 123 456 IN IP4 10.0.0.1\n\
                    s=Concert\n\
                    t=0 0\n\
                    m=video 6000 RTP/AVP 96\n\
                    c=IN IP4 10.0.0.9\n\
                    a=rtpmap:96 H264/90000\n\
                    a=ptime:40\n\
                    m=audio 5006 RTP/AVP 10 96\n\
                    c=IN IP4 10.0.0.2\n\
                    a=ptime:5\n\
                    m=audio 7000 RTP/AVP 0\n";
        let s = parse_sdp(text).expect("valid");
        assert_eq!(s.format, AudioFormat::new(Codec::L16, 44_100, 2).expect("valid"));
        assert_eq!(s.payload_type, 10);
        assert_eq!(s.address, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)));
        assert_eq!(s.port, 5006);
        assert_eq!(s.frames_per_packet, Some(221)); // 5 ms at 44.1 kHz = 220.5 -> 221
                                                    // AES67-style: session-level c with TTL, lowercase encoding, no channel count.
        let text = "v=0\r\ns=a\r\nc=IN IP4 239.69.1.1/32\r\nt=0 0\r\n\
                    m=audio 5004 RTP/AVP 98\r\na=rtpmap:98 l24/48000\r\na=ptime:1\r\n";
        let s = parse_sdp(text).expect("valid");
        assert_eq!(s.format, AudioFormat::new(Codec::L24, 48_000, 1).expect("valid"));
        assert_eq!(s.frames_per_packet, Some(48));
    }

    #[test]
    fn opus_is_announced_as_rfc_7587_says_and_read_back_mono_or_stereo() {
        for channels in [1u16, 2] {
            let mut s = stream();
            s.format = AudioFormat::new(Codec::Opus, 48_000, channels).expect("valid");
            s.payload_type = 100;
            s.frames_per_packet = Some(120);
            let text = write_sdp(&s, "jam");
            assert!(text.contains("a=rtpmap:100 opus/48000/2\r\n"), "{text}");
            let stereo = u8::from(channels == 2);
            assert!(text.contains(&format!("a=fmtp:100 stereo={stereo}; sprop-stereo={stereo}\r\n")));
            assert!(text.contains("a=ptime:2.5\r\n"), "{text}");
            assert_eq!(parse_sdp(&text), Ok(s));
        }
        // As GStreamer writes it: no fmtp for another payload type counts.
        let text = "v=0\r\nc=IN IP4 1.2.3.4\r\nt=0 0\r\nm=audio 5004 RTP/AVP 96\r\n\
                    a=rtpmap:96 OPUS/48000/2\r\na=fmtp:97 stereo=1\r\na=fmtp:96 sprop-stereo=1;foo=bar\r\n";
        assert_eq!(parse_sdp(text).expect("opus").format.channels, 2);
    }

    #[test]
    fn errors_name_what_is_supported() {
        let base = |m: &str, a: &str| format!("v=0\r\nc=IN IP4 1.2.3.4\r\nt=0 0\r\n{m}\r\n{a}\r\n");
        assert_eq!(parse_sdp("v=0\r\n"), Err(SdpError::NoAudio));
        assert_eq!(parse_sdp(""), Err(SdpError::NoAudio));
        let e = parse_sdp(&base("m=audio 5004 RTP/AVP 111", "a=rtpmap:111 G722/8000/1")).expect_err("g722");
        assert_eq!(e, SdpError::UnsupportedCodec("G722".into()));
        assert!(e.to_string().contains("L16, L24"));
        let s = parse_sdp(&base("m=audio 5004 RTP/AVP 96", "a=rtpmap:96 L16/8000/1")).expect("8 kHz");
        assert_eq!(s.format, AudioFormat::new(Codec::L16, 8_000, 1).expect("valid"));
        let e = parse_sdp(&base("m=audio 5004 RTP/AVP 96", "a=rtpmap:96 L16/384000/1")).expect_err("rate");
        assert!(e.to_string().contains("8000 to 192000"), "{e}");
        assert_eq!(
            parse_sdp(&base("m=audio 5004 RTP/AVP 96", "")),
            Err(SdpError::NoRtpmap(96))
        );
        assert!(matches!(
            parse_sdp(&base("m=audio x RTP/AVP 96", "")),
            Err(SdpError::BadMediaLine(_))
        ));
        assert!(matches!(
            parse_sdp(&base("m=audio 5004 udp 96", "")),
            Err(SdpError::BadMediaLine(_))
        ));
        assert!(matches!(
            parse_sdp(&base("m=audio 5004 RTP/SAVP 96", "a=rtpmap:96 L16/48000/2")),
            Err(SdpError::BadMediaLine(_))
        ));
        assert!(matches!(
            parse_sdp(&base("m=audio 5004 RTP/AVP 200", "")),
            Err(SdpError::BadMediaLine(_))
        ));
        assert!(matches!(
            parse_sdp(&base("m=audio 5004 RTP/AVP 96", "a=rtpmap:96 L16")),
            Err(SdpError::BadRtpmap(_))
        ));
        assert!(matches!(
            parse_sdp(&base(
                "m=audio 5004 RTP/AVP 96",
                "a=rtpmap:96 L16/48000/2\r\na=ptime:-1"
            )),
            Err(SdpError::BadPtime(_))
        ));
        assert_eq!(
            parse_sdp("v=0\r\nm=audio 5004 RTP/AVP 10\r\n"),
            Err(SdpError::NoConnection)
        );
        assert!(matches!(
            parse_sdp("c=IN IP4 ::1\r\nm=audio 5004 RTP/AVP 10\r\n"),
            Err(SdpError::BadConnection(_))
        ));
    }
}
