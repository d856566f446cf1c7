//! Stream benchmarks; prints its figures. Run: `cargo bench -p netjam --bench stream`.
//!
//! 1. CPU per packet, send and receive, 48 kHz stereo L16, 64 frames (target < 5 µs each).
//! 2. Added one-way latency of the receiver on clean loopback, 48 kHz / 64 frames
//!    (target ≤ one packet, 1.33 ms, + 0.5 ms).
//! 3. With 1 ms of jitter on the link: the adaptive buffer's depth and underrun rate.
//!
//! Each latency case runs a second time with a steady 440 Hz tone instead of music, and
//! prints what a listener hears of it (`netjam_engine::listen`: the worst pitch error in
//! cents, the glitch windows, the tone's level), beside the buffer's own counts.

use std::time::Instant;

use netjam::loopback::{run_loopback, LoopbackOptions, LoopbackReport};
use netjam_engine::delay::BufferMode;
use netjam_engine::link::{JitterDist, LinkConfig};
use netjam_engine::listen::{listen, Tones};
use netjam_engine::receiver::{Receiver, ReceiverConfig};
use netjam_engine::sender::{Sender, SenderConfig};
use netjam_engine::synth::{Synth, SynthKind};
use netjam_engine::time::frames_to_ns;
use netjam_engine::wire::{AudioFormat, Codec};

fn cpu_per_packet(redundancy: usize) {
    let format = AudioFormat::new(Codec::L16, 48_000, 2).expect("format");
    let mut sender = Sender::new(SenderConfig {
        redundancy,
        seed: 1,
        ..SenderConfig::new(format, 64)
    })
    .expect("sender");
    let mut receiver = Receiver::new(ReceiverConfig {
        seed: 2,
        ..ReceiverConfig::new(2)
    });
    let mut synth = Synth::new(SynthKind::Music { bpm: 120.0 }, 48_000, 2, 1);
    const N: usize = 200_000;
    let mut frames = vec![0.0f32; 64 * 2 * 1000];
    synth.fill(&mut frames);
    // Pre-build the packets so the receive timing excludes the sender.
    let mut packets: Vec<Vec<u8>> = Vec::with_capacity(N);
    let t0 = Instant::now();
    for k in 0..N {
        let block = &frames[(k % 1000) * 128..(k % 1000 + 1) * 128];
        sender.push_frames(k as u64, block, |p| packets.push(p.to_vec()));
    }
    let send_ns = t0.elapsed().as_nanos() as f64 / N as f64;
    // Subtract the cost of copying packets out (measured alone).
    let t0 = Instant::now();
    let mut sink = Vec::with_capacity(N);
    for p in &packets {
        sink.push(p.to_vec());
    }
    let copy_ns = t0.elapsed().as_nanos() as f64 / N as f64;
    drop(sink);
    let period = frames_to_ns(64, 48_000);
    let mut out = vec![0.0f32; 128];
    let t0 = Instant::now();
    for (k, p) in packets.iter().enumerate() {
        receiver.on_datagram(k as u64 * period + 5_000_000, p);
    }
    let rx_ns = t0.elapsed().as_nanos() as f64 / N as f64;
    // Playout measured on a fresh receiver fed in step, one packet per period.
    let mut receiver2 = Receiver::new(ReceiverConfig {
        seed: 3,
        ..ReceiverConfig::new(2)
    });
    let mut play_total = 0u128;
    let t_all = Instant::now();
    for (k, p) in packets.iter().enumerate() {
        let now = k as u64 * period + 5_000_000;
        receiver2.on_datagram(now, p);
        let t = Instant::now();
        receiver2.play(now + 300_000, &mut out);
        play_total += t.elapsed().as_nanos();
    }
    let both_ns = t_all.elapsed().as_nanos() as f64 / N as f64;
    let play_ns = play_total as f64 / N as f64;
    assert_eq!(receiver2.stats().jitter_buffer.concealment_events, 0);
    println!(
        "cpu per packet, 48 kHz stereo L16, 64 frames, redundancy {redundancy}:  send {:.0} ns   receive {:.0} ns   playout {:.0} ns   receive+playout {:.0} ns",
        send_ns - copy_ns,
        rx_ns,
        play_ns,
        both_ns
    );
}

fn latency(name: &str, link: Option<LinkConfig>, seconds: f64, drift_correction: bool) -> LoopbackReport {
    let r = latency_of(
        name,
        link.clone(),
        seconds,
        drift_correction,
        SynthKind::Music { bpm: 120.0 },
        None,
    );
    listened(name, link, seconds, drift_correction);
    r
}

/// The tone the listener's pass plays, Hz.
const TONE_HZ: f64 = 440.0;

/// The same case with a steady tone, played into a WAV file and judged as a listener would.
fn listened(name: &str, link: Option<LinkConfig>, seconds: f64, drift_correction: bool) {
    let dir = std::env::temp_dir().join(format!("netjam-bench-stream-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temporary directory");
    let wav = dir.join("heard.wav");
    let r = latency_of(
        &format!("{name}, {TONE_HZ} Hz tone"),
        link,
        seconds,
        drift_correction,
        SynthKind::Sine { hz: TONE_HZ },
        Some(wav.clone()),
    );
    let (samples, rate) = netjam::endpoint::wav::read_first_channel(&wav).expect("the tone's recording");
    let _ = std::fs::remove_dir_all(&dir);
    // The first second holds the stream's start and the buffer settling.
    let tones = Tones::present(&[TONE_HZ]).skip(1.0);
    match listen(&samples, rate, &tones) {
        Ok(l) => println!(
            "  heard: {} (jitter buffer: {} discontinuities)",
            l.summary, r.receiver.jitter_buffer.discontinuities.events
        ),
        Err(e) => println!("  heard: not measured: {e}"),
    }
}

fn latency_of(
    name: &str,
    link: Option<LinkConfig>,
    seconds: f64,
    drift_correction: bool,
    source: SynthKind,
    output: Option<std::path::PathBuf>,
) -> LoopbackReport {
    let options = LoopbackOptions {
        format: AudioFormat::new(Codec::L16, 48_000, 2).expect("format"),
        frames_per_packet: 64,
        redundancy: 0,
        buffer: BufferMode::default(),
        period: 64,
        link,
        events: Default::default(),
        seed: 7,
        duration_s: seconds,
        source,
        output,
        sender_name: "bench".into(),
        receiver_name: "bench".into(),
        drift_correction,
    };
    let r = run_loopback(&options, |_| {}).expect("loopback session");
    let jb = r.receiver.jitter_buffer;
    let periods = r.playout.periods.max(1);
    println!(
        "{name}: added latency mean {:.3} ms (max {:.3}), target {:.3} ms, depth {:.3} ms, PDV p99 {:.3} ms, underrun periods {} of {} ({:.3} %), concealed {} frames, playout wake-up late mean {:.1} µs",
        jb.added_latency_ms,
        jb.added_latency_max_ms,
        jb.target_ms,
        jb.depth_ms,
        jb.pdv_p99_ms,
        jb.underrun_periods,
        periods,
        100.0 * jb.underrun_periods as f64 / periods as f64,
        jb.concealed_frames,
        r.playout.wake_late_mean_us
    );
    r
}

fn main() {
    // `cargo test` runs bench targets with --bench only when asked; be quick when listed.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    for red in [0, 1] {
        cpu_per_packet(red);
    }
    latency("clean loopback, 48 kHz / 64 frames, 10 s", None, 10.0, false);
    latency(
        "clean loopback, 48 kHz / 64 frames, 10 s, drift correction",
        None,
        10.0,
        true,
    );
    let jitter = LinkConfig {
        jitter_ns: 1_000_000,
        jitter_dist: JitterDist::Uniform,
        delay_ns: 1_000_000,
        ..LinkConfig::ideal()
    };
    latency(
        "1 ms uniform jitter (±1 ms on 1 ms), 48 kHz / 64 frames, 20 s",
        Some(jitter),
        20.0,
        false,
    );
}
