//! `jam --server --room --record DIR` with real processes on loopback: a rooms server and
//! three players each sending noise of its own seed; the third records. Its multitrack must
//! hold, in each member's file, exactly that member's signal (found by alignment against
//! what the member sent, never another's); `you.wav` the recorder's own input; and
//! `mix.wav` must be the sum of the member tracks (unity gain), frame for frame, which
//! only holds if every file is on the same timeline (the noise is quiet enough that two
//! members' sum stays below −3 dBFS, which the mix's limiter leaves bit-exact).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{free_udp_port, read_json, tmp_dir, Proc, BIN};
use netjam_engine::align::{align, AlignOptions};
use netjam_engine::synth::{Synth, SynthKind};

const RATE: u32 = 48_000;

/// `seconds` of mono 16-bit noise from `seed`, peaks at 0.35 (two summed stay below the
/// limiter's −3 dBFS knee), written to `path`; returns the samples as the receiver
/// decodes them.
fn noise_wav(path: &Path, seconds: f64, seed: u64) -> Vec<f32> {
    let mut synth = Synth::new(SynthKind::Noise, RATE, 1, seed);
    let mut x = vec![0.0f32; (seconds * RATE as f64) as usize];
    synth.fill(&mut x);
    // The synth's noise peaks at 0.5.
    x.iter_mut().for_each(|s| *s *= 0.7);
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: RATE,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(path, spec).expect("wav");
    let mut decoded = Vec::with_capacity(x.len());
    for s in x {
        let q = (s * 32_768.0).round().clamp(-32_768.0, 32_767.0) as i16;
        w.write_sample(q).expect("sample");
        decoded.push(f32::from(q) / 32_768.0);
    }
    w.finalize().expect("finalize");
    decoded
}

fn read_f32(path: &Path) -> (Vec<f32>, u16) {
    let mut r = hound::WavReader::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let spec = r.spec();
    assert_eq!(
        (spec.sample_format, spec.bits_per_sample, spec.sample_rate),
        (hound::SampleFormat::Float, 32, RATE),
        "{}",
        path.display()
    );
    (
        r.samples::<f32>().map(|s| s.expect("sample")).collect(),
        spec.channels,
    )
}

/// Start a player and wait until it has its seat.
fn player(server: u16, name: &str, input: &Path, extra: &[&str]) -> Proc {
    let server = format!("127.0.0.1:{server}");
    let input = input.to_str().expect("path");
    let mut args = vec![
        "jam", "--server", &server, "--room", "session", "--name", name, "--input", input,
    ];
    args.extend_from_slice(extra);
    let p = Proc::spawn_lines(Command::new(BIN).args(&args), "netjam jam");
    loop {
        let line = p.next_line(Duration::from_secs(15));
        if line.contains("in room") {
            return p;
        }
    }
}

#[test]
fn a_room_recorded_as_a_sample_aligned_multitrack() {
    let dir = tmp_dir("room-record");
    let rec = dir.join("take");
    let _ = std::fs::remove_dir_all(&rec);
    // Distinct seeds: every window of one player's noise occurs in no other's.
    let ana = noise_wav(&dir.join("ana.wav"), 3.0, 11);
    let bo = noise_wav(&dir.join("bo.wav"), 3.0, 22);
    let cy = noise_wav(&dir.join("cy.wav"), 10.0, 33);
    let port = free_udp_port();
    let mut server = Proc::spawn_lines(
        Command::new(BIN).args([
            "server",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--duration",
            "30",
        ]),
        "netjam server",
    );
    server.next_line(Duration::from_secs(10));
    let json = dir.join("cy.json");
    let mut recorder = player(
        port,
        "cy",
        &dir.join("cy.wav"),
        &[
            "--duration",
            "8",
            "--no-drift-correction",
            "--record",
            rec.to_str().expect("path"),
            "--stats-json",
            json.to_str().expect("path"),
        ],
    );
    // One at a time, so each takes its seat while the recorder is already recording.
    let mut a = player(port, "ana", &dir.join("ana.wav"), &[]);
    let mut b = player(port, "bo", &dir.join("bo.wav"), &[]);
    for p in [&mut a, &mut b] {
        assert!(p.wait_for(Duration::from_secs(20)).success());
    }
    let (status, said) = recorder.finish(Duration::from_secs(20));
    assert!(status.success(), "{said:?}");
    let _ = server.child.kill();
    println!("{}", said.join("\n"));
    assert!(said.iter().any(|l| l.contains("recorded")), "{said:?}");

    let report = read_json(&json);
    let summary = &report["record"];
    let frames = summary["frames"].as_u64().expect("frames") as usize;
    println!(
        "recorded {frames} frames; dropped {} periods, padded {} frames",
        summary["dropped_blocks"], summary["padded_frames"]
    );
    assert!(frames >= 7 * RATE as usize, "{summary}");
    assert!(summary["error"].is_null(), "{summary}");

    // The files: mix, you, and one per member seat heard (a member who had to take a new
    // seat has a file per seat; each must hold only that member).
    let mut tracks: Vec<(String, PathBuf)> = Vec::new();
    for e in std::fs::read_dir(&rec).expect("record dir") {
        let path = e.expect("entry").path();
        let file = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .to_string();
        if let Some((_, name)) = file.strip_suffix(".wav").and_then(|f| f.split_once('-')) {
            tracks.push((name.to_string(), path));
        }
    }
    tracks.sort();
    let names: Vec<&str> = tracks.iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.contains(&"ana") && names.contains(&"bo"), "{names:?}");
    assert!(
        !names.contains(&"cy"),
        "the recorder never hears itself: {names:?}"
    );

    let (mix, mix_ch) = read_f32(&rec.join("mix.wav"));
    let (you, you_ch) = read_f32(&rec.join("you.wav"));
    assert_eq!((mix_ch, you_ch), (1, 1));
    assert_eq!(
        (mix.len(), you.len()),
        (frames, frames),
        "every file is the timeline's length"
    );

    // you.wav is the recorder's input from its first frame.
    let al = align(&cy, &you, 1, AlignOptions::default());
    let matched: usize = al.segments.iter().map(|s| s.len).sum();
    assert_eq!(
        al.segments.first().map(|s| (s.out_start, s.in_start)),
        Some((0, 0)),
        "{al:?}"
    );
    assert!(
        matched >= frames * 99 / 100,
        "you.wav: {matched} of {frames} frames"
    );

    let opts = AlignOptions {
        window: 32,
        tolerance: 1e-6,
    };
    let mut sum = vec![0.0f64; frames];
    let mut heard_frames = [0usize; 2];
    for (name, path) in &tracks {
        let (track, ch) = read_f32(path);
        assert_eq!((ch, track.len()), (1, frames), "{}", path.display());
        for (s, x) in sum.iter_mut().zip(&track) {
            *s += f64::from(*x);
        }
        let (own, others): (&[f32], [&[f32]; 2]) = match name.as_str() {
            "ana" => (&ana, [&bo, &cy]),
            "bo" => (&bo, [&ana, &cy]),
            other => panic!("a track of nobody in the room: {other}"),
        };
        let al = align(own, &track, 1, opts);
        let matched: usize = al.segments.iter().map(|s| s.len).sum();
        let sounding = track.iter().filter(|x| **x != 0.0).count();
        println!(
            "{}: {sounding} sounding frames, {matched} match {name}'s input in {} segments (first at frame {:?})",
            path.display(),
            al.segments.len(),
            al.segments.first().map(|s| s.out_start)
        );
        // What sounds is this member (concealment of a late packet aside).
        assert!(matched * 100 >= sounding * 95, "{}: {al:?}", path.display());
        heard_frames[usize::from(name == "bo")] += matched;
        for other in others {
            let al = align(other, &track, 1, opts);
            assert!(
                al.segments.is_empty(),
                "{} holds another player: {al:?}",
                path.display()
            );
        }
    }
    // Every packet the recorder received from a member is in that member's file.
    for (k, who) in ["ana", "bo"].iter().enumerate() {
        let received: u64 = report["heard"]
            .as_array()
            .expect("heard")
            .iter()
            .filter(|m| m["name"] == *who)
            .map(|m| m["received"].as_u64().unwrap_or(0))
            .sum();
        println!(
            "{who}: {received} packets received, {} frames in its track",
            heard_frames[k]
        );
        assert!(received > 0, "{who} was never heard");
        assert!(
            heard_frames[k] as u64 * 100 >= received * 64 * 90,
            "{who}: {} frames matched of {received} packets",
            heard_frames[k]
        );
    }

    // The mix is the sum of the tracks (unity gain, monitor off), frame for frame.
    let worst = mix
        .iter()
        .zip(&sum)
        .map(|(m, s)| (f64::from(*m) - s).abs())
        .fold(0.0f64, f64::max);
    let sounding = mix.iter().filter(|x| **x != 0.0).count();
    println!("mix: {sounding} sounding frames; worst |mix - sum of tracks| = {worst:e}");
    assert!(sounding as u64 >= RATE as u64 / 4, "the mix is silent");
    assert!(worst <= 1e-6, "mix differs from the sum of its tracks by {worst}");
}
