"""dp_imbalance_oom for tools/make_scenarios.py: a 4-GPU DataParallel job with expandable segments,
simulated with tools/make_expandable.py's allocator. Python 3 standard library only."""
from scenario_base import *  # noqa: F401,F403 (the shared constants, Gen and helpers)
from scenario_base import os, json, sf  # noqa: F401 (modules the section uses)

# --------------------------------------------------------------------------------------------
# dp_imbalance_oom: a 4-GPU DataParallel job with expandable segments that runs out of memory
# on cuda:1 (issue 13's real shape, fabricated). Simulated with tools/make_expandable.py's
# allocator (expandable segments: segment_map / segment_unmap of 20 MiB pages), not with the
# fixture compiler (which has no expandable segments).

import make_expandable as mx  # noqa: E402

DP_NAME = "dp_imbalance_oom"
DP_PY = "/opt/conda/lib/python3.11"
DP_TP = DP_PY + "/site-packages/torch"
DP_HF = DP_PY + "/site-packages/transformers"
DP_U = "/home/user/graphqa"
DP_WIDTHS = [336, 336, 336]     # node width of each EdgeConv layer
DP_H = 2048                     # message-MLP hidden width (every layer)
DP_FE = 1700                    # edge feature width (fp32)
DP_GRAPHS = [4, 6, 5, 5]        # graphs of the batch that DataParallel's scatter gave each device
DP_LAYERS = 3                   # EdgeConv layers
DP_A = (2, 0)                   # cuda:1: layer 3's 1st MLP hidden: the flush, retry succeeds
#                                 (the SiLU after it, the next request, is the one that fails)
# edges per device: the per-layer tensor at models.py:174 (the message MLP's hidden, E x 2048
# fp32 = 8192 E bytes) is 161996800 (~162 MB), 5305778176 (~5.3 GB), 560996352 (~561 MB) and
# 555417600 (~555 MB) bytes: DataParallel split the batch by graphs, device 1 got the huge ones
DP_EDGES = [19775, 647678, 68481, 67800]
DP_NODES = [e // 64 for e in DP_EDGES]
DP_DEVICE_FREE_AT_OOM = 91 * MIB
DP_CARD_TOTAL = 85520809984     # cudaMemGetInfo total of an 80 GB H100 (79.65 GiB)
DP_T0 = T0 + 3600 * 1000000     # one hour into the job
# Qwen3 text encoder (bf16, truncated to 27 decoder layers), question batch 4 x 512 tokens
QW_LAYERS, QW_HID, QW_INTER, QW_VOCAB, QW_TOK = 27, 1024, 3072, 151936, 2048
QW_H = QW_TOK * QW_HID * 2      # one [2048 x 1024] bf16 activation: 4 MiB

_CPP_ALLOC = [
    ("??", 0, "torch::unwind::unwind()"),
    ("??", 0, "torch::CapturedTraceback::gather(bool, bool, bool)"),
    ("memory_snapshot.cpp", 0, "torch::cuda::(anonymous namespace)::gather_with_cpp()"),
    ("CUDACachingAllocator.cpp", 0, "c10::cuda::CUDACachingAllocator::Native::"
     "DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)"),
    ("", 0, "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, "
     "signed char, unsigned long, CUstream_st*)"),
    ("", 0, "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate("
     "unsigned long)"),
    ("??", 0, "at::TensorBase at::detail::_empty_generic<long>(c10::ArrayRef<long>, "
     "c10::Allocator*, c10::DispatchKeySet, c10::ScalarType, std::optional<c10::MemoryFormat>)"),
    ("??", 0, "at::detail::empty_cuda(c10::ArrayRef<long>, c10::ScalarType, "
     "std::optional<c10::Device>, std::optional<c10::MemoryFormat>)"),
    ("??", 0, "at::native::empty_strided_cuda(c10::ArrayRef<long>, c10::ArrayRef<long>, "
     "std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, "
     "std::optional<bool>)"),
]
_OPS = {
    "copy": ["at::native::_to_copy(at::Tensor const&, std::optional<c10::ScalarType>, "
             "std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, bool, "
             "std::optional<c10::MemoryFormat>)", "at::_ops::_to_copy::call(at::Tensor const&, "
             "std::optional<c10::ScalarType>, std::optional<c10::Layout>, "
             "std::optional<c10::Device>, "
             "std::optional<bool>, bool, std::optional<c10::MemoryFormat>)"],
    "linear": ["at::native::addmm_out_cuda_impl(at::Tensor&, at::Tensor const&, at::Tensor const&, "
               "at::Tensor const&, c10::Scalar const&, c10::Scalar const&, at::native::Activation)",
               "at::_ops::addmm::call(at::Tensor const&, at::Tensor const&, at::Tensor const&, "
               "c10::Scalar const&, c10::Scalar const&)",
               "at::native::linear(at::Tensor const&, at::Tensor const&, "
               "std::optional<at::Tensor> const&)"],
    "index": ["at::native::index_select_out_cuda(at::Tensor const&, long, at::Tensor const&, "
              "at::Tensor&)", "at::_ops::index_select::call(at::Tensor const&, long, "
              "at::Tensor const&)", "torch::autograd::THPVariable_getitem(_object*, _object*)"],
    "cat": ["at::native::structured_cat_out_cuda::impl(c10::IListRef<at::Tensor> const&, long, "
            "long, bool, bool, bool, at::Tensor const&)", "at::_ops::cat::call("
            "c10::IListRef<at::Tensor> const&, long)"],
    "silu": ["at::native::silu_kernel(at::TensorIteratorBase&)",
             "at::_ops::silu::call(at::Tensor const&)"],
    "elementwise": ["at::native::mul_kernel_cuda(at::TensorIteratorBase&)",
                    "at::_ops::mul_Tensor::call(at::Tensor const&, at::Tensor const&)"],
    "index_add": ["at::native::index_add_cuda_impl(at::Tensor const&, long, at::Tensor const&, "
                  "at::Tensor const&, c10::Scalar const&, at::Tensor const&)",
                  "at::_ops::index_add_::call(at::Tensor&, long, at::Tensor const&, "
                  "at::Tensor const&, c10::Scalar const&)"],
    "layer_norm": ["at::native::layer_norm_cuda(at::Tensor const&, c10::ArrayRef<long>, "
                   "std::optional<at::Tensor> const&, std::optional<at::Tensor> const&, double)",
                   "at::_ops::native_layer_norm::call(at::Tensor const&, "
                   "c10::ArrayRef<c10::SymInt>, std::optional<at::Tensor> const&, "
                   "std::optional<at::Tensor> const&, double)"],
    "sdpa": ["at::native::_scaled_dot_product_efficient_attention_cuda(at::Tensor const&, "
             "at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, bool, "
             "double, bool, std::optional<double>)",
             "at::_ops::_scaled_dot_product_efficient_attention::call(at::Tensor const&, "
             "at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, bool, "
             "double, bool, std::optional<double>)"],
    "embedding": ["at::native::embedding_symint(at::Tensor const&, at::Tensor const&, c10::SymInt, "
                  "bool, bool)", "at::_ops::embedding::call(at::Tensor const&, at::Tensor const&, "
                  "c10::SymInt, bool, bool)"],
    "broadcast": ["torch::cuda::broadcast_coalesced(c10::ArrayRef<at::Tensor>, "
                  "c10::ArrayRef<long>, unsigned long)"],
    "scatter": ["torch::cuda::scatter(at::Tensor const&, c10::ArrayRef<long>, "
                "std::optional<std::vector<long, std::allocator<long> > > const&, long, "
                "std::optional<std::vector<std::optional<c10::cuda::CUDAStream>, "
                "std::allocator<std::optional<c10::cuda::CUDAStream> > > > const&)"],
}
_GLUE = [("??", 0, "_PyEval_EvalFrameDefault"), ("??", 0, "_PyFunction_Vectorcall"),
         ("??", 0, "PyObject_Call")]
_TAIL = {
    "main": [("??", 0, "Py_RunMain"), ("??", 0, "Py_BytesMain"), ("??", 0, "__libc_start_main"),
             ("??", 0, "_start")],
    "worker": [("??", 0, "thread_run"), ("pthread_create.c", 477, "start_thread"),
               ("clone3.S", 78, "__clone3")],
}


class DpStacks:
    """Frame dicts and stack lists shared across the file, as PyTorch writes them (one object
    per distinct frame / stack, so the pickle memo back-references them)."""

    def __init__(self):
        self.frames = {}
        self.stacks = {}

    def frame(self, f):
        o = self.frames.get(f)
        if o is None:
            o = self.frames[f] = {"name": f[2], "filename": f[0], "line": f[1]}
        return o

    def stack(self, op, py, thread):
        """stacks="all": the native unwind (allocator, op, interpreter, thread start), then the
        Python frames that could not be placed, appended (innermost first), as real files show."""
        key = (op, tuple(py), thread)
        s = self.stacks.get(key)
        if s is None:
            native = _CPP_ALLOC + [("??", 0, n) for n in _OPS[op]] + _GLUE + _TAIL[thread]
            s = self.stacks[key] = [self.frame(f) for f in native + list(py)]
        return s


def _py(path, line, name):
    return (path, line, name)


DP_CALL = [_py(DP_TP + "/nn/modules/module.py", 1784, "_call_impl"),
           _py(DP_TP + "/nn/modules/module.py", 1773, "_wrapped_call_impl")]
DP_TOP = [_py(DP_U + "/train.py", 133, "main"), _py(DP_U + "/train.py", 140, "<module>")]
DP_STEP = lambda line: [_py(DP_U + "/train.py", line, "train_step")] + DP_TOP  # noqa: E731
DP_TO = [_py(DP_TP + "/nn/modules/module.py", 1341, "convert"),
         _py(DP_TP + "/nn/modules/module.py", 942, "_apply"),
         _py(DP_TP + "/nn/modules/module.py", 915, "_apply"),
         _py(DP_TP + "/nn/modules/module.py", 915, "_apply"),
         _py(DP_TP + "/nn/modules/module.py", 1355, "to")]
DP_WORKER = [_py(DP_TP + "/nn/parallel/parallel_apply.py", 84, "_worker"),
             _py(DP_PY + "/threading.py", 1012, "run"),
             _py(DP_PY + "/threading.py", 1075, "_bootstrap_inner"),
             _py(DP_PY + "/threading.py", 1032, "_bootstrap")]
DP_FWD = lambda line: (  # noqa: E731
    DP_CALL + [_py(DP_TP + "/nn/parallel/data_parallel.py", line, "forward")]
    + DP_CALL + DP_STEP(91))
DP_REPLICATE = ([_py(DP_TP + "/nn/parallel/comm.py", 67, "broadcast_coalesced"),
                 _py(DP_TP + "/nn/parallel/_functions.py", 22, "forward"),
                 _py(DP_TP + "/autograd/function.py", 575, "apply"),
                 _py(DP_TP + "/nn/parallel/replicate.py", 27, "_broadcast_coalesced_reshape"),
                 _py(DP_TP + "/nn/parallel/replicate.py", 119, "replicate"),
                 _py(DP_TP + "/nn/parallel/data_parallel.py", 205, "replicate")]
                + DP_FWD(191)[2:])
# GraphDataParallel (parallel.py) overrides DataParallel.scatter: the graphs of the batch (on
# the CPU) go to the devices in order, whole graphs per device
DP_SCATTER = lambda line: ([_py(DP_U + "/parallel.py", line, "scatter")]  # noqa: E731
                           + DP_FWD(185)[2:])
# the GNN on a worker thread: GraphQA.forward (models.py:231 loops over the EdgeConv layers)
DP_GNN = DP_CALL + [_py(DP_U + "/models.py", 231, "forward")] + DP_CALL + DP_WORKER
DP_GNN_LINE = lambda line: [_py(DP_U + "/models.py", line, "forward")] + DP_GNN  # noqa: E731
DP_LINEAR = [_py(DP_TP + "/nn/modules/linear.py", 125, "forward")] + DP_CALL
DP_SEQ = DP_CALL + [_py(DP_TP + "/nn/modules/container.py", 250, "forward")] + DP_CALL
DP_SILU = [_py(DP_TP + "/nn/functional.py", 2372, "silu"),
           _py(DP_TP + "/nn/modules/activation.py", 432, "forward")]
# Qwen3 (transformers) on the main thread: Qwen3Model.forward loops over the decoder layers at
# modeling_qwen3.py:405
QW = DP_HF + "/models/qwen3/modeling_qwen3.py"
QW_MODEL = [_py(QW, 405, "forward")] + DP_CALL + DP_STEP(87)  # noqa: E501
QW_LAYER = DP_CALL + [_py(DP_HF + "/modeling_layers.py", 94, "__call__")] + QW_MODEL
QW_LINE = lambda line, inner=(): list(inner) + [_py(QW, line, "forward")] + QW_LAYER  # noqa: E731
QW_ATTN = lambda line, inner=(): (list(inner) + [_py(QW, line, "forward")] + DP_CALL  # noqa: E731
                                  + [_py(QW, 260, "forward")] + QW_LAYER)
QW_NORM = lambda line, outer: ([_py(QW, line, "forward")] + DP_CALL  # noqa: E731
                               + [_py(QW, outer, "forward")] + QW_LAYER)


class DpDevice:
    """One device: the simulated allocator plus the bookkeeping for the expected facts."""

    def __init__(self, dev, st):
        # the physical limit is set once the OOM device's history is known (see sc_dp)
        self.a = mx.Allocator(dev, DP_CARD_TOTAL, 1 << 62)
        self.a.t = DP_T0
        self.a.entry_fields = {"compile_context": "N/A"}
        self.dev = dev
        self.st = st
        self.live = {}          # name -> (ptr, size, tag, line)
        self.peak = 0
        self.requested = 0
        self.line_max = {}      # models.py line -> largest block requested there
        self.line_live = {}     # models.py line -> live bytes now

    def alloc(self, name, size, op, py, tag, thread="worker", line=None, dt=None):
        self.a.t += dt if dt is not None else 20 + size // (64 * MIB)
        ptr = self.a.malloc(size, 0, self.st.stack(op, py, thread))
        self.live[name] = (ptr, size, tag, line)
        self.requested += size
        self.peak = max(self.peak, self.requested)
        if line is not None:
            self.line_max[line] = max(self.line_max.get(line, 0), size)
            self.line_live[line] = self.line_live.get(line, 0) + size
        return ptr

    def free(self, name, dt=3):
        ptr, size, tag, line = self.live.pop(name)
        self.a.t += dt
        self.a.free(ptr)
        self.requested -= size
        if line is not None:
            self.line_live[line] -= size

    def tag_bytes(self):
        out = {}
        for _, size, tag, _ in self.live.values():
            out[tag] = out.get(tag, 0) + size
        return out


def dp_gnn_params():
    """GraphQA's parameters (fp32): node_in, 3 EdgeConv layers (edge encoder, 4-Linear message
    MLP, update Linear, LayerNorm), the head."""
    H = DP_H
    ps = [("node_in.weight", DP_WIDTHS[0] * 1024 * 4), ("node_in.bias", DP_WIDTHS[0] * 4)]
    for l in range(DP_LAYERS):
        p = "convs.%d." % l
        F = DP_WIDTHS[l]
        Fo = DP_WIDTHS[l + 1] if l + 1 < DP_LAYERS else 256
        ps += [(p + "edge_enc.weight", F * DP_FE * 4), (p + "edge_enc.bias", F * 4),
               (p + "msg.0.weight", H * 3 * F * 4), (p + "msg.0.bias", H * 4),
               (p + "msg.2.weight", H * H * 4), (p + "msg.2.bias", H * 4),
               (p + "msg.4.weight", H * H * 4), (p + "msg.4.bias", H * 4),
               (p + "msg.6.weight", Fo * H * 4), (p + "msg.6.bias", Fo * 4),
               (p + "upd.weight", Fo * (F + Fo) * 4), (p + "upd.bias", Fo * 4),
               (p + "norm.weight", Fo * 4), (p + "norm.bias", Fo * 4)]
    ps += [("head.weight", 2 * 256 * 4), ("head.bias", 8)]
    return ps


def dp_qwen_params():
    ps = [("embed_tokens.weight", QW_VOCAB * QW_HID * 2)]
    for l in range(QW_LAYERS):
        p = "layers.%d." % l
        ps += [(p + "self_attn.q_proj.weight", 2048 * QW_HID * 2),
               (p + "self_attn.k_proj.weight", 1024 * QW_HID * 2),
               (p + "self_attn.v_proj.weight", 1024 * QW_HID * 2),
               (p + "self_attn.o_proj.weight", QW_HID * 2048 * 2),
               (p + "self_attn.q_norm.weight", 128 * 2), (p + "self_attn.k_norm.weight", 128 * 2),
               (p + "mlp.gate_proj.weight", QW_INTER * QW_HID * 2),
               (p + "mlp.up_proj.weight", QW_INTER * QW_HID * 2),
               (p + "mlp.down_proj.weight", QW_HID * QW_INTER * 2),
               (p + "input_layernorm.weight", QW_HID * 2),
               (p + "post_attention_layernorm.weight", QW_HID * 2)]
    ps += [("norm.weight", QW_HID * 2)]
    return ps


def dp_qwen_forward(d):
    """One forward of the text encoder (grad enabled: it is fine-tuned): every decoder layer
    saves its activations, so live memory grows layer by layer; the same allocation pattern
    repeats 27 times inside ONE forward pass (not 27 steps)."""
    H = QW_H
    d.alloc("q.emb", H, "embedding", [_py(DP_TP + "/nn/functional.py", 2546, "embedding"),
                                      _py(DP_TP + "/nn/modules/sparse.py", 190, "forward")]
            + DP_CALL + [_py(QW, 383, "forward")] + DP_CALL + DP_STEP(87), "act", "main")
    prev = "q.emb"
    for l in range(QW_LAYERS):
        p = "q%d." % l

        def a(name, size, op, py):
            d.alloc(p + name, size, op, py, "act", "main", dt=15 + size // MIB)

        a("ln1.f32", 2 * H, "copy", QW_NORM(62, 257))          # hidden.to(float32): temp
        a("ln1", H, "elementwise", QW_NORM(65, 257))
        d.free(p + "ln1.f32")
        a("q", 2 * H, "linear", QW_ATTN(211, DP_LINEAR))
        a("qn", 2 * H, "elementwise", QW_ATTN(211, [_py(QW, 65, "forward")] + DP_CALL))
        a("k", H, "linear", QW_ATTN(212, DP_LINEAR))
        a("kn", H, "elementwise", QW_ATTN(212, [_py(QW, 65, "forward")] + DP_CALL))
        a("v", H, "linear", QW_ATTN(213, DP_LINEAR))
        a("qr", 2 * H, "elementwise", QW_ATTN(216, [_py(QW, 136, "apply_rotary_pos_emb")]))
        a("kr", H, "elementwise", QW_ATTN(216, [_py(QW, 137, "apply_rotary_pos_emb")]))
        a("attn", 2 * H, "sdpa", QW_ATTN(228, [
            _py(DP_HF + "/integrations/sdpa_attention.py", 96, "sdpa_attention_forward")]))
        a("lse", 4 * 16 * 512 * 4, "sdpa", QW_ATTN(228, [
            _py(DP_HF + "/integrations/sdpa_attention.py", 96, "sdpa_attention_forward")]))
        a("o", H, "linear", QW_ATTN(239, DP_LINEAR))
        a("res1", H, "elementwise", QW_LINE(270))
        a("ln2.f32", 2 * H, "copy", QW_NORM(62, 274))
        a("ln2", H, "elementwise", QW_NORM(65, 274))
        d.free(p + "ln2.f32")
        mlp = lambda inner: (list(inner) + [_py(QW, 91, "forward")] + DP_CALL  # noqa: E731
                             + [_py(QW, 275, "forward")] + QW_LAYER)
        a("gate", 3 * H // 2 * 2, "linear", mlp(DP_LINEAR))
        a("act", 3 * H // 2 * 2, "silu", mlp(DP_SILU))
        a("up", 3 * H // 2 * 2, "linear", mlp(DP_LINEAR))
        a("mul", 3 * H // 2 * 2, "elementwise", mlp([]))
        a("down", H, "linear", mlp(DP_LINEAR))
        a("res2", H, "elementwise", QW_LINE(276))
        prev = p + "res2"
    d.alloc("q.norm.f32", 2 * H, "copy", [_py(QW, 62, "forward")] + DP_CALL
            + [_py(QW, 408, "forward")] + DP_CALL + DP_STEP(87), "tmp", "main")
    d.alloc("q.out", H, "elementwise", [_py(QW, 65, "forward")] + DP_CALL
            + [_py(QW, 408, "forward")] + DP_CALL + DP_STEP(87), "act", "main")
    d.free("q.norm.f32")
    return prev


def dp_gnn_forward(d, stop_at=None):
    """GraphQA.forward on one device's share of the batch (worker thread): node_in, then 3
    EdgeConv layers (models.py:170-178)

        172  e = self.edge_enc(edge_attr)                          # [E, F]
        173  x_i, x_j = h[dst], h[src]                             # [E, F] each
        174  m = self.msg(torch.cat([x_i, x_j.sub_(x_i), e], -1))  # MLP 3F -> 2048 x3 -> F
        176  agg = torch.zeros_like(..).index_add_(0, dst, m)
        177  return self.norm(torch.cat([h, self.upd(agg)]) ...)

    With stop_at = (layer, k) returns before the k-th hidden tensor of that layer's message MLP
    (name, size, stack), for the caller to allocate (or fail) itself."""
    E, N = DP_EDGES[d.dev], DP_NODES[d.dev]
    H = DP_H
    S = E * H * 4                 # one [E x 2048] fp32 edge tensor: the per-layer tensor
    L = DP_GNN_LINE
    d.alloc("g.h0", N * DP_WIDTHS[0] * 4, "linear", DP_LINEAR + [_py(DP_U + "/models.py", 228,
            "forward")] + DP_CALL + DP_WORKER, "act", line=228)
    for l in range(DP_LAYERS):
        p = "g%d." % l
        F = DP_WIDTHS[l]
        Fo = DP_WIDTHS[l + 1] if l + 1 < DP_LAYERS else 256
        u = E * F * 4             # one [E x F_l] fp32 edge tensor
        d.alloc(p + "e", u, "linear", DP_LINEAR + L(172), "act", line=172)
        d.alloc(p + "xi", u, "index", L(173), "act", line=173)
        d.alloc(p + "xj", u, "index", L(173), "act", line=173)
        d.alloc(p + "cat", 3 * u, "cat", L(174), "act", line=174)
        for k, (nm, op, inner) in enumerate([("l1", "linear", DP_LINEAR), ("s1", "silu", DP_SILU),
                                             ("l2", "linear", DP_LINEAR), ("s2", "silu", DP_SILU),
                                             ("l3", "linear", DP_LINEAR), ("s3", "silu", DP_SILU)]):
            if stop_at == (l, k):
                return p + nm, S, op, inner + DP_SEQ + L(174)
            d.alloc(p + nm, S, op, inner + DP_SEQ + L(174), "act", line=174)
        d.alloc(p + "m", E * Fo * 4, "linear", DP_LINEAR + DP_SEQ + L(174), "act", line=174)
        d.alloc(p + "agg", N * Fo * 4, "index_add", L(176), "act", line=176)
        d.alloc(p + "upd", N * Fo * 4, "linear", DP_LINEAR + L(177), "tmp", line=177)
        d.alloc(p + "hcat", N * (F + Fo) * 4, "cat", L(177), "act", line=177)
        d.free(p + "upd")
        d.alloc(p + "norm", N * Fo * 4, "layer_norm", [
            _py(DP_TP + "/nn/functional.py", 2910, "layer_norm"),
            _py(DP_TP + "/nn/modules/normalization.py", 217, "forward")] + DP_CALL + L(177),
            "act", line=177)
        # EdgeConv.forward returns: its locals e, x_i, x_j and m go (nothing saved them)
        for n in ("e", "xi", "xj", "m"):
            d.free(p + n)
    d.alloc("g.pool", 64 * 256 * 4, "index_add", [_py(DP_U + "/models.py", 234, "forward")]
            + DP_CALL + DP_WORKER, "act", line=234)
    d.alloc("g.out", 64 * 4, "linear", DP_LINEAR + [_py(DP_U + "/models.py", 234, "forward")]
            + DP_CALL + DP_WORKER, "act", line=234)
    return None


def dp_job(limit):
    """The job up to cuda:1's OOM and the unwinding after it. limit: the bytes of physical pages
    cuda:1's process can create (None: unlimited; the first pass measures where it must be).
    Returns the devices and the numbers the expectations need."""
    st = DpStacks()
    devs = [DpDevice(i, st) for i in range(4)]
    d0, d1 = devs[0], devs[1]
    info = {}
    # --- cuda:0: module init (main thread) ---
    for name, size in dp_qwen_params():
        d0.alloc("qp." + name, size, "copy", DP_TO + [_py(DP_U + "/train.py", 108, "main"),
                                                      _py(DP_U + "/train.py", 140, "<module>")],
                 "param", "main", dt=40 + size // (8 * MIB))
    for name, size in dp_gnn_params():
        d0.alloc("gp." + name, size, "copy", DP_TO + [_py(DP_U + "/train.py", 112, "main"),
                                                      _py(DP_U + "/train.py", 140, "<module>")],
                 "param", "main", dt=30)
    # --- the first training step: the question through Qwen3 (cuda:0) ---
    d0.a.t += 2500000
    for name, size in [("input_ids", 4 * 512 * 8), ("attention_mask", 4 * 512 * 8)]:
        d0.alloc("b." + name, size, "copy", [_py(DP_U + "/data.py", 57, "to")] + DP_STEP(84),
                 "data", "main", dt=200)
    dp_qwen_forward(d0)
    # --- GraphDataParallel.forward: scatter the graphs, replicate the GNN, parallel_apply ---
    t_dp = d0.a.t + 400
    params = dp_gnn_params()
    for d in devs:
        d.a.t = max(d.a.t, t_dp)
        # parallel.py:30: each of the device's graphs is copied (its node features x_g are
        # kept in the list passed to the replica, its edge features are concatenated at
        # parallel.py:33 and the per-graph copies dropped: holes between the x_g)
        e, n, ng = DP_EDGES[d.dev], DP_NODES[d.dev], DP_GRAPHS[d.dev]
        for g in range(ng):
            eg = e // ng + (1 if g < e % ng else 0)
            d.alloc("in.x%d" % g, (n // ng) * 1024 * 4, "copy", DP_SCATTER(30), "data", "main",
                    dt=80)
            d.alloc("in.ea%d" % g, eg * DP_FE * 4, "copy", DP_SCATTER(30), "tmp", "main",
                    dt=80 + eg * DP_FE * 4 // (64 * MIB))
        d.alloc("in.edge_attr", e * DP_FE * 4, "cat", DP_SCATTER(33), "data", "main", dt=300)
        for g in range(ng):
            d.free("in.ea%d" % g)
        d.alloc("in.edge_index", 2 * e * 8, "cat", DP_SCATTER(34), "data", "main", dt=120)
        d.alloc("in.batch", n * 8, "cat", DP_SCATTER(35), "data", "main", dt=60)
    for d in devs[1:]:
        # broadcast_coalesced: buckets of up to 10 MiB, one flat tensor per bucket per device
        bsize, nb = 0, 0
        for name, size in params + [(None, 0)]:
            if bsize and (name is None or bsize + size > 10 * MIB):
                d.alloc("rep.%d" % nb, bsize, "broadcast", DP_REPLICATE, "replica", "main",
                        dt=40 + bsize // MIB)
                nb += 1
                bsize = 0
            bsize += size
    info["replica_bytes"] = sum(size for _, size in params)
    t_apply = max(d.a.t for d in devs) + 300
    for d in devs:
        d.a.t = t_apply + 40 * d.dev
    # --- parallel_apply: one worker thread per device ---
    for d in (devs[0], devs[2], devs[3]):
        dp_gnn_forward(d)
        info["peak_%d" % d.dev] = d.peak
    # cuda:1: layers 1 and 2, then layer 3's message MLP asks for its first hidden tensor (A)
    a_name, a_size, a_op, a_py = dp_gnn_forward(d1, stop_at=DP_A)
    if limit is None:
        # first pass: what the flush would release, and the mapped bytes after A
        phys_before = d1.a.phys
        d1.a.release_cached_blocks()
        info["flush_unmaps"] = d1.a.stats["unmap"]
        info["flushed_bytes"] = phys_before - d1.a.phys
        d1.alloc(a_name, a_size, a_op, a_py, "act", line=174)
        info["phys_after_a"] = d1.a.phys
        return devs, info
    d1.a.limit = limit
    d1.a.t += 120
    unmaps_before = d1.a.stats["unmap"]
    phys_before = d1.a.phys
    d1.alloc(a_name, a_size, a_op, a_py, "act", line=174)
    info["flush_unmaps"] = d1.a.stats["unmap"] - unmaps_before
    info["flush_events"] = [i for i, e in enumerate(d1.a.trace) if e["action"] == "segment_unmap"]
    info["flushed_bytes"] = sum(d1.a.trace[i]["size"] for i in info["flush_events"])
    info["a_request"] = a_size
    # B: the SiLU after it, the same size: 253 new pages, 91 MiB free: out of memory
    info["live_at_oom"] = d1.requested
    info["line_live_at_oom"] = dict(d1.line_live)
    info["tags_at_oom"] = d1.tag_bytes()
    info["reserved_at_oom"] = d1.a.phys
    b_name = a_name.replace("l1", "s1")
    d1.a.t += 15
    try:
        d1.alloc(b_name, a_size, "silu", DP_SILU + DP_SEQ + DP_GNN_LINE(174), "act", line=174)
        raise SystemExit("dp_imbalance_oom: the request on cuda:1 did not fail")
    except mx.OutOfMemory:
        pass
    info["oom_request"] = sf.round_size(a_size)
    info["oom_device_free"] = d1.a.trace[-1]["device_free"]
    info["cached_free_at_oom"] = d1.a.phys - sum(
        b.size for b in d1.a.active)
    info["oom_event"] = len(d1.a.trace) - 1
    # the pages the failed request needed: the free block before the unmapped tail (if any)
    # is used first, the rest in new 20 MiB pages
    tail = max((b for b in d1.a.large.unmapped), key=lambda b: b.ptr)
    before = tail.prev.size if tail.prev is not None and not tail.prev.allocated else 0
    page = mx.K_LARGE_BUFFER
    info["oom_new_pages"] = -(-(info["oom_request"] - before) // page)
    info["free_before_tail"] = before
    info["short_by"] = info["oom_new_pages"] * page - info["oom_device_free"]
    info["largest_free_at_oom"] = max(b.size for b in d1.a.large.blocks)
    info["line_max_at_oom"] = [dict(d.line_max) for d in devs]
    info["peaks"] = [d.peak for d in devs]
    # the worker's exception unwinds: EdgeConv's and GraphQA's frames go, and with them the
    # autograd graph that held every saved tensor (ExceptionWrapper keeps no frames)
    d1.a.t += 900
    for name in sorted((n for n in d1.live if n.startswith("g")),
                       key=lambda n: -d1.live[n][0]):
        d1.free(name, dt=2)
    # main thread: parallel_apply re-raises; after the except block (train.py:95) every frame of
    # the step is gone: outputs and graphs of the other replicas, the replicas, the scattered
    # inputs, the Qwen3 activations and the batch; the parameters on cuda:0 stay
    t_end = max(d.a.t for d in devs) + 5000
    for d in devs:
        d.a.t = max(d.a.t, t_end)
        for name in [n for n in d.live if d.live[n][2] != "param"][::-1]:
            d.free(name, dt=2)
    return devs, info


def sc_dp():
    """Both passes: the first measures the mapped bytes after the request that succeeds on the
    retry, the second runs with the physical limit that leaves 91 MiB free after it."""
    _, first = dp_job(None)
    limit = first["phys_after_a"] + DP_DEVICE_FREE_AT_OOM
    devs, info = dp_job(limit)
    assert info["flush_unmaps"] == 6 and info["oom_device_free"] == DP_DEVICE_FREE_AT_OOM, info
    info["limit"] = limit
    return devs, info


def gib(n):
    return "%.2f GiB" % (n / GIB)


def build_dp(out_dir):
    devs, info = sc_dp()
    obj = {"segments": [seg for d in devs for seg in d.a.segments()],
           "device_traces": [d.a.trace for d in devs],
           "allocator_settings": mx.settings("2.8"),
           "external_annotations": []}
    data = pickle.dumps(obj, protocol=4)
    d1 = devs[1]
    req, short, live = info["oom_request"], info["short_by"], info["live_at_oom"]
    capacity = info["reserved_at_oom"] + info["oom_device_free"]
    lines = info["line_max_at_oom"]
    dev_facts = {}
    for d in devs:
        acts = {}
        for e in d.a.trace:
            acts[e["action"]] = acts.get(e["action"], 0) + 1
        peak_reserved = max(d.a.phys_after + [d.a.phys])
        dev_facts[str(d.dev)] = {
            "events": len(d.a.trace),
            "events_by_action": dict(sorted(acts.items())),
            "oom_count": acts.get("oom", 0),
            "iterations": 0,
            "peak_requested_bytes": d.peak,
            "peak_reserved_bytes": peak_reserved,
            "final_requested_bytes": d.requested,
            "final_reserved_bytes": d.a.phys,
            "largest_block_by_line": {"models.py:%d" % k: v for k, v in sorted(d.line_max.items())},
        }
    desc = ("A 4-GPU job (torch 2.8-era fields, expandable_segments:True) whose first training "
            "step runs out of memory on cuda:1. cuda:0 holds the parameters (a Qwen3 text "
            "encoder, bf16, truncated to 27 decoder layers, and the GraphQA GNN, module init at "
            "train.py:108/112) and runs ONE forward pass of the encoder with grad (27 decoder "
            "layers under modeling_qwen3.py:405: a repeating per-layer pattern with growing live "
            "bytes, not 27 steps). GraphDataParallel (parallel.py) scatters whole graphs to the "
            "devices: cuda:1 gets the huge ones (%d edges vs %d / %d / %d), replicate() copies "
            "the GNN's %d parameter bytes to cuda:1..3 through comm.py broadcast_coalesced "
            "(replicas: parameters, not gradients), and parallel_apply runs GraphQA.forward on "
            "one worker thread per device (stacks: the native unwind to start_thread / "
            "pthread_create.c:477 / __clone3, then the Python frames models.py:174 forward ... "
            "_worker ... threading.py _bootstrap). Per EdgeConv layer models.py:174 builds the "
            "message MLP's [E x 2048] fp32 hidden tensors: %d bytes each on cuda:0, %d on "
            "cuda:1, %d on cuda:2, %d on cuda:3. cuda:1 (an 80 GB card: %d bytes usable by "
            "the allocator, the rest held by the CUDA context and libraries) fills to %d live "
            "bytes in its third layer; the first MLP Linear's %d-byte request cannot map its "
            "pages, the allocator flushes its cache (6 segment_unmap, %d bytes) and the retry "
            "succeeds; the next request (the SiLU, %d bytes) needs %d new 20 MiB pages with "
            "%d bytes free: oom. Short by %d bytes; not fragmentation (the cache holds %d "
            "bytes in pieces, the largest %d). The worker's exception then frees the forward "
            "intermediates on cuda:1, and after the except block every frame of the step is gone "
            "on all devices: the end state is mostly free cache (a cache-bloat warning would be "
            "wrong), only cuda:0's parameters stay live."
            % (DP_EDGES[1], DP_EDGES[0], DP_EDGES[2], DP_EDGES[3], info["replica_bytes"],
               lines[0][174], lines[1][174], lines[2][174], lines[3][174], capacity, live, req,
               info["flushed_bytes"], req, info["oom_new_pages"], info["oom_device_free"],
               short, info["cached_free_at_oom"], info["largest_free_at_oom"]))
    findings = [
        {"kind": "oom_verdict", "device": 1, "severity_at_least": "high",
         "stack_contains": "models.py:174",
         "bytes_at_least": int(short * 0.9), "bytes_at_most": int(req * 1.05),
         "oom": {"fragmentation": False,
                 "short_by_bytes": [int(short * 0.97), int(short * 1.03)],
                 "live_bytes": [int(live * 0.97), int(live * 1.03)],
                 "capacity_bytes": [int(capacity * 0.97), int(capacity * 1.03)]},
         # the cache flush before the OOM is evidence: oom.flushed_bytes, or an evidence line
         # about the flush (its text says flush/unmap/released) with these bytes
         "flushed": [int(info["flushed_bytes"] * 0.9), int(info["flushed_bytes"] * 1.1)],
         # the smallest changes begin with the even split: the mean of what the 4 replicas
         # needed fits cuda:1's card (cross_device.h EvenSplit)
         "fix_contains": "the smallest changes: an even split of the batch across the 4 replicas",
         # live bytes by category at the OOM (the verdict's "live CATEGORY (inferred)"
         # evidence): the replicas are parameters, not gradients; the forward intermediates
         # are activations (the scattered inputs may count as activation or another category)
         "categories": {"parameter": [info["replica_bytes"], info["replica_bytes"] + MIB],
                        "gradient": [0, 0], "temporary": [0, GIB],
                        "activation": [int(info["tags_at_oom"]["act"] * 0.95), live + MIB]}},
        {"kind": "device_imbalance", "device": None, "severity_at_least": "warning",
         "stack_contains": "models.py:174"},
    ]
    facts = {
        "era": "2.8", "devices": 4, "expandable_segments": True,
        "oom_device": 1, "oom_event": info["oom_event"], "oom_request": req,
        "oom_device_free": info["oom_device_free"], "oom_new_pages": info["oom_new_pages"],
        "free_at_end_of_mapped_range": info["free_before_tail"],
        "short_by_bytes": short, "live_at_oom": live, "reserved_at_oom": info["reserved_at_oom"],
        "capacity_bytes": capacity, "card_total_bytes": DP_CARD_TOTAL,
        "cached_free_at_oom": info["cached_free_at_oom"],
        "largest_free_at_oom": info["largest_free_at_oom"],
        "flush_unmaps": info["flush_unmaps"], "flushed_bytes": info["flushed_bytes"],
        "flush_events": info["flush_events"],
        "live_by_line_at_oom": {"models.py:%d" % k: v
                                for k, v in sorted(info["line_live_at_oom"].items())},
        "live_by_kind_at_oom": info["tags_at_oom"],
        "replica_bytes_per_device": info["replica_bytes"],
        "qwen3_decoder_layers_on_cuda0": QW_LAYERS, "gnn_layers": DP_LAYERS,
        "edges_per_device": DP_EDGES,
    }
    expected = {
        "scenario": DP_NAME, "description": desc, "findings": findings,
        "must_not_fire": ["leak", "activation_retention", "optimizer_state_bloat",
                          "oom_fragmentation", "pending_free_retention", "incomplete_history"],
        "must_not_fire_on": {"1": ["cache_bloat", "temporary_spike"]},
        "headline": {"focus_device": 1, "first_kind": "oom_verdict", "first_device": 1},
        "device_facts": dev_facts,
        "facts": facts,
    }
    text = ["# %s.txt - generated by tools/make_scenarios.py (sc_dp / build_dp); do not edit."
            % DP_NAME,
            "# No .fixture: the fixture compiler has no expandable segments; the job is simulated",
            "# with tools/make_expandable.py's allocator. What happened, per device:", "#"]
    text += ["# " + w for w in wrap(desc, 94)]
    text.append("")
    for d in devs:
        f = dev_facts[str(d.dev)]
        text.append("cuda:%d  %d events %s" % (d.dev, f["events"], f["events_by_action"]))
        text.append("        peak requested %d (%s), peak reserved %d (%s), final reserved %d, "
                    "final requested %d"
                    % (f["peak_requested_bytes"], gib(f["peak_requested_bytes"]),
                       f["peak_reserved_bytes"], gib(f["peak_reserved_bytes"]),
                       f["final_reserved_bytes"], f["final_requested_bytes"]))
        text.append("        largest block by line: " + ", ".join(
            "%s %d" % kv for kv in f["largest_block_by_line"].items()))
    text.append("")
    text.append("cuda:1 from the flush on (event index: action size):")
    for i, e in enumerate(d1.a.trace):
        if info["flush_events"][0] - 3 <= i <= info["oom_event"] + 2:
            text.append("  %4d %-15s %12d%s" % (i, e["action"], e["size"],
                                                ("  device_free=%d" % e["device_free"])
                                                if e["action"] == "oom" else ""))
    with open(os.path.join(out_dir, DP_NAME + ".pickle"), "wb") as f:
        f.write(data)
    with open(os.path.join(out_dir, DP_NAME + ".expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, DP_NAME + ".txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(text) + "\n")
    events = sum(len(d.a.trace) for d in devs)
    return DP_NAME, events, len(data), {"peak_requested_bytes": max(info["peaks"]),
                                        "peak_reserved_bytes": max(
                                            v["peak_reserved_bytes"] for v in dev_facts.values())}
