//! A NAT lab: Linux network namespaces joined by veth pairs, routers doing what home
//! routers do with nftables, for tests that run real netjam processes behind them.
//!
//! ```text
//!   home0 (10.98.0.2) -- router0 (wan 10.99.0.10) --+
//!   home1 (10.98.1.2) -- router1 (wan 10.99.0.11) --+-- br0 in "public": 10.99.0.1 (rooms server)
//!   home2 (10.98.2.2) -- router2 (wan 10.99.0.12) --+                    10.99.0.2 (another STUN server)
//! ```
//!
//! Router kinds: [`RouterKind::Cone`] (`masquerade`: one public port per socket whatever
//! the destination), [`RouterKind::Symmetric`] (`masquerade random`: a port per
//! destination) and [`RouterKind::Firewall`] (no translation — the home's address is routed
//! — but a stateful filter that drops everything inbound the home did not ask for). The NAT
//! routers also drop unsolicited datagrams addressed to themselves, as home routers do.
//!
//! Namespace names carry the test process id and a counter, so runs never collide; the
//! [`NatLab`] deletes every namespace it made when dropped, on success, failure or panic.
//! Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN); [`NatLab::build`] returns why not
//! otherwise, and the caller skips.

use std::net::Ipv4Addr;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// Ports a [`RouterKind::Sequential`] router hands out before it starts over.
pub const SEQUENTIAL_PORTS: u16 = 64;

/// What a home's router does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouterKind {
    /// NAT with endpoint-independent mapping (nftables `masquerade`).
    Cone,
    /// NAT that picks a random port per destination (`masquerade random`).
    Symmetric,
    /// No NAT; drops inbound packets that do not belong to a flow the home started.
    Firewall,
    /// NAT that gives each new UDP flow the next public port from 20000 on (nftables
    /// `snat to WAN : numgen inc`, starting over after [`SEQUENTIAL_PORTS`] flows), as
    /// routers with a sequential port allocator do.
    Sequential,
}

impl RouterKind {
    pub fn label(self) -> &'static str {
        match self {
            RouterKind::Cone => "cone",
            RouterKind::Symmetric => "symmetric",
            RouterKind::Firewall => "firewall",
            RouterKind::Sequential => "sequential",
        }
    }
}

/// One home behind its router.
#[derive(Debug, Clone)]
pub struct Home {
    pub kind: RouterKind,
    /// The home's namespace (where the player runs).
    pub ns: String,
    /// The router's namespace.
    pub router: String,
    /// The home's own address.
    pub ip: Ipv4Addr,
    /// The router's public (wan) address.
    pub wan: Ipv4Addr,
}

impl Home {
    /// The address the internet sees this home's sockets at: the router's for a NAT,
    /// the home's own behind a plain firewall.
    pub fn public_ip(&self) -> Ipv4Addr {
        match self.kind {
            RouterKind::Firewall => self.ip,
            _ => self.wan,
        }
    }
}

/// Why there is no lab.
#[derive(Debug)]
pub enum LabError {
    /// This process may not make network namespaces (not root, no CAP_NET_ADMIN /
    /// CAP_SYS_ADMIN, a container without them): tests skip.
    NotAllowed(String),
    /// Namespaces could be made, but building the topology failed: a bug or a tool missing.
    Failed(String),
}

/// The lab; its namespaces go when it is dropped.
#[derive(Debug)]
pub struct NatLab {
    /// The public namespace (servers run here, and players with no router).
    pub public: String,
    /// The rooms server's address in it.
    pub server_ip: Ipv4Addr,
    /// A second public address, for another STUN server.
    pub stun_ip: Ipv4Addr,
    pub homes: Vec<Home>,
    made: Vec<String>,
}

static LABS: AtomicU32 = AtomicU32::new(0);

fn ip_cmd() -> Command {
    let mut c = Command::new("ip");
    c.stdin(Stdio::null());
    c
}

fn output(cmd: &mut Command) -> Result<Output, String> {
    let what = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Runs `ip ARGS`.
fn ip(args: &[&str]) -> Result<(), String> {
    output(ip_cmd().args(args)).map(drop)
}

/// Runs `PROGRAM ARGS` inside namespace `ns`.
pub fn in_ns(ns: &str, program: &str, args: &[&str]) -> Result<String, String> {
    output(ip_cmd().args(["netns", "exec", ns, program]).args(args))
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Loads nftables rules (one statement a line, as `nft -f` reads them) inside `ns`.
fn nft(ns: &str, rules: &str) -> Result<(), String> {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("nft in {ns}: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(rules.as_bytes())
            .map_err(|e| format!("nft in {ns}: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("nft in {ns}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft in {ns} refused\n{rules}\n{}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl NatLab {
    /// The lab, or `None` (with the reason printed) where namespaces cannot be made: the
    /// test then skips. A lab that could be made and failed is a failure.
    pub fn build_or_skip(kinds: &[RouterKind]) -> Option<Self> {
        super::require("nft", "nftables");
        match Self::build(kinds) {
            Ok(lab) => Some(lab),
            Err(LabError::NotAllowed(why)) => {
                eprintln!(
                    "SKIPPED: this process cannot create network namespaces ({why}); the NAT lab needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN)"
                );
                None
            }
            Err(LabError::Failed(why)) => panic!("building the NAT lab failed: {why}"),
        }
    }

    /// Builds the public network and one home per entry of `kinds`, or says why it cannot
    /// (not root, no network namespaces, a tool missing).
    pub fn build(kinds: &[RouterKind]) -> Result<Self, LabError> {
        let tag = format!(
            "nj{}x{}",
            std::process::id(),
            LABS.fetch_add(1, Ordering::Relaxed)
        );
        let mut lab = NatLab {
            public: format!("{tag}p"),
            server_ip: Ipv4Addr::new(10, 99, 0, 1),
            stun_ip: Ipv4Addr::new(10, 99, 0, 2),
            homes: Vec::new(),
            made: Vec::new(),
        };
        lab.add_ns(&lab.public.clone()).map_err(LabError::NotAllowed)?;
        lab.topology(kinds).map_err(LabError::Failed)?;
        Ok(lab)
    }

    fn topology(&mut self, kinds: &[RouterKind]) -> Result<(), String> {
        let tag = self.public.trim_end_matches('p').to_string();
        let p = self.public.clone();
        ip(&["-n", &p, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &p, "addr", "add", "10.99.0.1/24", "dev", "br0"])?;
        ip(&["-n", &p, "addr", "add", "10.99.0.2/24", "dev", "br0"])?;
        ip(&["-n", &p, "link", "set", "br0", "up"])?;
        in_ns(&p, "sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
        for (i, &kind) in kinds.iter().enumerate() {
            let home = Home {
                kind,
                ns: format!("{tag}h{i}"),
                router: format!("{tag}r{i}"),
                ip: Ipv4Addr::new(10, 98, i as u8, 2),
                wan: Ipv4Addr::new(10, 99, 0, 10 + i as u8),
            };
            self.add_home(&home)?;
            self.homes.push(home);
        }
        Ok(())
    }

    fn add_ns(&mut self, ns: &str) -> Result<(), String> {
        ip(&["netns", "add", ns])?;
        self.made.push(ns.to_string());
        ip(&["-n", ns, "link", "set", "lo", "up"])
    }

    fn add_home(&mut self, h: &Home) -> Result<(), String> {
        let (p, r, n) = (self.public.clone(), h.router.clone(), h.ns.clone());
        self.add_ns(&r)?;
        self.add_ns(&n)?;
        let port = format!("to{}", h.wan.octets()[3]);
        // router wan <-> a port on the public bridge
        ip(&[
            "-n", &r, "link", "add", "wan", "type", "veth", "peer", "name", &port, "netns", &p,
        ])?;
        ip(&["-n", &p, "link", "set", &port, "master", "br0", "up"])?;
        ip(&["-n", &r, "addr", "add", &format!("{}/24", h.wan), "dev", "wan"])?;
        ip(&["-n", &r, "link", "set", "wan", "up"])?;
        ip(&["-n", &r, "route", "add", "default", "via", "10.99.0.1"])?;
        // home eth0 <-> router lan
        let lan_net = format!("10.98.{}", h.ip.octets()[2]);
        ip(&[
            "-n", &n, "link", "add", "eth0", "type", "veth", "peer", "name", "lan", "netns", &r,
        ])?;
        ip(&["-n", &r, "addr", "add", &format!("{lan_net}.1/24"), "dev", "lan"])?;
        ip(&["-n", &r, "link", "set", "lan", "up"])?;
        ip(&["-n", &n, "addr", "add", &format!("{}/24", h.ip), "dev", "eth0"])?;
        ip(&["-n", &n, "link", "set", "eth0", "up"])?;
        ip(&[
            "-n",
            &n,
            "route",
            "add",
            "default",
            "via",
            &format!("{lan_net}.1"),
        ])?;
        in_ns(&r, "sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
        match h.kind {
            RouterKind::Cone | RouterKind::Symmetric | RouterKind::Sequential => {
                // A map, not `numgen ... offset 20000`: the counter is in host byte
                // order and a port in network order, while a map's ports are written right.
                let ports: Vec<String> = (0..SEQUENTIAL_PORTS)
                    .map(|i| format!("{i} : {}", 20000 + i))
                    .collect();
                let sequential = format!(
                    "meta l4proto udp snat to {} : numgen inc mod {SEQUENTIAL_PORTS} map {{ {} }}",
                    h.wan,
                    ports.join(", ")
                );
                let how = match h.kind {
                    RouterKind::Cone => "masquerade",
                    RouterKind::Symmetric => "masquerade random",
                    _ => &sequential,
                };
                nft(&r, &nat_rules(how))?;
                // Like every home router, drop what comes in on the wan for the router
                // itself unless it answers something: a router without this rule confirms
                // a connection-tracking entry for each unsolicited datagram (answering it
                // with ICMP), and that stale entry makes the router map its own home's
                // later flow to the same peer to another port.
                nft(&r, WAN_INPUT_RULES)?;
            }
            RouterKind::Firewall => {
                // The home's address is routed to it through its router.
                ip(&[
                    "-n",
                    &p,
                    "route",
                    "add",
                    &format!("{lan_net}.0/24"),
                    "via",
                    &h.wan.to_string(),
                ])?;
                nft(
                    &r,
                    "table inet fw {\n chain inbound {\n  type filter hook forward priority filter; policy accept;\n  \
                     iifname \"wan\" ct state established,related accept\n  iifname \"wan\" counter drop\n }\n}\n",
                )?;
            }
        }
        Ok(())
    }

    /// Gives the NAT router of `home` a new mapping for every flow: new rules whose ports
    /// (20000–20999) lie outside the ephemeral range its first mappings came from, and an
    /// emptied connection-tracking table, as a router that rebooted or a mobile network
    /// that moved the player would.
    pub fn remap(&self, home: &Home) -> Result<(), String> {
        nft(
            &home.router,
            "flush chain ip nat post\n\
             add rule ip nat post oifname \"wan\" meta l4proto udp masquerade to :20000-20999\n\
             add rule ip nat post oifname \"wan\" masquerade\n",
        )?;
        in_ns(&home.router, "conntrack", &["-F"]).map(drop)
    }

    /// Waits (up to `timeout`) until the router of `home` has a UDP mapping for a flow to
    /// `server`, and returns its public port.
    pub fn wait_mapping(&self, home: &Home, server: Ipv4Addr, timeout: std::time::Duration) -> u16 {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            // "udp 17 29 src=10.98.0.2 dst=10.99.0.1 sport=5 dport=4464 ... src=10.99.0.1 dst=10.99.0.10 sport=4464 dport=20007 ..."
            let table = in_ns(&home.router, "conntrack", &["-L", "-p", "udp"]).unwrap_or_default();
            let port = table.lines().find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let dst = format!("dst={server}");
                let orig = f.iter().position(|w| *w == dst)?;
                // The reply direction's destination port is the public one.
                let reply_dport = f[orig + 1..].iter().filter(|w| w.starts_with("dport=")).nth(1)?;
                reply_dport.trim_start_matches("dport=").parse().ok()
            });
            if let Some(p) = port {
                return p;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no mapping to {server} in {}'s connection table: {table}",
                home.router
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Cuts the direct way between two homes: `a`'s router drops everything to or from
    /// `b`'s public address (the rooms server stays reachable), as a link that failed.
    pub fn cut(&self, a: &Home, b: &Home) -> Result<(), String> {
        let other = b.public_ip();
        nft(
            &a.router,
            &format!(
                "table inet cut {{\n chain cutoff {{\n  type filter hook forward priority filter - 10; policy accept;\n  \
                 ip daddr {other} counter drop\n  ip saddr {other} counter drop\n }}\n}}\n"
            ),
        )
    }

    /// Undoes [`NatLab::cut`] on `a`'s router: the way between the homes is open again.
    pub fn uncut(&self, a: &Home) -> Result<(), String> {
        in_ns(&a.router, "nft", &["delete", "table", "inet", "cut"]).map(drop)
    }

    /// Sends the direct way between two homes through a namespace of its own on the public
    /// network, at `via`, where the caller runs `netjam impair --listen VIA --forward
    /// B_PUBLIC` (returns that namespace), while their way to the servers stays as it was.
    ///
    /// Each router rewrites the destination of its home's datagrams to the other's public
    /// `ip:port` into `via`. The emulator takes `a`'s datagrams on `via` and sends them on
    /// from another socket; that namespace rewrites their source into `via` as well, so
    /// each router's connection tracking maps everything that comes back from `via` to the
    /// other home's public address and neither player can tell. `b`'s datagrams reach the
    /// emulator only as answers to its own (those that come first are dropped: `b` keeps
    /// punching), so it always takes `a` for its client. The homes' sockets must have fixed
    /// ports (`a_port`, `b_port`) that their cone routers keep.
    pub fn detour(
        &mut self,
        a: &Home,
        a_port: u16,
        b: &Home,
        b_port: u16,
        via: std::net::SocketAddrV4,
    ) -> Result<String, String> {
        let d = format!("{}d", self.public.trim_end_matches('p'));
        let p = self.public.clone();
        self.add_ns(&d)?;
        ip(&[
            "-n", &d, "link", "add", "eth0", "type", "veth", "peer", "name", "todetour", "netns", &p,
        ])?;
        ip(&["-n", &p, "link", "set", "todetour", "master", "br0", "up"])?;
        ip(&[
            "-n",
            &d,
            "addr",
            "add",
            &format!("{}/24", via.ip()),
            "dev",
            "eth0",
        ])?;
        ip(&["-n", &d, "link", "set", "eth0", "up"])?;
        let b_public = b.public_ip();
        nft(
            &d,
            &format!(
                "table ip detour {{\n chain pre {{\n  type filter hook prerouting priority -150; policy accept;\n  \
                 ip saddr {b_public} udp sport {b_port} ct state new drop\n }}\n \
                 chain post {{\n  type nat hook postrouting priority srcnat; policy accept;\n  \
                 ip daddr {b_public} udp dport {b_port} snat to {via}\n }}\n}}\n"
            ),
        )?;
        for (from, to, port) in [(a, b, b_port), (b, a, a_port)] {
            nft(
                &from.router,
                &format!(
                    "table ip detour {{\n chain pre {{\n  type nat hook prerouting priority dstnat;\n  \
                     iifname \"lan\" ip daddr {} udp dport {port} dnat to {via}\n }}\n}}\n",
                    to.public_ip()
                ),
            )?;
        }
        Ok(d)
    }

    /// Readies `home`'s NAT router to forward ports on request by the protocols `speaks`
    /// and returns the command that runs the daemon, miniupnpd, on its lan side (the caller
    /// spawns it and kills it when done; it prints [`Mapper::ready_line`] on stderr when
    /// ready). Its files go into `dir`.
    ///
    /// miniupnpd will not map ports on a router whose wan address is private, and every
    /// address in this lab is: the router's wan gets a public-looking address first
    /// (11.99.0.x, which exists only inside the lab), which miniupnpd reports as the
    /// router's, while the router goes on translating to its 10.99.0.x address (the one on
    /// the public network's subnet). Players take the mapped port at the address the rooms
    /// server sees them at.
    pub fn upnp_gateway(
        &self,
        home: &Home,
        dir: &std::path::Path,
        speaks: Mapper,
    ) -> Result<Command, String> {
        let r = &home.router;
        let [_, _, _, last] = home.wan.octets();
        ip(&["-n", r, "addr", "flush", "dev", "wan"])?;
        ip(&[
            "-n",
            r,
            "addr",
            "add",
            &format!("11.99.0.{last}/32"),
            "dev",
            "wan",
        ])?;
        ip(&["-n", r, "addr", "add", &format!("{}/24", home.wan), "dev", "wan"])?;
        ip(&["-n", r, "route", "replace", "default", "via", "10.99.0.1"])?;
        nft(
            r,
            "table inet upnp {\n chain forward {\n  type filter hook forward priority filter; policy accept;\n  jump upnp_forward\n }\n \
             chain upnp_forward {\n }\n chain prerouting {\n  type nat hook prerouting priority dstnat; policy accept;\n  jump upnp_dnat\n }\n \
             chain postrouting {\n  type nat hook postrouting priority srcnat; policy accept;\n  jump upnp_snat\n }\n \
             chain upnp_dnat {\n }\n chain upnp_snat {\n }\n}\n",
        )?;
        if speaks == Mapper::NatPmp {
            // The first byte of the UDP payload is the version: 0 NAT-PMP, 2 PCP.
            nft(
                r,
                "table inet nopcp {\n chain input {\n  type filter hook input priority filter - 10; policy accept;\n  \
                 iifname \"lan\" udp dport 5351 @th,64,8 2 counter drop\n }\n}\n",
            )?;
        }
        let lan = format!("10.98.{}.0/24", home.ip.octets()[2]);
        let conf = dir.join(format!("miniupnpd-{r}.conf"));
        std::fs::write(
            &conf,
            format!(
                "ext_ifname=wan\nlistening_ip=lan\nhttp_port=0\nenable_upnp={}\nenable_natpmp={}\nsecure_mode=yes\n\
                 uuid=3d3cec3a-8cf0-11e0-98ee-0000000000{last:02x}\nlease_file={}\n\
                 upnp_table_name=upnp\nupnp_nat_table_name=upnp\nupnp_forward_chain=upnp_forward\n\
                 upnp_nat_chain=upnp_dnat\nupnp_nat_postrouting_chain=upnp_snat\n\
                 allow 1024-65535 {lan} 1024-65535\ndeny 0-65535 0.0.0.0/0 0-65535\n",
                yes(speaks == Mapper::Upnp),
                yes(speaks != Mapper::Upnp),
                dir.join(format!("miniupnpd-{r}.leases")).display()
            ),
        )
        .map_err(|e| format!("writing {}: {e}", conf.display()))?;
        let mut c = self.command(r, "miniupnpd");
        c.arg("-f")
            .arg(&conf)
            .arg("-d")
            .arg("-P")
            .arg(dir.join(format!("miniupnpd-{r}.pid")))
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        Ok(c)
    }

    /// Packets the firewall router of `home` dropped as unsolicited.
    pub fn firewall_drops(&self, home: &Home) -> Option<u64> {
        let rules = in_ns(&home.router, "nft", &["list", "table", "inet", "fw"]).ok()?;
        rules
            .split("counter packets ")
            .nth(1)?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }

    /// `PROGRAM` to run inside namespace `ns` (the caller adds arguments).
    pub fn command(&self, ns: &str, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, program]);
        c
    }
}

/// Which protocols a router's miniupnpd answers ([`NatLab::upnp_gateway`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapper {
    /// UPnP-IGD only.
    Upnp,
    /// PCP and NAT-PMP (one switch in miniupnpd), no UPnP-IGD.
    PcpNatPmp,
    /// NAT-PMP only: [`Mapper::PcpNatPmp`] behind a rule that drops PCP requests (version
    /// 2) to the router, as a router that ignores PCP.
    NatPmp,
}

impl Mapper {
    /// What miniupnpd prints once it answers.
    pub fn ready_line(self) -> &'static str {
        match self {
            Mapper::Upnp => "HTTP listening",
            Mapper::PcpNatPmp | Mapper::NatPmp => "Listening for NAT-PMP/PCP traffic",
        }
    }
}

fn yes(on: bool) -> &'static str {
    if on {
        "yes"
    } else {
        "no"
    }
}

/// The home router's own firewall: nothing unsolicited from the wan reaches it.
const WAN_INPUT_RULES: &str =
    "table inet wanin {\n chain input {\n  type filter hook input priority filter; policy accept;\n  \
     iifname \"wan\" ct state established,related accept\n  iifname \"wan\" drop\n }\n}\n";

fn nat_rules(masquerade: &str) -> String {
    format!(
        "table ip nat {{\n chain post {{\n  type nat hook postrouting priority srcnat;\n  oifname \"wan\" {masquerade}\n }}\n}}\n"
    )
}

impl Drop for NatLab {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of every veth pair, and with it the peer.
        for ns in self.made.iter().rev() {
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("NAT lab: could not delete namespace {ns}: {e}");
            }
        }
    }
}
