//! A signal that says which input frame it is: two ramps, half a cycle apart, one per
//! channel. A frame of output, even resampled, decodes to the (fractional) input frame it
//! was made from, so playout delay can be read off the output frame by frame, with drift
//! correction on or off. Concealment, silence and cross-fades decode to nothing (the two
//! channels disagree) or to frames out of sequence, and are left out.

/// Frames in one cycle of the ramp (one second at 48 kHz): playout may jump by less than
/// half of it between two decoded periods.
pub const CYCLE: u64 = 48_000;
/// A channel within this many frames of its ramp's wrap is not trusted (a resampler rings
/// there).
const WRAP_GUARD: f64 = 256.0;

fn ramp(pos: u64) -> f32 {
    ((pos % CYCLE) as f64 / CYCLE as f64 - 0.5) as f32
}

/// Fill interleaved stereo `out` with frames `first..`; returns the next frame.
pub fn fill(first: u64, out: &mut [f32]) -> u64 {
    let mut i = first;
    for f in out.chunks_exact_mut(2) {
        f[0] = ramp(i);
        f[1] = ramp(i + CYCLE / 2);
        i += 1;
    }
    i
}

/// The input frame (modulo [`CYCLE`]) a stereo output frame reproduces, if its channels agree.
pub fn decode(frame: &[f32]) -> Option<f64> {
    let c = CYCLE as f64;
    let p0 = (frame[0] as f64 + 0.5) * c;
    let p1 = ((frame[1] as f64 + 0.5) * c - c / 2.0).rem_euclid(c);
    let near_wrap = |p: f64| p < WRAP_GUARD || p > c - WRAP_GUARD;
    let ok0 = !near_wrap(p0);
    let ok1 = !near_wrap((p1 + c / 2.0).rem_euclid(c));
    let d = (p0 - p1).rem_euclid(c);
    let agree = d.min(c - d) < 0.5;
    match (ok0, ok1) {
        (true, true) => agree.then_some(p0),
        (true, false) => Some(p0),
        (false, true) => Some(p1),
        (false, false) => None,
    }
}

/// Decode one period of interleaved stereo output: the input frame its first frame
/// reproduces (unwrapped to the cycle nearest `expect`), when every decodable frame of the
/// period follows the one before by `step` (± 1 %) and at least half of them decode.
pub fn decode_period(out: &[f32], step: f64, expect: f64) -> Option<f64> {
    let frames = out.len() / 2;
    let mut first: Option<f64> = None;
    let mut n = 0;
    for (k, f) in out.chunks_exact(2).enumerate() {
        let Some(p) = decode(f) else { continue };
        let at0 = p - k as f64 * step;
        match first {
            None => first = Some(at0),
            Some(a) => {
                let d = (at0 - a).rem_euclid(CYCLE as f64);
                if d.min(CYCLE as f64 - d) > 0.01 * frames as f64 * step.max(1.0) {
                    return None;
                }
            }
        }
        n += 1;
    }
    if n * 2 < frames {
        return None;
    }
    let a = first?;
    let c = CYCLE as f64;
    Some(a + c * ((expect - a) / c).round())
}
