//! Host memory: freed blocks are reused by later allocations of the same size, reused blocks
//! never leak old contents into tensors that must read as zeros, and the cache is bounded and
//! can be emptied.

use deferfuse::*;

fn rt(mode: Mode, cache: usize) -> Runtime {
    Runtime::new(Config {
        mode: Some(mode),
        host_cache_bytes: cache,
        ..Default::default()
    })
    .unwrap()
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn read(rt: &Runtime, h: Handle) -> Vec<f32> {
    let n: usize = rt.sizes(h).unwrap().iter().product();
    let mut b = vec![0u8; n * 4];
    rt.to_host(h, &mut b).unwrap();
    b.chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn a_training_style_loop_reuses_freed_blocks() {
    for mode in [Mode::Strict, Mode::Defer] {
        let r = rt(mode, 1 << 30);
        let x = r
            .from_host(&f32s(&[1.0; 4096]), DType::F32, &[4096])
            .unwrap();
        for _ in 0..10 {
            let y = r
                .op(
                    0,
                    Op::Binary(BinaryOp::Mul),
                    &[Input::Tensor(x), Input::Scalar(Scalar::Float(2.0))],
                    None,
                )
                .unwrap();
            let z = r
                .op(0, Op::Unary(UnaryOp::Exp), &[Input::Tensor(y)], None)
                .unwrap();
            read(&r, z);
            r.release(y).unwrap();
            r.release(z).unwrap();
        }
        let s = r.stats();
        assert!(s.host_cache_hits >= 9, "{mode:?}: {s:?}");
        assert!(s.host_cache_misses <= 3, "{mode:?}: {s:?}");
    }
}

#[test]
fn a_reused_block_reads_as_zeros_where_nothing_was_written() {
    let r = rt(Mode::Strict, 1 << 30);
    let dirty = r.from_host(&f32s(&[7.0; 64]), DType::F32, &[64]).unwrap();
    r.release(dirty).unwrap();
    // Same size class: likely the very block `dirty` freed. Only half of it is written.
    let e = r.empty(DType::F32, &[64]).unwrap();
    let half = r
        .view(
            0,
            e,
            &View::Slice {
                dim: 0,
                start: 0,
                end: 32,
                step: 1,
            },
        )
        .unwrap();
    r.op(
        0,
        Op::Full {
            sizes: [32usize].into_iter().collect(),
            dtype: DType::F32,
        },
        &[Input::Scalar(Scalar::Float(1.0))],
        Some(half),
    )
    .unwrap();
    let v = read(&r, e);
    assert_eq!(&v[..32], &[1.0; 32]);
    assert_eq!(
        &v[32..],
        &[0.0; 32],
        "unwritten elements of an empty tensor read as zeros"
    );
    assert!(r.stats().host_cache_hits >= 1);
}

#[test]
fn the_host_cache_is_bounded_and_can_be_released() {
    let r = rt(Mode::Strict, 100_000);
    let hs: Vec<Handle> = (0..8)
        .map(|i| {
            r.from_host(&f32s(&vec![i as f32; 10_000]), DType::F32, &[10_000])
                .unwrap()
        })
        .collect();
    for h in hs {
        r.release(h).unwrap();
    }
    assert!(r.stats().host_cached_bytes <= 100_000);
    assert!(r.stats().host_cached_bytes > 0);
    assert!(r.release_cached_memory() > 0);
    assert_eq!(r.stats().host_cached_bytes, 0);
}

#[test]
fn a_zero_byte_cache_never_holds_memory() {
    let r = rt(Mode::Strict, 0);
    let h = r.from_host(&f32s(&[1.0; 100]), DType::F32, &[100]).unwrap();
    r.release(h).unwrap();
    assert_eq!(r.stats().host_cached_bytes, 0);
}

#[test]
fn a_strict_loop_without_sync_points_holds_a_bounded_number_of_outputs() {
    // Each op's output is allocated at its launch and freed when its job has run: a host that
    // ran ahead without bound would hold one block per op it launched.
    use deferfuse::runtime::stream::MAX_QUEUED;
    let n = 1 << 16;
    let block = (n * 4) as u64;
    let ops = 2 * MAX_QUEUED + 100;
    let r = rt(Mode::Strict, 1 << 30);
    let x = r.from_host(&f32s(&vec![0.5; n]), DType::F32, &[n]).unwrap();
    for _ in 0..ops {
        let y = r
            .op(0, Op::Unary(UnaryOp::Exp), &[Input::Tensor(x)], None)
            .unwrap();
        r.release(y).unwrap();
    }
    r.synchronize_all().unwrap();
    let peak = r.memory().peak_live_bytes;
    assert!(
        peak <= (MAX_QUEUED + 4) * block + block,
        "{ops} strict ops of {block} bytes each peaked at {} blocks live",
        peak / block
    );
}
