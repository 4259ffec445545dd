//! Helpers that builders use to append ops with shape bookkeeping.

use super::ir::{Elem, Graph, Hold, Node, Op, Param, ParamId, Pointwise, Tensor, TensorId};

/// A feature map of one sample: channels × height × width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Feat {
    pub id: TensorId,
    pub c: u64,
    pub h: u64,
    pub w: u64,
}

impl Feat {
    pub fn elems(&self) -> u64 {
        prod(&[self.c, self.h, self.w])
    }
}

/// 2-D convolution geometry.
#[derive(Debug, Clone, Copy)]
pub struct ConvSpec {
    pub out: u64,
    pub kernel: u64,
    pub stride: u64,
    pub padding: u64,
    pub dilation: u64,
    pub groups: u64,
    pub bias: bool,
}

impl ConvSpec {
    /// A `k`×`k` convolution with "same"-style padding `(k-1)/2`, stride `s`, no bias.
    pub fn new(out: u64, kernel: u64, stride: u64) -> Self {
        ConvSpec {
            out,
            kernel,
            stride,
            padding: (kernel - 1) / 2,
            dilation: 1,
            groups: 1,
            bias: false,
        }
    }
    pub fn padding(mut self, p: u64) -> Self {
        self.padding = p;
        self
    }
    pub fn dilation(mut self, d: u64) -> Self {
        self.dilation = d;
        self
    }
    pub fn groups(mut self, g: u64) -> Self {
        self.groups = g;
        self
    }
    pub fn bias(mut self, b: bool) -> Self {
        self.bias = b;
        self
    }
}

/// The product of shape dimensions, saturating: an absurd model gives an element count that
/// [`crate::model::checks::check_graph_size`] refuses, never a wrapped or panicking multiplication.
pub fn prod(dims: &[u64]) -> u64 {
    dims.iter().fold(1u64, |a, &d| a.saturating_mul(d))
}

/// Output length of a convolution or pooling window along one axis.
pub fn conv_out(len: u64, kernel: u64, stride: u64, padding: u64, dilation: u64) -> u64 {
    let span = dilation * (kernel - 1) + 1;
    let padded = len + 2 * padding;
    if padded < span || stride == 0 {
        return 0;
    }
    (padded - span) / stride + 1
}

/// Bytes reserved per op for the layer names (most names are shorter).
const NAME_BYTES: usize = 32;

/// Builds a [`Graph`] op by op.
#[derive(Debug, Default)]
pub struct GraphBuilder {
    graph: Graph,
    block: Option<u32>,
    next_block: u32,
    prefix: String,
}

impl GraphBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// A builder with room for about `nodes` ops (one output tensor each).
    pub fn with_capacity(nodes: usize) -> Self {
        let mut b = Self::default();
        b.graph.nodes.reserve(nodes);
        b.graph.tensors.reserve(nodes);
        b.graph.names.reserve(nodes * NAME_BYTES);
        b
    }

    /// Finishes the graph.
    pub fn finish(self) -> Graph {
        self.graph
    }

    /// `t` stays referenced until the last op added so far has run: the argument of the
    /// module that op ends, held by the caller's variable until the module returns
    /// (`hidden_states = self.input_layernorm(hidden_states)` is read by
    /// `self.self_attn(hidden_states)` and released when its result replaces it).
    pub fn hold(&mut self, t: TensorId) {
        if let Some(node) = self.graph.nodes.len().checked_sub(1) {
            self.graph.holds.push(Hold { node, tensor: t });
        }
    }

    /// Sets the layer-name prefix used for following ops.
    pub fn scope(&mut self, name: impl Into<String>) {
        self.prefix = name.into();
    }

    /// Starts a new checkpointable block; ops until [`end_block`](Self::end_block) belong to it.
    pub fn begin_block(&mut self) {
        self.block = Some(self.next_block);
        self.next_block += 1;
    }

    pub fn end_block(&mut self) {
        self.block = None;
    }

    fn tensor(&mut self, per_sample: u64, fixed: u64, elem: Elem) -> TensorId {
        self.graph.tensors.push(Tensor {
            per_sample,
            fixed,
            elem,
        });
        self.graph.tensors.len() - 1
    }

    /// Elements per sample of a tensor.
    pub fn elems(&self, t: TensorId) -> u64 {
        self.graph.tensors[t].per_sample
    }

    /// Adds a trainable parameter of `elems` elements.
    pub fn param(&mut self, elems: u64, matrix: Option<(u64, u64)>) -> ParamId {
        self.graph.params.push(Param { elems, matrix });
        self.graph.params.len() - 1
    }

    /// Appends an op producing a new float tensor of `per_sample` elements.
    pub fn op(
        &mut self,
        op: Op,
        inputs: &[TensorId],
        per_sample: u64,
        params: &[ParamId],
        name: &str,
    ) -> TensorId {
        self.op_elem(op, inputs, per_sample, Elem::Float, params, name)
    }

    /// Appends an op producing a tensor of the given element kind.
    pub fn op_elem(
        &mut self,
        op: Op,
        inputs: &[TensorId],
        per_sample: u64,
        elem: Elem,
        params: &[ParamId],
        name: &str,
    ) -> TensorId {
        let output = self.tensor(per_sample, 0, elem);
        let names = &mut self.graph.names;
        let start = names.len();
        if !self.prefix.is_empty() {
            names.push_str(&self.prefix);
            names.push('.');
        }
        names.push_str(name);
        // (Names of more than 4 GiB read as empty.)
        let at = |i: usize| u32::try_from(i).unwrap_or(u32::MAX);
        let name = at(start)..at(names.len());
        self.graph.nodes.push(Node {
            op,
            inputs: inputs.into(),
            output,
            params: params.into(),
            block: self.block,
            name,
        });
        output
    }

    /// The data input: `per_sample` elements created on the GPU each micro-step.
    pub fn input(&mut self, per_sample: u64, elem: Elem) -> TensorId {
        self.op_elem(Op::Input, &[], per_sample, elem, &[], "input")
    }

    // ---- vision helpers -------------------------------------------------

    /// An image input of `c`×`h`×`w` floats.
    pub fn image(&mut self, c: u64, h: u64, w: u64) -> Feat {
        let id = self.input(prod(&[c, h, w]), Elem::Float);
        Feat { id, c, h, w }
    }

    /// `nn.Conv2d`.
    pub fn conv(&mut self, x: Feat, s: ConvSpec, name: &str) -> Feat {
        let h = conv_out(x.h, s.kernel, s.stride, s.padding, s.dilation);
        let w = conv_out(x.w, s.kernel, s.stride, s.padding, s.dilation);
        let cin_g = x.c / s.groups.max(1);
        let weight = self.param(
            prod(&[s.out, cin_g, s.kernel, s.kernel]),
            Some((s.kernel, s.kernel)),
        );
        let mut ps = vec![weight];
        if s.bias {
            ps.push(self.param(s.out, None));
        }
        let id = self.op(
            Op::Conv2d {
                transposed: false,
                kernel: s.kernel,
                groups: s.groups,
                out_channels: s.out,
            },
            &[x.id],
            prod(&[s.out, h, w]),
            &ps,
            name,
        );
        Feat { id, c: s.out, h, w }
    }

    /// `nn.ConvTranspose2d` with kernel = stride = `k`, with bias.
    pub fn conv_transpose(&mut self, x: Feat, out: u64, k: u64, name: &str) -> Feat {
        let weight = self.param(prod(&[x.c, out, k, k]), Some((k, k)));
        let bias = self.param(out, None);
        let (h, w) = (x.h.saturating_mul(k), x.w.saturating_mul(k));
        let id = self.op(
            Op::Conv2d {
                transposed: true,
                kernel: k,
                groups: 1,
                out_channels: out,
            },
            &[x.id],
            prod(&[out, h, w]),
            &[weight, bias],
            name,
        );
        Feat { id, c: out, h, w }
    }

    /// `nn.BatchNorm2d` (affine, train mode).
    pub fn batchnorm(&mut self, x: Feat, name: &str) -> Feat {
        let g = self.param(x.c, None);
        let b = self.param(x.c, None);
        let id = self.op(
            Op::BatchNorm { channels: x.c },
            &[x.id],
            x.elems(),
            &[g, b],
            name,
        );
        Feat { id, ..x }
    }

    /// A pointwise activation on a feature map.
    pub fn act(&mut self, x: Feat, f: Pointwise, inplace: bool, name: &str) -> Feat {
        let id = self.pointwise(x.id, f, inplace, name);
        Feat { id, ..x }
    }

    /// A unary pointwise op on any tensor.
    pub fn pointwise(&mut self, x: TensorId, f: Pointwise, inplace: bool, name: &str) -> TensorId {
        let n = self.elems(x);
        self.op(Op::Pointwise { f, inplace }, &[x], n, &[], name)
    }

    /// A binary pointwise op; the output has input `a`'s size.
    pub fn binary(
        &mut self,
        a: TensorId,
        b: TensorId,
        f: Pointwise,
        inplace: bool,
        name: &str,
    ) -> TensorId {
        let n = self.elems(a).max(self.elems(b));
        self.op(Op::Pointwise { f, inplace }, &[a, b], n, &[], name)
    }

    /// Conv → BatchNorm → optional activation (torchvision `Conv2dNormActivation`, inplace act).
    pub fn conv_bn_act(
        &mut self,
        x: Feat,
        s: ConvSpec,
        act: Option<Pointwise>,
        name: &str,
    ) -> Feat {
        let y = self.conv(x, s, &format!("{name}.conv"));
        let y = self.batchnorm(y, &format!("{name}.bn"));
        match act {
            Some(f) => self.act(y, f, true, &format!("{name}.act")),
            None => y,
        }
    }

    /// `nn.MaxPool2d(kernel, stride, padding)`.
    pub fn maxpool(&mut self, x: Feat, kernel: u64, stride: u64, padding: u64, name: &str) -> Feat {
        let h = conv_out(x.h, kernel, stride, padding, 1);
        let w = conv_out(x.w, kernel, stride, padding, 1);
        let id = self.op(Op::MaxPool, &[x.id], prod(&[x.c, h, w]), &[], name);
        Feat { id, c: x.c, h, w }
    }

    /// Adaptive average pooling to `h`×`w`.
    pub fn adaptive_avgpool(&mut self, x: Feat, h: u64, w: u64, name: &str) -> Feat {
        let id = self.op(Op::AvgPool, &[x.id], prod(&[x.c, h, w]), &[], name);
        Feat { id, c: x.c, h, w }
    }

    /// `nn.Linear(in, out)` applied to `rows` rows per sample.
    pub fn linear(
        &mut self,
        x: TensorId,
        rows: u64,
        in_features: u64,
        out_features: u64,
        bias: bool,
        name: &str,
    ) -> TensorId {
        let w = self.param(
            prod(&[in_features, out_features]),
            Some((out_features, in_features)),
        );
        let mut ps = [w, 0];
        let count = if bias {
            ps[1] = self.param(out_features, None);
            2
        } else {
            1
        };
        self.op(
            Op::Linear {
                in_features,
                out_features,
            },
            &[x],
            prod(&[rows, out_features]),
            &ps[..count],
            name,
        )
    }

    /// A linear layer reusing an existing weight (tied embeddings).
    pub fn linear_tied(
        &mut self,
        x: TensorId,
        rows: u64,
        weight: ParamId,
        in_features: u64,
        out_features: u64,
        name: &str,
    ) -> TensorId {
        self.op(
            Op::Linear {
                in_features,
                out_features,
            },
            &[x],
            prod(&[rows, out_features]),
            &[weight],
            name,
        )
    }

    /// Dropout; a no-op (returns `x`) when `p == 0`, as PyTorch's kernels skip it.
    pub fn dropout(&mut self, x: TensorId, p: f64, inplace: bool, name: &str) -> TensorId {
        if p <= 0.0 {
            return x;
        }
        let n = self.elems(x);
        self.op(Op::Dropout { p, inplace }, &[x], n, &[], name)
    }

    /// torchvision `StochasticDepth(p, "row")` in train mode: `x * noise` with a per-sample
    /// noise tensor (its saved bytes are negligible); the identity when `p == 0`.
    pub fn stochastic_depth(&mut self, x: TensorId, p: f64, name: &str) -> TensorId {
        if p <= 0.0 {
            return x;
        }
        self.pointwise(x, Pointwise::Scale, false, name)
    }

    /// `x * p` for a parameter `p` broadcast over `x` (ConvNeXt layer scale).
    pub fn mul_param(&mut self, x: TensorId, param: ParamId, name: &str) -> TensorId {
        let n = self.elems(x);
        self.op(
            Op::Pointwise {
                f: Pointwise::Mul,
                inplace: false,
            },
            &[x],
            n,
            &[param],
            name,
        )
    }

    /// A batch-independent tensor of `fixed` elements created in forward (e.g. an attention mask).
    pub fn constant(&mut self, fixed: u64, name: &str) -> TensorId {
        let id = self.op(Op::Constant, &[], 0, &[], name);
        self.graph.tensors[id].fixed = fixed;
        id
    }

    /// A batch-independent tensor of `fixed` elements of `elem` built in forward without
    /// gradients (T5's relative-position bucket ids, int64).
    pub fn constant_elem(&mut self, fixed: u64, elem: Elem, name: &str) -> TensorId {
        let id = self.op_elem(Op::Constant, &[], 0, elem, &[], name);
        self.graph.tensors[id].fixed = fixed;
        id
    }

    /// An op whose output is batch-independent: `fixed` elements (T5's relative position
    /// bias, `(1, heads, q, k)` from an embedding that trains).
    pub fn fixed_op(
        &mut self,
        op: Op,
        inputs: &[TensorId],
        fixed: u64,
        params: &[ParamId],
        name: &str,
    ) -> TensorId {
        let id = self.op(op, inputs, 0, params, name);
        self.graph.tensors[id].fixed = fixed;
        id
    }

    /// A view of `x` (no allocation).
    pub fn view(&mut self, x: TensorId, name: &str) -> TensorId {
        let n = self.elems(x);
        self.op(Op::View, &[x], n, &[], name)
    }

    /// A contiguous copy of `x`.
    /// `x.chunk(parts, dim=-1)`: `parts` views of equal size ([`Op::Chunk`]).
    pub fn chunks(&mut self, x: TensorId, parts: u64, name: &str) -> Vec<TensorId> {
        let n = self.elems(x) / parts.max(1);
        (0..parts)
            .map(|i| self.op(Op::Chunk, &[x], n, &[], &format!("{name}.{i}")))
            .collect()
    }

    pub fn copy(&mut self, x: TensorId, name: &str) -> TensorId {
        let n = self.elems(x);
        self.op(Op::Copy, &[x], n, &[], name)
    }

    /// The `.contiguous()` after `nn.MultiheadAttention`'s SDPA ([`Op::SdpaOutContiguous`]).
    pub fn sdpa_out_contiguous(&mut self, x: TensorId, name: &str) -> TensorId {
        let n = self.elems(x);
        self.op(Op::SdpaOutContiguous, &[x], n, &[], name)
    }

    /// Integer labels created with the data at the start of each micro-step.
    pub fn labels(&mut self, per_sample: u64) -> TensorId {
        self.input(per_sample, Elem::Int64)
    }

    /// Cross-entropy loss node (the last node of every graph).
    pub fn cross_entropy(
        &mut self,
        logits: TensorId,
        labels: TensorId,
        rows: u64,
        classes: u64,
        upcast: bool,
    ) {
        self.op(
            Op::CrossEntropy {
                rows,
                classes,
                upcast,
            },
            &[logits, labels],
            0,
            &[],
            "loss",
        );
    }
}
