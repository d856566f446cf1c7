//! OSC time tags: 64-bit NTP timestamps (32 bits of seconds since 1900, 32 bits of
//! fraction), with the special value 1 meaning "immediately".
//!
//! This module converts between time tags and wall time (`SystemTime`, UNIX seconds).
//! It never reads the clock itself: callers pass the time in.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Seconds from the NTP epoch (1900-01-01) to the UNIX epoch (1970-01-01).
pub const NTP_UNIX_OFFSET: u64 = 2_208_988_800;

/// An OSC time tag in NTP format.
///
/// Ordering compares the raw 64-bit value, which is chronological within one NTP era
/// (1900–2036) and treats [`TimeTag::IMMEDIATELY`] as the earliest time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct TimeTag(pub u64);

impl TimeTag {
    /// The special time tag meaning "process immediately" (OSC 1.0).
    pub const IMMEDIATELY: TimeTag = TimeTag(1);

    /// Builds a time tag from NTP seconds and fraction (units of 2^-32 s).
    pub const fn new(seconds: u32, fraction: u32) -> Self {
        TimeTag(((seconds as u64) << 32) | fraction as u64)
    }

    /// Whole seconds since the NTP epoch (modulo 2^32).
    pub const fn seconds(self) -> u32 {
        (self.0 >> 32) as u32
    }

    /// Fraction of a second in units of 2^-32 s.
    pub const fn fraction(self) -> u32 {
        self.0 as u32
    }

    /// Whether this is the special "immediately" value.
    pub const fn is_immediate(self) -> bool {
        self.0 == 1
    }

    /// Converts UNIX seconds (may be fractional) to a time tag. Values outside what the
    /// NTP format can hold saturate; NaN becomes [`TimeTag::IMMEDIATELY`].
    pub fn from_unix_secs_f64(unix: f64) -> Self {
        if unix.is_nan() {
            return Self::IMMEDIATELY;
        }
        let ntp = unix + NTP_UNIX_OFFSET as f64;
        if ntp <= 0.0 {
            return TimeTag(0);
        }
        let max = (u64::MAX >> 32) as f64 + 1.0;
        if ntp >= max {
            return TimeTag(u64::MAX);
        }
        let secs = ntp.floor();
        let frac = ((ntp - secs) * 4_294_967_296.0) as u64;
        TimeTag(((secs as u64) << 32) | frac.min(u32::MAX as u64))
    }

    /// Converts to UNIX seconds. Seconds values with the top bit clear are taken to be
    /// in NTP era 1 (after 2036-02-07), as RFC 4330 suggests.
    pub fn to_unix_secs_f64(self) -> f64 {
        let secs = self.unix_seconds_i64() as f64;
        secs + self.fraction() as f64 / 4_294_967_296.0
    }

    fn unix_seconds_i64(self) -> i64 {
        let s = self.seconds() as i64;
        let era_adjusted = if s < 0x8000_0000 { s + (1i64 << 32) } else { s };
        era_adjusted - NTP_UNIX_OFFSET as i64
    }

    /// Converts wall time to a time tag (times before 1900 saturate to 0).
    pub fn from_system_time(t: SystemTime) -> Self {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => {
                let secs = d.as_secs().wrapping_add(NTP_UNIX_OFFSET) & 0xFFFF_FFFF;
                let frac = ((d.subsec_nanos() as u64) << 32) / 1_000_000_000;
                TimeTag((secs << 32) | frac)
            }
            Err(e) => Self::from_unix_secs_f64(-e.duration().as_secs_f64()),
        }
    }

    /// Converts to wall time. [`TimeTag::IMMEDIATELY`] has no wall time of its own and
    /// converts like any other value; check [`TimeTag::is_immediate`] first.
    pub fn to_system_time(self) -> SystemTime {
        let secs = self.unix_seconds_i64();
        let nanos = ((self.fraction() as u64 * 1_000_000_000) >> 32) as u32;
        let t = if secs >= 0 {
            UNIX_EPOCH.checked_add(Duration::new(secs as u64, nanos))
        } else {
            UNIX_EPOCH
                .checked_sub(Duration::from_secs(secs.unsigned_abs()))
                .and_then(|t| t.checked_add(Duration::from_nanos(nanos as u64)))
        };
        // Every NTP value fits a 64-bit SystemTime; fall back to the epoch on a platform
        // whose SystemTime is narrower.
        t.unwrap_or(UNIX_EPOCH)
    }

    /// This time tag moved later by `d` (saturating).
    pub fn add_duration(self, d: Duration) -> Self {
        if d.as_secs() > u32::MAX as u64 {
            return TimeTag(u64::MAX);
        }
        let frac = ((d.subsec_nanos() as u64) << 32) / 1_000_000_000;
        let delta = (d.as_secs() << 32).saturating_add(frac);
        TimeTag(self.0.saturating_add(delta))
    }

    /// The time tag a nested bundle really carries: OSC 1.0 says a contained bundle's
    /// time tag must not be earlier than its parent's, so an earlier one is read as the
    /// parent's.
    pub fn nested_in(self, parent: TimeTag) -> TimeTag {
        if self < parent {
            parent
        } else {
            self
        }
    }
}

impl From<SystemTime> for TimeTag {
    fn from(t: SystemTime) -> Self {
        Self::from_system_time(t)
    }
}

impl std::fmt::Display for TimeTag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_immediate() {
            f.write_str("immediately")
        } else {
            write!(f, "{:08x}.{:08x}", self.seconds(), self.fraction())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn immediate_is_one() {
        assert_eq!(TimeTag::IMMEDIATELY.0, 1);
        assert!(TimeTag::new(0, 1).is_immediate());
    }

    #[test]
    fn unix_round_trip() {
        let t = TimeTag::from_unix_secs_f64(1_700_000_000.25);
        assert_eq!(t.seconds() as u64, 1_700_000_000 + NTP_UNIX_OFFSET);
        assert_eq!(t.fraction(), 1 << 30);
        assert!((t.to_unix_secs_f64() - 1_700_000_000.25).abs() < 1e-6);
    }

    #[test]
    fn system_time_round_trip() {
        let st = UNIX_EPOCH + Duration::new(1_750_000_000, 123_456_789);
        let t = TimeTag::from_system_time(st);
        let back = t.to_system_time();
        let diff = back.duration_since(st).unwrap_or_else(|e| e.duration());
        assert!(diff < Duration::from_nanos(2), "{diff:?}");
    }

    #[test]
    fn era_one_after_2036() {
        // 2040-01-01 lies in NTP era 1: seconds wrap past 2^32.
        let unix = 2_208_988_800.0;
        let t = TimeTag::from_system_time(UNIX_EPOCH + Duration::from_secs(unix as u64));
        assert!(t.seconds() < 0x8000_0000);
        assert!((t.to_unix_secs_f64() - unix).abs() < 1e-6);
    }

    #[test]
    fn nested_clamps_to_parent() {
        let parent = TimeTag::new(100, 0);
        assert_eq!(TimeTag::new(50, 0).nested_in(parent), parent);
        assert_eq!(TimeTag::IMMEDIATELY.nested_in(parent), parent);
        assert_eq!(TimeTag::new(200, 0).nested_in(parent), TimeTag::new(200, 0));
        assert_eq!(
            TimeTag::new(200, 0).nested_in(TimeTag::IMMEDIATELY),
            TimeTag::new(200, 0)
        );
    }

    #[test]
    fn adding_durations_saturates() {
        let t = TimeTag::new(10, 0).add_duration(Duration::from_millis(1500));
        assert_eq!((t.seconds(), t.fraction()), (11, 1 << 31));
        assert_eq!(
            TimeTag::new(1, 0).add_duration(Duration::from_secs(1 << 40)),
            TimeTag(u64::MAX)
        );
    }

    #[test]
    fn display() {
        assert_eq!(TimeTag::IMMEDIATELY.to_string(), "immediately");
        assert_eq!(TimeTag::new(1, 2).to_string(), "00000001.00000002");
    }
}
