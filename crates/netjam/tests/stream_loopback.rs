//! `netjam send` → `netjam recv` over real UDP on loopback: bit-exact WAV delivery for
//! every codec at 1, 2 and 8 channels, and at 8, 12 and 192 kHz; a sender restarted mid-stream is followed by the
//! same receiver; hostile datagrams sprayed at the receiver change nothing.

mod common;

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{start_recv, Proc, BIN};

fn tmp(name: &str) -> PathBuf {
    common::tmp("test", name)
}

fn send(to: SocketAddr, args: &[&str]) {
    let status = Command::new(BIN)
        .args(["send", "--to", &to.to_string()])
        .args(args)
        .stderr(Stdio::null())
        .status()
        .expect("run netjam send");
    assert!(status.success(), "netjam send failed");
}

/// Everything else `recv` prints until it ends; panics unless it succeeds.
fn wait(mut recv: Proc) -> Vec<String> {
    let (status, out) = recv.finish(Duration::from_secs(20));
    assert!(status.success(), "recv failed: {out:?}");
    out
}

/// Write a 48 kHz WAV of pseudo-random samples (full scale, every bit used).
fn write_noise_wav(path: &Path, bits: u16, float: bool, channels: u16, frames: usize) {
    write_noise_wav_at(path, bits, float, channels, frames, 48_000);
}

/// Write a WAV of pseudo-random samples at `rate`.
fn write_noise_wav_at(path: &Path, bits: u16, float: bool, channels: u16, frames: usize, rate: u32) {
    let spec = hound::WavSpec {
        channels,
        sample_rate: rate,
        bits_per_sample: bits,
        sample_format: if float {
            hound::SampleFormat::Float
        } else {
            hound::SampleFormat::Int
        },
    };
    let mut w = hound::WavWriter::create(path, spec).expect("create wav");
    let mut x: u64 = 0x1234_5678;
    for _ in 0..frames * channels as usize {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if float {
            w.write_sample(((x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32)
                .expect("write");
        } else {
            let v = (x as i64 >> (64 - bits)) as i32;
            w.write_sample(v).expect("write");
        }
    }
    w.finalize().expect("finalize");
}

/// All samples of a WAV as raw integers or float bit patterns, so comparison is exact.
fn samples(path: &Path) -> Vec<u32> {
    let mut r = hound::WavReader::open(path).expect("open wav");
    match r.spec().sample_format {
        hound::SampleFormat::Float => r.samples::<f32>().map(|s| s.expect("sample").to_bits()).collect(),
        hound::SampleFormat::Int => r.samples::<i32>().map(|s| s.expect("sample") as u32).collect(),
    }
}

/// Where `needle` occurs inside `hay`.
fn find(hay: &[u32], needle: &[u32]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn spray_garbage(
    to: SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let mut n = 0u64;
        let mut x = 7u64;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let len = (x >> 52) as usize % 300;
            let mut p: Vec<u8> = (0..len).map(|i| (x >> (i % 56)) as u8).collect();
            match n % 4 {
                0 if len > 2 => p[0] = 0x80,          // RTP version, garbage after
                1 if len > 2 => p[0] = 0x8f,          // CSRC count past the end
                2 => p = vec![0x81, 200, 0xff, 0xff], // RTCP with an absurd length
                _ => {}
            }
            let _ = s.send_to(&p, to);
            n += 1;
            std::thread::sleep(Duration::from_micros(500));
        }
        n
    })
}

#[test]
fn wav_files_arrive_bit_exact_for_every_codec_and_channel_count() {
    let cases = [(16u16, false, "l16"), (24, false, "l24"), (32, true, "f32")];
    for (bits, float, codec) in cases {
        for channels in [1u16, 2, 8] {
            let input = tmp(&format!("in-{codec}-{channels}.wav"));
            let output = tmp(&format!("out-{codec}-{channels}.wav"));
            write_noise_wav(&input, bits, float, channels, 9_600); // 0.2 s
                                                                   // A generous fixed buffer: this test is about exactness, not latency.
            let (recv, addr) = start_recv(&[
                "--output",
                output.to_str().expect("path"),
                "--duration",
                "0.5",
                "--buffer",
                "40ms",
            ]);
            let garbage_stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let sprayer = (channels == 2).then(|| spray_garbage(addr, garbage_stop.clone()));
            send(addr, &["--input", input.to_str().expect("path")]);
            let out = wait(recv);
            garbage_stop.store(true, std::sync::atomic::Ordering::Relaxed);
            if let Some(s) = sprayer {
                assert!(s.join().expect("sprayer") > 50);
            }
            let sent = samples(&input);
            let got = samples(&output);
            let at = find(&got, &sent).unwrap_or_else(|| {
                panic!("{codec} x{channels}: input not found bit-exact in output; recv said {out:?}")
            });
            assert_eq!(at % channels as usize, 0, "channels stay aligned");
            let spec = hound::WavReader::open(&output).expect("open").spec();
            assert_eq!(
                (spec.channels, spec.sample_rate, spec.bits_per_sample),
                (channels, 48_000, bits)
            );
        }
    }
}

#[test]
fn pcm_arrives_bit_exact_from_8_to_192_khz() {
    // 8 and 192 kHz have a rate code in the format extension; 12 kHz is written out in full.
    for rate in [8_000u32, 12_000, 192_000] {
        let input = tmp(&format!("in-rate-{rate}.wav"));
        let output = tmp(&format!("out-rate-{rate}.wav"));
        write_noise_wav_at(&input, 24, false, 2, rate as usize / 5, rate); // 0.2 s
        let (recv, addr) = start_recv(&[
            "--output",
            output.to_str().expect("path"),
            "--duration",
            "0.5",
            "--buffer",
            "40ms",
        ]);
        send(addr, &["--input", input.to_str().expect("path")]);
        let out = wait(recv);
        let (sent, got) = (samples(&input), samples(&output));
        let at = find(&got, &sent)
            .unwrap_or_else(|| panic!("{rate} Hz: input not found bit-exact in output; recv said {out:?}"));
        assert_eq!(at % 2, 0, "channels stay aligned");
        let spec = hound::WavReader::open(&output).expect("open").spec();
        assert_eq!(
            (spec.channels, spec.sample_rate, spec.bits_per_sample),
            (2, rate, 24)
        );
    }
}

#[test]
fn opus_from_a_44_1_khz_source_keeps_its_pitch_and_counts_the_resampler() {
    let output = tmp("opus-44k1.wav");
    let (recv, addr) = start_recv(&["--output", output.to_str().expect("path"), "--duration", "1.0"]);
    let mut send = Proc::spawn_lines(
        Command::new(BIN)
            .args([
                "send",
                "--to",
                &addr.to_string(),
                "--codec",
                "opus",
                "--sine",
                "1000",
            ])
            .args(["--rate", "44100", "--channels", "1", "--duration", "1.5"])
            .stdout(Stdio::null()),
        "netjam send",
    );
    let (status, said) = send.finish(Duration::from_secs(10));
    assert!(status.success(), "send failed: {said:?}");
    let out = wait(recv);
    // The start-up lines: what the resampler adds, and the codec delay that includes it.
    let number_after = |key: &str| -> Option<f64> {
        let line = said.iter().find(|l| l.contains(key))?;
        let rest = &line[line.find(key)? + key.len()..];
        rest.split_whitespace().next()?.trim_end_matches(',').parse().ok()
    };
    let resampler_ms = number_after("to Opus's 48000 Hz (adds").unwrap_or_else(|| panic!("{said:?}"));
    let codec_ms = number_after(", codec delay").unwrap_or_else(|| panic!("{said:?}"));
    assert!(resampler_ms > 0.0, "{said:?}");
    // Opus's own 2.5 ms look-ahead plus the resampler (printed to 0.1 ms).
    assert!(codec_ms >= 2.5 + resampler_ms - 0.1, "{said:?}");
    // The tone plays at 1 kHz at the receiver's 48 kHz (unresampled it would be 1088 Hz).
    let audio = common::signal::read_wav(&output);
    assert_eq!(audio.rate, 48_000);
    let x = &audio.channels[0];
    let first = x
        .iter()
        .position(|v| v.abs() > 0.1)
        .unwrap_or_else(|| panic!("silent; recv said {out:?}"));
    let body = &x[(first + 4_800).min(x.len())..(first + 4_800 + 24_000).min(x.len())];
    assert!(body.len() >= 12_000, "too little audio; recv said {out:?}");
    let hz = common::signal::dominant_hz(body);
    assert!((hz - 1_000.0).abs() <= 5.0, "the tone came out at {hz} Hz");
    let amp = common::signal::tone_amp(body, 1_000.0);
    assert!(amp > 0.1, "tone amplitude {amp}");
    eprintln!(
        "opus at 44.1 kHz: resampler {resampler_ms} ms, codec delay {codec_ms} ms, tone {hz} Hz at {amp:.3}"
    );
}

#[test]
fn a_restarted_sender_is_followed_without_restarting_the_receiver() {
    let output = tmp("restart.wav");
    let stats = tmp("restart.json");
    let (recv, addr) = start_recv(&[
        "--output",
        output.to_str().expect("path"),
        "--duration",
        "1.6",
        "--stats-json",
        stats.to_str().expect("path"),
    ]);
    send(addr, &["--sine", "440", "--duration", "0.5"]);
    std::thread::sleep(Duration::from_millis(300));
    send(addr, &["--sine", "880", "--duration", "0.5"]);
    let out = wait(recv);
    assert!(out.iter().any(|l| l.contains("restarted")), "{out:?}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).expect("stats")).expect("json");
    assert_eq!(report["stats"]["stream_starts"], 2, "{report}");
    // The second tone is in the file: zero crossings of the last 0.2 s of audio at 880 Hz.
    let all = samples(&output);
    let ch0: Vec<i32> = all.iter().step_by(2).map(|v| *v as i32).collect();
    let voiced: Vec<&i32> = ch0.iter().filter(|v| v.abs() > 1000).collect();
    assert!(
        voiced.len() > 30_000,
        "both tones were played: {} voiced samples",
        voiced.len()
    );
    let series = report["series"].as_array().expect("series");
    assert!(series.len() > 5);
}

#[test]
fn plain_rtp_without_a_format_gets_a_clear_hint() {
    let (recv, addr) = start_recv(&["--output", tmp("never.wav").to_str().expect("path")]);
    let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let mut pkt = vec![0x80, 96, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1];
    pkt.extend_from_slice(&[0; 256]);
    let mut hint = None;
    for _ in 0..100 {
        let _ = s.send_to(&pkt, addr);
        if let Some(l) = recv.line_within(Duration::from_millis(50)) {
            if l.contains("--codec") {
                hint = Some(l);
                break;
            }
        }
    }
    drop(recv);
    assert!(hint.is_some(), "recv explains how to give the format");
}

#[test]
fn the_sox_pipeline_works_through_stdin_and_stdout_byte_exact() {
    let sox_args = [
        "-R",
        "-D",
        "-n",
        "-t",
        "raw",
        "-r",
        "48000",
        "-c",
        "2",
        "-b",
        "16",
        "-e",
        "signed-integer",
        "-L",
        "-",
    ];
    let synth = ["synth", "0.25", "sine", "440", "sine", "660", "vol", "0.7"];
    let reference = Command::new("sox").args(sox_args).args(synth).output();
    let reference = match reference {
        Ok(o) if o.status.success() => o.stdout,
        _ => panic!("sox is missing: run scripts/deps"),
    };
    assert_eq!(reference.len(), 48_000 / 4 * 4);
    let mut recv = Command::new(BIN)
        .args([
            "recv",
            "--listen",
            "127.0.0.1:0",
            "--stdout",
            "--sample-format",
            "s16le",
            "--duration",
            "0.6",
        ])
        .args(["--buffer", "40ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("netjam recv");
    let stderr = recv.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let first = lines.next().expect("line").expect("utf-8");
    let addr = first.rsplit(' ').next().expect("addr").to_string();
    std::thread::spawn(move || for _ in lines {});
    let mut stdout = recv.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut v).expect("read stdout");
        v
    });
    // sox ... -t raw - | netjam send --stdin
    let mut sox = Command::new("sox")
        .args(sox_args)
        .args(synth)
        .stdout(Stdio::piped())
        .spawn()
        .expect("sox");
    let sox_out = sox.stdout.take().expect("sox stdout");
    let status = Command::new(BIN)
        .args([
            "send",
            "--to",
            &addr,
            "--stdin",
            "--rate",
            "48000",
            "--channels",
            "2",
            "--sample-format",
            "s16le",
        ])
        .stdin(sox_out)
        .stderr(Stdio::null())
        .status()
        .expect("netjam send");
    assert!(status.success());
    assert!(sox.wait().expect("sox").success());
    assert!(recv.wait().expect("recv").success());
    let got = reader.join().expect("reader");
    assert_eq!(got.len(), 48_000 * 6 / 10 * 4, "0.6 s of s16le stereo on stdout");
    assert!(
        got.windows(reference.len()).any(|w| w == &reference[..]),
        "sox's audio came out byte-exact"
    );
}
