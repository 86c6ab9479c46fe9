//! Bounded resources: the cap on bytes held by deferred values forces a flush and keeps a long
//! deferred chain within it; an allocation that cannot succeed is an `OutOfMemory` error (at
//! the op, or at the sync point that runs a deferred op), never an abort, and never a value
//! that silently reads as zeros; the program cache and the host block cache stay within their
//! configured bounds.

use deferfuse::{
    BinaryOp, BufferState, Config, DType, Error, Handle, Input, Mode, Op, Runtime, Scalar,
    SyncReason, UnaryOp, View,
};

/// 2^58 bytes: a valid size that no machine can allocate.
const HUGE: usize = 1 << 58;

fn rt(mode: Mode, cfg: Config) -> Runtime {
    Runtime::new(Config {
        mode: Some(mode),
        ..cfg
    })
    .unwrap()
}

fn f32s(rt: &Runtime, v: &[f32]) -> Handle {
    let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    rt.from_host(&b, DType::F32, &[v.len()]).unwrap()
}

fn read(rt: &Runtime, h: Handle) -> Result<Vec<f32>, Error> {
    let n: usize = rt.sizes(h)?.iter().product();
    let mut b = vec![0u8; n * 4];
    rt.to_host(h, &mut b)?;
    Ok(b.chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect())
}

fn add(rt: &Runtime, x: Handle, v: f64) -> Result<Handle, Error> {
    rt.op(
        0,
        Op::Binary(BinaryOp::Add),
        &[Input::Tensor(x), Input::Scalar(Scalar::Float(v))],
        None,
    )
}

fn neg(rt: &Runtime, x: Handle) -> Result<Handle, Error> {
    rt.op(0, Op::Unary(UnaryOp::Neg), &[Input::Tensor(x)], None)
}

fn assert_oom(r: Result<impl std::fmt::Debug, Error>, what: &str) {
    match r {
        Err(Error::OutOfMemory(m)) => assert!(m.contains("bytes"), "{what}: {m}"),
        other => panic!("{what}: expected OutOfMemory, got {other:?}"),
    }
}

#[test]
fn the_pending_bytes_cap_bounds_a_long_deferred_chain() {
    // Each op makes a 4 KiB buffer; a 16 KiB cap must flush at least every 5 ops.
    let r = rt(
        Mode::Defer,
        Config {
            max_pending_bytes: 16 << 10,
            ..Default::default()
        },
    );
    let mut x = f32s(&r, &[1.0; 1024]);
    let mut outs = vec![x];
    for _ in 0..40 {
        x = add(&r, x, 1.0).unwrap();
        outs.push(x);
    }
    let s = r.stats();
    let bound = s.sync_points[SyncReason::MemoryBound as usize];
    assert!(
        bound >= 40 / 5,
        "{bound} memory-bound flushes for 160 KiB of values"
    );
    // Everything older than the last flush has left the trace.
    let deferred = outs
        .iter()
        .filter(|&&h| r.state(h).unwrap() == BufferState::Deferred)
        .count();
    assert!(
        deferred <= 5,
        "{deferred} values still deferred under a 16 KiB cap"
    );
    assert_eq!(read(&r, x).unwrap(), vec![41.0; 1024]);
}

#[test]
fn an_allocation_that_cannot_succeed_is_out_of_memory_in_every_mode() {
    for mode in [Mode::Strict, Mode::Debug, Mode::Defer] {
        let r = rt(mode, Config::default());
        // `empty` allocates on first use, so the handle itself is fine.
        let e = r.empty(DType::U8, &[HUGE]).unwrap();
        assert_oom(neg(&r, e), &format!("{mode:?}: neg of 2^58 bytes"));
        let first = r.view(0, e, &View::Select { dim: 0, index: 0 }).unwrap();
        assert_oom(
            r.to_host(first, &mut [0u8]),
            &format!("{mode:?}: reading one byte of it"),
        );
        // The runtime is still usable.
        let x = f32s(&r, &[1.0, 2.0]);
        let y = add(&r, x, 1.0).unwrap();
        assert_eq!(read(&r, y).unwrap(), [2.0, 3.0], "{mode:?}");
    }
}

#[test]
fn a_deferred_op_that_cannot_allocate_fails_at_the_sync_point() {
    // No byte cap: the huge output is recorded, and only the flush finds out.
    let r = rt(
        Mode::Defer,
        Config {
            max_pending_bytes: usize::MAX,
            ..Default::default()
        },
    );
    let e = r.empty(DType::U8, &[HUGE]).unwrap();
    let big = neg(&r, e).expect("recording allocates nothing");
    assert_oom(r.synchronize(0), "the sync point that runs it");
    r.release(big).unwrap();
    let x = f32s(&r, &[1.0, 2.0]);
    let y = add(&r, x, 1.0).unwrap();
    assert_eq!(read(&r, y).unwrap(), [2.0, 3.0]);
}

#[test]
fn values_recorded_after_a_failed_allocation_never_read_as_zeros() {
    // One flush: a small value, the op that cannot allocate, then values that depend on the
    // first. The flush fails; afterwards each later value either reads correctly or reports
    // the failure, every time it is read. Reading zeros would be a silently wrong result.
    let r = rt(
        Mode::Defer,
        Config {
            max_pending_bytes: usize::MAX,
            ..Default::default()
        },
    );
    let x = f32s(&r, &[1.0, 2.0]);
    let a = add(&r, x, 1.0).unwrap();
    let e = r.empty(DType::U8, &[HUGE]).unwrap();
    let big = neg(&r, e).unwrap();
    let c = add(&r, a, 10.0).unwrap();
    let d = r
        .op(0, Op::Unary(UnaryOp::Exp), &[Input::Tensor(c)], None)
        .unwrap();
    assert_oom(read(&r, d), "the read that runs the flush");
    for (h, want) in [(a, vec![2.0f32, 3.0]), (c, vec![12.0, 13.0])] {
        for attempt in 0..2 {
            match read(&r, h) {
                Ok(v) => assert_eq!(v, want, "read {attempt} of a value after the failure"),
                Err(Error::OutOfMemory(_)) => {}
                Err(other) => panic!("read {attempt}: unexpected {other}"),
            }
        }
    }
    // An op reading a lost value cannot compute from stale memory either.
    if read(&r, c).is_err() {
        assert_oom(add(&r, c, 1.0), "an op reading the lost value");
    }
    r.release(big).unwrap();
}

/// A u8 tensor `x` whose in-place write `x += big[0]` is lost to the flush that cannot
/// allocate `big` (the sync point reported it): the runtime and `x`.
fn x_lost_to_a_failed_flush() -> (Runtime, Handle) {
    let r = rt(
        Mode::Defer,
        Config {
            max_pending_bytes: usize::MAX,
            ..Default::default()
        },
    );
    let x = r.from_host(&[1, 2], DType::U8, &[2]).unwrap();
    let e = r.empty(DType::U8, &[HUGE]).unwrap();
    let big = neg(&r, e).unwrap();
    let first = r.view(0, big, &View::Select { dim: 0, index: 0 }).unwrap();
    let add = Op::Binary(BinaryOp::Add);
    r.op(0, add, &[Input::Tensor(x), Input::Tensor(first)], Some(x))
        .unwrap();
    assert_oom(r.synchronize(0), "the flush that would write x");
    (r, x)
}

fn read_u8(rt: &Runtime, h: Handle) -> Result<Vec<u8>, Error> {
    let mut b = vec![0u8; 2];
    rt.to_host(h, &mut b)?;
    Ok(b)
}

#[test]
fn a_tensor_whose_write_was_lost_reports_the_failure_until_it_is_overwritten() {
    let (r, x) = x_lost_to_a_failed_flush();
    assert_oom(read_u8(&r, x), "reading x");
    // An in-place op that reads x cannot make a value from the lost one.
    let add = Op::Binary(BinaryOp::Add);
    let one = Input::Scalar(Scalar::Int(1));
    assert_oom(
        r.op(0, add, &[Input::Tensor(x), one], Some(x)),
        "x += 1 on the lost value",
    );
    // A copy into the whole tensor makes a new value (a reload after the out-of-memory
    // error, as `load_state_dict` or `fill_` does): x is usable again.
    let fresh = r.from_host(&[7, 9], DType::U8, &[2]).unwrap();
    r.op(0, Op::Copy, &[Input::Tensor(fresh)], Some(x)).unwrap();
    assert_eq!(read_u8(&r, x).unwrap(), [7, 9]);
}

#[test]
fn a_copy_into_part_of_a_lost_tensor_still_reports_the_failure() {
    // The rest of the tensor is still the lost value.
    let (r, x) = x_lost_to_a_failed_flush();
    let half = r.view(0, x, &View::Select { dim: 0, index: 0 }).unwrap();
    let fresh = r.from_host(&[7], DType::U8, &[]).unwrap();
    assert_oom(
        r.op(0, Op::Copy, &[Input::Tensor(fresh)], Some(half)),
        "a copy into x[0]",
    );
}

#[test]
fn the_program_cache_never_holds_more_than_its_capacity() {
    let r = rt(
        Mode::Strict,
        Config {
            cache_capacity: 3,
            ..Default::default()
        },
    );
    let x = f32s(&r, &[0.5; 8]);
    // Twelve different unary programs, twice over: each compiles once, most are evicted (the
    // second round reuses the stream's own plans, a cache bounded apart: `node_cache.rs`).
    for round in 0..2 {
        for u in &UnaryOp::ALL[..12] {
            let y = r.op(0, Op::Unary(*u), &[Input::Tensor(x)], None).unwrap();
            read(&r, y).unwrap();
            r.release(y).unwrap();
            let s = r.stats();
            let held = s.programs_compiled - s.cache_evictions;
            assert!(held <= 3, "round {round}: {held} programs held: {s:?}");
        }
    }
    let s = r.stats();
    assert!(s.cache_evictions >= 12 - 3, "{s:?}");
    assert_eq!(
        (s.programs_compiled, s.strict_plans_reused),
        (12, 12),
        "{s:?}"
    );
}

#[test]
fn the_host_cache_stays_within_its_bound_under_concurrent_churn() {
    const LIMIT: usize = 256 << 10;
    let r = std::sync::Arc::new(rt(
        Mode::Strict,
        Config {
            host_cache_bytes: LIMIT,
            ..Default::default()
        },
    ));
    let workers: Vec<_> = (0..6)
        .map(|t| {
            let r = r.clone();
            std::thread::spawn(move || {
                for k in 0..60 {
                    let n = 256 << ((t + k) % 6); // 1 KiB .. 32 KiB of f32
                    let x = f32s(&r, &vec![k as f32; n]);
                    let y = add(&r, x, 1.0).unwrap();
                    assert_eq!(read(&r, y).unwrap()[n - 1], k as f32 + 1.0);
                    r.release(x).unwrap();
                    r.release(y).unwrap();
                    let held = r.stats().host_cached_bytes as usize;
                    assert!(held <= LIMIT, "{held} cached bytes over the {LIMIT} limit");
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert!(r.stats().host_cache_hits > 0);
    r.release_cached_memory();
    assert_eq!(r.stats().host_cached_bytes, 0);
}
