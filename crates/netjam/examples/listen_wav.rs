//! The listener's measure of a recorded WAV file's first channel, for scripts that record a
//! steady tone through a chain of tools (`scripts/bench-jack-roundtrip` does, through both
//! netjam and JackTrip): `listen_wav FILE HZ [SKIP_SECONDS]`.
//!
//! Prints one line of figures for the script, `WINDOWS GLITCH_WINDOWS SILENT_WINDOWS
//! WORST_CENTS`, then the summary as a person reads it. Exits 2 on a file it cannot measure.

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
            println!(
                "{} {} {} {:.2}",
                s.windows,
                s.glitch_windows(),
                s.silent_windows,
                s.worst_cents
            );
            println!("{s}");
        }
        Err(e) => {
            eprintln!("listen_wav: {}: {e:#}", path.display());
            std::process::exit(2);
        }
    }
}
