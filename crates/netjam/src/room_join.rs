//! Taking a seat in a room: the player's addresses (its own, a home router's port
//! mapping, the ports a router handing them out in sequence will give), the reflexive
//! query to the rooms server and `--stun`, and the join itself on the first of the named
//! servers that answers ([`room_client::join_asking`]). What it learns on the way is said
//! on stderr, as the player tells it; the seat taken ([`Taken`]) goes on to the room
//! client and the audio.

use std::net::SocketAddr;
use std::time::Duration;

use netjam_engine::player::reflexive::{Mapping, Reflexive};
use netjam_engine::player::Mixes;
use netjam_engine::privacy::sframe;

use crate::lifecycle::any_for;
use crate::room_client::{self, JoinRequest, SeatSetup};
use crate::session::interrupt_flag;
use crate::shell::bind;

/// How long to try to take a seat before giving up.
const JOIN_TIMEOUT: Duration = Duration::from_secs(10);
/// RTCP a member sends and relays per second, on top of its audio (reports to and from
/// every other member, with room to spare).
const RTCP_PACKETS_PER_S: u32 = 40;

/// How long to wait, once seated, for STUN answers still missing (the audio waits).
const STUN_WAIT: Duration = Duration::from_millis(1000);

/// What a player asks of its seat, as the flags say.
#[derive(Debug, Clone, Default)]
pub struct SeatAsk {
    /// The address to send and listen on (any, of the server's family, unless given).
    pub listen: Option<SocketAddr>,
    /// Ask the home router to forward the stream's port (`--port-map`).
    pub port_map: bool,
    pub password: Option<String>,
    /// Reach the other members through the server only (`--via-server`).
    pub via_server: bool,
    /// List the room on its server (`--public`).
    pub public: bool,
    /// The mix to start with (`--mix`), by member name.
    pub mix: Option<Mixes>,
}

/// This player's own address as the other members at home would reach it: the local
/// address the system would send to the server from (found by connecting a socket, which
/// sends nothing), with the stream's port.
fn host_addresses(local: SocketAddr, server: SocketAddr) -> Vec<SocketAddr> {
    if !local.ip().is_unspecified() {
        return vec![local];
    }
    let probe = std::net::UdpSocket::bind(SocketAddr::new(local.ip(), 0)).and_then(|s| {
        s.connect(server)?;
        s.local_addr()
    });
    match probe {
        // A loopback address is only worth declaring when the server is on this machine.
        Ok(a) if !a.ip().is_unspecified() && (!a.ip().is_loopback() || server.ip().is_loopback()) => {
            vec![SocketAddr::new(a.ip(), local.port())]
        }
        _ => Vec::new(),
    }
}

/// How long `--port-map` waits for the home router.
const PORT_MAP_WAIT: Duration = Duration::from_secs(2);

/// `--port-map`: asks the router to forward the stream's port, saying what came of it.
fn ask_router(hosts: &[SocketAddr], local: SocketAddr) -> Option<crate::port_map::PortMapping> {
    let Some(host) = hosts.iter().find(|h| h.is_ipv4() && !h.ip().is_loopback()) else {
        eprintln!(
            "netjam: --port-map: no address of your own on a home network to map a port to; going on without"
        );
        return None;
    };
    let started = std::time::Instant::now();
    match crate::port_map::map_udp(SocketAddr::new(host.ip(), local.port()), PORT_MAP_WAIT) {
        Ok(m) => {
            eprintln!(
                "netjam: your router at {} forwards UDP port {} to you ({}, {:.0} ms; it says its address is {})",
                m.gateway,
                m.external_port,
                m.protocol,
                started.elapsed().as_secs_f64() * 1e3,
                m.external_ip.map_or("-".into(), |ip| ip.to_string())
            );
            Some(m)
        }
        Err(e) => {
            eprintln!("netjam: --port-map: {e:#}; going on without a port mapping");
            None
        }
    }
}

/// Says where the servers see this player, and what that tells of its router.
fn say_reflexive(r: &Reflexive, server: SocketAddr) {
    match r.server_sees {
        Some(a) => eprintln!("netjam: the server sees you at {a}"),
        None => eprintln!(
            "netjam: the server at {server} did not answer STUN (an older netjam server?): your public address is unknown"
        ),
    }
    let Some(stun) = r.stun_server else { return };
    match (r.stun_sees, r.mapping) {
        (None, _) => eprintln!("netjam: no answer from the STUN server {stun}: is it a STUN server, and is UDP to it open?"),
        (Some(a), Mapping::EndpointIndependent) => eprintln!(
            "netjam: the STUN server {stun} sees you at {a} too: your router keeps one public port per socket (endpoint-independent mapping)"
        ),
        (Some(a), Mapping::EndpointDependent) => eprintln!(
            "netjam: the STUN server {stun} sees you at {a}, not where the rooms server does: your router gives each destination its own port (a port-randomising or symmetric NAT)"
        ),
        (Some(a), Mapping::Unknown) => eprintln!("netjam: the STUN server {stun} sees you at {a}"),
    }
}

/// Where the two servers' answers show a router that gives each new destination the next
/// port(s), the ports it will likely give the other players, as candidates at the address
/// the server sees this player at (`0.0.0.0:PORT`), as many as the join has room for.
fn predicted_candidates(r: &Reflexive, declared: usize) -> Vec<SocketAddr> {
    let (Some(first), Some(second)) = (r.server_sees, r.stun_sees) else {
        return Vec::new();
    };
    let room = netjam_engine::room::msg::MAX_HOSTS.saturating_sub(declared);
    let Some(p) = netjam_engine::nat::predict::sequential(first, second, room) else {
        return Vec::new();
    };
    let ports = p.ports();
    eprintln!(
        "netjam: your router gives each new destination the next port (+{}): the other players also try ports {}",
        p.stride,
        ports.iter().map(u16::to_string).collect::<Vec<_>>().join(", ")
    );
    ports
        .iter()
        .map(|&port| SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), port))
        .collect()
}

/// A seat taken in a room, with what was learned on the way.
#[derive(Debug)]
pub struct Taken {
    pub socket: crate::transport::UdpTransport,
    pub seated: room_client::Seated,
    /// Where the rooms server (and `--stun`) saw this player.
    pub reflexive: Reflexive,
    /// `--port-map`'s mapping, removed from the router on the way out.
    pub port_mapping: Option<crate::port_map::PortMapping>,
}

/// Takes a seat for `sender`'s stream in the room `(room, name)` on the first of `servers`
/// (`--server`'s first, the others asked in turn, and `--stun`) that answers, with the
/// private room's media key and join proof if it has a password: the addresses the other
/// members may reach this player at go with the join (its own, a router's mapping, the
/// ports a router that hands them out in sequence will give), and what the servers saw
/// of it is said.
pub fn take_seat(
    a: &SeatAsk,
    servers: (SocketAddr, Vec<SocketAddr>, Option<SocketAddr>),
    (room, name): (&str, &str),
    private: Option<(netjam_engine::privacy::MediaKey, [u8; 32])>,
    sender: &netjam_engine::sender::Sender,
) -> anyhow::Result<Taken> {
    let (server, also, stun) = servers;
    let format = sender.format();
    let socket = bind(a.listen.unwrap_or(any_for(server)))?;
    let packets_per_s = format.rate.div_ceil(sender.frames_per_packet().max(1));
    let sealing = if private.is_some() {
        sframe::MAX_HEADER_LEN + sframe::TAG_LEN
    } else {
        0
    };
    let bytes_per_s = (packets_per_s as usize * (sender.max_packet_bytes() + sealing + 28)) as u32
        + RTCP_PACKETS_PER_S * 1500;
    eprintln!("netjam: joining room {room:?} on {server} as {name:?}");
    let mut hosts = host_addresses(socket.local_addr()?, server);
    let port_mapping = if a.port_map {
        // Ctrl-C or SIGTERM from now on ends the stream (at once if it has not started)
        // instead of the process, so the mapping is removed on the way out.
        let _ = interrupt_flag();
        ask_router(&hosts, socket.local_addr()?)
    } else {
        None
    };
    hosts.extend(port_mapping.iter().flat_map(|m| m.candidates()));
    let mut ask = room_client::ask_reflexive(server, stun);
    if stun.is_some() {
        // Both answers before the join, so that the ports a router handing them out in
        // sequence will give the next destinations go with the join as candidates.
        room_client::finish_reflexive(&mut ask, &socket, STUN_WAIT);
        hosts.extend(predicted_candidates(&ask.report(), hosts.len()));
    }
    let mut seated = room_client::join_asking(
        &socket,
        &JoinRequest {
            server,
            room: room.to_string(),
            name: name.to_string(),
            password: a.password.clone().unwrap_or_default(),
            // The join proof is the room key: derived once above, not again for the join.
            room_key: private.map(|p| p.1),
            ssrc: sender.ssrc(),
            packets_per_s: packets_per_s + RTCP_PACKETS_PER_S,
            bytes_per_s,
            timeout: JOIN_TIMEOUT,
            hosts,
            // What the room's streams are sent and mixed at (Opus runs at 48 kHz whatever
            // the device's rate).
            sample_rate: format.rate,
            also,
            known: crate::keys::KnownServers::from_env(),
            setup: SeatSetup {
                direct: !a.via_server,
                public: a.public,
                mixes: a.mix.clone().unwrap_or_default(),
                media_key: private.map(|p| p.0),
            },
        },
        Some(&mut ask),
    )?;
    if !ask.done(crate::clock::now_ns()) {
        room_client::finish_reflexive(&mut ask, &socket, STUN_WAIT);
    }
    let reflexive = ask.report();
    // STUN went to the first server named; when that one never answered and another front
    // door seated the player, its silence is already said.
    if reflexive.server_sees.is_some() || seated.session.front().current() == server {
        say_reflexive(&reflexive, server);
    }
    // The server named is the front door (the first that answered, of several named);
    // the seat may be on another one.
    let named = seated.session.front().current();
    let server = seated.session.server();
    seated.session.roster_mut().server_sees = reflexive.server_sees;
    if let Some(to) = &seated.redirected {
        let at = if to == &server.to_string() {
            String::new()
        } else {
            format!(" ({server})")
        };
        eprintln!("netjam: room {room:?} lives on {to}{at}, not {named}: joined there");
    }
    Ok(Taken {
        socket,
        seated,
        reflexive,
        port_mapping,
    })
}
