//! Backends: they differ in what they fuse, not in how they are driven. A backend compiles a
//! [`Region`] into a [`Program`]; the executor runs programs on resolved buffers.

pub mod cpu;

use crate::error::Result;
use deferfuse_fusion::{Binding, Region};
use std::sync::Arc;

/// A compiled region, runnable many times with different bindings.
pub trait Program: Send + Sync {
    /// Runs on `bases`: each binding operand's buffer start, in binding order.
    ///
    /// # Safety
    /// Every base must point to a live buffer large enough for its operand's layout, and no
    /// other thread may write those buffers meanwhile (streams guarantee both).
    unsafe fn run(&self, binding: &Binding, bases: &[*mut u8]) -> Result<()>;

    /// Human-readable code for dumps (e.g. Cranelift IR); empty if the backend has none.
    fn listing(&self) -> String {
        String::new()
    }
}

/// Compiles regions for one kind of device.
pub trait Backend: Send + Sync {
    /// Short name used in logs, stats and config (`cpu`).
    fn name(&self) -> &'static str;
    /// Identity that goes into program fingerprints: name plus target features.
    fn identity(&self) -> &str;
    fn compile(&self, region: &Region) -> Result<Arc<dyn Program>>;
}
