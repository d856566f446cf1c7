//! Interop with GStreamer (Debian's gstreamer1.0-plugins-good, installed by scripts/deps),
//! both ways, bit-exact: GStreamer's rtpL16pay → `netjam recv --codec/--rate/--channels`,
//! and `netjam send` → GStreamer's rtpL16depay.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{require_gstreamer, start_recv, GstReceiver, BIN};

fn tmp(name: &str) -> PathBuf {
    common::tmp("gst", name)
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
    require_gstreamer(&["rtpL16pay"]);
    let input = tmp(&format!("gst-in-{tag}.wav"));
    let output = tmp(&format!("gst-out-{tag}.wav"));
    // 0.3 s. GStreamer's pipeline may pause between its first packets and the rest while
    // it goes from paused to playing (about 47 ms once, on a loaded host): the fixed buffer
    // covers more than that, since the claim here is a bit-exact stream, not its latency.
    write_wav(&input, 14_400);
    let (mut recv, addr) = start_recv(
        &[
            format_args,
            &[
                "--buffer",
                "150ms",
                "--duration",
                "0.8",
                "--output",
                output.to_str().expect("path"),
            ],
        ]
        .concat(),
    );
    let status = Command::new("gst-launch-1.0")
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
    assert!(recv.wait_for(Duration::from_secs(10)).success());
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
    require_gstreamer(&["rtpL16depay", "wavenc"]);
    let input = tmp("nj-in.wav");
    let output = tmp("nj-out.wav");
    write_wav(&input, 14_400);
    let gst = GstReceiver::start(
        "application/x-rtp,media=audio,clock-rate=48000,encoding-name=L16,channels=2,payload=96",
        "rtpL16depay ! audioconvert ! audio/x-raw,format=S16LE",
        &output,
        &tmp("nj-out.log"),
    );
    let status = Command::new(BIN)
        .args([
            "send",
            "--to",
            &gst.addr(),
            "--input",
            input.to_str().expect("path"),
        ])
        .stderr(Stdio::null())
        .status()
        .expect("netjam send");
    assert!(status.success());
    let _ = gst.stop();
    let sent = samples(&input);
    let got = samples(&output);
    assert!(
        contains(&got, &sent),
        "GStreamer did not receive netjam's stream bit-exact ({} samples)",
        got.len()
    );
}
