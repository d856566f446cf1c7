//! Link measurement: the probe packet format, the reflector's state machine, the
//! statistics `netjam ping` reports and the packetization advice of `netjam sweep`.
//!
//! All of it is sans-IO: times are nanosecond counts handed in by the caller, packets are
//! byte slices; nothing here reads a clock, sleeps or touches a socket, and no input can
//! make it panic or grow without bound.

pub mod fuzz;
pub mod packet;
pub mod recommend;
pub mod reflector;
pub mod stats;

pub use packet::{classify, DatagramKind, ProbeError, ProbeKey};
pub use recommend::{recommend, sweep_grid, AudioFormat, Recommendation, SampleFormat, SweepPoint};
pub use reflector::{Action, DropReason, Reflector, ReflectorConfig, ReflectorStats};
pub use stats::{ProbeStats, ProbeSummary};
