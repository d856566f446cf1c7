//! The output limiter's cost; prints its figures. Run: `cargo bench -p netjam-engine --bench limiter`.
//!
//! CPU per 64-frame stereo period at 48 kHz of [`Mixer::finish`] (master gain and limiter):
//! a mix below the knee (the bit-exact path), a mix being limited (four tones at −6 dBFS),
//! and a master gain ramping; and, for scale, the whole mix of four members.

use std::hint::black_box;
use std::time::Instant;

use netjam_engine::mixer::Mixer;

const FRAMES: usize = 64;
const PERIODS: usize = 200_000;

/// Four stereo members, a tone each at `amp`, one period's worth per member.
fn members(amp: f32, periods: usize) -> Vec<Vec<f32>> {
    [220.0f32, 330.0, 550.0, 660.0]
        .iter()
        .map(|hz| {
            (0..FRAMES * periods)
                .flat_map(|i| {
                    let x = amp * (std::f32::consts::TAU * hz * (i % 48_000) as f32 / 48_000.0).sin();
                    [x, x]
                })
                .collect()
        })
        .collect()
}

/// µs per period of `finish` alone, and of the whole mix (begin, four adds, finish).
fn measure(amp: f32, master_steps: bool) -> (f64, f64) {
    // 750 periods of input (a second), played round.
    let input = members(amp, 750);
    let mut mixer = Mixer::new(4, 2, 48_000);
    let mut out = [0.0f32; FRAMES * 2];
    let mut sums = vec![[0.0f32; FRAMES * 2]; 750];
    for (k, sum) in sums.iter_mut().enumerate() {
        mixer.begin(sum);
        for (slot, x) in input.iter().enumerate() {
            mixer.add(slot, &x[k * FRAMES * 2..(k + 1) * FRAMES * 2], 2, sum);
        }
    }
    let start = Instant::now();
    for k in 0..PERIODS {
        if master_steps && k % 100 == 0 {
            mixer.set_master_gain_db(if k % 200 == 0 { -3.0 } else { 0.0 });
        }
        out.copy_from_slice(&sums[k % 750]);
        mixer.finish(black_box(&mut out));
    }
    let finish = start.elapsed().as_secs_f64() * 1e6 / PERIODS as f64;
    let start = Instant::now();
    for k in 0..PERIODS {
        let p = k % 750;
        mixer.begin(&mut out);
        for (slot, x) in input.iter().enumerate() {
            mixer.add(slot, &x[p * FRAMES * 2..(p + 1) * FRAMES * 2], 2, &mut out);
        }
        mixer.finish(black_box(&mut out));
    }
    let whole = start.elapsed().as_secs_f64() * 1e6 / PERIODS as f64;
    (finish, whole)
}

fn main() {
    println!("limiter, 48 kHz stereo, {FRAMES}-frame periods ({PERIODS} periods each):");
    for (what, amp, steps) in [
        ("below the knee (four tones at -18 dBFS)", 0.125, false),
        ("limiting (four tones at -6 dBFS)", 0.5, false),
        ("master gain ramping every 100 periods, limiting", 0.5, true),
    ] {
        let (finish, whole) = measure(amp, steps);
        println!("  {what}: finish {finish:.3} us/period; whole mix of four members {whole:.3} us/period");
    }
}
