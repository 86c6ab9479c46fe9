//! Checks a device program computed whose outcome is read at the next sync point instead of
//! right after the launch: XLA cannot raise on a bad index, so a program with a gather or
//! scatter returns its bounds checks as a small result, and reading that result after every
//! launch would cost a device round trip per program on a GPU or TPU.
//!
//! Until it is read, a check travels with every value computed from it: a buffer the program
//! wrote *carries* the check, and so does every buffer a later program computes from a
//! carrying buffer (the executor passes input checks on to outputs, `wave`). A sync point that
//! reads a buffer (`Runtime::wait_written`) and a host routine about to compute on host bytes
//! (`HostProgram`) resolve what the buffer carries: a failed check fails the buffer with its
//! error, exactly as an eager failure at launch would have (`Buffer::fail`), and a check known
//! to have passed is no longer carried. A host wait (a stream or event synchronize) reads every
//! check of the programs that ran (`Backend::read_device_checks`), so an op recorded after it
//! on a value computed from a bad index is refused at record time, as when the check was read
//! at launch. Between a launch and the next sync point such an op is recorded and runs, and its
//! value fails with the index error where it is read (the CPU backend, which raises at launch,
//! refuses it at record time once the launch has run). The CPU backend's programs raise at launch and never
//! make one; its launches pay one atomic load per operand to see that none is carried.

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// A check whose outcome lives on a device until it is read.
pub trait DeviceCheck: Send + Sync {
    /// The error it reports when it failed, `None` when it passed; the first call reads the
    /// result from the device (an `Err` is that read failing).
    fn outcome(&self) -> Result<Option<Error>>;
    /// The outcome if it was read already (`Some(None)`: it passed, and no longer needs to
    /// travel with values); `None` while it is on the device.
    fn known(&self) -> Option<Option<Error>>;
}

fn passed(c: &Arc<dyn DeviceCheck>) -> bool {
    matches!(c.known(), Some(None))
}

/// The unread checks a buffer's value depends on, in the order they reached it: when several
/// failed, the first one is the error, as the first failure recorded on a buffer is.
#[derive(Default)]
pub struct Carried {
    list: Mutex<Vec<Arc<dyn DeviceCheck>>>,
    /// Whether `list` may be non-empty: the lock-free answer for the usual buffer, which
    /// carries nothing.
    any: AtomicBool,
}

impl Carried {
    fn lock(&self) -> MutexGuard<'_, Vec<Arc<dyn DeviceCheck>>> {
        self.list.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether anything may be carried.
    pub fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    /// Adds `checks` after those already carried; a check carried already keeps its place,
    /// and checks known to have passed are dropped (a loop's weights would otherwise collect
    /// one per step).
    pub fn add(&self, checks: &[Arc<dyn DeviceCheck>]) {
        if checks.is_empty() {
            return;
        }
        let mut list = self.lock();
        list.retain(|c| !passed(c));
        for c in checks {
            if !passed(c) && !list.iter().any(|x| Arc::ptr_eq(x, c)) {
                list.push(c.clone());
            }
        }
        self.any.store(!list.is_empty(), Ordering::Release);
    }

    /// What is carried now, for a value computed from this one.
    pub fn snapshot(&self) -> Vec<Arc<dyn DeviceCheck>> {
        if !self.any() {
            return Vec::new();
        }
        self.lock().clone()
    }

    /// Reads every carried check and carries nothing more; the first failed one's error.
    pub fn resolve(&self) -> Result<Option<Error>> {
        if !self.any() {
            return Ok(None);
        }
        let mut list = self.lock();
        let mut first = None;
        for c in list.iter() {
            if let Some(e) = c.outcome()? {
                first = Some(e);
                break;
            }
        }
        list.clear();
        self.any.store(false, Ordering::Release);
        Ok(first)
    }

    /// The first failed check among those read already, without reading any: what a value
    /// known to be bad reports when an op is recorded on it. A check still on the device
    /// ahead of it may fail first, so the answer stops there.
    pub fn known_failure(&self) -> Option<Error> {
        if !self.any() {
            return None;
        }
        for c in self.lock().iter() {
            match c.known() {
                Some(Some(e)) => return Some(e),
                Some(None) => {}
                None => return None,
            }
        }
        None
    }

    /// Forgets every check without reading it (the value no longer depends on them).
    pub fn forget(&self) {
        if self.any() {
            self.lock().clear();
            self.any.store(false, Ordering::Release);
        }
    }

    /// Forgets everything (the buffer starts a new life).
    pub fn clear(&mut self) {
        self.list
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        *self.any.get_mut() = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A check with a fixed outcome that counts its device reads.
    struct Fixed {
        error: Option<&'static str>,
        reads: AtomicUsize,
    }

    impl DeviceCheck for Fixed {
        fn outcome(&self) -> Result<Option<Error>> {
            self.reads.fetch_add(1, Ordering::Relaxed);
            Ok(self.error.map(|m| Error::IndexOutOfBounds(m.into())))
        }
        fn known(&self) -> Option<Option<Error>> {
            (self.reads.load(Ordering::Relaxed) > 0)
                .then(|| self.error.map(|m| Error::IndexOutOfBounds(m.into())))
        }
    }

    /// Adds `checks` to `c` (as the trait objects values carry).
    fn carry(c: &Carried, checks: &[&Arc<Fixed>]) {
        let v: Vec<Arc<dyn DeviceCheck>> = checks.iter().map(|&x| x.clone() as _).collect();
        c.add(&v);
    }

    fn check(error: Option<&'static str>) -> Arc<Fixed> {
        Arc::new(Fixed {
            error,
            reads: AtomicUsize::new(0),
        })
    }

    #[test]
    fn the_first_failed_check_to_reach_a_value_is_its_error() {
        let c = Carried::default();
        let (ok, a, b) = (check(None), check(Some("a")), check(Some("b")));
        carry(&c, &[&ok, &a]);
        carry(&c, &[&b, &a]);
        let e = c.resolve().unwrap().expect("a check failed");
        assert_eq!(e.to_string(), "a");
        assert!(!c.any(), "resolved checks are no longer carried");
        assert_eq!(
            b.reads.load(Ordering::Relaxed),
            0,
            "nothing after the first failure"
        );
    }

    #[test]
    fn a_failure_read_already_is_known_unless_an_unread_check_comes_first() {
        let c = Carried::default();
        let (unread, bad) = (check(Some("first")), check(Some("second")));
        bad.outcome().unwrap();
        carry(&c, &[&bad]);
        assert_eq!(
            c.known_failure().map(|e| e.to_string()).as_deref(),
            Some("second")
        );
        let c = Carried::default();
        carry(&c, &[&unread, &bad]);
        assert!(c.known_failure().is_none(), "the unread one may fail first");
        assert_eq!(unread.reads.load(Ordering::Relaxed), 0, "nothing was read");
    }

    #[test]
    fn checks_known_to_have_passed_stop_travelling() {
        let c = Carried::default();
        let ok = check(None);
        carry(&c, &[&ok]);
        assert_eq!(c.resolve().unwrap().map(|e| e.to_string()), None);
        carry(&c, &[&ok]);
        assert!(!c.any() && c.snapshot().is_empty());
    }
}
