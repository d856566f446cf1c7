//! The sound-card endpoint's callback path — input bridge, period adapter, sample
//! conversion, timing — allocates nothing per callback in steady state, whatever the
//! callback sizes and sample formats. Driven through `OfflineCallbacks`, which runs exactly
//! what cpal's input and output callbacks run, on this thread, counted by the per-thread
//! counting allocator.
#![cfg(feature = "cpal")]

use netjam::endpoint::cpal::{DeviceSample, OfflineCallbacks};
use netjam::endpoint::{Process, StreamSpec};

alloc_count::install!();

/// Plays back what it captures (or a constant when one side is missing), remembers nothing.
struct Echo {
    periods: u64,
    last_now: u64,
    monotonic: bool,
}

impl Process for Echo {
    fn process(&mut self, now_ns: u64, input: &[f32], output: &mut [f32]) {
        if input.len() == output.len() {
            output.copy_from_slice(input);
        } else {
            output.fill(0.5);
        }
        self.monotonic &= now_ns > self.last_now;
        self.last_now = now_ns;
        self.periods += 1;
    }
}

/// Run 2000 callbacks of sizes cycling through `sizes` in sample type `T`; returns the
/// allocations made after the first 200 and the periods run.
fn run<T: DeviceSample + Default + Clone>(spec: StreamSpec, sizes: &[usize]) -> (u64, Echo) {
    let mut cb = OfflineCallbacks::new(spec);
    let mut echo = Echo {
        periods: 0,
        last_now: 0,
        monotonic: true,
    };
    let most = sizes.iter().max().copied().unwrap_or(1);
    let ci = spec.input_channels as usize;
    let co = spec.output_channels as usize;
    let input = vec![T::default(); most * ci];
    let mut output = vec![T::default(); most * co];
    let mut from = 0;
    cb.with_process(&mut echo, |cb| {
        for (k, &n) in sizes.iter().cycle().take(2000).enumerate() {
            if k == 200 {
                from = alloc_count::allocations();
                // One counted allocation on purpose: the counter moves inside the region.
                alloc_count::prove_counting();
                from += 1;
            }
            if ci > 0 {
                cb.input(&input[..n * ci]);
            }
            if co > 0 {
                cb.output(&mut output[..n * co]);
            }
        }
    });
    (alloc_count::allocations() - from, echo)
}

fn spec(input_channels: u16, output_channels: u16) -> StreamSpec {
    StreamSpec {
        rate: 48_000,
        input_channels,
        output_channels,
        period: 64,
    }
}

#[test]
fn the_counter_counts_this_thread() {
    let (n, _) = alloc_count::count(|| drop(std::hint::black_box(vec![1u8; 10])));
    assert_eq!(n, 1);
}

#[test]
fn duplex_callbacks_of_odd_sizes_allocate_nothing_in_any_format() {
    let sizes = [1, 63, 64, 65, 100, 128, 191, 192, 7, 64];
    let (a, e) = run::<f32>(spec(2, 2), &sizes);
    assert_eq!(a, 0, "f32 callbacks allocated");
    assert!(e.periods > 1000 && e.monotonic, "{} periods", e.periods);
    let (a, e) = run::<i16>(spec(2, 2), &sizes);
    assert_eq!(a, 0, "i16 callbacks allocated");
    assert!(e.periods > 1000 && e.monotonic);
    let (a, e) = run::<i32>(spec(1, 1), &sizes);
    assert_eq!(a, 0, "i32 callbacks allocated");
    assert!(e.periods > 1000 && e.monotonic);
}

#[test]
fn one_direction_callbacks_allocate_nothing() {
    let sizes = [17, 64, 200, 3];
    let (a, e) = run::<f32>(spec(2, 0), &sizes);
    assert_eq!(a, 0, "capture-only callbacks allocated");
    assert!(e.periods > 400);
    let (a, e) = run::<i16>(spec(0, 2), &sizes);
    assert_eq!(a, 0, "playback-only callbacks allocated");
    assert!(e.periods > 400);
}

#[test]
fn a_buffer_larger_than_the_staging_area_is_handled_in_slices() {
    let big = netjam::endpoint::cpal::STAGING_FRAMES * 2 + 37;
    let (a, e) = run::<f32>(spec(2, 2), &[big]);
    assert_eq!(a, 0);
    assert!(e.periods as usize >= 1800 * big / 64, "{} periods", e.periods);
}
