//! Recording a room as a multitrack: one WAV per member heard, the mix, and your own input,
//! all on one timeline.
//!
//! The timeline is the output as played: frame n of every file is the n-th frame the device
//! played since the stream started (frames the device skipped are silence in every file).
//! A member's track holds what its receiver rendered — after the jitter buffer, concealment
//! and drift correction, before the mix's gain, pan and mute — so a DAW gets the raw
//! tracks. A member who joins late starts with silence up to its first frame; one who
//! leaves goes on as silence to the end, so every file has the same length and lines up at
//! both ends. Files are 32-bit float WAV at the stream's rate: `mix.wav`, `you.wav` and
//! `NN-name.wav` (member id, then the name made safe for a file name).
//!
//! Two halves joined by lock-free rings:
//! * [`RecordTap`] lives on the audio thread. Each period it copies your input, the mix and
//!   every member's rendered block into a pre-allocated sample ring and a ring of block
//!   headers (who, how many channels, where on the timeline). When the rings lack room it
//!   drops the whole period and counts it — it never allocates, locks or blocks.
//! * [`RecordWriter`] is a thread that writes the files. A gap in the timeline (a dropped
//!   period, recording paused) becomes silence in every open file, so alignment survives.
//!
//! The writer never runs on the audio thread and the tap never touches a file.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use anyhow::{bail, Context};
use hound::{SampleFormat, WavSpec, WavWriter};
use netjam_engine::members::{MemberId, MemberReceivers};

/// Members a block can carry (a room client's slots).
pub const MAX_TRACKS: usize = crate::session::MAX_ROOM_MEMBERS;
/// Seconds of audio the rings hold for a writer that falls behind (a slow disk).
pub const RECORD_BUFFER_S: f64 = 2.0;
/// Channels per member the sample ring is sized for (besides your input and the mix).
const CHANNELS_PER_MEMBER: usize = 2;
/// Shortest period the header ring is sized for.
const MIN_PERIOD: usize = 16;
/// How long the writer sleeps when there is nothing to write.
const WRITER_IDLE: Duration = Duration::from_millis(10);
/// Silence pushed in pieces of this many samples.
const ZEROS: [f32; 256] = [0.0; 256];

/// Where one period sits on the timeline and whose audio follows it in the sample ring:
/// your input (`you_channels`), the mix, then each member slot that played, in slot order.
#[derive(Debug, Clone, Copy)]
struct BlockHeader {
    /// First frame on the output timeline.
    start: u64,
    frames: u32,
    /// By slot: (member, channels); 0 channels: the slot played nothing.
    members: [(MemberId, u16); MAX_TRACKS],
}

/// Counters both halves see.
#[derive(Debug, Default)]
struct Counters {
    /// Periods the tap dropped because the rings were full (the writer fell behind).
    dropped_blocks: AtomicU64,
    dropped_frames: AtomicU64,
    /// Frames the writer has written to every file.
    written_frames: AtomicU64,
}

/// How a recording is set up.
pub struct RecordConfig {
    pub dir: PathBuf,
    pub rate: u32,
    /// Channels of the mix (the output).
    pub mix_channels: u16,
    /// Channels of your input (0: no `you.wav`).
    pub you_channels: u16,
    /// A member's name for its file name (asked when its track starts); `None`: `member`.
    pub names: Box<dyn Fn(MemberId) -> Option<String> + Send>,
}

impl std::fmt::Debug for RecordConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordConfig")
            .field("dir", &self.dir)
            .field("rate", &self.rate)
            .field("mix_channels", &self.mix_channels)
            .field("you_channels", &self.you_channels)
            .finish_non_exhaustive()
    }
}

/// Make sure `dir` exists (creating it) and is writable, and holds no earlier recording,
/// so a stream never starts towards a recording that cannot be written.
pub fn prepare_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| {
        format!(
            "cannot create the --record directory {}: check its parent exists and is writable, or choose another",
            dir.display()
        )
    })?;
    if !dir.is_dir() {
        bail!("--record {} is not a directory: give a directory", dir.display());
    }
    if dir.join("mix.wav").exists() {
        bail!(
            "{} already holds a recording (mix.wav): choose another --record directory or move it away",
            dir.display()
        );
    }
    let probe = dir.join(".netjam-write-check");
    std::fs::write(&probe, b"").with_context(|| {
        format!(
            "cannot write in the --record directory {}: check its permissions",
            dir.display()
        )
    })?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// A name made safe for a file name: letters, digits, `-` and `_` kept, the rest `_`, at
/// most 40 characters, never empty.
pub fn sanitize_name(name: &str) -> String {
    let s: String = name
        .chars()
        .filter(|c| !c.is_control())
        .map(|c| {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    let s = s.trim_matches('_').to_string();
    if s.is_empty() {
        "member".into()
    } else {
        s
    }
}

/// The file of member `id` called `name`.
pub fn member_file_name(id: MemberId, name: &str) -> String {
    format!("{id:02}-{}.wav", sanitize_name(name))
}

/// Start a recording: prepare the directory, create `mix.wav` (and `you.wav`), reserve the
/// rings and start the writer thread. Returns the audio thread's half and the writer.
pub fn start(config: RecordConfig) -> anyhow::Result<(RecordTap, RecordWriter)> {
    prepare_dir(&config.dir)?;
    let rate = config.rate.max(1);
    let mix_ch = usize::from(config.mix_channels.max(1));
    let you_ch = usize::from(config.you_channels);
    let mix = Track::create(&config.dir.join("mix.wav"), rate, mix_ch, "mix", None)?;
    let you = if you_ch > 0 {
        Some(Track::create(
            &config.dir.join("you.wav"),
            rate,
            you_ch,
            "you",
            None,
        )?)
    } else {
        None
    };
    let seconds = (rate as f64 * RECORD_BUFFER_S) as usize;
    let (mut samples_tx, mut samples_rx) =
        rtrb::RingBuffer::new(seconds * (mix_ch + you_ch + CHANNELS_PER_MEMBER * MAX_TRACKS));
    let (blocks_tx, blocks_rx) = rtrb::RingBuffer::new((seconds / MIN_PERIOD).max(64));
    // Touch every page of the sample ring now, so the audio thread never faults one in.
    let mut sink = vec![0.0f32; ZEROS.len()];
    for _ in 0..samples_tx.buffer().capacity().div_ceil(ZEROS.len()) + 1 {
        let _ = samples_tx.push_entire_slice(&ZEROS);
        let _ = samples_rx.pop_entire_slice(&mut sink);
    }
    let counters = Arc::new(Counters::default());
    let stop = Arc::new(AtomicBool::new(false));
    let state = WriterState {
        dir: config.dir.clone(),
        rate,
        names: config.names,
        mix,
        you,
        members: BTreeMap::new(),
        frames: 0,
        padded_frames: 0,
        scratch: Vec::new(),
        mix_ch,
        you_ch,
    };
    let thread = {
        let (counters, stop) = (counters.clone(), stop.clone());
        thread::Builder::new()
            .name("netjam-record".into())
            .spawn(move || write_loop(state, samples_rx, blocks_rx, &counters, &stop))
            .context("cannot start the recording thread")?
    };
    let tap = RecordTap {
        blocks: blocks_tx,
        samples: samples_tx,
        position: 0,
        you_ch,
        mix_ch,
        armed: true,
        counters: counters.clone(),
    };
    Ok((
        tap,
        RecordWriter {
            thread: Some(thread),
            stop,
            counters,
            dir: config.dir,
        },
    ))
}

/// The audio thread's half of a recording (see the module docs). Never allocates, locks
/// or blocks.
pub struct RecordTap {
    blocks: rtrb::Producer<BlockHeader>,
    samples: rtrb::Producer<f32>,
    /// The next period's first frame on the timeline.
    position: u64,
    you_ch: usize,
    mix_ch: usize,
    armed: bool,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for RecordTap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordTap")
            .field("position", &self.position)
            .field("armed", &self.armed)
            .finish_non_exhaustive()
    }
}

impl RecordTap {
    /// The device skipped `frames` frames: the timeline moves on (silence in every file).
    pub fn skipped(&mut self, frames: u64) {
        self.position += frames;
    }

    /// Pause (`false`) or resume recording; a pause is silence in every file.
    pub fn set_armed(&mut self, on: bool) {
        self.armed = on;
    }

    pub fn armed(&self) -> bool {
        self.armed
    }

    /// Frames of the timeline so far.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Record one period of `frames` frames: `you` (your input), `mix` (the output) and
    /// what every member slot of `members` rendered this period (call after
    /// [`MemberReceivers::render`]). Drops and counts the period when the rings are full.
    pub fn record(&mut self, frames: usize, you: &[f32], mix: &[f32], members: &MemberReceivers) {
        let start = self.position;
        self.position += frames as u64;
        if !self.armed || frames == 0 {
            return;
        }
        let mut header = BlockHeader {
            start,
            frames: frames as u32,
            members: [(0, 0); MAX_TRACKS],
        };
        let mut need = frames * (self.you_ch + self.mix_ch);
        for (slot, h) in header.members.iter_mut().enumerate().take(members.capacity()) {
            if let (Some(owner), Some((_, ch))) = (members.owner(slot), members.output(slot)) {
                *h = (owner.member, ch as u16);
                need += frames * ch;
            }
        }
        if !self.room_for(need, frames) {
            return;
        }
        push_padded(&mut self.samples, you, frames * self.you_ch);
        push_padded(&mut self.samples, mix, frames * self.mix_ch);
        for (slot, &(_, ch)) in header.members.iter().enumerate() {
            if ch > 0 {
                let data = members.output(slot).map_or(&[][..], |(d, _)| d);
                push_padded(&mut self.samples, data, frames * usize::from(ch));
            }
        }
        // Checked above: there is room for it.
        let _ = self.blocks.push(header);
    }

    /// Whether the rings hold a block of `need` samples more; when not, the period of
    /// `frames` frames is counted dropped.
    fn room_for(&mut self, need: usize, frames: usize) -> bool {
        if self.blocks.slots() == 0 || self.samples.slots() < need {
            self.counters.dropped_blocks.fetch_add(1, Ordering::Relaxed);
            self.counters
                .dropped_frames
                .fetch_add(frames as u64, Ordering::Relaxed);
            return false;
        }
        true
    }
}

/// Push exactly `want` samples: `data`'s first ones, then silence.
fn push_padded(ring: &mut rtrb::Producer<f32>, data: &[f32], want: usize) {
    let n = data.len().min(want);
    let _ = ring.push_entire_slice(&data[..n]);
    let mut left = want - n;
    while left > 0 {
        let k = left.min(ZEROS.len());
        let _ = ring.push_entire_slice(&ZEROS[..k]);
        left -= k;
    }
}

/// One file being written.
struct Track {
    writer: WavWriter<BufWriter<File>>,
    channels: usize,
    file: RecordedFile,
}

impl Track {
    fn create(
        path: &Path,
        rate: u32,
        channels: usize,
        track: &str,
        member_id: Option<MemberId>,
    ) -> anyhow::Result<Self> {
        let spec = WavSpec {
            channels: channels as u16,
            sample_rate: rate,
            bits_per_sample: 32,
            sample_format: SampleFormat::Float,
        };
        let writer = WavWriter::create(path, spec).with_context(|| {
            format!(
                "cannot create {}: check the --record directory is writable",
                path.display()
            )
        })?;
        Ok(Self {
            writer,
            channels,
            file: RecordedFile {
                path: path.to_owned(),
                track: track.to_owned(),
                member_id,
                channels: channels as u16,
            },
        })
    }

    /// Write `samples` (interleaved with `channels`) as this file's channels: the channels
    /// both have, the rest silent.
    fn write(&mut self, samples: &[f32], channels: usize) -> hound::Result<()> {
        if channels == self.channels {
            for &x in samples {
                self.writer.write_sample(x)?;
            }
            return Ok(());
        }
        for frame in samples.chunks_exact(channels.max(1)) {
            for c in 0..self.channels {
                self.writer.write_sample(frame.get(c).copied().unwrap_or(0.0))?;
            }
        }
        Ok(())
    }

    fn silence(&mut self, frames: u64) -> hound::Result<()> {
        for _ in 0..frames * self.channels as u64 {
            self.writer.write_sample(0.0f32)?;
        }
        Ok(())
    }
}

/// One file of a recording.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RecordedFile {
    pub path: PathBuf,
    /// `mix`, `you`, or the member's name.
    pub track: String,
    pub member_id: Option<MemberId>,
    pub channels: u16,
}

/// What a recording wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RecordSummary {
    pub dir: PathBuf,
    pub rate: u32,
    /// Length of every file, in frames.
    pub frames: u64,
    pub files: Vec<RecordedFile>,
    /// Periods dropped because the writer fell behind (silence in their place).
    pub dropped_blocks: u64,
    pub dropped_frames: u64,
    /// Frames of silence written for gaps in the timeline (drops, pauses, skipped frames).
    pub padded_frames: u64,
    /// Why writing stopped early, if it did (the files hold what came before).
    pub error: Option<String>,
}

impl RecordSummary {
    pub fn seconds(&self) -> f64 {
        self.frames as f64 / self.rate.max(1) as f64
    }
}

struct WriterState {
    dir: PathBuf,
    rate: u32,
    names: Box<dyn Fn(MemberId) -> Option<String> + Send>,
    mix: Track,
    you: Option<Track>,
    members: BTreeMap<MemberId, Track>,
    /// Frames written to every file.
    frames: u64,
    padded_frames: u64,
    scratch: Vec<f32>,
    mix_ch: usize,
    you_ch: usize,
}

impl WriterState {
    fn tracks(&mut self) -> impl Iterator<Item = &mut Track> {
        std::iter::once(&mut self.mix)
            .chain(self.you.as_mut())
            .chain(self.members.values_mut())
    }

    fn pad_all(&mut self, frames: u64) -> anyhow::Result<()> {
        for t in self.tracks() {
            t.silence(frames)
                .with_context(|| format!("writing {}", t.file.path.display()))?;
        }
        self.padded_frames += frames;
        self.frames += frames;
        Ok(())
    }

    /// Take `n` samples off the ring into the scratch buffer.
    fn take(&mut self, ring: &mut rtrb::Consumer<f32>, n: usize) -> anyhow::Result<()> {
        self.scratch.resize(n, 0.0);
        ring.pop_entire_slice(&mut self.scratch)
            .map_err(|_| anyhow::anyhow!("recording ring out of step (a bug)"))
    }

    fn write_block(&mut self, h: &BlockHeader, ring: &mut rtrb::Consumer<f32>) -> anyhow::Result<()> {
        if h.start > self.frames {
            self.pad_all(h.start - self.frames)?;
        }
        let frames = h.frames as usize;
        self.take(ring, frames * self.you_ch)?;
        if let Some(you) = &mut self.you {
            you.write(&self.scratch, self.you_ch)
                .with_context(|| format!("writing {}", you.file.path.display()))?;
        }
        self.take(ring, frames * self.mix_ch)?;
        self.mix
            .write(&self.scratch, self.mix_ch)
            .with_context(|| format!("writing {}", self.mix.file.path.display()))?;
        let mut written = [0 as MemberId; MAX_TRACKS];
        let mut n_written = 0;
        for &(member, ch) in h.members.iter().filter(|(_, ch)| *ch > 0) {
            let ch = usize::from(ch);
            self.take(ring, frames * ch)?;
            if written[..n_written].contains(&member) {
                // One member in two slots (never by the roster): its first slot counts.
                continue;
            }
            if !self.members.contains_key(&member) {
                let name = (self.names)(member).unwrap_or_else(|| "member".into());
                let path = self.dir.join(member_file_name(member, &name));
                let mut t = Track::create(&path, self.rate, ch, &name, Some(member))?;
                t.silence(self.frames)
                    .with_context(|| format!("writing {}", path.display()))?;
                self.members.insert(member, t);
            }
            if let Some(t) = self.members.get_mut(&member) {
                t.write(&self.scratch, ch)
                    .with_context(|| format!("writing {}", t.file.path.display()))?;
            }
            written[n_written] = member;
            n_written += 1;
        }
        for (id, t) in &mut self.members {
            if !written[..n_written].contains(id) {
                t.silence(frames as u64)
                    .with_context(|| format!("writing {}", t.file.path.display()))?;
            }
        }
        self.frames += frames as u64;
        Ok(())
    }

    fn finish(self, counters: &Counters, error: Option<String>) -> RecordSummary {
        let mut files = Vec::new();
        let mut error = error;
        let tracks = std::iter::once(self.mix)
            .chain(self.you)
            .chain(self.members.into_values());
        for t in tracks {
            if let Err(e) = t.writer.finalize() {
                error.get_or_insert_with(|| format!("finishing {}: {e}", t.file.path.display()));
            }
            files.push(t.file);
        }
        RecordSummary {
            dir: self.dir,
            rate: self.rate,
            frames: self.frames,
            files,
            dropped_blocks: counters.dropped_blocks.load(Ordering::Relaxed),
            dropped_frames: counters.dropped_frames.load(Ordering::Relaxed),
            padded_frames: self.padded_frames,
            error,
        }
    }
}

fn write_loop(
    mut state: WriterState,
    mut samples: rtrb::Consumer<f32>,
    mut blocks: rtrb::Consumer<BlockHeader>,
    counters: &Counters,
    stop: &AtomicBool,
) -> RecordSummary {
    let mut error = None;
    loop {
        // Read the flags before draining: whatever was pushed before them is written.
        let last = stop.load(Ordering::Acquire) || blocks.is_abandoned();
        let mut any = false;
        while let Ok(h) = blocks.pop() {
            any = true;
            if error.is_some() {
                // Keep the audio side's rings moving; the files are lost anyway.
                let n = samples.slots();
                if let Ok(c) = samples.read_chunk(n) {
                    c.commit_all();
                }
                continue;
            }
            if let Err(e) = state.write_block(&h, &mut samples) {
                tracing::warn!("recording stopped: {e:#}");
                error = Some(format!("{e:#}"));
            }
            counters.written_frames.store(state.frames, Ordering::Relaxed);
        }
        if last {
            break;
        }
        if !any {
            thread::sleep(WRITER_IDLE);
        }
    }
    state.finish(counters, error)
}

/// The writer thread of a recording (see the module docs).
#[derive(Debug)]
pub struct RecordWriter {
    thread: Option<JoinHandle<RecordSummary>>,
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    dir: PathBuf,
}

impl RecordWriter {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Periods dropped so far because the writer fell behind.
    pub fn dropped_blocks(&self) -> u64 {
        self.counters.dropped_blocks.load(Ordering::Relaxed)
    }

    /// Frames written to every file so far.
    pub fn written_frames(&self) -> u64 {
        self.counters.written_frames.load(Ordering::Relaxed)
    }

    /// Write what is queued, close every file and say what was written. Call once the
    /// audio thread has stopped (what it records after this is lost).
    pub fn finish(mut self) -> anyhow::Result<RecordSummary> {
        self.stop.store(true, Ordering::Release);
        let thread = self.thread.take().context("the recording was already finished")?;
        thread
            .join()
            .map_err(|_| anyhow::anyhow!("the recording thread panicked"))
    }
}

impl Drop for RecordWriter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_safe_file_names() {
        assert_eq!(member_file_name(2, "ana"), "02-ana.wav");
        assert_eq!(member_file_name(12, "../etc/passwd"), "12-etc_passwd.wav");
        assert_eq!(member_file_name(3, "Zoë Smith"), "03-Zoë_Smith.wav");
        assert_eq!(member_file_name(4, "///"), "04-member.wav");
        assert_eq!(sanitize_name(&"x".repeat(100)).len(), 40);
    }

    #[test]
    fn a_directory_with_a_recording_is_refused() {
        let dir = std::env::temp_dir().join(format!("netjam-record-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        prepare_dir(&dir).expect("fresh directory");
        std::fs::write(dir.join("mix.wav"), b"").expect("write");
        let e = prepare_dir(&dir).expect_err("refused");
        assert!(format!("{e:#}").contains("already holds a recording"), "{e:#}");
        let file = dir.join("mix.wav");
        let e = prepare_dir(&file).expect_err("a file is no directory");
        assert!(format!("{e:#}").contains("--record"), "{e:#}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
