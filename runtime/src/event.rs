//! Events: a recorded point in a stream ("everything issued to it so far"), and, for an event
//! created with timing, the host time at which the stream's worker reached that point, so two
//! events give the time between them (`torch.Event(enable_timing=True).elapsed_time`).

use crate::error::{Error, Result};
use crate::stream::{EventPoint, Stream};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// What an event handle holds.
#[derive(Clone, Default)]
pub struct EventState {
    /// Created with timing: each record also stamps the time the stream reaches the point.
    pub timing: bool,
    /// The last recorded point; `None` until the first record (an unrecorded event counts as
    /// complete, as in CUDA).
    pub point: Option<EventPoint>,
    /// Set by the stream's worker when it reaches the point (timing events only).
    stamp: Option<Arc<OnceLock<Instant>>>,
}

impl EventState {
    /// A new, unrecorded event.
    pub fn new(timing: bool) -> EventState {
        EventState {
            timing,
            ..EventState::default()
        }
    }

    /// Records the point after everything issued to `s` so far. A timing event queues a job
    /// that stamps the time when the worker gets there, so the stamp measures when the stream
    /// finished the earlier work, not when the host recorded the event.
    pub fn record(&mut self, s: &Stream) {
        self.stamp = self.timing.then(|| {
            let stamp = Arc::new(OnceLock::new());
            let set = stamp.clone();
            s.launch(Box::new(move || {
                let _ = set.set(Instant::now());
                Ok(())
            }));
            stamp
        });
        self.point = Some(EventPoint {
            stream: s.id,
            progress: s.progress.clone(),
            seq: s.last_seq(),
        });
    }

    /// Blocks until the point is reached (at once for an unrecorded event).
    pub fn wait(&self) {
        if let Some(p) = &self.point {
            p.progress.wait(p.seq);
        }
    }

    /// Milliseconds from `start`'s point to `end`'s (negative when `end` was reached first),
    /// waiting for both. Both must be timing events that were recorded.
    pub fn elapsed_ms(start: &EventState, end: &EventState) -> Result<f64> {
        for (e, which) in [(start, "start"), (end, "end")] {
            if !e.timing {
                return Err(Error::InvalidArgument(format!(
                    "elapsed_time: the {which} event was created without timing; create both \
                     events with timing enabled (torch.Event(enable_timing=True))"
                )));
            }
            if e.point.is_none() {
                return Err(Error::InvalidArgument(format!(
                    "elapsed_time: the {which} event was never recorded; record both events \
                     before asking for the time between them"
                )));
            }
        }
        start.wait();
        end.wait();
        let at = |e: &EventState| {
            e.stamp
                .as_ref()
                .and_then(|s| s.get().copied())
                .ok_or_else(|| {
                    Error::Internal("elapsed_time: a completed timing event has no time".into())
                })
        };
        let (a, b) = (at(start)?, at(end)?);
        Ok(if b >= a {
            (b - a).as_secs_f64() * 1e3
        } else {
            -((a - b).as_secs_f64() * 1e3)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::Pacing;

    #[test]
    fn elapsed_time_between_two_timing_events_covers_the_work_between_them() {
        let s = Stream::new(1, Pacing::SHARED).unwrap();
        let (mut a, mut b) = (EventState::new(true), EventState::new(true));
        a.record(&s);
        s.launch(Box::new(|| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            Ok(())
        }));
        b.record(&s);
        let ms = EventState::elapsed_ms(&a, &b).unwrap();
        assert!(ms >= 19.0, "{ms} ms");
        assert!(EventState::elapsed_ms(&b, &a).unwrap() <= -19.0);
    }

    #[test]
    fn elapsed_time_needs_timing_and_recorded_events() {
        let s = Stream::new(1, Pacing::SHARED).unwrap();
        let (mut plain, mut timed) = (EventState::new(false), EventState::new(true));
        let unrecorded = EventState::new(true);
        plain.record(&s);
        timed.record(&s);
        let e = EventState::elapsed_ms(&plain, &timed)
            .unwrap_err()
            .to_string();
        assert!(e.contains("without timing"), "{e}");
        let e = EventState::elapsed_ms(&timed, &unrecorded)
            .unwrap_err()
            .to_string();
        assert!(e.contains("never recorded"), "{e}");
    }

    #[test]
    fn an_event_without_timing_queues_no_work() {
        let s = Stream::new(1, Pacing::SHARED).unwrap();
        let mut e = EventState::new(false);
        e.record(&s);
        assert_eq!(s.last_seq(), 0);
    }
}
