//! Running one elementwise program on the CPU backend over 1-D inputs of each lane type, and
//! checking that the vectorized main loop and the scalar tail give the same bits.

use deferfuse_fusion::ir::{BinaryOp, DType, Op, UnaryOp};
use deferfuse_runtime::{Config, Handle, Input, Mode, Runtime};

/// A defer-mode runtime, so that a chain of ops is one fused loop.
pub fn runtime() -> Runtime {
    Runtime::new(Config {
        mode: Some(Mode::Defer),
        ..Default::default()
    })
    .unwrap()
}

/// Little-endian element codec for the test dtypes.
pub trait Elem: Copy + std::fmt::Debug {
    const D: DType;
    fn put(self, out: &mut Vec<u8>);
    fn get(b: &[u8]) -> Self;
    fn bits(self) -> u64;
}

macro_rules! elem {
    ($t:ty, $d:expr, $bits:expr) => {
        impl Elem for $t {
            const D: DType = $d;
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().unwrap())
            }
            fn bits(self) -> u64 {
                $bits(self)
            }
        }
    };
}
elem!(f64, DType::F64, |x: f64| x.to_bits());
elem!(f32, DType::F32, |x: f32| x.to_bits() as u64);
elem!(i64, DType::I64, |x: i64| x as u64);
elem!(i32, DType::I32, |x: i32| x as u32 as u64);
elem!(u8, DType::U8, |x: u8| x as u64);

/// A 1-D tensor of `xs`.
pub fn upload<T: Elem>(rt: &Runtime, xs: &[T]) -> Handle {
    let mut bytes = Vec::new();
    for &x in xs {
        x.put(&mut bytes);
    }
    rt.from_host(&bytes, T::D, &[xs.len()]).unwrap()
}

/// The first `n` elements of `h`.
pub fn download<T: Elem>(rt: &Runtime, h: Handle, n: usize) -> Vec<T> {
    let size = std::mem::size_of::<T>();
    let mut out = vec![0u8; n * size];
    rt.to_host(h, &mut out).unwrap();
    out.chunks(size).map(T::get).collect()
}

/// A tensor operand.
pub fn t(h: Handle) -> Input {
    Input::Tensor(h)
}

/// Records `op(x, y)`.
pub fn bin(rt: &Runtime, op: BinaryOp, x: Input, y: Input) -> Handle {
    rt.op(0, Op::Binary(op), &[x, y], None).unwrap()
}

/// Records `op(x)`.
pub fn un(rt: &Runtime, op: UnaryOp, x: Handle) -> Handle {
    rt.op(0, Op::Unary(op), &[t(x)], None).unwrap()
}

/// Records `x.to(d)`.
pub fn cast(rt: &Runtime, x: Handle, d: DType) -> Handle {
    rt.op(0, Op::Cast(d), &[t(x)], None).unwrap()
}

/// `f(x)` of a 1-D input in one deferred (fused) program.
pub fn apply<T: Elem, U: Elem>(xs: &[T], f: impl Fn(&Runtime, Handle) -> Handle) -> Vec<U> {
    let rt = runtime();
    let x = upload(&rt, xs);
    let y = f(&rt, x);
    download(&rt, y, xs.len())
}

/// Runs `f` on every prefix of `xs` (lengths 1..=len) and checks each element's result is the
/// same bits whichever loop (8-wide, 4-wide or the tail) computed it.
pub fn main_loop_and_tail_agree<T: Elem, U: Elem>(
    xs: &[T],
    f: impl Fn(&Runtime, Handle) -> Handle,
) {
    let full: Vec<U> = apply(xs, &f);
    for n in 1..=xs.len() {
        let part: Vec<U> = apply(&xs[..n], &f);
        for k in 0..n {
            assert_eq!(
                part[k].bits(),
                full[k].bits(),
                "element {k} of a length-{n} run: {:?} vs {:?} at length {}",
                part[k],
                full[k],
                xs.len()
            );
        }
    }
}
