//! The runtime's streams and events: creating and destroying them, synchronizing a stream or
//! every stream, and recording, waiting on, querying and timing events (like CUDA's).

use super::Runtime;
use crate::error::{Error, Result};
use crate::event::EventState;
use crate::handle::Handle;
use crate::stats::SyncReason;
use crate::stream::Stream;
use crate::timeline::Track;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Runtime {
    /// The stream ops go to when the caller passes 0.
    pub fn default_stream(&self) -> Handle {
        self.default_stream
    }

    /// The stream `h` names, borrowed where it can be: the default stream is the runtime's own,
    /// so a recorded op on it takes no reference (two atomic ops); another stream is looked up
    /// into `slot`.
    pub(crate) fn stream_ref<'a>(
        &'a self,
        h: Handle,
        slot: &'a mut Option<Arc<Stream>>,
    ) -> Result<&'a Arc<Stream>> {
        if h == 0 || h == self.default_stream {
            return Ok(&self.default_stream_ref);
        }
        Ok(slot.insert(self.streams.get(h)?))
    }

    pub(crate) fn stream(&self, h: Handle) -> Result<Arc<Stream>> {
        if h == 0 || h == self.default_stream {
            return Ok(self.default_stream_ref.clone());
        }
        self.streams.get(h)
    }

    /// The live stream with internal id `id` (a buffer's writer), if it still exists.
    pub(crate) fn stream_by_id(&self, id: u64) -> Option<Arc<Stream>> {
        self.streams.values().into_iter().find(|s| s.id == id)
    }

    /// A new stream with its own trace, queue and worker thread.
    pub fn create_stream(&self) -> Result<Handle> {
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        self.streams.insert(Arc::new(Stream::new(id, self.pacing)?))
    }

    /// Flushes and waits for the stream's work, then forgets it.
    pub fn destroy_stream(&self, h: Handle) -> Result<()> {
        if h == 0 || h == self.default_stream {
            return Err(Error::InvalidArgument(
                "the default stream cannot be destroyed".into(),
            ));
        }
        let s = self.streams.get(h)?;
        self.flush(&s, SyncReason::Synchronize)?;
        let r = s.synchronize();
        self.streams.release(h)?;
        r
    }

    /// Runs everything pending on the stream and waits for it; reports the first async error.
    pub fn synchronize(&self, stream: Handle) -> Result<()> {
        let s = self.stream(stream)?;
        self.flush(&s, SyncReason::Synchronize)?;
        self.wait_stream(&s)
    }

    /// Waits for everything launched on `s` (a span on its host track while tracing).
    /// The backend's device checks are read here too (a synchronize is a sync point).
    fn wait_stream(&self, s: &Stream) -> Result<()> {
        if !self.timeline.on() {
            s.synchronize()?;
            return self.exec.backend.read_device_checks();
        }
        let t0 = self.timeline.now();
        let r = s.synchronize();
        self.timeline
            .span(Track::StreamHost(s.id), "wait", "synchronize", t0, vec![]);
        r?;
        self.exec.backend.read_device_checks()
    }

    /// True once everything issued to the stream has completed; pending deferred work is
    /// flushed (not waited for) first, so a caller polling this makes progress.
    pub fn query_stream(&self, stream: Handle) -> Result<bool> {
        let s = self.stream(stream)?;
        self.flush(&s, SyncReason::Event)?;
        Ok(s.progress.completed() >= s.last_seq())
    }

    /// Synchronizes every stream.
    pub fn synchronize_all(&self) -> Result<()> {
        let mut first = Ok(());
        for s in self.streams.values() {
            let r = self
                .flush(&s, SyncReason::Synchronize)
                .and_then(|_| self.wait_stream(&s));
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// A new, unrecorded event. Fails only when the runtime holds its maximum of live events.
    pub fn create_event(&self) -> Result<Handle> {
        self.events.insert(EventState::new(false))
    }

    /// A new, unrecorded event that also keeps the time each record is reached, for
    /// [`Runtime::event_elapsed_ms`] (a record then queues one small job on the stream).
    pub fn create_timing_event(&self) -> Result<Handle> {
        self.events.insert(EventState::new(true))
    }

    /// Drops one reference to the event; it goes away with the last one.
    pub fn destroy_event(&self, e: Handle) -> Result<()> {
        self.events.release(e)
    }

    /// Marks the point after everything issued to `stream` so far (flushing its trace).
    pub fn record_event(&self, e: Handle, stream: Handle) -> Result<()> {
        let s = self.stream(stream)?;
        self.events.get(e)?;
        self.flush(&s, SyncReason::Event)?;
        self.events.update(e, |ev| ev.record(&s))
    }

    /// Makes `stream` wait (on its worker, not the host) until the event's point is reached.
    pub fn wait_event(&self, stream: Handle, e: Handle) -> Result<()> {
        let s = self.stream(stream)?;
        if let Some(p) = self.events.get(e)?.point {
            self.flush(&s, SyncReason::Event)?;
            s.wait_for(&p.progress, p.seq);
        }
        Ok(())
    }

    /// True once the event's point is reached (an unrecorded event counts as reached).
    pub fn query_event(&self, e: Handle) -> Result<bool> {
        Ok(self
            .events
            .get(e)?
            .point
            .is_none_or(|p| p.progress.completed() >= p.seq))
    }

    /// Blocks the host until the event's point is reached; a sync point, so the backend's
    /// device checks are read too (see `checks`).
    pub fn synchronize_event(&self, e: Handle) -> Result<()> {
        self.events.get(e)?.wait();
        self.exec.backend.read_device_checks()
    }

    /// Milliseconds between two recorded timing events' points, waiting for both.
    pub fn event_elapsed_ms(&self, start: Handle, end: Handle) -> Result<f64> {
        EventState::elapsed_ms(&self.events.get(start)?, &self.events.get(end)?)
    }
}
