//! The live one-line status: refreshed in place on a terminal, silent otherwise.

use std::io::{IsTerminal, Write};

use netjam_engine::jitter::JitterStats;
use netjam_engine::receiver::ReceiverStats;
use netjam_engine::sender::SenderStats;

use crate::session::Snapshot;

/// A line on stderr redrawn in place; does nothing when stderr is not a terminal.
#[derive(Debug)]
pub struct StatusLine {
    enabled: bool,
    shown: bool,
}

impl Default for StatusLine {
    fn default() -> Self {
        Self::new()
    }
}

impl StatusLine {
    pub fn new() -> Self {
        Self {
            enabled: std::io::stderr().is_terminal(),
            shown: false,
        }
    }

    /// Show `line` in place of the last one, cut to the terminal's width: a line that wrapped
    /// would leave its first rows behind at every update and scroll the event lines away.
    pub fn show(&mut self, line: &str) {
        if self.enabled {
            let width = terminal_size::terminal_size_of(std::io::stderr())
                .map_or(DEFAULT_WIDTH, |(w, _)| usize::from(w.0));
            let line = fit(line, width);
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r\x1b[2K{line}");
            let _ = e.flush();
            self.shown = true;
        }
    }

    /// End the line so later output starts on a fresh one.
    pub fn finish(&mut self) {
        if self.shown {
            eprintln!();
            self.shown = false;
        }
    }
}

/// Columns assumed when the terminal does not say.
const DEFAULT_WIDTH: usize = 80;

/// `line` cut to fit `width` columns with one to spare (a cursor in the last column wraps
/// on some terminals), ending in `…` where it was cut. Counts characters: the lines are
/// ASCII but for that mark.
pub fn fit(line: &str, width: usize) -> std::borrow::Cow<'_, str> {
    let room = width.saturating_sub(1).max(1);
    if line.chars().count() <= room {
        return line.into();
    }
    let mut cut: String = line.chars().take(room - 1).collect();
    cut.push('…');
    cut.into()
}

/// A ten-step level meter for a peak in dBFS (-60..0).
pub fn meter(dbfs: f32) -> String {
    let steps = (((dbfs + 60.0) / 6.0).clamp(0.0, 10.0)) as usize;
    format!(
        "[{}{}] {:>4.0} dB",
        "#".repeat(steps),
        "-".repeat(10 - steps),
        dbfs.max(-99.0)
    )
}

pub fn recv_line(s: &Snapshot<ReceiverStats>) -> String {
    let r = &s.stats;
    let jb = &r.jitter_buffer;
    let expected = (r.received as i64 + r.lost.max(0)).max(1);
    format!(
        "{:>7.1}s  pkts {:>8}  lost {:>5} ({:.2}%)  late {:>4}  jitter {:>5.2} ms  buffer {:>5.2}/{:>5.2} ms  conceal {:>5}  {}",
        s.t_s,
        r.received,
        r.lost,
        100.0 * r.lost.max(0) as f64 / expected as f64,
        jb.late_packets,
        r.jitter_ms,
        jb.depth_ms,
        jb.target_ms,
        jb.concealment_events,
        meter(s.peak_dbfs)
    )
}

/// Every discontinuity a listener can find, for the final lines: "2 discontinuities:
/// concealed 128 frames in 2 (loss 2, late 0, far gap 0), inserted 0 frames in 0 (growth 0,
/// relock 0), skipped 0 frames in 0 (shrink 0, device lost 0, far device lost 0); 0 pauses".
pub fn discontinuity_text(jb: &JitterStats) -> String {
    let d = &jb.discontinuities;
    format!(
        "{} discontinuities: concealed {} frames in {} (loss {}, late {}, far gap {}), inserted {} frames in {} (growth {}, relock {}), skipped {} frames in {} (shrink {}, device lost {}, far device lost {}); {} pauses",
        d.events,
        jb.concealed_frames.saturating_sub(jb.inserted_frames),
        d.concealed_events,
        d.loss,
        d.late,
        d.sender_gap_concealed,
        jb.inserted_frames,
        d.inserted_events,
        d.growth,
        d.relock,
        jb.skipped_frames,
        d.skipped_events,
        d.shrink,
        d.device_lost,
        d.sender_lost,
        d.pause
    )
}

pub fn send_line(s: &Snapshot<SenderStats>) -> String {
    let t = &s.stats;
    let rtt = t.rtt_ms.map_or("  -  ".to_string(), |r| format!("{r:5.1}"));
    let loss = t
        .remote_fraction_lost
        .map_or(" - ".to_string(), |l| format!("{:.1}%", l * 100.0));
    format!(
        "{:>7.1}s  sent {:>8} pkts  {:>7.0} kbit/s  rtt {rtt} ms  far-end loss {loss}{}  {}",
        s.t_s,
        t.packets,
        if s.t_s > 0.0 {
            t.bytes as f64 * 8.0 / s.t_s / 1000.0
        } else {
            0.0
        },
        codec_delay(t),
        meter(s.peak_dbfs)
    )
}

/// "  codec 2.5 ms" for a codec with look-ahead (Opus), nothing for PCM.
pub fn codec_delay(t: &SenderStats) -> String {
    if t.codec_delay_ms > 0.0 {
        format!("  codec {:.1} ms", t.codec_delay_ms)
    } else {
        String::new()
    }
}

/// A one-character meter for a peak in dBFS: eight steps of 7.5 dB from −60, a blank below.
pub fn meter_char(dbfs: f32) -> char {
    const STEPS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    if dbfs.is_nan() || dbfs < -60.0 {
        return ' ';
    }
    STEPS[(((dbfs + 60.0) / 7.5) as usize).min(STEPS.len() - 1)]
}

/// What a player has been told about the sample rate another player's stream arrives at,
/// so each change is said once: a stream at another rate is converted to the player's; one
/// too far from it to convert is refused (nothing of it plays).
#[derive(Debug, Default)]
pub struct HeardRate {
    told: Option<(Option<u32>, bool)>,
}

impl HeardRate {
    /// The line to print now about `who`, whose stream was last heard at `heard` Hz (None:
    /// not yet) with `refused` packets refused for their rate so far, on a device at
    /// `device_rate`; `None` when nothing changed or there is nothing to say.
    pub fn tell(&mut self, who: &str, heard: Option<u32>, refused: u64, device_rate: u32) -> Option<String> {
        // Refused packets are counted for good: a stream heard since is what counts.
        let refusing = refused > 0 && heard.is_none();
        let now = (heard, refusing);
        if self.told == Some(now) {
            return None;
        }
        self.told = Some(now);
        if refusing {
            return Some(format!(
                "netjam: error: {who} sends at a sample rate too far from yours ({device_rate} Hz) to convert, so you hear \
                 nothing from them: 44.1 and 48 kHz convert to each other, as do 88.2 and 96 kHz, so one of you picks a --rate \
                 near the other's (with --codec opus on both sides any device rate works)"
            ));
        }
        match heard {
            Some(r) if r != device_rate => Some(format!(
                "netjam: {who} sends at {r} Hz: converted to your {device_rate} Hz"
            )),
            _ => None,
        }
    }
}

/// How a sender packs audio, for the start-up line: "packets of 64 frames (1.33 ms)", and
/// for Opus its look-ahead, the delay the codec adds on top.
pub fn packets_text(sender: &netjam_engine::sender::Sender) -> String {
    let ms = sender.packet_ns() as f64 / 1e6;
    let text = format!("packets of {} frames ({ms:.2} ms)", sender.frames_per_packet());
    match sender.stats().codec_delay_ms {
        d if d > 0.0 => format!("{text}, codec delay {d:.1} ms"),
        _ => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_line_is_cut_to_the_width_with_a_mark_and_a_short_one_is_kept() {
        assert_eq!(fit("short", 80), "short");
        let long = "x".repeat(200);
        let cut = fit(&long, 80);
        assert_eq!(cut.chars().count(), 79);
        assert!(cut.ends_with('…'));
        assert_eq!(fit(&long, 0).chars().count(), 1);
    }

    #[test]
    fn the_meter_character_rises_with_the_level() {
        assert_eq!(meter_char(-120.0), ' ');
        assert_eq!(meter_char(-60.0), '▁');
        assert_eq!(meter_char(-6.0), '█');
        assert_eq!(meter_char(3.0), '█');
        assert!(meter_char(-30.0) < meter_char(-10.0));
    }
}
