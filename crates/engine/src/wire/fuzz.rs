//! Fuzzing entry points for the wire parsers.
//!
//! [`parse_any`] feeds one input to every parser in [`crate::wire`] and walks everything
//! they return, checking that what parses also re-encodes to the same thing. The
//! `rtp_rtcp_parse` target of the `fuzz/` crate calls it, and the unit tests below run it
//! over hundreds of thousands of random and mutated packets so the normal test suite
//! exercises the same paths. Any panic reached from here is a bug in the parsers, never a
//! fault of the input. [`seed_packets`] provides valid packets of every kind as a starting
//! corpus.

use crate::wire::payload::{decode, AudioFormat, Codec};
use crate::wire::red::{parse_red, write_red};
use crate::wire::rtcp::{
    parse_rtcp, rtt_ns, write_bye, write_receiver_report, write_sdes, write_sender_report, NtpTime,
    ReceptionStats, ReportBlock, RtcpPacket, SenderInfo,
};
use crate::wire::rtp::{classify, format_extension, parse_format_extension, parse_rtp, write_rtp, RtpHeader};
use crate::wire::sdp::{parse_sdp, write_sdp};
use crate::wire::seq::{SeqExtender, TimestampExtender};

/// Runs every wire parser on `data` and checks parse/write round trips. Never panics
/// unless a parser or writer has a bug.
pub fn parse_any(data: &[u8]) {
    let _ = classify(data);
    if let Ok(packet) = parse_rtp(data) {
        check_rtp(data, &packet);
        check_red(packet.payload);
        let mut samples = [0f32; 64];
        for codec in [Codec::L16, Codec::L24, Codec::F32] {
            let n = decode(codec, packet.payload, &mut samples);
            assert!(n <= samples.len());
            assert!(n <= packet.payload.len() / codec.bytes_per_sample());
        }
    }
    check_red(data);
    check_rtcp(data);
    check_sdp(data);
    check_counters(data);
}

fn check_rtp(data: &[u8], packet: &crate::wire::rtp::RtpPacket<'_>) {
    assert!(packet.payload.len() <= data.len());
    for i in 0..=packet.csrc_count() {
        let _ = packet.csrc(i);
    }
    if let Some(ext) = &packet.extension {
        if let Some(Ok(fmt)) = parse_format_extension(ext) {
            assert!(fmt.validate().is_ok());
            let mut buf = [0u8; 8];
            let again = format_extension(&fmt, &mut buf);
            assert_eq!(parse_format_extension(&again), Some(Ok(fmt)));
        }
    }
    // Writing the parsed header back (without CSRCs and padding, which netjam never
    // sends) and parsing it again gives the same header, extension and payload.
    let mut out = [0u8; 2048];
    if let Ok(n) = write_rtp(&packet.header, packet.extension, packet.payload.len(), &mut out) {
        let end = n + packet.payload.len();
        out[n..end].copy_from_slice(packet.payload);
        let again = parse_rtp(&out[..end]);
        assert!(again.is_ok(), "{again:?}");
        if let Ok(again) = again {
            assert_eq!(again.header, packet.header);
            assert_eq!(again.extension, packet.extension);
            assert_eq!(again.payload, packet.payload);
        }
    }
}

fn check_red(data: &[u8]) {
    let Ok(red) = parse_red(data) else {
        return;
    };
    // The RED layout is canonical: writing the parsed blocks back gives the input.
    let primary = red.primary();
    assert_eq!(primary.timestamp_offset, 0);
    let mut out = [0u8; 2048];
    if data.len() <= out.len() {
        let n = write_red(primary.payload_type, primary.data, red.redundant(), &mut out);
        assert_eq!(n, Ok(data.len()));
        assert_eq!(&out[..data.len()], data);
    }
}

fn check_rtcp(data: &[u8]) {
    let mut errors = 0;
    for packet in parse_rtcp(data) {
        match packet {
            Ok(RtcpPacket::SenderReport { ssrc, info, reports }) => {
                let _ = (ssrc, info.ntp.middle32(), info.ntp.to_unix_ns());
                for block in reports {
                    let _ = rtt_ns(info.ntp.middle32(), block.lsr, block.dlsr);
                    assert!((-0x80_0000..=0x7F_FFFF).contains(&block.cumulative_lost));
                }
            }
            Ok(RtcpPacket::ReceiverReport { reports, .. }) => {
                let mut blocks = [ReportBlock::default(); 31];
                let mut n = 0;
                for (slot, block) in blocks.iter_mut().zip(reports) {
                    *slot = block;
                    n += 1;
                }
                let mut out = [0u8; 1024];
                if let Ok(len) = write_receiver_report(1, &blocks[..n], &mut out) {
                    assert_eq!(parse_rtcp(&out[..len]).count(), 1);
                }
            }
            Ok(RtcpPacket::Sdes(chunks)) => {
                for item in chunks {
                    let _ = (item.ssrc, item.item_type, item.as_str());
                    assert!(item.value.len() <= 255);
                }
            }
            Ok(RtcpPacket::Bye { ssrcs, reason }) => {
                assert_eq!(ssrcs.len() % 4, 0);
                assert!(reason.map_or(0, <[u8]>::len) <= 255);
            }
            Ok(RtcpPacket::App { data, .. }) => assert!(data.len() <= u16::MAX as usize * 4),
            Ok(RtcpPacket::Other { packet_type }) => {
                assert!(!(200..=204).contains(&packet_type));
            }
            Err(_) => errors += 1,
        }
    }
    assert!(errors <= 1, "the RTCP walk continued after an error");
}

fn check_sdp(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(stream) = parse_sdp(&text) {
        assert!(stream.format.validate().is_ok());
        let again = parse_sdp(&write_sdp(&stream, "fuzz"));
        assert_eq!(again, Ok(stream));
    }
}

/// Drives the stateful counters with values taken from the input.
fn check_counters(data: &[u8]) {
    let mut seq = SeqExtender::new();
    let mut ts = TimestampExtender::new();
    let rate = match data.first() {
        Some(b) => u32::from(*b) * 1000,
        None => 48_000,
    };
    let mut stats = ReceptionStats::new(rate);
    for c in data.chunks_exact(14) {
        let s = seq.extend(u16::from_be_bytes([c[0], c[1]]));
        let t = u32::from_be_bytes([c[2], c[3], c[4], c[5]]);
        let arrival = u64::from_be_bytes([c[6], c[7], c[8], c[9], c[10], c[11], c[12], c[13]]);
        let _ = ts.extend(t);
        stats.on_packet(s, t, arrival);
        let _ = (stats.expected(), stats.lost(), stats.jitter_ns());
    }
    let block = stats.report_block(1, 2, 3);
    assert!((-0x80_0000..=0x7F_FFFF).contains(&block.cumulative_lost));
}

/// Valid packets of every kind the parsers read, named for use as fuzz corpus seeds.
pub fn seed_packets() -> Vec<(&'static str, Vec<u8>)> {
    let mut seeds = Vec::new();
    let header = RtpHeader {
        marker: false,
        payload_type: 97,
        sequence: 65_530,
        timestamp: 0xFFFF_FF00,
        ssrc: 0x1234_5678,
    };
    let fmt = AudioFormat {
        codec: Codec::L24,
        rate: 48_000,
        channels: 2,
    };

    // RTP with the format extension and four L24 stereo frames.
    let mut buf = [0u8; 2048];
    let mut ext_buf = [0u8; 8];
    let ext = format_extension(&fmt, &mut ext_buf);
    if let Ok(n) = write_rtp(&header, Some(ext), 24, &mut buf) {
        let samples = [0.5f32, -0.5, 0.25, -0.25, 1.0, -1.0, 0.0, 0.1];
        let m = crate::wire::payload::encode(fmt.codec, &samples, &mut buf[n..]);
        seeds.push(("seed-rtp-l24-format-ext", buf[..n + m].to_vec()));
    }

    // RTP carrying a RED payload with two redundant blocks.
    let red_header = RtpHeader {
        payload_type: crate::wire::payload::RED_PAYLOAD_TYPE,
        ..header
    };
    let older = crate::wire::red::RedBlock {
        payload_type: 97,
        timestamp_offset: 64,
        data: &[1, 2, 3, 4, 5, 6],
    };
    let newer = crate::wire::red::RedBlock {
        timestamp_offset: 32,
        data: &[7, 8, 9, 10, 11, 12],
        ..older
    };
    if let Ok(n) = write_rtp(&red_header, None, 0, &mut buf) {
        if let Ok(m) = write_red(97, &[13, 14, 15, 16, 17, 18], &[older, newer], &mut buf[n..]) {
            seeds.push(("seed-rtp-red", buf[..n + m].to_vec()));
        }
    }

    // RTP with two CSRCs, a foreign extension, marker and padding, built by hand.
    let mut p = vec![0xB2, 0x80 | 11, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3];
    p.extend_from_slice(&[0, 0, 0, 10, 0, 0, 0, 11]);
    p.extend_from_slice(&[0x10, 0x00, 0, 1, 0x00, 0x05, 1, 2]);
    p.extend_from_slice(&[0x12, 0x34, 0, 0]);
    p.extend_from_slice(&[0, 0, 0, 4]);
    seeds.push(("seed-rtp-csrc-ext-padding", p));

    // Compound RTCP: SR with a report block, SDES, BYE.
    let block = ReportBlock {
        ssrc: 0x8765_4321,
        fraction_lost: 12,
        cumulative_lost: -3,
        highest_seq: 70_000,
        jitter: 48,
        lsr: 0xB705_2000,
        dlsr: 0x0005_4000,
    };
    let info = SenderInfo {
        ntp: NtpTime::from_unix_ns(1_700_000_000_000_000_000),
        rtp_timestamp: 0xFFFF_FF00,
        packet_count: 1000,
        octet_count: 192_000,
    };
    let ssrc = 0x1234_5678;
    let compound = write_sender_report(ssrc, &info, &[block], &mut buf).and_then(|a| {
        let b = write_sdes(ssrc, "alice@studio", Some("Alice"), &mut buf[a..])?;
        let c = write_bye(ssrc, Some("end of set"), &mut buf[a + b..])?;
        Ok(a + b + c)
    });
    if let Ok(n) = compound {
        seeds.push(("seed-rtcp-sr-sdes-bye", buf[..n].to_vec()));
    }

    // Compound RTCP: RR with no blocks, then an APP packet.
    if let Ok(n) = write_receiver_report(0x0BAD_CAFE, &[], &mut buf) {
        let mut p = buf[..n].to_vec();
        p.extend_from_slice(&[0x81, 204, 0, 3, 0x0B, 0xAD, 0xCA, 0xFE]);
        p.extend_from_slice(b"NJAM");
        p.extend_from_slice(&[0, 1, 2, 3]);
        seeds.push(("seed-rtcp-rr-app", p));
    }

    // An SDP as netjam writes it.
    let sdp = write_sdp(
        &crate::wire::sdp::SdpStream {
            format: fmt,
            payload_type: fmt.payload_type(),
            address: std::net::IpAddr::V4(std::net::Ipv4Addr::new(239, 1, 2, 3)),
            port: 5004,
            frames_per_packet: Some(32),
        },
        "netjam seed",
    );
    seeds.push(("seed-sdp", sdp.into_bytes()));
    seeds
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SimRng;

    fn mutate(rng: &mut SimRng, packet: &mut Vec<u8>) {
        let edits = 1 + rng.next_u64() % 4;
        for _ in 0..edits {
            let r = rng.next_u64();
            let len = packet.len();
            match r % 7 {
                // Flip one bit.
                0 | 1 if len > 0 => {
                    let i = (r >> 8) as usize % len;
                    packet[i] ^= 1 << ((r >> 40) % 8);
                }
                // Overwrite one byte with a boundary value.
                2 if len > 0 => {
                    let i = (r >> 8) as usize % len;
                    packet[i] = [0, 1, 0x7f, 0x80, 0xff, 3, 4][(r >> 40) as usize % 7];
                }
                // Truncate.
                3 if len > 0 => packet.truncate((r >> 8) as usize % len),
                // Insert a random byte.
                4 => {
                    let i = (r >> 8) as usize % (len + 1);
                    packet.insert(i, (r >> 40) as u8);
                }
                // Append random bytes.
                5 => {
                    for _ in 0..(r >> 8) % 9 {
                        packet.push(rng.next_u64() as u8);
                    }
                }
                // Remove a byte.
                _ if len > 0 => {
                    packet.remove((r >> 8) as usize % len);
                }
                _ => {}
            }
        }
    }

    #[test]
    fn seeds_are_valid_packets() {
        let seeds = seed_packets();
        assert_eq!(seeds.len(), 6);
        for (name, bytes) in &seeds {
            parse_any(bytes);
            let ok = if name.starts_with("seed-rtp-") {
                parse_rtp(bytes).is_ok()
            } else if name.starts_with("seed-rtcp-") {
                parse_rtcp(bytes).all(|p| p.is_ok())
            } else {
                parse_sdp(&String::from_utf8_lossy(bytes)).is_ok()
            };
            assert!(ok, "{name} does not parse");
        }
    }

    #[test]
    fn parse_any_survives_random_and_mutated_packets() {
        let mut rng = SimRng::new(0x6e6a_7769_7265);
        let seeds = seed_packets();
        let mut packet = Vec::with_capacity(2048);
        // Mutations of valid packets, which get past the first checks.
        for i in 0..250_000u64 {
            let (_, seed) = &seeds[i as usize % seeds.len()];
            packet.clear();
            packet.extend_from_slice(seed);
            mutate(&mut rng, &mut packet);
            parse_any(&packet);
        }
        // Pure noise, with the version bits of RTP/RTCP half of the time.
        for _ in 0..100_000 {
            let len = (rng.next_u64() % 80) as usize;
            packet.clear();
            packet.extend((0..len).map(|_| rng.next_u64() as u8));
            if len > 0 && rng.chance(0.5) {
                packet[0] = 0x80 | (packet[0] & 0x3f);
            }
            parse_any(&packet);
        }
    }

    /// Writes the seed corpus for `cargo fuzz run rtp_rtcp_parse`. Run on purpose:
    /// `cargo test -p netjam-engine write_fuzz_seed_corpus -- --ignored`.
    #[test]
    #[ignore]
    fn write_fuzz_seed_corpus() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/rtp_rtcp_parse");
        std::fs::create_dir_all(&dir).expect("create corpus dir");
        for (name, bytes) in seed_packets() {
            std::fs::write(dir.join(name), bytes).expect("write seed");
        }
    }
}
