//! Malformed and forged packet injection: a panic or a glitch in the stream here is a bug
//! in netjam, never bad input. Every hostile datagram is counted and dropped, and the music
//! arrives bit-exact all the same.

mod common;

use common::Session;
use netjam_engine::link::LinkConfig;
use netjam_engine::rng::SimRng;
use netjam_engine::wire::{AudioFormat, Codec};

fn valid_rtp(r: &mut SimRng, ssrc: u32) -> Vec<u8> {
    let mut p = vec![0x80, 96, 0, 0, 0, 0, 0, 0];
    p.extend_from_slice(&ssrc.to_be_bytes());
    let seq = (r.next_u64() as u16).to_be_bytes();
    p[2] = seq[0];
    p[3] = seq[1];
    p.extend((0..256).map(|_| r.next_u64() as u8));
    p
}

fn hostile(r: &mut SimRng) -> Vec<u8> {
    let mut p = valid_rtp(r, 0xdead_beef);
    match r.next_u64() % 10 {
        0 => p.truncate((r.next_u64() % 12) as usize), // truncated header
        1 => p[0] = 0x40 | (p[0] & 0x3f),              // wrong version
        2 => p[0] = 0x8f,                              // 15 CSRCs past the end
        3 => {
            p[0] |= 0x10; // extension whose length points past the end
            p.truncate(16);
            p[14] = 0xff;
            p[15] = 0xff;
        }
        4 => {
            p[0] |= 0x20; // padding count larger than the packet
            let last = p.len() - 1;
            p[last] = 255;
        }
        5 => {
            p = (0..(r.next_u64() % 2000) as usize)
                .map(|_| r.next_u64() as u8)
                .collect()
        } // noise
        6 => {
            // RTCP garbage: a valid-looking header with an absurd length.
            p = vec![0x81, 201, 0xff, 0xff, 1, 2, 3, 4];
        }
        7 => p.clear(),
        8 => {
            // Forged: another SSRC, valid header, a netjam format extension saying 64 channels.
            p = vec![
                0x90, 96, 0, 1, 0, 0, 0, 1, 1, 2, 3, 4, 0xbe, 0xde, 0, 1, 0x11, 0x12, 64, 0,
            ];
            p.extend((0..64).map(|_| 0xaa));
        }
        _ => {
            // RED with block lengths past the end.
            p[1] = 99;
            p.truncate(20);
            p[12] = 0x80 | 96;
            p[15] = 0xff;
        }
    }
    p
}

#[test]
fn hostile_datagrams_are_counted_and_the_stream_stays_bit_exact() {
    let format = AudioFormat::new(Codec::F32, 48_000, 2).expect("format");
    let link = LinkConfig {
        delay_ns: 10_000_000,
        ..LinkConfig::ideal()
    };
    let mut s = Session::new(format, 64, 0, link, 21);
    let mut r = SimRng::new(99);
    s.garbage = Some(Box::new(move |step| (step % 3 == 0).then(|| hostile(&mut r))));
    s.run(3_000_000_000);
    let st = s.receiver.stats();
    let dropped = st.malformed + st.not_rtp + st.rtcp_malformed + st.probation + st.unknown_format;
    assert!(dropped > 1000, "{st:?}");
    assert_eq!(
        st.stream_starts, 1,
        "a forged packet must not take over the stream: {st:?}"
    );
    assert_eq!(st.jitter_buffer.concealment_events, 0, "{st:?}");
    let offset = s.alignment().expect("sent audio found in what was played");
    let ch = 2;
    let start = s
        .played
        .chunks(ch)
        .position(|f| f.iter().any(|x| *x != 0.0))
        .expect("audio");
    let n = s.played.len() / ch - start;
    let sent_start = start - offset;
    assert_eq!(
        &s.played[start * ch..],
        &s.sent[sent_start * ch..(sent_start + n) * ch]
    );
}

#[test]
fn random_bytes_never_panic_the_receiver() {
    let mut rx = netjam_engine::receiver::Receiver::new(netjam_engine::receiver::ReceiverConfig {
        fixed_format: Some((AudioFormat::new(Codec::L16, 44_100, 2).expect("format"), 10)),
        seed: 1,
        ..netjam_engine::receiver::ReceiverConfig::new(64)
    });
    let mut r = SimRng::new(5);
    let mut out = vec![0.0; 128];
    for i in 0..200_000u64 {
        let len = (r.next_u64() % 1500) as usize;
        let mut p: Vec<u8> = (0..len).map(|_| r.next_u64() as u8).collect();
        if i % 2 == 0 && p.len() > 1 {
            p[0] = 0x80 | (p[0] & 0x3f); // mostly-valid RTP/RTCP headers reach deeper code
        }
        rx.on_datagram(i * 10_000, &p);
        if i % 100 == 0 {
            rx.play(i * 10_000, &mut out);
        }
    }
    assert!(rx.stats().datagrams == 200_000);
}
