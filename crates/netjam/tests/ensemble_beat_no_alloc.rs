//! Zero heap allocations on the audio thread's side of the shared beat in a jam, proven
//! with the counting allocator: the click advanced by the output latency, where the
//! stream sent stands published every period, and `--delay-to-beat`'s delay line fed by
//! where the stream heard stands, while another thread keeps publishing that.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use netjam::endpoint::Process;
use netjam::ensemble::beat::{BeatClicks, BeatShared};
use netjam::ensemble::beat_delay::{DelayState, StreamMark, Streams};
use netjam_engine::time::frames_to_ns;
use netjam_ensemble::beat::{tempo_share, TempoSegment, TempoView};
use netjam_ensemble::clock::{clock_share, ClockSegment};
use netjam_ensemble::publish;

alloc_count::install!();

const FRAMES: u32 = 64;

/// A jam stand-in: sends one stream and hears another, both advancing a period at a time.
struct Streaming {
    ts: u32,
}

impl Streams for Streaming {
    fn sent(&self) -> Option<(u32, u32, u32)> {
        Some((1, self.ts, 48_000))
    }
    fn heard(&self) -> Option<(u32, u32)> {
        Some((2, self.ts))
    }
}

impl Process for Streaming {
    fn process(&mut self, _now_ns: u64, _input: &[f32], output: &mut [f32]) {
        output.fill(0.25);
        self.ts = self.ts.wrapping_add(FRAMES);
    }
}

#[test]
fn the_beat_the_marks_and_the_delay_line_do_not_allocate() {
    let (mut clock_w, clock) = clock_share();
    clock_w.publish(ClockSegment {
        local_origin_ns: 0,
        ensemble_origin_ns: 0,
        rate: 0.0,
    });
    let (mut tempo_w, tempo) = tempo_share();
    tempo_w.publish(TempoView {
        current: Some(TempoSegment {
            start_ns: 0,
            start_beat: 0.0,
            bpm: 120.0,
            by: 1,
        }),
        next: None,
    });
    let shared = Arc::new(BeatShared::default());
    shared.delay_beats.store(1, Ordering::Relaxed);
    shared.output_latency_frames.store(256, Ordering::Relaxed);
    shared.input_latency_frames.store(128, Ordering::Relaxed);
    let (sent_w, sent_r) = publish::share::<StreamMark>();
    let (mut heard_w, heard_r) = publish::share::<StreamMark>();
    let mut p = BeatClicks::with_readers(
        Streaming { ts: 0 },
        clock,
        tempo,
        shared.clone(),
        48_000,
        2,
        -12.0,
    )
    .with_marks(sent_w, heard_r, Some(2_000_000_000));
    let start = netjam::clock::now_ns();
    // How many marks the other thread has published: the audio loop waits for a fresh one
    // every simulated second, so a busy machine that starves that thread cannot leave the
    // line with nothing heard (the loop itself runs far faster than real time).
    let echoes = Arc::new(AtomicU64::new(0));
    let echoes_seen = echoes.clone();
    let audio = std::thread::spawn(move || {
        let input = vec![0f32; FRAMES as usize * 2];
        let mut output = vec![0f32; FRAMES as usize * 2];
        let before = alloc_count::allocations();
        alloc_count::prove_counting();
        // 10 s of periods.
        for k in 0..7_500u64 {
            if k % 750 == 1 {
                let seen = echoes_seen.load(Ordering::Acquire);
                let waited = std::time::Instant::now();
                while echoes_seen.load(Ordering::Acquire) == seen
                    && waited.elapsed() < std::time::Duration::from_secs(10)
                {
                    std::thread::yield_now();
                }
            }
            let now = start + frames_to_ns(k * u64::from(FRAMES), 48_000);
            p.process(now, &input, &mut output);
        }
        alloc_count::allocations() - before - 1
    });
    // The heard stream: the one sent, 20 ms earlier.
    let mut published = 0u64;
    while !audio.is_finished() {
        if let Some(m) = sent_r.get() {
            heard_w.publish(StreamMark {
                ssrc: 2,
                ensemble_ns: m.ensemble_ns - 20_000_000,
                ..m
            });
            echoes.fetch_add(1, Ordering::Release);
        }
        published += 1;
        std::thread::yield_now();
    }
    let allocs = audio.join().expect("audio thread");
    assert_eq!(allocs, 0, "the audio thread allocated");
    assert!(published > 0);
    // The sender's mark moved on with the stream; the line ran.
    assert!(sent_r.get().is_some_and(|m| m.ssrc == 1 && m.rtp_ts > 0));
    let state = DelayState::from_word(shared.delay_state.load(Ordering::Relaxed), 0);
    assert!(matches!(state, DelayState::OnBeat { .. }), "{state:?}");
    assert!(shared.clicks.load(Ordering::Relaxed) >= 15);
}
