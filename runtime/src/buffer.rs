//! Buffers: 64-byte aligned host storage with a lifecycle (deferred -> executing ->
//! materialized). Storage is allocated when the first program that writes the buffer is
//! launched, so a value that is never written never costs memory.

use crate::alloc::{HostAllocator, Storage};
use crate::error::{Error, Result};
use crate::stream::Progress;
use deferfuse_fusion::BufferId;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// The last op that writes a buffer: which stream, and once launched, which job to wait for.
#[derive(Clone)]
pub struct Writer {
    pub stream: u64,
    /// `None` while the write is still recorded in the stream's trace.
    pub done: Option<(Arc<Progress>, u64)>,
}

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

/// A buffer shared by every view of it and by the work that reads or writes it.
pub struct Buffer {
    pub id: BufferId,
    /// Size in bytes.
    pub len: usize,
    storage: OnceLock<Storage>,
    pool: Arc<HostAllocator>,
    /// Recorded-but-not-flushed ops writing this buffer.
    deferred_writes: AtomicU32,
    /// Launched-but-not-finished programs writing this buffer.
    inflight_writes: AtomicU32,
    writer: Mutex<Option<Writer>>,
    /// Why the deferred op that should have written this buffer never ran (a flush failed
    /// before launching it): reported on every later use instead of reading stale memory.
    failure: Mutex<Option<Error>>,
}

impl Buffer {
    pub fn new(id: BufferId, len: usize, pool: Arc<HostAllocator>) -> Buffer {
        Buffer {
            id,
            len,
            storage: OnceLock::new(),
            pool,
            deferred_writes: AtomicU32::new(0),
            inflight_writes: AtomicU32::new(0),
            writer: Mutex::new(None),
            failure: Mutex::new(None),
        }
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
    }

    /// The failure recorded by [`Buffer::fail`], if any.
    pub fn failure(&self) -> Result<()> {
        match &*self.failure.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
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

    pub fn state(&self) -> BufferState {
        if self.deferred_writes.load(Ordering::Acquire) > 0 {
            BufferState::Deferred
        } else if self.inflight_writes.load(Ordering::Acquire) > 0 {
            BufferState::Executing
        } else {
            BufferState::Materialized
        }
    }

    pub fn writer(&self) -> Option<Writer> {
        self.writer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn set_writer(&self, w: Writer) {
        *self.writer.lock().unwrap_or_else(|p| p.into_inner()) = Some(w);
    }

    pub fn mark_recorded(&self) {
        self.deferred_writes.fetch_add(1, Ordering::AcqRel);
    }

    /// A recorded write left the trace (launched, or dropped as dead).
    pub fn mark_flushed(&self) {
        self.deferred_writes.fetch_sub(1, Ordering::AcqRel);
    }

    pub fn mark_launched(&self) {
        self.inflight_writes.fetch_add(1, Ordering::AcqRel);
    }

    pub fn mark_done(&self) {
        self.inflight_writes.fetch_sub(1, Ordering::AcqRel);
    }
}
