//! Zero heap allocations per period in steady state for clock-drift correction, proven
//! with a counting allocator: packets into the estimator, and per device period the depth
//! loop, the input count, the resampler (stereo and a muted discard), the envelope and the
//! stats snapshot.

use netjam_engine::drift::{DriftCorrector, DriftLoopConfig};
use netjam_engine::rng::SimRng;

alloc_count::install!();

fn allocs() -> u64 {
    alloc_count::allocations()
}

#[test]
fn drift_correction_does_not_allocate_per_period() {
    // The counter sees this thread's allocations.
    let before = allocs();
    drop(std::hint::black_box(vec![1u8; 16]));
    assert_eq!(allocs(), before + 1);

    const RATE: u32 = 48_000;
    const PERIOD: usize = 64;
    let mut dc = DriftCorrector::new(RATE, 8, 256, DriftLoopConfig::default());
    let mut rng = SimRng::new(7);
    let mut input = vec![0.1f32; 2 * 2 * 256];
    let mut out = vec![0.0f32; 2 * 256];
    let sender_ns = 1e9 * PERIOD as f64 / (RATE as f64 * (1.0 + 150e-6));
    let device_ns = 1e9 * PERIOD as f64 / (RATE as f64 * (1.0 - 80e-6));
    let mut k = 0u64;
    let mut play = 0u64;
    let mut measured = 0u64;
    let periods = 20_000u64; // 27 s: a hundred estimator windows and refits
    for j in 0..periods {
        if j == 5_000 {
            measured = allocs();
            // One counted allocation on purpose: the counter moves inside the region.
            alloc_count::prove_counting();
            measured += 1;
        }
        let now = 1e9 + j as f64 * device_ns;
        loop {
            let arrival = 1e9 + (k + 1) as f64 * sender_ns + 10e6 + rng.uniform(0.0, 2e6);
            if arrival > now {
                break;
            }
            dc.on_packet(arrival as u64, k * PERIOD as u64);
            k += 1;
        }
        let floor = dc
            .estimator()
            .earliest_arrival_ns(play)
            .unwrap_or(1e9 as u64 + play * 20_833);
        let err = now as i64 - floor as i64 - 3_000_000;
        let need = dc.begin_period(now as u64, PERIOD, err);
        if j % 10 == 0 {
            dc.discard(2, &input[..2 * need], PERIOD).expect("discard");
        } else {
            dc.resample(2, &input[..2 * need], &mut out[..2 * PERIOD])
                .expect("resample");
        }
        input[0] = -input[0];
        play += need as u64;
        std::hint::black_box(dc.stats());
        if j == 15_000 {
            // A re-locked stream on the realtime path.
            dc.relock();
        }
        if j == 17_000 {
            // A new format (same rate) on the realtime path.
            dc.reset(RATE);
        }
    }
    let during = allocs() - measured;
    let st = dc.stats();
    assert!(st.estimator.ratio_ppm.is_some(), "{st:?}");
    assert_eq!(during, 0, "{during} allocations in {} periods", periods - 5_000);
}
