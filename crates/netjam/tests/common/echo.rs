//! A `Process` for endpoints on a real clock (JACK, the sound card): it plays back what it
//! captures and counts what the callback thread allocates.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use netjam::endpoint::{Endpoint, PeriodStats, Process};

/// Plays back what it captures; counts what the callback thread allocates from its first
/// period on, and keeps each period's time in memory reserved before the stream starts.
/// Needs `alloc_count::install!()` in the test binary.
#[derive(Debug)]
pub struct Echo {
    pub times: Vec<u64>,
    pub frames_seen: usize,
    /// The callback thread's allocation count at the first period, and how many it made
    /// since.
    first: Option<u64>,
    pub allocations: u64,
    /// What the counter saw of one deliberate allocation made on the callback thread in
    /// the first period: 1 proves the counter moves there (it is not part of `allocations`).
    pub deliberate: u64,
}

impl Echo {
    /// Room for the times of `periods` periods.
    pub fn new(periods: usize) -> Self {
        Self {
            times: Vec::with_capacity(periods),
            frames_seen: 0,
            first: None,
            allocations: 0,
            deliberate: 0,
        }
    }
}

impl Process for Echo {
    fn process(&mut self, now_ns: u64, input: &[f32], output: &mut [f32]) {
        // Everything the callback thread allocates after the first period's `process` shows
        // up here: the rest of that callback and every later one (up to this call).
        let now = alloc_count::allocations();
        let first = match self.first {
            Some(first) => first,
            None => {
                // One allocation on purpose, inside the measured region, to prove the
                // counter of this thread moves at all.
                drop(std::hint::black_box(Box::new(now)));
                self.deliberate = alloc_count::allocations() - now;
                self.first = Some(now);
                now
            }
        };
        self.allocations = now - first - self.deliberate.min(now - first);
        output.copy_from_slice(input);
        self.frames_seen += input.len();
        if self.times.len() < self.times.capacity() {
            self.times.push(now_ns);
        }
    }
}

/// Run `endpoint` with `process` until it stops on its own, or for `limit` at most;
/// returns its period statistics and how long it ran.
pub fn run_at_most(
    endpoint: Box<dyn Endpoint>,
    process: &mut dyn Process,
    limit: Duration,
) -> (PeriodStats, Duration) {
    let stop = Arc::new(AtomicBool::new(false));
    // The watchdog wakes as soon as `run` returns.
    let (done, finished) = mpsc::channel::<()>();
    let watchdog = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let _ = finished.recv_timeout(limit);
            stop.store(true, Ordering::Relaxed);
        })
    };
    let started = Instant::now();
    let (_, periods) = endpoint.run(process, stop).expect("run");
    let took = started.elapsed();
    drop(done);
    let _ = watchdog.join();
    (periods, took)
}
