//! A player in a room: take a seat on the rooms server (before any audio runs, so the
//! stream starts with the SSRC the room assigned), then send what you play once, to the
//! server, and hear every other member through a receiver of its own, mixed with
//! per-member gain, pan and mute. You hear yourself only through the local monitor (off
//! unless asked for), never through the network. With OSC every mix parameter is an
//! address; with the page ([`crate::web::room_page`]) a browser sees the room and sets the
//! mix, its commands polled by the room client's control thread beside OSC's.
//!
//! This module decides nothing about the protocol: it wires the library pieces
//! ([`crate::room_client`], [`crate::session::RoomProcess`], [`crate::control`],
//! [`crate::web`]) to the device the player opened, run by the player's shell
//! ([`crate::shell`]) as a two-player jam's is, and says what happens. What to do comes
//! in a [`RoomPlay`], parsed by `netjam jam`.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context};
use netjam_engine::player::{Command, MediaReport};
use netjam_engine::privacy::{MediaSeal, RoomSecret};

use crate::control::{command_ring, ControlHandle, ControlServer, ControlState, Surface, DEFAULT_RING};
use crate::member_ports::{self, MemberPorts};
use crate::room_client::{self, RoomWires, CONTROL_QUEUE};
use crate::room_join::{take_seat, SeatAsk, Taken};
use crate::room_view::{
    heard_members, keep_peaks, publish, remember, room_line, summary, Everyone, HeardMember, RoomPoint,
    RoomReport, RoundTrips, Told,
};
use crate::series::BoundedSeries;
use crate::session::{interrupt_flag, NetIo, Peer, RoomProcess, Snapshot, MAX_ROOM_MEMBERS};
use crate::shell::{
    finish_recording, heard_format, recording_status, start_player, start_recording, stop_player, write_json,
    Click, PlayerAsk, PlayerDevice, StartedPlayer,
};
use crate::status::{packets_text, StatusLine};
use crate::web::room_page::{FixedStages, RoomPage};
use crate::web::WebListener;

/// What a player in a room asked for, every address resolved and the page's bound.
#[derive(Debug)]
pub struct RoomPlay {
    /// The rooms server to ask first, and the others sharing its room directory.
    pub server: SocketAddr,
    pub also: Vec<SocketAddr>,
    /// A STUN server to compare the public address with.
    pub stun: Option<SocketAddr>,
    pub room: String,
    pub name: String,
    /// How to take the seat (its password makes the room private).
    pub seat: SeatAsk,
    /// The player's page, its address already taken.
    pub web: Option<WebListener>,
    /// JACK ports for each member.
    pub member_ports: bool,
    /// What every player asks for besides where it plays.
    pub player: PlayerAsk,
}

/// How often the main thread looks for snapshots: with a page, each one as it comes.
const WATCH: Duration = Duration::from_millis(100);
const PAGE_WATCH: Duration = Duration::from_millis(20);

/// OSC control: every mix parameter of the room as an OSC address, its commands for the
/// room client's control thread to pass on.
fn start_osc(
    a: &RoomPlay,
    bind: SocketAddr,
    private: bool,
    passwords: mpsc::Sender<String>,
) -> anyhow::Result<(ControlHandle, crate::control::room::OscCommands)> {
    // Redundancy cannot change while a room's stream runs: its address is left out, so a
    // set is answered with an error instead of being taken and ignored.
    let surface = Surface {
        redundancy: false,
        record: a.player.record.is_some(),
        password: private,
        ..Surface::room()
    };
    let mut state = ControlState::new(&surface);
    state.latency = a.player.latency;
    state.monitor.mute = !a.player.monitor;
    state.master_gain_db = a.player.master_gain_db;
    state.record = a.player.record.is_some();
    let (tx, rx) = command_ring(DEFAULT_RING);
    let handle = ControlServer::spawn_with_passwords(bind, surface, state, tx, passwords)?;
    eprintln!(
        "netjam: OSC control on {} (/memberN/gain, /memberN/pan, /memberN/mute, /memberN/solo, /send/gain, /monitor/mute, /master/gain, /roster; '/_meta ,s PATH' describes an address)",
        handle.local_addr()
    );
    Ok((
        handle,
        crate::control::room::OscCommands::new(rx, a.player.record.is_some()),
    ))
}

/// The player's page of the room on `listener`, said with who may use it.
fn start_page(
    listener: WebListener,
    a: &RoomPlay,
    room: &str,
    passwords: Option<mpsc::Sender<String>>,
) -> anyhow::Result<(RoomPage, crate::web::room_page::PageCommands)> {
    let url = listener.url();
    let note = if listener.access().token().is_none() {
        "this machine only"
    } else {
        "anyone with this URL can change your mix: share it only with yourself"
    };
    let record_dir = a.player.record.as_ref().map(|d| d.display().to_string());
    let started =
        RoomPage::start(listener, record_dir, passwords).map_err(|e| anyhow::anyhow!("--web: {e}"))?;
    eprintln!("netjam: your page of room {room:?}: {url} ({note})");
    Ok(started)
}

/// Plays in the room until the device's duration ends, Ctrl-C, or this player is replaced
/// by itself joining again; then leaves, says what was heard and writes the report.
pub fn run(
    mut a: RoomPlay,
    mut device: PlayerDevice,
    mut sender: netjam_engine::sender::Sender,
) -> anyhow::Result<()> {
    let (server, also, room, name) = (
        a.server,
        std::mem::take(&mut a.also),
        a.room.clone(),
        a.name.clone(),
    );
    // A room with a password is private: its audio is sealed with keys only those who know
    // the password can derive. Argon2id is slow on purpose: derived once, before joining.
    let private = match a.seat.password.as_deref().filter(|p| !p.is_empty()) {
        Some(password) => {
            let started = std::time::Instant::now();
            let secret = RoomSecret::derive(&room, password)
                .context("cannot derive the room's keys from --password: try another password")?;
            Some((secret.media_key(), secret.join_proof(), started.elapsed()))
        }
        None => None,
    };
    let device_spec = device.spec();
    let format = sender.format();
    let heard = heard_format(format, device_spec);
    // The device's own rate: with Opus on a device at another rate than 48 kHz the room runs
    // at 48 kHz between two edge resamplers (see `EdgeProcess`).
    let device_rate = device_spec.map_or(format.rate, |s| s.rate);
    if a.member_ports && device_rate != format.rate {
        // The per-member ports are filled at the process's rate: following the edge would
        // take a resampler for every seat's channels on the audio thread.
        bail!(
            "--member-ports with --codec opus needs the JACK server at Opus's {} Hz, and it runs at {device_rate} Hz: \
             restart JACK at 48000 Hz (jackd -r 48000), or leave out --member-ports (the room's mix plays at any rate)",
            format.rate
        );
    }
    let web = a.web.take();
    let Taken {
        socket,
        seated,
        reflexive,
        port_mapping,
    } = take_seat(
        &a.seat,
        (server, also, a.stun),
        (&room, &name),
        private.as_ref().map(|p| (p.0, p.1)),
        &sender,
    )?;
    let front_doors = seated.session.front().clone();
    let server = seated.session.server();
    sender.set_ssrc(seated.ssrc);
    let (member_id, ssrc) = (seated.member_id, seated.ssrc);
    let join_ms = seated.took.as_secs_f64() * 1e3;
    let packets = packets_text(&sender);
    let packet_ms = sender.packet_ns() as f64 / 1e6;
    let (control_tx, control_rx) = mpsc::sync_channel(CONTROL_QUEUE);
    let (io, link) = NetIo::start_with_control(socket, Peer::Fixed(server), Some(control_tx))?;
    let (mut process, mut snaps, mut commands) = RoomProcess::new(sender, link, a.player.media.clone());
    if let Some((media, _, took)) = private {
        process
            .media_mut()
            .set_seal(MediaSeal::new(media, 0, ssrc, MAX_ROOM_MEMBERS));
        eprintln!(
            "netjam: private room: your audio is sealed end to end (SFrame, RFC 9605) and only members with the password can open it; the server forwards what it cannot hear (keys derived in {:.0} ms)",
            took.as_secs_f64() * 1e3
        );
    }
    process
        .media_mut()
        .members_mut()
        .set_latency_policy(a.player.latency);
    process
        .media_mut()
        .measure_round_trip(a.player.measure_round_trip);
    let mut round_trips = a.player.measure_round_trip.then(|| RoundTrips {
        readings: BoundedSeries::default(),
        found: 0,
        lost: 0,
    });
    // You hear yourself through your own monitoring unless you ask for netjam's.
    let _ = commands.push(Command::MonitorMute {
        mute: !a.player.monitor,
    });
    if a.player.master_gain_db != 0.0 {
        let _ = commands.push(Command::MasterGain {
            db: a.player.master_gain_db,
        });
    }
    // A private room's password can change while it plays (OSC's `/password`).
    let (password_tx, password_rx) = mpsc::channel();
    let (osc, extra) = match a.player.osc {
        Some(bind) => {
            let (handle, commands) = start_osc(&a, bind, private.is_some(), password_tx.clone())?;
            (Some(handle), Some(commands))
        }
        None => (None, None),
    };
    let (mut page, page_commands) = match web {
        Some(listener) => {
            let passwords = private.is_some().then(|| password_tx.clone());
            let (page, commands) = start_page(listener, &a, &room, passwords)?;
            (Some(page), Some(commands))
        }
        None => (None, None),
    };
    // An ensemble in this same room rides on this seat: one seat per player.
    let ens_seat = if a.player.click.shares_seat_in(&room) {
        Some(crate::ensemble::SharedSeat::new(io.socket.socket(), server)?)
    } else {
        None
    };
    let wires = RoomWires {
        send: {
            let socket = io.socket.clone();
            move |bytes: &[u8], to: SocketAddr| {
                if let Err(e) = socket.send_to(bytes, to) {
                    tracing::debug!("room control to {to}: {e}");
                }
            }
        },
        route: io.route.clone(),
        ensemble: ens_seat.as_ref().map(crate::ensemble::SharedSeat::inbox),
        passwords: private.is_some().then_some(password_rx),
    };
    // The control thread stays the command ring's one producer: OSC's and the page's
    // commands reach the audio thread through it.
    let room_link = room_client::spawn(seated, wires, control_rx, commands, (extra, page_commands))?;
    let roster = room_link.roster.clone();
    let recorder = start_recording(
        a.player.record.as_deref(),
        &mut process,
        (format.rate, heard.channels, format.channels),
        Box::new(move |id| {
            roster
                .lock()
                .ok()
                .and_then(|r| r.members.get(&id).map(|m| m.name.clone()))
        }),
        "NN-name.wav per member",
    )?;
    let mut member_ports = match (a.member_ports, device.jack.as_mut()) {
        (false, _) => None,
        (true, None) => bail!("--member-ports gives each member JACK ports of its own: add --jack"),
        (true, Some(j)) => Some(member_ports::start(j, usize::from(heard.channels), &mut process)?),
    };
    // The ensemble's click (with --ensemble): the room is the ensemble, through its server.
    let password = a.seat.password.clone().unwrap_or_default();
    let mut beat = a
        .player
        .click
        .start_in_room(server, front_doors, &room, &password, ens_seat)?;
    let click = Click {
        beat: beat.as_mut(),
        gain_db: a.player.click.gain_db,
        delay_max_ns: None,
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
        stop.clone(),
        |local| {
            eprintln!(
            "netjam: in room {room:?} as member {member_id} from {local} ({format}, {packets}); you hear the others, not yourself{}; seated in {:.0} ms",
            if a.player.monitor { " except through --monitor" } else { "" },
            join_ms
        );
        },
    )?;
    // What every member's path has besides the network and your buffer: a packet of audio,
    // a device period at each end (theirs taken to be like yours), and the resampler from
    // Opus's 48 kHz to your device if it runs at another rate.
    let fixed = FixedStages {
        packet_ms,
        device_ms: 2.0 * monitors.jack_period_ms().unwrap_or(0.0),
        resampler_ms: hear_edge_ms,
    };
    let fixed_ms = fixed.total_ms();
    let mut status = StatusLine::new();
    // Everyone heard during the session, as last seen (members who left stay in the summary).
    let mut everyone: Everyone = Default::default();
    let mut series = BoundedSeries::default();
    let mut told = Told::default();
    // The page takes every snapshot; the rest one per tenth of a second, with the peaks of
    // those in between.
    let mut tenth = -1i64;
    let mut between: Option<Snapshot<MediaReport>> = None;
    let watch_every = if page.is_some() { PAGE_WATCH } else { WATCH };
    running.watch_every(watch_every, &mut snaps, |mut s| {
        let roster = room_link.roster();
        if let Some(p) = &mut page {
            p.set_beat(beat.as_ref().and_then(|b| b.now()).map(|(bpm, at)| {
                crate::web::room_page::BeatView::new(bpm, at, crate::ensemble::beat::BEATS_PER_BAR)
            }));
            if let Some(w) = &recorder {
                p.set_recorded_s(w.written_frames() as f64 / f64::from(format.rate.max(1)));
            }
            p.publish(&s, &roster, &name, &fixed);
        }
        if let Some(b) = &between {
            keep_peaks(b, &mut s);
        }
        let now_tenth = (s.t_s * 10.0).floor() as i64;
        if now_tenth == tenth {
            between = Some(s);
            return;
        }
        tenth = now_tenth;
        between = None;
        let (lines, replaced) = told.news(&roster, &s.stats, &room, device_rate);
        for line in lines {
            status.finish();
            eprintln!("{line}");
        }
        if replaced {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        if let Some(ports) = &mut member_ports {
            if ports.update(&roster) {
                status.finish();
                eprintln!("netjam: member ports: {}", ports.describe(&roster));
            }
        }
        let members = heard_members(&s.stats, &roster, fixed_ms);
        if a.player.stats_json.is_some() {
            series.push(RoomPoint::new(&s, &members));
        }
        remember(&mut everyone, members);
        let mut line = room_line(&s, &roster, fixed_ms);
        if let Some(rt) = &mut round_trips {
            rt.offer(&s);
            if let Some(ms) = s.stats.round_trip_ms {
                line.push_str(&format!("  round trip {ms:.1} ms"));
            }
        }
        if let Some(w) = &recorder {
            line.push_str(&recording_status(w, format.rate));
        }
        monitors.on_snapshot(&mut line, &mut status, beat.as_ref());
        status.show(&line);
        if let Some(c) = &osc {
            publish(c, &s, &roster, fixed_ms);
        }
    });
    status.finish();
    if let Some(p) = page.take() {
        let gone = p.gone();
        let w = p.stop();
        eprintln!(
            "netjam: your page: loaded {} times, {} commands taken ({gone} for members who had just left), {} refused",
            w.page_loads, w.commands, w.commands_refused
        );
    }
    if let Some(failed) = member_ports
        .as_ref()
        .map(MemberPorts::rename_failures)
        .filter(|&n| n > 0)
    {
        eprintln!("netjam: the JACK server refused {failed} member port rename(s); those ports kept their earlier names");
    }
    let roster = room_link.roster();
    room_link.leave();
    if let Some(m) = port_mapping {
        // Not left behind in the router (an error return drops it, which removes it too).
        m.remove(crate::port_map::REMOVE_WAIT);
    }
    let (mut process, periods) = stop_player(running, beat.as_mut())?;
    let stats = process.report();
    remember(&mut everyone, heard_members(&stats, &roster, fixed_ms));
    let heard_final: Vec<HeardMember> = everyone.into_values().collect();
    // The audio thread has stopped: what it queued is written, then the files are closed.
    drop(process.take_recorder());
    let recorded = finish_recording(recorder)?;
    for line in summary(&stats, &heard_final, format.rate, &room, round_trips.as_ref()) {
        eprintln!("{line}");
    }
    if let Some(path) = &a.player.stats_json {
        write_json(
            path,
            &RoomReport {
                server,
                room,
                name,
                member_id,
                ssrc,
                roster,
                heard: heard_final,
                stats,
                periods,
                record: recorded,
                round_trip: round_trips,
                reflexive,
                hear_edge_ms,
                series,
            },
        )?;
    }
    if let Some(c) = osc {
        c.shutdown();
    }
    Ok(())
}
