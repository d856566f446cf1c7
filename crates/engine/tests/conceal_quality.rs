//! How well [`Concealer`] continues music across lost packets, driven the way the jitter
//! buffer drives it (one `on_real` per packet of real audio, one `conceal` per missing
//! packet, configured for the stream's rate as the buffer's `reset` configures it): a two-tone signal must be carried
//! through gaps of one to three packets with at least 20 dB SNR against the signal that was
//! lost, and neither the gap nor the return of real audio may step further from one sample
//! to the next than twice the signal's own largest step.

use netjam_engine::conceal::{Concealer, ConcealerConfig};

const RATE: f64 = 48_000.0;
const CHANNELS: usize = 2;
/// Packets of real audio before the first gap position: more than the fit's history.
const LEAD_PACKETS: usize = 40;
const MIN_SNR_DB: f64 = 20.0;

/// Frame `n` of a stereo two-tone signal (440 Hz at 0.4 and 1230 Hz at 0.3; the right
/// channel starts at other phases).
fn two_tone(n: usize) -> [f32; CHANNELS] {
    let t = n as f64 / RATE;
    let tau = std::f64::consts::TAU;
    let l = 0.4 * (tau * 440.0 * t).sin() + 0.3 * (tau * 1230.0 * t).sin();
    let r = 0.4 * (tau * 440.0 * t + 1.0).sin() + 0.3 * (tau * 1230.0 * t + 2.5).sin();
    [l as f32, r as f32]
}

fn truth(frames: usize) -> Vec<f32> {
    (0..frames).flat_map(two_tone).collect()
}

/// The largest sample-to-sample difference of the signal itself.
fn natural_step(x: &[f32]) -> f32 {
    largest_step(x, 0, x.len() / CHANNELS)
}

/// The largest difference between consecutive frames `from..to` of any channel.
fn largest_step(x: &[f32], from: usize, to: usize) -> f32 {
    (from.max(1)..to)
        .flat_map(|i| (0..CHANNELS).map(move |c| (x[i * CHANNELS + c] - x[(i - 1) * CHANNELS + c]).abs()))
        .fold(0.0, f32::max)
}

#[derive(Debug)]
struct Outcome {
    packet: usize,
    gap_packets: usize,
    at_packet: usize,
    snr_db: f64,
    /// Largest step from the last real frame before the gap to the end of the resume
    /// cross-fade, against the signal's own.
    step_ratio: f32,
}

/// Play `total` packets of `packet` frames, the ones in `gap` concealed.
fn play(packet: usize, gap: std::ops::Range<usize>, total: usize) -> Outcome {
    let config = ConcealerConfig::for_format(RATE as u32, CHANNELS);
    let mut c = Concealer::new(config, CHANNELS);
    c.reset(CHANNELS);
    let x = truth(total * packet);
    let mut out = vec![0.0f32; x.len()];
    for k in 0..total {
        let block = &mut out[k * packet * CHANNELS..(k + 1) * packet * CHANNELS];
        if gap.contains(&k) {
            c.conceal(block);
        } else {
            block.copy_from_slice(&x[k * packet * CHANNELS..(k + 1) * packet * CHANNELS]);
            c.on_real(block);
        }
    }
    let (from, to) = (gap.start * packet * CHANNELS, gap.end * packet * CHANNELS);
    let signal: f64 = x[from..to].iter().map(|v| f64::from(*v).powi(2)).sum();
    let error: f64 = x[from..to]
        .iter()
        .zip(&out[from..to])
        .map(|(a, b)| f64::from(a - b).powi(2))
        .sum();
    let snr_db = 10.0 * (signal / error.max(1e-30)).log10();
    let step = largest_step(
        &out,
        gap.start * packet,
        gap.end * packet + config.resume_frames + 1,
    );
    Outcome {
        packet,
        gap_packets: gap.len(),
        at_packet: gap.start,
        snr_db,
        step_ratio: step / natural_step(&x),
    }
}

fn outcomes() -> Vec<Outcome> {
    let mut all = Vec::new();
    for packet in [64, 120] {
        for gap_packets in 1..=3 {
            // Gap positions a prime number of packets apart, so the tones' phases differ.
            for at in [
                LEAD_PACKETS,
                LEAD_PACKETS + 7,
                LEAD_PACKETS + 19,
                LEAD_PACKETS + 31,
            ] {
                all.push(play(packet, at..at + gap_packets, at + gap_packets + 8));
            }
        }
    }
    all
}

#[test]
fn gaps_of_one_to_three_packets_are_continued_at_20_db_without_a_step() {
    let all = outcomes();
    for o in &all {
        eprintln!(
            "{:>3}-frame packets, gap of {} at packet {:>2}: SNR {:6.1} dB, largest step {:.2}x the signal's",
            o.packet, o.gap_packets, o.at_packet, o.snr_db, o.step_ratio
        );
    }
    let bad: Vec<&Outcome> = all
        .iter()
        .filter(|o| o.snr_db < MIN_SNR_DB || o.step_ratio > 2.0)
        .collect();
    assert!(bad.is_empty(), "below {MIN_SNR_DB} dB or stepping: {bad:#?}");
}
