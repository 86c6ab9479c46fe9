//! Buffers: 64-byte aligned host storage with a lifecycle (deferred -> executing ->
//! materialized). Storage is allocated when the first program that writes the buffer is
//! launched, so a value that is never written never costs memory.
//!
//! # Where a buffer's bytes live
//!
//! A buffer's value may also have a *device copy*: a backend (PJRT) keeps a program's result
//! on its device so the next region takes it without a round trip through the host, and keeps
//! an uploaded input so the next launch does not upload it again. The two copies form a
//! write-back cache with one rule: when a device copy exists it holds the current value, and
//! `host_stale` says whether the host bytes are older (a device program wrote the buffer last).
//! So every path that reads host bytes calls [`Buffer::host_coherent`] first (it writes a stale
//! value back), and every path that writes host bytes calls [`Buffer::host_written`] after
//! making the host coherent (the device copy no longer matches and is dropped). The CPU backend
//! never makes device copies; its launches only pay one atomic load per operand to see that.

use crate::alloc::{HostAllocator, Storage};
use crate::backend::DeviceValue;
use crate::checks::{Carried, DeviceCheck};
use crate::error::{Error, Result};
use crate::stream::Progress;
use deferfuse_fusion::BufferId;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// The last op that writes a buffer: which stream, and once launched, which job to wait for.
#[derive(Clone)]
pub struct Writer {
    /// The internal id of the stream the write was issued to ([`crate::stream::Stream::id`]).
    pub stream: u64,
    /// `None` while the write is still recorded in the stream's trace.
    pub done: Option<(Arc<Progress>, u64)>,
}

/// `Buffer::writer_stream` when nothing has written the buffer yet (stream ids start at 0).
const NO_WRITER: u64 = u64::MAX;

/// Set in `Buffer::writer_stream` once the last writer was launched (its job is in `writer`).
/// Without it the writer is still recorded and its stream id is all there is to know, so
/// recording a write (every deferred op does) is one store instead of a lock.
const LAUNCHED: u64 = 1 << 63;

/// Where a buffer is in its life.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferState {
    /// Written by ops still recorded in a trace; nothing has run.
    Deferred = 0,
    /// A program writing it is queued or running.
    Executing = 1,
    /// Its contents are final until the next write.
    Materialized = 2,
}

/// A buffer's device copy (see the module doc).
struct Resident {
    value: Arc<dyn DeviceValue>,
    /// The device copy is newer than the host bytes: write it back before a host read.
    host_stale: bool,
}

/// A buffer shared by every view of it and by the work that reads or writes it.
pub struct Buffer {
    /// The id the trace and the planner name this buffer by.
    pub id: BufferId,
    /// Size in bytes.
    pub len: usize,
    storage: OnceLock<Storage>,
    pool: Arc<HostAllocator>,
    /// Recorded-but-not-flushed ops writing this buffer.
    deferred_writes: AtomicU32,
    /// Launched-but-not-finished programs writing this buffer.
    inflight_writes: AtomicU32,
    /// The last launched writer; current only while `writer_stream` has [`LAUNCHED`] set.
    writer: Mutex<Option<Writer>>,
    /// The last writer's stream, with [`LAUNCHED`] once it was launched, or [`NO_WRITER`]: a
    /// lock-free answer to "did my own stream write this last?", which every recorded op asks
    /// of each operand, and the whole writer while it is only recorded.
    writer_stream: AtomicU64,
    /// Why the deferred op that should have written this buffer never ran (a flush failed
    /// before launching it): reported on every later use instead of reading stale memory.
    failure: Mutex<Option<Error>>,
    /// Whether `failure` may be `Some`: every recorded op checks each input, and almost none
    /// has failed.
    failed: AtomicBool,
    /// The device copy, if any.
    resident: Mutex<Option<Resident>>,
    /// Whether `resident` may be `Some`: a lock-free answer for the common case of a buffer
    /// that only lives on the host (every operand of every CPU launch asks).
    has_resident: AtomicBool,
    /// Device checks the value depends on that nobody has read yet (see `checks`).
    checks: Carried,
}

impl Buffer {
    /// A buffer of `len` bytes with no storage yet: its memory comes from `pool` at first use.
    pub fn new(id: BufferId, len: usize, pool: Arc<HostAllocator>) -> Buffer {
        Buffer {
            id,
            len,
            storage: OnceLock::new(),
            pool,
            deferred_writes: AtomicU32::new(0),
            inflight_writes: AtomicU32::new(0),
            writer: Mutex::new(None),
            writer_stream: AtomicU64::new(NO_WRITER),
            failure: Mutex::new(None),
            failed: AtomicBool::new(false),
            resident: Mutex::new(None),
            has_resident: AtomicBool::new(false),
            checks: Carried::default(),
        }
    }

    /// Empties a buffer nothing else holds, for [`Spares`]: its storage goes back to the pool
    /// and its lifecycle starts over.
    fn retire(&mut self) {
        drop(self.storage.take());
        *self.deferred_writes.get_mut() = 0;
        *self.inflight_writes.get_mut() = 0;
        *self.writer.get_mut().unwrap_or_else(|p| p.into_inner()) = None;
        *self.writer_stream.get_mut() = NO_WRITER;
        *self.failure.get_mut().unwrap_or_else(|p| p.into_inner()) = None;
        *self.failed.get_mut() = false;
        *self.resident.get_mut().unwrap_or_else(|p| p.into_inner()) = None;
        *self.has_resident.get_mut() = false;
        self.checks.clear();
    }

    /// Records that a write to this buffer was lost because its flush failed with `e`.
    pub fn fail(&self, e: &Error) {
        let why = |m: &String| format!("a deferred op writing this tensor never ran: {m}");
        let e = match e {
            Error::OutOfMemory(m) => Error::OutOfMemory(why(m)),
            Error::Backend(m) => Error::Backend(why(m)),
            Error::Internal(m) => Error::Internal(why(m)),
            other => other.clone(),
        };
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        f.get_or_insert(e);
        self.failed.store(true, Ordering::Release);
    }

    /// Forgets a recorded failure and the unread checks the value depended on: for a write
    /// that replaces every byte without reading any (a reload after an out-of-memory error),
    /// after which the value depends on nothing that was lost.
    pub fn clear_failure(&self) {
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        *f = None;
        self.failed.store(false, Ordering::Release);
        self.checks.forget();
    }

    /// The failure recorded by [`Buffer::fail`], if any.
    pub fn failure(&self) -> Result<()> {
        if !self.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        match &*self.failure.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Makes the value depend on `checks` too (it was computed from their program's results),
    /// until a sync point reads them (see `checks`).
    pub fn carry_checks(&self, checks: &[Arc<dyn DeviceCheck>]) {
        self.checks.add(checks);
    }

    /// The unread device checks the value depends on, for what is computed from it.
    pub fn carried_checks(&self) -> Vec<Arc<dyn DeviceCheck>> {
        self.checks.snapshot()
    }

    /// [`Buffer::failure`], after reading the device checks the value depends on: a failed
    /// one fails the buffer with its error, as if it had failed at its launch. For sync points
    /// and host routines; an op being recorded asks [`Buffer::failure`], which never waits
    /// for the device.
    pub fn resolve_checks(&self) -> Result<()> {
        if let Some(e) = self.checks.resolve()? {
            self.fail(&e);
        }
        self.failure()
    }

    /// [`Buffer::failure`], or the error of a device check the value depends on that was read
    /// already (a stream synchronize reads them): what an op recorded on the value reports,
    /// without waiting for the device.
    pub fn known_failure(&self) -> Result<()> {
        if let Some(e) = self.checks.known_failure() {
            self.fail(&e);
        }
        self.failure()
    }

    /// The storage, allocating it zero-filled on first use (a tensor never written reads as
    /// zeros).
    pub fn storage(&self) -> Result<&Storage> {
        self.storage_init(true)
    }

    /// The storage, allocating it with any contents on first use: for a first writer that
    /// overwrites every byte.
    pub fn storage_for_overwrite(&self) -> Result<&Storage> {
        self.storage_init(false)
    }

    fn storage_init(&self, zeroed: bool) -> Result<&Storage> {
        if let Some(s) = self.storage.get() {
            return Ok(s);
        }
        let s = self.pool.allocate(self.len, zeroed)?;
        Ok(self.storage.get_or_init(|| s))
    }

    /// True once storage exists (a buffer whose producer was fused away never allocates).
    pub fn is_allocated(&self) -> bool {
        self.storage.get().is_some()
    }

    /// Deferred while a recorded write is pending, executing while a launched one runs, else
    /// materialized.
    pub fn state(&self) -> BufferState {
        if self.deferred_writes.load(Ordering::Acquire) > 0 {
            BufferState::Deferred
        } else if self.inflight_writes.load(Ordering::Acquire) > 0 {
            BufferState::Executing
        } else {
            BufferState::Materialized
        }
    }

    /// The last op that writes this buffer; takes a lock only once that op was launched.
    pub fn writer(&self) -> Option<Writer> {
        let recorded = |v: u64| match v {
            NO_WRITER => Some(None),
            v if v & LAUNCHED == 0 => Some(Some(Writer {
                stream: v,
                done: None,
            })),
            _ => None,
        };
        if let Some(w) = recorded(self.writer_stream.load(Ordering::Acquire)) {
            return w;
        }
        let g = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        // Read again under the lock: a recorded write may have replaced the launched one.
        match recorded(self.writer_stream.load(Ordering::Acquire)) {
            Some(w) => w,
            None => g.clone(),
        }
    }

    /// Makes `w` the last op that writes this buffer: a recorded one is a single store, a
    /// launched one is kept under the lock with its job.
    pub fn set_writer(&self, w: Writer) {
        if w.done.is_none() {
            self.writer_stream.store(w.stream, Ordering::Release);
            return;
        }
        let mut g = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let stream = w.stream;
        *g = Some(w);
        self.writer_stream
            .store(stream | LAUNCHED, Ordering::Release);
    }

    /// Whether the last op that writes this buffer was issued to stream `stream` (lock-free:
    /// the common case of an op reading its own stream's results needs no ordering work).
    pub fn written_by(&self, stream: u64) -> bool {
        let v = self.writer_stream.load(Ordering::Acquire);
        v != NO_WRITER && v & !LAUNCHED == stream
    }

    /// A write to this buffer was recorded in a stream's trace.
    pub fn mark_recorded(&self) {
        self.deferred_writes.fetch_add(1, Ordering::AcqRel);
    }

    /// `n` recorded writes left the trace (launched, or dropped as dead).
    pub fn mark_flushed(&self, n: u32) {
        self.deferred_writes.fetch_sub(n, Ordering::AcqRel);
    }

    /// A program that writes this buffer was launched.
    pub fn mark_launched(&self) {
        self.inflight_writes.fetch_add(1, Ordering::AcqRel);
    }

    /// A launched program that writes this buffer finished.
    pub fn mark_done(&self) {
        self.inflight_writes.fetch_sub(1, Ordering::AcqRel);
    }

    fn resident_lock(&self) -> MutexGuard<'_, Option<Resident>> {
        self.resident.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a device copy exists (it may or may not be newer than the host bytes).
    pub fn is_resident(&self) -> bool {
        self.has_resident.load(Ordering::Acquire)
    }

    /// The device copy, if any. It holds the buffer's current value.
    pub fn device_copy(&self) -> Option<Arc<dyn DeviceValue>> {
        if !self.is_resident() {
            return None;
        }
        self.resident_lock().as_ref().map(|r| r.value.clone())
    }

    /// Makes `value` the buffer's device copy. `host_stale`: a device program just wrote the
    /// buffer (the host bytes are old until written back); false for a copy of the host bytes
    /// (an upload kept for the next launch).
    pub fn set_device_copy(&self, value: Arc<dyn DeviceValue>, host_stale: bool) {
        let mut r = self.resident_lock();
        *r = Some(Resident { value, host_stale });
        self.has_resident.store(true, Ordering::Release);
    }

    /// Replaces the device copy `old` by `new`, the same value in another form (a backend
    /// restaged it); the host bytes stay as stale as they were. Does nothing if the copy is no
    /// longer `old`.
    pub fn replace_device_copy(&self, old: &Arc<dyn DeviceValue>, new: Arc<dyn DeviceValue>) {
        let mut r = self.resident_lock();
        if let Some(res) = r.as_mut().filter(|r| Arc::ptr_eq(&r.value, old)) {
            res.value = new;
        }
    }

    /// Makes the host bytes current: writes a stale device copy back (the copy stays, now
    /// clean). Call before anything reads or partially writes the host storage; the buffer's
    /// writer must have finished.
    pub fn host_coherent(&self) -> Result<()> {
        if !self.is_resident() {
            return Ok(());
        }
        let mut r = self.resident_lock();
        let Some(res) = r.as_mut().filter(|r| r.host_stale) else {
            return Ok(());
        };
        let s = self.storage_for_overwrite()?;
        // SAFETY: the storage holds `self.len` bytes, and the stale flag (held under the lock)
        // means no one reads the host bytes until this write-back is done.
        let host = unsafe { std::slice::from_raw_parts_mut(s.ptr(), self.len) };
        res.value.copy_to_host(host)?;
        res.host_stale = false;
        Ok(())
    }

    /// The host bytes were (or are about to be) written: drops the device copy. The caller made
    /// the host coherent first unless the write covers every byte.
    pub fn host_written(&self) {
        if !self.is_resident() {
            return;
        }
        let old = {
            let mut r = self.resident_lock();
            self.has_resident.store(false, Ordering::Release);
            r.take()
        };
        // Freed outside the lock (a device free may wait for the device).
        drop(old);
    }
}

/// Emptied buffers kept for the next ops' outputs: a steady-state loop makes and drops one
/// buffer per recorded op, and taking a spare costs a short lock instead of an allocation
/// and a free (~300 instructions of malloc per op). Bounded by [`Spares::CAP`].
#[derive(Default)]
pub(crate) struct Spares(Mutex<Vec<Arc<Buffer>>>);

impl Spares {
    /// Most spares kept (each is a buffer record without storage, ~200 bytes).
    const CAP: usize = 4096;

    fn lock(&self) -> MutexGuard<'_, Vec<Arc<Buffer>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A spare made into a fresh buffer with `id` and `len`, if one is kept.
    pub(crate) fn take(&self, id: BufferId, len: usize) -> Option<Arc<Buffer>> {
        let mut b = self.lock().pop()?;
        let m = Arc::get_mut(&mut b).expect("a spare is held by nothing else");
        m.id = id;
        m.len = len;
        Some(b)
    }

    /// Keeps each buffer nothing else holds (up to the bound); the others are just dropped.
    pub(crate) fn give(&self, buffers: impl Iterator<Item = Arc<Buffer>>) {
        let mut spares = self.lock();
        for mut b in buffers {
            if spares.len() >= Self::CAP {
                continue;
            }
            if let Some(m) = Arc::get_mut(&mut b) {
                m.retire();
                spares.push(b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buffer(id: BufferId) -> Arc<Buffer> {
        Arc::new(Buffer::new(id, 64, HostAllocator::new(1 << 20)))
    }

    #[test]
    fn a_spare_comes_back_as_a_fresh_buffer_with_the_new_id_and_size() {
        let spares = Spares::default();
        let b = buffer(1);
        b.storage().unwrap();
        b.mark_recorded();
        b.set_writer(Writer {
            stream: 3,
            done: None,
        });
        b.fail(&Error::Backend("boom".into()));
        spares.give(std::iter::once(b));
        let b = spares.take(2, 128).expect("kept");
        assert_eq!((b.id, b.len), (2, 128));
        assert!(!b.is_allocated(), "its storage went back to the pool");
        assert_eq!(b.state(), BufferState::Materialized);
        assert!(b.writer().is_none() && !b.written_by(3));
        assert!(b.failure().is_ok());
        assert!(spares.take(3, 8).is_none());
    }

    #[test]
    fn the_last_writer_set_is_the_writer_whether_recorded_or_launched() {
        let b = buffer(1);
        assert!(b.writer().is_none() && !b.written_by(0));
        b.set_writer(Writer {
            stream: 2,
            done: Some((Arc::new(Progress::default()), 5)),
        });
        let w = b.writer().expect("launched writer");
        assert_eq!((w.stream, w.done.map(|d| d.1)), (2, Some(5)));
        assert!(b.written_by(2));
        b.set_writer(Writer {
            stream: 3,
            done: None,
        });
        let w = b.writer().expect("recorded writer");
        assert_eq!((w.stream, w.done.is_none()), (3, true));
        assert!(b.written_by(3) && !b.written_by(2));
    }

    #[test]
    fn a_buffer_something_else_holds_is_not_kept() {
        let spares = Spares::default();
        let b = buffer(1);
        let held = b.clone();
        spares.give(std::iter::once(b));
        assert!(spares.take(2, 8).is_none());
        assert_eq!(held.id, 1);
    }
}
