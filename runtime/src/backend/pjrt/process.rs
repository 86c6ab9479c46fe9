//! One PJRT client per plugin per process, and the executables it compiled, shared by every
//! runtime in the process. A PJRT client owns thread pools and device memory, so one per runtime
//! wastes both; and a runtime created later (a test per case, a second model) reuses the
//! executables an earlier one compiled instead of paying XLA again.

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
/// The compiled executables, and their keys oldest first (for the bound).
type Executables = (
    HashMap<ExecutableKey, Arc<Executable>>,
    VecDeque<ExecutableKey>,
);

/// A plugin's process-wide client and its compiled executables.
pub struct Device {
    pub client: Arc<Client>,
    executables: Mutex<Executables>,
}

impl Device {
    /// The executable of region `fingerprint` at signature `sig`, if this process has one.
    pub fn executable(&self, fingerprint: u128, sig: &[u64]) -> Option<Arc<Executable>> {
        let m = self.executables.lock().unwrap_or_else(|p| p.into_inner());
        m.0.get(&(fingerprint, sig.to_vec())).cloned()
    }

    /// Keeps `exe` for every runtime of the process that meets the same region and signature.
    pub fn keep_executable(&self, fingerprint: u128, sig: Vec<u64>, exe: Arc<Executable>) {
        let mut m = self.executables.lock().unwrap_or_else(|p| p.into_inner());
        let key = (fingerprint, sig);
        if m.0.insert(key.clone(), exe).is_none() {
            m.1.push_back(key);
        }
        while m.0.len() > MAX_EXECUTABLES {
            match m.1.pop_front() {
                Some(old) => {
                    m.0.remove(&old);
                }
                None => break,
            }
        }
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
        executables: Mutex::new((HashMap::new(), VecDeque::new())),
    });
    devices.insert(key, d.clone());
    Ok(d)
}
