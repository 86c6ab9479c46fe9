//! Which numbers of a whole-flush binding are the batch, so one module serves every batch size
//! of a bucket (see `graph_bucket`).
//!
//! A whole-flush signature is concrete numbers: buffer lengths, and each part's view sizes,
//! strides and offsets and iteration space. A batch of 64 looks like a hidden size of 64, so
//! the batch is found as torch.compile's automatic dynamic finds it: on the second signature of
//! the same graph, the numbers that changed are the batch-derived ones. They must all be
//! multiples of one unit (the batch: `N`, `N*784`, ...), and only sizes and lengths may change:
//! a stride or offset that depends on the batch means the batch is not the outermost dim of a
//! buffer, and the padding would not sit at the end of its flat array.

use deferfuse_fusion::region::{GraphRegion, Region};
use deferfuse_fusion::Binding;

/// What a number of the signature is; only sizes and lengths may depend on the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A boundary buffer's length in bytes.
    Len,
    /// A view's or iteration space's size.
    Size,
    /// A view's or iteration space's stride.
    Stride,
    /// A view's offset.
    Offset,
    /// A rank, a reduced-dims count, a matmul's beta-is-zero flag.
    Other,
}

/// Visits every number of binding `b` (a graph's) and its boundary buffers' byte lengths
/// `lens`, in signature order, letting `f` replace each. One walk serves both reading the
/// signature and writing a binding at another batch size, so the two cannot drift apart.
fn walk(g: &GraphRegion, b: &mut Binding, lens: &mut [usize], f: &mut dyn FnMut(Kind, i64) -> i64) {
    fn u(f: &mut dyn FnMut(Kind, i64) -> i64, k: Kind, x: &mut usize) {
        *x = f(k, *x as i64) as usize;
    }
    for l in lens.iter_mut() {
        u(f, Kind::Len, l);
    }
    for (part, pb) in g.parts.iter().zip(b.parts.iter_mut()) {
        let beta = f64::from_bits(pb.scalars.get(1).copied().unwrap_or(0)) == 0.0;
        for t in pb.operands.iter_mut() {
            let l = &mut t.layout;
            u(f, Kind::Offset, &mut l.offset);
            f(Kind::Other, l.sizes.len() as i64);
            for s in l.sizes.iter_mut() {
                u(f, Kind::Size, s);
            }
            for s in l.strides.iter_mut() {
                *s = f(Kind::Stride, *s as i64) as isize;
            }
        }
        if let Some(it) = pb.iter.as_mut() {
            f(Kind::Other, it.rank() as i64 | (it.reduced as i64) << 32);
            for s in it.sizes.iter_mut() {
                u(f, Kind::Size, s);
            }
            for st in it.strides.iter_mut() {
                for s in st.iter_mut() {
                    *s = f(Kind::Stride, *s as i64) as isize;
                }
            }
        }
        if matches!(*part.region, Region::Matmul { .. }) {
            f(Kind::Other, beta as i64);
        }
    }
}

/// The signature of graph `g` bound to `b` on boundary buffers of `lens` bytes:
/// every number the module depends on, with what it is.
pub fn numbers(g: &GraphRegion, b: &Binding, lens: &[usize]) -> Vec<(Kind, i64)> {
    let mut out = Vec::new();
    // The walk writes back what `f` returns; on a clone, so reading costs one copy.
    let (mut b, mut lens) = (b.clone(), lens.to_vec());
    walk(g, &mut b, &mut lens, &mut |k, x| {
        out.push((k, x));
        x
    });
    out
}

/// How a graph's numbers depend on its batch: each is `coeff * batch`, or the constant `base`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    kinds: Vec<Kind>,
    base: Vec<i64>,
    coeff: Vec<i64>,
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl Template {
    /// The template two signatures of one graph share, or why there is none.
    pub fn infer(a: &[(Kind, i64)], b: &[(Kind, i64)]) -> Result<Template, String> {
        if a.len() != b.len() || a.iter().zip(b).any(|(x, y)| x.0 != y.0) {
            return Err("the flush's views changed rank between the two batch sizes".into());
        }
        let changed: Vec<usize> = (0..a.len()).filter(|&i| a[i].1 != b[i].1).collect();
        if let Some(&i) = changed
            .iter()
            .find(|&&i| !matches!(a[i].0, Kind::Size | Kind::Len))
        {
            return Err(format!(
                "a view's {} changed with the batch ({} -> {}): the batch is not the \
                 outermost dim of every buffer it sizes",
                match a[i].0 {
                    Kind::Stride => "stride",
                    Kind::Offset => "offset",
                    _ => "rank or flags",
                },
                a[i].1,
                b[i].1
            ));
        }
        if changed.is_empty() {
            return Err("the two signatures are the same".into());
        }
        let g = |s: &[(Kind, i64)]| changed.iter().fold(0, |g, &i| gcd(g, s[i].1));
        let (ga, gb) = (g(a), g(b));
        let mut coeff = vec![0; a.len()];
        for &i in &changed {
            if ga == 0 || gb == 0 || a[i].1 / ga != b[i].1 / gb {
                return Err(format!(
                    "the changed sizes are not multiples of one batch size ({} -> {} against \
                     a batch of {ga} -> {gb})",
                    a[i].1, b[i].1
                ));
            }
            coeff[i] = a[i].1 / ga;
        }
        let base = a
            .iter()
            .zip(&coeff)
            .map(|(x, &c)| if c == 0 { x.1 } else { 0 })
            .collect();
        Ok(Template {
            kinds: a.iter().map(|x| x.0).collect(),
            base,
            coeff,
        })
    }

    /// The batch of signature `s` if it is this template's at some batch, else `None`.
    pub fn batch_of(&self, s: &[(Kind, i64)]) -> Option<usize> {
        if s.len() != self.coeff.len() {
            return None;
        }
        let i = self.coeff.iter().position(|&c| c != 0)?;
        let n = s[i].1 / self.coeff[i];
        let fits = s
            .iter()
            .enumerate()
            .all(|(i, x)| x.0 == self.kinds[i] && x.1 == self.base[i] + self.coeff[i] * n);
        (fits && n > 0).then_some(n as usize)
    }

    /// Binding `b` (any of this template's) and its lengths `lens`, at batch `n`.
    pub fn at(
        &self,
        g: &GraphRegion,
        b: &Binding,
        lens: &[usize],
        n: usize,
    ) -> (Binding, Vec<usize>) {
        let (mut b, mut lens) = (b.clone(), lens.to_vec());
        let mut i = 0;
        walk(g, &mut b, &mut lens, &mut |_, x| {
            let v = if self.coeff[i] == 0 {
                x
            } else {
                self.coeff[i] * n as i64
            };
            i += 1;
            v
        });
        (b, lens)
    }

    /// A stable key of the template (part of a bucketed module's cache key).
    pub fn key(&self) -> Vec<u64> {
        self.base
            .iter()
            .zip(&self.coeff)
            .flat_map(|(&b, &c)| [b as u64, c as u64])
            .collect()
    }
}
