//! A quiet host, as the JACK bench records it, in virtual time: the far side's audio
//! thread wakes a little late every period (a JACK dummy server on this 2-core VM, its
//! callbacks' start against JACK's own cycle time, as the JACK shell then took it:
//! `periods.wake_late_*` in each player's
//! `--stats-json`), on a loopback path, 48 kHz, 64-frame packets and periods, drift
//! correction on and the `tight` policy, as on the bench.
//!
//! What the bench's quiet series (8 runs, 16 players) recorded: wake-ups late by 79–150 µs
//! on average (median 104), with a standard deviation of 64–254 µs (median 92) and the worst
//! 0.7–1.75 ms in 9,760 periods; at the end of each 13 s run a target of 0.45–1.45 ms
//! (median 0.70), 0.8–2.3 ms added, 2–8 late concealments and 0–3 growths a player. The
//! bench keeps no more of the distribution than that, so the model's wake-ups are the
//! simplest with those moments: 99.2 % normal around 97 µs (40 µs standard deviation), 0.8 %
//! anywhere from 0.2 to 1.6 ms (mean 103 µs, standard deviation 90 µs, the worst about
//! 1.6 ms in 10,000). Each seed starts the two devices at another phase.
//!
//! The model then predicts a target of 0.85–1.45 ms (median 1.15), 1.6–2.7 ms added and 0–7
//! late concealments a run: the glitches as on the bench, the latency at the top of its
//! range. The difference is likely the tail: the bench's standard deviation also counts the
//! wake-ups around its xruns, which come in clusters that a quantile covers only while
//! they last, where the model spreads them evenly over the run.
//!
//! The test holds the model to the bench's range, so a change to playout that would cost
//! latency or glitches on a quiet host shows here before any bench is run. Every seed
//! prints its figures (`--nocapture`).

mod common;

use common::Session;
use netjam_engine::rng::SimRng;
use netjam_engine::time::frames_to_ns;

const RATE: u32 = 48_000;
const FRAMES: u32 = 64;
/// A bench run's length, and where its readings start (the bench's warm-up).
const RUN_NS: u64 = 13_000_000_000;
const WARM_NS: u64 = 3_000_000_000;

/// How late the far side's callback for the period due now starts, ns.
fn quiet_host_wake(rng: &mut SimRng) -> u64 {
    let us = if rng.chance(0.008) {
        rng.uniform(200.0, 1600.0)
    } else {
        (97.0 + 40.0 * rng.normal()).max(0.0)
    };
    (us * 1e3) as u64
}

/// One run's figures at its end, and what happened after the warm-up.
#[derive(Debug)]
struct HostRun {
    wake_mean_us: f64,
    wake_max_us: f64,
    target_ms: f64,
    added_ms: f64,
    late: u64,
    growth: u64,
    concealed_frames: u64,
}

fn run(seed: u64) -> HostRun {
    let mut s = Session::bench_loopback(RATE, FRAMES, seed);
    let mut phase = SimRng::new(seed ^ 0x9a5e);
    s.set_play_phase(phase.uniform(0.0, frames_to_ns(u64::from(FRAMES), RATE) as f64) as u64);
    let mut rng = SimRng::new(seed ^ 0x1a7e);
    let wakes = std::rc::Rc::new(std::cell::RefCell::new((0u64, 0.0f64, 0.0f64)));
    let seen = wakes.clone();
    s.capture_late = Some(Box::new(move |_| {
        let late = quiet_host_wake(&mut rng);
        let mut w = seen.borrow_mut();
        w.0 += 1;
        w.1 += late as f64 / 1e3;
        w.2 = w.2.max(late as f64 / 1e3);
        late
    }));
    s.run(WARM_NS);
    let before = s.receiver.stats().jitter_buffer;
    s.run(RUN_NS - WARM_NS);
    let jb = s.receiver.stats().jitter_buffer;
    let (n, sum, max) = *wakes.borrow();
    HostRun {
        wake_mean_us: sum / n.max(1) as f64,
        wake_max_us: max,
        target_ms: jb.target_ms,
        added_ms: jb.added_latency_recent_ms,
        late: jb.discontinuities.late - before.discontinuities.late,
        growth: jb.discontinuities.growth - before.discontinuities.growth,
        concealed_frames: jb.concealed_frames - before.concealed_frames,
    }
}

#[test]
fn a_quiet_hosts_late_wakeups_cost_what_the_bench_measured_and_no_more() {
    let mut runs: Vec<HostRun> = (1..=8).map(|seed| run(seed * 101)).collect();
    for (i, r) in runs.iter().enumerate() {
        eprintln!(
            "seed {}: wake-ups {:.0} µs late on average, {:.0} at worst; target {:.2} ms, added {:.2} ms; after the warm-up {} late, {} growths, {} frames concealed",
            (i + 1) * 101,
            r.wake_mean_us,
            r.wake_max_us,
            r.target_ms,
            r.added_ms,
            r.late,
            r.growth,
            r.concealed_frames
        );
    }
    runs.sort_by(|a, b| a.target_ms.total_cmp(&b.target_ms));
    let median_target = runs[runs.len() / 2].target_ms;
    let worst_target = runs.last().map_or(0.0, |r| r.target_ms);
    let worst_glitches = runs.iter().map(|r| r.late + r.growth).max().unwrap_or(0);
    eprintln!(
        "model: target median {median_target:.2} ms, worst {worst_target:.2}; late + growths at most {worst_glitches} a run \
         (bench, quiet: target median 0.70, 0.45-1.45; late + growths 2-11 a player)"
    );
    // The bench's range, with room for the model's own spread: a playout that held more
    // latency or glitched more for the same wake-ups would fall outside it.
    assert!(
        median_target <= 1.3 && worst_target <= 1.6,
        "target median {median_target:.2} ms, worst {worst_target:.2}"
    );
    assert!(
        worst_glitches <= 12,
        "{worst_glitches} late or growths in one run"
    );
    for r in &runs {
        assert!(r.added_ms <= 3.0, "{r:?}");
    }
}
