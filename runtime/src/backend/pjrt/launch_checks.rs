//! A whole program's bounds checks (`graph_kernel`), left on the device after the launch and
//! read when a sync point needs one (`crate::checks`): on a GPU or TPU, reading them after
//! every launch would be a device round trip per program. The launches not read yet are also
//! listed (`Unread`), for a stream synchronize to read them all.

use super::client::DeviceBuffer;
use super::graph_kernel::{Check, CHECK_WORDS};
use super::PjrtCounters;
use crate::backend::host_kernels::out_of_bounds;
use crate::checks::DeviceCheck;
use crate::error::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// Where one launch's check result is.
enum State {
    /// The module's check result, not read yet.
    OnDevice(DeviceBuffer),
    /// Read: per check, the host routine's error when it failed.
    Read(Vec<Option<Error>>),
}

/// The checks of one launch and their result.
pub struct LaunchChecks {
    checks: Vec<Check>,
    state: Mutex<State>,
    counters: Arc<PjrtCounters>,
}

impl LaunchChecks {
    /// The checks `checks` of a launch whose check result is `flags`.
    pub fn new(checks: Vec<Check>, flags: DeviceBuffer, counters: Arc<PjrtCounters>) -> Self {
        LaunchChecks {
            checks,
            state: Mutex::new(State::OnDevice(flags)),
            counters,
        }
    }

    /// Check `index` of this launch, to carry with the values computed from it.
    pub fn check(self: &Arc<Self>, index: usize) -> Arc<dyn DeviceCheck> {
        Arc::new(OneCheck {
            launch: self.clone(),
            index,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Downloads the result once (it is small: [`CHECK_WORDS`] i64s per check) and keeps the
    /// errors it says.
    fn read(&self, state: &mut State) -> Result<()> {
        let State::OnDevice(flags) = &*state else {
            return Ok(());
        };
        let mut bytes = vec![0u8; self.checks.len() * CHECK_WORDS * 8];
        flags.download(&mut bytes)?;
        self.counters.downloads.fetch_add(1, Ordering::Relaxed);
        let word =
            |i: usize| i64::from_ne_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        let errors = self
            .checks
            .iter()
            .enumerate()
            .map(|(k, c)| {
                (word(k * CHECK_WORDS) != 0)
                    .then(|| out_of_bounds(c.op, word(k * CHECK_WORDS + 1), c.dim, c.size))
            })
            .collect();
        *state = State::Read(errors);
        Ok(())
    }
}

/// One check of a launch.
struct OneCheck {
    launch: Arc<LaunchChecks>,
    index: usize,
}

impl DeviceCheck for OneCheck {
    fn outcome(&self) -> Result<Option<Error>> {
        let mut state = self.launch.lock();
        self.launch.read(&mut state)?;
        match &*state {
            State::Read(errors) => Ok(errors[self.index].clone()),
            State::OnDevice(_) => unreachable!("read just above"),
        }
    }

    fn known(&self) -> Option<Option<Error>> {
        match &*self.launch.lock() {
            State::Read(errors) => Some(errors[self.index].clone()),
            State::OnDevice(_) => None,
        }
    }
}

/// The launches whose checks may not have been read, for a synchronize to read them all
/// (a launch no value carries any more is gone from it).
#[derive(Default)]
pub struct Unread(Mutex<Vec<Weak<LaunchChecks>>>);

impl Unread {
    /// Above this many entries, those of launches gone are dropped when one is added.
    const PRUNE_AT: usize = 64;

    fn lock(&self) -> MutexGuard<'_, Vec<Weak<LaunchChecks>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lists `launch` until the next [`Unread::read_all`].
    pub fn add(&self, launch: &Arc<LaunchChecks>) {
        let mut list = self.lock();
        if list.len() >= Self::PRUNE_AT {
            list.retain(|w| w.strong_count() > 0);
        }
        list.push(Arc::downgrade(launch));
    }

    /// Reads every listed launch's checks (each one download) and empties the list.
    pub fn read_all(&self) -> Result<()> {
        let list = std::mem::take(&mut *self.lock());
        for launch in list.iter().filter_map(Weak::upgrade) {
            let mut state = launch.lock();
            launch.read(&mut state)?;
        }
        Ok(())
    }
}
