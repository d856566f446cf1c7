//! A sender that restarts mid-stream (new SSRC, new sequence and timestamps) is followed
//! by the same receiver, which plays the new stream within its target plus one packet.

mod common;

use common::{sender_config, Session};
use netjam_engine::link::LinkConfig;
use netjam_engine::receiver::ReceiverEvent;
use netjam_engine::sender::Sender;
use netjam_engine::time::frames_to_ns;
use netjam_engine::wire::{AudioFormat, Codec};

#[test]
fn restarted_sender_is_heard_within_target_plus_one_packet() {
    let format = AudioFormat::new(Codec::F32, 48_000, 2).expect("format");
    let link = LinkConfig {
        delay_ns: 19_000_000,
        jitter_ns: 500_000,
        ..LinkConfig::ideal()
    };
    let mut s = Session::new(format, 64, 0, link, 11);
    s.run(2_000_000_000);
    // The sender process dies; 300 ms later a new one starts.
    let restart_at = s.now + 300_000_000;
    let mut dead = Sender::new(sender_config(format, 64, 0, 999)).expect("sender");
    std::mem::swap(&mut s.sender, &mut dead);
    let played_before = s.played.len();
    // Run the silent gap with a sender that sends nothing (capture is skipped by muting).
    let gap_end = restart_at;
    while s.now < gap_end {
        // Let the receiver play on while nothing is sent.
        let step = frames_to_ns(64, 48_000);
        let mut out = vec![0.0; 128];
        s.now += step;
        s.receiver.play(s.now, &mut out);
        s.played.extend_from_slice(&out);
        s.play_times.push(s.now);
    }
    let _ = played_before;
    let first_new_sample = s.sent.len();
    s.reset_clocks_at(restart_at);
    s.run(1_000_000_000);
    let starts: Vec<_> = s
        .events
        .iter()
        .filter(|e| matches!(e, ReceiverEvent::StreamStarted { .. }))
        .collect();
    assert_eq!(starts.len(), 2, "{:?}", s.events);
    assert!(matches!(
        starts[1],
        ReceiverEvent::StreamStarted { restart: true, .. }
    ));
    // The first new packet leaves the sender one packet after the restart and arrives
    // 19 ms (± jitter) later. Find when its first frame was played.
    let probe = &s.sent[first_new_sample..first_new_sample + 2 * 32];
    let pos = s
        .played
        .windows(probe.len())
        .position(|w| w == probe)
        .expect("new stream played")
        / 2;
    let period_idx = pos / 64;
    let heard_ns = s.play_times[period_idx] + frames_to_ns((pos % 64) as u64, 48_000);
    let first_arrival = restart_at + frames_to_ns(64, 48_000) + 19_000_000;
    let waited_ms = (heard_ns as f64 - first_arrival as f64) / 1e6;
    let st = s.receiver.stats().jitter_buffer;
    let allowed_ms = st.target_ms + 1.333 /* period */ + 1.333 /* one packet */ + 0.5 /* jitter */;
    assert!(
        waited_ms <= allowed_ms,
        "heard {waited_ms:.2} ms after arrival; allowed {allowed_ms:.2}"
    );
    assert!(st.relocks >= 1, "the restart re-locks: {st:?}");
}
