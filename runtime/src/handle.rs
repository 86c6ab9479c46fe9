//! Handle tables: opaque 64-bit handles that are checked, never trusted.
//!
//! A handle is `runtime tag << 48 | serial`. Serials are never reused, so a released handle can
//! never alias a newer object: using it is a clear "stale handle" error, not undefined behaviour.
//! The tag catches handles passed to the wrong runtime.

use crate::error::{Error, Result};
use dashmap::DashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// A tensor, stream or event handle as the C ABI passes it; 0 is null.
pub type Handle = u64;

static NEXT_TAG: AtomicU64 = AtomicU64::new(1);

/// A table of objects of one kind, keyed by handle, each with a reference count.
pub struct HandleTable<T> {
    kind: &'static str,
    tag: u64,
    next: AtomicU64,
    map: DashMap<Handle, (T, u32), ahash::RandomState>,
}

impl<T: Clone> HandleTable<T> {
    /// A table for objects called `kind` in messages; `tag` identifies the runtime.
    pub fn new(kind: &'static str, tag: u64) -> Self {
        HandleTable {
            kind,
            tag,
            next: AtomicU64::new(1),
            map: DashMap::with_hasher(ahash::RandomState::new()),
        }
    }

    /// A fresh tag for a new runtime (16 bits, never 0).
    pub fn new_tag() -> u64 {
        (NEXT_TAG.fetch_add(1, Ordering::Relaxed) % 0xffff) + 1
    }

    pub fn insert(&self, v: T) -> Handle {
        let h = (self.tag << 48) | self.next.fetch_add(1, Ordering::Relaxed);
        self.map.insert(h, (v, 1));
        h
    }

    fn bad(&self, h: Handle) -> Error {
        if h == 0 {
            Error::InvalidHandle(format!(
                "null {} handle (0); pass a handle returned by the runtime",
                self.kind
            ))
        } else if h >> 48 != self.tag {
            Error::InvalidHandle(format!(
                "{} handle {h:#x} belongs to another runtime (or is not a handle); use handles from the runtime that created them",
                self.kind
            ))
        } else {
            Error::InvalidHandle(format!(
                "{} handle {h:#x} is stale: it was released (or never existed); do not use a handle after its last release",
                self.kind
            ))
        }
    }

    pub fn get(&self, h: Handle) -> Result<T> {
        self.map
            .get(&h)
            .map(|e| e.0.clone())
            .ok_or_else(|| self.bad(h))
    }

    /// Replaces the object behind a live handle.
    pub fn update(&self, h: Handle, f: impl FnOnce(&mut T)) -> Result<()> {
        let mut e = self.map.get_mut(&h).ok_or_else(|| self.bad(h))?;
        f(&mut e.0);
        Ok(())
    }

    pub fn retain(&self, h: Handle) -> Result<()> {
        let mut e = self.map.get_mut(&h).ok_or_else(|| self.bad(h))?;
        e.1 =
            e.1.checked_add(1)
                .ok_or_else(|| Error::InvalidArgument("reference count overflow".into()))?;
        Ok(())
    }

    /// Drops one reference; the object goes away with the last one.
    pub fn release(&self, h: Handle) -> Result<()> {
        let last = {
            let mut e = self.map.get_mut(&h).ok_or_else(|| self.bad(h))?;
            e.1 -= 1;
            e.1 == 0
        };
        if last {
            self.map.remove(&h);
        }
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn values(&self) -> Vec<T> {
        self.map.iter().map(|e| e.0.clone()).collect()
    }
}
