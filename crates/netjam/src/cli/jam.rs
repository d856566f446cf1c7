//! `netjam jam`: full duplex with one other player on one UDP socket (`--peer`, run by
//! [`crate::peer_play`]), or in a room through a rooms server (`--room`, run by
//! [`crate::room_play`]).
//!
//! This module parses the flags, refuses a flag that means something in one mode only in
//! the other (saying what to use instead), opens the device or source they name and builds
//! the sender for it, and hands the rest to the mode's runner.
//!
//! With `--jack`, the audio comes from and goes to a JACK server: netjam's client ports
//! `NAME:send_N` carry what you play and `NAME:receive_N` what you hear, and the server's
//! period clocks the stream. Otherwise a file, stdin or a synthesizer is played in real time.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use netjam_engine::player::MediaConfig;
use netjam_engine::receiver::ReceiverConfig;
use netjam_engine::wire::Codec;

use super::common::{check_outputs, resolve, resolve_host, resolve_servers};
use super::stream::{parse_outputs, SourceArgs, WireArgs};
use crate::endpoint::card;
use crate::endpoint::channels::ChannelMap;
use crate::endpoint::jack::{JackConfig, JackEndpoint};
use crate::endpoint::{Endpoint, FrameSource, SampleFormat};
use crate::lifecycle::{cname, fresh_seed};
use crate::peer_play::{BeatDelay, PeerPlay};
use crate::record;
use crate::resample::{EdgeResampler, ResampledSource, OPUS_RATE};
use crate::room_join::SeatAsk;
use crate::room_play::RoomPlay;
use crate::session::MAX_ROOM_MEMBERS;
use crate::shell::BufferSize;
use crate::shell::{heard_format, DeviceSettings, HeardTo, PlayerAsk, PlayerDevice};

#[derive(Debug, Args)]
// A sound card is a source too, named by up to three flags at once: the source group stops
// being required by clap and `run_jam` asks for one of its members or a device instead.
#[command(mut_group("source", |g| g.required(false)))]
// `--name` comes with the stream's flags but says who you are, to a peer or a room.
#[command(mut_arg("name", |a| a.help_heading(WHERE)))]
// Flags that mean something in one mode only are refused in the other by `refuse_other_mode`,
// saying what to use instead (clap's `requires` is waived for an argument that conflicts
// with one given, so `--peer` would silence it).
pub struct JamArgs {
    /// Play with one other player (or a `netjam reflect`): HOST:PORT.
    #[arg(long, help_heading = WHERE, required_unless_present = "room", conflicts_with_all = ["room", "server"])]
    pub peer: Option<String>,
    /// Play in a room instead: join room NAME on the rooms server (its first player
    /// creates it). Room names match whatever the case: "Friday" and "friday" are one
    /// room, shown as its first player spelled it. --server and --name default to `server = "HOST"` and `name = "YOU"` in
    /// the settings file ($NETJAM_CONFIG, else netjam/config.toml in your configuration
    /// directory, e.g. ~/.config/netjam/config.toml).
    #[arg(long, help_heading = WHERE, value_name = "NAME")]
    pub room: Option<String>,
    /// The rooms server (`netjam server`) as HOST or HOST:PORT (port 4464 unless given);
    /// default: `server` in the settings file (see `--room`). Servers that share a room
    /// directory may be named together, `A,B`: when the first does not answer (or stops),
    /// the next is asked, and sends the player to wherever the room lives.
    #[arg(long, help_heading = WHERE, value_name = "HOST[:PORT][,HOST[:PORT]...]", requires = "room")]
    pub server: Option<String>,
    /// Local address to send from and listen on (default: port 4464 with --peer, where the
    /// other player sends; any free port with --room).
    #[arg(long, help_heading = WHERE)]
    pub listen: Option<SocketAddr>,
    #[command(flatten, next_help_heading = "What you play")]
    pub source: SourceArgs,
    /// Play through the JACK server instead of a file or test signal: ports NAME:send_N
    /// (what you play) and NAME:receive_N (what you hear). --channels sets N (default 2).
    #[arg(long, help_heading = DEVICE, group = "source", conflicts_with_all = ["output", "stdout"])]
    pub jack: bool,
    /// Name of netjam's JACK client (default: netjam).
    #[arg(long, help_heading = DEVICE, value_name = "NAME")]
    pub jack_name: Option<String>,
    /// Leave netjam's JACK ports unconnected (default: connect to the physical ports).
    #[arg(long, help_heading = DEVICE)]
    pub no_connect: bool,
    /// The JACK server to use (its `jackd -n` name; default: $JACK_DEFAULT_SERVER, else the default).
    #[arg(long, help_heading = DEVICE, value_name = "NAME")]
    pub jack_server: Option<String>,
    /// Play through a sound card (ALSA, CoreAudio, WASAPI) whose name contains NAME, for
    /// both capture and playback (`default` for the system's, `none` for no device). The
    /// card clocks the stream; --rate and --channels must be ones it offers.
    #[arg(long, help_heading = DEVICE, value_name = "NAME", conflicts_with_all = CARD_CONFLICTS)]
    pub device: Option<String>,
    /// Capture from this sound card instead (name substring, `default` or `none`).
    #[arg(long, help_heading = DEVICE, value_name = "NAME", conflicts_with_all = CARD_CONFLICTS)]
    pub input_device: Option<String>,
    /// Play through this sound card instead (name substring, `default` or `none`).
    #[arg(long, help_heading = DEVICE, value_name = "NAME", conflicts_with_all = CARD_CONFLICTS)]
    pub output_device: Option<String>,
    /// The audio host for the sound card: alsa, jack, coreaudio, wasapi... (default: the
    /// platform's; `netjam devices` lists them). Alone, it uses the host's default devices.
    #[arg(long, help_heading = DEVICE, value_name = "NAME", conflicts_with_all = CARD_CONFLICTS)]
    pub host: Option<String>,
    /// Play what you hear on these channels of the device, numbered from 1 as the interface
    /// labels them (e.g. `3-4` for a headphone mix); the others stay silent. Default: as
    /// many channels from 1 as --channels (2).
    #[arg(long, help_heading = DEVICE, value_name = "LIST", value_parser = parse_outputs, conflicts_with_all = ["output", "stdout"])]
    pub outputs: Option<ChannelMap>,
    #[command(flatten, next_help_heading = SOUND)]
    pub wire: WireArgs,
    /// Jitter buffer: auto, a number of frames, or milliseconds (e.g. 3ms).
    #[arg(long, help_heading = SOUND, default_value = "auto")]
    pub buffer: BufferSize,
    /// With an auto buffer: tight gives latency back within a second of a transient and
    /// ignores one-off delay peaks; safe covers delay peaks up to 60 ms for ten seconds.
    #[arg(long, help_heading = SOUND, default_value = "tight")]
    pub latency: netjam_engine::delay::LatencyPolicy,
    /// Play what you hear without following the other players' clocks: no resampling, and
    /// latency that grows is only given back when more than 5 ms is left over.
    #[arg(long, help_heading = SOUND)]
    pub no_drift_correction: bool,
    /// With --peer: gain on the other player, in dB (in a room: --master-gain and --mix).
    #[arg(long, help_heading = MIX, default_value_t = 0.0, allow_negative_numbers = true)]
    pub gain: f32,
    /// With --peer: start with the other player muted (in a room: --mix "NAME=mute").
    #[arg(long, help_heading = MIX)]
    pub mute: bool,
    /// Gain on the whole mix you hear, in dB (-60 to +12; in a room OSC /master/gain). A
    /// limiter after it keeps the mix under full scale: it leaves a mix that stays below
    /// -3 dBFS untouched and turns a louder one down smoothly instead of clipping it.
    #[arg(long, help_heading = MIX, value_name = "DB", default_value_t = 0.0, allow_negative_numbers = true, value_parser = master_gain_db)]
    pub master_gain: f32,
    /// In a room: each member's mix from the start, by name: `--mix "ana=-6,bo=mute"` (a
    /// gain in dB, `mute`, `unmute`, `solo` or `unsolo`; names match whatever the case). A member's mix, set
    /// here or over OSC, applies again whenever a member of that name comes back.
    #[arg(long, help_heading = MIX, value_name = "NAME=DB|mute|solo,...", allow_hyphen_values = true, value_parser = netjam_engine::player::parse_mix)]
    pub mix: Option<netjam_engine::player::Mixes>,
    /// Hear your own signal through netjam too, beside the other player or the room (off by
    /// default: you hear yourself through your interface's direct monitoring).
    #[arg(long, help_heading = MIX)]
    pub monitor: bool,
    /// In a room with --jack: one set of output ports per member, so a DAW records each
    /// player on a track of its own: `NAME:from_<seat>_<channel>` for the 16 control seats
    /// (`/memberN`), renamed `NAME:from_<member>_<channel>` while a member sits there where
    /// libjack can rename ports. Each carries the member as heard, before your gain, pan
    /// and mute; empty seats are silent.
    #[arg(long, help_heading = MIX, requires = "jack")]
    pub member_ports: bool,
    /// The room's password (set by whoever opens the room; never sent, only proven).
    #[arg(long, help_heading = ROOM, value_name = "TEXT")]
    pub password: Option<String>,
    /// List the room publicly: `netjam rooms --server HOST` shows it with its players (any
    /// member may ask; the room stays listed while it lives).
    #[arg(long, help_heading = ROOM)]
    pub public: bool,
    /// Send and hear everything through the rooms server, never on a direct path to
    /// another player (by default netjam punches one where the routers allow and uses it
    /// when it is not slower).
    #[arg(long, help_heading = ROOM)]
    pub via_server: bool,
    /// Ask your home router to forward a UDP port to you (PCP, NAT-PMP or UPnP-IGD,
    /// whichever it speaks), and offer it to the other players as one more way to reach
    /// you directly; it helps where the router gives every destination another public
    /// port. Waits at most 2 s for a router to answer, then goes on without; the mapping is
    /// removed when you leave, on an error, Ctrl-C or SIGTERM too.
    #[arg(long, help_heading = ROOM, visible_alias = "upnp", conflicts_with = "via_server")]
    pub port_map: bool,
    /// Also ask this STUN server (HOST or HOST:PORT, port 3478 unless given) where it sees you,
    /// and say whether your router shows the same public port to it as to the rooms server
    /// (endpoint-independent mapping) or another one (port-randomising NAT). Where the
    /// router gives each new destination the next port, its next few ports go to the other
    /// players to try. The join waits for both answers (at most 1 s).
    #[arg(long, help_heading = ROOM, value_name = "HOST[:PORT]")]
    pub stun: Option<String>,
    /// Record the session as a multitrack into DIR (created if missing; must not hold an
    /// earlier recording): `mix.wav` (what you hear), `you.wav` (your input) and
    /// `NN-name.wav` per player heard (as its receiver played it, before your gain, pan and
    /// mute; with --peer the other player is `01-peer.wav`), 32-bit float WAV at the
    /// stream's rate, all sample-aligned to the frames played: frame n of every file is the
    /// same instant. A member who joins late starts with silence, one who leaves goes on as
    /// silence, so every file has the same length. In a room, OSC `/record 0|1` pauses and
    /// resumes (a pause is silence in every file).
    #[arg(long, help_heading = RECORD, value_name = "DIR")]
    pub record: Option<PathBuf>,
    /// Write what you hear to a WAV file.
    #[arg(long, help_heading = RECORD, value_name = "FILE.wav")]
    pub output: Option<PathBuf>,
    /// Write what you hear to stdout as raw PCM (layout from --out-format).
    #[arg(long, help_heading = RECORD, conflicts_with = "output")]
    pub stdout: bool,
    /// With --stdout: the layout of the raw PCM.
    #[arg(long, help_heading = RECORD, value_enum, default_value = "s16le", requires = "stdout")]
    pub out_format: SampleFormat,
    #[command(flatten, next_help_heading = "Ensemble click")]
    pub ensemble: super::ensemble::JamEnsembleArgs,
    /// With --ensemble and --peer (NINJAM-style): hear the other player exactly one beat (or
    /// bar of four) after they played, in time with the ensemble's beat. Where the way from
    /// them is already longer, they are heard as they come and the status line says so.
    #[arg(long, help_heading = "Ensemble click", value_name = "UNIT", num_args = 0..=1, default_missing_value = "beat", requires = "ensemble")]
    pub delay_to_beat: Option<DelayUnit>,
    /// Stop after this many seconds.
    #[arg(long, help_heading = CONTROL)]
    pub duration: Option<f64>,
    /// Listen for OSC control on this UDP port (0: any free port): with --peer,
    /// /member0/gain and /member0/mute set what you hear; in a room every member's mix,
    /// your send and monitor, and the master gain. /stats answers the latest figures, and
    /// `/_meta ,s PATH` describes each address.
    #[arg(long, help_heading = CONTROL, value_name = "PORT")]
    pub osc: Option<u16>,
    /// The address OSC control listens on (default: this machine only).
    #[arg(long, help_heading = CONTROL, value_name = "ADDR", default_value = "127.0.0.1", requires = "osc")]
    pub osc_bind: std::net::IpAddr,
    /// In a room: serve your own page for a browser on ADDR:PORT (alone: 127.0.0.1:4466;
    /// port 0: any free port): who is in the room, how far away they sound, meters, and
    /// your mix with the mouse. A loopback address serves this machine only; any other
    /// needs the token printed with the URL.
    #[arg(long, help_heading = CONTROL, value_name = "ADDR:PORT", num_args = 0..=1, default_missing_value = crate::web::room_page::DEFAULT_ADDR)]
    pub web: Option<SocketAddr>,
    /// Write the final statistics and their time series as JSON.
    #[arg(long, help_heading = CONTROL, value_name = "FILE")]
    pub stats_json: Option<PathBuf>,
    /// Measure the real mouth-to-ear round trip in band: a quiet burst once a second on the
    /// first channel, found again in what comes back (use against `netjam reflect`, or a
    /// player who monitors through).
    #[arg(long, help_heading = CONTROL)]
    pub measure_roundtrip: bool,
}

/// `jam --help`'s headings.
const WHERE: &str = "Where to play";
const DEVICE: &str = "Audio device";
const SOUND: &str = "Sound and latency";
const MIX: &str = "Mix";
const ROOM: &str = "Room";
const RECORD: &str = "Recording";
const CONTROL: &str = "Control and reports";

/// What `--delay-to-beat` delays by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DelayUnit {
    Beat,
    Bar,
}

impl DelayUnit {
    /// Beats in one.
    pub fn beats(self) -> u64 {
        match self {
            DelayUnit::Beat => 1,
            DelayUnit::Bar => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DelayUnit::Beat => "beat",
            DelayUnit::Bar => "bar",
        }
    }
}

/// What a sound card replaces: the other sources, JACK, and the sinks for what you hear.
const CARD_CONFLICTS: [&str; 9] = [
    "input", "stdin", "sine", "clicks", "noise", "silence", "jack", "output", "stdout",
];

impl JamArgs {
    /// What the flags ask of a sound card.
    fn card(&self) -> card::CardRequest {
        card::CardRequest {
            host: self.host.clone(),
            device: self.device.clone(),
            input_device: self.input_device.clone(),
            output_device: self.output_device.clone(),
            rate: self.source.rate,
            channels: self.source.channels,
            inputs: self.source.inputs.clone(),
            outputs: self.outputs.clone(),
            period: self.wire.frames,
        }
    }

    fn wants_card(&self) -> bool {
        self.card().wants_card()
    }
}

/// The rate and channels of a device, for building a sender before the device runs.
#[derive(Debug)]
struct DeviceFormat {
    rate: u32,
    channels: u16,
}

impl FrameSource for DeviceFormat {
    fn rate(&self) -> u32 {
        self.rate
    }
    fn channels(&self) -> u16 {
        self.channels
    }
    fn read(&mut self, _out: &mut [f32]) -> anyhow::Result<usize> {
        Ok(0)
    }
}

/// Open netjam's JACK client and make `--frames` and `--rate` agree with the server.
fn open_jack(a: &mut JamArgs) -> anyhow::Result<JackEndpoint> {
    let channels = a.source.channels.unwrap_or(2);
    if channels == 0 {
        bail!("--channels must be at least 1");
    }
    let endpoint = JackEndpoint::open(&JackConfig {
        name: a.jack_name.clone().unwrap_or_else(|| "netjam".into()),
        channels,
        inputs: a.source.inputs.clone(),
        outputs: a.outputs.clone(),
        connect: !a.no_connect,
        server: a.jack_server.clone(),
    })
    .context("cannot use JACK (--jack)")?;
    let spec = endpoint.spec();
    if let Some(rate) = a.source.rate {
        if rate != spec.rate {
            bail!(
                "the JACK server runs at {} Hz, not --rate {rate}: leave out --rate, or restart jackd with -r {rate}",
                spec.rate
            );
        }
    }
    if !(16..=1024).contains(&spec.period) {
        bail!(
            "the JACK server runs {}-frame periods; netjam sends 16 to 1024 frames per packet: restart jackd with -p 64 (or another period in that range)",
            spec.period
        );
    }
    if a.wire.frames != spec.period {
        eprintln!(
            "netjam: the JACK server runs {}-frame periods, not --frames {}: sending {} frames per packet (change the server's period with jackd -p or jack_bufsize)",
            spec.period, a.wire.frames, spec.period
        );
        a.wire.frames = spec.period;
    }
    Ok(endpoint)
}

/// `--master-gain`: a number of dB in the range OSC's gains take.
fn master_gain_db(text: &str) -> Result<f32, String> {
    use crate::control::{GAIN_MAX_DB, GAIN_MIN_DB};
    match text.parse::<f32>() {
        Ok(db) if (GAIN_MIN_DB..=GAIN_MAX_DB).contains(&db) => Ok(db),
        _ => Err(format!("a gain from {GAIN_MIN_DB} to {GAIN_MAX_DB} dB")),
    }
}

/// Refuse a flag that means nothing in the mode asked for (`--peer` or `--room`), saying
/// what to use instead: before any device or socket opens, never silently ignored.
fn refuse_other_mode(a: &JamArgs) -> anyhow::Result<()> {
    const ROOM: &str = "--room NAME --server HOST";
    if a.room.is_some() {
        if a.gain != 0.0 || a.mute {
            bail!(
                "--gain and --mute set the other player of a two-player jam (--peer); in a room use --master-gain DB for \
                 the whole mix and --mix \"NAME=DB\" or --mix \"NAME=mute\" for one member (or OSC --osc PORT, /memberN/gain)"
            );
        }
        if a.delay_to_beat.is_some() {
            bail!("--delay-to-beat works with --peer for now (in a room the click is shared, the delay is not built yet): play with --peer, or leave out --delay-to-beat");
        }
        if a.ensemble.ensemble_local || a.ensemble.ensemble_port.is_some() {
            bail!(
                "--ensemble-local and --ensemble-port set how an ensemble is found on the local network (with --peer); in a \
                 room the ensemble goes through the rooms server: leave them out (--ensemble-room NAME picks another room's \
                 ensemble on that server)"
            );
        }
        return Ok(());
    }
    let refused: [(bool, String); 10] = [
        (
            a.password.is_some(),
            format!("--password protects a room; with --peer there is no server to prove it to: use {ROOM} --password TEXT"),
        ),
        (
            a.mix.is_some(),
            "--mix sets the members of a room by name; with --peer use --gain DB or --mute for the other player".into(),
        ),
        (
            a.member_ports,
            "--member-ports gives each member of a room JACK ports of its own; with --peer the other player alone plays \
             on NAME:receive_N: leave out --member-ports"
                .into(),
        ),
        (
            a.via_server,
            format!("--via-server sends through a rooms server; with --peer the audio goes straight to the other player: use {ROOM} --via-server"),
        ),
        (
            a.public,
            format!("--public lists a room on its server; with --peer there is no server to list it: use {ROOM} --public"),
        ),
        (
            a.port_map,
            format!(
                "--port-map offers a forwarded port to a room's players; with --peer forward the --listen port (4464 unless \
                 given) on your router yourself, or play in a room: {ROOM} --port-map"
            ),
        ),
        (
            a.stun.is_some(),
            format!("--stun compares your public address with a rooms server's view of it; with --peer there is no server: use {ROOM} --stun HOST"),
        ),
        (
            a.ensemble.ensemble_room.is_some(),
            format!(
                "--ensemble-room picks the ensemble of a room on the rooms server; with --peer the ensemble is found on the \
                 local network: use --ensemble NAME alone, or play in a room: {ROOM} --ensemble --ensemble-room NAME"
            ),
        ),
        (
            a.web.is_some(),
            format!(
                "--web serves your page of a room (its members, meters and your mix of them); with --peer there is no \
                 room: use {ROOM} --web, or --osc PORT to control a two-player jam"
            ),
        ),
        (
            a.ensemble.ensemble.as_deref() == Some(""),
            "--ensemble without a NAME joins your room's ensemble; with --peer name one: --ensemble NAME".into(),
        ),
    ];
    if let Some((_, why)) = refused.into_iter().find(|(given, _)| *given) {
        bail!("{why}");
    }
    Ok(())
}

pub fn run_jam(mut a: JamArgs) -> anyhow::Result<()> {
    refuse_other_mode(&a)?;
    a.source.refuse_stray()?;
    a.wire.refuse_stray()?;
    if a.room.is_some() {
        fill_room_defaults(&mut a)?;
    }
    if let Some(dir) = &a.record {
        // Before anything runs: a recording that cannot be written is said now.
        record::prepare_dir(dir)?;
    }
    check_outputs([
        (a.output.as_deref(), "--output"),
        (a.stats_json.as_deref(), "--stats-json"),
    ])?;
    if !a.jack && (a.jack_name.is_some() || a.no_connect || a.jack_server.is_some()) {
        bail!("--jack-name, --jack-server and --no-connect apply to JACK: add --jack");
    }
    let s = &a.source;
    if !a.jack
        && !a.wants_card()
        && s.input.is_none()
        && !s.stdin
        && s.sine.is_none()
        && s.clicks.is_none()
        && !s.noise
        && !s.silence
    {
        bail!("netjam jam needs something to play: --input FILE.wav, --stdin, --sine HZ, --clicks BPM, --noise, --silence, --jack or --device NAME");
    }
    if a.outputs.is_some() && !a.jack && !a.wants_card() {
        bail!("--outputs picks channels of a device: use it with --jack or --device (a file or stdout gets every channel you hear)");
    }
    let audio = open_audio(&mut a)?;
    if a.server.is_some() {
        let play = room_play(&a, &audio)?;
        return crate::room_play::run(play, audio.device, audio.sender);
    }
    let play = peer_play(&a, &audio)?;
    crate::peer_play::run(play, audio.device, audio.sender)
}

/// A room's player as the flags ask for it, for the device and sender opened: every
/// address resolved and the page's taken before joining, so a bad one is said before
/// anything runs.
fn room_play(a: &JamArgs, audio: &Audio) -> anyhow::Result<RoomPlay> {
    let (server, also) = resolve_servers(a.server.as_deref().unwrap_or_default())?;
    let Some(room) = a.room.clone() else {
        bail!("a room needs --room NAME: the room to join (its first player creates it)");
    };
    let Some(name) = a.wire.name.clone() else {
        bail!("a room needs --name YOU: the name the others see");
    };
    Ok(RoomPlay {
        server,
        also,
        stun: a
            .stun
            .as_deref()
            .map(|s| resolve_host(s, Some(STUN_PORT), "--stun"))
            .transpose()?,
        player: player_ask(
            a,
            audio,
            (MAX_ROOM_MEMBERS, Some(name.clone())),
            "(counted in the latency to each member)",
        )?,
        room,
        name,
        seat: SeatAsk {
            listen: a.listen,
            port_map: a.port_map,
            password: a.password.clone(),
            via_server: a.via_server,
            public: a.public,
            mix: a.mix.clone(),
        },
        web: a.web.map(super::server::bind_web).transpose()?,
        member_ports: a.member_ports,
    })
}

/// A two-player jam as the flags ask for it, for the device and sender opened.
fn peer_play(a: &JamArgs, audio: &Audio) -> anyhow::Result<PeerPlay> {
    let peer_text = a.peer.clone().unwrap_or_default();
    Ok(PeerPlay {
        peer: resolve(&peer_text)?,
        peer_text,
        listen: a.listen.unwrap_or(SocketAddr::from(([0, 0, 0, 0], 4464))),
        gain_db: a.gain,
        mute: a.mute,
        delay_to_beat: a.delay_to_beat.map(|unit| BeatDelay {
            beats: unit.beats(),
            unit: unit.name(),
        }),
        // The other player is the one member of a room of two.
        player: player_ask(a, audio, (1, a.wire.name.clone()), "(counted in the codec delay)")?,
    })
}

/// What the flags ask of either kind of player, for the device and sender opened: the
/// audio half for `members` (how many, and the name the receivers report under). What
/// you hear plays in your own format, on as many channels as the device plays (an
/// --outputs map can name more or fewer than --inputs sends), the members mixed into it.
fn player_ask(
    a: &JamArgs,
    audio: &Audio,
    members: (usize, Option<String>),
    edge_counted: &str,
) -> anyhow::Result<PlayerAsk> {
    let format = audio.sender.format();
    let heard = heard_format(format, audio.device.spec());
    Ok(PlayerAsk {
        media: media_config(a, format.rate, members.0, heard.channels.into(), members.1),
        latency: a.latency,
        master_gain_db: a.master_gain,
        monitor: a.monitor,
        measure_round_trip: a.measure_roundtrip,
        osc: a.osc.map(|port| SocketAddr::new(a.osc_bind, port)),
        record: a.record.clone(),
        click: a.ensemble.ask()?,
        device: a.device_settings(format, edge_counted),
        stats_json: a.stats_json.clone(),
    })
}

/// The standard STUN port.
const STUN_PORT: u16 = 3478;

/// The player's audio half as the flags ask for it: `capacity` members of up to 64
/// channels each (a jam's one other player, or a room's), mixed into `out_channels`; the
/// receivers report under `name`.
fn media_config(
    a: &JamArgs,
    rate: u32,
    capacity: usize,
    out_channels: usize,
    name: Option<String>,
) -> MediaConfig {
    MediaConfig {
        receiver: ReceiverConfig {
            buffer: a.buffer.mode(rate),
            fixed_format: None,
            max_channels: 64,
            max_redundancy_wait: 8,
            seed: fresh_seed(),
            cname: cname(),
            name,
            decoders: crate::opus::decoders(),
        },
        // Follow each sender's clock by resampling, and give back latency smoothly.
        drift_correction: !a.no_drift_correction,
        ..MediaConfig::new(capacity, out_channels)
    }
}

/// A room needs a server and a name: from the flags, else from the settings file.
fn fill_room_defaults(a: &mut JamArgs) -> anyhow::Result<()> {
    if a.server.is_some() && a.wire.name.is_some() {
        return Ok(());
    }
    let (config, path) = crate::config::load()?;
    let file = path.map_or_else(|| "a settings file".to_string(), |p| p.display().to_string());
    if a.server.is_none() {
        a.server = config.server;
    }
    if a.wire.name.is_none() {
        a.wire.name = config.name;
    }
    if a.server.is_none() {
        bail!("--room needs a rooms server: give --server HOST[:PORT], or put server = \"HOST\" in {file}");
    }
    if a.wire.name.is_none() {
        bail!("--room needs your name as the others will see it: give --name YOU, or put name = \"YOU\" in {file}");
    }
    Ok(())
}

/// The audio side opened before the network: a device or a source, and the sender for it.
struct Audio {
    pub device: PlayerDevice,
    pub sender: netjam_engine::sender::Sender,
}

impl JamArgs {
    /// How the player's device runs; `edge_counted` says where the delay of resampling
    /// at the device's edges is counted.
    fn device_settings(
        &self,
        format: netjam_engine::wire::AudioFormat,
        edge_counted: &str,
    ) -> DeviceSettings {
        let mut edge_counted = edge_counted.to_string();
        if self.record.is_some() {
            edge_counted += &format!("; the recording is at {} Hz", format.rate);
        }
        DeviceSettings {
            frames: self.wire.frames,
            no_connect: self.no_connect,
            inputs: self.source.inputs.clone(),
            outputs: self.outputs.clone(),
            heard_to: match (&self.output, self.stdout) {
                (Some(path), _) => HeardTo::File(path.clone()),
                (None, true) => HeardTo::Stdout(self.out_format),
                (None, false) => HeardTo::Nowhere,
            },
            duration_s: self.duration,
            edge_counted,
        }
    }
}

/// Open JACK, a sound card or the source named by the flags, and build the sender for it.
fn open_audio(a: &mut JamArgs) -> anyhow::Result<Audio> {
    let jack = if a.jack { Some(open_jack(a)?) } else { None };
    let card = card::open(&a.card())?;
    let mut device = PlayerDevice {
        jack,
        card,
        source: None,
    };
    let sender = match device.spec() {
        Some(spec) => {
            let captured = DeviceFormat {
                rate: spec.rate,
                channels: spec.input_channels,
            };
            // Opus runs at 48 kHz: on a device at another rate, the jam resamples at its
            // edges (see `EdgeProcess`), and the sender counts the capture edge's delay.
            if opus_edges(a, spec.rate) {
                let capture_edge = EdgeResampler::new(
                    spec.rate,
                    OPUS_RATE,
                    spec.input_channels.max(1).into(),
                    spec.period as usize,
                )?;
                let captured = DeviceFormat {
                    rate: OPUS_RATE,
                    ..captured
                };
                a.wire
                    .sender_after_edge(&captured, Codec::L24, capture_edge.filter_delay_ns())?
            } else {
                // A device delivers float samples: 24-bit on the wire keeps their resolution by default.
                a.wire.sender(&captured, Codec::L24)?
            }
        }
        None => {
            let (mut source, default_codec) = a.source.open()?;
            let mut edge_ns = 0;
            if opus_edges(a, source.rate()) {
                let resampled = ResampledSource::new(source, OPUS_RATE, a.wire.frames as usize)?;
                edge_ns = resampled.delay_ns();
                source = Box::new(resampled);
            }
            let sender = a
                .wire
                .sender_after_edge(source.as_ref(), default_codec, edge_ns)?;
            device.source = Some(source);
            sender
        }
    };
    Ok(Audio { device, sender })
}

/// Whether the stream is Opus on a device (or source) at another rate than 48 kHz, so the
/// jam resamples at its edges: in peer mode and in rooms alike (a room's member ports need
/// the device at 48 kHz; the room refuses them otherwise, see `room_play`).
fn opus_edges(a: &JamArgs, rate: u32) -> bool {
    a.wire.codec == Some(Codec::Opus) && rate != OPUS_RATE
}
