//! Zero heap allocations per packet for SFrame, proven with a counting allocator: sealing
//! 276-byte payloads, opening them in place (in order, reordered, replayed, forged and
//! under unknown KIDs), and installing the next epoch's key on the opening side.

use netjam_engine::privacy::{kid, RoomKdf, RoomSecret, SframeError, SframeOpener};

alloc_count::install!();

#[test]
fn seal_and_open_do_not_allocate() {
    // Derivation is done at join time, off the realtime threads: outside the region.
    let cheap = RoomKdf {
        memory_kib: 64,
        passes: 1,
        lanes: 1,
    };
    let media = RoomSecret::derive_with("band", "pw", cheap)
        .expect("derive")
        .media_key();
    let (k0, k1) = (kid(0, 1), kid(1, 0x9e37_79b9));
    let base1 = media.sender_base_key(k1);
    let mut sealer = media.sealer(k0);
    let mut opener = SframeOpener::new();
    media.install(&mut opener, k0);

    let payload: Vec<u8> = (0..276u32).map(|i| (i * 3) as u8).collect();
    let metadata = [0x80u8, 96, 0, 1, 0, 0, 0, 64, 1, 2, 3, 4];
    let mut frames = vec![[0u8; 320]; 4];
    let mut lens = [0usize; 4];
    let mut forged = [0u8; 320];
    let (mut opened, mut replayed, mut refused) = (0u64, 0u64, 0u64);

    let ((allocs, frees), ()) = alloc_count::count_both(|| {
        alloc_count::prove_counting();
        for k in 0..20_000usize {
            let slot = k % 4;
            lens[slot] = sealer.seal(&metadata, &payload, &mut frames[slot]).expect("seal");
            if slot != 3 {
                continue;
            }
            // Four packets arrive out of order: 1, 0, 3, 2.
            for i in [1, 0, 3, 2] {
                let n = lens[i];
                let o = opener.open(&metadata, &mut frames[i][..n]).expect("open");
                assert_eq!(o.plaintext.len(), payload.len());
                opened += 1;
            }
            if k % 40 == 7 {
                // A fresh frame arrives bit-flipped (forged), then genuine, then again (replayed).
                let n = sealer.seal(&metadata, &payload, &mut forged).expect("seal");
                let genuine = forged;
                forged[n / 2] ^= 1;
                match opener.open(&metadata, &mut forged[..n]) {
                    Err(SframeError::Forged) => refused += 1,
                    other => panic!("forgery opened: {:?}", other.map(|x| x.ctr)),
                }
                forged = genuine;
                opener
                    .open(&metadata, &mut forged[..n])
                    .expect("genuine after a forgery");
                forged = genuine;
                match opener.open(&metadata, &mut forged[..n]) {
                    Err(SframeError::Replayed(_)) => replayed += 1,
                    other => panic!("replay opened: {:?}", other.map(|x| x.ctr)),
                }
                // A KID nobody installed.
                forged[0] = 0x50 | (forged[0] & 0x0f);
                assert!(matches!(
                    opener.open(&metadata, &mut forged[..n]),
                    Err(SframeError::UnknownKey(5))
                ));
            }
            if k == 10_003 {
                // The next epoch's key arrives while the stream plays.
                opener.install(k1, &base1);
            }
        }
    });
    assert!(
        opened >= 19_000 && replayed > 100 && refused > 100,
        "{opened} {replayed} {refused}"
    );
    assert!(opener.has(k0) && opener.has(k1));
    assert_eq!(
        (allocs - 1, frees - 1),
        (0, 0),
        "allocations and frees while sealing and opening 20 000 packets"
    );
}
