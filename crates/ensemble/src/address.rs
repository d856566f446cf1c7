//! Addresses as O2 has them: the first segment names a service, so `/synth1/filter/cutoff`
//! goes to whichever member offers `synth1`; a leading `!` instead of `/` marks a literal
//! address (the receiver matches it as is, with no pattern characters). Service names are
//! plain segments: no `/`, no OSC pattern characters, no leading `_` (reserved for the
//! ensemble's own messages).
//!
//! Pure string functions; nothing here allocates except [`readdress`], which builds a
//! copy for a tap.

use netjam_osc::Message;

/// Why a service name or address is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error("service name {0:?} is not valid: use 1–64 letters, digits, '-' or '.', not starting with '_'")]
    BadService(String),
    #[error("address {0:?} does not name a service: it must look like /service/... or !service/...")]
    NoService(String),
    #[error("a member offers at most {0} services and asks for at most {0} taps")]
    TooMany(usize),
}

/// Longest service name.
pub const MAX_SERVICE_LEN: usize = 64;

/// Whether `name` may be offered as a service.
pub fn valid_service(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_SERVICE_LEN
        && !name.starts_with('_')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
}

/// Checks a service name, for callers that take names from users.
pub fn check_service(name: &str) -> Result<(), AddressError> {
    if valid_service(name) {
        Ok(())
    } else {
        Err(AddressError::BadService(name.to_string()))
    }
}

/// The service an address goes to and whether it is literal (`!`):
/// `/synth1/filter/cutoff` → `("synth1", false)`, `!synth1/gate` → `("synth1", true)`.
pub fn service_of(address: &str) -> Result<(&str, bool), AddressError> {
    let literal = match address.as_bytes().first() {
        Some(b'/') => false,
        Some(b'!') => true,
        _ => return Err(AddressError::NoService(address.to_string())),
    };
    let rest = &address[1..];
    let service = rest.split('/').next().unwrap_or("");
    if service.is_empty() {
        return Err(AddressError::NoService(address.to_string()));
    }
    Ok((service, literal))
}

/// The encoded message `m` with its service replaced by `service` (for a tap: a copy of
/// `/synth1/gate ,f 1` to `logger` is `/logger/gate ,f 1`). The literal mark is kept.
pub fn readdress(m: &Message<'_>, service: &str, out: &mut Vec<u8>) {
    let addr = m.address();
    let (old, _) = service_of(addr).unwrap_or(("", false));
    let lead = addr.get(..1).unwrap_or("/");
    let tail = addr.get(1 + old.len()..).unwrap_or("");
    out.clear();
    out.extend_from_slice(lead.as_bytes());
    out.extend_from_slice(service.as_bytes());
    out.extend_from_slice(tail.as_bytes());
    pad_nul(out);
    out.push(b',');
    out.extend_from_slice(m.type_tag_bytes());
    pad_nul(out);
    out.extend_from_slice(m.arg_bytes());
}

/// Terminates an OSC string with at least one NUL, padded to 4 bytes.
fn pad_nul(out: &mut Vec<u8>) {
    out.push(0);
    while out.len() % 4 != 0 {
        out.push(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netjam_osc::{encode_message, Arg};

    #[test]
    fn the_first_segment_is_the_service() {
        assert_eq!(service_of("/synth1/filter/cutoff"), Ok(("synth1", false)));
        assert_eq!(service_of("!synth1/gate"), Ok(("synth1", true)));
        assert_eq!(service_of("/conductor"), Ok(("conductor", false)));
        assert!(service_of("synth1/x").is_err());
        assert!(service_of("/").is_err());
        assert!(service_of("//x").is_err());
        assert!(valid_service("synth-1.a"));
        assert!(!valid_service("_clock"));
        assert!(!valid_service("a*b"));
        assert!(!valid_service(""));
    }

    #[test]
    fn a_tap_copy_keeps_the_rest_of_the_message() {
        let mut buf = [0u8; 64];
        for (addr, want) in [("/synth1/gate", "/logger/gate"), ("!synth1", "!logger")] {
            let n = encode_message(&mut buf, addr, &[Arg::Float(1.0), Arg::Str("xy")]).unwrap();
            let m = Message::decode(&buf[..n]).unwrap();
            let mut out = Vec::new();
            readdress(&m, "logger", &mut out);
            let c = Message::decode(&out).unwrap();
            assert_eq!(c.address(), want);
            assert_eq!(c.args().collect::<Vec<_>>(), m.args().collect::<Vec<_>>());
        }
    }
}
