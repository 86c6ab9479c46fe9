//! Depthwise convolution geometries, shared by the suites that run the kernel op: its checks
//! against the reference (`depthwise_conv`) and its PJRT lowering (`pjrt_kernels_in_program`).

use deferfuse::fusion::ir::{Depthwise, DepthwisePart, KernelOp};
use deferfuse::Op;

/// A batch, channel count, input's spatial sizes and the convolution's geometry.
pub struct ConvGeometry {
    pub name: &'static str,
    pub n: usize,
    pub c: usize,
    pub input: &'static [usize],
    pub kernel: &'static [usize],
    pub stride: &'static [usize],
    pub padding: &'static [usize],
    pub dilation: &'static [usize],
}

impl ConvGeometry {
    /// The kernel op's attributes for `part` (the input sizes go to the input gradient only).
    pub fn depthwise(&self, part: DepthwisePart) -> Depthwise {
        let input = if part == DepthwisePart::InputGrad {
            self.input
        } else {
            &[]
        };
        Depthwise {
            part,
            kernel: self.kernel.into(),
            stride: self.stride.into(),
            padding: self.padding.into(),
            dilation: self.dilation.into(),
            input: input.into(),
        }
    }

    pub fn op(&self, part: DepthwisePart) -> Op {
        Op::Kernel(KernelOp::Depthwise(Box::new(self.depthwise(part))))
    }

    /// `[n, C, spatial...]`.
    pub fn lead(&self, n: usize, spatial: &[usize]) -> Vec<usize> {
        [&[n, self.c][..], spatial].concat()
    }

    /// The output's spatial sizes.
    pub fn out_sizes(&self) -> Vec<usize> {
        self.depthwise(DepthwisePart::Forward)
            .output_sizes(self.input)
            .expect("a valid geometry")
            .to_vec()
    }

    /// The weight's shape `[C, 1, k...]`.
    pub fn weight(&self) -> Vec<usize> {
        [&[self.c, 1][..], self.kernel].concat()
    }
}
