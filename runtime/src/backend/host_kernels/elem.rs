//! Reading and writing single elements of any dtype, as the host kernels see them: floats as
//! f64 (exact for every float dtype), integers and bool as i64 (exact for every integer dtype).

use deferfuse_fusion::ir::DType;
use half::{bf16, f16};

/// The float value of the element at `off` (in elements) of a float, integer or bool buffer.
///
/// # Safety
/// `p` holds a `dtype` element at `off`.
pub unsafe fn read_f64(dtype: DType, p: *const u8, off: isize) -> f64 {
    match dtype {
        DType::F32 => *(p as *const f32).offset(off) as f64,
        DType::F64 => *(p as *const f64).offset(off),
        DType::F16 => f16::from_bits(*(p as *const u16).offset(off)).to_f64(),
        DType::BF16 => bf16::from_bits(*(p as *const u16).offset(off)).to_f64(),
        _ => read_i64(dtype, p, off) as f64,
    }
}

/// The integer value of the element at `off` (floats truncate toward zero).
///
/// # Safety
/// `p` holds a `dtype` element at `off`.
pub unsafe fn read_i64(dtype: DType, p: *const u8, off: isize) -> i64 {
    match dtype {
        DType::I32 => *(p as *const i32).offset(off) as i64,
        DType::I64 => *(p as *const i64).offset(off),
        DType::U8 => *p.offset(off) as i64,
        DType::Bool => (*p.offset(off) != 0) as i64,
        _ => read_f64(dtype, p, off) as i64,
    }
}

/// Evaluates `$body` with `$read` bound to a reader of `$dtype` index elements, `read(base,
/// element_offset) -> isize`, monomorphic per index dtype: the gather and scatter walks read one
/// index per element, and `read_i64`'s dtype dispatch there was inlined or not as the rest of
/// the crate changed (a gather along the last dim: 1.7 or 3.9 ns an element).
///
/// Every use must call `$read` only with an index view's base and an offset inside it.
macro_rules! with_index_reader {
    ($dtype:expr, |$read:ident| $body:expr) => {
        match $dtype {
            deferfuse_fusion::ir::DType::I64 => {
                // SAFETY: see the macro's doc.
                let $read =
                    |p: *const u8, off: isize| unsafe { *(p as *const i64).offset(off) as isize };
                $body
            }
            deferfuse_fusion::ir::DType::I32 => {
                // SAFETY: see the macro's doc.
                let $read =
                    |p: *const u8, off: isize| unsafe { *(p as *const i32).offset(off) as isize };
                $body
            }
            dt => {
                // SAFETY: see the macro's doc.
                let $read = move |p: *const u8, off: isize| unsafe {
                    $crate::backend::host_kernels::elem::read_i64(dt, p, off) as isize
                };
                $body
            }
        }
    };
}
pub(crate) use with_index_reader;

/// Stores `v` converted to `dtype` at element `off` (floats round to nearest even; integers
/// truncate and saturate, NaN gives 0; bool is `v != 0`).
///
/// # Safety
/// `p` has room for a `dtype` element at `off`, and no one else accesses it meanwhile.
pub unsafe fn write_f64(dtype: DType, p: *mut u8, off: isize, v: f64) {
    match dtype {
        DType::F32 => *(p as *mut f32).offset(off) = v as f32,
        DType::F64 => *(p as *mut f64).offset(off) = v,
        DType::F16 => *(p as *mut u16).offset(off) = f16::from_f32(to_odd_f32(v)).to_bits(),
        DType::BF16 => *(p as *mut u16).offset(off) = bf16::from_f32(to_odd_f32(v)).to_bits(),
        DType::I32 => *(p as *mut i32).offset(off) = v as i32,
        DType::I64 => *(p as *mut i64).offset(off) = v as i64,
        DType::U8 => *p.offset(off) = v as i64 as u8,
        DType::Bool => *p.offset(off) = (v != 0.0) as u8,
    }
}

/// `v` rounded to f32 toward zero with the last bit set when inexact ("round to odd"), NaN as
/// `v as f32`: rounding that to f16 or bf16 (at least two bits fewer) to nearest even gives
/// `v` correctly rounded, where rounding `v as f32` again could round twice the wrong way.
/// (`half`'s own f64 conversions look only at the high 20 bits of the mantissa: the f32
/// `0x002a8001`, read as f64, went to the bf16 `0x2a` where PyTorch rounds it to `0x2b`.)
fn to_odd_f32(v: f64) -> f32 {
    let f = v as f32;
    if v.is_nan() || f as f64 == v {
        return f;
    }
    // Inexact: step back toward zero where `as` rounded away from it, then mark the bit.
    let bits = f.to_bits() - ((f as f64).abs() > v.abs()) as u32;
    f32::from_bits(bits | 1)
}

/// Stores integer `v` converted to `dtype` at element `off` (integers wrap, like torch's
/// integer casts; floats round once from the exact integer).
///
/// # Safety
/// As for [`write_f64`].
pub unsafe fn write_i64(dtype: DType, p: *mut u8, off: isize, v: i64) {
    match dtype {
        DType::F32 => *(p as *mut f32).offset(off) = v as f32,
        DType::F64 => *(p as *mut f64).offset(off) = v as f64,
        DType::F16 => *(p as *mut u16).offset(off) = f16::from_f32(v as f32).to_bits(),
        DType::BF16 => *(p as *mut u16).offset(off) = bf16::from_f32(v as f32).to_bits(),
        DType::I32 => *(p as *mut i32).offset(off) = v as i32,
        DType::I64 => *(p as *mut i64).offset(off) = v,
        DType::U8 => *p.offset(off) = v as u8,
        DType::Bool => *p.offset(off) = (v != 0) as u8,
    }
}

/// Copies one element of `from` at `soff` into `to` at `doff`, converting between dtypes.
///
/// # Safety
/// As for [`read_f64`] and [`write_f64`].
pub unsafe fn convert(
    from: DType,
    src: *const u8,
    soff: isize,
    to: DType,
    dst: *mut u8,
    doff: isize,
) {
    if from == to {
        let es = from.size();
        std::ptr::copy_nonoverlapping(
            src.offset(soff * es as isize),
            dst.offset(doff * es as isize),
            es,
        );
    } else if from.is_float() {
        write_f64(to, dst, doff, read_f64(from, src, soff));
    } else {
        write_i64(to, dst, doff, read_i64(from, src, soff));
    }
}

/// `v` rounded to float `dtype` (f64 values pass unchanged).
pub fn round_to(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F32 => v as f32 as f64,
        DType::F16 => f16::from_f32(to_odd_f32(v)).to_f64(),
        DType::BF16 => bf16::from_f32(to_odd_f32(v)).to_f64(),
        _ => v,
    }
}

/// `f(a, b)` in the precision torch's CPU kernels use for one step on `dtype`: f64 for f64,
/// f32 for f32, f16 and bf16 (whose operators widen to f32), rounded to `dtype`.
pub fn float_step(dtype: DType, a: f64, b: f64, f: impl Fn(f64, f64) -> f64) -> f64 {
    if dtype == DType::F64 {
        f(a, b)
    } else {
        // Both operands are f32 values, so one f64 operation rounded to f32 is the f32 result.
        round_to(dtype, f(a, b) as f32 as f64)
    }
}

/// Integer `v` wrapped to `dtype` as storing and reloading it would (bool: `v != 0`).
pub fn wrap_to(dtype: DType, v: i64) -> i64 {
    match dtype {
        DType::I32 => v as i32 as i64,
        DType::U8 => v as u8 as i64,
        DType::Bool => (v != 0) as i64,
        _ => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `v` rounded to nearest even among the finite values `next` steps through (from the
    /// largest one at or below `v`), judged by exact distances: the reference the conversions
    /// are checked against.
    fn nearest_even(v: f64, below: f64, above: f64, below_is_even: bool) -> f64 {
        let (d_below, d_above) = (v - below, above - v);
        if d_below < d_above || (d_below == d_above && below_is_even) {
            below
        } else {
            above
        }
    }

    #[test]
    fn an_f64_rounds_to_bf16_and_f16_as_one_correct_rounding() {
        // Values whose sticky bits lie only below f32's precision, on both sides of ties, at
        // normal and subnormal results, from f32 values and from f64 ones.
        let mut values: Vec<f64> = Vec::new();
        for hi in (0u32..0x7f7f).step_by(97) {
            for lo in [0x0000, 0x7fff, 0x8000, 0x8001, 0xffff] {
                let f = f32::from_bits(hi << 16 | lo) as f64;
                values.extend([
                    f,
                    -f,
                    f * (1.0 + 2f64.powi(-40)),
                    f * (1.0 - 2f64.powi(-40)),
                ]);
            }
        }
        for dtype in [DType::BF16, DType::F16] {
            let step = |h: u16| match dtype {
                DType::BF16 => bf16::from_bits(h).to_f64(),
                _ => f16::from_bits(h).to_f64(),
            };
            let max = if dtype == DType::BF16 { 0x7f7f } else { 0x7bff };
            for &v in &values {
                let mut got = 0u16;
                unsafe { write_f64(dtype, &mut got as *mut u16 as *mut u8, 0, v) };
                // The two neighbours by magnitude, then signed.
                let a = v.abs();
                let mut h = 0u16;
                let (mut lo_h, mut hi_h) = (0u16, max + 1);
                // Binary search for the largest magnitude at or below |v|.
                let (mut l, mut r) = (0u16, max);
                while l <= r {
                    let m = l + (r - l) / 2;
                    if step(m) <= a {
                        lo_h = m;
                        l = m + 1;
                    } else {
                        if m == 0 {
                            break;
                        }
                        r = m - 1;
                    }
                }
                if lo_h < max {
                    hi_h = lo_h + 1;
                }
                h |= if hi_h > max {
                    // Past the largest finite value: infinity beyond its half step.
                    let top = step(max);
                    let half_ulp = (top - step(max - 1)) / 2.0;
                    if a - top >= half_ulp {
                        max + 1
                    } else {
                        max
                    }
                } else {
                    let n = nearest_even(a, step(lo_h), step(hi_h), lo_h % 2 == 0);
                    if n == step(lo_h) {
                        lo_h
                    } else {
                        hi_h
                    }
                };
                let want = h | if v.is_sign_negative() { 0x8000 } else { 0 };
                assert_eq!(got, want, "{dtype:?} {v:e}");
                assert_eq!(round_to(dtype, v), step(want & 0x7fff).copysign(v), "{v:e}");
            }
        }
    }

    #[test]
    fn a_converted_element_keeps_its_value() {
        let src = [3i64, -2];
        let mut dst = [0f32; 2];
        unsafe {
            convert(
                DType::I64,
                src.as_ptr() as *const u8,
                1,
                DType::F32,
                dst.as_mut_ptr() as *mut u8,
                0,
            )
        };
        assert_eq!(dst, [-2.0, 0.0]);
    }

    #[test]
    fn an_f16_step_rounds_through_f32_then_f16() {
        let a = f16::from_f32(1.0).to_f64();
        let b = f16::from_f32(0.0004).to_f64();
        let want = (f16::from_f32(1.0) + f16::from_f32(0.0004)).to_f64();
        assert_eq!(float_step(DType::F16, a, b, |x, y| x + y), want);
    }
}
