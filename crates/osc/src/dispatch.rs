//! Tree dispatch: a tree of ports, one layer per address segment, each layer looked up
//! by a precomputed hash.
//!
//! Ports are declared with a path spec such as `/voice#16/freq::f`:
//! * `name#N` is an array port standing for `name0` … `name{N-1}`; the matched indices
//!   reach the handler through [`Request::indices`], so a tree with millions of reachable
//!   paths stays small.
//! * After the last segment, `:` starts the accepted argument types, alternatives
//!   separated by `:`. `freq::f` accepts no arguments (a query) or one float; `freq:f`
//!   only a float; `go:` only no arguments. Without `:` any arguments are accepted.
//!
//! Literal addresses starting with `/` are resolved with one hash probe per layer. An
//! address starting with `!` (the O2 convention: no wildcards) is looked up whole in a
//! full-path table with one probe, array elements included: the table is keyed by the
//! path with every segment's trailing digits removed, and the candidate is then checked
//! segment by segment (names, digits, array bounds). Patterns are matched layer by layer (`//` included) under a
//! work budget, so a hostile pattern cannot make one message cost more than that. Handlers may reply to the sender, broadcast, forward the message unchanged to
//! the next stage, or chain a new message that is dispatched after the current one; all
//! of these are written into a caller-provided [`Outbox`].
//!
//! The address `/_meta` is reserved: `/_meta ,s PATH` replies `/_meta ,ss PATH JSON` with
//! the port's metadata (or `/_meta/error ,ss PATH REASON`).
//!
//! Building a [`Tree`] allocates; [`Tree::dispatch`] must never allocate, lock or block.

use crate::arg::Arg;
use crate::decode::{DecodeError, Message, Packet};
use crate::encode::{encode_message, EncodeError};
use crate::meta::Meta;
use crate::pattern::{has_wildcards, is_literal_bytes, match_segment};
use crate::time::TimeTag;

/// Deepest address (in segments) the tree accepts.
pub const MAX_PATH_DEPTH: usize = 16;

/// Longest base name of an array port.
pub const MAX_ARRAY_NAME: usize = 80;

/// How many chained messages one [`Tree::dispatch`] call processes at most.
pub const MAX_CHAINED: u32 = 64;

/// The reserved metadata query address.
pub const META_ADDRESS: &str = "/_meta";

/// A port handler: gets the caller's state and the request.
pub type Handler<S> = Box<dyn Fn(&mut S, &mut Request<'_, '_>) + Send + Sync>;

/// Why a tree could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// The path spec does not start with `/` or has an empty segment.
    #[error("port spec {0:?} must start with '/' and have no empty segments")]
    BadPath(String),
    /// A segment contains a character that is not allowed in port names.
    #[error("port spec {0:?}: segment names may not contain ' ', '#', ',', '*', '?', '[', ']', '{{', '}}' or ':' (except 'name#N' for arrays)")]
    BadName(String),
    /// An array count is missing, zero or too large, or its base name ends in a digit.
    #[error("port spec {0:?}: array ports are written 'name#N' with 1 <= N <= 2^31 and a name of at most {MAX_ARRAY_NAME} bytes not ending in a digit")]
    BadArray(String),
    /// The path has more than [`MAX_PATH_DEPTH`] segments.
    #[error("port spec {0:?} is deeper than {MAX_PATH_DEPTH} segments")]
    TooDeep(String),
    /// Two ports with the same path.
    #[error("port {0:?} is declared twice")]
    Duplicate(String),
    /// A name that is declared both as an array and as a plain port in one layer.
    #[error("port spec {0:?} conflicts with an existing port of the same name")]
    Conflict(String),
    /// Names starting with `_` are reserved.
    #[error("port spec {0:?}: top-level names starting with '_' are reserved")]
    Reserved(String),
}

/// Where an [`Outbox`] entry should go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Back to the sender of the message being dispatched.
    Reply = 1,
    /// To every listener.
    Broadcast = 2,
    /// The unchanged message, handed on to the next stage (e.g. the non-realtime side).
    Forward = 3,
    /// A new message that the tree dispatched after the current one.
    Chain = 4,
}

impl Route {
    fn from_u8(b: u8) -> Option<Route> {
        Some(match b {
            1 => Route::Reply,
            2 => Route::Broadcast,
            3 => Route::Forward,
            4 => Route::Chain,
            _ => return None,
        })
    }
}

const ENTRY_HEADER: usize = 8;

/// Caller-provided storage for the messages handlers produce during dispatch.
///
/// Entries are encoded OSC messages tagged with a [`Route`]. When the buffer is full,
/// further entries are dropped and counted in [`Outbox::dropped`].
#[derive(Debug)]
pub struct Outbox<'o> {
    buf: &'o mut [u8],
    len: usize,
    dropped: u32,
}

impl<'o> Outbox<'o> {
    /// An empty outbox writing into `buf`.
    pub fn new(buf: &'o mut [u8]) -> Self {
        Outbox {
            buf,
            len: 0,
            dropped: 0,
        }
    }

    /// Forgets every entry (keeps the buffer).
    pub fn clear(&mut self) {
        self.len = 0;
        self.dropped = 0;
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Entries that did not fit since the last [`clear`](Self::clear).
    pub fn dropped(&self) -> u32 {
        self.dropped
    }

    /// Iterates over `(route, encoded message)` in the order they were written.
    pub fn entries(&self) -> OutboxEntries<'_> {
        OutboxEntries {
            rest: &self.buf[..self.len],
        }
    }

    /// Encodes a message for `route`.
    pub fn push(&mut self, route: Route, address: &str, args: &[Arg<'_>]) -> Result<(), EncodeError> {
        let start = self.len + ENTRY_HEADER;
        let Some(space) = self.buf.get_mut(start..) else {
            self.dropped += 1;
            return Err(EncodeError::BufferTooSmall {
                needed: start,
                available: self.buf.len(),
            });
        };
        match encode_message(space, address, args) {
            Ok(n) => {
                self.write_header(route, n);
                Ok(())
            }
            Err(e) => {
                self.dropped += 1;
                Err(e)
            }
        }
    }

    /// Copies an already encoded message for `route`.
    pub fn push_raw(&mut self, route: Route, message: &[u8]) -> Result<(), EncodeError> {
        let start = self.len + ENTRY_HEADER;
        let padded = crate::arg::pad4(message.len());
        match self.buf.get_mut(start..start + padded) {
            Some(dst) => {
                dst[..message.len()].copy_from_slice(message);
                dst[message.len()..].fill(0);
                self.write_header(route, message.len());
                Ok(())
            }
            None => {
                self.dropped += 1;
                Err(EncodeError::BufferTooSmall {
                    needed: start + padded,
                    available: self.buf.len(),
                })
            }
        }
    }

    fn write_header(&mut self, route: Route, n: usize) {
        let h = &mut self.buf[self.len..self.len + ENTRY_HEADER];
        h[..4].copy_from_slice(&[route as u8, 0, 0, 0]);
        h[4..].copy_from_slice(&(n as u32).to_ne_bytes());
        self.len += ENTRY_HEADER + crate::arg::pad4(n);
    }
}

/// Iterator over an [`Outbox`]'s entries.
#[derive(Debug, Clone)]
pub struct OutboxEntries<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for OutboxEntries<'a> {
    type Item = (Route, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let (route, n, next) = entry_at(self.rest, 0)?;
        let msg = self.rest.get(ENTRY_HEADER..ENTRY_HEADER + n)?;
        self.rest = self.rest.get(next..).unwrap_or(&[]);
        Some((route, msg))
    }
}

/// Route, message length and offset of the next entry for the entry at `at`.
fn entry_at(buf: &[u8], at: usize) -> Option<(Route, usize, usize)> {
    let h = buf.get(at..at + ENTRY_HEADER)?;
    let route = Route::from_u8(h[0])?;
    let n = u32::from_ne_bytes([h[4], h[5], h[6], h[7]]) as usize;
    Some((route, n, at + ENTRY_HEADER + crate::arg::pad4(n)))
}

/// One message arriving at one port, as seen by its handler.
#[derive(Debug)]
pub struct Request<'r, 'o> {
    message: &'r Message<'r>,
    time: TimeTag,
    indices: &'r [u32],
    path: &'r str,
    meta: &'r Meta,
    out: &'r mut Outbox<'o>,
}

impl<'r> Request<'r, '_> {
    /// The message (its address may be a pattern).
    pub fn message(&self) -> &Message<'r> {
        self.message
    }

    /// The message's arguments.
    pub fn args(&self) -> crate::decode::Args<'r> {
        self.message.args()
    }

    /// The `n`th argument.
    pub fn arg(&self, n: usize) -> Option<Arg<'r>> {
        self.message.arg(n)
    }

    /// The time tag the message was delivered with ([`TimeTag::IMMEDIATELY`] outside a
    /// bundle).
    pub fn time(&self) -> TimeTag {
        self.time
    }

    /// Array indices matched along the path, outermost first (one per array port).
    pub fn indices(&self) -> &[u32] {
        self.indices
    }

    /// The `n`th array index, or 0.
    pub fn index(&self, n: usize) -> u32 {
        self.indices.get(n).copied().unwrap_or(0)
    }

    /// The port's path spec, e.g. `/voice#16/freq` (without the argument spec).
    pub fn port_path(&self) -> &'r str {
        self.path
    }

    /// The port's metadata.
    pub fn meta(&self) -> &'r Meta {
        self.meta
    }

    /// Writes the concrete address of this port (array indices filled in) into `buf`;
    /// useful to reply to a pattern with the real address. `None` if `buf` is too small.
    pub fn concrete_address<'b>(&self, buf: &'b mut [u8]) -> Option<&'b str> {
        let mut w = 0usize;
        let mut idx = self.indices.iter();
        for seg in self.path.split('/').skip(1) {
            *buf.get_mut(w)? = b'/';
            w += 1;
            let (name, is_array) = match seg.split_once('#') {
                Some((n, _)) => (n, true),
                None => (seg, false),
            };
            buf.get_mut(w..w + name.len())?.copy_from_slice(name.as_bytes());
            w += name.len();
            if is_array {
                let mut digits = [0u8; 10];
                let s = fmt_u32(*idx.next()?, &mut digits);
                buf.get_mut(w..w + s.len())?.copy_from_slice(s);
                w += s.len();
            }
        }
        core::str::from_utf8(&buf[..w]).ok()
    }

    /// Sends a message back to the sender.
    pub fn reply(&mut self, address: &str, args: &[Arg<'_>]) -> Result<(), EncodeError> {
        self.out.push(Route::Reply, address, args)
    }

    /// Sends a message to every listener.
    pub fn broadcast(&mut self, address: &str, args: &[Arg<'_>]) -> Result<(), EncodeError> {
        self.out.push(Route::Broadcast, address, args)
    }

    /// Replies to the sender from this port's concrete address (e.g. answering a query
    /// on `/voice3/freq` with the current value, even if it arrived as `/voice*/freq`).
    pub fn reply_here(&mut self, args: &[Arg<'_>]) -> Result<(), EncodeError> {
        self.push_here(Route::Reply, args)
    }

    /// Broadcasts from this port's concrete address (e.g. announcing a changed value).
    pub fn broadcast_here(&mut self, args: &[Arg<'_>]) -> Result<(), EncodeError> {
        self.push_here(Route::Broadcast, args)
    }

    fn push_here(&mut self, route: Route, args: &[Arg<'_>]) -> Result<(), EncodeError> {
        let mut buf = [0u8; 512];
        let address = self.concrete_address(&mut buf).ok_or(EncodeError::BadAddress)?;
        self.out.push(route, address, args)
    }

    /// Hands the unchanged message on to the next stage.
    pub fn forward(&mut self) -> Result<(), EncodeError> {
        self.out.push_raw(Route::Forward, self.message.as_bytes())
    }

    /// Dispatches a new message through the tree after this one.
    pub fn chain(&mut self, address: &str, args: &[Arg<'_>]) -> Result<(), EncodeError> {
        self.out.push(Route::Chain, address, args)
    }
}

fn fmt_u32(mut v: u32, buf: &mut [u8; 10]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    &buf[i..]
}

/// What one [`Tree::dispatch`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DispatchSummary {
    /// Messages seen (bundles flattened, chained messages included).
    pub messages: u32,
    /// Handler calls.
    pub handled: u32,
    /// Ports whose address matched but whose argument types did not.
    pub type_mismatch: u32,
    /// Messages that reached no port.
    pub unmatched: u32,
    /// Chained messages dispatched.
    pub chained: u32,
    /// Whether a pattern ran out of its work budget (some ports were not visited).
    pub truncated: bool,
}

struct Leaf<S> {
    handler: Handler<S>,
    /// Accepted type-tag alternatives separated by ':'; `None` accepts anything.
    args: Option<Box<str>>,
    meta: Meta,
    path: Box<str>,
    meta_json: Box<str>,
}

struct Port<S> {
    name: Box<str>,
    hash: u64,
    /// 0 for a plain port, else the number of elements.
    array: u32,
    child: Option<u32>,
    leaf: Option<Leaf<S>>,
}

struct Layer<S> {
    ports: Vec<Port<S>>,
    /// Open-addressing table of port index + 1 (0 = empty), by name hash.
    table: Box<[u32]>,
    /// Whether a plain (non-array) port's name ends in a digit; if not, a segment ending
    /// in digits can only name an array element and needs one probe.
    digit_names: bool,
}

/// One segment of a leaf's path as the full-path table sees it: the name without its
/// trailing digits, and what those digits must be.
struct FlatSeg {
    base: Box<[u8]>,
    kind: FlatKind,
}

enum FlatKind {
    /// A plain name: the address must carry exactly these trailing digits (maybe none).
    Plain(Box<[u8]>),
    /// An array port: the address carries an index below this count.
    Array(u32),
}

struct FlatEntry {
    key: u64,
    layer: u32,
    port: u32,
    segs: Box<[FlatSeg]>,
}

/// A built dispatch tree over state `S`.
pub struct Tree<S> {
    layers: Vec<Layer<S>>,
    /// Full-path table: open addressing over `flat_entries` (index + 1, 0 = empty), keyed
    /// by the hash of the path with every segment's trailing digits removed, so array
    /// elements share their template's key.
    flat: Box<[u32]>,
    flat_entries: Vec<FlatEntry>,
    /// Leaves in declaration order: (layer, port).
    leaves: Vec<(u32, u32)>,
    pattern_budget: u32,
    error: Option<BuildError>,
}

impl<S> std::fmt::Debug for Tree<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tree")
            .field("layers", &self.layers.len())
            .field("ports", &self.layers.iter().map(|l| l.ports.len()).sum::<usize>())
            .field("reachable_paths", &self.reachable_paths())
            .finish()
    }
}

/// A fast non-cryptographic hash of a short name, 8 bytes at a time (names are chosen
/// by whoever builds the tree, so flooding is not a concern; probes compare names too).
#[inline]
fn hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let n = bytes.len();
    let mut h: u64 = (n as u64).wrapping_mul(K) ^ 0x243F_6A88_85A3_08D3;
    let w = |at: usize| -> u64 {
        bytes.get(at..at + 8).map_or(0, |c| {
            u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])
        })
    };
    let h4 = |at: usize| -> u64 {
        bytes
            .get(at..at + 4)
            .map_or(0, |c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u64)
    };
    // Whole 8-byte words, then the last 8 bytes again (overlapping) so the tail is one load;
    // the length mixed in above keeps overlapping reads of different names apart.
    let tail = if n >= 8 {
        let mut at = 0;
        while at + 8 < n {
            h = (h ^ w(at)).wrapping_mul(K).rotate_left(29);
            at += 8;
        }
        w(n - 8)
    } else if n >= 4 {
        (h4(0) << 32) | h4(n - 4)
    } else if n > 0 {
        (bytes[0] as u64) | (bytes[n / 2] as u64) << 8 | (bytes[n - 1] as u64) << 16
    } else {
        0
    };
    h = (h ^ tail).wrapping_mul(K).rotate_left(29);
    h ^= h >> 32;
    h = h.wrapping_mul(K);
    h ^ (h >> 29)
}

/// Collects port declarations; [`build`](TreeBuilder::build) checks them and makes the
/// lookup tables.
pub struct TreeBuilder<S> {
    tree: Tree<S>,
}

impl<S> std::fmt::Debug for TreeBuilder<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TreeBuilder").field("tree", &self.tree).finish()
    }
}

impl<S> Default for TreeBuilder<S> {
    fn default() -> Self {
        Self::new()
    }
}

impl<S> TreeBuilder<S> {
    /// An empty tree.
    pub fn new() -> Self {
        TreeBuilder {
            tree: Tree {
                layers: vec![Layer {
                    ports: Vec::new(),
                    table: Box::new([]),
                    digit_names: false,
                }],
                flat: Box::new([]),
                flat_entries: Vec::new(),
                leaves: Vec::new(),
                pattern_budget: 100_000,
                error: None,
            },
        }
    }

    /// Bounds how many ports one pattern may visit (default 100 000).
    pub fn pattern_budget(&mut self, ports: u32) -> &mut Self {
        self.tree.pattern_budget = ports;
        self
    }

    /// Declares a port; see the [module docs](self) for the spec syntax. Errors are
    /// reported by [`build`](Self::build).
    pub fn port<F>(&mut self, spec: &str, meta: Meta, handler: F) -> &mut Self
    where
        F: Fn(&mut S, &mut Request<'_, '_>) + Send + Sync + 'static,
    {
        if self.tree.error.is_none() {
            if let Err(e) = self.add(spec, meta, Box::new(handler)) {
                self.tree.error = Some(e);
            }
        }
        self
    }

    fn add(&mut self, spec: &str, meta: Meta, handler: Handler<S>) -> Result<(), BuildError> {
        let bad = |f: fn(String) -> BuildError| f(spec.to_owned());
        let (path, args) = match spec.split_once(':') {
            Some((p, a)) => (p, Some(a)),
            None => (spec, None),
        };
        if let Some(a) = args {
            if a.bytes().any(|c| c != b':' && !crate::arg::is_known_tag(c)) {
                return Err(bad(BuildError::BadName));
            }
        }
        let Some(rel) = path.strip_prefix('/') else {
            return Err(bad(BuildError::BadPath));
        };
        let segments = rel.split('/');
        if rel.split('/').count() > MAX_PATH_DEPTH {
            return Err(bad(BuildError::TooDeep));
        }
        let mut layer = 0usize;
        let mut segs = segments.peekable();
        let mut first = true;
        let mut last = None;
        while let Some(seg) = segs.next() {
            if seg.is_empty() {
                return Err(bad(BuildError::BadPath));
            }
            if first && seg.starts_with('_') {
                return Err(bad(BuildError::Reserved));
            }
            first = false;
            let (name, array) = match seg.split_once('#') {
                Some((n, count)) => {
                    let count: u32 = count.parse().map_err(|_| bad(BuildError::BadArray))?;
                    if count == 0
                        || count > 1 << 31
                        || n.is_empty()
                        || n.len() > MAX_ARRAY_NAME
                        || n.ends_with(|c: char| c.is_ascii_digit())
                    {
                        return Err(bad(BuildError::BadArray));
                    }
                    (n, count)
                }
                None => (seg, 0),
            };
            if name.bytes().any(|c| b" #,*?[]{}:!\0".contains(&c)) {
                return Err(bad(BuildError::BadName));
            }
            let ports = &mut self.tree.layers[layer].ports;
            let idx = match ports.iter().position(|p| &*p.name == name) {
                Some(i) => {
                    if ports[i].array != array {
                        return Err(bad(BuildError::Conflict));
                    }
                    i
                }
                None => {
                    ports.push(Port {
                        name: name.into(),
                        hash: hash(name.as_bytes()),
                        array,
                        child: None,
                        leaf: None,
                    });
                    ports.len() - 1
                }
            };
            if segs.peek().is_some() {
                let child = match self.tree.layers[layer].ports[idx].child {
                    Some(c) => c as usize,
                    None => {
                        self.tree.layers.push(Layer {
                            ports: Vec::new(),
                            table: Box::new([]),
                            digit_names: false,
                        });
                        let c = self.tree.layers.len() - 1;
                        self.tree.layers[layer].ports[idx].child = Some(c as u32);
                        c
                    }
                };
                layer = child;
            } else {
                last = Some((layer, idx));
            }
        }
        let Some((layer, idx)) = last else {
            return Err(bad(BuildError::BadPath));
        };
        let port = &mut self.tree.layers[layer].ports[idx];
        if port.leaf.is_some() {
            return Err(bad(BuildError::Duplicate));
        }
        let mut meta_json = String::new();
        meta.write_json(path, args, &mut meta_json);
        port.leaf = Some(Leaf {
            handler,
            args: args.map(Into::into),
            meta,
            path: path.into(),
            meta_json: meta_json.into(),
        });
        self.tree.leaves.push((layer as u32, idx as u32));
        Ok(())
    }

    /// Checks the declarations and builds the lookup tables.
    pub fn build(self) -> Result<Tree<S>, BuildError> {
        let mut tree = self.tree;
        if let Some(e) = tree.error.take() {
            return Err(e);
        }
        // A plain name that reads as an element of an array beside it (`osc2` next to
        // `osc#4`) would make the address ambiguous.
        for layer in &tree.layers {
            for p in layer.ports.iter().filter(|p| p.array == 0) {
                let base = p.name.trim_end_matches(|c: char| c.is_ascii_digit());
                if base.len() < p.name.len() && layer.ports.iter().any(|q| q.array > 0 && &*q.name == base) {
                    let path = tree.leaves.iter().find_map(|&(li, pi)| {
                        let leaf = tree.layers[li as usize].ports[pi as usize].leaf.as_ref()?;
                        leaf.path
                            .split('/')
                            .any(|seg| seg == &*p.name)
                            .then(|| leaf.path.to_string())
                    });
                    return Err(BuildError::Conflict(path.unwrap_or_else(|| p.name.to_string())));
                }
            }
        }
        for layer in &mut tree.layers {
            let size = (layer.ports.len() * 2).next_power_of_two().max(2);
            let mut table = vec![0u32; size];
            for (i, p) in layer.ports.iter().enumerate() {
                let mut slot = p.hash as usize & (size - 1);
                while table[slot] != 0 {
                    slot = (slot + 1) & (size - 1);
                }
                table[slot] = i as u32 + 1;
            }
            layer.table = table.into_boxed_slice();
            layer.digit_names = layer
                .ports
                .iter()
                .any(|p| p.array == 0 && p.name.ends_with(|c: char| c.is_ascii_digit()));
        }
        let mut entries = Vec::new();
        for &(li, pi) in &tree.leaves {
            let Some(leaf) = &tree.layers[li as usize].ports[pi as usize].leaf else {
                continue;
            };
            let segs: Box<[FlatSeg]> = leaf
                .path
                .split('/')
                .skip(1)
                .map(|seg| match seg.split_once('#') {
                    Some((name, count)) => FlatSeg {
                        base: name.as_bytes().into(),
                        kind: FlatKind::Array(count.parse().unwrap_or(0)),
                    },
                    None => {
                        let (base, digits) = split_digits(seg.as_bytes());
                        FlatSeg {
                            base: base.into(),
                            kind: FlatKind::Plain(digits.into()),
                        }
                    }
                })
                .collect();
            let key = segs.iter().fold(FLAT_SEED, |h, s| flat_mix(h, &s.base));
            entries.push(FlatEntry {
                key,
                layer: li,
                port: pi,
                segs,
            });
        }
        let size = (entries.len() * 2).next_power_of_two().max(2);
        let mut table = vec![0u32; size];
        for (i, e) in entries.iter().enumerate() {
            let mut slot = e.key as usize & (size - 1);
            while table[slot] != 0 {
                slot = (slot + 1) & (size - 1);
            }
            table[slot] = i as u32 + 1;
        }
        tree.flat_entries = entries;
        tree.flat = table.into_boxed_slice();
        Ok(tree)
    }
}

/// Per-dispatch working state kept on the stack.
struct Walk<'a, 'r, 'o, S> {
    state: &'a mut S,
    message: &'r Message<'r>,
    time: TimeTag,
    out: &'a mut Outbox<'o>,
    indices: [u32; MAX_PATH_DEPTH],
    n_indices: usize,
    budget: u32,
    summary: DispatchSummary,
}

impl<S> Tree<S> {
    /// Number of concrete leaf addresses the tree answers (array ports expanded).
    pub fn reachable_paths(&self) -> u64 {
        fn count<S>(t: &Tree<S>, layer: usize) -> u64 {
            t.layers[layer]
                .ports
                .iter()
                .map(|p| {
                    let own = p.leaf.is_some() as u64 + p.child.map_or(0, |c| count(t, c as usize));
                    own * (p.array.max(1) as u64)
                })
                .sum()
        }
        count(self, 0)
    }

    /// Every port and its metadata as a JSON document: `{"ports":[{"path":…},…]}`.
    pub fn to_json(&self) -> String {
        let mut out = String::from("{\"ports\":[");
        let mut first = true;
        for &(li, pi) in &self.leaves {
            if let Some(leaf) = &self.layers[li as usize].ports[pi as usize].leaf {
                if !first {
                    out.push(',');
                }
                first = false;
                out.push_str(&leaf.meta_json);
            }
        }
        out.push_str("]}");
        out
    }

    /// Decodes `packet` and dispatches every message in it (bundles flattened, with their
    /// time tags), then every chained message. Never allocates.
    pub fn dispatch(
        &self,
        state: &mut S,
        packet: &[u8],
        out: &mut Outbox<'_>,
    ) -> Result<DispatchSummary, DecodeError> {
        let packet = Packet::decode(packet)?;
        let mut summary = DispatchSummary::default();
        let chain_start = out.len;
        packet.for_each_message(|time, m| {
            let s = self.dispatch_message(state, m, time, out);
            accumulate(&mut summary, &s);
        });
        self.run_chains(state, chain_start, out, &mut summary);
        Ok(summary)
    }

    fn run_chains(&self, state: &mut S, mut at: usize, out: &mut Outbox<'_>, summary: &mut DispatchSummary) {
        while at < out.len && summary.chained < MAX_CHAINED {
            let Some((route, n, next)) = entry_at(out.buf, at) else {
                break;
            };
            if route == Route::Chain {
                let (done, rest) = out.buf.split_at_mut(out.len);
                let bytes = &done[at + ENTRY_HEADER..at + ENTRY_HEADER + n];
                if let Ok(m) = Message::decode(bytes) {
                    let mut sub = Outbox {
                        buf: rest,
                        len: 0,
                        dropped: 0,
                    };
                    let s = self.dispatch_message(state, &m, TimeTag::IMMEDIATELY, &mut sub);
                    let (len, dropped) = (sub.len, sub.dropped);
                    out.len += len;
                    out.dropped += dropped;
                    accumulate(summary, &s);
                }
                summary.chained += 1;
            }
            at = next;
        }
    }

    /// Dispatches one decoded message delivered at `time` (chained messages it produces
    /// stay in the outbox as [`Route::Chain`] entries; [`Tree::dispatch`] runs them).
    pub fn dispatch_message(
        &self,
        state: &mut S,
        message: &Message<'_>,
        time: TimeTag,
        out: &mut Outbox<'_>,
    ) -> DispatchSummary {
        let addr = message.address_bytes();
        let mut w = Walk {
            state,
            message,
            time,
            out,
            indices: [0; MAX_PATH_DEPTH],
            n_indices: 0,
            budget: self.pattern_budget,
            summary: DispatchSummary {
                messages: 1,
                ..Default::default()
            },
        };
        let rel = addr.get(1..).unwrap_or(&[]);
        if rel == &META_ADDRESS.as_bytes()[1..] {
            self.answer_meta(&mut w);
            return w.summary;
        }
        if addr.first() == Some(&b'!') {
            // O2 convention: never a pattern, so the whole path is looked up at once in
            // the full-path table (one probe); the per-layer walk is only a safety net.
            if !self.lookup_flat(rel, &mut w) {
                w.n_indices = 0;
                let _ = self.walk_literal(rel, &mut w);
            }
        } else if !self.walk_literal(rel, &mut w) && !is_literal_bytes(addr) {
            // Port names never contain wildcard characters or empty segments, so a
            // pattern can't succeed as a literal lookup: trying the literal walk first
            // costs patterns little and spares literal addresses a scan.
            w.n_indices = 0;
            self.walk_pattern(0, rel, 0, &mut w);
        }
        if w.summary.handled == 0 && w.summary.type_mismatch == 0 {
            w.summary.unmatched = 1;
        }
        w.summary
    }

    /// Looks a literal address up in the full-path table with one probe (plus linear
    /// probing on collisions) and checks it segment by segment against the candidate.
    fn lookup_flat(&self, rel: &[u8], w: &mut Walk<'_, '_, '_, S>) -> bool {
        let empty: &[u8] = &[];
        let mut parts = [(empty, empty); MAX_PATH_DEPTH];
        let mut n = 0;
        let mut key = FLAT_SEED;
        for seg in rel.split(|&c| c == b'/') {
            let Some(part) = parts.get_mut(n) else {
                return false;
            };
            *part = split_digits(seg);
            key = flat_mix(key, part.0);
            n += 1;
        }
        let parts = &parts[..n];
        let mask = self.flat.len() - 1;
        let mut slot = key as usize & mask;
        loop {
            let i = self.flat[slot];
            let Some(e) = i.checked_sub(1).and_then(|i| self.flat_entries.get(i as usize)) else {
                return false;
            };
            if e.key == key && e.segs.len() == n && flat_matches(e, parts, w) {
                if let Some(leaf) = &self.layers[e.layer as usize].ports[e.port as usize].leaf {
                    self.call(leaf, w);
                    return true;
                }
            }
            slot = (slot + 1) & mask;
        }
    }

    /// Finds the port for one literal segment: exact name first, then `base` + index for
    /// array ports.
    fn find(&self, layer: usize, seg: &[u8]) -> Option<(&Port<S>, Option<u32>)> {
        let layer = &self.layers[layer];
        let digits = seg.iter().rev().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 || layer.digit_names {
            if let Some(p) = probe(layer, seg, false) {
                return Some((p, None));
            }
        }
        if digits == 0 || digits == seg.len() || digits > 10 {
            return None;
        }
        let (base, num) = seg.split_at(seg.len() - digits);
        if num.len() > 1 && num[0] == b'0' {
            return None;
        }
        let idx = num.iter().fold(0u64, |acc, &d| acc * 10 + (d - b'0') as u64);
        let p = probe(layer, base, true)?;
        if idx < p.array as u64 {
            Some((p, Some(idx as u32)))
        } else {
            None
        }
    }

    /// Resolves a literal address segment by segment; returns whether it reached a leaf.
    fn walk_literal(&self, rel: &[u8], w: &mut Walk<'_, '_, '_, S>) -> bool {
        let mut layer = 0usize;
        let mut rest = rel;
        loop {
            let (seg, more) = match rest.iter().position(|&c| c == b'/') {
                Some(i) => (&rest[..i], Some(&rest[i + 1..])),
                None => (rest, None),
            };
            let Some((port, idx)) = self.find(layer, seg) else {
                return false;
            };
            if let Some(i) = idx {
                if w.n_indices >= MAX_PATH_DEPTH {
                    return false;
                }
                w.indices[w.n_indices] = i;
                w.n_indices += 1;
            }
            match more {
                None => {
                    let Some(leaf) = &port.leaf else { return false };
                    self.call(leaf, w);
                    return true;
                }
                Some(m) => {
                    let Some(c) = port.child else { return false };
                    layer = c as usize;
                    rest = m;
                }
            }
        }
    }

    fn walk_pattern(&self, layer: usize, p: &[u8], depth: usize, w: &mut Walk<'_, '_, '_, S>) {
        if depth >= MAX_PATH_DEPTH {
            return;
        }
        let (seg, rest) = match p.iter().position(|&c| c == b'/') {
            Some(i) => (&p[..i], Some(&p[i + 1..])),
            None => (p, None),
        };
        if seg.is_empty() {
            if let Some(rest) = rest {
                // `//`: the rest of the pattern here, and `//` again in every child.
                self.walk_pattern(layer, rest, depth, w);
                for port in &self.layers[layer].ports {
                    let Some(child) = port.child else { continue };
                    for i in 0..port.array.max(1) {
                        if !w.spend() {
                            return;
                        }
                        let mark = w.push_index(port, i);
                        self.walk_pattern(child as usize, p, depth + 1, w);
                        w.n_indices = mark;
                    }
                }
            }
            return;
        }
        if !has_wildcards(seg) {
            if let Some((port, idx)) = self.find(layer, seg) {
                let mark = w.n_indices;
                if let Some(i) = idx {
                    w.indices[w.n_indices] = i;
                    w.n_indices += 1;
                }
                self.visit(port, rest, depth, w);
                w.n_indices = mark;
            }
            return;
        }
        for port in &self.layers[layer].ports {
            if port.array == 0 {
                if !w.spend() {
                    return;
                }
                if match_segment(seg, port.name.as_bytes()) {
                    self.visit(port, rest, depth, w);
                }
                continue;
            }
            if !prefix_compatible(seg, port.name.as_bytes()) {
                continue;
            }
            let mut name = [0u8; MAX_ARRAY_NAME + 10];
            let base = port.name.len();
            if base > MAX_ARRAY_NAME {
                continue;
            }
            name[..base].copy_from_slice(port.name.as_bytes());
            for i in 0..port.array {
                if !w.spend() {
                    return;
                }
                let mut digits = [0u8; 10];
                let d = fmt_u32(i, &mut digits);
                name[base..base + d.len()].copy_from_slice(d);
                if match_segment(seg, &name[..base + d.len()]) {
                    let mark = w.push_index(port, i);
                    self.visit(port, rest, depth, w);
                    w.n_indices = mark;
                }
            }
        }
    }

    fn visit(&self, port: &Port<S>, rest: Option<&[u8]>, depth: usize, w: &mut Walk<'_, '_, '_, S>) {
        match rest {
            None => {
                if let Some(leaf) = &port.leaf {
                    self.call(leaf, w);
                }
            }
            Some(r) => {
                if let Some(c) = port.child {
                    self.walk_pattern(c as usize, r, depth + 1, w);
                }
            }
        }
    }

    fn call(&self, leaf: &Leaf<S>, w: &mut Walk<'_, '_, '_, S>) {
        if let Some(spec) = &leaf.args {
            let tags = w.message.type_tag_bytes();
            if !spec.as_bytes().split(|&c| c == b':').any(|alt| alt == tags) {
                w.summary.type_mismatch += 1;
                return;
            }
        }
        let mut req = Request {
            message: w.message,
            time: w.time,
            indices: &w.indices[..w.n_indices],
            path: &leaf.path,
            meta: &leaf.meta,
            out: &mut *w.out,
        };
        (leaf.handler)(&mut *w.state, &mut req);
        w.summary.handled += 1;
    }

    fn answer_meta(&self, w: &mut Walk<'_, '_, '_, S>) {
        let Some(Arg::Str(path)) = w.message.arg(0) else {
            let _ = w.out.push(
                Route::Reply,
                "/_meta/error",
                &[Arg::Str(""), Arg::Str("send /_meta ,s PATH")],
            );
            return;
        };
        match self.leaf_for_meta(path) {
            Some(leaf) => {
                let _ = w.out.push(
                    Route::Reply,
                    META_ADDRESS,
                    &[Arg::Str(path), Arg::Str(&leaf.meta_json)],
                );
            }
            None => {
                let _ = w.out.push(
                    Route::Reply,
                    "/_meta/error",
                    &[Arg::Str(path), Arg::Str("no such port")],
                );
            }
        }
    }

    /// The leaf for a concrete path (`/voice3/freq`) or a path spec (`/voice#16/freq`).
    fn leaf_for_meta(&self, path: &str) -> Option<&Leaf<S>> {
        let rel = path.as_bytes().get(1..)?;
        if !path.starts_with('/') && !path.starts_with('!') {
            return None;
        }
        let mut layer = 0usize;
        let mut rest = rel;
        loop {
            let (seg, more) = match rest.iter().position(|&c| c == b'/') {
                Some(i) => (&rest[..i], Some(&rest[i + 1..])),
                None => (rest, None),
            };
            let port = match seg.iter().position(|&c| c == b'#') {
                Some(h) => probe(&self.layers[layer], &seg[..h], true)?,
                None => self.find(layer, seg)?.0,
            };
            match more {
                None => return port.leaf.as_ref(),
                Some(m) => {
                    layer = port.child? as usize;
                    rest = m;
                }
            }
        }
    }
}

/// Whether an array port named `base` (elements `base0`, `base1`, …) can match the
/// pattern segment at all, judged by the pattern's literal prefix, so patterns like
/// `kit*` skip `voice#8` without trying all eight names.
fn prefix_compatible(pattern: &[u8], base: &[u8]) -> bool {
    let lit_len = pattern
        .iter()
        .position(|c| matches!(c, b'*' | b'?' | b'[' | b'{'))
        .unwrap_or(pattern.len());
    let lit = &pattern[..lit_len];
    if lit.len() <= base.len() {
        base.starts_with(lit)
    } else {
        lit.starts_with(base) && lit[base.len()..].iter().all(u8::is_ascii_digit)
    }
}

/// Whether the address split into `parts` (name, trailing digits) is an address of entry
/// `e`; fills in the array indices if so.
fn flat_matches<S>(e: &FlatEntry, parts: &[(&[u8], &[u8])], w: &mut Walk<'_, '_, '_, S>) -> bool {
    let mut n = 0;
    for (fs, &(base, digits)) in e.segs.iter().zip(parts) {
        if !same_name(base, &fs.base) {
            return false;
        }
        match &fs.kind {
            FlatKind::Plain(d) => {
                if !same_name(digits, d) {
                    return false;
                }
            }
            FlatKind::Array(count) => {
                let Some(idx) = parse_index(digits).filter(|i| i < count) else {
                    return false;
                };
                w.indices[n] = idx;
                n += 1;
            }
        }
    }
    w.n_indices = n;
    true
}

const FLAT_SEED: u64 = 0x1357_9BDF_2468_ACE0;

fn flat_mix(h: u64, base: &[u8]) -> u64 {
    (h ^ hash(base))
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .rotate_left(27)
}

/// A segment split into its name and trailing ASCII digits; a segment of digits only is
/// all name.
#[inline]
fn split_digits(seg: &[u8]) -> (&[u8], &[u8]) {
    let digits = seg.iter().rev().take_while(|c| c.is_ascii_digit()).count();
    if digits == seg.len() {
        (seg, &[])
    } else {
        seg.split_at(seg.len() - digits)
    }
}

/// An array index written without leading zeros, below 2^32.
#[inline]
fn parse_index(digits: &[u8]) -> Option<u32> {
    if digits.is_empty() || digits.len() > 10 || (digits.len() > 1 && digits[0] == b'0') {
        return None;
    }
    let v = digits.iter().fold(0u64, |acc, &d| acc * 10 + (d - b'0') as u64);
    u32::try_from(v).ok()
}

/// Byte equality for short names without a library call: 8 bytes at a time, with
/// overlapping loads for the tail.
#[inline]
fn same_name(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let word = |s: &[u8], at: usize| -> u64 {
        s.get(at..at + 8)
            .and_then(|c| <[u8; 8]>::try_from(c).ok())
            .map_or(0, u64::from_ne_bytes)
    };
    if n >= 8 {
        let mut at = 0;
        while at + 8 < n {
            if word(a, at) != word(b, at) {
                return false;
            }
            at += 8;
        }
        word(a, n - 8) == word(b, n - 8)
    } else if n >= 4 {
        let half = |s: &[u8], at: usize| -> u32 {
            s.get(at..at + 4)
                .and_then(|c| <[u8; 4]>::try_from(c).ok())
                .map_or(0, u32::from_ne_bytes)
        };
        half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4)
    } else {
        a.iter().zip(b).all(|(x, y)| x == y)
    }
}

fn probe<'t, S>(layer: &'t Layer<S>, name: &[u8], array: bool) -> Option<&'t Port<S>> {
    let mask = layer.table.len().checked_sub(1)?;
    let h = hash(name);
    let mut slot = h as usize & mask;
    loop {
        let i = *layer.table.get(slot)?;
        if i == 0 {
            return None;
        }
        let p = &layer.ports[i as usize - 1];
        if p.hash == h && (p.array > 0) == array && same_name(p.name.as_bytes(), name) {
            return Some(p);
        }
        slot = (slot + 1) & mask;
    }
}

impl<S> Walk<'_, '_, '_, S> {
    fn spend(&mut self) -> bool {
        if self.budget == 0 {
            self.summary.truncated = true;
            return false;
        }
        self.budget -= 1;
        true
    }

    fn push_index(&mut self, port: &Port<S>, i: u32) -> usize {
        let mark = self.n_indices;
        if port.array > 0 && self.n_indices < MAX_PATH_DEPTH {
            self.indices[self.n_indices] = i;
            self.n_indices += 1;
        }
        mark
    }
}

fn accumulate(total: &mut DispatchSummary, s: &DispatchSummary) {
    total.messages += s.messages;
    total.handled += s.handled;
    total.type_mismatch += s.type_mismatch;
    total.unmatched += s.unmatched;
    total.truncated |= s.truncated;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::Scale;

    #[derive(Default)]
    struct Synth {
        freq: [f32; 16],
        gain: f32,
        log: Vec<String>,
    }

    fn tree() -> Tree<Synth> {
        let mut b = TreeBuilder::<Synth>::new();
        b.port(
            "/voice#16/freq::f",
            Meta::new()
                .doc("Oscillator frequency")
                .range(20.0, 20000.0)
                .unit("Hz")
                .scale(Scale::Log),
            |s, r| {
                let v = r.index(0) as usize;
                match r.arg(0) {
                    Some(Arg::Float(f)) => s.freq[v] = f,
                    _ => {
                        let _ = r.reply_here(&[Arg::Float(s.freq[v])]);
                    }
                }
            },
        )
        .port("/gain:f", Meta::new().default_number(1.0), |s, r| {
            if let Some(Arg::Float(g)) = r.arg(0) {
                s.gain = g;
                let _ = r.broadcast("/gain", &[Arg::Float(g)]);
            }
        })
        .port("/osc2/mode", Meta::new().options(&["sine", "saw"]), |s, r| {
            s.log.push(format!("osc2 {}", r.message().type_tags()));
            let _ = r.forward();
        })
        .port("/panic:", Meta::new(), |_, r| {
            for a in ["/voice0/freq", "/voice1/freq"] {
                let _ = r.chain(a, &[Arg::Float(0.0)]);
            }
        })
        .port("/a/b/c/deep", Meta::new(), |s, r| {
            s.log.push(format!("deep {}", r.time()))
        });
        b.build().unwrap()
    }

    fn msg(buf: &mut [u8], addr: &str, args: &[Arg<'_>]) -> usize {
        encode_message(buf, addr, args).unwrap()
    }

    #[test]
    fn literal_array_and_type_constraints() {
        let t = tree();
        let mut s = Synth::default();
        let mut pkt = [0u8; 128];
        let mut ob = [0u8; 512];
        let mut out = Outbox::new(&mut ob);
        let n = msg(&mut pkt, "/voice3/freq", &[Arg::Float(440.0)]);
        let r = t.dispatch(&mut s, &pkt[..n], &mut out).unwrap();
        assert_eq!((r.handled, r.unmatched), (1, 0));
        assert_eq!(s.freq[3], 440.0);
        // Query (no args) replies with the concrete address.
        let n = msg(&mut pkt, "/voice3/freq", &[]);
        t.dispatch(&mut s, &pkt[..n], &mut out).unwrap();
        let (route, bytes) = out.entries().next().unwrap();
        assert_eq!(route, Route::Reply);
        let m = Message::decode(bytes).unwrap();
        assert_eq!((m.address(), m.arg(0)), ("/voice3/freq", Some(Arg::Float(440.0))));
        // Wrong types, out-of-range index, leading zero, unknown names.
        let n = msg(&mut pkt, "/voice3/freq", &[Arg::Int(1)]);
        assert_eq!(t.dispatch(&mut s, &pkt[..n], &mut out).unwrap().type_mismatch, 1);
        for bad in [
            "/voice16/freq",
            "/voice03/freq",
            "/voice/freq",
            "/nothing",
            "/voice3",
        ] {
            let n = msg(&mut pkt, bad, &[Arg::Float(1.0)]);
            assert_eq!(
                t.dispatch(&mut s, &pkt[..n], &mut out).unwrap().unmatched,
                1,
                "{bad}"
            );
        }
        // A plain name ending in digits wins over array parsing.
        out.clear();
        let n = msg(&mut pkt, "!osc2/mode", &[Arg::Int(1)]);
        assert_eq!(t.dispatch(&mut s, &pkt[..n], &mut out).unwrap().handled, 1);
        assert_eq!(out.entries().next().map(|e| e.0), Some(Route::Forward));
        assert_eq!(out.entries().next().map(|e| e.1), Some(&pkt[..n]));
    }

    #[test]
    fn patterns_match_layer_by_layer() {
        let t = tree();
        let mut s = Synth::default();
        let mut pkt = [0u8; 128];
        let mut ob = [0u8; 4096];
        let mut out = Outbox::new(&mut ob);
        let n = msg(&mut pkt, "/voice*/freq", &[Arg::Float(5.0)]);
        assert_eq!(t.dispatch(&mut s, &pkt[..n], &mut out).unwrap().handled, 16);
        assert!(s.freq.iter().all(|&f| f == 5.0));
        let n = msg(&mut pkt, "/voice1[0-2]/freq", &[Arg::Float(6.0)]);
        assert_eq!(t.dispatch(&mut s, &pkt[..n], &mut out).unwrap().handled, 3);
        assert_eq!(&s.freq[9..14], &[5.0, 6.0, 6.0, 6.0, 5.0]);
        let n = msg(&mut pkt, "/{voice2,gain}", &[Arg::Float(0.5)]);
        assert_eq!(t.dispatch(&mut s, &pkt[..n], &mut out).unwrap().handled, 1);
        assert_eq!(s.gain, 0.5);
        let n = msg(&mut pkt, "//deep", &[]);
        assert_eq!(t.dispatch(&mut s, &pkt[..n], &mut out).unwrap().handled, 1);
        let n = msg(&mut pkt, "//freq", &[Arg::Float(7.0)]);
        assert_eq!(t.dispatch(&mut s, &pkt[..n], &mut out).unwrap().handled, 16);
        // A literal '!' address is never treated as a pattern.
        let n = msg(&mut pkt, "!voice*/freq", &[Arg::Float(8.0)]);
        assert_eq!(t.dispatch(&mut s, &pkt[..n], &mut out).unwrap().unmatched, 1);
    }

    #[test]
    fn bundles_deliver_time_tags_and_chains_run() {
        let t = tree();
        let mut s = Synth::default();
        let mut pkt = [0u8; 256];
        let mut w = crate::encode::BundleWriter::new(&mut pkt, TimeTag::new(7, 0)).unwrap();
        w.message("/a/b/c/deep", &[]).unwrap();
        w.message("/panic", &[]).unwrap();
        let n = w.finish().unwrap();
        s.freq = [1.0; 16];
        let mut ob = [0u8; 1024];
        let mut out = Outbox::new(&mut ob);
        let r = t.dispatch(&mut s, &pkt[..n], &mut out).unwrap();
        assert_eq!(s.log, vec!["deep 00000007.00000000".to_owned()]);
        assert_eq!((r.messages, r.handled, r.chained), (4, 4, 2));
        assert_eq!(&s.freq[..3], &[0.0, 0.0, 1.0]);
    }

    #[test]
    fn broadcast_and_full_outbox() {
        let t = tree();
        let mut s = Synth::default();
        let mut pkt = [0u8; 64];
        let mut ob = [0u8; 8];
        let mut out = Outbox::new(&mut ob);
        let n = msg(&mut pkt, "/gain", &[Arg::Float(0.25)]);
        assert_eq!(t.dispatch(&mut s, &pkt[..n], &mut out).unwrap().handled, 1);
        assert_eq!(out.dropped(), 1);
        let mut ob = [0u8; 64];
        let mut out = Outbox::new(&mut ob);
        t.dispatch(&mut s, &pkt[..n], &mut out).unwrap();
        assert_eq!(out.entries().next().map(|e| e.0), Some(Route::Broadcast));
    }

    #[test]
    fn metadata_json_and_query() {
        let t = tree();
        assert_eq!(t.reachable_paths(), 20);
        let json = t.to_json();
        assert!(
            json.starts_with("{\"ports\":[{\"path\":\"/voice#16/freq\",\"args\":[\"\",\"f\"]"),
            "{json}"
        );
        assert!(json.contains("\"options\":[\"sine\",\"saw\"]"));
        let mut s = Synth::default();
        let mut pkt = [0u8; 64];
        let mut ob = [0u8; 1024];
        for path in ["/voice7/freq", "/voice#16/freq"] {
            let mut out = Outbox::new(&mut ob);
            let n = msg(&mut pkt, "/_meta", &[Arg::Str(path)]);
            t.dispatch(&mut s, &pkt[..n], &mut out).unwrap();
            let (route, bytes) = out.entries().next().unwrap();
            assert_eq!(route, Route::Reply);
            let m = Message::decode(bytes).unwrap();
            assert_eq!(m.address(), "/_meta");
            let json = m.arg(1).and_then(|a| a.as_str().map(str::to_owned)).unwrap();
            assert!(json.contains("\"unit\":\"Hz\""), "{json}");
        }
        let mut out = Outbox::new(&mut ob);
        let n = msg(&mut pkt, "/_meta", &[Arg::Str("/nope")]);
        t.dispatch(&mut s, &pkt[..n], &mut out).unwrap();
        let m = Message::decode(out.entries().next().unwrap().1).unwrap();
        assert_eq!(m.address(), "/_meta/error");
    }

    #[test]
    fn json_export_is_valid_json_with_every_field() {
        let mut b = TreeBuilder::<()>::new();
        b.port(
            "/filter#2/cutoff::f",
            Meta::new()
                .doc("Cutoff \"frequency\"\nin Hz")
                .short("cut")
                .range(20.0, 20000.0)
                .default_number(1000.0)
                .unit("Hz")
                .scale(Scale::Log),
            |_, _| {},
        )
        .port(
            "/filter#2/type:i",
            Meta::new().options(&["lp", "hp"]).default_text("lp"),
            |_, _| {},
        )
        .port("/bypass", Meta::new().default_bool(false), |_, _| {});
        let json: serde_json::Value = serde_json::from_str(&b.build().unwrap().to_json()).unwrap();
        let ports = json["ports"].as_array().unwrap();
        assert_eq!(ports.len(), 3);
        let cutoff = &ports[0];
        assert_eq!(cutoff["path"], "/filter#2/cutoff");
        assert_eq!(cutoff["args"], serde_json::json!(["", "f"]));
        assert_eq!(cutoff["doc"], "Cutoff \"frequency\"\nin Hz");
        assert_eq!(cutoff["short_name"], "cut");
        assert_eq!(
            (cutoff["min"].as_f64(), cutoff["max"].as_f64()),
            (Some(20.0), Some(20000.0))
        );
        assert_eq!(cutoff["default"].as_f64(), Some(1000.0));
        assert_eq!(
            (&cutoff["unit"], &cutoff["scale"]),
            (&serde_json::json!("Hz"), &serde_json::json!("log"))
        );
        assert_eq!(ports[1]["options"], serde_json::json!(["lp", "hp"]));
        assert_eq!(ports[1]["default"], "lp");
        assert_eq!(ports[2]["args"], serde_json::Value::Null);
        assert_eq!(ports[2]["default"], false);
    }

    #[test]
    fn names_of_every_length_resolve_exactly() {
        let names: Vec<String> = (1..=40)
            .map(|n| (0..n).map(|i| (b'a' + (i % 26) as u8) as char).collect())
            .collect();
        let mut b = TreeBuilder::<Vec<usize>>::new();
        for (k, name) in names.iter().enumerate() {
            b.port(&format!("/{name}"), Meta::new(), move |hits, _| hits.push(k));
            b.port(&format!("/arr/{name}#3/x"), Meta::new(), move |hits, r| {
                hits.push(1000 * k + r.index(0) as usize)
            });
        }
        let t = b.build().unwrap();
        let mut pkt = [0u8; 128];
        let mut ob = [0u8; 64];
        for (k, name) in names.iter().enumerate() {
            let mut hits = Vec::new();
            for addr in [format!("/{name}"), format!("/arr/{name}2/x")] {
                let n = msg(&mut pkt, &addr, &[]);
                t.dispatch(&mut hits, &pkt[..n], &mut Outbox::new(&mut ob))
                    .unwrap();
            }
            assert_eq!(hits, vec![k, 1000 * k + 2], "{name}");
            // Same length, one byte different at either end: no match.
            let mut first = name.clone().into_bytes();
            first[0] = b'Z';
            let mut last = name.clone().into_bytes();
            *last.last_mut().unwrap() = b'Z';
            for wrong in [first, last] {
                let addr = format!("/{}", String::from_utf8(wrong).unwrap());
                let n = msg(&mut pkt, &addr, &[]);
                let s = t
                    .dispatch(&mut hits, &pkt[..n], &mut Outbox::new(&mut ob))
                    .unwrap();
                assert_eq!(s.unmatched, 1, "{addr}");
            }
        }
    }

    #[test]
    fn literal_lookup_answers_exactly_the_concrete_paths() {
        let specs = [
            "/a#3/b#2/c",
            "/a#3/d",
            "/x1/y",
            "/x2/y",
            "/z/7",
            "/z/q#12",
            "/z/q#12/r10",
        ];
        let mut b = TreeBuilder::<Vec<(String, Vec<u32>)>>::new();
        for spec in specs {
            b.port(spec, Meta::new(), |hits, r| {
                hits.push((r.port_path().to_owned(), r.indices().to_vec()))
            });
        }
        let t = b.build().unwrap();
        let mut concrete = Vec::new();
        for a in 0..3 {
            for b in 0..2 {
                concrete.push(format!("/a{a}/b{b}/c"));
            }
            concrete.push(format!("/a{a}/d"));
        }
        concrete.extend(["/x1/y", "/x2/y", "/z/7"].map(String::from));
        for q in 0..12 {
            concrete.push(format!("/z/q{q}"));
            concrete.push(format!("/z/q{q}/r10"));
        }
        let mut candidates = concrete.clone();
        for c in &concrete {
            candidates.push(c.replace('0', "00"));
            candidates.push(c.replace('1', "01"));
            candidates.push(c.replace('2', "9"));
            candidates.push(c.replacen('/', "!", 1));
            candidates.push(format!("{c}/extra"));
            candidates.push(
                c.rsplit_once('/')
                    .map(|(head, _)| head.to_owned())
                    .unwrap_or_default(),
            );
        }
        candidates.extend(
            [
                "/a3/d", "/a/d", "/x3/y", "/x/y", "/z/8", "/z/q12", "/z/q1/r1", "/", "!",
            ]
            .map(String::from),
        );
        let mut pkt = [0u8; 128];
        let mut ob = [0u8; 64];
        for addr in candidates {
            let want = concrete.contains(&addr.replacen('!', "/", 1));
            let mut hits = Vec::new();
            let Ok(n) = encode_message(&mut pkt, &addr, &[]) else {
                continue;
            };
            let s = t
                .dispatch(&mut hits, &pkt[..n], &mut Outbox::new(&mut ob))
                .unwrap();
            assert_eq!(s.handled == 1, want, "{addr}: {hits:?}");
            // The full-path table alone answers every concrete path (no per-layer fallback).
            let m = Message::decode(&pkt[..n]).unwrap();
            let mut scratch = Vec::new();
            let mut out = Outbox::new(&mut ob);
            let mut w = Walk {
                state: &mut scratch,
                message: &m,
                time: TimeTag::IMMEDIATELY,
                out: &mut out,
                indices: [0; MAX_PATH_DEPTH],
                n_indices: 0,
                budget: 0,
                summary: DispatchSummary::default(),
            };
            assert_eq!(t.lookup_flat(&addr.as_bytes()[1..], &mut w), want, "{addr}");
            if want {
                // The indices are the numbers in the address, in order, for array segments.
                let (spec, idx) = &hits[0];
                let expect: Vec<u32> = addr
                    .split(['/', '!'])
                    .zip(spec.split('/'))
                    .filter(|(_, sp)| sp.contains('#'))
                    .map(|(seg, _)| {
                        seg.trim_start_matches(|c: char| c.is_ascii_alphabetic())
                            .parse()
                            .unwrap()
                    })
                    .collect();
                assert_eq!(idx, &expect, "{addr}");
            }
        }
    }

    #[test]
    fn build_errors() {
        let h = |_: &mut (), _: &mut Request<'_, '_>| {};
        let cases = [
            ("nope", BuildError::BadPath("nope".into())),
            ("/a//b", BuildError::BadPath("/a//b".into())),
            ("/a*", BuildError::BadName("/a*".into())),
            ("/v#0", BuildError::BadArray("/v#0".into())),
            ("/v2#4", BuildError::BadArray("/v2#4".into())),
            ("/_x", BuildError::Reserved("/_x".into())),
            ("/a:q", BuildError::BadName("/a:q".into())),
            ("/a{0}#2", BuildError::BadName("/a{0}#2".into())),
        ];
        for (spec, want) in cases {
            let mut b = TreeBuilder::<()>::new();
            b.port(spec, Meta::new(), h);
            assert_eq!(b.build().unwrap_err(), want);
        }
        let mut b = TreeBuilder::<()>::new();
        b.port("/a", Meta::new(), h).port("/a", Meta::new(), h);
        assert_eq!(b.build().unwrap_err(), BuildError::Duplicate("/a".into()));
        let mut b = TreeBuilder::<()>::new();
        b.port("/a#2/x", Meta::new(), h).port("/a/y", Meta::new(), h);
        assert_eq!(b.build().unwrap_err(), BuildError::Conflict("/a/y".into()));
        let mut b = TreeBuilder::<()>::new();
        b.port("/osc#4/x", Meta::new(), h).port("/osc2/y", Meta::new(), h);
        assert_eq!(b.build().unwrap_err(), BuildError::Conflict("/osc2/y".into()));
        let mut b = TreeBuilder::<()>::new();
        b.port("/osc#4/x", Meta::new(), h)
            .port("/a/osc2", Meta::new(), h)
            .port("/a/osc10", Meta::new(), h);
        assert!(b.build().is_ok());
    }

    #[test]
    fn pattern_budget_bounds_work() {
        let mut b = TreeBuilder::<u32>::new();
        b.pattern_budget(1000)
            .port("/a#1000/b#1000/c", Meta::new(), |n, _| *n += 1);
        let t = b.build().unwrap();
        assert_eq!(t.reachable_paths(), 1_000_000);
        let mut n = 0u32;
        let mut pkt = [0u8; 64];
        let mut ob = [0u8; 64];
        let mut out = Outbox::new(&mut ob);
        let len = msg(&mut pkt, "/*/*/c", &[]);
        let r = t.dispatch(&mut n, &pkt[..len], &mut out).unwrap();
        assert!(r.truncated);
        assert!(n < 1000);
    }
}
