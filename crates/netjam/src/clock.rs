//! The process's monotonic clock as a nanosecond count, the only wall time netjam uses.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Monotonic nanoseconds since the first call in this process.
pub fn now_ns() -> u64 {
    epoch().elapsed().as_nanos() as u64
}

/// Sleep until the monotonic time `deadline_ns` (absolute, so a late wake-up does not shift
/// later deadlines). Sleeps coarsely, then spins the last stretch for sub-100 µs accuracy.
pub fn sleep_until_ns(deadline_ns: u64) {
    sleep_until_spinning(deadline_ns, 150_000);
}

/// [`sleep_until_ns`] spinning only the last `spin_ns`: a caller that wakes very often spins
/// less, so it does not occupy a core.
pub fn sleep_until_spinning(deadline_ns: u64, spin_ns: u64) {
    loop {
        let now = now_ns();
        if now >= deadline_ns {
            return;
        }
        let left = deadline_ns - now;
        if left > spin_ns {
            std::thread::sleep(Duration::from_nanos(left - spin_ns));
        } else {
            std::hint::spin_loop();
        }
    }
}
