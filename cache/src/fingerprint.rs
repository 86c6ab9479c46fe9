//! Region fingerprints: a stable 128-bit key for "the same program".
//!
//! A region is already canonical (operands by position, values numbered in order, shapes reduced
//! to stride kinds, scalars as parameter slots), so hashing it is enough. The hash is xxh3-128,
//! whose output is specified and identical in every process and on every platform, so a disk
//! cache can key on it. The key also covers the library version and the backend's identity
//! (name plus target features), because a program for another CPU is not the same program.

use deferfuse_fusion::Region;
use std::fmt;
use std::hash::{Hash, Hasher};
use xxhash_rust::xxh3::Xxh3;

/// The 128-bit identity of a compiled program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub u128);

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// Feeds `std::hash::Hash` into xxh3. Integers are written little-endian at fixed widths so the
/// byte stream does not depend on the platform.
struct StableHasher(Xxh3);

impl Hasher for StableHasher {
    fn finish(&self) -> u64 {
        self.0.digest()
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    fn write_usize(&mut self, i: usize) {
        self.0.update(&(i as u64).to_le_bytes());
    }
    fn write_isize(&mut self, i: isize) {
        self.0.update(&(i as i64).to_le_bytes());
    }
    fn write_u16(&mut self, i: u16) {
        self.0.update(&i.to_le_bytes());
    }
    fn write_u32(&mut self, i: u32) {
        self.0.update(&i.to_le_bytes());
    }
    fn write_u64(&mut self, i: u64) {
        self.0.update(&i.to_le_bytes());
    }
    fn write_u128(&mut self, i: u128) {
        self.0.update(&i.to_le_bytes());
    }
}

/// The library version baked into every key: a new release never reuses an old program.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Fingerprints `region` for a backend identified by `backend` (e.g. "cpu-cranelift:avx2,fma").
pub fn fingerprint(region: &Region, backend: &str) -> Fingerprint {
    let mut h = StableHasher(Xxh3::new());
    h.write(b"deferfuse-region\0");
    h.write(VERSION.as_bytes());
    h.write(&[0]);
    h.write(backend.as_bytes());
    h.write(&[0]);
    region.hash(&mut h);
    Fingerprint(h.0.digest128())
}

#[cfg(test)]
mod tests {
    use super::*;
    use deferfuse_fusion::ir::{BinaryOp, DType};
    use deferfuse_fusion::region::{Instr, InstrKind, LoopOperand, LoopRegion};
    use deferfuse_fusion::StrideKind;

    fn add_region(inner: StrideKind) -> Region {
        let op = |inner| LoopOperand {
            dtype: DType::F32,
            inner,
        };
        Region::Loop(LoopRegion {
            inputs: vec![op(StrideKind::Contig), op(inner)],
            params: vec![],
            body: vec![
                Instr {
                    kind: InstrKind::Load(0),
                    dtype: DType::F32,
                },
                Instr {
                    kind: InstrKind::Load(1),
                    dtype: DType::F32,
                },
                Instr {
                    kind: InstrKind::Binary(BinaryOp::Add, 0, 1),
                    dtype: DType::F32,
                },
            ],
            outputs: vec![(2, op(StrideKind::Contig))],
            reduces: vec![],
        })
    }

    /// The value is pinned: if this test fails, the fingerprint encoding changed, and every
    /// disk-cached program keyed on the old encoding would be orphaned. Change it only
    /// together with a version bump.
    #[test]
    fn fingerprint_is_stable_across_processes_and_runs() {
        let f = fingerprint(&add_region(StrideKind::Contig), "cpu-test");
        assert_eq!(f.to_string(), GOLDEN, "fingerprint encoding changed");
    }

    const GOLDEN: &str = "fabab008385cf0814649d7004e7ad068";

    #[test]
    fn backend_identity_and_shape_class_change_the_key() {
        let a = fingerprint(&add_region(StrideKind::Contig), "cpu-test");
        assert_ne!(a, fingerprint(&add_region(StrideKind::Contig), "cpu-other"));
        assert_ne!(a, fingerprint(&add_region(StrideKind::Bcast), "cpu-test"));
        assert_eq!(a, fingerprint(&add_region(StrideKind::Contig), "cpu-test"));
    }
}
