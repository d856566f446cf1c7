//! Opus interop with GStreamer (Debian's gstreamer1.0-plugins-base for opusenc/opusdec and
//! -plugins-good for rtpopuspay/rtpopusdepay, installed by scripts/deps), both ways:
//!
//! * GStreamer's `opusenc ! rtpopuspay` → `netjam recv --codec opus` (and `--sdp` with an
//!   RFC 7587 description as GStreamer writes it), with opusenc's default settings and in
//!   its restricted-low-delay mode: the decoded 1 kHz tone is there at the level it was
//!   sent, clean, without dropouts, every packet decoded and (on a loss-free loopback) no
//!   more than the overlap of GStreamer's first two packets concealed;
//! * `netjam send --codec opus` (2.5 ms and 20 ms packets, with netjam's RFC 8285 header
//!   extension) → GStreamer's `rtpopusdepay ! opusdec`: the same checks on GStreamer's decode.
//!
//! Opus is lossy, so the checks are on the signal: its dominant frequency, the amplitude
//! and SNR of least-squares fits of the tone in 20 ms blocks, and the RMS of every 2.5 ms
//! window.

mod common;

use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::signal::{dominant_hz, quietest_window, read_wav, RATE};
use common::{read_json, start_recv, GstReceiver, Proc, BIN};

/// Peak amplitude both senders use: `audiotestsrc volume=0.5` and netjam's test tone.
const AMPLITUDE: f64 = 0.5;
const TONE_HZ: f64 = 1000.0;

fn require_gstreamer() {
    common::require_gstreamer(&["opusenc", "opusdec", "rtpopuspay", "rtpopusdepay", "wavenc"]);
}

fn tmp(name: &str) -> PathBuf {
    common::tmp("gst-opus", name)
}

// ---------------------------------------------------------------------------------------
// Signal analysis

/// Least-squares fit of `a·sin + b·cos + c` at `hz`: the tone's amplitude and the ratio of
/// its power to everything else (noise, distortion, other tones), in dB.
fn fit_tone(x: &[f64], hz: f64) -> (f64, f64) {
    let w = 2.0 * std::f64::consts::PI * hz / RATE;
    // Normal equations of the three basis functions.
    let mut m = [[0.0f64; 4]; 3];
    for (i, &v) in x.iter().enumerate() {
        let b = [(w * i as f64).sin(), (w * i as f64).cos(), 1.0];
        for r in 0..3 {
            for c in 0..3 {
                m[r][c] += b[r] * b[c];
            }
            m[r][3] += b[r] * v;
        }
    }
    // Gaussian elimination (the matrix is well conditioned over many periods).
    for p in 0..3 {
        for r in 0..3 {
            if r != p {
                let (f, pivot) = (m[r][p] / m[p][p], m[p]);
                for (v, q) in m[r].iter_mut().zip(pivot) {
                    *v -= f * q;
                }
            }
        }
    }
    let (a, b, c) = (m[0][3] / m[0][0], m[1][3] / m[1][1], m[2][3] / m[2][2]);
    let (mut tone, mut rest) = (0.0, 0.0);
    for (i, &v) in x.iter().enumerate() {
        let t = a * (w * i as f64).sin() + b * (w * i as f64).cos();
        tone += t * t;
        rest += (v - t - c).powi(2);
    }
    (a.hypot(b), 10.0 * (tone / rest.max(1e-30)).log10())
}

/// First and one past the last sample louder than a fifth of the tone's peak.
fn voiced_span(x: &[f64]) -> (usize, usize) {
    let loud = |v: &f64| v.abs() > AMPLITUDE / 5.0;
    let first = x.iter().position(loud).unwrap_or(x.len());
    let last = x.iter().rposition(loud).map_or(first, |i| i + 1);
    (first, last)
}

/// What the decoded tone looks like in one channel.
#[derive(Debug)]
struct ToneReport {
    voiced_ms: f64,
    hz: f64,
    /// Median over 20 ms blocks of the fitted amplitude, its level against the sent one,
    /// and the SNR; the worst block's SNR and how many blocks are broken (SNR under 10 dB).
    amplitude: f64,
    level_db: f64,
    snr_db: f64,
    worst_block_snr_db: f64,
    broken_blocks: usize,
    quietest_rms: f64,
    quietest_at_ms: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Analyse the tone in `x` from 50 ms after it starts (an Opus encoder takes a few tens of
/// milliseconds to settle on a new signal) to 10 ms before it ends. The tone is fitted in
/// 20 ms blocks, each on its own, so that a jump in phase (a jitter buffer may skip or
/// insert a few frames to hold its depth) spoils one block rather than the whole measure.
fn analyse(x: &[f64]) -> ToneReport {
    let (first, last) = voiced_span(x);
    let (head, tail) = (2400, 480);
    let body = if last > first + head + tail {
        &x[first + head..last - tail]
    } else {
        &x[first..last]
    };
    let fits: Vec<(f64, f64)> = body.chunks_exact(960).map(|b| fit_tone(b, TONE_HZ)).collect();
    let amplitude = median(fits.iter().map(|f| f.0).collect());
    let (quietest_rms, at) = quietest_window(body);
    ToneReport {
        voiced_ms: (last - first) as f64 / RATE * 1000.0,
        hz: dominant_hz(body),
        amplitude,
        level_db: 20.0 * (amplitude / AMPLITUDE).log10(),
        snr_db: median(fits.iter().map(|f| f.1).collect()),
        worst_block_snr_db: fits.iter().map(|f| f.1).fold(f64::INFINITY, f64::min),
        broken_blocks: fits.iter().filter(|f| f.1 < 10.0).count(),
        quietest_rms,
        quietest_at_ms: (first + head + at) as f64 / RATE * 1000.0,
    }
}

/// Both channels carry the 1 kHz tone: at least `min_ms` of it, at the sent level (±1 dB),
/// with a median SNR of at least `min_snr_db` over 20 ms blocks, at most `max_broken`
/// blocks with a discontinuity, and no 2.5 ms quieter than a third of the tone's RMS.
fn check_tone(path: &Path, min_ms: f64, min_snr_db: f64, max_broken: usize, context: &str) {
    let audio = read_wav(path);
    assert_eq!(audio.rate, 48_000, "{context}");
    assert_eq!(audio.channels.len(), 2, "stereo in, stereo out; {context}");
    let tone_rms = AMPLITUDE / 2f64.sqrt();
    for (c, x) in audio.channels.iter().enumerate() {
        let r = analyse(x);
        eprintln!("channel {c}: {r:?}");
        let all = format!("channel {c}: {r:?}; {context}");
        assert!(r.voiced_ms >= min_ms, "only {:.1} ms of tone; {all}", r.voiced_ms);
        assert!((r.hz - TONE_HZ).abs() <= 5.0, "dominant {} Hz; {all}", r.hz);
        assert!(
            r.level_db.abs() <= 1.0,
            "amplitude {:.3} is {:.2} dB off {AMPLITUDE}; {all}",
            r.amplitude,
            r.level_db
        );
        assert!(
            r.snr_db >= min_snr_db,
            "SNR {:.1} dB (worst 20 ms: {:.1} dB); {all}",
            r.snr_db,
            r.worst_block_snr_db
        );
        assert!(
            r.broken_blocks <= max_broken,
            "{} blocks of 20 ms with a discontinuity; {all}",
            r.broken_blocks
        );
        assert!(
            r.quietest_rms >= tone_rms / 3.0,
            "a dropout: RMS {:.3} in the 2.5 ms at {:.1} ms; {all}",
            r.quietest_rms,
            r.quietest_at_ms
        );
    }
}

// ---------------------------------------------------------------------------------------
// GStreamer → netjam

/// How GStreamer encodes.
#[derive(Debug, Clone, Copy)]
struct GstEncoding {
    /// opusenc frame-size in ms (2.5, 5, 10, 20, 40, 60).
    frame_ms: f64,
    /// opusenc audio-type: "generic" (its default) or "restricted-lowdelay".
    audio_type: &'static str,
}

/// The receiver's fixed buffer. The claim is that GStreamer's Opus is decoded, not its
/// latency: GStreamer is no realtime sender, and on a loaded machine its pipeline paused
/// for more than 30 ms (arrival variation p99 36.5 ms, 6 packets late behind a 30 ms
/// buffer, with the whole suite and two busy loops running).
const G2N_BUFFER_MS: f64 = 80.0;

/// Stream 1 s of a 1 kHz tone from GStreamer into `netjam recv`, which plays 0.6 s of it
/// (stopping while the stream still runs, so no concealment after its end is counted).
fn gstreamer_to_netjam(tag: &str, enc: GstEncoding, format_args: &[&str]) {
    require_gstreamer();
    let output = tmp(&format!("g2n-{tag}.wav"));
    let stats = tmp(&format!("g2n-{tag}.json"));
    let (mut recv, addr) = start_recv(
        &[
            format_args,
            &[
                "--buffer",
                &format!("{G2N_BUFFER_MS}ms"),
                "--duration",
                "0.6",
                "--output",
                output.to_str().expect("path"),
                "--stats-json",
                stats.to_str().expect("path"),
            ],
        ]
        .concat(),
    );
    let mut gst = Proc::spawn_lines(
        Command::new("gst-launch-1.0")
            .arg("-q")
            .args([
                "audiotestsrc",
                "wave=sine",
                "freq=1000",
                "volume=0.5",
                "samplesperbuffer=480",
                "num-buffers=100",
                "!",
                "audio/x-raw,rate=48000,channels=2",
                "!",
                "opusenc",
                &format!("frame-size={}", enc.frame_ms),
                &format!("audio-type={}", enc.audio_type),
                "bitrate=192000",
                "!",
                "rtpopuspay",
                "pt=96",
                "!",
                "udpsink",
                "host=127.0.0.1",
                &format!("port={}", addr.port()),
                "sync=true",
            ])
            .stdout(Stdio::null()),
        "gst-launch-1.0 (sender)",
    );
    // GStreamer sends for 1 s; the receiver stops 0.6 s after the first packet.
    let gst_status = gst.wait_for(Duration::from_secs(10));
    assert!(gst_status.success(), "GStreamer failed: {:?}", gst.drain_lines());
    let recv_status = recv.wait_for(Duration::from_secs(5));
    let recv_said = recv.drain_lines();
    assert!(recv_status.success(), "netjam recv failed: {recv_said:?}");

    let report = read_json(&stats);
    let s = &report["stats"];
    let d = &s["decoder"];
    let n = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    let context = format!("recv said {recv_said:?}\nstats {s}");
    let pdv_p99_ms = n(&s["jitter_buffer"]["pdv_p99_ms"]);
    eprintln!(
        "{tag}: decoder {d}; received {}; jitter buffer skipped {} and inserted {} frames; \
         arrival variation p99 {pdv_p99_ms} ms",
        s["received"], s["jitter_buffer"]["skipped_frames"], s["jitter_buffer"]["inserted_frames"]
    );
    assert_eq!(s["format"]["codec"], "opus", "{context}");
    assert_eq!(s["format"]["channels"], 2, "{context}");
    for bad in ["malformed", "wrong_payload_type", "undecodable", "unknown_format"] {
        assert_eq!(s[bad], 0, "{bad}; {context}");
    }
    assert_eq!(d["decode_errors"], 0, "{context}");
    assert_eq!(d["dropped_packets"], 0, "{context}");
    // 0.6 s of playout less the buffer, in packets.
    let packet_frames = enc.frame_ms * 48.0;
    let expected = ((0.6 - G2N_BUFFER_MS / 1e3) * RATE / packet_frames).floor();
    assert!(
        n(&d["decoded_packets"]) >= expected - 2.0,
        "{} packets decoded ({} came after their time was concealed), expected about {expected}; {context}",
        d["decoded_packets"],
        d["late_packets"]
    );
    // Nothing was lost on loopback. GStreamer's first two packets overlap by the encoder's
    // look-ahead (it shifts every timestamp after the first back by it), so one packet may
    // be late and one gap concealed, no more -- unless GStreamer itself stalled (it is no
    // realtime sender: on a busy machine its pipeline can pause for tens of milliseconds and
    // then burst). The receiver measures that as arrival variation; a stall reaching a third
    // of the buffer may cost up to three more packets, and each must be counted.
    let sender_stalled = pdv_p99_ms > G2N_BUFFER_MS / 3.0;
    let late_allowed = if sender_stalled { 4.0 } else { 1.0 };
    assert!(n(&d["late_packets"]) <= late_allowed, "late packets; {context}");
    assert!(
        n(&d["concealed_frames"]) <= late_allowed * packet_frames,
        "the decoder concealed {} frames of a loss-free stream; {context}",
        d["concealed_frames"]
    );
    // The jitter buffer may trim its depth once by skipping a few frames (a click).
    check_tone(&output, 500.0, 20.0, 1, &context);
    let _ = std::fs::remove_file(&output);
    let _ = std::fs::remove_file(&stats);
}

/// What GStreamer sends, as `netjam recv` is told it without an SDP file.
const FORMAT_FLAGS: &[&str] = &[
    "--codec",
    "opus",
    "--rate",
    "48000",
    "--channels",
    "2",
    "--pt",
    "96",
];

#[test]
fn gstreamer_opus_20ms_is_decoded_with_format_flags() {
    gstreamer_to_netjam(
        "flags-20",
        GstEncoding {
            frame_ms: 20.0,
            audio_type: "generic",
        },
        FORMAT_FLAGS,
    );
}

#[test]
fn gstreamer_opus_low_delay_2_5ms_is_decoded_with_format_flags() {
    gstreamer_to_netjam(
        "flags-2.5",
        GstEncoding {
            frame_ms: 2.5,
            audio_type: "restricted-lowdelay",
        },
        FORMAT_FLAGS,
    );
}

/// The description GStreamer writes for `rtpopuspay` (gst_sdp_media_set_media_from_caps):
/// RFC 7587's `OPUS/48000/2` with stereo in `sprop-stereo`.
#[test]
fn gstreamer_opus_10ms_is_decoded_with_an_rfc7587_sdp_file() {
    let sdp = tmp("gst-opus.sdp");
    std::fs::write(
        &sdp,
        "v=0\r\n\
         o=- 1188340656180883 1 IN IP4 127.0.0.1\r\n\
         s=Session streamed by GStreamer\r\n\
         t=0 0\r\n\
         m=audio 5004 RTP/AVP 96\r\n\
         c=IN IP4 127.0.0.1\r\n\
         a=rtpmap:96 OPUS/48000/2\r\n\
         a=fmtp:96 sprop-stereo=1;sprop-maxcapturerate=48000\r\n\
         a=ptime:10\r\n",
    )
    .expect("write sdp");
    gstreamer_to_netjam(
        "sdp-10",
        GstEncoding {
            frame_ms: 10.0,
            audio_type: "generic",
        },
        &["--sdp", sdp.to_str().expect("path")],
    );
}

// ---------------------------------------------------------------------------------------
// netjam → GStreamer

/// The first RTP packet `netjam send --codec opus` sends with `args`.
fn first_netjam_packet(args: &[&str]) -> Vec<u8> {
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
    socket
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let to = socket.local_addr().expect("addr").to_string();
    let mut send = Proc::spawn(
        Command::new(BIN)
            .args([
                "send",
                "--to",
                &to,
                "--codec",
                "opus",
                "--sine",
                "1000",
                "--duration",
                "0.05",
            ])
            .args(args)
            .stderr(Stdio::null()),
        "netjam send",
    );
    let mut buf = [0u8; 2048];
    loop {
        let n = socket.recv(&mut buf).expect("a packet from netjam send");
        // RTP, not RTCP (payload types 200..=204 with the marker bit).
        if n >= 12 && !(200..=204).contains(&buf[1]) {
            let _ = send.wait_for(Duration::from_secs(5));
            return buf[..n].to_vec();
        }
    }
}

/// `netjam send --codec opus --sine 1000` for 1 s into GStreamer's depayloader and decoder.
fn netjam_to_gstreamer(tag: &str, opus_frame: &str) {
    require_gstreamer();
    // What GStreamer is given: payload type 100 with an RFC 8285 one-byte header extension.
    let p = first_netjam_packet(&["--opus-frame", opus_frame]);
    assert_eq!(p[0] >> 6, 2, "RTP version 2: {p:02x?}");
    assert_eq!(p[1] & 0x7f, 100, "payload type 100: {p:02x?}");
    assert_ne!(p[0] & 0x10, 0, "the extension bit: {p:02x?}");
    let at = 12 + 4 * usize::from(p[0] & 0x0f);
    assert_eq!(
        p[at..at + 2],
        [0xbe, 0xde],
        "one-byte extension profile: {p:02x?}"
    );

    let output = tmp(&format!("n2g-{tag}.wav"));
    // gst-launch prints its warnings on stdout.
    let gst_log = tmp(&format!("n2g-{tag}.log"));
    let gst = GstReceiver::start(
        "application/x-rtp,media=audio,clock-rate=48000,encoding-name=OPUS,payload=100",
        "rtpopusdepay ! opusdec ! audioconvert",
        &output,
        &gst_log,
    );
    let sent = Command::new(BIN)
        .args([
            "send",
            "--to",
            &gst.addr(),
            "--codec",
            "opus",
            "--opus-frame",
            opus_frame,
            "--sine",
            "1000",
            "--channels",
            "2",
            "--duration",
            "1.0",
        ])
        .output()
        .expect("netjam send");
    let send_said = String::from_utf8_lossy(&sent.stderr).to_string();
    assert!(sent.status.success(), "netjam send failed: {send_said}");
    let (status, gst_said) = gst.stop();
    // netjam multiplexes RTCP on the RTP port (RFC 5761); a bare udpsrc ! rtpopusdepay takes
    // each sender report for RTP and drops it with a warning, which is harmless.
    let dropped = gst_said.matches("invalid RTP payload").count();
    let context = format!("netjam send said {send_said:?}\nGStreamer said {gst_said:?}");
    eprintln!("{tag}: GStreamer dropped {dropped} datagrams as invalid RTP (netjam's RTCP)");
    assert!(status.success(), "{context}");
    let audio = read_wav(&output);
    let frames = audio.channels.first().map_or(0, Vec::len);
    assert!(
        (47_000..=50_000).contains(&frames),
        "GStreamer decoded {frames} frames of the 48000 sent; {context}"
    );
    check_tone(&output, 950.0, 25.0, 0, &context);
    let _ = std::fs::remove_file(&output);
    let _ = std::fs::remove_file(&gst_log);
}

#[test]
fn netjam_opus_2_5ms_is_decoded_by_gstreamer() {
    netjam_to_gstreamer("2.5", "2.5");
}

#[test]
fn netjam_opus_20ms_is_decoded_by_gstreamer() {
    netjam_to_gstreamer("20", "20");
}
