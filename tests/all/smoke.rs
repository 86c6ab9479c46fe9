//! A first end-to-end check: a few ops in every mode give the known answers.

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
        let sum = Op::Reduce {
            op: ReduceOp::Sum,
            dims: Default::default(),
            keepdim: false,
        };
        let s = rt.op(0, sum, &[Input::Tensor(c)], None).unwrap();
        assert_eq!(f32s(&rt, c), [2., 3., 4., 5., 6., 7., 9.], "{mode:?}");
        for (got, x) in f32s(&rt, e).iter().zip([2f32, 3., 4., 5., 6., 7., 9.]) {
            assert!(
                (got - x.exp()).abs() <= 5e-7 * x.exp(),
                "{mode:?}: exp({x}) = {got}"
            );
        }
        assert_eq!(f32s(&rt, s), [36.], "{mode:?}");
        let m = tensor(&rt, &[1., 2., 3., 4., 5., 6.], &[2, 3]);
        let mt = rt.view(0, m, &View::Transpose(0, 1)).unwrap();
        let mm = rt
            .op(0, Op::Matmul, &[Input::Tensor(m), Input::Tensor(mt)], None)
            .unwrap();
        assert_eq!(f32s(&rt, mm), [14., 32., 32., 77.], "{mode:?}");
        let am = Op::Reduce {
            op: ReduceOp::Argmax,
            dims: [1].into_iter().collect(),
            keepdim: false,
        };
        let am = rt.op(0, am, &[Input::Tensor(m)], None).unwrap();
        let mut o = vec![0u8; 16];
        rt.to_host(am, &mut o).unwrap();
        assert_eq!(
            o,
            [2, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0],
            "{mode:?}"
        );
    }
}
