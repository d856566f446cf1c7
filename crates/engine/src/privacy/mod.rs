//! Private rooms: media sealed end to end per sender, with keys the rooms server never
//! holds.
//!
//! * [`sframe`]: SFrame (RFC 9605) sealing and opening of RTP payloads with the
//!   `AES_128_CTR_HMAC_SHA256_80` suite, and a replay window per key ID.
//! * [`rtp`]: SFrame around an RTP payload, the header left clear and authenticated.
//! * [`seal`]: the player's SFrame stage, [`MediaSeal`]: its own stream sealed after
//!   packetizing, each member's opened before that member's jitter buffer.
//! * [`fuzz`]: the fuzzing entry point for opening.
//! * [`keys`]: the room secret from the password (Argon2id), split by HKDF into the join
//!   proof the server checks and the media key it never sees, and per-sender SFrame keys.
//!
//! Sealing and opening allocate nothing and never block, so they run on the audio and
//! network threads; deriving keys is slow on purpose (Argon2id) and must never run there.
//! Nothing here reads a clock, a random source or a socket.

pub mod fuzz;
pub mod keys;
pub mod rtp;
pub mod seal;
pub use netjam_sframe as sframe;

pub use keys::{kid, KeyError, MediaKey, RoomKdf, RoomSecret};
pub use seal::{MediaSeal, SealStats};
pub use sframe::{Header, Opened, SframeError, SframeOpener, SframeSealer};
