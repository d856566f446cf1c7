//! What the ensemble's virtual-time tests share: time in nanoseconds and the link model's
//! paths they run over. Every test binary compiles this module on its own and uses a part
//! of it; nothing here touches a socket, a thread or the system clock.
#![allow(dead_code)]

use netjam_engine::link::{JitterDist, LinkConfig, LossModel};

pub const MS: u64 = 1_000_000;
pub const S: u64 = 1_000 * MS;

/// A path `delay_ns` long one way, with normal jitter of `jitter_ns`, independent loss of
/// the fraction `loss` (none at 0) and the fraction `reorder` of packets reordered.
pub fn path(delay_ns: u64, jitter_ns: u64, loss: f64, reorder: f64) -> LinkConfig {
    LinkConfig {
        delay_ns,
        jitter_ns,
        jitter_dist: JitterDist::Normal,
        loss: if loss > 0.0 {
            LossModel::Bernoulli { p: loss }
        } else {
            LossModel::None
        },
        reorder,
        ..LinkConfig::default()
    }
}
