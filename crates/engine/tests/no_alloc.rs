//! Zero heap allocations per packet and per playout period in steady state, proven with a
//! counting allocator: sender packetizing with redundancy and RTCP, receiver taking RTP
//! (with loss, reordering, duplicates and gaps the sender skipped) and RTCP and playing
//! out with concealment; and
//! the link model applying a schedule of events once its queue has its working size.

use netjam_engine::link::{JitterDist, LinkConfig, LinkModel, LinkSchedule};
use netjam_engine::receiver::{Receiver, ReceiverConfig};
use netjam_engine::sender::{Sender, SenderConfig};
use netjam_engine::synth::{Synth, SynthKind};
use netjam_engine::time::frames_to_ns;
use netjam_engine::wire::{AudioFormat, Codec};

alloc_count::install!();

fn allocs() -> u64 {
    alloc_count::allocations()
}

#[test]
fn sender_and_receiver_do_not_allocate_in_steady_state() {
    // The counter sees this thread's allocations.
    let before = allocs();
    drop(std::hint::black_box(vec![1u8; 16]));
    assert_eq!(allocs(), before + 1);
    for (codec, channels, redundancy) in [(Codec::L16, 2u16, 0usize), (Codec::L24, 4, 2), (Codec::F32, 1, 1)]
    {
        let format = AudioFormat::new(codec, 48_000, channels).expect("format");
        let mut sender = Sender::new(SenderConfig {
            redundancy,
            seed: 3,
            name: Some("A".into()),
            ..SenderConfig::new(format, 64)
        })
        .expect("sender");
        let mut receiver = Receiver::new(ReceiverConfig {
            seed: 4,
            ..ReceiverConfig::new(4)
        });
        // Odd cases resample (drift correction), even ones play bit-exact.
        receiver.set_drift_correction(redundancy % 2 == 1);
        // Link impairments are applied by index (the link model itself allocates and is not
        // on the realtime path): lose every 37th packet, swap every 50th pair, duplicate every 61st.
        let mut synth = Synth::new(SynthKind::Music { bpm: 120.0 }, 48_000, channels as usize, 1);
        let ch = channels as usize;
        let mut cap = vec![0.0f32; 64 * ch];
        let mut out = vec![0.0f32; 64 * ch];
        let mut rtcp = vec![0u8; 1500];
        let mut packets: Vec<Vec<u8>> = (0..4).map(|_| Vec::with_capacity(65_536)).collect();
        let mut held = Vec::with_capacity(65_536);
        let period = frames_to_ns(64, 48_000);
        let mut measured = 0u64;
        for k in 0..20_000u64 {
            let now = k * period;
            if k == 2_000 {
                measured = allocs();
                // One counted allocation on purpose: the counter moves inside the region.
                alloc_count::prove_counting();
                measured += 1;
            }
            synth.fill(&mut cap);
            if k % 997 == 500 {
                // The sender's device lost a period: a gap in its stream.
                sender.skip_frames(64);
            }
            let mut n = 0;
            sender.push_frames(now, &cap, |p| {
                packets[n].clear();
                packets[n].extend_from_slice(p);
                n += 1;
            });
            for p in packets.iter().take(n) {
                // The parsers themselves, walked to the end.
                if let Ok(rtp) = netjam_engine::wire::parse_rtp(p) {
                    if let Some(ext) = rtp.extension.as_ref() {
                        let _ = std::hint::black_box(netjam_engine::wire::parse_format_extension(ext));
                    }
                    if let Ok(red) = netjam_engine::wire::red::parse_red(rtp.payload) {
                        std::hint::black_box(red.redundant().len());
                    }
                }
                let arrive = now + 5_000_000;
                if k % 37 == 0 {
                    continue;
                }
                if k % 50 == 0 {
                    held.clear();
                    held.extend_from_slice(p);
                    continue;
                }
                receiver.on_datagram(arrive, p);
                if k % 50 == 1 && !held.is_empty() {
                    receiver.on_datagram(arrive, &held);
                }
                if k % 61 == 0 {
                    receiver.on_datagram(arrive, p);
                }
            }
            if let Some(len) = sender.poll_rtcp(now, &mut rtcp) {
                for pkt in netjam_engine::wire::rtcp::parse_rtcp(&rtcp[..len]) {
                    std::hint::black_box(&pkt);
                }
                receiver.on_datagram(now + 5_000_000, &rtcp[..len]);
            }
            receiver.play(now + 5_000_000 + 300_000, &mut out);
            if let Some(len) = receiver.poll_rtcp(now, &mut rtcp) {
                sender.on_rtcp(now + 10_000_000, &rtcp[..len]);
            }
            while receiver.poll_event().is_some() {}
        }
        let during = allocs() - measured;
        let st = receiver.stats();
        // The lossy path was exercised: concealment without redundancy, recovery with it.
        if redundancy == 0 {
            assert!(st.jitter_buffer.concealment_events > 100, "{st:?}");
        }
        assert!(
            st.reordered > 100 && st.jitter_buffer.duplicate_packets > 100,
            "{st:?}"
        );
        assert!(sender.stats().rtt_ms.is_some());
        // The sender's gaps were found (those whose packet arrived next in sequence).
        assert!(st.jitter_buffer.sender_gaps >= 10, "{st:?}");
        if redundancy > 0 {
            assert!(st.jitter_buffer.recovered_frames > 0, "{st:?}");
        }
        assert_eq!(
            during, 0,
            "{codec} x{channels} red {redundancy}: {during} allocations in 18 000 periods"
        );
    }
}

#[test]
fn link_events_do_not_allocate_per_packet() {
    const MS: u64 = 1_000_000;
    let schedule = LinkSchedule::parse(
        "2s:stall=200ms\n3s:delay=+10ms\n4s:delay=-20ms\n5s:jitter=30ms/1s\n6s:rate=256kbit/1s\n7s:loss=20%/1s",
    )
    .expect("schedule");
    let config = LinkConfig {
        delay_ns: 30 * MS,
        jitter_ns: MS,
        jitter_dist: JitterDist::Normal,
        reorder: 0.01,
        duplicate: 0.01,
        ..LinkConfig::ideal()
    };
    let mut link: LinkModel<u64> = LinkModel::new(config, 5).with_schedule(schedule);
    // The in-flight heap grows to the most packets ever held (a jitter burst's tail can hold
    // hundreds); holding 4000 at once first gives it its working size.
    for i in 0..4000u64 {
        link.send(i * MS / 4, i, 200);
    }
    while link.poll(u64::MAX).is_some() {}
    let measured = allocs();
    for i in 1000..9000u64 {
        let now = i * MS;
        link.send(now, i, 200);
        while link.poll(now).is_some() {}
    }
    let during = allocs() - measured;
    let s = link.stats();
    assert!(
        s.stalled > 100 && s.queue_dropped > 100 && s.lost > 100,
        "events not exercised: {s:?}"
    );
    assert_eq!(during, 0, "{during} allocations in 8000 packets");
}
