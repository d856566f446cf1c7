//! Interop with GStreamer (Debian's gstreamer1.0-plugins-good, installed by scripts/deps),
//! both ways, bit-exact: GStreamer's rtpL16pay → `netjam recv --codec/--rate/--channels`,
//! and `netjam send` → GStreamer's rtpL16depay.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_netjam");

fn gst() -> &'static str {
    let ok = Command::new("gst-inspect-1.0")
        .arg("rtpL16pay")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    assert!(
        ok.is_ok_and(|s| s.success()),
        "GStreamer's rtpL16pay is missing: run scripts/deps (installs gstreamer1.0-tools and -plugins-good)"
    );
    "gst-launch-1.0"
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("netjam-gst-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

fn write_wav(path: &Path, frames: usize) {
    let spec = hound::WavSpec {
        channels: 2,
        sample_rate: 48_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(path, spec).expect("create");
    let mut x = 99u32;
    for i in 0..frames * 2 {
        x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        // A tone plus noise: loud enough that no sample is lost in silence detection.
        let tone = ((i / 2) as f64 * 0.05).sin() * 12_000.0;
        w.write_sample((tone as i32 + (x >> 20) as i32 - 2048) as i16)
            .expect("write");
    }
    w.finalize().expect("finalize");
}

fn samples(path: &Path) -> Vec<i16> {
    hound::WavReader::open(path)
        .expect("open")
        .samples::<i16>()
        .map(|s| s.expect("sample"))
        .collect()
}

fn contains(hay: &[i16], needle: &[i16]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

#[test]
fn gstreamer_rtp_l16_is_received_bit_exact_with_format_flags() {
    gstreamer_to_netjam("flags", &["--codec", "l16", "--rate", "48000", "--channels", "2"]);
}

#[test]
fn gstreamer_rtp_l16_is_received_bit_exact_with_an_sdp_file() {
    let sdp = tmp("stream.sdp");
    let out = Command::new(BIN)
        .args([
            "sdp",
            "--codec",
            "l16",
            "--rate",
            "48000",
            "--channels",
            "2",
            "--port",
            "5004",
            "--frames",
            "64",
        ])
        .output()
        .expect("netjam sdp");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert!(text.contains("a=rtpmap:96 L16/48000/2"), "{text}");
    std::fs::write(&sdp, text).expect("write sdp");
    gstreamer_to_netjam("sdp", &["--sdp", sdp.to_str().expect("path")]);
}

fn gstreamer_to_netjam(tag: &str, format_args: &[&str]) {
    let gst = gst();
    let input = tmp(&format!("gst-in-{tag}.wav"));
    let output = tmp(&format!("gst-out-{tag}.wav"));
    write_wav(&input, 14_400); // 0.3 s
    let mut recv = Command::new(BIN)
        .args(["recv", "--listen", "127.0.0.1:0"])
        .args(format_args)
        .args([
            "--buffer",
            "40ms",
            "--duration",
            "0.6",
            "--output",
            output.to_str().expect("path"),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("netjam recv");
    let mut lines = BufReader::new(recv.stderr.take().expect("stderr")).lines();
    let first = lines.next().expect("a line").expect("utf-8");
    let addr: SocketAddr = first
        .rsplit(' ')
        .next()
        .and_then(|a| a.parse().ok())
        .expect("listen address");
    std::thread::spawn(move || for _ in lines {});
    let status = Command::new(gst)
        .arg("-q")
        .args([
            "filesrc",
            &format!("location={}", input.display()),
            "!",
            "wavparse",
            "!",
            "audioconvert",
            "!",
        ])
        .args([
            "audio/x-raw,format=S16BE,rate=48000,channels=2",
            "!",
            "rtpL16pay",
            "pt=96",
            "min-ptime=1333333",
            "max-ptime=1333333",
            "!",
        ])
        .args(["udpsink", "host=127.0.0.1", &format!("port={}", addr.port())])
        .stdout(Stdio::null())
        .status()
        .expect("gst-launch");
    assert!(status.success());
    assert!(recv.wait().expect("recv").success());
    let sent = samples(&input);
    let got = samples(&output);
    assert!(
        contains(&got, &sent),
        "GStreamer's stream was not received bit-exact ({} samples out)",
        got.len()
    );
}

#[test]
fn netjam_stream_is_received_bit_exact_by_gstreamer() {
    let gst = gst();
    let input = tmp("nj-in.wav");
    let output = tmp("nj-out.wav");
    write_wav(&input, 14_400);
    let port = free_port();
    let mut gst_rx = Command::new(gst)
        .args(["-q", "-e", "udpsrc", &format!("port={port}"), "address=127.0.0.1"])
        .arg("caps=application/x-rtp,media=audio,clock-rate=48000,encoding-name=L16,channels=2,payload=96")
        .args([
            "!",
            "rtpL16depay",
            "!",
            "audioconvert",
            "!",
            "audio/x-raw,format=S16LE",
            "!",
            "wavenc",
            "!",
        ])
        .args(["filesink", &format!("location={}", output.display())])
        .stdout(Stdio::null())
        .spawn()
        .expect("gst-launch");
    std::thread::sleep(Duration::from_millis(700)); // let the pipeline reach PLAYING
    let status = Command::new(BIN)
        .args([
            "send",
            "--to",
            &format!("127.0.0.1:{port}"),
            "--input",
            input.to_str().expect("path"),
        ])
        .stderr(Stdio::null())
        .status()
        .expect("netjam send");
    assert!(status.success());
    std::thread::sleep(Duration::from_millis(300));
    // -e turns SIGINT into end-of-stream, so wavenc writes its header.
    let _ = Command::new("kill")
        .args(["-INT", &gst_rx.id().to_string()])
        .status();
    let _ = gst_rx.wait();
    let sent = samples(&input);
    let got = samples(&output);
    assert!(
        contains(&got, &sent),
        "GStreamer did not receive netjam's stream bit-exact ({} samples)",
        got.len()
    );
}
