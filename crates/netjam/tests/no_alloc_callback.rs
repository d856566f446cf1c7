//! The audio callbacks themselves — `SendProcess::process` and `RecvProcess::process`, with
//! their lock-free rings to real network threads on loopback — allocate nothing per
//! period in steady state. Counted with a per-thread counting allocator on the thread
//! that runs the callbacks, as the audio thread would.

mod common;

use std::path::Path;
use std::time::Duration;

use common::reflect;
use netjam::endpoint::Process;
use netjam::opus::{decoders, OpusEncoder, OpusSettings};
use netjam::session::{JamProcess, JamStats, NetIo, Peer, RecvProcess, SendProcess, PEER_TRACK};
use netjam::transport::UdpTransport;
use netjam_engine::player::{Command, MediaConfig};
use netjam_engine::receiver::{Receiver, ReceiverConfig};
use netjam_engine::sender::{Sender, SenderConfig};
use netjam_engine::synth::{Synth, SynthKind};
use netjam_engine::time::frames_to_ns;
use netjam_engine::wire::{AudioFormat, Codec};

alloc_count::install!();

fn allocs() -> u64 {
    alloc_count::allocations()
}

/// Run `periods` periods of 64 stereo frames of music from `synth` through `process` on
/// their real schedule, as the audio thread would; returns the allocations this thread made
/// from period `from` on.
fn periods_on_time(
    mut synth: Synth,
    periods: u64,
    from: u64,
    mut process: impl FnMut(u64, &[f32], &mut [f32]),
) -> u64 {
    let mut input = vec![0.0f32; 128];
    let mut output = vec![0.0f32; 128];
    let period = frames_to_ns(64, 48_000);
    let start = netjam::clock::now_ns();
    let mut measured_from = 0;
    for k in 0..periods {
        if k == from {
            measured_from = allocs();
            // One counted allocation on purpose: the counter moves inside the region.
            alloc_count::prove_counting();
            measured_from += 1;
        }
        let deadline = start + (k + 1) * period;
        netjam::clock::sleep_until_ns(deadline);
        synth.fill(&mut input);
        process(deadline, &input, &mut output);
    }
    allocs() - measured_from
}

/// The jam callback of `sender` and a receiver made from `receiver` on a socket facing
/// `netjam reflect` (up for `seconds`), run for `periods` periods of music, hearing the
/// other side at `gain_db` and recording into `record` if given: the allocations from
/// period 750 on, and its statistics.
fn jam_against_reflect(
    seconds: &str,
    sender: Sender,
    receiver: ReceiverConfig,
    measure_round_trip: bool,
    periods: u64,
    gain_db: f32,
    record: Option<&Path>,
) -> (u64, JamStats) {
    let (_reflect, reflector) = reflect(seconds);
    let (io, link) = NetIo::start(
        UdpTransport::bind("127.0.0.1:0".parse().expect("addr")).expect("bind"),
        Peer::Fixed(reflector),
    )
    .expect("io");
    let channels = sender.format().channels.into();
    let media = MediaConfig {
        receiver,
        ..MediaConfig::new(1, channels)
    };
    let (mut jam, _snaps, _commands) = JamProcess::new(sender, link, media);
    let m = jam.media_mut();
    m.apply(Command::Gain {
        member: PEER_TRACK,
        db: gain_db,
    });
    m.measure_round_trip(measure_round_trip);
    let writer = record.map(|dir| {
        let (tap, writer) = netjam::record::start(netjam::record::RecordConfig {
            dir: dir.to_owned(),
            rate: 48_000,
            mix_channels: 2,
            you_channels: 2,
            names: Box::new(|_| Some("peer".into())),
        })
        .expect("recording");
        jam.set_recorder(tap);
        writer
    });
    let synth = Synth::new(SynthKind::Music { bpm: 100.0 }, 48_000, 2, 9);
    let during = periods_on_time(synth, periods, 750, |deadline, input, output| {
        jam.process(deadline, input, output)
    });
    let stats = jam.stats();
    io.shutdown();
    drop(jam.take_recorder());
    if let Some(w) = writer {
        let summary = w.finish().expect("recording finished");
        assert_eq!(summary.error, None);
        assert_eq!(summary.files.len(), 3, "{summary:?}");
        assert_eq!(summary.frames, periods * 64, "{summary:?}");
    }
    (during, stats)
}

#[test]
fn send_and_receive_callbacks_do_not_allocate() {
    let before = allocs();
    drop(std::hint::black_box(Box::new(1u64)));
    assert_eq!(allocs(), before + 1, "the counter counts this thread");

    let format = AudioFormat::new(Codec::L16, 48_000, 2).expect("format");
    let loopback = "127.0.0.1:0".parse().expect("addr");
    let recv_socket = UdpTransport::bind(loopback).expect("bind");
    let recv_addr = recv_socket.local_addr().expect("addr");
    let (recv_io, recv_link) = NetIo::start(recv_socket, Peer::Learned).expect("recv io");
    let (send_io, send_link) = NetIo::start(
        UdpTransport::bind(loopback).expect("bind"),
        Peer::Fixed(recv_addr),
    )
    .expect("send io");
    let sender = Sender::new(SenderConfig {
        redundancy: 1,
        seed: 1,
        name: Some("A".into()),
        ..SenderConfig::new(format, 64)
    })
    .expect("sender");
    let mut receiver = Receiver::new(ReceiverConfig {
        seed: 2,
        ..ReceiverConfig::new(2)
    });
    receiver.set_output_format(format);
    let (mut tx, mut tx_snaps) = SendProcess::new(sender, send_link, 48_000);
    let (mut rx, mut rx_snaps) = RecvProcess::new(receiver, recv_link, 48_000);
    let synth = Synth::new(SynthKind::Music { bpm: 120.0 }, 48_000, 2, 3);
    let periods = 3000u64; // 4 s, with RTCP both ways several times
    let during = periods_on_time(synth, periods, 500, |deadline, input, output| {
        tx.process(deadline, input, &mut []);
        rx.process(deadline, &[], output);
    });
    // Drain the snapshot rings (outside the measured stretch).
    let last_rx = std::iter::from_fn(|| rx_snaps.pop().ok())
        .last()
        .expect("receiver snapshots");
    let last_tx = std::iter::from_fn(|| tx_snaps.pop().ok())
        .last()
        .expect("sender snapshots");
    std::thread::sleep(Duration::from_millis(20));
    send_io.shutdown();
    recv_io.shutdown();
    assert!(last_rx.stats.received > 2000, "{:?}", last_rx.stats);
    assert!(
        last_tx.stats.rtcp_received >= 2,
        "receiver reports came back: {:?}",
        last_tx.stats
    );
    assert_eq!(
        during,
        0,
        "{during} allocations in {} callbacks of each kind",
        periods - 500
    );
}

#[test]
fn jam_callback_measures_its_round_trip_through_reflect_without_allocating() {
    let format = AudioFormat::new(Codec::L16, 48_000, 2).expect("format");
    let sender = Sender::new(SenderConfig {
        seed: 5,
        ..SenderConfig::new(format, 64)
    })
    .expect("sender");
    let receiver = ReceiverConfig {
        seed: 6,
        ..ReceiverConfig::new(2)
    };
    let (during, stats) = jam_against_reflect("8", sender, receiver, true, 3750, 0.0, None); // 5 s
    assert_eq!(during, 0, "{during} allocations in the jam callback");
    // The meter ran (a burst that a late period cut is lost, and a loaded machine has a
    // few: one run in CI found 1 and lost 4).
    assert!(stats.round_trip_found >= 1, "{stats:?}");
    let rtt = stats.round_trip_ms.expect("round trip measured");
    // Loopback: one packet + the buffer (a period plus its target) + the wire.
    assert!((1.3..25.0).contains(&rtt), "in-band round trip {rtt:.2} ms");
    eprintln!(
        "in-band round trip through netjam reflect: {rtt:.2} ms ({} bursts found, {} lost); RTCP rtt {:?} ms",
        stats.round_trip_found, stats.round_trip_lost, stats.sent.rtt_ms
    );
}

#[test]
fn jam_callback_with_opus_both_ways_does_not_allocate() {
    let format = AudioFormat::new(Codec::Opus, 48_000, 2).expect("format");
    // 2.5 ms Opus packets from 64-frame periods, with one redundant copy.
    let settings = OpusSettings::new(2.5, 192, 5).expect("settings");
    let encoder =
        OpusEncoder::new(format, settings).expect("libopus encoder (scripts/deps installs libopus0)");
    let sender = Sender::with_encoder(
        SenderConfig {
            seed: 7,
            redundancy: 1,
            ..SenderConfig::new(format, settings.frames)
        },
        Some(Box::new(encoder)),
    )
    .expect("sender");
    let receiver = ReceiverConfig {
        seed: 8,
        decoders: decoders(),
        ..ReceiverConfig::new(2)
    };
    // 4 s; the decoder exists from the first packet back, well before 1 s.
    let (during, stats) = jam_against_reflect("6", sender, receiver, false, 3000, 0.0, None);
    // Rust allocations on the audio thread; libopus itself allocates only when an encoder or
    // decoder is created (its scratch space is on the stack).
    assert_eq!(during, 0, "{during} allocations in the jam callback with Opus");
    let heard = &stats.heard;
    assert!(heard.decoder.decoded_packets > 1000, "{heard:?}");
    assert_eq!(heard.undecodable, 0, "{heard:?}");
    assert_eq!(stats.sent.encode_errors, 0, "{:?}", stats.sent);
    assert!((stats.sent.codec_delay_ms - 2.5).abs() < 1e-9, "{:?}", stats.sent);
}

#[test]
fn jam_callback_recording_every_track_does_not_allocate() {
    let format = AudioFormat::new(Codec::L16, 48_000, 2).expect("format");
    let sender = Sender::new(SenderConfig {
        seed: 11,
        ..SenderConfig::new(format, 64)
    })
    .expect("sender");
    let receiver = ReceiverConfig {
        seed: 12,
        ..ReceiverConfig::new(2)
    };
    let take = std::env::temp_dir().join(format!("netjam-no-alloc-jam-record-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&take);
    // 4 s, with the other player's gain turned down so the mix is scaled as it is recorded.
    let (during, stats) = jam_against_reflect("6", sender, receiver, false, 3000, -6.0, Some(&take));
    let _ = std::fs::remove_dir_all(&take);
    assert_eq!(during, 0, "{during} allocations in the recording jam callback");
    assert!(stats.heard.received > 2000, "{:?}", stats.heard);
}
