use deferfuse::*;

fn f32s(rt: &Runtime, h: Handle) -> Vec<f32> {
    let n: usize = rt.sizes(h).unwrap().iter().product();
    let mut b = vec![0u8; n * 4];
    rt.to_host(h, &mut b).unwrap();
    b.chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
fn tensor(rt: &Runtime, v: &[f32], s: &[usize]) -> Handle {
    let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    rt.from_host(&b, DType::F32, s).unwrap()
}

#[test]
fn smoke() {
    for mode in [Mode::Strict, Mode::Debug, Mode::Defer] {
        let rt = Runtime::new(Config {
            mode: Some(mode),
            ..Default::default()
        })
        .unwrap();
        let a = tensor(&rt, &[1., 2., 3., 4., 5., 6., 7.], &[7]);
        let b = tensor(&rt, &[1., 1., 1., 1., 1., 1., 2.], &[7]);
        let c = rt
            .op(
                0,
                Op::Binary(BinaryOp::Add),
                &[Input::Tensor(a), Input::Tensor(b)],
                None,
            )
            .unwrap();
        let e = rt
            .op(0, Op::Unary(UnaryOp::Exp), &[Input::Tensor(c)], None)
            .unwrap();
        let s = rt
            .op(
                0,
                Op::Reduce {
                    op: ReduceOp::Sum,
                    dims: Default::default(),
                    keepdim: false,
                },
                &[Input::Tensor(c)],
                None,
            )
            .unwrap();
        println!(
            "{mode:?} {:?} {:?} {:?}",
            f32s(&rt, c),
            f32s(&rt, e),
            f32s(&rt, s)
        );
        let m = tensor(&rt, &[1., 2., 3., 4., 5., 6.], &[2, 3]);
        let mt = rt.view(0, m, &View::Transpose(0, 1)).unwrap();
        let mm = rt
            .op(0, Op::Matmul, &[Input::Tensor(m), Input::Tensor(mt)], None)
            .unwrap();
        println!("{:?} {:?}", f32s(&rt, mm), rt.stats());
        let am = rt
            .op(
                0,
                Op::Reduce {
                    op: ReduceOp::Argmax,
                    dims: [1].into_iter().collect(),
                    keepdim: false,
                },
                &[Input::Tensor(m)],
                None,
            )
            .unwrap();
        let mut o = vec![0u8; 16];
        rt.to_host(am, &mut o).unwrap();
        println!("{o:?}");
    }
}
