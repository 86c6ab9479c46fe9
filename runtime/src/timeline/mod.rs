//! The timeline: an opt-in recorder of what the runtime did and when (flushes, plan lookups,
//! compiles, program runs, host copies, sync waits), written as a Chrome trace / Perfetto JSON
//! file (`DEFERFUSE_TRACE=path.json`, `dfuse_trace_start`/`dfuse_trace_stop`).
//!
//! Off, it costs one relaxed atomic load per hook ([`Timeline::on`]); the record path of an op
//! has no hook at all. On, events go to a ring buffer of a fixed number of events, so a long
//! run holds bounded memory: the oldest events are dropped, and the file says how many. The
//! log can read the same events (sources.rs): while it prints fusion cuts, each cut event
//! also prints the source line of the op it cut at.

mod capture;
mod control;
mod json;
pub(crate) mod label;
mod sources;

use crate::error::{Error, Result};
use deferfuse_fusion::{Binding, Region};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Instant;

pub use capture::CapturedRun;
pub use label::region_label;

/// Events a trace keeps when nobody said how many (`DEFERFUSE_TRACE_EVENTS`): about 40 MB.
pub const DEFAULT_EVENTS: usize = 1 << 18;

/// Where an event is drawn: one row ("thread") of the trace viewer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Track {
    /// Host work tied to no stream (a host copy, waiting for a value's producer).
    Host,
    /// What the host does for a stream, on the caller's thread: flushes, plan lookups,
    /// compiles, synchronizes.
    StreamHost(u64),
    /// The stream's programs in the order the stream runs them (on its worker, or on the
    /// caller at a waiting sync point).
    StreamDevice(u64),
    /// A CPU worker thread running programs of a wave side by side; numbered in order of
    /// first use.
    Worker(u64),
}

/// An argument value of an event (shown in the viewer's detail pane).
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    /// An unsigned integer.
    U(u64),
    /// A float.
    F(f64),
    /// A string.
    S(String),
    /// A boolean.
    B(bool),
}

/// One recorded event: a span (with a duration) or an instant (without).
#[derive(Clone, Debug)]
pub struct Event {
    /// The text the viewer shows on the event (a region's label, a step's name).
    pub name: String,
    /// The kind: `flush`, `plan`, `compile`, `run`, `wave`, `copy`, `wait`, `mark`.
    pub cat: &'static str,
    /// The row the event is drawn on.
    pub track: Track,
    /// Nanoseconds since the timeline was made.
    pub start_ns: u64,
    /// `None` for an instant.
    pub dur_ns: Option<u64>,
    /// Named values shown in the viewer's detail pane.
    pub args: Vec<(&'static str, Arg)>,
}

/// A region seen by a trace: its label and, for a loop, its Graphviz graph (a report page
/// draws it), written once per fingerprint.
struct RegionInfo {
    label: String,
    text: String,
    dot: Option<String>,
}

/// A running trace.
struct Session {
    path: PathBuf,
    cap: usize,
    events: VecDeque<Event>,
    dropped: u64,
    regions: BTreeMap<u128, RegionInfo>,
}

/// What stopping a trace wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceSummary {
    /// Events in the file.
    pub events: u64,
    /// Oldest events the ring buffer dropped to stay within its size.
    pub dropped: u64,
}

/// `Timeline::state` bits: a trace runs; program run time is summed for a profiler; program
/// runs are collected for a profiler (capture.rs); the log prints each cut's source line
/// (sources.rs).
const TRACING: u8 = 1;
const PROFILING: u8 = 2;
const CAPTURING: u8 = 4;
const LOGGING: u8 = 8;

/// The runtime's timeline recorder, and the device-time clock torch.profiler reads.
pub struct Timeline {
    /// [`TRACING`] | [`PROFILING`] | [`CAPTURING`] | [`LOGGING`]: one byte, so a hook's
    /// "anything to do?" is one load.
    state: AtomicU8,
    /// Nanoseconds programs ran, summed while [`PROFILING`] (see [`Timeline::busy_ns`]).
    busy: AtomicU64,
    session: Mutex<Option<Session>>,
    /// The runs collected for a profiler while [`CAPTURING`].
    capture: Mutex<Option<capture::Capture>>,
    /// The host's names of the source ids its tags carry (sources.rs).
    sources: Mutex<HashMap<u32, String>>,
    epoch: Instant,
}

static NEXT_WORKER: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's worker track number, given on first use.
    static WORKER: u64 = NEXT_WORKER.fetch_add(1, Ordering::Relaxed);
}

impl Default for Timeline {
    fn default() -> Self {
        Timeline {
            state: AtomicU8::new(0),
            busy: AtomicU64::new(0),
            session: Mutex::new(None),
            capture: Mutex::new(None),
            sources: Mutex::new(HashMap::new()),
            epoch: Instant::now(),
        }
    }
}

impl Timeline {
    /// Whether events are recorded (a trace runs, or the log prints cuts with their source
    /// lines): the one check every hook makes (a relaxed load).
    #[inline(always)]
    pub fn on(&self) -> bool {
        self.state.load(Ordering::Relaxed) & (TRACING | LOGGING) != 0
    }

    /// Whether a trace is running (a file will be written); the log alone does not count.
    #[inline(always)]
    pub fn tracing(&self) -> bool {
        self.state.load(Ordering::Relaxed) & TRACING != 0
    }

    /// Whether program runs are timed (a trace runs, or a profiler reads device time): the
    /// one check a prepared step makes. The log reads no run, so it does not time them.
    #[inline(always)]
    pub fn timing(&self) -> bool {
        self.state.load(Ordering::Relaxed) & !LOGGING != 0
    }

    /// Starts or stops summing program run time for [`Timeline::busy_ns`].
    pub fn set_profiling(&self, on: bool) {
        if on {
            self.state.fetch_or(PROFILING, Ordering::Relaxed);
        } else {
            self.state.fetch_and(!PROFILING, Ordering::Relaxed);
        }
    }

    /// Nanoseconds programs have run while profiling (each program of a wave counted whole):
    /// the device clock a profiler differences around each op.
    pub fn busy_ns(&self) -> u64 {
        self.busy.load(Ordering::Relaxed)
    }

    /// Nanoseconds since the timeline was made: the clock of every event.
    pub fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// The calling thread's worker track.
    pub fn worker_track() -> Track {
        Track::Worker(WORKER.with(|w| *w))
    }

    /// Starts a trace into `path`, keeping at most `max_events` events. The file is created
    /// now, so a path that cannot be written fails here rather than when the trace stops.
    pub fn start(&self, path: &Path, max_events: usize) -> Result<()> {
        let mut s = self.lock();
        if let Some(running) = &*s {
            return Err(Error::InvalidArgument(format!(
                "trace start: a trace into {} is running already; stop it first",
                running.path.display()
            )));
        }
        if max_events == 0 {
            return Err(Error::InvalidArgument(
                "trace start: max_events is 0; pass at least 1 (or the default)".into(),
            ));
        }
        std::fs::File::create(path).map_err(|e| {
            Error::InvalidArgument(format!(
                "trace start: cannot create {}: {e}; pass a writable file path",
                path.display()
            ))
        })?;
        *s = Some(Session {
            path: path.to_path_buf(),
            cap: max_events,
            events: VecDeque::with_capacity(max_events.min(4096)),
            dropped: 0,
            regions: BTreeMap::new(),
        });
        self.state.fetch_or(TRACING, Ordering::Relaxed);
        Ok(())
    }

    /// Stops the running trace and writes its file.
    pub fn stop(&self) -> Result<TraceSummary> {
        let mut s = self.lock();
        let session = s.take().ok_or_else(|| {
            Error::InvalidArgument(
                "trace stop: no trace is running; start one with trace start (or \
                 DEFERFUSE_TRACE)"
                    .into(),
            )
        })?;
        self.state.fetch_and(!TRACING, Ordering::Relaxed);
        drop(s);
        let text = json::chrome_trace(
            session.events.iter(),
            session.dropped,
            session.regions.iter().map(|(k, r)| json::RegionJson {
                fingerprint: *k,
                label: &r.label,
                text: &r.text,
                dot: r.dot.as_deref(),
            }),
        );
        std::fs::write(&session.path, text).map_err(|e| {
            Error::Internal(format!(
                "trace stop: writing {}: {e}",
                session.path.display()
            ))
        })?;
        Ok(TraceSummary {
            events: session.events.len() as u64,
            dropped: session.dropped,
        })
    }

    /// Adds an event (dropping the oldest when the ring is full); nothing when no trace runs.
    pub fn record(&self, ev: Event) {
        if let Some(s) = &mut *self.lock() {
            if s.events.len() == s.cap {
                s.events.pop_front();
                s.dropped += 1;
            }
            s.events.push_back(ev);
        }
    }

    /// A span from `start_ns` to now.
    pub fn span(
        &self,
        track: Track,
        cat: &'static str,
        name: impl Into<String>,
        start_ns: u64,
        args: Vec<(&'static str, Arg)>,
    ) {
        let end = self.now();
        self.record(Event {
            name: name.into(),
            cat,
            track,
            start_ns,
            dur_ns: Some(end.saturating_sub(start_ns)),
            args,
        });
    }

    /// An instant event now (a cut event also names its source, see sources.rs).
    pub fn instant(
        &self,
        track: Track,
        cat: &'static str,
        name: impl Into<String>,
        args: Vec<(&'static str, Arg)>,
    ) {
        let now = self.now();
        let mut ev = Event {
            name: name.into(),
            cat,
            track,
            start_ns: now,
            dur_ns: None,
            args,
        };
        if cat == "cut" {
            self.name_cut(&mut ev);
        }
        self.record(ev);
    }

    /// Notes a region that ran in this trace (its label, text and graph go into the file once
    /// per fingerprint, so a report can show what each program computes).
    pub fn note_region(&self, fingerprint: u128, region: &Region) {
        let mut s = self.lock();
        let Some(s) = &mut *s else { return };
        s.regions.entry(fingerprint).or_insert_with(|| RegionInfo {
            label: region_label(region),
            text: region.to_string(),
            dot: match region {
                Region::Loop(l) => Some(crate::dump::loop_dot(
                    deferfuse_cache::Fingerprint(fingerprint),
                    l,
                )),
                _ => None,
            },
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Session>> {
        self.session.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What a program run records about itself while a trace runs (made when the step is
/// prepared, so a run without a trace carries nothing).
pub struct RunTrace {
    /// Where the run is recorded.
    pub timeline: std::sync::Arc<Timeline>,
    /// The internal id of the stream the run belongs to.
    pub stream: u64,
    /// The region's label (its kind, shapes and ops); empty unless the timeline describes runs.
    pub label: String,
    /// The region's program fingerprint (the event's `region` argument).
    pub fingerprint: u128,
    /// Operand dtypes and sizes, inputs `->` outputs; empty unless the timeline describes runs.
    pub shapes: String,
    /// Bytes of all operands, inputs and outputs; 0 unless the timeline describes runs.
    pub bytes: u64,
    /// Threads the program may split its loops over (1 inside a wave).
    pub threads: usize,
    /// The host's tag on the thread that prepared the run ([`Timeline::set_tag`]).
    pub tag: u64,
}

impl RunTrace {
    /// Records the run that started at `start_ns` on `track`, and whether it failed; adds
    /// its time to the profiler's device clock.
    pub fn finish(&self, track: Track, start_ns: u64, ok: bool) {
        let tl = &self.timeline;
        let end = tl.now();
        let state = tl.state.load(Ordering::Relaxed);
        if state & PROFILING != 0 {
            tl.busy
                .fetch_add(end.saturating_sub(start_ns), Ordering::Relaxed);
        }
        if state & CAPTURING != 0 {
            tl.capture_run(self.stream, self.tag, &self.label, track, start_ns, end);
        }
        if !tl.tracing() {
            return;
        }
        let threads = if matches!(track, Track::Worker(_)) {
            1
        } else {
            self.threads
        };
        let args = vec![
            ("region", Arg::S(format!("{:032x}", self.fingerprint))),
            ("stream", Arg::U(self.stream)),
            ("shapes", Arg::S(self.shapes.clone())),
            ("bytes", Arg::U(self.bytes)),
            ("threads", Arg::U(threads as u64)),
            ("ok", Arg::B(ok)),
        ];
        tl.record(Event {
            name: self.label.clone(),
            cat: "run",
            track,
            start_ns,
            dur_ns: Some(end.saturating_sub(start_ns)),
            args,
        });
    }
}

/// What a program run's event says about its operands: shapes and dtypes (inputs, then
/// outputs) and the bytes they span.
pub fn binding_args(b: &Binding) -> (String, u64) {
    let mut shapes = String::new();
    let mut bytes = 0u64;
    for (i, t) in b.operands.iter().enumerate() {
        if i == b.n_inputs {
            shapes.push_str(" -> ");
        } else if i > 0 {
            shapes.push_str(", ");
        }
        shapes.push_str(&format!("{}{:?}", t.dtype, t.layout.sizes.as_slice()));
        bytes += (t.layout.numel() * t.dtype.size()) as u64;
    }
    (shapes, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("dfuse-timeline-{}-{name}", std::process::id()))
    }

    #[test]
    fn a_full_ring_drops_the_oldest_events_and_counts_them() {
        let t = Timeline::default();
        let p = tmp("ring.json");
        t.start(&p, 2).unwrap();
        for k in 0..5u64 {
            t.instant(Track::Host, "mark", format!("e{k}"), vec![]);
        }
        let s = t.stop().unwrap();
        assert_eq!(
            s,
            TraceSummary {
                events: 2,
                dropped: 3
            }
        );
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(
            text.contains("\"e4\"") && !text.contains("\"e2\""),
            "{text}"
        );
        assert!(text.contains("\"dropped_events\":3"), "{text}");
        let _ = std::fs::remove_file(p);
    }

    #[test]
    fn nothing_is_recorded_when_no_trace_runs() {
        let t = Timeline::default();
        assert!(!t.on());
        t.instant(Track::Host, "mark", "x", vec![]);
        assert!(t.stop().is_err(), "stop without start is an error");
    }

    #[test]
    fn a_second_start_while_running_is_an_error_naming_the_running_file() {
        let t = Timeline::default();
        let p = tmp("twice.json");
        t.start(&p, 8).unwrap();
        let e = t.start(&tmp("other.json"), 8).unwrap_err().to_string();
        assert!(e.contains("twice.json"), "{e}");
        t.stop().unwrap();
        let _ = std::fs::remove_file(p);
    }

    #[test]
    fn an_unwritable_path_fails_at_start() {
        let t = Timeline::default();
        let e = t
            .start(Path::new("/nonexistent-dir/x.json"), 8)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot create /nonexistent-dir/x.json"), "{e}");
        assert!(!t.on());
    }
}
