//! The Opus edge resampler runs on the audio path: once built, pushing a device's periods
//! in at its rate and popping 48 kHz frames out (and back the other way) allocates nothing.
//! So does a 48 kHz process running on a 44.1 kHz device through both edges. Counted with
//! the per-thread counting allocator on the thread that runs it.

use netjam::endpoint::Process;
use netjam::resample::{EdgeProcess, EdgeResampler};

alloc_count::install!();

#[test]
fn resampling_a_period_allocates_nothing() {
    const PERIOD: usize = 64;
    const CHANNELS: usize = 2;
    let mut up = EdgeResampler::new(44_100, 48_000, CHANNELS, PERIOD).expect("build");
    let mut down = EdgeResampler::new(48_000, 44_100, CHANNELS, PERIOD).expect("build");
    let period: Vec<f32> = (0..PERIOD * CHANNELS)
        .map(|i| ((i / CHANNELS) as f32 * 0.0627).sin() * 0.5)
        .collect();
    // Popped in pieces of another size than pushed, as a 48 kHz consumer would.
    let mut at_48k = vec![0.0f32; 70 * CHANNELS];
    let mut back = vec![0.0f32; PERIOD * CHANNELS];
    let (mut popped_up, mut popped_down) = (0, 0);
    let mut energy = 0.0f32;

    let before = alloc_count::allocations();
    alloc_count::prove_counting();
    for _ in 0..1_000 {
        up.push(&period);
        let n = up.pop(&mut at_48k);
        popped_up += n;
        down.push(&at_48k[..n * CHANNELS]);
        let m = down.pop(&mut back);
        popped_down += m;
        energy += back[..m * CHANNELS].iter().map(|x| x * x).sum::<f32>();
    }
    let allocated = alloc_count::allocations() - before - 1;

    assert_eq!(allocated, 0, "the edge resampler allocated on the audio path");
    // 1000 periods of 64 frames at 44.1 kHz are 69,660 frames at 48 kHz, less what the
    // filter still holds; and about as many came back at 44.1 kHz.
    assert!((69_000..=69_660).contains(&popped_up), "{popped_up}");
    assert!((63_000..=64_000).contains(&popped_down), "{popped_down}");
    assert_eq!((up.overflowed(), down.overflowed()), (0, 0));
    assert!(energy > 1_000.0, "the signal came through: {energy}");
}

/// Plays back what it captures.
struct Echo(u64);

impl Process for Echo {
    fn process(&mut self, _now_ns: u64, input: &[f32], output: &mut [f32]) {
        output.copy_from_slice(input);
        self.0 += (input.len() / 2) as u64;
    }
}

#[test]
fn a_process_behind_both_edges_allocates_nothing() {
    const PERIOD: usize = 64;
    let mut p = EdgeProcess::new(Echo(0), 44_100, PERIOD, 2, 2).expect("build");
    let input: Vec<f32> = (0..PERIOD * 2)
        .map(|i| ((i / 2) as f32 * 0.0627).sin() * 0.5)
        .collect();
    let mut output = vec![0.0f32; PERIOD * 2];
    let mut energy = 0.0f32;

    let before = alloc_count::allocations();
    alloc_count::prove_counting();
    for k in 0..1_000u64 {
        p.process(k, &input, &mut output);
        energy += output.iter().map(|x| x * x).sum::<f32>();
    }
    let allocated = alloc_count::allocations() - before - 1;

    assert_eq!(allocated, 0, "a device callback through the Opus edges allocated");
    assert_eq!(p.underruns(), 0);
    // The process saw the 48 kHz frames of 1000 periods at 44.1 kHz: 69,660 less the filter's.
    assert!((69_000..=69_660).contains(&p.inner().0), "{}", p.inner().0);
    assert!(energy > 1_000.0, "the signal came through: {energy}");
}
