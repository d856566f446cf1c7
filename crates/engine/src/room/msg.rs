//! The room control protocol's messages (version [`PROTOCOL_VERSION`]) and their OSC codec.
//!
//! Every control message is one OSC message under `/netjam/` whose first argument is the
//! protocol version (int32). [`Control::decode`] borrows strings and blobs from the packet
//! and never allocates; [`Control::encode`] writes into a caller's buffer. Byte layouts are
//! in `docs/protocol.md`. This module must never allocate on decode and never panic on any
//! input.

use netjam_osc::{encode_message, Arg, EncodeError, Packet};

/// The protocol version this code speaks; the first argument of every control message.
pub const PROTOCOL_VERSION: i32 = 2;
/// Length of a return-routability cookie.
pub const COOKIE_LEN: usize = 32;
/// Length of the server's and the client's nonces.
pub const NONCE_LEN: usize = 16;
/// Length of a join/rejoin authenticator (HMAC-SHA256).
pub const AUTH_LEN: usize = 32;
/// Length of a session token (rejoin credential).
pub const TOKEN_LEN: usize = 16;
/// Length of a room key (SHA-256 of the room name and password).
pub const ROOM_KEY_LEN: usize = 32;
/// Longest room or member name, in bytes of UTF-8.
pub const MAX_NAME_LEN: usize = 64;
/// Longest refusal text the server writes.
pub const MAX_REASON_LEN: usize = 64;
/// Most rooms one answer to `/netjam/list` names.
pub const MAX_LISTED: usize = 64;
/// Longest server address a `/netjam/redirect` carries (`host:port`), in bytes of UTF-8.
pub const MAX_SERVER_LEN: usize = 128;
/// Largest control message either side writes (a buffer of this size always suffices).
pub const MAX_CONTROL_LEN: usize = 512;
/// Bytes the control channel adds around a control message (`/netjam/sealed ,ihb`: address,
/// type tags, version, nonce, blob length and padding, ChaCha20-Poly1305's tag).
pub const SEALED_OVERHEAD: usize = 16 + 8 + 4 + 8 + 4 + 3 + 16;
/// Largest control datagram on the wire, sealed or not.
pub const MAX_WIRE_LEN: usize = MAX_CONTROL_LEN + SEALED_OVERHEAD;

/// Most host addresses a member declares in its join (more are ignored).
pub const MAX_HOSTS: usize = 4;
/// Length of a per-pair direct-path token (`/netjam/peer`).
pub const PAIR_TOKEN_LEN: usize = 16;
/// Length of a probe's authenticator (`/netjam/probe`).
pub const PROBE_MAC_LEN: usize = 16;
/// Length of `/netjam/rekey`'s nonce.
pub const REKEY_NONCE_LEN: usize = 16;
/// Length of `/netjam/rekey`'s and `/netjam/rekeyed`'s authenticators (HMAC-SHA256, whole in
/// a request, its first 16 bytes in an answer).
pub const REKEY_MAC_LEN: usize = 32;
/// Length of `/netjam/rekeyed`'s authenticator.
pub const REKEYED_MAC_LEN: usize = 16;
/// Most member ids in one `/netjam/route`.
pub const MAX_ROUTE_IDS: usize = 64;
/// Largest ensemble datagram one `/netjam/ens` carries.
pub const MAX_ENS_PAYLOAD: usize = 1400;
/// Bytes `/netjam/ens` adds around its payload (address, type tags, version, member id,
/// blob length; the payload is padded to 4 bytes).
pub const ENS_OVERHEAD: usize = 12 + 8 + 4 + 4 + 4;
/// Largest `/netjam/ens` either side writes; also the largest message of this protocol,
/// so a buffer of this size holds any of them.
pub const MAX_ENS_LEN: usize = ENS_OVERHEAD + MAX_ENS_PAYLOAD;
const _: () = assert!(MAX_ENS_LEN >= MAX_CONTROL_LEN);
/// `/netjam/ens` member id meaning "every other ensemble member of the room".
pub const ENS_EVERYONE: u32 = 0;
/// Address prefix of the ensemble's clock probe (`netjam-ensemble`'s `/_clock/ping`),
/// which the server answers for its members: the server is a room's clock reference.
pub const CLOCK_PING_PREFIX: &[u8] = b"/_clock/ping";

/// The address prefix of every control message; also how the demultiplexer recognises one.
pub const PREFIX: &str = "/netjam/";

/// What a roster event says about a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RosterKind {
    /// The member is in the room (sent for every member already there when one joins).
    Joined = 1,
    /// The member left (`/netjam/leave`).
    Left = 2,
    /// The member was silent for longer than the timeout.
    Timeout = 3,
    /// The member changed its name.
    Renamed = 4,
}

impl RosterKind {
    fn from_i32(v: i32) -> Option<Self> {
        Some(match v {
            1 => Self::Joined,
            2 => Self::Left,
            3 => Self::Timeout,
            4 => Self::Renamed,
            _ => return None,
        })
    }
}

/// Why the server refused a join or rejoin (the `code` of `/netjam/refused`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RefuseCode {
    /// The client speaks another protocol version.
    BadVersion = 1,
    /// The cookie is not valid for this address (stale, or made for another address).
    BadCookie = 2,
    /// The authenticator does not match the room's password.
    WrongPassword = 3,
    /// The room holds its maximum number of members.
    RoomFull = 4,
    /// The declared media rate is above what the server admits.
    RateTooHigh = 5,
    /// The room does not exist yet: join again carrying the room key to create it.
    NoSuchRoom = 6,
    /// A rejoin named a member the server no longer knows (timed out): join afresh.
    UnknownMember = 7,
    /// A field is out of range (empty or too long name, zero rate, ...).
    BadRequest = 8,
    /// The server holds its maximum number of members or rooms.
    ServerFull = 9,
    /// The server cannot reach the room directory it shares with other servers, so it
    /// cannot tell whether the room lives elsewhere: it opens no new room until the
    /// directory answers again (rooms already playing on it go on).
    DirectoryUnavailable = 10,
    /// Another player in the room already has this name (names are compared as
    /// [`fold_name`] folds them) and joined from another address: pick another name.
    NameTaken = 11,
    /// Sent to a seated member's address when a new join with its name came from its IP
    /// address (the same player, restarted): that seat is gone, and the client stops.
    Replaced = 12,
    /// The room's players play at a sample rate netjam cannot convert this player's to
    /// (it converts within 10 %: 44.1 ↔ 48 kHz, 88.2 ↔ 96 kHz): the text names the room's rate.
    RateUnconvertible = 13,
}

impl RefuseCode {
    /// The code for a wire value; unknown values are `None`.
    pub fn from_i32(v: i32) -> Option<Self> {
        Some(match v {
            1 => Self::BadVersion,
            2 => Self::BadCookie,
            3 => Self::WrongPassword,
            4 => Self::RoomFull,
            5 => Self::RateTooHigh,
            6 => Self::NoSuchRoom,
            7 => Self::UnknownMember,
            8 => Self::BadRequest,
            9 => Self::ServerFull,
            10 => Self::DirectoryUnavailable,
            11 => Self::NameTaken,
            12 => Self::Replaced,
            13 => Self::RateUnconvertible,
            _ => return None,
        })
    }

    /// The short human text the server sends with this code.
    pub fn text(self) -> &'static str {
        match self {
            Self::BadVersion => "protocol version not supported",
            Self::BadCookie => "stale or foreign cookie, say hello again",
            Self::WrongPassword => "wrong room password",
            Self::RoomFull => "room is full",
            Self::RateTooHigh => "declared media rate too high",
            Self::NoSuchRoom => "room does not exist yet",
            Self::UnknownMember => "unknown member, join again",
            Self::BadRequest => "bad request",
            Self::ServerFull => "server is full",
            Self::DirectoryUnavailable => "room directory unreachable, no new rooms",
            Self::NameTaken => "name taken in this room, pick another",
            Self::Replaced => "a newer join of this name from this address took the seat",
            Self::RateUnconvertible => "sample rate too far from the room's to convert",
        }
    }
}

/// `/netjam/join`: ask for a seat in a room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Join<'a> {
    /// The cookie from `/netjam/challenge`.
    pub cookie: &'a [u8; COOKIE_LEN],
    /// Room name (1..=64 bytes).
    pub room: &'a str,
    /// Member name (1..=64 bytes).
    pub name: &'a str,
    /// A fresh client nonce.
    pub client_nonce: &'a [u8; NONCE_LEN],
    /// [`join_authenticator`](super::auth::join_authenticator).
    pub authenticator: &'a [u8; AUTH_LEN],
    /// The SSRC the client would like.
    pub ssrc: u32,
    /// Declared media rate: packets per second.
    pub packets_per_s: u32,
    /// Declared media rate: bytes per second (UDP payload).
    pub bytes_per_s: u32,
    /// Empty, or the room key when the client creates the room (after `NoSuchRoom`).
    pub create_key: &'a [u8],
    /// Reserved for the key agreement of encrypted media; empty in version 1.
    pub key_agreement: &'a [u8],
    /// The client's own (host) addresses, [`encode_addrs`] form; empty when it declares
    /// none (the argument is then left out on the wire).
    pub hosts: &'a [u8],
    /// The sample rate of the audio it sends and mixes at, Hz; 0 when it does not say (the
    /// argument is then left out on the wire).
    pub sample_rate: u32,
}

/// `/netjam/rejoin`: take back a seat from a new address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejoin<'a> {
    /// The cookie from `/netjam/challenge` for the new address.
    pub cookie: &'a [u8; COOKIE_LEN],
    /// The member id from `/netjam/welcome`.
    pub member_id: u32,
    /// The session token from `/netjam/welcome`.
    pub token: &'a [u8; TOKEN_LEN],
    /// A fresh client nonce.
    pub client_nonce: &'a [u8; NONCE_LEN],
    /// [`rejoin_authenticator`](super::auth::rejoin_authenticator).
    pub authenticator: &'a [u8; AUTH_LEN],
    /// Reserved for the key agreement of encrypted media; empty in version 1.
    pub key_agreement: &'a [u8],
    /// The client's host addresses from its new address, as in [`Join::hosts`].
    pub hosts: &'a [u8],
}

/// `/netjam/welcome`: the seat the server gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Welcome<'a> {
    /// The member id (unique on this server while the member lives).
    pub member_id: u32,
    /// The SSRC the client must send with (may differ from the one it asked for).
    pub ssrc: u32,
    /// Credential for `/netjam/rejoin`.
    pub token: &'a [u8; TOKEN_LEN],
    /// How often the client sends `/netjam/keepalive`.
    pub keepalive_ms: u32,
    /// Silence after which the server drops the member.
    pub timeout_ms: u32,
    /// Reserved for the key agreement of encrypted media; empty in version 1.
    pub key_agreement: &'a [u8],
}

/// `/netjam/roster`: one reliable event about another member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roster<'a> {
    /// Per-receiver sequence number, from 1, one per event.
    pub seq: u32,
    /// What happened.
    pub kind: RosterKind,
    /// Whom it is about.
    pub member_id: u32,
    /// Its (new) name.
    pub name: &'a str,
    /// Its SSRC.
    pub ssrc: u32,
}

/// `/netjam/peer`: server → client, reliable (it shares the roster's sequence numbers and
/// acknowledgements): how to reach another member directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerInfo<'a> {
    /// Per-receiver sequence number, shared with `/netjam/roster`.
    pub seq: u32,
    /// The other member.
    pub member_id: u32,
    /// Where the server sees the other member ([`encode_addrs`] form, one address).
    pub observed: &'a [u8],
    /// The host addresses the other member declared ([`encode_addrs`] form).
    pub hosts: &'a [u8],
    /// The pair's fresh token: probes between the two are authenticated with it.
    pub token: &'a [u8; PAIR_TOKEN_LEN],
}

/// What the server answers a `/netjam/rekey` (the `status` of `/netjam/rekeyed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RekeyStatus {
    /// The key offered is the room's from the epoch answered: seal and open in it.
    Done = 0,
    /// The request is proven with the room's earlier key but what it offers is not the
    /// room's key now: not the new password.
    NotTheNewPassword = 1,
    /// The epoch asked for is neither the room's nor the next one (the password changed
    /// meanwhile); the answer carries the room's epoch.
    Stale = 2,
    /// The request is proven by neither the room's key nor its earlier one: the sender's
    /// password is two changes behind, or the request was altered (unauthenticated).
    Unproven = 3,
}

impl RekeyStatus {
    /// The status for a wire value; unknown values are `None`.
    pub fn from_i32(v: i32) -> Option<Self> {
        Some(match v {
            0 => Self::Done,
            1 => Self::NotTheNewPassword,
            2 => Self::Stale,
            3 => Self::Unproven,
            _ => return None,
        })
    }
}

/// `/netjam/rekey`: a seated member of a private room gives the server a new join proof
/// (the key of a new password) for the room's next epoch, or shows it has the key of the
/// room's current one, wrapped and authenticated under the key it has
/// ([`RekeyKeys::wrap`](super::auth::RekeyKeys::wrap)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rekey<'a> {
    /// The epoch the key is for: the room's next (a change) or its current (taking it).
    pub epoch: u32,
    /// Fresh for every request.
    pub nonce: &'a [u8; REKEY_NONCE_LEN],
    /// The new room key, encrypted.
    pub wrapped: &'a [u8; ROOM_KEY_LEN],
    /// HMAC-SHA256 over the fields above.
    pub mac: &'a [u8; REKEY_MAC_LEN],
}

/// What a `/netjam/probe` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    /// "Can you hear me?"
    Probe = 1,
    /// "I heard your probe `seq`."
    Ack = 2,
}

/// `/netjam/probe`: member → member, straight through both routers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe<'a> {
    /// The sending member's id.
    pub from: u32,
    /// The member it is meant for.
    pub to: u32,
    /// The probe's number (an ack carries the number of the probe it answers).
    pub seq: u32,
    /// Probe or ack.
    pub kind: ProbeKind,
    /// The sender's round trip to the server, microseconds (0: not measured).
    pub server_rtt_us: u32,
    /// In an ack: how long the probe waited at the acking side between arriving and the
    /// ack leaving, microseconds (taken off the measured round trip); 0 in a probe.
    pub hold_us: u32,
    /// HMAC-SHA256(pair token, the fields above), first 16 bytes.
    pub mac: &'a [u8; PROBE_MAC_LEN],
}

/// One control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control<'a> {
    /// client → server: `/netjam/hello`, padded with a blob of zeros.
    Hello {
        /// Length of the padding blob.
        pad: usize,
    },
    /// server → client: `/netjam/challenge`.
    Challenge {
        /// Return-routability cookie for the address the hello came from.
        cookie: &'a [u8; COOKIE_LEN],
        /// Server nonce the authenticator covers.
        server_nonce: &'a [u8; NONCE_LEN],
    },
    /// client → server: `/netjam/join`.
    Join(Join<'a>),
    /// client → server: `/netjam/rejoin`.
    Rejoin(Rejoin<'a>),
    /// server → client: `/netjam/welcome`.
    Welcome(Welcome<'a>),
    /// server → client: `/netjam/refused`.
    Refused {
        /// Raw code (see [`RefuseCode::from_i32`]).
        code: i32,
        /// Human text.
        text: &'a str,
    },
    /// server → client: `/netjam/roster`.
    Roster(Roster<'a>),
    /// client → server: `/netjam/ack`, cumulative: every event up to `seq` arrived.
    Ack {
        /// Highest sequence number received in order.
        seq: u32,
    },
    /// client → server: `/netjam/rename`.
    Rename {
        /// The new name.
        name: &'a str,
    },
    /// both ways: `/netjam/keepalive` (the server echoes each one).
    Keepalive,
    /// client → server: `/netjam/leave`.
    Leave,
    /// server → unknown address: `/netjam/rebind` ("who are you": say hello and rejoin).
    Rebind,
    /// server → client: `/netjam/peer`.
    Peer(PeerInfo<'a>),
    /// client → server: `/netjam/route`: the members this client now reaches directly
    /// (the server stops forwarding its media to them), replacing any earlier list.
    Route {
        /// Increases with every new list; the server applies only a newer one.
        seq: u32,
        /// Member ids, big-endian u32 each.
        direct: &'a [u8],
    },
    /// server → client: `/netjam/routed`: the route list `seq` (or a newer one) is applied.
    Routed {
        /// The list's sequence number.
        seq: u32,
    },
    /// both ways: `/netjam/ens`, an ensemble datagram relayed by the server. From a
    /// member: `member_id` is the destination ([`ENS_EVERYONE`]: every other member of
    /// the room that speaks ensemble); from the server: the member it came from.
    Ens {
        /// Destination (client → server) or source (server → client).
        member_id: u32,
        /// The ensemble datagram, at most [`MAX_ENS_PAYLOAD`] bytes.
        payload: &'a [u8],
    },
    /// member → member: `/netjam/probe`.
    Probe(Probe<'a>),
    /// both ways: `/netjam/public`: a member asks that its room be listed publicly; the
    /// server echoes it once the room is.
    Public,
    /// anyone → server: `/netjam/list` with a cookie from `/netjam/challenge`: which public
    /// rooms are there?
    List {
        /// The cookie the challenge gave this address.
        cookie: &'a [u8; COOKIE_LEN],
    },
    /// server → asker: `/netjam/listed`, one public room.
    Listed {
        /// The room's name.
        room: &'a str,
        /// The server it lives on (`host:port`; empty: the server answering).
        server: &'a str,
        /// Players in it.
        members: u32,
        /// That server's region label (may be empty).
        region: &'a str,
    },
    /// server → asker: `/netjam/listend`: the answer to `/netjam/list` is complete.
    ListEnd {
        /// How many `/netjam/listed` came before it.
        count: u32,
    },
    /// client → server: `/netjam/rekey`.
    Rekey(Rekey<'a>),
    /// server → client: `/netjam/rekeyed`, the answer to a `/netjam/rekey`.
    Rekeyed {
        /// The room's epoch now.
        epoch: u32,
        /// Raw status (see [`RekeyStatus::from_i32`]).
        status: i32,
        /// [`RekeyKeys::answer_mac`](super::auth::RekeyKeys::answer_mac); empty with [`RekeyStatus::Unproven`].
        mac: &'a [u8],
    },
    /// server → client: `/netjam/epoch`, reliable (the roster's sequence numbers): the
    /// room's media epoch, sent after every new seat and whenever a member changes the
    /// password.
    Epoch {
        /// Per-receiver sequence number, shared with `/netjam/roster`.
        seq: u32,
        /// The room's epoch.
        epoch: u32,
        /// The member who changed the password; 0 when sent after a new seat.
        by: u32,
    },
    /// server → client: `/netjam/redirect`, the answer to a join for a room that another
    /// server hosts: join that one instead.
    Redirect {
        /// The room the join asked for.
        room: &'a str,
        /// Where the room lives: `host:port` as that server advertises itself
        /// (1..=[`MAX_SERVER_LEN`] bytes).
        server: &'a str,
    },
}

/// Why bytes are not a control message this code understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// Not a well-formed OSC message.
    #[error(transparent)]
    Osc(#[from] netjam_osc::DecodeError),
    /// An OSC bundle (not used by this protocol).
    #[error("OSC bundle where a control message was expected")]
    Bundle,
    /// Not one of the addresses this protocol defines.
    #[error("unknown control address")]
    UnknownAddress,
    /// A known address whose first argument is another protocol version.
    #[error("protocol version {0} not supported (this is {PROTOCOL_VERSION})")]
    Version(i32),
    /// Type tags or argument values do not match the message's layout.
    #[error("arguments do not match the message layout")]
    BadArguments,
}

const HELLO: &str = "/netjam/hello";
const CHALLENGE: &str = "/netjam/challenge";
const JOIN: &str = "/netjam/join";
const REJOIN: &str = "/netjam/rejoin";
const WELCOME: &str = "/netjam/welcome";
const REFUSED: &str = "/netjam/refused";
const ROSTER: &str = "/netjam/roster";
const ACK: &str = "/netjam/ack";
const RENAME: &str = "/netjam/rename";
const KEEPALIVE: &str = "/netjam/keepalive";
const LEAVE: &str = "/netjam/leave";
const REBIND: &str = "/netjam/rebind";
const PEER: &str = "/netjam/peer";
const ROUTE: &str = "/netjam/route";
const ROUTED: &str = "/netjam/routed";
const PROBE: &str = "/netjam/probe";
const ENS: &str = "/netjam/ens";
const REDIRECT: &str = "/netjam/redirect";
const PUBLIC: &str = "/netjam/public";
const LIST: &str = "/netjam/list";
const LISTED: &str = "/netjam/listed";
const LISTEND: &str = "/netjam/listend";
const REKEY: &str = "/netjam/rekey";
const REKEYED: &str = "/netjam/rekeyed";
const EPOCH: &str = "/netjam/epoch";

/// The padding blob a client puts in its hello so that the hello is at least as long as
/// the challenge it asks for: 64 bytes makes a 92-byte hello for an 88-byte challenge.
pub const HELLO_PAD: usize = 64;

/// Length of every `/netjam/challenge` (fixed). The server drops a hello shorter than this.
pub const CHALLENGE_LEN: usize = 20 + 8 + 4 + (4 + COOKIE_LEN) + (4 + NONCE_LEN);

const ZEROS: [u8; 256] = [0; 256];

fn arr<const N: usize>(b: &[u8]) -> Option<&[u8; N]> {
    b.try_into().ok()
}

impl<'a> Control<'a> {
    /// Whether `bytes` is addressed as an ensemble envelope ([`Control::Ens`]), from its
    /// address alone (a shell routing datagrams decides by it; [`Control::decode`] checks
    /// the rest).
    pub fn is_ens(bytes: &[u8]) -> bool {
        bytes.starts_with(ENS.as_bytes()) && bytes.get(ENS.len()) == Some(&0)
    }

    /// Decodes one control message. Never allocates; any malformed input is an error.
    pub fn decode(bytes: &'a [u8]) -> Result<Self, ControlError> {
        let m = match Packet::decode(bytes)? {
            Packet::Message(m) => m,
            Packet::Bundle(_) => return Err(ControlError::Bundle),
        };
        let address = m.address();
        let tags = m.type_tag_bytes();
        let mut args = m.args();
        // Every message: a known address, then int32 version.
        let known = matches!(
            address,
            HELLO
                | CHALLENGE
                | JOIN
                | REJOIN
                | WELCOME
                | REFUSED
                | ROSTER
                | ACK
                | RENAME
                | KEEPALIVE
                | LEAVE
                | REBIND
                | PEER
                | ROUTE
                | ROUTED
                | PROBE
                | ENS
                | REDIRECT
                | PUBLIC
                | LIST
                | LISTED
                | LISTEND
                | REKEY
                | REKEYED
                | EPOCH
        );
        if !known {
            return Err(ControlError::UnknownAddress);
        }
        match args.next() {
            Some(Arg::Int(PROTOCOL_VERSION)) => {}
            Some(Arg::Int(v)) => return Err(ControlError::Version(v)),
            _ => return Err(ControlError::BadArguments),
        }
        let bad = ControlError::BadArguments;
        let mut next = || match args.next() {
            Some(Arg::Int(v)) => Ok(ArgV::I(v)),
            Some(Arg::Blob(b)) => Ok(ArgV::B(b)),
            Some(Arg::Str(s)) => Ok(ArgV::S(s)),
            _ => Err(ControlError::BadArguments),
        };
        macro_rules! i {
            () => {
                match next()? {
                    ArgV::I(v) => v,
                    _ => return Err(bad),
                }
            };
        }
        macro_rules! b {
            () => {
                match next()? {
                    ArgV::B(v) => v,
                    _ => return Err(bad),
                }
            };
        }
        macro_rules! s {
            () => {
                match next()? {
                    ArgV::S(v) => v,
                    _ => return Err(bad),
                }
            };
        }
        macro_rules! fixed {
            ($n:expr) => {
                arr::<{ $n }>(b!()).ok_or(bad)?
            };
        }
        let expect = |t: &[u8]| {
            if tags == t {
                Ok(())
            } else {
                Err(ControlError::BadArguments)
            }
        };
        Ok(match address {
            HELLO => {
                expect(b"ib")?;
                Control::Hello { pad: b!().len() }
            }
            CHALLENGE => {
                expect(b"ibb")?;
                Control::Challenge {
                    cookie: fixed!(COOKIE_LEN),
                    server_nonce: fixed!(NONCE_LEN),
                }
            }
            JOIN => {
                // Optional trailing arguments: the host addresses (a blob), then the
                // sample rate (an int).
                let with_rate = tags.len() > 11 && tags.ends_with(b"i");
                let core = if with_rate { &tags[..tags.len() - 1] } else { tags };
                let with_hosts = core == b"ibssbbiiibbb";
                if !with_hosts && core != b"ibssbbiiibb" {
                    expect(b"ibssbbiiibb")?;
                }
                Control::Join(Join {
                    cookie: fixed!(COOKIE_LEN),
                    room: s!(),
                    name: s!(),
                    client_nonce: fixed!(NONCE_LEN),
                    authenticator: fixed!(AUTH_LEN),
                    ssrc: i!() as u32,
                    packets_per_s: i!() as u32,
                    bytes_per_s: i!() as u32,
                    create_key: b!(),
                    key_agreement: b!(),
                    hosts: if with_hosts { b!() } else { &[] },
                    sample_rate: if with_rate { i!() as u32 } else { 0 },
                })
            }
            REJOIN => {
                let with_hosts = tags == b"ibibbbbb";
                if !with_hosts {
                    expect(b"ibibbbb")?;
                }
                Control::Rejoin(Rejoin {
                    cookie: fixed!(COOKIE_LEN),
                    member_id: i!() as u32,
                    token: fixed!(TOKEN_LEN),
                    client_nonce: fixed!(NONCE_LEN),
                    authenticator: fixed!(AUTH_LEN),
                    key_agreement: b!(),
                    hosts: if with_hosts { b!() } else { &[] },
                })
            }
            WELCOME => {
                expect(b"iiibiib")?;
                Control::Welcome(Welcome {
                    member_id: i!() as u32,
                    ssrc: i!() as u32,
                    token: fixed!(TOKEN_LEN),
                    keepalive_ms: i!() as u32,
                    timeout_ms: i!() as u32,
                    key_agreement: b!(),
                })
            }
            REFUSED => {
                expect(b"iis")?;
                Control::Refused {
                    code: i!(),
                    text: s!(),
                }
            }
            ROSTER => {
                expect(b"iiiisi")?;
                let seq = i!() as u32;
                let kind = RosterKind::from_i32(i!()).ok_or(bad)?;
                Control::Roster(Roster {
                    seq,
                    kind,
                    member_id: i!() as u32,
                    name: s!(),
                    ssrc: i!() as u32,
                })
            }
            ACK => {
                expect(b"ii")?;
                Control::Ack { seq: i!() as u32 }
            }
            RENAME => {
                expect(b"is")?;
                Control::Rename { name: s!() }
            }
            KEEPALIVE => {
                expect(b"i")?;
                Control::Keepalive
            }
            LEAVE => {
                expect(b"i")?;
                Control::Leave
            }
            PEER => {
                expect(b"iiibbb")?;
                Control::Peer(PeerInfo {
                    seq: i!() as u32,
                    member_id: i!() as u32,
                    observed: b!(),
                    hosts: b!(),
                    token: fixed!(PAIR_TOKEN_LEN),
                })
            }
            ROUTE => {
                expect(b"iib")?;
                let seq = i!() as u32;
                let direct = b!();
                if direct.len() % 4 != 0 || direct.len() / 4 > MAX_ROUTE_IDS {
                    return Err(bad);
                }
                Control::Route { seq, direct }
            }
            ROUTED => {
                expect(b"ii")?;
                Control::Routed { seq: i!() as u32 }
            }
            PROBE => {
                expect(b"iiiiiiib")?;
                let (from, to, seq) = (i!() as u32, i!() as u32, i!() as u32);
                let kind = match i!() {
                    1 => ProbeKind::Probe,
                    2 => ProbeKind::Ack,
                    _ => return Err(bad),
                };
                Control::Probe(Probe {
                    from,
                    to,
                    seq,
                    kind,
                    server_rtt_us: i!() as u32,
                    hold_us: i!() as u32,
                    mac: fixed!(PROBE_MAC_LEN),
                })
            }
            ENS => {
                expect(b"iib")?;
                let member_id = i!() as u32;
                let payload = b!();
                if payload.len() > MAX_ENS_PAYLOAD {
                    return Err(bad);
                }
                Control::Ens { member_id, payload }
            }
            REDIRECT => {
                expect(b"iss")?;
                let room = s!();
                let server = s!();
                if !valid_name(room) || server.is_empty() || server.len() > MAX_SERVER_LEN {
                    return Err(bad);
                }
                Control::Redirect { room, server }
            }
            PUBLIC => {
                expect(b"i")?;
                Control::Public
            }
            LIST => {
                expect(b"ib")?;
                Control::List {
                    cookie: fixed!(COOKIE_LEN),
                }
            }
            LISTED => {
                expect(b"issis")?;
                let (room, server, members, region) = (s!(), s!(), i!() as u32, s!());
                if !valid_name(room) || server.len() > MAX_SERVER_LEN || region.len() > MAX_NAME_LEN {
                    return Err(bad);
                }
                Control::Listed {
                    room,
                    server,
                    members,
                    region,
                }
            }
            LISTEND => {
                expect(b"ii")?;
                Control::ListEnd { count: i!() as u32 }
            }
            REKEY => {
                expect(b"iibbb")?;
                Control::Rekey(Rekey {
                    epoch: i!() as u32,
                    nonce: fixed!(REKEY_NONCE_LEN),
                    wrapped: fixed!(ROOM_KEY_LEN),
                    mac: fixed!(REKEY_MAC_LEN),
                })
            }
            REKEYED => {
                expect(b"iiib")?;
                let (epoch, status, mac) = (i!() as u32, i!(), b!());
                if !(mac.is_empty() || mac.len() == REKEYED_MAC_LEN) {
                    return Err(bad);
                }
                Control::Rekeyed { epoch, status, mac }
            }
            EPOCH => {
                expect(b"iiii")?;
                Control::Epoch {
                    seq: i!() as u32,
                    epoch: i!() as u32,
                    by: i!() as u32,
                }
            }
            _ => {
                expect(b"i")?;
                Control::Rebind
            }
        })
    }

    /// Encodes this message into `buf` and returns its length. [`MAX_CONTROL_LEN`] bytes
    /// always suffice for names and texts within their limits.
    pub fn encode(&self, buf: &mut [u8]) -> Result<usize, EncodeError> {
        let v = Arg::Int(PROTOCOL_VERSION);
        let u = |x: u32| Arg::Int(x as i32);
        match *self {
            Control::Hello { pad } => {
                encode_message(buf, HELLO, &[v, Arg::Blob(&ZEROS[..pad.min(ZEROS.len())])])
            }
            Control::Challenge { cookie, server_nonce } => {
                encode_message(buf, CHALLENGE, &[v, Arg::Blob(cookie), Arg::Blob(server_nonce)])
            }
            // The host addresses and the sample rate are trailing arguments, each left out
            // when there is nothing to say, so that an older server reads a join that says
            // neither as before.
            Control::Join(j) => {
                let mut args = [
                    v,
                    Arg::Blob(j.cookie),
                    Arg::Str(j.room),
                    Arg::Str(j.name),
                    Arg::Blob(j.client_nonce),
                    Arg::Blob(j.authenticator),
                    u(j.ssrc),
                    u(j.packets_per_s),
                    u(j.bytes_per_s),
                    Arg::Blob(j.create_key),
                    Arg::Blob(j.key_agreement),
                    Arg::Blob(j.hosts),
                    u(j.sample_rate),
                ];
                let mut n = args.len();
                if j.sample_rate == 0 {
                    n -= 1;
                }
                if j.hosts.is_empty() {
                    args[11] = args[12];
                    n -= 1;
                }
                encode_message(buf, JOIN, &args[..n])
            }
            Control::Rejoin(r) => {
                let args = [
                    v,
                    Arg::Blob(r.cookie),
                    u(r.member_id),
                    Arg::Blob(r.token),
                    Arg::Blob(r.client_nonce),
                    Arg::Blob(r.authenticator),
                    Arg::Blob(r.key_agreement),
                    Arg::Blob(r.hosts),
                ];
                encode_message(buf, REJOIN, without_empty_hosts(&args, r.hosts))
            }
            Control::Welcome(w) => encode_message(
                buf,
                WELCOME,
                &[
                    v,
                    u(w.member_id),
                    u(w.ssrc),
                    Arg::Blob(w.token),
                    u(w.keepalive_ms),
                    u(w.timeout_ms),
                    Arg::Blob(w.key_agreement),
                ],
            ),
            Control::Refused { code, text } => {
                encode_message(buf, REFUSED, &[v, Arg::Int(code), Arg::Str(text)])
            }
            Control::Roster(r) => encode_message(
                buf,
                ROSTER,
                &[
                    v,
                    u(r.seq),
                    Arg::Int(r.kind as i32),
                    u(r.member_id),
                    Arg::Str(r.name),
                    u(r.ssrc),
                ],
            ),
            Control::Ack { seq } => encode_message(buf, ACK, &[v, u(seq)]),
            Control::Rename { name } => encode_message(buf, RENAME, &[v, Arg::Str(name)]),
            Control::Keepalive => encode_message(buf, KEEPALIVE, &[v]),
            Control::Leave => encode_message(buf, LEAVE, &[v]),
            Control::Rebind => encode_message(buf, REBIND, &[v]),
            Control::Peer(p) => encode_message(
                buf,
                PEER,
                &[
                    v,
                    u(p.seq),
                    u(p.member_id),
                    Arg::Blob(p.observed),
                    Arg::Blob(p.hosts),
                    Arg::Blob(p.token),
                ],
            ),
            Control::Route { seq, direct } => encode_message(buf, ROUTE, &[v, u(seq), Arg::Blob(direct)]),
            Control::Routed { seq } => encode_message(buf, ROUTED, &[v, u(seq)]),
            Control::Ens { member_id, payload } => {
                encode_message(buf, ENS, &[v, u(member_id), Arg::Blob(payload)])
            }
            Control::Redirect { room, server } => {
                encode_message(buf, REDIRECT, &[v, Arg::Str(room), Arg::Str(server)])
            }
            Control::Public => encode_message(buf, PUBLIC, &[v]),
            Control::List { cookie } => encode_message(buf, LIST, &[v, Arg::Blob(cookie)]),
            Control::Listed {
                room,
                server,
                members,
                region,
            } => encode_message(
                buf,
                LISTED,
                &[v, Arg::Str(room), Arg::Str(server), u(members), Arg::Str(region)],
            ),
            Control::ListEnd { count } => encode_message(buf, LISTEND, &[v, u(count)]),
            Control::Rekey(r) => encode_message(
                buf,
                REKEY,
                &[
                    v,
                    u(r.epoch),
                    Arg::Blob(r.nonce),
                    Arg::Blob(r.wrapped),
                    Arg::Blob(r.mac),
                ],
            ),
            Control::Rekeyed { epoch, status, mac } => {
                encode_message(buf, REKEYED, &[v, u(epoch), Arg::Int(status), Arg::Blob(mac)])
            }
            Control::Epoch { seq, epoch, by } => encode_message(buf, EPOCH, &[v, u(seq), u(epoch), u(by)]),
            Control::Probe(p) => encode_message(
                buf,
                PROBE,
                &[
                    v,
                    u(p.from),
                    u(p.to),
                    u(p.seq),
                    Arg::Int(p.kind as i32),
                    u(p.server_rtt_us),
                    u(p.hold_us),
                    Arg::Blob(p.mac),
                ],
            ),
        }
    }
}

enum ArgV<'a> {
    I(i32),
    B(&'a [u8]),
    S(&'a str),
}

/// Bytes one address takes in [`encode_addrs`] form: a family byte (4 or 6), the address,
/// the port (big-endian).
fn addr_len(a: &std::net::SocketAddr) -> usize {
    match a {
        std::net::SocketAddr::V4(_) => 1 + 4 + 2,
        std::net::SocketAddr::V6(_) => 1 + 16 + 2,
    }
}

/// Longest address list [`encode_addrs`] writes ([`MAX_HOSTS`] IPv6 addresses).
pub const MAX_ADDRS_LEN: usize = MAX_HOSTS * 19;

/// Writes up to [`MAX_HOSTS`] addresses into `out` (each: family byte 4 or 6, address,
/// port big-endian) and returns the length; what does not fit is left out.
pub fn encode_addrs(addrs: &[std::net::SocketAddr], out: &mut [u8]) -> usize {
    let mut at = 0;
    for a in addrs.iter().take(MAX_HOSTS) {
        let n = addr_len(a);
        let Some(w) = out.get_mut(at..at + n) else { break };
        match a {
            std::net::SocketAddr::V4(v4) => {
                w[0] = 4;
                w[1..5].copy_from_slice(&v4.ip().octets());
            }
            std::net::SocketAddr::V6(v6) => {
                w[0] = 6;
                w[1..17].copy_from_slice(&v6.ip().octets());
            }
        }
        w[n - 2..].copy_from_slice(&a.port().to_be_bytes());
        at += n;
    }
    at
}

/// Reads an address list written by [`encode_addrs`]: at most [`MAX_HOSTS`] addresses;
/// reading stops at the first malformed entry. Never allocates.
pub fn decode_addrs(bytes: &[u8]) -> [Option<std::net::SocketAddr>; MAX_HOSTS] {
    let mut out = [None; MAX_HOSTS];
    let mut at = 0;
    for slot in &mut out {
        let a = match bytes.get(at) {
            Some(4) => bytes.get(at + 1..at + 7).map(|w| {
                std::net::SocketAddr::from(([w[0], w[1], w[2], w[3]], u16::from_be_bytes([w[4], w[5]])))
            }),
            Some(6) => bytes.get(at + 1..at + 19).map(|w| {
                let mut ip = [0u8; 16];
                ip.copy_from_slice(&w[..16]);
                std::net::SocketAddr::from((ip, u16::from_be_bytes([w[16], w[17]])))
            }),
            _ => None,
        };
        let Some(a) = a else { break };
        at += addr_len(&a);
        *slot = Some(a);
    }
    out
}

/// Whether `name` is acceptable as a room or member name: 1..=[`MAX_NAME_LEN`] bytes, no
/// control characters.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME_LEN && !name.chars().any(char::is_control)
}

/// The form in which room names, and member names within a room, are compared: Unicode
/// lowercase, so "Friday" and "friday" are one room and "Ana" and "ana" one name. What is
/// shown keeps the spelling given.
pub fn fold_name(name: &str) -> String {
    name.to_lowercase()
}

/// `args` (whose last is the host addresses) without that last one when `hosts` is empty.
fn without_empty_hosts<'a, 'b>(args: &'b [Arg<'a>], hosts: &[u8]) -> &'b [Arg<'a>] {
    if hosts.is_empty() {
        &args[..args.len() - 1]
    } else {
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(c: Control<'_>) {
        let mut buf = [0u8; MAX_CONTROL_LEN];
        let n = c.encode(&mut buf).unwrap();
        assert_eq!(Control::decode(&buf[..n]).unwrap(), c);
        // Every truncation is an error, never a panic.
        for k in 0..n {
            assert!(Control::decode(&buf[..k]).is_err());
        }
    }

    #[test]
    fn every_message_roundtrips() {
        let c = [7u8; COOKIE_LEN];
        let nonce = [3u8; NONCE_LEN];
        let auth = [9u8; AUTH_LEN];
        let tok = [5u8; TOKEN_LEN];
        roundtrip(Control::Hello { pad: HELLO_PAD });
        roundtrip(Control::Challenge {
            cookie: &c,
            server_nonce: &nonce,
        });
        roundtrip(Control::Join(Join {
            cookie: &c,
            room: "band",
            name: "Ana",
            client_nonce: &nonce,
            authenticator: &auth,
            ssrc: 0xdead_beef,
            packets_per_s: 750,
            bytes_per_s: 207_000,
            create_key: &[1; ROOM_KEY_LEN],
            key_agreement: &[],
            hosts: &[],
            sample_rate: 0,
        }));
        let mut hosts = [0u8; MAX_ADDRS_LEN];
        let hn = encode_addrs(
            &[
                "192.168.1.2:4464".parse().unwrap(),
                "[fe80::1]:9".parse().unwrap(),
            ],
            &mut hosts,
        );
        // The host addresses and the sample rate, each with and without the other.
        for (hosts, sample_rate) in [(&hosts[..hn], 0), (&hosts[..hn], 44_100), (&[][..], 96_000)] {
            roundtrip(Control::Join(Join {
                cookie: &c,
                room: "band",
                name: "Ana",
                client_nonce: &nonce,
                authenticator: &auth,
                ssrc: 1,
                packets_per_s: 750,
                bytes_per_s: 207_000,
                create_key: &[],
                key_agreement: &[],
                hosts,
                sample_rate,
            }));
        }
        roundtrip(Control::Rejoin(Rejoin {
            cookie: &c,
            member_id: 4,
            token: &tok,
            client_nonce: &nonce,
            authenticator: &auth,
            key_agreement: &[],
            hosts: &hosts[..hn],
        }));
        roundtrip(Control::Peer(PeerInfo {
            seq: 5,
            member_id: 9,
            observed: &hosts[..7],
            hosts: &hosts[..hn],
            token: &[8; PAIR_TOKEN_LEN],
        }));
        roundtrip(Control::Route {
            seq: 3,
            direct: &[0, 0, 0, 2, 0, 0, 0, 7],
        });
        roundtrip(Control::Routed { seq: 3 });
        roundtrip(Control::Ens {
            member_id: ENS_EVERYONE,
            payload: b"/_ens/bye\0\0\0,h\0\0\0\0\0\0\0\0\0\x07",
        });
        roundtrip(Control::Probe(Probe {
            from: 1,
            to: 2,
            seq: 77,
            kind: ProbeKind::Ack,
            server_rtt_us: 1234,
            hold_us: 56,
            mac: &[6; PROBE_MAC_LEN],
        }));
        roundtrip(Control::Rejoin(Rejoin {
            cookie: &c,
            member_id: 4,
            token: &tok,
            client_nonce: &nonce,
            authenticator: &auth,
            key_agreement: &[],
            hosts: &[],
        }));
        roundtrip(Control::Welcome(Welcome {
            member_id: 4,
            ssrc: u32::MAX,
            token: &tok,
            keepalive_ms: 1000,
            timeout_ms: 5000,
            key_agreement: &[],
        }));
        roundtrip(Control::Refused {
            code: RefuseCode::RoomFull as i32,
            text: "room is full",
        });
        roundtrip(Control::Roster(Roster {
            seq: 3,
            kind: RosterKind::Renamed,
            member_id: 2,
            name: "Bo",
            ssrc: 17,
        }));
        roundtrip(Control::Ack { seq: 99 });
        roundtrip(Control::Rename { name: "Cy" });
        roundtrip(Control::Keepalive);
        roundtrip(Control::Leave);
        roundtrip(Control::Rebind);
        roundtrip(Control::Redirect {
            room: "band",
            server: "eu-west.example.org:4464",
        });
        roundtrip(Control::Public);
        roundtrip(Control::List { cookie: &c });
        roundtrip(Control::Listed {
            room: "band",
            server: "eu-west.example.org:4464",
            members: 4,
            region: "eu-west",
        });
        roundtrip(Control::Listed {
            room: "duo",
            server: "",
            members: 2,
            region: "",
        });
        roundtrip(Control::ListEnd { count: 2 });
        roundtrip(Control::Rekey(Rekey {
            epoch: 3,
            nonce: &[7; REKEY_NONCE_LEN],
            wrapped: &[8; ROOM_KEY_LEN],
            mac: &[9; REKEY_MAC_LEN],
        }));
        roundtrip(Control::Rekeyed {
            epoch: 3,
            status: RekeyStatus::Done as i32,
            mac: &[1; REKEYED_MAC_LEN],
        });
        roundtrip(Control::Rekeyed {
            epoch: 0,
            status: RekeyStatus::Unproven as i32,
            mac: &[],
        });
        roundtrip(Control::Epoch {
            seq: 4,
            epoch: 2,
            by: 17,
        });
        roundtrip(Control::Refused {
            code: RefuseCode::DirectoryUnavailable as i32,
            text: RefuseCode::DirectoryUnavailable.text(),
        });
    }

    #[test]
    fn redirects_name_a_room_and_a_server_within_limits() {
        let mut buf = [0u8; MAX_CONTROL_LEN];
        let long = "s".repeat(MAX_SERVER_LEN);
        let n = Control::Redirect {
            room: "band",
            server: &long,
        }
        .encode(&mut buf)
        .unwrap();
        assert!(Control::decode(&buf[..n]).is_ok());
        let longer = "s".repeat(MAX_SERVER_LEN + 1);
        for (room, server) in [("band", longer.as_str()), ("band", ""), ("", "a:1")] {
            let n = Control::Redirect { room, server }.encode(&mut buf).unwrap();
            assert_eq!(
                Control::decode(&buf[..n]),
                Err(ControlError::BadArguments),
                "{room:?} {server:?}"
            );
        }
        // "band" takes 8 bytes, "a:1" 4.
        assert_eq!(
            Control::Redirect {
                room: "band",
                server: "a:1"
            }
            .encode(&mut buf)
            .unwrap(),
            20 + 8 + 4 + 8 + 4
        );
    }

    #[test]
    fn hello_is_longer_than_challenge_and_challenge_len_is_exact() {
        let mut buf = [0u8; MAX_CONTROL_LEN];
        let h = Control::Hello { pad: HELLO_PAD }.encode(&mut buf).unwrap();
        let c = Control::Challenge {
            cookie: &[0; COOKIE_LEN],
            server_nonce: &[0; NONCE_LEN],
        }
        .encode(&mut buf)
        .unwrap();
        assert_eq!(c, CHALLENGE_LEN);
        assert!(h >= c, "hello {h} < challenge {c}");
    }

    /// The sizes `docs/protocol.md` states.
    #[test]
    fn sizes_match_the_protocol_document() {
        let mut buf = [0u8; MAX_CONTROL_LEN];
        let c = [0u8; COOKIE_LEN];
        let n = [0u8; NONCE_LEN];
        let a = [0u8; AUTH_LEN];
        let t = [0u8; TOKEN_LEN];
        let mut len = |m: Control<'_>| m.encode(&mut buf).unwrap();
        // One IPv4 host address: 7 bytes, padded to 8.
        const H: [u8; 7] = [4, 10, 0, 0, 1, 0x11, 0x70];
        let join = |create: &'static [u8], hosts: &'static [u8], sample_rate| {
            Control::Join(Join {
                cookie: &c,
                room: "abc",
                name: "abcd",
                client_nonce: &n,
                authenticator: &a,
                ssrc: 0,
                packets_per_s: 1,
                bytes_per_s: 1,
                create_key: create,
                key_agreement: &[],
                hosts,
                sample_rate,
            })
        };
        // "abc" takes 4 bytes, "abcd" 8.
        assert_eq!(len(join(&[], &[], 0)), 148 + 4 + 8);
        assert_eq!(len(join(&[0; ROOM_KEY_LEN], &[], 0)), 148 + 4 + 8 + 32);
        let rejoin = Control::Rejoin(Rejoin {
            cookie: &c,
            member_id: 0,
            token: &t,
            client_nonce: &n,
            authenticator: &a,
            key_agreement: &[],
            hosts: &[],
        });
        assert_eq!(len(rejoin), 152);
        let welcome = Control::Welcome(Welcome {
            member_id: 0,
            ssrc: 0,
            token: &t,
            keepalive_ms: 0,
            timeout_ms: 0,
            key_agreement: &[],
        });
        assert_eq!(len(welcome), 72);
        assert_eq!(len(Control::Refused { code: 1, text: "abc" }), 32 + 4);
        let roster = Control::Roster(Roster {
            seq: 1,
            kind: RosterKind::Joined,
            member_id: 1,
            name: "abcd",
            ssrc: 1,
        });
        assert_eq!(len(roster), 44 + 8);
        assert_eq!(len(Control::Ack { seq: 1 }), 24);
        assert_eq!(len(Control::Rename { name: "abc" }), 24 + 4);
        assert_eq!(len(Control::Keepalive), 28);
        assert_eq!(len(Control::Leave), 24);
        assert_eq!(len(Control::Rebind), 24);
        assert_eq!(len(Control::Hello { pad: HELLO_PAD }), 92);
        // A host address adds a tag and a blob.
        assert_eq!(len(join(&[], &H, 0)), 148 + 4 + 8 + 4 + 8);
        // A sample rate adds a tag (within the tag string's padding) and an int.
        assert_eq!(len(join(&[], &H, 48_000)), 148 + 4 + 8 + 4 + 8 + 4);
        let peer = Control::Peer(PeerInfo {
            seq: 1,
            member_id: 2,
            observed: &H,
            hosts: &H,
            token: &[0; PAIR_TOKEN_LEN],
        });
        assert_eq!(len(peer), 80);
        assert_eq!(
            len(Control::Route {
                seq: 1,
                direct: &[0; 8]
            }),
            44
        );
        assert_eq!(len(Control::Routed { seq: 1 }), 28);
        let probe = Control::Probe(Probe {
            from: 1,
            to: 2,
            seq: 3,
            kind: ProbeKind::Probe,
            server_rtt_us: 0,
            hold_us: 0,
            mac: &[0; PROBE_MAC_LEN],
        });
        assert_eq!(len(probe), 76);
        assert_eq!(len(Control::Public), 24);
        assert_eq!(len(Control::List { cookie: &c }), 60);
        let listed = Control::Listed {
            room: "abc",
            server: "abc",
            members: 2,
            region: "abcd",
        };
        assert_eq!(len(listed), 32 + 4 + 4 + 8);
        assert_eq!(len(Control::ListEnd { count: 1 }), 28);
        let rekey = Control::Rekey(Rekey {
            epoch: 1,
            nonce: &[0; REKEY_NONCE_LEN],
            wrapped: &[0; ROOM_KEY_LEN],
            mac: &[0; REKEY_MAC_LEN],
        });
        assert_eq!(len(rekey), 124);
        let done = Control::Rekeyed {
            epoch: 1,
            status: 0,
            mac: &[0; REKEYED_MAC_LEN],
        };
        assert_eq!(len(done), 56);
        assert_eq!(
            len(Control::Epoch {
                seq: 1,
                epoch: 1,
                by: 0
            }),
            40
        );
    }

    #[test]
    fn a_rekey_answer_carries_a_whole_authenticator_or_none() {
        let mut buf = [0u8; MAX_CONTROL_LEN];
        let n = Control::Rekeyed {
            epoch: 1,
            status: 0,
            mac: &[5; 8],
        }
        .encode(&mut buf)
        .expect("encode");
        assert_eq!(Control::decode(&buf[..n]), Err(ControlError::BadArguments));
        assert_eq!(RekeyStatus::from_i32(4), None);
        assert_eq!(RekeyStatus::from_i32(2), Some(RekeyStatus::Stale));
    }

    #[test]
    fn ens_envelopes_hold_their_largest_payload_and_refuse_a_larger_one() {
        let big = vec![1u8; MAX_ENS_PAYLOAD];
        let mut buf = vec![0u8; MAX_ENS_LEN + 8];
        let c = Control::Ens {
            member_id: 9,
            payload: &big,
        };
        let n = c.encode(&mut buf).unwrap();
        assert_eq!(n, MAX_ENS_LEN);
        assert_eq!(Control::decode(&buf[..n]).unwrap(), c);
        let bigger = vec![1u8; MAX_ENS_PAYLOAD + 1];
        let n = Control::Ens {
            member_id: 9,
            payload: &bigger,
        }
        .encode(&mut buf)
        .unwrap();
        assert_eq!(Control::decode(&buf[..n]), Err(ControlError::BadArguments));
    }

    #[test]
    fn address_lists_roundtrip_and_stop_at_garbage() {
        let addrs: [std::net::SocketAddr; 3] = [
            "10.1.2.3:4464".parse().unwrap(),
            "[2001:db8::7]:5000".parse().unwrap(),
            "127.0.0.1:1".parse().unwrap(),
        ];
        let mut buf = [0u8; MAX_ADDRS_LEN];
        let n = encode_addrs(&addrs, &mut buf);
        assert_eq!(n, 7 + 19 + 7);
        let back = decode_addrs(&buf[..n]);
        assert_eq!(&back[..3], &addrs.map(Some)[..]);
        assert_eq!(back[3], None);
        for k in 0..n {
            let _ = decode_addrs(&buf[..k]);
        }
        assert_eq!(decode_addrs(&[9, 1, 2])[0], None);
    }

    #[test]
    fn other_versions_are_named() {
        let mut buf = [0u8; 64];
        // Version 1, whose joins this version's server could not read, and a later one.
        for v in [1, PROTOCOL_VERSION + 1] {
            let n = encode_message(&mut buf, "/netjam/keepalive", &[Arg::Int(v)]).unwrap();
            assert_eq!(Control::decode(&buf[..n]), Err(ControlError::Version(v)));
        }
        let v = Arg::Int(PROTOCOL_VERSION);
        let n = encode_message(&mut buf, "/netjam/nope", &[v]).unwrap();
        assert_eq!(Control::decode(&buf[..n]), Err(ControlError::UnknownAddress));
        let n = encode_message(&mut buf, "/netjam/ack", &[v, Arg::Str("x")]).unwrap();
        assert_eq!(Control::decode(&buf[..n]), Err(ControlError::BadArguments));
    }
}
