//! The ABI's conversions exercised through the exported functions, from Rust: negative dims,
//! scalar and absent operands, attrs, views, item, and runtime pointers destroyed while other
//! threads use them.

use deferfuse::*;
use std::ffi::CStr;
use std::ptr;

fn last_error() -> String {
    // SAFETY: dfuse_last_error returns a NUL-terminated string valid until the next call.
    unsafe { CStr::from_ptr(dfuse_last_error()) }
        .to_string_lossy()
        .into_owned()
}

#[track_caller]
fn ok(s: DfuseStatus) {
    assert_eq!(s, DfuseStatus::Ok, "{}", last_error());
}

/// A runtime in `mode`, destroyed on drop.
struct Rt(*mut DfuseRuntime);

impl Rt {
    fn new(mode: DfuseMode) -> Rt {
        let mut cfg = std::mem::MaybeUninit::uninit();
        let mut rt = ptr::null_mut();
        // SAFETY: valid out-pointers.
        unsafe {
            ok(dfuse_config_default(cfg.as_mut_ptr()));
            let mut cfg = cfg.assume_init();
            cfg.mode = mode as u32;
            ok(dfuse_runtime_create(&cfg, &mut rt));
        }
        Rt(rt)
    }

    fn f32s(&self, v: &[f32], sizes: &[i64]) -> u64 {
        self.upload(v, DfuseDtype::F32, sizes)
    }

    /// A tensor of `dtype` holding `v` (whose element type must match it).
    fn upload<T>(&self, v: &[T], dtype: DfuseDtype, sizes: &[i64]) -> u64 {
        let mut h = 0;
        // SAFETY: slices are valid for their lengths.
        ok(unsafe {
            dfuse_tensor_from_host(
                self.0,
                v.as_ptr().cast(),
                std::mem::size_of_val(v),
                dtype as u32,
                sizes.as_ptr(),
                sizes.len(),
                &mut h,
            )
        });
        h
    }

    fn read(&self, t: u64) -> Vec<f32> {
        let n: i64 = self.shape(t).iter().product();
        let mut v = vec![0f32; n as usize];
        // SAFETY: the buffer holds exactly n floats.
        ok(unsafe { dfuse_tensor_to_host(self.0, t, v.as_mut_ptr().cast(), n as usize * 4) });
        v
    }

    fn shape(&self, t: u64) -> Vec<i64> {
        let mut n = 0;
        let mut s = [0i64; 8];
        // SAFETY: valid out-pointers.
        unsafe {
            ok(dfuse_tensor_ndim(self.0, t, &mut n));
            ok(dfuse_tensor_shape(self.0, t, s.as_mut_ptr(), s.len()));
        }
        s[..n].to_vec()
    }

    fn op(&self, kind: DfuseOpKind, attrs: Option<&DfuseAttrs>, inputs: &[DfuseOperand]) -> u64 {
        let mut r = 0;
        ok(self.try_op(kind as u32, attrs, inputs, &mut r));
        r
    }

    fn try_op(
        &self,
        kind: u32,
        attrs: Option<&DfuseAttrs>,
        inputs: &[DfuseOperand],
        r: &mut u64,
    ) -> DfuseStatus {
        let a = attrs.map_or(ptr::null(), |a| a as *const DfuseAttrs);
        // SAFETY: pointers are valid for their lengths.
        unsafe { dfuse_op(self.0, 0, kind, a, inputs.as_ptr(), inputs.len(), 0, r) }
    }

    fn view(&self, kind: DfuseViewKind, t: u64, args: &[i64]) -> u64 {
        let mut r = 0;
        // SAFETY: pointers are valid for their lengths.
        ok(unsafe { dfuse_view(self.0, 0, kind as u32, t, args.as_ptr(), args.len(), &mut r) });
        r
    }

    fn item(&self, t: u64) -> DfuseScalar {
        let mut s = DfuseScalar {
            kind: 99,
            f: 0.0,
            i: 0,
        };
        // SAFETY: valid out-pointer.
        ok(unsafe { dfuse_tensor_item(self.0, t, &mut s) });
        s
    }
}

impl Drop for Rt {
    fn drop(&mut self) {
        // SAFETY: the pointer came from dfuse_runtime_create (or is already destroyed, which is
        // reported, not undefined).
        unsafe { dfuse_runtime_destroy(self.0) };
    }
}

fn t(h: u64) -> DfuseOperand {
    DfuseOperand {
        kind: DfuseOperandKind::Tensor as u32,
        tensor: h,
        f: 0.0,
        i: 0,
    }
}

fn float(f: f64) -> DfuseOperand {
    DfuseOperand {
        kind: DfuseOperandKind::Float as u32,
        tensor: 0,
        f,
        i: 0,
    }
}

fn int(i: i64) -> DfuseOperand {
    DfuseOperand {
        kind: DfuseOperandKind::Int as u32,
        tensor: 0,
        f: 0.0,
        i,
    }
}

fn absent() -> DfuseOperand {
    DfuseOperand {
        kind: DfuseOperandKind::Absent as u32,
        tensor: 0,
        f: 0.0,
        i: 0,
    }
}

fn attrs(sub_op: u32) -> DfuseAttrs {
    DfuseAttrs {
        sub_op,
        dtype: 0,
        dims: [0; DFUSE_MAX_REDUCE_DIMS],
        n_dims: 0,
        keepdim: 0,
        dim: 0,
        include_self: 1,
        descending: 0,
        has_dtype: 0,
        stride: [1; 3],
        padding: [0; 3],
        dilation: [1; 3],
        limit: 0,
    }
}

const MODES: [DfuseMode; 3] = [DfuseMode::Strict, DfuseMode::Debug, DfuseMode::Defer];

impl Rt {
    fn i64s(&self, v: &[i64], sizes: &[i64]) -> u64 {
        self.upload(v, DfuseDtype::I64, sizes)
    }
}

#[test]
fn gather_through_dfuse_op_wraps_its_dim_and_reports_a_bad_index_as_bad_op() {
    for mode in MODES {
        let rt = Rt::new(mode);
        let src = rt.f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
        let idx = rt.i64s(&[2, 0, 1, 1], &[2, 2]);
        let mut a = attrs(0);
        a.dim = -1;
        let g = rt.op(DfuseOpKind::Gather, Some(&a), &[t(src), t(idx)]);
        assert_eq!(rt.read(g), [3.0, 1.0, 5.0, 5.0], "{mode:?}");
        let bad = rt.i64s(&[3, 0, 1, 1], &[2, 2]);
        let mut r = 0;
        let s = rt.try_op(
            DfuseOpKind::Gather as u32,
            Some(&a),
            &[t(src), t(bad)],
            &mut r,
        );
        let msg = "gather: index 3 is out of bounds for dim 1 with size 3";
        if mode == DfuseMode::Debug {
            let want = format!("dfuse_op: {msg}");
            assert_eq!((s, last_error()), (DfuseStatus::BadOp, want));
        } else {
            ok(s);
            let mut out = [0f32; 4];
            // SAFETY: the buffer holds exactly 4 floats.
            let s = unsafe { dfuse_tensor_to_host(rt.0, r, out.as_mut_ptr().cast(), 16) };
            assert_eq!(
                (s, last_error()),
                (DfuseStatus::BadOp, format!("dfuse_tensor_to_host: {msg}")),
                "{mode:?}"
            );
        }
    }
}

#[test]
fn random_through_dfuse_op_takes_its_sizes_from_dims() {
    let rt = Rt::new(DfuseMode::Defer);
    let mut a = attrs(DfuseRandomDist::Uniform as u32);
    a.n_dims = 2;
    a.dims[..2].copy_from_slice(&[3, 4]);
    let r = rt.op(DfuseOpKind::Random, Some(&a), &[int(42), int(0)]);
    assert_eq!(rt.shape(r), [3, 4]);
    let v = rt.read(r);
    assert!(v.iter().all(|x| (0.0..1.0).contains(x)), "{v:?}");
    assert_eq!(
        v,
        rt.read(rt.op(DfuseOpKind::Random, Some(&a), &[int(42), int(0)]))
    );
}

#[test]
fn reduce_dims_wrap_like_pytorch() {
    for mode in MODES {
        let rt = Rt::new(mode);
        let v: Vec<f32> = (0..24).map(|x| x as f32).collect();
        let x = rt.f32s(&v, &[2, 3, 4]);
        let mut a = attrs(DfuseReduceOp::Sum as u32);
        a.dims[..2].copy_from_slice(&[-1, 0]);
        a.n_dims = 2;
        a.keepdim = 1;
        let s = rt.op(DfuseOpKind::Reduce, Some(&a), &[t(x)]);
        assert_eq!(rt.shape(s), [1, 3, 1]);
        let want: Vec<f32> = (0..3)
            .map(|j| {
                (0..2)
                    .flat_map(|i| (0..4).map(move |k| (i * 12 + j * 4 + k) as f32))
                    .sum()
            })
            .collect();
        assert_eq!(rt.read(s), want);
        // The same dims written positively give the same result.
        a.dims[..2].copy_from_slice(&[2, 0]);
        let s2 = rt.op(DfuseOpKind::Reduce, Some(&a), &[t(x)]);
        assert_eq!(rt.read(s2), want);
        // All dims, no keepdim: a 0-dim tensor whose item is the total.
        let all = rt.op(
            DfuseOpKind::Reduce,
            Some(&attrs(DfuseReduceOp::Sum as u32)),
            &[t(x)],
        );
        assert_eq!(rt.shape(all), Vec::<i64>::new());
        let it = rt.item(all);
        assert_eq!((it.kind, it.f), (DfuseScalarKind::Float as u32, 276.0));
        // Out of range, in either direction, is a bad op naming the reduction.
        a.dims[0] = -4;
        let mut r = 7;
        assert_eq!(
            rt.try_op(DfuseOpKind::Reduce as u32, Some(&a), &[t(x)], &mut r),
            DfuseStatus::BadOp
        );
        assert_eq!(r, 0);
        assert!(last_error().contains("sum: dim"), "{}", last_error());
    }
}

#[test]
fn cat_wraps_its_dim() {
    let rt = Rt::new(DfuseMode::Defer);
    let a = rt.f32s(&[1., 2., 3., 4.], &[2, 2]);
    let b = rt.f32s(&[5., 6.], &[2, 1]);
    let mut at = attrs(0);
    at.dim = -1;
    let c = rt.op(DfuseOpKind::Cat, Some(&at), &[t(a), t(b)]);
    assert_eq!(rt.shape(c), [2, 3]);
    assert_eq!(rt.read(c), [1., 2., 5., 3., 4., 6.]);
    // A stale first input is reported as an invalid handle naming the input, not a dim error.
    ok(unsafe { dfuse_tensor_release(rt.0, b) });
    let mut r = 0;
    assert_eq!(
        rt.try_op(DfuseOpKind::Cat as u32, Some(&at), &[t(b), t(a)], &mut r),
        DfuseStatus::InvalidHandle
    );
    assert!(last_error().contains("input 0"), "{}", last_error());
}

#[test]
fn scalar_and_absent_operands() {
    for mode in MODES {
        let rt = Rt::new(mode);
        let x = rt.f32s(&[-3., -1., 0., 2., 5.], &[5]);
        let c = rt.op(DfuseOpKind::Clamp, None, &[t(x), absent(), float(2.0)]);
        assert_eq!(rt.read(c), [-3., -1., 0., 2., 2.]);
        let gt = rt.op(
            DfuseOpKind::Binary,
            Some(&attrs(DfuseBinaryOp::Gt as u32)),
            &[t(x), int(0)],
        );
        let mut dt = 99;
        ok(unsafe { dfuse_tensor_dtype(rt.0, gt, &mut dt) });
        assert_eq!(dt, DfuseDtype::Bool as u32);
        let w = rt.op(DfuseOpKind::Where, None, &[t(gt), t(x), float(0.5)]);
        assert_eq!(rt.read(w), [0.5, 0.5, 0.5, 2., 5.]);
        let mut a = attrs(0);
        a.dtype = DfuseDtype::F32 as u32;
        let r = rt.op(DfuseOpKind::Arange, Some(&a), &[int(1), int(7), int(2)]);
        assert_eq!(rt.read(r), [1., 3., 5.]);
        let m1 = rt.f32s(&[1., 2., 3., 4.], &[2, 2]);
        let id = rt.f32s(&[1., 0., 0., 1.], &[2, 2]);
        let mm = rt.op(
            DfuseOpKind::Addmm,
            None,
            &[t(id), t(m1), t(id), float(0.5), float(2.0)],
        );
        assert_eq!(rt.read(mm), [2.5, 4., 6., 8.5]);
        let mut cast = attrs(0);
        cast.dtype = DfuseDtype::I32 as u32;
        let xi = rt.op(DfuseOpKind::Cast, Some(&cast), &[t(x)]);
        let one = rt.view(DfuseViewKind::Select, xi, &[0, -1]);
        let it = rt.item(one);
        assert_eq!((it.kind, it.i), (DfuseScalarKind::Int as u32, 5));
        let b = rt.view(DfuseViewKind::Select, gt, &[0, 3]);
        let it = rt.item(b);
        assert_eq!((it.kind, it.i), (DfuseScalarKind::Bool as u32, 1));
    }
}

#[test]
fn views_convert_their_args() {
    let rt = Rt::new(DfuseMode::Strict);
    let v: Vec<f32> = (0..6).map(|x| x as f32).collect();
    let x = rt.f32s(&v, &[2, 3]);
    let r = rt.view(DfuseViewKind::Reshape, x, &[3, -1]);
    assert_eq!(rt.shape(r), [3, 2]);
    let p = rt.view(DfuseViewKind::Permute, x, &[-1, 0]);
    assert_eq!(rt.read(p), [0., 3., 1., 4., 2., 5.]);
    let u = rt.view(DfuseViewKind::Unsqueeze, x, &[-1]);
    assert_eq!(rt.shape(u), [2, 3, 1]);
    let e = rt.view(DfuseViewKind::Expand, u, &[2, 3, 2]);
    assert_eq!(rt.shape(e), [2, 3, 2]);
    let s = rt.view(DfuseViewKind::Squeeze, u, &[]);
    assert_eq!(rt.shape(s), [2, 3]);
    let sl = rt.view(DfuseViewKind::Slice, x, &[1, 0, 3, 2]);
    assert_eq!(rt.read(sl), [0., 2., 3., 5.]);
    let mut out = 0;
    // SAFETY: the arrays hold ndim values.
    ok(unsafe { dfuse_as_strided(rt.0, x, [2, 2].as_ptr(), [1, 2].as_ptr(), 2, 1, &mut out) });
    assert_eq!(rt.read(out), [1., 3., 2., 4.]);
    let mut strides = [0i64; 2];
    ok(unsafe { dfuse_tensor_strides(rt.0, out, strides.as_mut_ptr(), 2) });
    assert_eq!(strides, [1, 2]);
    // Negative offset and a transpose with one arg are invalid arguments.
    let st = unsafe { dfuse_as_strided(rt.0, x, [1].as_ptr(), [1].as_ptr(), 1, -1, &mut out) };
    assert_eq!(st, DfuseStatus::InvalidArgument);
    assert_eq!(out, 0);
}

#[test]
fn bogus_and_destroyed_runtime_pointers_are_invalid_handles() {
    let mut x = 0u64;
    let bogus = (&mut x as *mut u64).cast::<DfuseRuntime>();
    let mut n = 0usize;
    // SAFETY: the runtime pointer is only looked up, never dereferenced.
    unsafe {
        assert_eq!(
            dfuse_tensor_ndim(bogus, 1, &mut n),
            DfuseStatus::InvalidHandle
        );
        assert!(last_error().contains("is not live"), "{}", last_error());
        assert_eq!(dfuse_runtime_destroy(bogus), DfuseStatus::InvalidHandle);
    }
    let rt = Rt::new(DfuseMode::Strict);
    let p = rt.0;
    drop(rt);
    // SAFETY: as above.
    unsafe {
        assert_eq!(dfuse_device_synchronize(p), DfuseStatus::InvalidHandle);
        // A new runtime never reuses a destroyed pointer.
        let rt2 = Rt::new(DfuseMode::Strict);
        assert_ne!(rt2.0, p);
        assert_eq!(dfuse_device_synchronize(p), DfuseStatus::InvalidHandle);
        ok(dfuse_device_synchronize(rt2.0));
    }
}

#[test]
fn a_released_tensor_handle_stays_stale_after_its_slot_holds_a_new_tensor() {
    let rt = Rt::new(DfuseMode::Defer);
    let old = rt.f32s(&[1.0], &[1]);
    // SAFETY: handles are only looked up; the out-pointer is valid.
    unsafe {
        ok(dfuse_tensor_release(rt.0, old));
        let new = rt.f32s(&[2.0], &[1]);
        assert_ne!(new, old, "a handle value is never handed out twice");
        let mut n = 0usize;
        assert_eq!(
            dfuse_tensor_ndim(rt.0, old, &mut n),
            DfuseStatus::InvalidHandle
        );
        assert!(last_error().contains("is stale"), "{}", last_error());
        assert_eq!(dfuse_tensor_release(rt.0, old), DfuseStatus::InvalidHandle);
        ok(dfuse_tensor_ndim(rt.0, new, &mut n));
        assert_eq!(n, 1, "the stale release left the new tensor alone");
        ok(dfuse_tensor_release(rt.0, new));
    }
}

#[test]
fn a_runtime_the_thread_just_used_is_not_live_after_its_destroy() {
    let rt = Rt::new(DfuseMode::Defer);
    let p = rt.0;
    // SAFETY: the runtime pointer is only looked up, never dereferenced.
    unsafe {
        // The thread now remembers `p` (its fast lookup path).
        ok(dfuse_device_synchronize(p));
        ok(dfuse_device_synchronize(p));
        assert_eq!(dfuse_runtime_destroy(p), DfuseStatus::Ok);
        assert_eq!(dfuse_device_synchronize(p), DfuseStatus::InvalidHandle);
        assert!(last_error().contains("is not live"), "{}", last_error());
    }
    std::mem::forget(rt);
}

#[test]
fn destroy_while_other_threads_call() {
    let rt = Rt::new(DfuseMode::Defer);
    let addr = rt.0 as usize;
    let x = rt.f32s(&[1., 2., 3., 4.], &[4]);
    let workers: Vec<_> = (0..3)
        .map(|_| {
            std::thread::spawn(move || {
                let p = addr as *const DfuseRuntime;
                let add = attrs(DfuseBinaryOp::Add as u32);
                let mut seen_ok = 0;
                loop {
                    let mut r = 0;
                    // SAFETY: the pointer is only looked up; arrays are valid.
                    let s = unsafe {
                        dfuse_op(p, 0, 1, &add, [t(x), float(1.0)].as_ptr(), 2, 0, &mut r)
                    };
                    match s {
                        DfuseStatus::Ok => {
                            seen_ok += 1;
                            let mut v = [0f32; 4];
                            let s =
                                unsafe { dfuse_tensor_to_host(p, r, v.as_mut_ptr().cast(), 16) };
                            if s == DfuseStatus::Ok {
                                assert_eq!(v, [2., 3., 4., 5.]);
                            } else {
                                assert_eq!(s, DfuseStatus::InvalidHandle, "{}", last_error());
                            }
                            unsafe { dfuse_tensor_release(p, r) };
                        }
                        DfuseStatus::InvalidHandle => return seen_ok,
                        other => panic!("{other:?}: {}", last_error()),
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(50));
    drop(rt);
    for w in workers {
        w.join().expect("a worker thread panicked");
    }
}

#[test]
fn null_pointers_name_the_function_and_parameter() {
    let rt = Rt::new(DfuseMode::Strict);
    // SAFETY: NULL pointers are reported before any access.
    unsafe {
        assert_eq!(
            dfuse_stream_create(rt.0, ptr::null_mut()),
            DfuseStatus::InvalidArgument
        );
        assert_eq!(last_error(), "dfuse_stream_create: invalid argument: out is NULL; pass a pointer to writable memory for the result");
        assert_eq!(
            dfuse_stats(rt.0, ptr::null_mut()),
            DfuseStatus::InvalidArgument
        );
        assert!(
            last_error().starts_with("dfuse_stats: "),
            "{}",
            last_error()
        );
        let mut done = false;
        assert_eq!(
            dfuse_event_query(ptr::null(), 1, &mut done),
            DfuseStatus::InvalidArgument
        );
        assert!(last_error().contains("dfuse_event_query: invalid argument: rt is NULL"));
        let mut r = 0;
        assert_eq!(
            dfuse_op(rt.0, 0, 1, &attrs(0), ptr::null(), 2, 0, &mut r),
            DfuseStatus::InvalidArgument
        );
        assert!(last_error().contains("inputs is NULL"), "{}", last_error());
        // Zero-length arrays may be NULL: a 0-dim tensor from one element.
        let v = 4.0f32;
        let mut h = 0;
        ok(dfuse_tensor_from_host(
            rt.0,
            (&v as *const f32).cast(),
            4,
            0,
            ptr::null(),
            0,
            &mut h,
        ));
        assert_eq!(rt.item(h).f, 4.0);
        ok(dfuse_tensor_shape(rt.0, h, ptr::null_mut(), 0));
    }
}

#[test]
fn a_release_of_cached_memory_with_a_bad_out_pointer_releases_nothing() {
    let rt = Rt::new(DfuseMode::Strict);
    let x = rt.f32s(&[1.0; 1024], &[1024]);
    // SAFETY: a live handle.
    ok(unsafe { dfuse_tensor_release(rt.0, x) });
    let cached = || {
        let mut s = std::mem::MaybeUninit::<DfuseStats>::uninit();
        // SAFETY: a valid out-pointer.
        ok(unsafe { dfuse_stats(rt.0, s.as_mut_ptr()) });
        // SAFETY: initialized by the successful call.
        unsafe { s.assume_init() }.host_cached_bytes
    };
    assert!(cached() > 0, "the freed tensor's block is cached");
    // SAFETY: NULL is a documented misuse, reported as an error.
    let st = unsafe { dfuse_release_cached_memory(rt.0, ptr::null_mut()) };
    assert_eq!(st, DfuseStatus::InvalidArgument);
    assert!(cached() > 0, "a failed call has no effect");
    let mut freed = 0;
    // SAFETY: a valid out-pointer.
    ok(unsafe { dfuse_release_cached_memory(rt.0, &mut freed) });
    assert!(freed > 0);
    assert_eq!(cached(), 0);
}

#[test]
fn timing_events_on_a_stream_give_the_milliseconds_between_them() {
    for mode in MODES {
        let rt = Rt::new(mode);
        let (mut s, mut a, mut b, mut plain) = (0, 0, 0, 0);
        let mut ms = -1.0;
        // SAFETY: valid out-pointers; handles come from this runtime.
        unsafe {
            ok(dfuse_stream_create(rt.0, &mut s));
            ok(dfuse_event_create_timing(rt.0, &mut a));
            ok(dfuse_event_create_timing(rt.0, &mut b));
            ok(dfuse_event_create(rt.0, &mut plain));
            ok(dfuse_event_record(rt.0, a, s));
            let x = rt.f32s(&[1.0; 1024], &[1024]);
            let mut y = 0;
            ok(dfuse_op(
                rt.0,
                s,
                DfuseOpKind::Unary as u32,
                &attrs(DfuseUnaryOp::Exp as u32),
                [t(x)].as_ptr(),
                1,
                0,
                &mut y,
            ));
            ok(dfuse_event_record(rt.0, b, s));
            ok(dfuse_event_elapsed_ms(rt.0, a, b, &mut ms));
            assert!(ms >= 0.0, "{mode:?}: {ms}");
            ok(dfuse_event_record(rt.0, plain, s));
            assert_eq!(
                dfuse_event_elapsed_ms(rt.0, a, plain, &mut ms),
                DfuseStatus::InvalidArgument
            );
            assert!(
                last_error().contains("the end event was created without timing"),
                "{}",
                last_error()
            );
            assert_eq!(ms, 0.0, "the out value is cleared on failure");
            ok(dfuse_stream_synchronize(rt.0, s));
            let mut done = false;
            ok(dfuse_stream_query(rt.0, s, &mut done));
            assert!(
                done,
                "{mode:?}: a synchronized stream has nothing left to run"
            );
            ok(dfuse_stream_destroy(rt.0, s));
        }
    }
}

#[test]
fn querying_a_stream_flushes_its_deferred_work_so_polling_finishes() {
    let rt = Rt::new(DfuseMode::Defer);
    let x = rt.f32s(&[2.0; 16], &[16]);
    let y = rt.op(
        DfuseOpKind::Unary,
        Some(&attrs(DfuseUnaryOp::Neg as u32)),
        &[t(x)],
    );
    let mut done = false;
    // SAFETY: valid out-pointer.
    while !done {
        ok(unsafe { dfuse_stream_query(rt.0, 0, &mut done) });
    }
    let mut state = 0;
    // SAFETY: valid out-pointer.
    ok(unsafe { dfuse_tensor_state(rt.0, y, &mut state) });
    assert_eq!(state, DfuseBufferState::Materialized as u32);
}

#[test]
fn a_memory_limit_turns_an_allocation_past_it_into_out_of_memory() {
    let rt = Rt::new(DfuseMode::Strict);
    let mut info = DfuseMemoryInfo::default();
    // SAFETY: valid out-pointers; handles come from this runtime.
    unsafe {
        let x = rt.f32s(&[1.0; 1024], &[1024]);
        ok(dfuse_memory_info(rt.0, &mut info));
        assert!(info.live_bytes >= 4096, "{info:?}");
        ok(dfuse_memory_limit_set(rt.0, info.live_bytes + 1024));
        let mut h = 0;
        let big = vec![0f32; 4096];
        let s = dfuse_tensor_from_host(
            rt.0,
            big.as_ptr().cast(),
            big.len() * 4,
            DfuseDtype::F32 as u32,
            [4096i64].as_ptr(),
            1,
            &mut h,
        );
        assert_eq!(s, DfuseStatus::OutOfMemory);
        assert!(
            last_error().contains("over the limit of"),
            "{}",
            last_error()
        );
        ok(dfuse_memory_limit_set(rt.0, 0));
        rt.f32s(&big, &[4096]);
        ok(dfuse_memory_info(rt.0, &mut info));
        assert_eq!(info.limit_bytes, 0);
        assert!(info.peak_live_bytes >= info.live_bytes);
        ok(dfuse_tensor_release(rt.0, x));
        ok(dfuse_memory_peak_reset(rt.0));
        ok(dfuse_memory_info(rt.0, &mut info));
        assert_eq!(info.peak_live_bytes, info.live_bytes);
    }
}

#[test]
fn pipeline_ops_set_returns_the_previous_value() {
    let rt = Rt::new(DfuseMode::Defer);
    let mut previous = u64::MAX;
    // SAFETY: a valid out-pointer.
    ok(unsafe { dfuse_pipeline_ops_set(rt.0, 16, &mut previous) });
    // SAFETY: as above.
    ok(unsafe { dfuse_pipeline_ops_set(rt.0, 0, &mut previous) });
    assert_eq!(previous, 16);
}

#[test]
fn a_pipeline_ops_set_with_a_null_out_pointer_changes_nothing() {
    let rt = Rt::new(DfuseMode::Defer);
    let mut previous = 0;
    // SAFETY: a valid out-pointer.
    ok(unsafe { dfuse_pipeline_ops_set(rt.0, 16, &mut previous) });
    // SAFETY: NULL is a documented misuse, reported as an error.
    let st = unsafe { dfuse_pipeline_ops_set(rt.0, 3, ptr::null_mut()) };
    assert_eq!(st, DfuseStatus::InvalidArgument);
    assert!(last_error().contains("previous"), "{}", last_error());
    // SAFETY: a valid out-pointer.
    ok(unsafe { dfuse_pipeline_ops_set(rt.0, 16, &mut previous) });
    assert_eq!(previous, 16, "the failed call left the value alone");
}
