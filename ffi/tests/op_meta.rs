//! `dfuse_op_meta`: `dfuse_op` plus what `dfuse_tensor_meta` would say of its result, in one
//! call.

use deferfuse::*;
use std::ptr;

fn ok(s: DfuseStatus) {
    assert_eq!(s, DfuseStatus::Ok, "{}", last_error());
}

fn last_error() -> String {
    // SAFETY: dfuse_last_error returns a valid C string.
    unsafe { std::ffi::CStr::from_ptr(dfuse_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// A defer-mode runtime, destroyed on drop.
struct Rt(*mut DfuseRuntime);

impl Rt {
    fn new() -> Rt {
        let mut cfg = std::mem::MaybeUninit::uninit();
        let mut rt = ptr::null_mut();
        // SAFETY: valid out-pointers.
        unsafe {
            ok(dfuse_config_default(cfg.as_mut_ptr()));
            let mut cfg = cfg.assume_init();
            cfg.mode = DfuseMode::Defer as u32;
            ok(dfuse_runtime_create(&cfg, &mut rt));
        }
        Rt(rt)
    }

    fn zeros(&self, dtype: DfuseDtype, sizes: &[i64]) -> u64 {
        let mut h = 0;
        // SAFETY: sizes is valid for its length.
        ok(unsafe {
            dfuse_tensor_empty(self.0, dtype as u32, sizes.as_ptr(), sizes.len(), &mut h)
        });
        h
    }

    /// What dfuse_tensor_meta says of `t`: dtype and sizes.
    fn meta(&self, t: u64) -> (u32, Vec<i64>) {
        let (mut d, mut n, mut s) = (0, 0, [0i64; 8]);
        // SAFETY: valid out-pointers.
        ok(unsafe { dfuse_tensor_meta(self.0, t, &mut d, s.as_mut_ptr(), s.len(), &mut n) });
        (d, s[..n].to_vec())
    }

    /// `a <sub_op> b` through dfuse_op_meta (into `out` unless 0) with room for `capacity`
    /// sizes: the status, result, dtype, ndim and sizes it wrote.
    fn op_meta(
        &self,
        sub_op: DfuseBinaryOp,
        (a, b): (u64, u64),
        out: u64,
        capacity: usize,
    ) -> (DfuseStatus, u64, u32, usize, [i64; 8]) {
        let attrs = binary(sub_op);
        let inputs = [tensor(a), tensor(b)];
        let (mut r, mut d, mut n, mut s) = (7, 99, 99, [-1i64; 8]);
        // SAFETY: every pointer is valid for the call; `s` holds 8 >= capacity values.
        let st = unsafe {
            dfuse_op_meta(
                self.0,
                0,
                DfuseOpKind::Binary as u32,
                &attrs,
                inputs.as_ptr(),
                2,
                out,
                &mut r,
                &mut d,
                s.as_mut_ptr(),
                capacity,
                &mut n,
            )
        };
        (st, r, d, n, s)
    }
}

impl Drop for Rt {
    fn drop(&mut self) {
        // SAFETY: the pointer came from dfuse_runtime_create.
        unsafe { dfuse_runtime_destroy(self.0) };
    }
}

#[test]
fn op_meta_describes_a_new_result_as_tensor_meta_does() {
    let rt = Rt::new();
    let (a, b) = (
        rt.zeros(DfuseDtype::F32, &[2, 3]),
        rt.zeros(DfuseDtype::I64, &[3]),
    );
    for sub_op in [DfuseBinaryOp::Add, DfuseBinaryOp::Lt] {
        let (st, r, d, n, s) = rt.op_meta(sub_op, (a, b), 0, 8);
        ok(st);
        assert_ne!(r, 0);
        assert_eq!((d, s[..n].to_vec()), rt.meta(r));
    }
    assert_eq!(
        rt.op_meta(DfuseBinaryOp::Lt, (a, b), 0, 8).2,
        DfuseDtype::Bool as u32
    );
}

#[test]
fn op_meta_of_an_in_place_op_describes_its_out_tensor() {
    let rt = Rt::new();
    let (a, b) = (
        rt.zeros(DfuseDtype::F32, &[4]),
        rt.zeros(DfuseDtype::F32, &[4]),
    );
    let out = rt.zeros(DfuseDtype::F64, &[4]);
    let (st, r, d, n, s) = rt.op_meta(DfuseBinaryOp::Mul, (a, b), out, 8);
    ok(st);
    assert_eq!(r, out);
    assert_eq!((d, s[..n].to_vec()), (DfuseDtype::F64 as u32, vec![4]));
}

#[test]
fn op_meta_with_too_little_room_for_the_sizes_gives_ndim_and_leaves_sizes_alone() {
    let rt = Rt::new();
    let a = rt.zeros(DfuseDtype::F32, &[2, 3, 4]);
    let (st, r, d, n, s) = rt.op_meta(DfuseBinaryOp::Add, (a, a), 0, 2);
    ok(st);
    assert_ne!(r, 0);
    assert_eq!((d, n), (DfuseDtype::F32 as u32, 3));
    assert_eq!(s, [-1; 8]);
}

#[test]
fn op_meta_of_a_bad_op_fails_as_dfuse_op_does_and_zeroes_the_result() {
    let rt = Rt::new();
    let (a, b) = (
        rt.zeros(DfuseDtype::F32, &[2]),
        rt.zeros(DfuseDtype::F32, &[3]),
    );
    let (st, r, ..) = rt.op_meta(DfuseBinaryOp::Add, (a, b), 0, 8);
    assert_eq!(st, DfuseStatus::BadOp);
    assert_eq!(r, 0);
    assert!(
        last_error().starts_with("dfuse_op_meta: "),
        "{}",
        last_error()
    );
}

#[test]
fn op_meta_with_a_null_ndim_pointer_records_nothing() {
    let rt = Rt::new();
    let a = rt.zeros(DfuseDtype::F32, &[2]);
    let before = stats(&rt).ops_recorded;
    let attrs = binary(DfuseBinaryOp::Add);
    let x = tensor(a);
    let (mut r, mut d) = (7, 0);
    // SAFETY: valid pointers but for the NULL ndim, which is reported.
    let st = unsafe {
        dfuse_op_meta(
            rt.0,
            0,
            DfuseOpKind::Binary as u32,
            &attrs,
            [x, x].as_ptr(),
            2,
            0,
            &mut r,
            &mut d,
            ptr::null_mut(),
            0,
            ptr::null_mut(),
        )
    };
    assert_eq!(st, DfuseStatus::InvalidArgument);
    assert!(last_error().contains("ndim is NULL"), "{}", last_error());
    assert_eq!(stats(&rt).ops_recorded, before);
}

fn binary(sub_op: DfuseBinaryOp) -> DfuseAttrs {
    DfuseAttrs {
        sub_op: sub_op as u32,
        // SAFETY: plain C data; zero is every other field's "unset".
        ..unsafe { std::mem::zeroed() }
    }
}

fn tensor(h: u64) -> DfuseOperand {
    DfuseOperand {
        kind: DfuseOperandKind::Tensor as u32,
        tensor: h,
        f: 0.0,
        i: 0,
    }
}

fn stats(rt: &Rt) -> DfuseStats {
    // SAFETY: plain C data, filled by the call.
    let mut s: DfuseStats = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    ok(unsafe { dfuse_stats(rt.0, &mut s) });
    s
}
