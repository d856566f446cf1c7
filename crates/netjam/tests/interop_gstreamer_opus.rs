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

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_netjam");
const RATE: f64 = 48_000.0;
/// Peak amplitude both senders use: `audiotestsrc volume=0.5` and netjam's test tone.
const AMPLITUDE: f64 = 0.5;
const TONE_HZ: f64 = 1000.0;

// ---------------------------------------------------------------------------------------
// Processes

/// A child process that is killed when dropped, so a failing assertion leaves nothing
/// running.
#[derive(Debug)]
struct Proc {
    child: Child,
    what: &'static str,
    /// Lines the process wrote to stderr, if it was started with [`Proc::spawn_lines`].
    lines: Option<mpsc::Receiver<String>>,
}

impl Proc {
    fn spawn(cmd: &mut Command, what: &'static str) -> Self {
        let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        Self {
            child,
            what,
            lines: None,
        }
    }

    /// Start with stderr read line by line in a thread.
    fn spawn_lines(cmd: &mut Command, what: &'static str) -> Self {
        let mut p = Self::spawn(cmd.stderr(Stdio::piped()), what);
        let stderr = p.child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        p.lines = Some(rx);
        p
    }

    fn next_line(&self, timeout: Duration) -> String {
        self.lines
            .as_ref()
            .expect("started with spawn_lines")
            .recv_timeout(timeout)
            .unwrap_or_else(|_| panic!("{} printed nothing within {timeout:?}", self.what))
    }

    /// Every line printed so far.
    fn drain_lines(&self) -> Vec<String> {
        self.lines
            .as_ref()
            .map_or_else(Vec::new, |l| l.try_iter().collect())
    }

    /// Wait for the process to exit on its own; panics (and the drop kills it) after
    /// `timeout`.
    fn wait_for(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not finish within {timeout:?}",
                self.what
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGINT: `gst-launch-1.0 -e` turns it into end-of-stream, so wavenc finishes its file.
    fn interrupt(&self) {
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn require_gstreamer() {
    for element in ["opusenc", "opusdec", "rtpopuspay", "rtpopusdepay", "wavenc"] {
        let ok = Command::new("gst-inspect-1.0")
            .arg(element)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        assert!(
            ok.is_ok_and(|s| s.success()),
            "GStreamer's {element} is missing: run scripts/deps (installs gstreamer1.0-tools, -plugins-base and -plugins-good)"
        );
    }
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("netjam-gst-opus-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

/// A port nobody uses right now (as the other interop tests pick them).
fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// Start `netjam recv` on an ephemeral port and return it with the address it took.
fn start_recv(args: &[&str]) -> (Proc, SocketAddr) {
    let recv = Proc::spawn_lines(
        Command::new(BIN)
            .args(["recv", "--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::null()),
        "netjam recv",
    );
    let line = recv.next_line(Duration::from_secs(10));
    let addr = line
        .rsplit(' ')
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    (recv, addr)
}

fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("stats JSON")
}

// ---------------------------------------------------------------------------------------
// Signal analysis

/// A WAV file as one vector of samples (-1..1) per channel.
#[derive(Debug)]
struct Audio {
    rate: u32,
    channels: Vec<Vec<f64>>,
}

fn read_wav(path: &Path) -> Audio {
    let mut r = hound::WavReader::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let spec = r.spec();
    let all: Vec<f64> = match spec.sample_format {
        hound::SampleFormat::Float => r
            .samples::<f32>()
            .map(|s| f64::from(s.expect("sample")))
            .collect(),
        hound::SampleFormat::Int => {
            let scale = f64::from(1u32 << (spec.bits_per_sample - 1));
            r.samples::<i32>()
                .map(|s| f64::from(s.expect("sample")) / scale)
                .collect()
        }
    };
    let ch = usize::from(spec.channels);
    let channels = (0..ch)
        .map(|c| all.iter().skip(c).step_by(ch).copied().collect())
        .collect();
    Audio {
        rate: spec.sample_rate,
        channels,
    }
}

/// Power of `x` at `hz` (Goertzel).
fn goertzel(x: &[f64], hz: f64) -> f64 {
    let k = 2.0 * (2.0 * std::f64::consts::PI * hz / RATE).cos();
    let (mut s1, mut s2) = (0.0, 0.0);
    for &v in x {
        let s0 = v + k * s1 - s2;
        s2 = s1;
        s1 = s0;
    }
    s1 * s1 + s2 * s2 - k * s1 * s2
}

/// The strongest frequency between 50 Hz and 10 kHz, to 5 Hz.
fn dominant_hz(x: &[f64]) -> f64 {
    let mut best = (0.0, 0.0);
    for step in 10..=2000 {
        let hz = f64::from(step) * 5.0;
        let p = goertzel(x, hz);
        if p > best.1 {
            best = (hz, p);
        }
    }
    best.0
}

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

/// The quietest 2.5 ms (RMS) in `x`, over windows starting at every sample, and where it
/// starts, in ms.
fn quietest_window(x: &[f64]) -> (f64, f64) {
    let mut sum = vec![0.0; x.len() + 1];
    for (i, v) in x.iter().enumerate() {
        sum[i + 1] = sum[i] + v * v;
    }
    (0..x.len().saturating_sub(119))
        .map(|i| {
            (
                ((sum[i + 120] - sum[i]).max(0.0) / 120.0).sqrt(),
                i as f64 / RATE * 1000.0,
            )
        })
        .fold((f64::INFINITY, 0.0), |m, w| if w.0 < m.0 { w } else { m })
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
        quietest_at_ms: (first + head) as f64 / RATE * 1000.0 + at,
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
                "30ms",
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
    eprintln!(
        "{tag}: decoder {d}; received {}; jitter buffer skipped {} and inserted {} frames",
        s["received"], s["jitter_buffer"]["skipped_frames"], s["jitter_buffer"]["inserted_frames"]
    );
    assert_eq!(s["format"]["codec"], "opus", "{context}");
    assert_eq!(s["format"]["channels"], 2, "{context}");
    for bad in ["malformed", "wrong_payload_type", "undecodable", "unknown_format"] {
        assert_eq!(s[bad], 0, "{bad}; {context}");
    }
    assert_eq!(d["decode_errors"], 0, "{context}");
    assert_eq!(d["dropped_packets"], 0, "{context}");
    // 0.6 s of playout less the 30 ms buffer, in packets.
    let packet_frames = enc.frame_ms * 48.0;
    let expected = (0.57 * RATE / packet_frames).floor();
    assert!(
        n(&d["decoded_packets"]) >= expected - 2.0,
        "{} packets decoded ({} came after their time was concealed), expected about {expected}; {context}",
        d["decoded_packets"],
        d["late_packets"]
    );
    // Nothing was lost on loopback. GStreamer's first two packets overlap by the encoder's
    // look-ahead (it shifts every timestamp after the first back by it), so one packet may
    // be late and one gap concealed, no more.
    assert!(n(&d["late_packets"]) <= 1.0, "late packets; {context}");
    assert!(
        n(&d["concealed_frames"]) <= packet_frames,
        "the decoder concealed {} frames of a loss-free stream; {context}",
        d["concealed_frames"]
    );
    // The jitter buffer may trim its depth once by skipping a few frames (a click).
    check_tone(&output, 500.0, 20.0, 1, &context);
    let _ = std::fs::remove_file(&output);
    let _ = std::fs::remove_file(&stats);
}

#[test]
fn gstreamer_opus_20ms_is_decoded_with_format_flags() {
    gstreamer_to_netjam(
        "flags-20",
        GstEncoding {
            frame_ms: 20.0,
            audio_type: "generic",
        },
        &[
            "--codec",
            "opus",
            "--rate",
            "48000",
            "--channels",
            "2",
            "--pt",
            "96",
        ],
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
        &[
            "--codec",
            "opus",
            "--rate",
            "48000",
            "--channels",
            "2",
            "--pt",
            "96",
        ],
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
    let port = free_port();
    // gst-launch prints its warnings on stdout.
    let gst_log = tmp(&format!("n2g-{tag}.log"));
    let mut gst = Proc::spawn_lines(
        Command::new("gst-launch-1.0")
            .args(["-e", "udpsrc", &format!("port={port}"), "address=127.0.0.1"])
            .arg("caps=application/x-rtp,media=audio,clock-rate=48000,encoding-name=OPUS,payload=100")
            .args([
                "!",
                "rtpopusdepay",
                "!",
                "opusdec",
                "!",
                "audioconvert",
                "!",
                "wavenc",
                "!",
            ])
            .args(["filesink", &format!("location={}", output.display())])
            .stdout(std::fs::File::create(&gst_log).expect("log file")),
        "gst-launch-1.0 (receiver)",
    );
    // udpsrc binds with SO_REUSEADDR; a plain bind fails once it has the port.
    let deadline = Instant::now() + Duration::from_secs(10);
    while UdpSocket::bind(("127.0.0.1", port)).is_ok() {
        assert!(
            gst.running() && Instant::now() < deadline,
            "GStreamer did not open port {port}: {:?}",
            gst.drain_lines()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200)); // from PAUSED to PLAYING
    let sent = Command::new(BIN)
        .args([
            "send",
            "--to",
            &format!("127.0.0.1:{port}"),
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
    std::thread::sleep(Duration::from_millis(300));
    gst.interrupt();
    let status = gst.wait_for(Duration::from_secs(10));
    let mut gst_said = std::fs::read_to_string(&gst_log).unwrap_or_default();
    gst_said.extend(gst.drain_lines().iter().map(|l| format!("{l}\n")));
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
