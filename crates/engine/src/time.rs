//! Named conversions between wall time (monotonic nanoseconds) and media time (frames).

/// Nanoseconds per second.
pub const NS_PER_SEC: u64 = 1_000_000_000;

/// Frames elapsed in `ns` of wall time at `rate`, rounded down.
pub fn ns_to_frames(ns: u64, rate: u32) -> u64 {
    (ns as u128 * rate as u128 / NS_PER_SEC as u128) as u64
}

/// Wall time taken by `frames` at `rate`, in nanoseconds (rounded down).
pub fn frames_to_ns(frames: u64, rate: u32) -> u64 {
    (frames as u128 * NS_PER_SEC as u128 / rate.max(1) as u128) as u64
}

/// Milliseconds taken by `frames` at `rate`.
pub fn frames_to_ms(frames: f64, rate: u32) -> f64 {
    frames * 1000.0 / rate.max(1) as f64
}

/// Frames in `ms` milliseconds at `rate`.
pub fn ms_to_frames(ms: f64, rate: u32) -> f64 {
    ms * rate as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn conversions_agree() {
        assert_eq!(ns_to_frames(NS_PER_SEC, 48_000), 48_000);
        assert_eq!(frames_to_ns(64, 48_000), 1_333_333);
        assert_eq!(ns_to_frames(frames_to_ns(441, 44_100), 44_100), 441); // exactly 10 ms
        assert_eq!(ns_to_frames(frames_to_ns(1, 48_000), 48_000), 0); // 20833 ns rounds down
        assert!((frames_to_ms(48.0, 48_000) - 1.0).abs() < 1e-12);
    }
}
