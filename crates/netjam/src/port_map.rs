//! Asking the home router to forward a UDP port to this player, for `jam --port-map`: by
//! UPnP-IGD (the `igd-next` crate), PCP or NAT-PMP (the `crab_nat` crate, PCP first and
//! NAT-PMP where PCP gets no mapping). A router that gives every
//! destination another public port (a port-randomising NAT) defeats punching; a port it
//! forwards on request does not, so the mapped port is offered to the other members as one
//! more candidate address, and their authenticated probes find out whether it works.
//!
//! Bounded and optional: [`map_udp`] gives up after the time it is given whatever the router
//! does (each request runs on a thread of its own, left behind if it hangs; a mapping made
//! after the caller gave up is removed at once), and a player without a mapping simply goes
//! on without one. A [`PortMapping`] is renewed while it lives and removed from the router
//! when it is dropped, so an error return takes it away as a clean leave does.
//!
//! Never on the audio or the send path; nothing here touches the stream's socket.

use std::fs;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::num::NonZeroU16;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use igd_next::{Gateway, PortMappingProtocol, SearchOptions};

/// How a mapping is named in the router's table (UPnP-IGD only; PCP and NAT-PMP have none).
const DESCRIPTION: &str = "netjam";
/// Lease asked for; the mapping is renewed at half of what the router grants.
const LEASE_S: u32 = 3600;
/// How long dropping a mapping waits for the router to confirm its removal.
pub const REMOVE_WAIT: Duration = Duration::from_secs(1);
/// PCP / NAT-PMP: the first request's wait for an answer, doubled on each retry.
const PMP_FIRST_WAIT: Duration = Duration::from_millis(150);

/// Which protocol the router forwarded the port by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    UpnpIgd,
    Pcp,
    NatPmp,
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Protocol::UpnpIgd => "UPnP-IGD",
            Protocol::Pcp => "PCP",
            Protocol::NatPmp => "NAT-PMP",
        })
    }
}

/// A UDP port the router forwards to this player; renewed until dropped, then removed.
#[derive(Debug)]
pub struct PortMapping {
    /// How the router was asked.
    pub protocol: Protocol,
    /// The router's public port that reaches the player's socket.
    pub external_port: u16,
    /// The public address the router says it has (a router behind another NAT, or a
    /// lab's, may report a private one).
    pub external_ip: Option<IpAddr>,
    /// The router that answered.
    pub gateway: IpAddr,
    keeper: Option<Keeper>,
}

/// The thread that renews a mapping and, told to stop, removes it and says whether the
/// router confirmed.
#[derive(Debug)]
struct Keeper {
    stop: mpsc::Sender<()>,
    removed: mpsc::Receiver<bool>,
}

impl Keeper {
    /// Starts a keeper: `renew` every `every`, and `remove` once told to stop (or once the
    /// mapping's owner is gone).
    fn spawn(
        every: Duration,
        mut renew: impl FnMut() -> Result<(), String> + Send + 'static,
        remove: impl FnOnce() -> Result<(), String> + Send + 'static,
    ) -> anyhow::Result<Self> {
        let (stop, stop_rx) = mpsc::channel();
        let (removed_tx, removed) = mpsc::channel();
        std::thread::Builder::new()
            .name("netjam-portmap".into())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = stop_rx.recv_timeout(every) {
                    if let Err(e) = renew() {
                        tracing::warn!("renewing the router's port mapping: {e}");
                    }
                }
                let done = remove();
                if let Err(e) = &done {
                    tracing::debug!("removing the router's port mapping: {e}");
                }
                let _ = removed_tx.send(done.is_ok());
            })
            .context("starting the port mapping's thread")?;
        Ok(Self { stop, removed })
    }
}

impl PortMapping {
    /// The candidate addresses to declare to the other members: the mapped port at the
    /// address the rooms server sees this player at (written with an unspecified IP,
    /// which the other side fills in from what the server tells it), and at the address
    /// the router reports if that is another one.
    pub fn candidates(&self) -> Vec<SocketAddr> {
        let mut c = vec![SocketAddr::new(
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            self.external_port,
        )];
        if let Some(ip) = self
            .external_ip
            .filter(|ip| !ip.is_unspecified() && !ip.is_loopback())
        {
            c.push(SocketAddr::new(ip, self.external_port));
        }
        c
    }

    /// Removes the mapping from the router, waiting at most `wait`; whether the router
    /// confirmed it in time.
    pub fn remove(mut self, wait: Duration) -> bool {
        self.remove_within(wait)
    }

    fn remove_within(&mut self, wait: Duration) -> bool {
        let Some(k) = self.keeper.take() else {
            return true;
        };
        let _ = k.stop.send(());
        match k.removed.recv_timeout(wait) {
            Ok(confirmed) => confirmed,
            Err(_) => {
                tracing::debug!(
                    "the router did not confirm removing port mapping {} within {wait:?}",
                    self.external_port
                );
                false
            }
        }
    }
}

impl Drop for PortMapping {
    fn drop(&mut self) {
        self.remove_within(REMOVE_WAIT);
    }
}

/// What the two ways of asking the router report to [`map_udp`].
enum Answer {
    /// A UPnP-IGD router answered the search (no port is mapped yet).
    IgdFound(anyhow::Result<Gateway>),
    /// PCP or NAT-PMP mapped a port, or could not.
    Pmp(anyhow::Result<PortMapping>),
    /// UPnP-IGD mapped a port, or could not.
    IgdMapped(anyhow::Result<PortMapping>),
}

/// Asks the router on `local`'s network to forward a UDP port to `local` (the player's own
/// address and the stream's port), the same port outside if free, any other if not: by
/// PCP, then NAT-PMP, to the default gateway (one exchange with a router that speaks them),
/// and, where those fail, by UPnP-IGD, whose multicast search for the router runs meanwhile
/// so that it costs no extra time. Only one way ever maps a port: two mappings of the same
/// port would be one rule in the router, and removing the spare would remove both. Gives
/// up after `wait`.
pub fn map_udp(local: SocketAddr, wait: Duration) -> anyhow::Result<PortMapping> {
    let deadline = Instant::now() + wait;
    let (tx, rx) = mpsc::channel::<Answer>();
    let search_tx = tx.clone();
    std::thread::Builder::new()
        .name("netjam-upnp".into())
        .spawn(move || {
            let options = SearchOptions {
                bind_addr: SocketAddr::new(local.ip(), 0),
                timeout: Some(wait),
                single_search_timeout: Some(wait),
                ..SearchOptions::default()
            };
            let found = igd_next::search_gateway(options).context("no UPnP-IGD router answered");
            let _ = search_tx.send(Answer::IgdFound(found));
        })
        .context("starting the UPnP thread")?;
    let gateway = default_gateway(local.ip());
    let pmp_tx = tx.clone();
    std::thread::Builder::new()
        .name("netjam-pcp".into())
        .spawn(move || {
            let got = match gateway {
                Some(gw) => ask_pmp(gw, local, wait),
                None => Err(anyhow!("no default gateway known to ask")),
            };
            // Too late (the caller gave up): dropped here, so removed.
            let _ = pmp_tx.send(Answer::Pmp(got));
        })
        .context("starting the PCP thread")?;
    let mut pmp_failed: Option<anyhow::Error> = None;
    let mut igd: Option<anyhow::Result<Gateway>> = None;
    let mut igd_asked = false;
    loop {
        if let (Some(_), Some(Ok(gw))) = (&pmp_failed, &igd) {
            if !igd_asked {
                igd_asked = true;
                let (gw, tx) = (gw.clone(), tx.clone());
                std::thread::Builder::new()
                    .name("netjam-upnp".into())
                    .spawn(move || {
                        let _ = tx.send(Answer::IgdMapped(map_igd(gw, local)));
                    })
                    .context("starting the UPnP thread")?;
            }
        }
        if let (Some(pmp), Some(Err(igd))) = (&pmp_failed, &igd) {
            bail!("no router forwarded a port (PCP/NAT-PMP: {pmp:#}; {igd:#})");
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Answer::Pmp(Ok(m)) | Answer::IgdMapped(Ok(m))) => return Ok(m),
            Ok(Answer::Pmp(Err(e))) => pmp_failed = Some(e),
            Ok(Answer::IgdFound(found)) => igd = Some(found),
            Ok(Answer::IgdMapped(Err(e))) => return Err(e),
            Err(_) => bail!(
                "no router forwarded a port within {:.1} s{}",
                wait.as_secs_f64(),
                pmp_failed.map_or(String::new(), |e| format!(" (PCP/NAT-PMP: {e:#})"))
            ),
        }
    }
}

fn map_igd(gw: Gateway, local: SocketAddr) -> anyhow::Result<PortMapping> {
    let external_ip = gw.get_external_ip().ok();
    let port = match gw.add_port(
        PortMappingProtocol::UDP,
        local.port(),
        local,
        LEASE_S,
        DESCRIPTION,
    ) {
        Ok(()) => local.port(),
        Err(e) => {
            tracing::debug!("the router did not map port {} as is: {e}", local.port());
            gw.add_any_port(PortMappingProtocol::UDP, local, LEASE_S, DESCRIPTION)
                .with_context(|| format!("the router at {} refused to forward a UDP port", gw.addr))?
        }
    };
    let gateway = gw.addr.ip();
    let keeper = keep_igd(gw.clone(), local, port).inspect_err(|_| {
        // Nothing would renew or remove it: take it back now.
        let _ = gw.remove_port(PortMappingProtocol::UDP, port);
    })?;
    Ok(PortMapping {
        protocol: Protocol::UpnpIgd,
        external_port: port,
        external_ip,
        gateway,
        keeper: Some(keeper),
    })
}

fn keep_igd(gw: Gateway, local: SocketAddr, port: u16) -> anyhow::Result<Keeper> {
    let renew_gw = gw.clone();
    Keeper::spawn(
        Duration::from_secs(u64::from(LEASE_S / 2)),
        move || {
            renew_gw
                .add_port(PortMappingProtocol::UDP, port, local, LEASE_S, DESCRIPTION)
                .map_err(|e| e.to_string())
        },
        move || {
            gw.remove_port(PortMappingProtocol::UDP, port)
                .map_err(|e| e.to_string())
        },
    )
}

/// PCP, then NAT-PMP where PCP got no mapping, through a runtime of this thread's own
/// (crab_nat is asynchronous).
fn ask_pmp(gateway: IpAddr, local: SocketAddr, wait: Duration) -> anyhow::Result<PortMapping> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the PCP client's runtime")?;
    let internal = NonZeroU16::new(local.port()).context("the stream has no port to map")?;
    let timeouts = crab_nat::TimeoutConfig {
        initial_timeout: PMP_FIRST_WAIT,
        // 150 + 300 + 600 ms, within the usual 2 s cap.
        max_retries: 2,
        max_retry_timeout: Some(wait),
    };
    let options = crab_nat::PortMappingOptions {
        external_port: Some(internal),
        lifetime_seconds: Some(LEASE_S),
        timeout_config: Some(timeouts),
    };
    let gw = crab_nat::GatewayAddress::from(gateway);
    let udp = crab_nat::InternetProtocol::Udp;
    let pcp = rt.block_on(crab_nat::pcp::port_mapping(
        crab_nat::pcp::BaseMapRequest::new(gw, local.ip(), udp, internal),
        None,
        None,
        options,
    ));
    let mapping = match pcp {
        Ok(m) => m,
        // Not only where the router answers that it speaks NAT-PMP alone (one round trip):
        // one that ignores PCP gets asked by NAT-PMP too, in what is left of the wait.
        Err(pcp) => rt
            .block_on(crab_nat::natpmp::port_mapping(gw, udp, internal, options))
            .map_err(|e| anyhow!("the router at {gateway} did not map a port (PCP: {pcp}; NAT-PMP: {e})"))?,
    };
    let (protocol, external_ip) = match mapping.mapping_type() {
        crab_nat::PortMappingType::Pcp { external_ip, .. } => (Protocol::Pcp, Some(external_ip)),
        crab_nat::PortMappingType::NatPmp => (
            Protocol::NatPmp,
            rt.block_on(crab_nat::natpmp::external_address(gw, Some(timeouts)))
                .ok()
                .map(IpAddr::V4),
        ),
    };
    let external_port = mapping.external_port().get();
    let every = Duration::from_secs(u64::from(mapping.lifetime().max(2) / 2));
    let mut renewing = mapping.clone();
    let keeper = Keeper::spawn(
        every,
        move || rt.block_on(renewing.renew()).map_err(|e| e.to_string()),
        move || {
            // The keeper's runtime moved into `renew`; removing takes one of its own.
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(mapping.try_drop()).map_err(|(e, _)| e.to_string())
        },
    )?;
    Ok(PortMapping {
        protocol,
        external_port,
        external_ip,
        gateway,
        keeper: Some(keeper),
    })
}

/// The IPv4 default gateway: from the kernel's routing table where there is one to read
/// (Linux), else the address ending in .1 on `host`'s /24, which most home routers have.
fn default_gateway(host: IpAddr) -> Option<IpAddr> {
    if let Some(gw) = fs::read_to_string("/proc/net/route")
        .ok()
        .and_then(|t| gateway_in_route_table(&t))
    {
        return Some(IpAddr::V4(gw));
    }
    match host {
        IpAddr::V4(h) if !h.is_loopback() && !h.is_unspecified() => {
            let [a, b, c, _] = h.octets();
            Some(IpAddr::V4(Ipv4Addr::new(a, b, c, 1)))
        }
        _ => None,
    }
}

/// The gateway of the default route in `/proc/net/route`'s text (addresses in hex, in the
/// machine's byte order, which is little-endian on every platform that file exists on
/// that netjam builds for).
fn gateway_in_route_table(table: &str) -> Option<Ipv4Addr> {
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (dest, gw, flags) = (f.get(1)?, f.get(2)?, f.get(3)?);
        let up_gateway = u32::from_str_radix(flags, 16).ok()? & 0x3 == 0x3;
        if *dest != "00000000" || !up_gateway {
            return None;
        }
        let gw = u32::from_str_radix(gw, 16).ok()?;
        Some(Ipv4Addr::from(gw.to_le_bytes()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_route_gives_the_gateway() {
        let table = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                     eth0\t0000620A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
                     eth0\t00000000\t0100620A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n";
        assert_eq!(gateway_in_route_table(table), Some(Ipv4Addr::new(10, 98, 0, 1)));
    }

    #[test]
    fn no_default_route_no_gateway() {
        let table = "Iface\tDestination\tGateway \tFlags\n\
                     eth0\t0000620A\t00000000\t0001\n\
                     eth1\t00000000\t0100620A\t0001\n";
        assert_eq!(gateway_in_route_table(table), None);
        assert_eq!(gateway_in_route_table("garbage\n00000000"), None);
    }

    #[test]
    fn protocols_are_named_as_their_standards_name_them() {
        assert_eq!(Protocol::UpnpIgd.to_string(), "UPnP-IGD");
        assert_eq!(Protocol::Pcp.to_string(), "PCP");
        assert_eq!(Protocol::NatPmp.to_string(), "NAT-PMP");
    }
}
