//! A tiny writer of StableHLO MLIR text in the generic op form (`"stablehlo.add"(%a, %b) :
//! (..) -> ..`): one syntax for every op, so each emitter is one line and the parser never has to
//! guess a pretty form. One op per line; the entry function is `@main`.

use deferfuse_fusion::ir::DType;
use std::fmt::Write;

/// The `precision_config` every product and convolution carries: full precision for both
/// operands. XLA's default lets a GPU plugin multiply float32 in TF32 (10-bit mantissas): on an
/// H200 an MLP's AdamW step then gave a parameter 2.4% off the CPU backend's (session 25).
const HIGHEST_PRECISION: &str = "[#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]";

/// An element type in the program. Values are kept in their dtype's compute type, like the CPU
/// backend's registers: f16/bf16 as f32, u8/bool/i32 as i32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    F32,
    F64,
    I32,
    I64,
    I1,
}

impl Elem {
    /// The compute element of `d`.
    pub fn of(d: DType) -> Elem {
        match d.compute() {
            DType::F32 => Elem::F32,
            DType::F64 => Elem::F64,
            DType::I64 => Elem::I64,
            _ => Elem::I32,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Elem::F32 => "f32",
            Elem::F64 => "f64",
            Elem::I32 => "i32",
            Elem::I64 => "i64",
            Elem::I1 => "i1",
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, Elem::F32 | Elem::F64)
    }

    /// Bytes per element in staging buffers.
    pub fn size(self) -> usize {
        match self {
            Elem::F64 | Elem::I64 => 8,
            _ => 4,
        }
    }
}

/// A tensor type: element and static dims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ty {
    pub elem: Elem,
    pub dims: Vec<usize>,
}

impl Ty {
    pub fn new(elem: Elem, dims: &[usize]) -> Ty {
        Ty {
            elem,
            dims: dims.to_vec(),
        }
    }

    pub fn with(&self, elem: Elem) -> Ty {
        Ty {
            elem,
            dims: self.dims.clone(),
        }
    }
}

impl std::fmt::Display for Ty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("tensor<")?;
        for d in &self.dims {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", self.elem.name())
    }
}

/// An SSA value and its type.
#[derive(Clone, Debug)]
pub struct Val {
    pub name: String,
    pub ty: Ty,
}

/// Builds the body of `@main`.
#[derive(Default)]
pub struct Func {
    text: String,
    next: usize,
    pub args: Vec<Ty>,
    indent: usize,
}

/// An MLIR dense i64 array attribute (`array<i64>` when empty: `array<i64: >` does not parse).
fn arr<T: std::fmt::Display>(v: &[T]) -> String {
    if v.is_empty() {
        return "array<i64>".into();
    }
    let items: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    format!("array<i64: {}>", items.join(", "))
}

impl Func {
    /// Declares the next argument of `@main`.
    pub fn arg(&mut self, ty: Ty) -> Val {
        self.args.push(ty.clone());
        Val {
            name: format!("%arg{}", self.args.len() - 1),
            ty,
        }
    }

    fn fresh(&mut self) -> String {
        self.next += 1;
        format!("%v{}", self.next)
    }

    /// Emits `op` on `operands` with attributes `attrs` (may be empty) yielding `ty`.
    pub fn op(&mut self, op: &str, operands: &[&Val], attrs: &str, ty: Ty) -> Val {
        let name = self.fresh();
        let names: Vec<&str> = operands.iter().map(|v| v.name.as_str()).collect();
        // `chlo.erf` and friends name their dialect; everything else is StableHLO.
        let dialect = if op.contains('.') { "" } else { "stablehlo." };
        let tys: Vec<String> = operands.iter().map(|v| v.ty.to_string()).collect();
        let attrs = if attrs.is_empty() {
            String::new()
        } else {
            format!(" {{{attrs}}}")
        };
        let _ = writeln!(
            self.text,
            "{:w$}{name} = \"{dialect}{op}\"({}){attrs} : ({}) -> {ty}",
            "",
            names.join(", "),
            tys.join(", "),
            w = 4 + self.indent
        );
        Val { name, ty }
    }

    /// An elementwise op whose result has the type of its first operand.
    pub fn ew(&mut self, op: &str, operands: &[&Val]) -> Val {
        let ty = operands[0].ty.clone();
        self.op(op, operands, "", ty)
    }

    /// A splat constant of `ty` from its literal (`0x..` bits for floats, decimal for ints).
    pub fn constant(&mut self, lit: &str, ty: Ty) -> Val {
        let name = self.fresh();
        let _ = writeln!(
            self.text,
            "{:w$}{name} = \"stablehlo.constant\"() {{value = dense<{lit}> : {ty}}} : () -> {ty}",
            "",
            w = 4 + self.indent
        );
        Val { name, ty }
    }

    /// A float constant `x` of element `e` (exact bits, so inf and NaN survive the text).
    pub fn fconst(&mut self, x: f64, ty: Ty) -> Val {
        let lit = match ty.elem {
            Elem::F32 => format!("0x{:08X}", (x as f32).to_bits()),
            Elem::F64 => format!("0x{:016X}", x.to_bits()),
            Elem::I1 => (x != 0.0).to_string(),
            _ => (x as i64).to_string(),
        };
        self.constant(&lit, ty)
    }

    pub fn iconst(&mut self, x: i64, ty: Ty) -> Val {
        self.constant(&x.to_string(), ty)
    }

    pub fn convert(&mut self, v: &Val, e: Elem) -> Val {
        if v.ty.elem == e {
            return v.clone();
        }
        let ty = v.ty.with(e);
        self.op("convert", &[v], "", ty)
    }

    pub fn compare(&mut self, dir: &str, a: &Val, b: &Val) -> Val {
        let kind = if a.ty.elem.is_float() {
            "FLOAT"
        } else {
            "SIGNED"
        };
        let attrs = format!(
            "comparison_direction = #stablehlo<comparison_direction {dir}>, \
             compare_type = #stablehlo<comparison_type {kind}>"
        );
        let ty = a.ty.with(Elem::I1);
        self.op("compare", &[a, b], &attrs, ty)
    }

    pub fn select(&mut self, p: &Val, a: &Val, b: &Val) -> Val {
        let ty = a.ty.clone();
        self.op("select", &[p, a, b], "", ty)
    }

    /// `v` broadcast to `dims`, its dims landing on `map`.
    pub fn broadcast(&mut self, v: &Val, dims: &[usize], map: &[usize]) -> Val {
        if v.ty.dims == dims {
            return v.clone();
        }
        let ty = Ty::new(v.ty.elem, dims);
        let attrs = format!("broadcast_dimensions = {}", arr(map));
        self.op("broadcast_in_dim", &[v], &attrs, ty)
    }

    pub fn iota(&mut self, dim: usize, ty: Ty) -> Val {
        let name = self.fresh();
        let _ = writeln!(
            self.text,
            "{:w$}{name} = \"stablehlo.iota\"() {{iota_dimension = {dim} : i64}} : () -> {ty}",
            "",
            w = 4 + self.indent
        );
        Val { name, ty }
    }

    pub fn reshape(&mut self, v: &Val, dims: &[usize]) -> Val {
        if v.ty.dims == dims {
            return v.clone();
        }
        let ty = Ty::new(v.ty.elem, dims);
        self.op("reshape", &[v], "", ty)
    }

    /// `v[start..limit]` of a 1-D `v`.
    pub fn slice(&mut self, v: &Val, start: usize, limit: usize) -> Val {
        let attrs = format!(
            "start_indices = {}, limit_indices = {}, strides = {}",
            arr(&[start]),
            arr(&[limit]),
            arr(&[1])
        );
        let ty = Ty::new(v.ty.elem, &[limit - start]);
        self.op("slice", &[v], &attrs, ty)
    }

    /// The leading `limit[d]` elements of `v` along each dim `d`.
    pub fn take(&mut self, v: &Val, limit: &[usize]) -> Val {
        if v.ty.dims == limit {
            return v.clone();
        }
        let attrs = format!(
            "start_indices = {}, limit_indices = {}, strides = {}",
            arr(&vec![0; limit.len()]),
            arr(limit),
            arr(&vec![1; limit.len()])
        );
        let ty = Ty::new(v.ty.elem, limit);
        self.op("slice", &[v], &attrs, ty)
    }

    /// `v` padded with zeros at the end of each dim up to `dims`.
    pub fn pad_zeros(&mut self, v: &Val, dims: &[usize]) -> Val {
        let high: Vec<i64> = dims
            .iter()
            .zip(&v.ty.dims)
            .map(|(&a, &b)| a as i64 - b as i64)
            .collect();
        let n = dims.len();
        self.pad(v, &vec![0; n], &high, &vec![0; n])
    }

    /// `v` with zeros added before (`low`) and after (`high`) each dim and `interior` zeros
    /// between its elements; a negative `low` or `high` drops that many elements instead.
    pub fn pad(&mut self, v: &Val, low: &[i64], high: &[i64], interior: &[usize]) -> Val {
        let n = v.ty.dims.len();
        if low.iter().chain(high).all(|&x| x == 0) && interior.iter().all(|&x| x == 0) {
            return v.clone();
        }
        let dims: Vec<usize> = (0..n)
            .map(|d| {
                let s = v.ty.dims[d] as i64;
                let spread = s + (s - 1).max(0) * interior[d] as i64;
                let len = spread + low[d] + high[d];
                assert!(len >= 0, "a pad leaves a negative size");
                len as usize
            })
            .collect();
        let zero = self.fconst(0.0, Ty::new(v.ty.elem, &[]));
        let attrs = format!(
            "edge_padding_low = {}, edge_padding_high = {}, interior_padding = {}",
            arr(low),
            arr(high),
            arr(interior)
        );
        let ty = Ty::new(v.ty.elem, &dims);
        self.op("pad", &[v, &zero], &attrs, ty)
    }

    /// Every `strides[d]`-th element of `v` along each dim `d` from `start[d]`, `count[d]` of
    /// them.
    pub fn slice_strided(
        &mut self,
        v: &Val,
        start: &[usize],
        count: &[usize],
        strides: &[usize],
    ) -> Val {
        if start.iter().all(|&x| x == 0) && count == v.ty.dims && strides.iter().all(|&x| x == 1) {
            return v.clone();
        }
        let limit: Vec<usize> = (0..start.len())
            .map(|d| match count[d] {
                0 => start[d],
                c => start[d] + (c - 1) * strides[d] + 1,
            })
            .collect();
        let attrs = format!(
            "start_indices = {}, limit_indices = {}, strides = {}",
            arr(start),
            arr(&limit),
            arr(strides)
        );
        let ty = Ty::new(v.ty.elem, count);
        self.op("slice", &[v], &attrs, ty)
    }

    /// `stablehlo.dot_general` of `a` and `b` with `dimension_numbers` (a `#stablehlo.dot<..>`
    /// attribute) yielding `ty`, at full precision.
    pub fn dot_general(&mut self, a: &Val, b: &Val, dimension_numbers: &str, ty: Ty) -> Val {
        let attrs = format!(
            "dot_dimension_numbers = {dimension_numbers}, precision_config = {HIGHEST_PRECISION}"
        );
        self.op("dot_general", &[a, b], &attrs, ty)
    }

    /// A convolution of `lhs` (`[batch, features, spatial...]`) with kernel `rhs`
    /// (`[out features, in features per group, spatial...]`) in `groups` feature groups, with
    /// no padding and no input dilation: output position `o` of each spatial dim `d` sums
    /// window position `j` at input position `o * strides[d] + j * dilation[d]`. The result,
    /// `[batch, out features, spatial...]`, has the sizes `out`.
    pub fn convolution(
        &mut self,
        lhs: &Val,
        rhs: &Val,
        groups: usize,
        strides: &[usize],
        dilation: &[usize],
        out: &[usize],
    ) -> Val {
        let d = strides.len();
        let spatial: Vec<String> = (0..d).map(|i| i.to_string()).collect();
        let spatial = spatial.join(", ");
        let zeros = vec!["[0, 0]"; d].join(", ");
        let attrs = format!(
            "batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<[b, f, \
             {spatial}]x[o, i, {spatial}]->[b, f, {spatial}]>, feature_group_count = {groups} \
             : i64, lhs_dilation = {}, padding = dense<[{zeros}]> : tensor<{d}x2xi64>, \
             rhs_dilation = {}, window_strides = {}, precision_config = {HIGHEST_PRECISION}",
            arr(&vec![1; d]),
            arr(dilation),
            arr(strides)
        );
        self.op(
            "convolution",
            &[lhs, rhs],
            &attrs,
            Ty::new(lhs.ty.elem, out),
        )
    }

    /// `v[start..start+1]` along each dim in `at`, other dims whole.
    pub fn slice_first(&mut self, v: &Val, at: &[usize]) -> Val {
        let limit: Vec<usize> =
            v.ty.dims
                .iter()
                .enumerate()
                .map(|(d, &s)| if at.contains(&d) { 1.min(s) } else { s })
                .collect();
        let zeros = vec![0; limit.len()];
        let ones = vec![1; limit.len()];
        let attrs = format!(
            "start_indices = {}, limit_indices = {}, strides = {}",
            arr(&zeros),
            arr(&limit),
            arr(&ones)
        );
        let ty = Ty::new(v.ty.elem, &limit);
        self.op("slice", &[v], &attrs, ty)
    }

    /// A reduce of `inputs` (with `inits`) over `dims`; `body` builds the combiner from the
    /// block arguments (accumulators first, then elements) and returns its results.
    pub fn reduce(
        &mut self,
        inputs: &[&Val],
        inits: &[&Val],
        dims: &[usize],
        body: impl FnOnce(&mut Func, &[Val]) -> Vec<Val>,
    ) -> Vec<Val> {
        let out_dims: Vec<usize> = inputs[0]
            .ty
            .dims
            .iter()
            .enumerate()
            .filter(|(d, _)| !dims.contains(d))
            .map(|(_, &s)| s)
            .collect();
        let results: Vec<Val> = inputs
            .iter()
            .map(|v| Val {
                name: String::new(),
                ty: Ty::new(v.ty.elem, &out_dims),
            })
            .collect();
        let base = self.fresh();
        let n = inputs.len();
        let w = 4 + self.indent;
        let block_args: Vec<Val> = (0..2 * n)
            .map(|i| Val {
                name: format!("{base}_b{i}"),
                ty: Ty::new(inputs[i % n].ty.elem, &[]),
            })
            .collect();
        let operands: Vec<&Val> = inputs.iter().chain(inits.iter()).copied().collect();
        let _ = writeln!(
            self.text,
            "{:w$}{base}:{n} = \"stablehlo.reduce\"({}) ({{",
            "",
            operands
                .iter()
                .map(|v| v.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let _ = writeln!(
            self.text,
            "{:w$}^bb0({}):",
            "",
            block_args
                .iter()
                .map(|a| format!("{}: {}", a.name, a.ty))
                .collect::<Vec<_>>()
                .join(", ")
        );
        self.indent += 2;
        let rets = body(self, &block_args);
        self.ret("stablehlo.return", &rets);
        self.indent -= 2;
        let _ = writeln!(
            self.text,
            "{:w$}}}) {{dimensions = {}}} : ({}) -> ({})",
            "",
            arr(dims),
            operands
                .iter()
                .map(|v| v.ty.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            results
                .iter()
                .map(|v| v.ty.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        results
            .into_iter()
            .enumerate()
            .map(|(i, v)| Val {
                name: format!("{base}#{i}"),
                ..v
            })
            .collect()
    }

    fn ret(&mut self, op: &str, vals: &[Val]) {
        let _ = writeln!(
            self.text,
            "{:w$}\"{op}\"({}) : ({}) -> ()",
            "",
            vals.iter()
                .map(|v| v.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            vals.iter()
                .map(|v| v.ty.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            w = 4 + self.indent
        );
    }

    /// The whole module, returning `results` from `@main`.
    pub fn finish(self, results: &[Val]) -> String {
        format!("module {{\n{}}}\n", self.function("main", results, &[]))
    }

    /// This body as function `@name` returning `results` (one `func.func`, for a module
    /// holding several). `arg_attrs` are (argument, attribute text) pairs, e.g. donation.
    pub fn function(
        mut self,
        name: &str,
        results: &[Val],
        arg_attrs: &[(usize, String)],
    ) -> String {
        self.ret("func.return", results);
        let args: Vec<String> = self
            .args
            .iter()
            .enumerate()
            .map(|(i, t)| match arg_attrs.iter().find(|(a, _)| *a == i) {
                Some((_, attr)) => format!("%arg{i}: {t} {{{attr}}}"),
                None => format!("%arg{i}: {t}"),
            })
            .collect();
        let rets: Vec<String> = results.iter().map(|v| v.ty.to_string()).collect();
        let private = if name == "main" { "" } else { "private " };
        format!(
            "  func.func {private}@{name}({}) -> ({}) {{\n{}  }}\n",
            args.join(", "),
            rets.join(", "),
            self.text
        )
    }

    /// Calls function `@name` (see [`Func::function`]) on `args`; its results have `tys`.
    pub fn call(&mut self, name: &str, args: &[&Val], tys: &[Ty]) -> Vec<Val> {
        let base = self.fresh();
        let names: Vec<&str> = args.iter().map(|v| v.name.as_str()).collect();
        let arg_tys: Vec<String> = args.iter().map(|v| v.ty.to_string()).collect();
        let ret_tys: Vec<String> = tys.iter().map(|t| t.to_string()).collect();
        let _ = writeln!(
            self.text,
            "{:w$}{base}:{} = \"func.call\"({}) {{callee = @{name}}} : ({}) -> ({})",
            "",
            tys.len().max(1),
            names.join(", "),
            arg_tys.join(", "),
            ret_tys.join(", "),
            w = 4 + self.indent
        );
        tys.iter()
            .enumerate()
            .map(|(i, t)| Val {
                name: format!("{base}#{i}"),
                ty: t.clone(),
            })
            .collect()
    }

    /// `v` with its dims permuted: result dim `i` is `v`'s dim `perm[i]`.
    pub fn transpose(&mut self, v: &Val, perm: &[usize]) -> Val {
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return v.clone();
        }
        let dims: Vec<usize> = perm.iter().map(|&p| v.ty.dims[p]).collect();
        let attrs = format!("permutation = {}", arr(perm));
        self.op("transpose", &[v], &attrs, Ty::new(v.ty.elem, &dims))
    }

    /// The elements of 1-D `v` at the i64 indices `idx` (any shape; the result has it).
    pub fn gather_1d(&mut self, v: &Val, idx: &Val) -> Val {
        let k = idx.ty.dims.len();
        let attrs = format!(
            "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], \
             start_index_map = [0], index_vector_dim = {k}>, slice_sizes = {}, \
             indices_are_sorted = false",
            arr(&[1])
        );
        let ty = Ty::new(v.ty.elem, &idx.ty.dims);
        self.op("gather", &[v, idx], &attrs, ty)
    }

    /// 1-D `v` with `upd`'s elements stored at the i64 indices `idx` (same shape as `upd`):
    /// replacing what is there (`combine` None), or combined with it by the elementwise op
    /// `combine` ("add", "maximum", ...).
    pub fn scatter_1d(&mut self, v: &Val, idx: &Val, upd: &Val, combine: Option<&str>) -> Val {
        let name = self.fresh();
        let k = idx.ty.dims.len();
        let w = 4 + self.indent;
        let s = Ty::new(v.ty.elem, &[]);
        let (body, ret) = match combine {
            None => (String::new(), format!("{name}_b")),
            Some(op) => (
                format!(
                    "{:w2$}{name}_c = \"stablehlo.{op}\"({name}_a, {name}_b) : ({s}, {s}) -> {s}\n",
                    "",
                    w2 = w + 2
                ),
                format!("{name}_c"),
            ),
        };
        let _ = writeln!(
            self.text,
            "{:w$}{name} = \"stablehlo.scatter\"({}, {}, {}) ({{\n{:w$}^bb0({name}_a: {s}, {name}_b: {s}):\n{body}{:w2$}\"stablehlo.return\"({ret}) : ({s}) -> ()\n{:w$}}}) {{scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = {k}>, indices_are_sorted = false, unique_indices = false}} : ({}, {}, {}) -> {}",
            "",
            v.name,
            idx.name,
            upd.name,
            "",
            "",
            "",
            v.ty,
            idx.ty,
            upd.ty,
            v.ty,
            w2 = w + 2
        );
        Val {
            name,
            ty: v.ty.clone(),
        }
    }

    /// 1-D `v` with 1-D `upd` written at element `at`.
    pub fn update_slice_1d(&mut self, v: &Val, upd: &Val, at: usize) -> Val {
        let start = self.iconst(at as i64, Ty::new(Elem::I64, &[]));
        let ty = v.ty.clone();
        self.op("dynamic_update_slice", &[v, upd, &start], "", ty)
    }
}

impl Func {
    /// Converts f32 `v` to the tensor type `narrow` and back (rounds to a narrow float).
    pub fn raw_convert_through(&mut self, v: &Val, narrow: &str) -> Val {
        let mid = self.fresh();
        let _ = writeln!(
            self.text,
            "{:w$}{mid} = \"stablehlo.convert\"({}) : ({}) -> {narrow}",
            "",
            v.name,
            v.ty,
            w = 4 + self.indent
        );
        let name = self.fresh();
        let _ = writeln!(
            self.text,
            "{:w$}{name} = \"stablehlo.convert\"({mid}) : ({narrow}) -> {}",
            "",
            v.ty,
            w = 4 + self.indent
        );
        Val {
            name,
            ty: v.ty.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_and_convolutions_ask_for_full_precision() {
        let mut f = Func::default();
        let a = f.arg(Ty::new(Elem::F32, &[2, 3]));
        let b = f.arg(Ty::new(Elem::F32, &[3, 4]));
        let dims = "#stablehlo.dot<lhs_contracting_dimensions = [1], \
                    rhs_contracting_dimensions = [0]>";
        let p = f.dot_general(&a, &b, dims, Ty::new(Elem::F32, &[2, 4]));
        let x = f.arg(Ty::new(Elem::F32, &[1, 2, 5]));
        let w = f.arg(Ty::new(Elem::F32, &[2, 1, 3]));
        let c = f.convolution(&x, &w, 2, &[1], &[1], &[1, 2, 3]);
        let text = f.finish(&[p, c]);
        assert_eq!(text.matches("precision HIGHEST").count(), 4, "{text}");
    }
}
