//! What SFrame costs a private room; prints its figures. Run:
//! `cargo bench -p netjam-engine --bench sframe`.
//!
//! µs per packet to seal and to open a 276-byte RTP payload (64 frames of L16 stereo plus
//! the format extension's worth), bytes each packet gains, and the time the room secret's
//! Argon2id takes with the room parameters (and, for scale, lighter and heavier ones).
//! Then the control channel's: µs per Noise handshake at the server and at the player,
//! and per control message sealed and opened, with the bytes it gains.

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
    control_channel();
}

/// The control channel's costs: handshakes (the server's share is what a join costs its
/// forwarding thread) and sealed control messages.
fn control_channel() {
    use netjam_engine::room::secure::{SecureClient, SecureServer, StaticKey, NOISE};
    use std::net::SocketAddr;
    const HANDSHAKES: usize = 2_000;
    const MESSAGES: usize = 100_000;
    let cookie = [5u8; 32];
    let mut server = SecureServer::new(StaticKey::generate().expect("key"), HANDSHAKES);
    let (mut a, mut b) = ([0u8; 256], [0u8; 256]);
    let (mut at_server, mut at_client) = (0u128, 0u128);
    let mut last = None;
    for i in 0..HANDSHAKES {
        let src = SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 5000));
        let mut c = SecureClient::new(None);
        let t = Instant::now();
        let n = c.start(&cookie, &mut a).expect("start");
        at_client += t.elapsed().as_nanos();
        let t = Instant::now();
        let m = server
            .accept(i as u64, src, &a[..n], |k| k == &cookie, &mut b)
            .expect("accept");
        at_server += t.elapsed().as_nanos();
        let t = Instant::now();
        c.finish(0, &b[..m]).expect("finish");
        at_client += t.elapsed().as_nanos();
        last = Some((c, src));
    }
    let (mut client, src) = last.expect("a handshake");
    let msg = [0x2fu8; 64];
    let mut wire = vec![[0u8; 160]; MESSAGES];
    let mut lens = vec![0usize; MESSAGES];
    let t = Instant::now();
    for (w, n) in wire.iter_mut().zip(lens.iter_mut()) {
        *n = client.seal(black_box(&msg), w).expect("seal");
    }
    let seal_us = t.elapsed().as_secs_f64() * 1e6 / MESSAGES as f64;
    let mut out = [0u8; 160];
    let t = Instant::now();
    for (w, &n) in wire.iter().zip(lens.iter()) {
        black_box(server.open(1, src, &w[..n], &mut out).expect("open"));
    }
    let open_us = t.elapsed().as_secs_f64() * 1e6 / MESSAGES as f64;
    println!("control channel ({NOISE}):");
    println!(
        "  handshake: {:.1} us at the server, {:.1} us at the player ({HANDSHAKES} handshakes)",
        at_server as f64 / 1e3 / HANDSHAKES as f64,
        at_client as f64 / 1e3 / HANDSHAKES as f64
    );
    println!(
        "  a {}-byte control message: sealed {seal_us:.3} us, opened {open_us:.3} us, {} bytes added",
        msg.len(),
        lens[0] - msg.len()
    );
}

/// Bytes a sealer for `k` adds once its counter has reached `ctr`: header and tag.
fn overhead_at(k: u64, ctr: u64) -> usize {
    Header { kid: k, ctr }.len() + TAG_LEN
}
