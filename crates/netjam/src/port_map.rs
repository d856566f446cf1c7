//! Asking the home router to forward a UDP port to this player (UPnP-IGD, through the
//! `igd-next` crate), for `jam --upnp`. A router that gives every destination another
//! public port (a port-randomising NAT) defeats punching; a port it forwards on request
//! does not, so the mapped port is offered to the other members as one more candidate
//! address, and their authenticated probes find out whether it works.
//!
//! Bounded and optional: [`map_udp`] gives up after the time it is given, whatever the
//! router does (the search and the HTTP requests run on a thread of their own, which is
//! left behind if it hangs), and a player without a mapping simply goes on without one.
//! Never on the audio or the send path; nothing here touches the stream's socket.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::{anyhow, Context};
use igd_next::{Gateway, PortMappingProtocol, SearchOptions};

/// How a mapping is named in the router's table.
const DESCRIPTION: &str = "netjam";
/// Lease asked for; the mapping is renewed at half of it while the player plays.
const LEASE_S: u32 = 3600;

/// A UDP port the router forwards to this player; renewed until dropped, then removed.
#[derive(Debug)]
pub struct PortMapping {
    /// The router's public port that reaches the player's socket.
    pub external_port: u16,
    /// The public address the router says it has (a router behind another NAT, or a
    /// lab's, may report a private one).
    pub external_ip: Option<IpAddr>,
    /// The router that answered.
    pub gateway: SocketAddr,
    stop: Arc<AtomicBool>,
    gw: Gateway,
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

    /// Removes the mapping from the router, waiting at most `wait`.
    pub fn remove(self, wait: Duration) {
        self.stop.store(true, Ordering::Relaxed);
        let (gw, port) = (self.gw.clone(), self.external_port);
        let (tx, rx) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("netjam-upnp".into())
            .spawn(move || {
                let _ = tx.send(gw.remove_port(PortMappingProtocol::UDP, port));
            });
        if spawned.is_ok() {
            match rx.recv_timeout(wait) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!("removing the router's port mapping {port}: {e}"),
                Err(_) => tracing::debug!("the router did not confirm removing port mapping {port}"),
            }
        }
    }
}

impl Drop for PortMapping {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Asks the router on `local`'s network (by UPnP-IGD's multicast search) to forward a UDP
/// port to `local` (the player's own address and the stream's port): the same port
/// outside if free, any other if not. Gives up after `wait`.
pub fn map_udp(local: SocketAddr, wait: Duration) -> anyhow::Result<PortMapping> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("netjam-upnp".into())
        .spawn(move || {
            let _ = tx.send(ask(local, wait));
        })
        .context("starting the UPnP thread")?;
    let (gw, external_port, external_ip) = rx
        .recv_timeout(wait)
        .map_err(|_| anyhow!("no router answered UPnP within {:.1} s", wait.as_secs_f64()))??;
    let stop = Arc::new(AtomicBool::new(false));
    let mapping = PortMapping {
        external_port,
        external_ip,
        gateway: gw.addr,
        stop: stop.clone(),
        gw: gw.clone(),
    };
    // Renew the lease while the player plays.
    let renew = std::thread::Builder::new()
        .name("netjam-upnp-renew".into())
        .spawn(move || {
            let every = Duration::from_secs(u64::from(LEASE_S / 2));
            let tick = Duration::from_millis(500);
            let mut waited = Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(tick);
                waited += tick;
                if waited >= every {
                    waited = Duration::ZERO;
                    if let Err(e) = gw.add_port(
                        PortMappingProtocol::UDP,
                        external_port,
                        local,
                        LEASE_S,
                        DESCRIPTION,
                    ) {
                        tracing::warn!("renewing the router's port mapping {external_port}: {e}");
                    }
                }
            }
        });
    if let Err(e) = renew {
        tracing::warn!("the router's port mapping will not be renewed: {e}");
    }
    Ok(mapping)
}

fn ask(local: SocketAddr, wait: Duration) -> anyhow::Result<(Gateway, u16, Option<IpAddr>)> {
    let options = SearchOptions {
        bind_addr: SocketAddr::new(local.ip(), 0),
        timeout: Some(wait),
        single_search_timeout: Some(wait),
        ..SearchOptions::default()
    };
    let gw = igd_next::search_gateway(options).context("no UPnP router found")?;
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
    Ok((gw, port, external_ip))
}
