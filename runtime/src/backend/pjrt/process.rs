//! One PJRT client per plugin per process, and the executables it compiled, shared by every
//! runtime in the process. A PJRT client owns thread pools and device memory, so one per runtime
//! wastes both; and a runtime created later (a test per case, a second model) reuses the
//! executables an earlier one compiled instead of paying XLA again.
//!
//! Executables are found by region and signature, and also by module text: regions that differ
//! only in what the lowering erases (an operand read through a strided view is staged dense, so
//! `cast(x)` and `cast(x[::2])` emit the same module) share one XLA compile.

use super::client::{Client, Executable, Plugin};
use crate::error::Result;
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// Executables kept for the process; beyond this the oldest are dropped (a program that still
/// holds one keeps it alive).
const MAX_EXECUTABLES: usize = 4096;

/// An executable's key: the region fingerprint and its signature.
type ExecutableKey = (u128, Vec<u64>);
/// Executables by key, and their keys oldest first (for the bound).
struct Bounded<K> {
    map: HashMap<K, Arc<Executable>>,
    order: VecDeque<K>,
}

impl<K: std::hash::Hash + Eq + Clone> Bounded<K> {
    fn new() -> Self {
        Bounded {
            map: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    fn insert(&mut self, key: K, exe: Arc<Executable>) {
        if self.map.insert(key.clone(), exe).is_none() {
            self.order.push_back(key);
        }
        while self.map.len() > MAX_EXECUTABLES {
            match self.order.pop_front() {
                Some(old) => {
                    self.map.remove(&old);
                }
                None => break,
            }
        }
    }
}

/// A plugin's process-wide client and its compiled executables.
pub struct Device {
    pub client: Arc<Client>,
    executables: Mutex<Bounded<ExecutableKey>>,
    /// The same executables by the 128-bit hash of their module text.
    by_text: Mutex<Bounded<u128>>,
}

impl Device {
    /// The executable of region `fingerprint` at signature `sig`, if this process has one.
    pub fn executable(&self, fingerprint: u128, sig: &[u64]) -> Option<Arc<Executable>> {
        let m = self.executables.lock().unwrap_or_else(|p| p.into_inner());
        m.map.get(&(fingerprint, sig.to_vec())).cloned()
    }

    /// Keeps `exe` for every runtime of the process that meets the same region and signature.
    pub fn keep_executable(&self, fingerprint: u128, sig: Vec<u64>, exe: Arc<Executable>) {
        let mut m = self.executables.lock().unwrap_or_else(|p| p.into_inner());
        m.insert((fingerprint, sig), exe);
    }

    /// The executable this process compiled from the module text hashing to `text`, if any:
    /// the same text compiles to the same executable whatever region emitted it.
    pub fn executable_by_text(&self, text: u128) -> Option<Arc<Executable>> {
        let m = self.by_text.lock().unwrap_or_else(|p| p.into_inner());
        m.map.get(&text).cloned()
    }

    /// Keeps `exe` for any later region whose module text hashes to `text`.
    pub fn keep_by_text(&self, text: u128, exe: Arc<Executable>) {
        let mut m = self.by_text.lock().unwrap_or_else(|p| p.into_inner());
        m.insert(text, exe);
    }
}

/// The process's device for the plugin at `path`, loading it on first use.
pub fn device(path: &Path) -> Result<Arc<Device>> {
    static DEVICES_BY_PLUGIN: OnceLock<Mutex<HashMap<PathBuf, Arc<Device>>>> = OnceLock::new();
    let key = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let mut devices = DEVICES_BY_PLUGIN
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(d) = devices.get(&key) {
        return Ok(d.clone());
    }
    let plugin = Plugin::load(path)?;
    let d = Arc::new(Device {
        client: Arc::new(Client::new(plugin)?),
        executables: Mutex::new(Bounded::new()),
        by_text: Mutex::new(Bounded::new()),
    });
    devices.insert(key, d.clone());
    Ok(d)
}
