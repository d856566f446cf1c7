//! What SFrame costs a private room; prints its figures. Run:
//! `cargo bench -p netjam-engine --bench sframe`.
//!
//! µs per packet to seal and to open a 276-byte RTP payload (64 frames of L16 stereo plus
//! the format extension's worth), bytes each packet gains, and the time the room secret's
//! Argon2id takes with the room parameters (and, for scale, lighter and heavier ones).

use std::hint::black_box;
use std::time::Instant;

use netjam_engine::privacy::sframe::TAG_LEN;
use netjam_engine::privacy::{kid, Header, RoomKdf, RoomSecret, SframeOpener};

const PAYLOAD: usize = 276;
const PACKETS: usize = 200_000;

fn main() {
    let media = RoomSecret::derive_with(
        "bench",
        "pw",
        RoomKdf {
            memory_kib: 64,
            passes: 1,
            lanes: 1,
        },
    )
    .expect("derive")
    .media_key();
    let payload: Vec<u8> = (0..PAYLOAD).map(|i| (i * 7) as u8).collect();
    let metadata = [0u8; 12];
    println!("SFrame AES_128_CTR_HMAC_SHA256_80, {PAYLOAD}-byte payload, {PACKETS} packets:");
    for (what, k) in [("epoch 0", kid(0, 0x9e37_79b9)), ("epoch 1", kid(1, 0x9e37_79b9))] {
        let mut sealer = media.sealer(k);
        let mut opener = SframeOpener::new();
        media.install(&mut opener, k);
        // Seal every packet first (timed), keeping them to open (timed apart).
        let mut frames = vec![[0u8; PAYLOAD + 32]; PACKETS];
        let mut lens = vec![0usize; PACKETS];
        let start = Instant::now();
        for (f, n) in frames.iter_mut().zip(lens.iter_mut()) {
            *n = sealer.seal(&metadata, black_box(&payload), f).expect("seal");
        }
        let seal_us = start.elapsed().as_secs_f64() * 1e6 / PACKETS as f64;
        let start = Instant::now();
        for (f, &n) in frames.iter_mut().zip(lens.iter()) {
            let opened = opener.open(&metadata, &mut f[..n]).expect("open");
            black_box(opened.plaintext);
        }
        let open_us = start.elapsed().as_secs_f64() * 1e6 / PACKETS as f64;
        let first = lens[0] - PAYLOAD;
        let at_64k = lens[1 << 16] - PAYLOAD;
        println!(
            "  {what}: seal {seal_us:.3} us/packet, open {open_us:.3} us/packet; \
             bytes added {first} (counter < 8) .. {at_64k} (counter 2^16, 87 s at 750 packets/s); \
             {} from 2^24 (6.2 h)",
            overhead_at(k, 1 << 24)
        );
    }

    println!("room secret (Argon2id, 1 lane; one run each):");
    for (what, kdf) in [
        (
            "19 MiB x 2",
            RoomKdf {
                memory_kib: 19 * 1024,
                passes: 2,
                lanes: 1,
            },
        ),
        ("room parameters", RoomKdf::ROOM),
        (
            "64 MiB x 3",
            RoomKdf {
                memory_kib: 64 * 1024,
                passes: 3,
                lanes: 1,
            },
        ),
    ] {
        let start = Instant::now();
        let s = RoomSecret::derive_with("bench", "correct horse", kdf).expect("derive");
        let ms = start.elapsed().as_secs_f64() * 1e3;
        black_box(s.join_proof());
        println!(
            "  {what} ({} KiB, {} passes): {ms:.0} ms",
            kdf.memory_kib, kdf.passes
        );
    }
}

/// Bytes a sealer for `k` adds once its counter has reached `ctr`: header and tag.
fn overhead_at(k: u64, ctr: u64) -> usize {
    Header { kid: k, ctr }.len() + TAG_LEN
}
