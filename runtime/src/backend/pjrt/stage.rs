//! Staging between the runtime's strided host buffers and the dense arrays a PJRT program
//! takes, and the bucketed [`Signature`] a program is compiled for.
//!
//! XLA needs static shapes, but regions leave sizes to run time. Every dim of a step's space is
//! rounded up to a power of two (its bucket), so a loop over 100 batch sizes compiles at most
//! 8 programs per region. Padding is zero on input and on output (so a result kept on the device
//! is the array an upload would stage, see `dense_key`), never stored into a host buffer, and
//! masked out of reductions (the program takes the valid length of the reduced dim). An operand is staged as a
//! dense array of its present dims only (broadcast dims are re-broadcast inside the program), in
//! its dtype's compute element (f16/bf16 as f32, u8/bool as i32), so casts behave exactly as in
//! the CPU backend.

use super::ffi::buffer_type;
use super::hlo::Elem;
use deferfuse_fusion::ir::DType;
use deferfuse_fusion::{Binding, Region};
use half::{bf16, f16};

/// How one operand's dims sit in the step's space and which of them are staged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperandSig {
    /// For each of the operand's dims, the space dim it walks.
    pub map: Vec<usize>,
    /// Whether the dim is staged (it has a non-zero stride and more than one element).
    pub present: Vec<bool>,
    /// For matmul epilogue inputs: the operand is the matmul's output view, so the program
    /// feeds it the new product instead of the staged old contents.
    pub view: Option<bool>,
}

/// What a program is compiled for: the bucketed space and each operand's staging.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    pub space: Vec<usize>,
    pub operands: Vec<OperandSig>,
    /// The space is the valid sizes themselves (no padding): a part of a whole-program module,
    /// compiled for exact shapes, needs no masks.
    pub exact: bool,
}

impl OperandSig {
    /// The staged array's dims (bucketed).
    pub fn staged_dims(&self, sig: &Signature) -> Vec<usize> {
        self.map
            .iter()
            .zip(&self.present)
            .filter(|(_, &p)| p)
            .map(|(&d, _)| sig.space[d])
            .collect()
    }
}

impl Signature {
    /// A stable key of the signature (part of the executable's cache key).
    pub fn key(&self) -> Vec<u64> {
        let mut k: Vec<u64> = vec![self.space.len() as u64];
        k.extend(self.space.iter().map(|&s| s as u64));
        for o in &self.operands {
            k.push(o.map.len() as u64);
            k.extend(o.map.iter().map(|&d| d as u64));
            let bits = o
                .present
                .iter()
                .enumerate()
                .fold(0u64, |a, (i, &p)| a | ((p as u64) << i));
            k.push(bits | ((o.view == Some(true)) as u64) << 63);
        }
        k
    }

    /// The 2-D space of a matmul epilogue: rows and columns of the output.
    pub fn epilogue_space(&self) -> Signature {
        let r = self.space.len();
        Signature {
            space: vec![self.space[r - 3], self.space[r - 1]],
            operands: vec![],
            exact: self.exact,
        }
    }
}

/// The smallest power of two at least `n` (1 for 0 and 1).
pub fn bucket(n: usize) -> usize {
    n.max(1).next_power_of_two()
}

/// A step's staging: its signature, the valid (unpadded) space, and each operand's strides.
pub struct Staging {
    pub sig: Signature,
    pub valid: Vec<usize>,
    pub strides: Vec<Vec<isize>>,
    /// Operands the program reads (staged: uploaded, or taken from the device), in argument order.
    pub inputs: Vec<usize>,
    /// Operands the program writes, in result order.
    pub outputs: Vec<usize>,
    /// Nothing to compute (an empty output).
    pub empty: bool,
}

fn operand(map: Vec<usize>, strides: &[isize], valid: &[usize]) -> OperandSig {
    let present = map
        .iter()
        .zip(strides)
        .map(|(&d, &s)| s != 0 && valid[d] > 1)
        .collect();
    OperandSig {
        map,
        present,
        view: None,
    }
}

/// How to stage `region` on `binding`, each dim rounded up to its bucket.
pub fn bucketed(region: &Region, b: &Binding) -> Staging {
    staging(region, b, false)
}

/// How to stage `region` on `binding` at its exact sizes (a part of a whole-program
/// module: the module is compiled for the flush's shapes).
pub fn exact(region: &Region, b: &Binding) -> Staging {
    staging(region, b, true)
}

fn staging(region: &Region, b: &Binding, exact: bool) -> Staging {
    let n = b.operands.len();
    let (valid, maps, strides, inputs, outputs, empty): (Vec<usize>, Vec<Vec<usize>>, _, _, _, _) =
        match region {
            Region::Loop(_) => {
                let it = b.iter.as_ref().expect("loop steps have an iteration space");
                let r = it.rank();
                let valid: Vec<usize> = it.sizes.to_vec();
                let empty = valid[..r - it.reduced].contains(&0);
                (
                    valid,
                    vec![(0..r).collect(); n],
                    it.strides.iter().map(|s| s.to_vec()).collect::<Vec<_>>(),
                    (0..b.n_inputs).collect::<Vec<_>>(),
                    (b.n_inputs..n).collect::<Vec<_>>(),
                    empty,
                )
            }
            Region::Matmul { .. } => {
                let a = &b.operands[0].layout;
                let bm = &b.operands[1].layout;
                let r = a.rank();
                let nb = r - 2;
                let mut valid: Vec<usize> = a.sizes[..nb].to_vec();
                valid.extend([a.sizes[nb], a.sizes[nb + 1], bm.sizes[nb + 1]]);
                let batch: Vec<usize> = (0..nb).collect();
                let with = |x: [usize; 2]| {
                    let mut m = batch.clone();
                    m.extend(x);
                    m
                };
                let out_j = b.n_inputs;
                let mut maps = vec![with([nb, nb + 1]), with([nb + 1, nb + 2])];
                for _ in 2..n {
                    maps.push(vec![nb, nb + 2]);
                }
                maps[out_j] = with([nb, nb + 2]);
                let mut inputs: Vec<usize> = (0..out_j).collect();
                inputs.push(out_j);
                let empty = valid[..nb].contains(&0) || valid[nb] == 0 || valid[nb + 2] == 0;
                (
                    valid,
                    maps,
                    b.operands
                        .iter()
                        .map(|t| t.layout.strides.to_vec())
                        .collect(),
                    inputs,
                    (out_j..n).collect(),
                    empty,
                )
            }
            Region::Kernel(_) => {
                unreachable!("kernel regions run as host programs (see PjrtBackend::compile)")
            }
            Region::Graph(_) => unreachable!("a graph is staged part by part (see `graph`)"),
            Region::Arange { .. } => {
                let l = &b.operands[0].layout;
                let numel = l.numel();
                let st = l.strides.first().copied().unwrap_or(1);
                (
                    vec![numel],
                    vec![vec![0]],
                    vec![vec![st]],
                    vec![],
                    vec![0],
                    numel == 0,
                )
            }
        };
    let space: Vec<usize> = if exact {
        valid.clone()
    } else {
        valid.iter().map(|&s| bucket(s)).collect()
    };
    let mut operands: Vec<OperandSig> = maps
        .into_iter()
        .zip(&strides)
        .map(|(m, s)| operand(m, s, &valid))
        .collect();
    if let Region::Matmul {
        epilogue: Some(_), ..
    } = region
    {
        let out_j = b.n_inputs;
        for (o, t) in operands[2..out_j].iter_mut().zip(&b.operands[2..out_j]) {
            o.view = Some(*t == b.operands[out_j]);
        }
    }
    Staging {
        sig: Signature {
            space,
            operands,
            exact,
        },
        valid,
        strides,
        inputs,
        outputs,
        empty,
    }
}

/// The staging of a buffer's whole storage of `n` elements as one flat array of `padded`
/// elements, zero past `n`: how a whole-program module takes and returns buffers (`padded` is
/// `n` but in a bucketed module, see `graph_bucket`).
pub fn flat_padded(n: usize, padded: usize) -> Staging {
    Staging {
        sig: Signature {
            space: vec![padded],
            operands: vec![OperandSig {
                map: vec![0],
                present: vec![padded > 1],
                view: None,
            }],
            exact: n == padded,
        },
        valid: vec![n],
        strides: vec![vec![1]],
        inputs: vec![0],
        outputs: vec![0],
        empty: n == 0,
    }
}

/// The PJRT element type of a staged array.
pub fn pjrt_type(e: Elem) -> i32 {
    match e {
        Elem::F32 => buffer_type::F32,
        Elem::F64 => buffer_type::F64,
        Elem::I32 => buffer_type::S32,
        Elem::I64 => buffer_type::S64,
        Elem::I1 => buffer_type::PRED,
    }
}

/// Walks the valid part of operand `j`'s staged array: calls `f(element offset in the buffer,
/// index in the dense array)` for each element, innermost dim fastest.
fn walk(p: &Staging, j: usize, offset: isize, mut f: impl FnMut(isize, usize)) {
    let o = &p.sig.operands[j];
    let dims: Vec<usize> = (0..o.map.len()).filter(|&d| o.present[d]).collect();
    let sizes: Vec<usize> = dims.iter().map(|&d| p.valid[o.map[d]]).collect();
    let buckets: Vec<usize> = dims.iter().map(|&d| p.sig.space[o.map[d]]).collect();
    let strides: Vec<isize> = dims.iter().map(|&d| p.strides[j][d]).collect();
    // An operand that steps along an empty dim has no elements (its buffer may be empty, and
    // its stride along another dim 0). One that is broadcast along it, like a row result over
    // an empty row, still has its elements.
    if o.map
        .iter()
        .zip(&p.strides[j])
        .any(|(&d, &st)| p.valid[d] == 0 && st != 0)
    {
        return;
    }
    let k = dims.len();
    if k == 0 {
        f(offset, 0);
        return;
    }
    let mut idx = vec![0usize; k];
    loop {
        let mut src = offset;
        let mut dst = 0usize;
        for d in 0..k - 1 {
            src += idx[d] as isize * strides[d];
            dst = (dst + idx[d]) * buckets[d + 1];
        }
        for i in 0..sizes[k - 1] {
            f(src + i as isize * strides[k - 1], dst + i);
        }
        let mut d = k - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < sizes[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// Bytes of operand `j`'s staged array.
pub fn staged_len(p: &Staging, j: usize, dtype: DType) -> usize {
    let n: usize = p.sig.operands[j].staged_dims(&p.sig).iter().product();
    n * Elem::of(dtype).size()
}

/// Copies operand `j` (dtype `d`, buffer `base`, element `offset`) into a dense array.
///
/// # Safety
/// `base` must hold the operand's whole view.
pub unsafe fn gather(p: &Staging, j: usize, d: DType, base: *const u8, offset: isize) -> Vec<u8> {
    let mut out = vec![0u8; staged_len(p, j, d)];
    let o = out.as_mut_ptr();
    macro_rules! go {
        ($src:ty, $dst:ty, $conv:expr) => {
            walk(p, j, offset, |s, i| {
                let x = *(base as *const $src).offset(s);
                *(o as *mut $dst).add(i) = $conv(x);
            })
        };
    }
    match d {
        DType::F32 => go!(f32, f32, |x| x),
        DType::F64 => go!(f64, f64, |x| x),
        DType::F16 => go!(u16, f32, |x| f16::from_bits(x).to_f32()),
        DType::BF16 => go!(u16, f32, |x| bf16::from_bits(x).to_f32()),
        DType::I32 => go!(i32, i32, |x| x),
        DType::I64 => go!(i64, i64, |x| x),
        DType::U8 | DType::Bool => go!(u8, i32, |x: u8| x as i32),
    }
    out
}

/// Stores the dense array `data` into operand `j`'s view (the valid part only).
///
/// # Safety
/// `base` must hold the operand's whole view, and no one else may access it meanwhile.
pub unsafe fn scatter(p: &Staging, j: usize, d: DType, base: *mut u8, offset: isize, data: &[u8]) {
    let src = data.as_ptr();
    macro_rules! go {
        ($s:ty, $dst:ty, $conv:expr) => {
            walk(p, j, offset, |o, i| {
                let x = *(src as *const $s).add(i);
                *(base as *mut $dst).offset(o) = $conv(x);
            })
        };
    }
    match d {
        DType::F32 => go!(f32, f32, |x| x),
        DType::F64 => go!(f64, f64, |x| x),
        DType::F16 => go!(f32, u16, |x| f16::from_f32(x).to_bits()),
        DType::BF16 => go!(f32, u16, |x| bf16::from_f32(x).to_bits()),
        DType::I32 => go!(i32, i32, |x| x),
        DType::I64 => go!(i64, i64, |x| x),
        DType::U8 | DType::Bool => go!(i32, u8, |x: i32| x as u8),
    }
}

/// What a staged array is when it is its buffer's whole value, densely: the buffer's dtype and
/// the array's valid and bucketed dims. Two operands with equal keys stage the same bytes into
/// the same array (row-major over the valid dims, zero padding), so a device copy made for one
/// serves the other.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DenseKey {
    pub dtype: DType,
    pub valid: Vec<usize>,
    pub padded: Vec<usize>,
}

impl DenseKey {
    /// Bytes of the (padded) device array.
    pub fn padded_len(&self) -> usize {
        self.padded.iter().product::<usize>() * self.dtype.size()
    }
}

/// The key of operand `j` (dtype `d`, element `offset`, on a buffer of `len` bytes) if its
/// staged array holds the whole buffer densely: offset 0, its staged dims walking the buffer
/// row-major, every byte covered. Only dtypes stored as their compute element qualify (f16,
/// bf16, u8 and bool are staged widened, and a device value of them would hold what the host
/// store rounds or wraps).
pub fn dense_key(p: &Staging, j: usize, d: DType, offset: usize, len: usize) -> Option<DenseKey> {
    if offset != 0 || len == 0 || !matches!(d, DType::F32 | DType::F64 | DType::I32 | DType::I64) {
        return None;
    }
    let o = &p.sig.operands[j];
    let st = &p.strides[j];
    // An operand that steps along an empty dim stages nothing (see `walk`).
    if o.map
        .iter()
        .zip(st)
        .any(|(&m, &s)| p.valid[m] == 0 && s != 0)
    {
        return None;
    }
    let dims: Vec<usize> = (0..o.map.len()).filter(|&k| o.present[k]).collect();
    let valid: Vec<usize> = dims.iter().map(|&k| p.valid[o.map[k]]).collect();
    let mut step = 1usize;
    for (&k, &n) in dims.iter().zip(&valid).rev() {
        if st[k] != step as isize {
            return None;
        }
        step *= n;
    }
    (step * d.size() == len).then(|| DenseKey {
        dtype: d,
        valid,
        padded: o.staged_dims(&p.sig),
    })
}

/// Copies the valid part of a padded dense array (`key.padded`, row-major) into `dst`, the
/// same array without padding.
pub fn unpad(key: &DenseKey, src: &[u8], dst: &mut [u8]) {
    let es = key.dtype.size();
    let k = key.valid.len();
    if k == 0 || key.valid == key.padded {
        dst.copy_from_slice(&src[..dst.len()]);
        return;
    }
    let row = key.valid[k - 1] * es;
    let rows: usize = key.valid[..k - 1].iter().product();
    let mut idx = vec![0usize; k - 1];
    for r in 0..rows {
        let at = idx
            .iter()
            .zip(&key.padded[1..])
            .fold(0usize, |at, (&i, &n)| (at + i) * n);
        dst[r * row..(r + 1) * row].copy_from_slice(&src[at * es..at * es + row]);
        for d in (0..k - 1).rev() {
            idx[d] += 1;
            if idx[d] < key.valid[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// A scalar slot's 64 bits as the program's 0-d argument of dtype `d` (the CPU backend's
/// reading: floats arrive as f64 bits, integers as i64 bits; u8 wraps, bool is 0/1).
pub fn scalar_bytes(bits: u64, d: DType) -> Vec<u8> {
    match Elem::of(d) {
        Elem::F32 => (f64::from_bits(bits) as f32).to_ne_bytes().to_vec(),
        Elem::F64 => bits.to_ne_bytes().to_vec(),
        Elem::I64 => bits.to_ne_bytes().to_vec(),
        _ => {
            let v = bits as i32;
            let v = match d {
                DType::U8 => v & 0xff,
                DType::Bool => (v != 0) as i32,
                _ => v,
            };
            v.to_ne_bytes().to_vec()
        }
    }
}

/// A matmul's alpha/beta (f64 bits) as a 0-d argument of the matmul's compute element.
pub fn gemm_scalar_bytes(bits: u64, d: DType) -> Vec<u8> {
    let x = f64::from_bits(bits);
    match Elem::of(d) {
        Elem::F32 => (x as f32).to_ne_bytes().to_vec(),
        Elem::F64 => x.to_ne_bytes().to_vec(),
        Elem::I64 => (x as i64).to_ne_bytes().to_vec(),
        _ => (x as i64 as i32).to_ne_bytes().to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two() {
        assert_eq!(
            [0, 1, 2, 3, 5, 64, 65].map(bucket),
            [1, 1, 2, 4, 8, 64, 128]
        );
    }

    #[test]
    fn unpad_keeps_the_valid_rows_of_a_padded_array() {
        let key = DenseKey {
            dtype: DType::I32,
            valid: vec![2, 3],
            padded: vec![2, 4],
        };
        let src: Vec<u8> = [1, 2, 3, 9, 4, 5, 6, 9]
            .iter()
            .flat_map(|x: &i32| x.to_ne_bytes())
            .collect();
        let mut dst = vec![0u8; 24];
        unpad(&key, &src, &mut dst);
        let got: Vec<i32> = dst
            .chunks(4)
            .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, [1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn a_hundred_sizes_fall_in_eight_buckets() {
        let mut b: Vec<usize> = (1..=100).map(bucket).collect();
        b.dedup();
        assert_eq!(b.len(), 8);
    }
}
