//! The listener's measure of a recorded WAV file's first channel, for scripts that record a
//! steady tone through a chain of tools (`scripts/bench-jack-roundtrip` does, through both
//! netjam and JackTrip): `listen_wav FILE HZ [SKIP_SECONDS]`.
//!
//! Prints one line of figures for the script, `WINDOWS GLITCH_WINDOWS SILENT_WINDOWS
//! WORST_CENTS CLEAN_WORST_CENTS`, then the summary as a person reads it. The worst pitch
//! error is read over every window; in a glitch window a splice moves the spectrum's peak,
//! so the clean figure, over the windows that are not glitches, is the pitch a listener
//! hears held. Exits 2 on a file it cannot measure. With `LISTEN_WAV_WINDOWS` set in the
//! environment, every window's figures follow, each line starting with `#`.

use std::io::Write;
use std::path::PathBuf;

use netjam::endpoint::wav::read_first_channel;
use netjam_engine::listen::{listen, Tones};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: listen_wav FILE HZ [SKIP_SECONDS]";
    let (Some(path), Some(hz)) = (args.first(), args.get(1).and_then(|h| h.parse::<f64>().ok())) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let skip = match args.get(2).map(|s| s.parse::<f64>()) {
        None => 0.0,
        Some(Ok(s)) if s >= 0.0 => s,
        Some(_) => {
            eprintln!("{usage}: SKIP_SECONDS is a number of seconds, not {:?}", args[2]);
            std::process::exit(2);
        }
    };
    let path = PathBuf::from(path);
    let measured = read_first_channel(&path)
        .and_then(|(samples, rate)| Ok(listen(&samples, rate, &Tones::present(&[hz]).skip(skip))?));
    match measured {
        Ok(l) => {
            let s = &l.summary;
            let clean = l.worst_clean_cents();
            // A reader that stops after the first line is no error.
            let mut out = std::io::stdout().lock();
            if std::env::var_os("LISTEN_WAV_WINDOWS").is_some() {
                // Every window, to find where a figure comes from: start (s), the tone's
                // pitch error (cents) and level (dB), the residual (dB), G for a glitch.
                for w in &l.windows {
                    let tone = w.present.first();
                    let _ = writeln!(
                        out,
                        "# {:.1} {:+.2} {:.1} {:.1}{}",
                        w.start_seconds,
                        tone.map_or(0.0, |t| t.cents),
                        tone.map_or(-120.0, |t| t.level_db),
                        w.residual_db.unwrap_or(-120.0),
                        if w.is_glitch() { " G" } else { "" }
                    );
                }
            }
            let _ = writeln!(
                out,
                "{} {} {} {:.2} {clean:.2}\n{s}",
                s.windows,
                s.glitch_windows(),
                s.silent_windows,
                s.worst_cents
            );
        }
        Err(e) => {
            eprintln!("listen_wav: {}: {e:#}", path.display());
            std::process::exit(2);
        }
    }
}
