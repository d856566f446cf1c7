//! A two-player jam: full duplex with one other player (or a `netjam reflect`) on one
//! UDP socket. The other player is the one member of a room of two, on the same player
//! core as a room's members ([`crate::session::JamProcess`]): send what you play, hear
//! what they play, mixed with your gain and mute on them. Against `netjam reflect` it is a
//! self-test: you hear your own round trip, and RTCP measures it.
//!
//! This module wires the device the player opened to the core, OSC control and the
//! ensemble's click, runs it in the player's shell ([`crate::shell`]), and says what
//! happens: the live status line, the closing figures, where the time goes, and the JSON
//! report. What to do comes in a [`PeerPlay`], parsed by `netjam jam --peer`.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use netjam_engine::player::Command;

use crate::control::jam::JamControl;
use crate::endpoint::PeriodStats;
use crate::ensemble::beat_delay::DelayState;
use crate::record::{self, RecordSummary};
use crate::series::BoundedSeries;
use crate::session::{interrupt_flag, JamProcess, JamStats, NetIo, Peer, Snapshot, PEER_TRACK};
use crate::shell::{
    bind, finish_recording, heard_format, recording_status, start_player, start_recording, stop_player,
    write_json, Click, DeviceReport, PlayerAsk, PlayerDevice, StartedPlayer,
};
use crate::status::{codec_delay, meter, packets_text, HeardRate, StatusLine};

/// What a two-player jam asked for, every address resolved.
#[derive(Debug)]
pub struct PeerPlay {
    /// The other player, as resolved and as given.
    pub peer: SocketAddr,
    pub peer_text: String,
    /// The address to send from and listen on.
    pub listen: SocketAddr,
    /// Gain on the other player, and whether they start muted.
    pub gain_db: f32,
    pub mute: bool,
    /// Hear the other player a beat or a bar after they played (with a click).
    pub delay_to_beat: Option<BeatDelay>,
    /// What every player asks for besides where it plays.
    pub player: PlayerAsk,
}

/// How far a delay to the beat reaches: beats, and the unit's name as said.
#[derive(Debug, Clone, Copy)]
pub struct BeatDelay {
    pub beats: u64,
    pub unit: &'static str,
}

/// The longest delay `--delay-to-beat` reserves room for: a bar of four at 30 BPM.
const DELAY_MAX_NS: u64 = 8_000_000_000;

/// Plays until the device's duration ends or Ctrl-C; then says what was heard and
/// writes the report.
pub fn run(a: PeerPlay, device: PlayerDevice, sender: netjam_engine::sender::Sender) -> anyhow::Result<()> {
    let peer = a.peer;
    let format = sender.format();
    let heard = heard_format(format, device.spec());
    let socket = bind(a.listen)?;
    crate::rt::set_period_ns(netjam_engine::time::frames_to_ns(
        a.player.device.frames.into(),
        format.rate,
    ));
    let (io, link) = NetIo::start(socket, Peer::Fixed(peer))?;
    let packets = packets_text(&sender);
    let packet_ms = sender.packet_ns() as f64 / 1e6;
    let (mut process, mut snaps, commands) = JamProcess::new(sender, link, a.player.media.clone());
    let m = process.media_mut();
    m.members_mut().set_latency_policy(a.player.latency);
    m.apply(Command::Gain {
        member: PEER_TRACK,
        db: a.gain_db,
    });
    m.apply(Command::Mute {
        member: PEER_TRACK,
        mute: a.mute,
    });
    m.apply(Command::MasterGain {
        db: a.player.master_gain_db,
    });
    m.apply(Command::MonitorMute {
        mute: !a.player.monitor,
    });
    m.measure_round_trip(a.player.measure_round_trip);
    let control = a
        .player
        .osc
        .map(|bind| JamControl::spawn(bind, commands, a.gain_db, a.mute, &a.peer_text, packet_ms));
    let control = control.transpose()?;
    if let Some(c) = &control {
        eprintln!(
            "netjam: OSC control on {} ('/_meta ,s PATH' describes an address)",
            c.local_addr()
        );
    }
    let recorder = start_recording(
        a.player.record.as_deref(),
        &mut process,
        (format.rate, heard.channels, format.channels),
        Box::new(|_| Some(PEER_TRACK_NAME.into())),
        &format!(
            "{} (the other player)",
            record::member_file_name(PEER_TRACK, PEER_TRACK_NAME)
        ),
    )?;
    // The ensemble's click, mixed into what you hear (a no-op without --ensemble).
    let mut beat = a.player.click.start()?;
    if let (Some(b), Some(delay)) = (&beat, a.delay_to_beat) {
        b.shared.delay_beats.store(delay.beats, Ordering::Relaxed);
    }
    let click = Click {
        beat: beat.as_mut(),
        gain_db: a.player.click.gain_db,
        delay_max_ns: a.delay_to_beat.map(|_| DELAY_MAX_NS),
    };
    // Ctrl-C from now on stops the stream: before the line a caller waits for.
    let stop = interrupt_flag();
    let StartedPlayer {
        running,
        mut monitors,
        hear_edge_ms,
    } = start_player(
        process,
        device,
        &a.player.device,
        (io, format),
        click,
        stop,
        |local| {
            eprintln!("netjam: jamming with {peer} from {local} ({format}, {packets})");
        },
    )?;
    let mut status = StatusLine::new();
    let mut series = BoundedSeries::default();
    let mut rate_told = HeardRate::default();
    let mut delay_told = DelayState::Waiting;
    running.watch(&mut snaps, |s| {
        let heard_rate = s.stats.heard.format.map(|f| f.rate);
        if let Some(line) = rate_told.tell(
            "the other player",
            heard_rate,
            s.stats.heard.rate_mismatch,
            heard.rate,
        ) {
            status.finish();
            eprintln!("{line}");
        }
        let mut line = jam_line(&s);
        if let Some(w) = &recorder {
            line.push_str(&recording_status(w, format.rate));
        }
        monitors.on_snapshot(&mut line, &mut status, beat.as_ref());
        if let (Some(b), Some(delay)) = (&beat, a.delay_to_beat) {
            let want = b.shared.delay_want_ns.load(Ordering::Relaxed);
            let state = DelayState::from_word(b.shared.delay_state.load(Ordering::Relaxed), want);
            line.push_str("  ");
            line.push_str(&state.text(delay.unit));
            // Said on a line of its own whenever it goes from one state to another.
            if std::mem::discriminant(&state) != std::mem::discriminant(&delay_told) {
                delay_told = state;
                status.finish();
                eprintln!("netjam: {}", state.text(delay.unit));
            }
        }
        status.show(&line);
        if let Some(c) = &control {
            c.publish(&s);
        }
        series.push(s);
    });
    status.finish();
    let (mut process, periods) = stop_player(running, beat.as_mut())?;
    // The audio thread has stopped: what it queued is written, then the files are closed.
    drop(process.take_recorder());
    let record = finish_recording(recorder)?;
    let stats = process.stats();
    let jb = &stats.heard.jitter_buffer;
    eprintln!(
        "netjam: sent {} packets, heard {} (lost {}; {}); rtt {}; buffer target {:.2} ms, added latency {:.2} ms",
        stats.sent.packets,
        stats.heard.received,
        stats.heard.lost,
        crate::status::discontinuity_text(jb),
        stats.sent.rtt_ms.map_or("not measured".into(), |r| format!("{r:.2} ms")),
        jb.target_ms,
        jb.added_latency_ms
    );
    let device_rate = monitors.rate();
    let device = monitors.report(&periods);
    let stages = Stages {
        round_trip_ms: stats.round_trip_ms,
        network_ms: stats.sent.rtt_floor_ms,
        packet_ms,
        codec_ms: stats.sent.codec_delay_ms + hear_edge_ms,
        jitter_buffer_ms: stats
            .round_trip_buffer_ms
            .unwrap_or(stats.heard.jitter_buffer.added_latency_recent_ms),
        device_ms: device
            .device_frames()
            .map(|frames| frames * 1e3 / f64::from(device_rate.max(1))),
    };
    eprintln!("netjam: where the time goes: {stages}");
    if let Some(line) = crate::rt::report_line() {
        eprintln!("netjam: {line}");
    }
    if let Some(path) = &a.player.stats_json {
        write_json(
            path,
            &JamReport {
                stats,
                periods,
                discontinuities: process
                    .heard()
                    .map(|r| r.recent_discontinuities().copied().collect())
                    .unwrap_or_default(),
                series,
                device,
                stages,
                threads: crate::rt::threads(),
                record,
            },
        )?;
    }
    Ok(())
}

#[derive(Debug, serde::Serialize)]
struct JamReport {
    stats: JamStats,
    periods: PeriodStats,
    /// The most recent concealed, inserted and skipped stretches of what you heard.
    discontinuities: Vec<netjam_engine::discontinuity::Discontinuity>,
    series: BoundedSeries<Snapshot<JamStats>>,
    #[serde(flatten)]
    device: DeviceReport,
    stages: Stages,
    /// What scheduling each of netjam's own threads got.
    threads: Vec<crate::rt::ThreadRt>,
    /// What `--record` wrote.
    #[serde(skip_serializing_if = "Option::is_none")]
    record: Option<RecordSummary>,
}

/// The file name of the other player's track in a two-player recording.
const PEER_TRACK_NAME: &str = "peer";

/// What each stage of the path adds, beside the round trip measured in band, so a player
/// sees where the time goes.
#[derive(Debug, serde::Serialize)]
struct Stages {
    /// The mouth-to-ear round trip found in band (with `--measure-roundtrip`), ms.
    round_trip_ms: Option<f64>,
    /// RTCP's round trip, the least of the last few reports: the network both ways and the
    /// far end's turnaround, without a stall of either host at the moment of one report, ms.
    network_ms: Option<f64>,
    /// The packet's worth of audio the sender waits for, ms.
    packet_ms: f64,
    /// The encoder's look-ahead (Opus), and the resamplers at the edges when the device
    /// runs at another rate than Opus's 48 kHz, ms.
    codec_ms: f64,
    /// Time from a packet's arrival to its first frame played: for the packet heard when
    /// the in-band round trip was last measured (so the stages describe that round trip),
    /// else the mean over about the last second, ms.
    jitter_buffer_ms: f64,
    /// The device's own buffering where netjam knows it (a period each way for JACK; the
    /// callbacks each way plus the capture-to-playback cushion for a sound card), ms.
    device_ms: Option<f64>,
}

impl std::fmt::Display for Stages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.2} ms"));
        write!(
            f,
            "network {} (RTCP round trip), packet {:.2} ms, codec {:.2} ms, jitter buffer {:.2} ms, device {}",
            ms(self.network_ms),
            self.packet_ms,
            self.codec_ms,
            self.jitter_buffer_ms,
            ms(self.device_ms)
        )?;
        if let Some(rt) = self.round_trip_ms {
            write!(f, "; measured in band: {rt:.2} ms mouth to ear")?;
        }
        Ok(())
    }
}

fn jam_line(s: &Snapshot<JamStats>) -> String {
    let (t, r) = (&s.stats.sent, &s.stats.heard);
    let jb = &r.jitter_buffer;
    format!(
        "{:>7.1}s  sent {:>7}  heard {:>7}  lost {:>4}  rtt {}{}  buffer {:>5.2}/{:>5.2} ms  conceal {:>4}{}  {}",
        s.t_s,
        t.packets,
        r.received,
        r.lost,
        t.rtt_ms.map_or("  -  ".into(), |x| format!("{x:5.1} ms")),
        s.stats.round_trip_ms.map_or(String::new(), |x| format!("  mouth-to-ear {x:5.1} ms")),
        jb.depth_ms,
        jb.target_ms,
        jb.concealment_events,
        codec_delay(t),
        meter(s.peak_dbfs)
    )
}
