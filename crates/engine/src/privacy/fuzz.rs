//! Fuzzing entry point for SFrame opening: [`open_any`] feeds one input to the SFrame
//! header parser, to an opener holding keys for a few KIDs (as a frame and as an RTP
//! packet), and seals it as a payload to check the round trip. The `sframe_open` target
//! of the `fuzz/` crate calls it, and the unit test below runs it over random and mutated
//! frames so the normal test suite exercises the same paths. Any panic reached from here
//! is a bug, never a fault of the input.

use super::rtp::{open_rtp, seal_rtp};
use super::sframe::{Header, SframeOpener, SframeSealer, TAG_LEN};

/// The base key every fuzzed opener and sealer uses.
const BASE: [u8; 32] = [0x5a; 32];
/// KIDs the opener holds: short, one-byte and long forms.
const KIDS: [u64; 3] = [3, 0x42, 0x1_9e37_79b9];

/// Opens `data` every way a receiver could, and seals it as a plaintext. Never panics
/// unless the code under test has a bug.
pub fn open_any(data: &[u8]) {
    if let Ok((h, n)) = Header::parse(data) {
        // Accepted encodings may be longer than the shortest; the shortest reads back.
        assert!(n <= data.len() && n >= h.len());
        let mut again = [0u8; super::sframe::MAX_HEADER_LEN];
        let m = h.encode(&mut again).expect("room for any header");
        assert_eq!(Header::parse(&again[..m]), Ok((h, m)));
    }
    let mut opener = SframeOpener::new();
    for k in KIDS {
        opener.install(k, &BASE);
    }
    let mut buf = [0u8; 2048];
    let len = data.len().min(buf.len());
    buf[..len].copy_from_slice(&data[..len]);
    if let Ok(o) = opener.open(b"", &mut buf[..len]) {
        assert!(o.plaintext.len() + TAG_LEN < len);
    }
    buf[..len].copy_from_slice(&data[..len]);
    if let Ok(n) = open_rtp(&mut opener, &mut buf[..len]) {
        assert!(n < len);
    }
    // Sealed as a payload and as a packet, it opens back to itself.
    let mut sealer = SframeSealer::new(KIDS[2], &BASE);
    let mut out = [0u8; 2048 + 64];
    let n = sealer
        .seal(b"m", &data[..len], &mut out)
        .expect("room for the frame");
    let opened = opener.open(b"m", &mut out[..n]).expect("own frame opens");
    assert_eq!(opened.plaintext, &data[..len]);
    if let Ok(n) = seal_rtp(&mut sealer, &data[..len], &mut out) {
        assert_eq!(open_rtp(&mut opener, &mut out[..n]), Ok(len));
        assert_eq!(&out[..len], &data[..len]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_and_mutated_frames_never_panic() {
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // Genuine frames and RTP packets to mutate.
        let mut sealer = SframeSealer::new(KIDS[1], &BASE);
        let mut seeds: Vec<Vec<u8>> = Vec::new();
        for len in [0usize, 1, 12, 40, 276] {
            let pt: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut out = vec![0u8; len + 64];
            let n = sealer.seal(b"", &pt, &mut out).expect("seal");
            out.truncate(n);
            seeds.push(out);
            let mut rtp = vec![0x80u8, 96, 0, 1, 0, 0, 0, 64, 1, 2, 3, 4];
            rtp.extend_from_slice(&pt);
            let mut out = vec![0u8; rtp.len() + 64];
            if let Ok(n) = seal_rtp(&mut sealer, &rtp, &mut out) {
                out.truncate(n);
                seeds.push(out);
            }
        }
        for i in 0..20_000u64 {
            let mut d = seeds[(i as usize) % seeds.len()].clone();
            match next() % 4 {
                0 => {
                    let len = (next() % 300) as usize;
                    d = (0..len).map(|_| next() as u8).collect();
                }
                1 if !d.is_empty() => {
                    let at = (next() as usize) % d.len();
                    d[at] ^= 1 << (next() % 8);
                }
                2 => d.truncate((next() as usize) % (d.len() + 1)),
                _ => {}
            }
            open_any(&d);
        }
    }
}
