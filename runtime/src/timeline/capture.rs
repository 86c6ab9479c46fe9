//! Program runs collected for a profiler (torch.profiler's device activities): each run's
//! stream, start, duration, region label and the host's correlation tag, the number the host
//! set on the calling thread ([`Timeline::set_tag`]) when the run was prepared. torch.profiler
//! links a device activity to the aten op that launched it by that number.
//!
//! Off, it costs nothing beyond the timeline's one state load; on, a run costs a lock and a
//! push. At most a fixed number of runs is kept (the oldest dropped), so a long profile holds
//! bounded memory.

use super::{Timeline, Track, CAPTURING};
use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

/// One program run, as a profiler shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapturedRun {
    /// The stream whose work the run was.
    pub stream: u64,
    /// The CPU worker that ran it inside a wave, or `None` on the stream's own track.
    pub worker: Option<u64>,
    /// The host's tag on the thread that prepared the run (0: none was set).
    pub tag: u64,
    /// Start, in nanoseconds since the Unix epoch (the clock torch.profiler's events use).
    pub start_unix_ns: i64,
    /// Duration, in nanoseconds.
    pub dur_ns: u64,
    /// The region's label (its kind, shapes and ops).
    pub label: String,
}

/// A running capture.
pub(super) struct Capture {
    cap: usize,
    runs: VecDeque<CapturedRun>,
    dropped: u64,
    /// The Unix time of timeline instant `anchor_ns`: converts the timeline's monotonic clock.
    anchor_unix_ns: i64,
    anchor_ns: u64,
}

thread_local! {
    /// The host's correlation tag on this thread (see [`Timeline::set_tag`]).
    static TAG: Cell<u64> = const { Cell::new(0) };
}

impl Timeline {
    /// Whether runs are collected for a profiler.
    #[inline(always)]
    pub fn capturing(&self) -> bool {
        self.state.load(Ordering::Relaxed) & CAPTURING != 0
    }

    /// Whether a run must describe itself (its label): a trace or a capture wants it.
    #[inline(always)]
    pub fn describes(&self) -> bool {
        self.tracing() || self.capturing()
    }

    /// Starts collecting runs, keeping at most `max_runs` (the oldest dropped beyond); runs
    /// collected before and not taken are discarded.
    pub fn capture_start(&self, max_runs: usize) {
        let now = self.now();
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as i64)
            .unwrap_or(0);
        *self.capture_lock() = Some(Capture {
            cap: max_runs.max(1),
            runs: VecDeque::new(),
            dropped: 0,
            anchor_unix_ns: unix,
            anchor_ns: now,
        });
        self.state.fetch_or(CAPTURING, Ordering::Relaxed);
    }

    /// Stops collecting; the runs collected stay until taken. Returns how many were dropped
    /// to stay within the capture's size.
    pub fn capture_stop(&self) -> u64 {
        self.state.fetch_and(!CAPTURING, Ordering::Relaxed);
        self.capture_lock().as_ref().map_or(0, |c| c.dropped)
    }

    /// Removes and returns up to `max` of the collected runs, oldest first.
    pub fn capture_take(&self, max: usize) -> Vec<CapturedRun> {
        match &mut *self.capture_lock() {
            Some(c) => {
                let n = max.min(c.runs.len());
                c.runs.drain(..n).collect()
            }
            None => Vec::new(),
        }
    }

    /// Sets the calling thread's tag, which runs prepared on this thread from now on carry:
    /// torch.profiler sets the correlation id of the op it is in.
    pub fn set_tag(tag: u64) {
        TAG.with(|t| t.set(tag));
    }

    /// The calling thread's tag.
    pub fn tag() -> u64 {
        TAG.with(|t| t.get())
    }

    /// Adds a run that went from timeline instant `start_ns` to `end_ns`.
    pub(super) fn capture_run(
        &self,
        stream: u64,
        tag: u64,
        label: &str,
        track: Track,
        start_ns: u64,
        end_ns: u64,
    ) {
        let mut guard = self.capture_lock();
        let Some(c) = &mut *guard else { return };
        if c.runs.len() == c.cap {
            c.runs.pop_front();
            c.dropped += 1;
        }
        let since_anchor = start_ns as i64 - c.anchor_ns as i64;
        c.runs.push_back(CapturedRun {
            stream,
            worker: match track {
                Track::Worker(w) => Some(w),
                _ => None,
            },
            tag,
            start_unix_ns: c.anchor_unix_ns + since_anchor,
            dur_ns: end_ns.saturating_sub(start_ns),
            label: label.to_string(),
        });
    }

    fn capture_lock(&self) -> std::sync::MutexGuard<'_, Option<Capture>> {
        self.capture.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_captured_before_a_capture_starts() {
        let t = Timeline::default();
        t.capture_run(0, 0, "x", Track::StreamDevice(0), 0, 10);
        assert!(!t.capturing());
        assert!(t.capture_take(10).is_empty());
    }

    #[test]
    fn a_captured_run_carries_its_stream_tag_worker_and_unix_start() {
        let t = Timeline::default();
        let before = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i64;
        t.capture_start(8);
        let s = t.now();
        t.capture_run(3, 42, "loop f32[4]", Track::Worker(1), s, s + 500);
        assert_eq!(t.capture_stop(), 0);
        let runs = t.capture_take(8);
        assert_eq!(runs.len(), 1);
        let r = &runs[0];
        assert_eq!((r.stream, r.tag, r.worker, r.dur_ns), (3, 42, Some(1), 500));
        assert_eq!(r.label, "loop f32[4]");
        assert!(r.start_unix_ns >= before, "{} < {before}", r.start_unix_ns);
        assert!(t.capture_take(8).is_empty(), "taken runs are gone");
    }

    #[test]
    fn a_full_capture_drops_the_oldest_runs_and_counts_them() {
        let t = Timeline::default();
        t.capture_start(2);
        for k in 0..5u64 {
            t.capture_run(0, k, "r", Track::StreamDevice(0), k, k + 1);
        }
        assert_eq!(t.capture_stop(), 3);
        let tags: Vec<u64> = t.capture_take(10).iter().map(|r| r.tag).collect();
        assert_eq!(tags, vec![3, 4]);
    }

    #[test]
    fn take_returns_at_most_the_number_asked_for_oldest_first() {
        let t = Timeline::default();
        t.capture_start(8);
        for k in 0..3u64 {
            t.capture_run(0, k, "r", Track::StreamDevice(0), k, k + 1);
        }
        t.capture_stop();
        assert_eq!(t.capture_take(2).len(), 2);
        assert_eq!(t.capture_take(2)[0].tag, 2);
    }

    #[test]
    fn the_tag_is_per_thread() {
        Timeline::set_tag(7);
        let other = std::thread::spawn(Timeline::tag).join().unwrap();
        assert_eq!((Timeline::tag(), other), (7, 0));
        Timeline::set_tag(0);
    }
}
