#!/usr/bin/env python3
"""Generate the scenario corpus for the findings detectors (snapshots/scenarios/).

Each scenario is a synthetic training loop of a small GPT-style model (vocab 8192, d_model 512,
2 transformer blocks = 2 attention + 2 MLP sub-layers, untied embedding/lm_head, batch 8 x 128
tokens, fp32, torch.optim.Adam with foreach=False, zero_grad(set_to_none=True)), clean or with
one problem injected.  For every scenario NAME the generator writes

    NAME.fixture        the text form (tools/snapshot_fixture.py), so a reader can see what happened
    NAME.pickle         the compiled PyTorch-format snapshot
    NAME.expected.json  the findings a detector must report (and must not report)

One scenario is not such a loop: dp_imbalance_oom (a 4-GPU DataParallel job with expandable
segments that runs out of memory on cuda:1) is simulated with tools/make_expandable.py's allocator
(the fixture compiler has no expandable segments) and gets NAME.txt (what happened) instead of a
.fixture; see dp_job / build_dp below.

Addresses come from the compiler's allocator model ("alloc auto"); this script only decides when
the allocator would have to cudaMalloc a new segment (no cached free block of the pool and stream
fits) and with which size (2 MiB small pool, 20 MiB for requests below 10 MiB, else the request
rounded up to 2 MiB).  Everything is deterministic (fixed seeds, no wall clock).

Usage:
    python3 tools/make_scenarios.py --out snapshots/scenarios
    python3 tools/make_scenarios.py --check [--out snapshots/scenarios]
        regenerate into a temporary folder and fail if anything differs from the committed files

Python 3 standard library only.  The schema of NAME.expected.json is documented in
snapshots/scenarios/README.md.
"""

import argparse
import filecmp
import json
import os
import pickle
import random
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import snapshot_fixture as sf  # noqa: E402

KIB, MIB, GIB = sf.KIB, sf.MIB, sf.GIB
T0 = 1767225600000000            # 2026-01-01 00:00:00 UTC, in microseconds
SEG_BASE = 0x7f2a40000000        # first cudaMalloc'd address
SIDE_STREAM = 94373802471424     # cudaStream_t of the prefetch stream (a pointer value)

KINDS = ["leak", "activation_retention", "optimizer_state_bloat", "oom_fragmentation",
         "cache_bloat", "temporary_spike", "pending_free_retention"]
# kinds added by issue 13 (built by the detector helpers of that session); the clean scenarios list
# them in must_not_fire too (activation_checkpointing only where activations hold < 50 % of the
# peak: see the README's table of activation shares); allocator_setting (issue 28) fires only where
# a replay shows expandable segments lower the peak reserved, which no scenario here is built for
NEW_KINDS = ["activation_checkpointing", "device_imbalance", "incomplete_history",
             "allocator_setting", "inference_with_grad"]
ALL_KINDS = KINDS + NEW_KINDS

# model: vocab V, width D, tokens per batch T (8 x 128), MLP hidden 4D, 2 blocks
V, D, T, HID, NBLK = 8192, 512, 1024, 2048, 2
F32 = 4
ACT = T * D * F32                # 2 MiB: one [1024 x 512] activation
QKV = 3 * ACT                    # 6 MiB
SCORES = 8 * 8 * 128 * 128 * F32  # 4 MiB: [8 batch, 8 heads, 128, 128]
HIDDEN = T * HID * F32           # 8 MiB
RSTD = T * F32                   # 4 KiB (small pool)
LOGITS = T * V * F32             # 32 MiB
IDS = T * 8                      # 8 KiB int64 token ids
PARAMS = [                       # (name, bytes, module depth for the .to() stack)
    ("tok_emb.weight", V * D * F32, 1),
] + [p for b in range(NBLK) for p in (
    ("blocks.%d.attn.qkv.weight" % b, 3 * D * D * F32, 4),
    ("blocks.%d.attn.proj.weight" % b, D * D * F32, 4),
    ("blocks.%d.mlp.fc1.weight" % b, D * HID * F32, 4),
    ("blocks.%d.mlp.fc2.weight" % b, HID * D * F32, 4),
)] + [
    ("lm_head.weight", V * D * F32, 1),
]
PARAM_BYTES = sum(p[1] for p in PARAMS)



class Model:
    """Sizes of one model configuration (the default is the corpus' small GPT)."""

    def __init__(self, V=8192, D=512, batch=8, seq=128, heads=8, NBLK=2):
        self.V, self.D, self.NBLK, self.heads = V, D, NBLK, heads
        self.batch, self.seq = batch, seq
        self.T = batch * seq
        self.HID = 4 * D
        self.ACT = self.T * D * F32
        self.QKV = 3 * self.ACT
        self.SCORES = batch * heads * seq * seq * F32
        self.HIDDEN = self.T * self.HID * F32
        self.RSTD = self.T * F32
        self.LOGITS = self.T * V * F32
        self.IDS = self.T * 8
        self.PARAMS = [("tok_emb.weight", V * D * F32, 1)] + [p for b in range(NBLK) for p in (
            ("blocks.%d.attn.qkv.weight" % b, 3 * D * D * F32, 4),
            ("blocks.%d.attn.proj.weight" % b, D * D * F32, 4),
            ("blocks.%d.mlp.fc1.weight" % b, D * self.HID * F32, 4),
            ("blocks.%d.mlp.fc2.weight" % b, self.HID * D * F32, 4),
        )] + [("lm_head.weight", V * D * F32, 1)]
        self.PARAM_BYTES = sum(p[1] for p in self.PARAMS)


SMALL_GPT = Model()
assert SMALL_GPT.PARAM_BYTES == PARAM_BYTES and SMALL_GPT.LOGITS == LOGITS

USER = "/home/user/tinygpt"
TORCH = "/usr/local/lib/python3.11/site-packages/torch"

STACKS = """\
# ---- Python stacks, innermost frame first ("@name" splices in an earlier stack) ----
stack top        = {U}/train.py:95:<module>
stack loop       = {U}/train.py:86:main ; @top
stack call       = {P}/nn/modules/module.py:1762:_call_impl ; {P}/nn/modules/module.py:1751:_wrapped_call_impl
# model = TinyGPT(cfg, device="cuda"): model.py:88 __init__ ends with self.to(device)
stack to_root    = {P}/nn/modules/module.py:1355:to ; {U}/model.py:88:__init__ ; {U}/train.py:80:main ; @top
stack init_d1    = {P}/nn/modules/module.py:1341:convert ; {P}/nn/modules/module.py:942:_apply ; {P}/nn/modules/module.py:915:_apply ; @to_root
stack init_d4    = {P}/nn/modules/module.py:1341:convert ; {P}/nn/modules/module.py:942:_apply ; {P}/nn/modules/module.py:915:_apply ; {P}/nn/modules/module.py:915:_apply ; {P}/nn/modules/module.py:915:_apply ; {P}/nn/modules/module.py:915:_apply ; @to_root
# data
stack step       = {U}/train.py:52:train_step ; @loop
stack batch_x    = {U}/train.py:22:get_batch ; @step
stack batch_y    = {U}/train.py:23:get_batch ; @step
# forward: logits = model(x) (train.py:53)
stack fwd        = @call ; {U}/train.py:53:train_step ; @loop
stack f_emb      = {P}/nn/functional.py:2551:embedding ; {P}/nn/modules/sparse.py:192:forward ; @call ; {U}/model.py:91:forward ; @fwd
stack in_block   = @call ; {U}/model.py:92:forward ; @fwd
stack attn_call  = @call ; {U}/model.py:61:forward ; @in_block
stack mlp_call   = @call ; {U}/model.py:62:forward ; @in_block
stack f_n1_rstd  = {U}/model.py:21:forward ; @call ; {U}/model.py:61:forward ; @in_block
stack f_n1       = {U}/model.py:22:forward ; @call ; {U}/model.py:61:forward ; @in_block
stack f_qkv      = {P}/nn/modules/linear.py:125:forward ; @call ; {U}/model.py:37:forward ; @attn_call
stack f_scores   = {U}/model.py:38:forward ; @attn_call
stack f_probs    = {U}/model.py:39:forward ; @attn_call
stack f_ctx      = {U}/model.py:40:forward ; @attn_call
stack f_proj     = {P}/nn/modules/linear.py:125:forward ; @call ; {U}/model.py:41:forward ; @attn_call
stack f_res1     = {U}/model.py:61:forward ; @in_block
stack f_n2_rstd  = {U}/model.py:21:forward ; @call ; {U}/model.py:62:forward ; @in_block
stack f_n2       = {U}/model.py:22:forward ; @call ; {U}/model.py:62:forward ; @in_block
stack f_fc1      = {P}/nn/modules/linear.py:125:forward ; @call ; {U}/model.py:51:forward ; @mlp_call
stack f_gelu     = {U}/model.py:51:forward ; @mlp_call
stack f_fc2      = {P}/nn/modules/linear.py:125:forward ; @call ; {U}/model.py:52:forward ; @mlp_call
stack f_res2     = {U}/model.py:62:forward ; @in_block
stack f_nf_rstd  = {U}/model.py:21:forward ; @call ; {U}/model.py:93:forward ; @fwd
stack f_nf       = {U}/model.py:22:forward ; @call ; {U}/model.py:93:forward ; @fwd
stack f_head     = {P}/nn/modules/linear.py:125:forward ; @call ; {U}/model.py:94:forward ; @fwd
# loss = F.cross_entropy(logits.view(-1, V), y.view(-1)) (train.py:54)
stack f_ce       = {P}/nn/functional.py:3494:cross_entropy ; {U}/train.py:54:train_step ; @loop
# loss.backward() (train.py:55); allocations of the autograd thread carry the call site
stack bwd        = {P}/autograd/graph.py:829:_engine_run_backward ; {P}/autograd/__init__.py:354:backward ; {P}/_tensor.py:648:backward ; {U}/train.py:55:train_step ; @loop
# optimizer.step() (train.py:56)
stack opt        = {P}/optim/optimizer.py:79:_use_grad ; {P}/optim/optimizer.py:493:wrapper ; {U}/train.py:56:train_step ; @loop
stack adam_exp_avg    = {P}/optim/adam.py:166:_init_group ; {P}/optim/adam.py:236:step ; @opt
stack adam_exp_avg_sq = {P}/optim/adam.py:170:_init_group ; {P}/optim/adam.py:236:step ; @opt
stack adam_denom      = {P}/optim/adam.py:446:_single_tensor_adam ; {P}/optim/adam.py:952:adam ; {P}/optim/adam.py:247:step ; @opt
""".format(U=USER, P=TORCH)


def seg_size_for(rounded):
    if rounded <= sf.SMALL_SIZE:
        return sf.SMALL_SEGMENT
    if rounded < 10 * MIB:
        return 20 * MIB
    return (rounded + sf.ROUND_LARGE - 1) // sf.ROUND_LARGE * sf.ROUND_LARGE


class Gen:
    """Writes fixture text and compiles it statement by statement, so the allocator model's
    state (which blocks are free) is known while the trace is being written."""

    def __init__(self, name, era="2.11", annotations=True, seed=1):
        self.name = name
        self.era = era
        self.annotations = annotations and era in ("2.6", "2.11")
        self.rng = random.Random(seed)
        self.comp = sf.Compiler(name + ".fixture")
        self.lines = []
        self.t = T0
        self.next_seg = SEG_BASE
        self.live = {}            # fixture name -> {"size", "tag", "pending"}
        self.requested = 0        # live requested bytes (alloc .. free_completed), as ref_replay
        self.reserved = 0
        self.pending = 0
        self.peak = {"requested": -1}
        self.peak_reserved = 0
        self.step = -1
        self.step_max = {}        # step -> max live requested bytes during it
        self.step_end = {}        # step -> live requested bytes at its end
        self.marks = {}           # free-form numbers for the expected findings
        self.model_text = True    # the header describes the training loop's model
        self.levels = []          # live requested bytes after each alloc and free, in order
        self.spans = {}           # fixture name -> (levels index of its alloc, of its free)
        self.extra_devices = []   # Gens of devices 1.. whose lines follow this one's (replicas)

    # ---- text ------------------------------------------------------------------------------
    def stmt(self, line):
        self.lines.append(line)
        self.comp.lineno = len(self.lines)
        text = sf.strip_comment(line).strip()
        if text:
            try:
                self.comp.statement(text)
            except sf.FixtureError as e:
                raise SystemExit("%s.fixture:%d: internal error: %s\n  %s"
                                 % (self.name, len(self.lines), e.message, line))

    def comment(self, text=""):
        self.lines.append(("# " + text) if text else "")

    def adv(self, lo, hi=None):
        self.t += lo if hi is None else self.rng.randint(lo, hi)

    def ev(self, rest, note=None):
        self.stmt("t %d %s%s" % (self.t, rest, ("   # " + note) if note else ""))

    def annotate(self, name, stage):
        if self.annotations:
            self.stmt("annotation %d %s %s" % (self.t, name, stage))

    def events(self):
        return sum(len(d.events) for d in self.comp.devices.values())

    # ---- allocator -------------------------------------------------------------------------
    def free_blocks(self, pool=None, stream=None):
        out = []
        for seg in self.comp.dev().segments:
            if (pool and seg.pool != pool) or (stream is not None and seg.stream != stream):
                continue
            out.extend((b, seg) for b in seg.blocks if b.state == "inactive")
        return out

    def fits(self, rounded, stream):
        pool = sf.pool_for(rounded)
        return any(b.size >= rounded for b, _ in self.free_blocks(pool, stream))

    def _track(self):
        if self.requested > self.peak["requested"]:
            tags = {}
            for v in self.live.values():
                tags[v["tag"]] = tags.get(v["tag"], 0) + v["size"]
            self.peak = {"requested": self.requested, "reserved": self.reserved,
                         "pending": self.pending, "event": self.events() - 1,
                         "step": self.step, "tags": tags}
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        if self.step >= 0:
            self.step_max[self.step] = max(self.step_max.get(self.step, 0), self.requested)

    def alloc(self, name, size, stack, tag, stream=0, note=None):
        if name in self.live:
            raise SystemExit("%s: %s allocated twice" % (self.name, name))
        rounded = sf.round_size(size)
        skw = "" if stream == 0 else " stream=%d" % stream
        if not self.fits(rounded, stream):
            seg = seg_size_for(rounded)
            self.ev("segment_alloc 0x%x %d%s stack=%s" % (self.next_seg, seg, skw, stack))
            self.next_seg += seg
            self.reserved += seg
            self._track()
        self.ev("alloc auto %d%s name=%s stack=%s" % (size, skw, name, stack), note)
        self.live[name] = {"size": size, "tag": tag, "pending": False, "at": len(self.levels)}
        self.requested += size
        self.levels.append(self.requested)
        self._track()

    def free(self, name, note=None):
        v = self.live.pop(name)
        assert not v["pending"]
        self.ev("free @%s" % name, note)
        self.requested -= v["size"]
        self.spans[name] = (v["at"], len(self.levels))
        self.levels.append(self.requested)
        self._track()

    def free_requested(self, name, note=None):
        v = self.live[name]
        v["pending"] = True
        self.pending += v["size"]
        self.ev("free_requested @%s" % name, note)
        self._track()

    def free_completed(self, name, note=None):
        v = self.live.pop(name)
        assert v["pending"]
        self.pending -= v["size"]
        self.requested -= v["size"]
        self.ev("free_completed @%s" % name, note)
        self.spans[name] = (v["at"], len(self.levels))
        self.levels.append(self.requested)
        self._track()

    def release_cached(self):
        """The allocator's OOM retry path: cudaFree every segment that is one free block
        (large pool first, each pool in (size, address) order)."""
        released = 0
        for pool in ("large", "small"):
            segs = [s for s in self.comp.dev().segments
                    if s.pool == pool and len(s.blocks) == 1 and s.blocks[0].state == "inactive"]
            for s in sorted(segs, key=lambda s: (s.stream, s.size, s.addr)):
                self.adv(20, 60)
                self.ev("segment_free 0x%x %d" % (s.addr, s.size))
                self.reserved -= s.size
                released += s.size
        return released

    def live_tag_bytes(self, tag):
        return sum(v["size"] for v in self.live.values() if v["tag"] == tag)

    # ---- output ----------------------------------------------------------------------------
    def fixture_text(self, header):
        out = ["# " + h if h else "#" for h in header]
        out.append("")
        return "\n".join(out + self.lines) + "\n"


# --------------------------------------------------------------------------------------------
# the training loop


class Loop:
    """One scenario's training loop; the flags inject the problems."""

    def __init__(self, g, leak=False, kept_graph=False, dup_opt=False, bloat=False,
                 spike=False, prefetch=False, keep_output=False, hook=False, model=SMALL_GPT,
                 forward_only=False, keep_prev=False):
        self.g = g
        self.keep_prev = keep_prev       # logits = train_step(batch): kept until the next returns
        self.opt_starts = {}             # step -> index into g.levels where optimizer.step() began
        self.forward_only = forward_only  # no backward, no optimizer: autograd on, graph dropped
        self.m = model
        self.keep_output = keep_output   # history.append(logits): the output survives the step
        self.hook = hook                 # forward hooks clone every Linear output, kept a step
        self.leak = leak
        self.kept_graph = kept_graph
        self.dup_opt = dup_opt
        self.bloat = bloat
        self.spike = spike
        self.prefetch = prefetch
        self.opt_state = False
        self.opt2_state = False

    # parameters: model = TinyGPT(cfg).to("cuda")
    def build(self):
        g = self.g
        g.comment("=== model = TinyGPT(cfg, device='cuda') (train.py:80): %d parameters, %d bytes ==="
                  % (len(self.m.PARAMS), self.m.PARAM_BYTES))
        for name, size, depth in self.m.PARAMS:
            g.adv(150, 400)
            g.alloc(name, size, "init_d%d" % depth, "param")
        g.marks["param_bytes"] = self.m.PARAM_BYTES

    def fwd(self, k, pfx):
        """Forward; returns the names of the tensors saved for backward (in allocation order)."""
        g = self.g
        saved = []

        def a(name, size, stack, keep=True, note=None):
            g.adv(20, 90)
            g.alloc(pfx + name, size, stack, "act" if keep else "tmp", note=note)
            if keep:
                saved.append(pfx + name)

        def f(name):
            g.adv(3, 8)
            g.free(pfx + name)

        def hook(site, size):
            """acts[name] = out.detach().clone() in a forward hook of every Linear: the new clone,
            then the previous step's clone of the same module is released (dict overwrite)."""
            if not self.hook:
                return
            g.adv(6, 15)
            g.alloc("s%d.hook.%s" % (k, site), size, "hook_" + site.split(".")[-1], "hook",
                    note="forward hook: acts[%r] = out.detach().clone()" % site if k == 0 else None)
            if k > 0:
                g.adv(2, 5)
                g.free("s%d.hook.%s" % (k - 1, site),
                       note="the previous step's clone is released by the overwrite")

        a("emb", self.m.ACT, "f_emb")
        for b in range(self.m.NBLK):
            p = "b%d." % b
            a(p + "n1.rstd", self.m.RSTD, "f_n1_rstd")
            a(p + "n1", self.m.ACT, "f_n1")
            a(p + "qkv", self.m.QKV, "f_qkv")
            hook(p + "qkv", self.m.QKV)
            a(p + "scores", self.m.SCORES, "f_scores", keep=False)
            a(p + "probs", self.m.SCORES, "f_probs")
            f(p + "scores")
            if self.spike and k >= 1 and b == 1:
                a(p + "mem_attn", SPIKE_BYTES, "f_mem_attn", keep=False,
                  note="attn = q @ self.mem_k.transpose(-2, -1): [8, 8, 128, 12288] fp32")
                a(p + "mem_w", 8 * 8 * 128 * 32 * F32, "f_mem_topk")
                a(p + "mem_idx", 8 * 8 * 128 * 32 * 8, "f_mem_topk")
                f(p + "mem_attn")
            a(p + "ctx", self.m.ACT, "f_ctx")
            a(p + "attn_out", self.m.ACT, "f_proj", keep=False)
            hook(p + "proj", self.m.ACT)
            a(p + "x_mid", self.m.ACT, "f_res1")
            f(p + "attn_out")
            a(p + "n2.rstd", self.m.RSTD, "f_n2_rstd")
            a(p + "n2", self.m.ACT, "f_n2")
            a(p + "fc1", self.m.HIDDEN, "f_fc1")
            hook(p + "fc1", self.m.HIDDEN)
            a(p + "h", self.m.HIDDEN, "f_gelu")
            a(p + "mlp_out", self.m.ACT, "f_fc2", keep=False)
            hook(p + "fc2", self.m.ACT)
            a(p + "x_out", self.m.ACT, "f_res2")
            f(p + "mlp_out")
        a("nf.rstd", self.m.RSTD, "f_nf_rstd")
        a("xf", self.m.ACT, "f_nf")
        if self.keep_prev:
            g.adv(20, 90)
            g.alloc("s%d.logits" % k, self.m.LOGITS, "f_head", "kept_prev",
                    note="logits [1024 x 8192] fp32, returned by train_step and kept by the "
                    "loop's `logits = train_step(batch)` (train.py:86) until the next step returns"
                    if k == 0 else None)
        elif self.keep_output:
            g.adv(20, 90)
            g.alloc("s%d.logits" % k, self.m.LOGITS, "f_head", "kept_out",
                    note="logits [1024 x 8192] fp32; history.append(logits) at train.py:58 "
                    "keeps it (no .detach())")
        else:
            a("logits", self.m.LOGITS, "f_head", keep=False,
              note="logits [%d x %d] fp32; a local of train_step until it returns"
              % (self.m.T, self.m.V))
        hook("head", self.m.LOGITS)
        a("logsm", self.m.LOGITS, "f_ce", note="log_softmax inside F.cross_entropy")
        a("loss", 4, "f_ce")
        return saved

    def bwd(self, k, pfx):
        """Backward: gradients (set_to_none=True, so new every step) and backward temporaries;
        frees the saved activations unless the graph is kept."""
        g = self.g
        keep = self.kept_graph

        def a(name, size, tag):
            g.adv(40, 150)
            g.alloc(name, size, "bwd", tag)

        def f(name, act=False):
            if act and keep:
                return
            g.adv(3, 8)
            g.free(name if not act else pfx + name)

        a("g_logits", self.m.LOGITS, "tmp")
        f("logsm", act=True)
        a("lm_head.weight.grad", self.m.V * self.m.D * F32, "grad")
        a("g_x", self.m.ACT, "tmp")
        f("g_logits")
        f("xf", act=True)
        f("nf.rstd", act=True)
        for b in reversed(range(self.m.NBLK)):
            p = "b%d." % b
            w = "blocks.%d." % b
            a(w + "mlp.fc2.weight.grad", self.m.HID * self.m.D * F32, "grad")
            a(p + "g_h", self.m.HIDDEN, "tmp")
            f(p + "h", act=True)
            f(p + "x_out", act=True)
            a(p + "g_fc1", self.m.HIDDEN, "tmp")
            f(p + "g_h")
            f(p + "fc1", act=True)
            a(w + "mlp.fc1.weight.grad", self.m.D * self.m.HID * F32, "grad")
            a(p + "g_n2", self.m.ACT, "tmp")
            f(p + "g_fc1")
            f(p + "n2", act=True)
            f(p + "n2.rstd", act=True)
            a(p + "g_xmid", self.m.ACT, "tmp")
            f(p + "g_n2")
            f("g_x")
            f(p + "x_mid", act=True)
            a(w + "attn.proj.weight.grad", self.m.D * self.m.D * F32, "grad")
            a(p + "g_ctx", self.m.ACT, "tmp")
            a(p + "g_probs", self.m.SCORES, "tmp")
            f(p + "ctx", act=True)
            if self.spike and k >= 1 and b == 1:
                f(p + "mem_w", act=True)
                f(p + "mem_idx", act=True)
            a(p + "g_scores", self.m.SCORES, "tmp")
            f(p + "g_probs")
            f(p + "probs", act=True)
            a(p + "g_qkv", self.m.QKV, "tmp")
            f(p + "g_scores")
            f(p + "g_ctx")
            a(w + "attn.qkv.weight.grad", 3 * self.m.D * self.m.D * F32, "grad")
            a(p + "g_n1", self.m.ACT, "tmp")
            f(p + "g_qkv")
            f(p + "qkv", act=True)
            a("g_x", self.m.ACT, "tmp")
            f(p + "g_n1")
            f(p + "g_xmid")
            f(p + "n1", act=True)
            f(p + "n1.rstd", act=True)
        a("tok_emb.weight.grad", self.m.V * self.m.D * F32, "grad")
        f("g_x")
        f("emb", act=True)

    def adam(self, which, first):
        """optimizer.step(): lazy state at the first step, then one denom temporary per
        parameter (exp_avg_sq.sqrt() and the division by bias_correction2_sqrt)."""
        g = self.g
        sfx = "" if which == 1 else ".opt2"
        opt_stack = "" if which == 1 else "2"
        g.adv(60, 120)
        if which == 1:
            self.opt_starts[g.step] = len(g.levels)
        g.annotate("Optimizer.step#Adam.step", "START")
        for name, size, _ in self.m.PARAMS:
            if first:
                g.adv(15, 30)
                g.alloc(name + sfx + ".exp_avg", size, "adam_exp_avg" + opt_stack, "optstate")
                g.adv(15, 30)
                g.alloc(name + sfx + ".exp_avg_sq", size, "adam_exp_avg_sq" + opt_stack,
                        "optstate")
            g.adv(10, 25)
            g.alloc(name + ".sqrt", size, "adam_denom" + opt_stack, "tmp")
            g.adv(8, 15)
            g.alloc(name + ".denom", size, "adam_denom" + opt_stack, "tmp")
            g.adv(2, 5)
            g.free(name + ".sqrt")
            g.adv(10, 25)
            g.free(name + ".denom")
        g.adv(40, 80)
        g.annotate("Optimizer.step#Adam.step", "END")

    def step(self, k):
        g = self.g
        g.step = k
        pfx = "s%d." % k if self.kept_graph else ""
        g.comment("")
        g.comment("=== step %d (ProfilerStep#%d) ===" % (k, k))
        g.adv(18000, 24000)   # data loading / host work between steps
        g.annotate("ProfilerStep#%d" % k, "START")
        if self.prefetch:
            self.prefetch_step(k, pfx)
        else:
            g.adv(20, 60)
            g.alloc(pfx + "x", self.m.IDS, "batch_x", "data", note="x = batch['input_ids'].to('cuda')")
            g.adv(20, 60)
            g.alloc(pfx + "y", self.m.IDS, "batch_y", "data")
        g.comment("forward")
        saved = self.fwd(k, pfx)
        if self.forward_only:
            g.comment("no backward and no optimizer: the graph goes with the loss at the step's end")
        else:
            g.comment("backward")
            g.adv(250, 400)
            self.bwd(k, pfx)
            g.comment("optimizer.step()")
            self.adam(1, not self.opt_state)
            self.opt_state = True
            if self.dup_opt:
                g.comment("aux_optimizer.step(): a second Adam over the same parameters (train.py:57)")
                self.adam(2, not self.opt2_state)
                self.opt2_state = True
            g.comment("optimizer.zero_grad(set_to_none=True) frees the gradients")
            g.adv(30, 60)
            g.annotate("Optimizer.zero_grad#Adam.zero_grad", "START")
            for name, _, _ in self.m.PARAMS:
                g.adv(3, 6)
                g.free(name + ".grad")
            g.annotate("Optimizer.zero_grad#Adam.zero_grad", "END")
        if self.leak:
            g.adv(30, 60)
            g.alloc("hist%d" % k, self.m.LOGITS, "leak_hist", "leak",
                    note="probs_history.append(logits.detach().softmax(-1))")
        if self.kept_graph and k == 0:
            g.adv(10, 20)
            g.alloc("total_loss", 4, "kept_total", "kept",
                    note="total_loss = 0; total_loss += loss: a new tensor that holds the graph")
        if self.bloat and k == 0:
            g.comment("one-off check at the first step: lm_head over a 32768-token validation set")
            g.adv(40, 80)
            g.alloc("val_h", 32768 * self.m.D * F32, "bloat_val", "tmp")
            g.adv(60, 120)
            g.alloc("ref_logits", 32768 * self.m.V * F32, "bloat_head", "tmp",
                    note="[32768 x 8192] fp32 = 1 GiB")
            g.adv(80, 150)
            g.alloc("baseline", 32768 * 8, "bloat_argmax", "tmp")
            g.adv(10, 20)
            g.free("ref_logits")
            g.adv(3, 8)
            g.free("val_h")
        # train_step returns: its locals go
        g.adv(20, 40)
        if self.bloat and k == 0:
            g.free("baseline")
        if self.keep_prev:
            if k > 0:
                g.adv(3, 8)
                g.free("s%d.logits" % (k - 1),
                       note="the loop's `logits` now names this step's: step %d's goes" % (k - 1)
                       if k == 1 else None)
        elif not self.keep_output:
            g.adv(3, 8)
            g.free(pfx + "logits")
        if not self.kept_graph:
            g.adv(3, 8)
            g.free("loss")
            if not self.prefetch:
                g.adv(3, 8)
                g.free("x")
                g.adv(3, 8)
                g.free("y")
        if self.forward_only:
            for n, name in enumerate(reversed([x for x in saved if x != "loss"])):
                g.adv(3, 8)
                g.free(name, note="the graph dropped with the loss frees what it saved for backward"
                       if k == 0 and n == 0 else None)
        if self.prefetch:
            for n in ("x", "y", "teacher"):
                g.adv(3, 8)
                g.free_requested("b%d.%s" % (k, n),
                                 note="used on the compute stream (record_stream): pending")
        g.adv(10, 30)
        g.annotate("ProfilerStep#%d" % k, "END")
        g.step_end[k] = g.requested

    def prefetch_step(self, k, pfx):
        """The prefetcher copies batch k+1 on the side stream while step k runs; batch k-LAG's
        frees complete only now (the compute stream's event recorded at its free_requested)."""
        g = self.g
        old = k - PREFETCH_LAG
        if old >= 0:
            for n in ("x", "y", "teacher"):
                g.adv(1, 2)
                g.free_completed("b%d.%s" % (old, n),
                                 note="event of step %d's free completes at this malloc" % old)
        for j in ([0, 1] if k == 0 else [k + 1]):
            for n, size, stack in (("x", self.m.IDS, "pf_x"), ("y", self.m.IDS, "pf_y"),
                                   ("teacher", self.m.LOGITS, "pf_teacher")):
                g.adv(20, 60)
                g.alloc("b%d.%s" % (j, n), size, stack, "data", stream=SIDE_STREAM,
                        note="prefetch of batch %d on the side stream" % j if n == "x" else None)


SPIKE_BYTES = 8 * 8 * 128 * 12288 * F32    # 384 MiB
PREFETCH_LAG = 4

EXTRA_STACKS = {
    "leak": """\
stack leak_hist  = {U}/train.py:58:train_step ; @loop
""",
    "kept": """\
stack kept_total = {U}/train.py:58:train_step ; @loop
""",
    "dup": """\
stack opt2       = {P}/optim/optimizer.py:79:_use_grad ; {P}/optim/optimizer.py:493:wrapper ; {U}/train.py:57:train_step ; @loop
stack adam_exp_avg2    = {P}/optim/adam.py:166:_init_group ; {P}/optim/adam.py:236:step ; @opt2
stack adam_exp_avg_sq2 = {P}/optim/adam.py:170:_init_group ; {P}/optim/adam.py:236:step ; @opt2
stack adam_denom2      = {P}/optim/adam.py:446:_single_tensor_adam ; {P}/optim/adam.py:952:adam ; {P}/optim/adam.py:247:step ; @opt2
""",
    "bloat": """\
stack bloat_val    = {U}/train.py:60:train_step ; @loop
stack bloat_head   = {P}/nn/modules/linear.py:125:forward ; @call ; {U}/train.py:61:train_step ; @loop
stack bloat_argmax = {U}/train.py:62:train_step ; @loop
""",
    "hook": """\
stack hook_qkv   = {U}/train.py:35:save_hook ; {P}/nn/modules/module.py:1805:_call_impl ; {P}/nn/modules/module.py:1751:_wrapped_call_impl ; {U}/model.py:37:forward ; @attn_call
stack hook_proj  = {U}/train.py:35:save_hook ; {P}/nn/modules/module.py:1805:_call_impl ; {P}/nn/modules/module.py:1751:_wrapped_call_impl ; {U}/model.py:41:forward ; @attn_call
stack hook_fc1   = {U}/train.py:35:save_hook ; {P}/nn/modules/module.py:1805:_call_impl ; {P}/nn/modules/module.py:1751:_wrapped_call_impl ; {U}/model.py:51:forward ; @mlp_call
stack hook_fc2   = {U}/train.py:35:save_hook ; {P}/nn/modules/module.py:1805:_call_impl ; {P}/nn/modules/module.py:1751:_wrapped_call_impl ; {U}/model.py:52:forward ; @mlp_call
stack hook_head  = {U}/train.py:35:save_hook ; {P}/nn/modules/module.py:1805:_call_impl ; {P}/nn/modules/module.py:1751:_wrapped_call_impl ; {U}/model.py:94:forward ; @fwd
""",
    "keep_out": "",
    "spike": """\
stack f_mem_attn = {U}/model.py:44:forward ; @attn_call
stack f_mem_topk = {U}/model.py:45:forward ; @attn_call
""",
    "prefetch": """\
stack pf_top     = {U}/train.py:31:<dictcomp> ; {U}/train.py:31:prefetch ; {U}/train.py:51:train_step ; @loop
stack pf_x       = @pf_top
stack pf_y       = @pf_top
stack pf_teacher = @pf_top
""",
    "swap": """\
stack sw_init    = {U}/simulate.py:31:init_state ; @top
stack sw_step    = {P}/functional.py:402:einsum ; {U}/simulate.py:36:advance ; {U}/simulate.py:44:run ; @top
stack sw_tmp     = {U}/simulate.py:35:advance ; {U}/simulate.py:44:run ; @top
""",
    "stack": """\
stack ls_init    = {P}/nn/modules/module.py:1355:to ; {U}/model.py:52:__init__ ; {U}/train.py:80:main ; @top
stack ls_layer   = {P}/nn/modules/linear.py:125:forward ; @call ; {U}/model.py:60:forward ; @fwd
stack ls_loss    = {U}/model.py:62:forward ; @fwd
""",
    "grow": """\
stack gr_init    = {U}/train.py:40:main ; @top
stack gr_buf     = {U}/train.py:64:collate ; {U}/train.py:71:train_step ; @top
stack gr_tmp     = {U}/train.py:66:collate ; {U}/train.py:71:train_step ; @top
""",
    "ddp": """\
stack dp_init    = {P}/nn/modules/module.py:1341:convert ; {P}/nn/modules/module.py:942:_apply ; {P}/nn/modules/module.py:1355:to ; {U}/train.py:41:main ; @top
stack dp_mb      = {U}/train.py:66:train_step ; @loop
stack dp_fc1     = {P}/nn/modules/linear.py:125:forward ; @call ; {U}/encoder.py:44:forward ; @call ; {U}/train.py:67:train_step ; @loop
stack dp_fc2     = {P}/nn/modules/linear.py:125:forward ; @call ; {U}/encoder.py:46:forward ; @call ; {U}/train.py:67:train_step ; @loop
stack dp_loss    = {U}/train.py:68:train_step ; @loop
""",
    "eval": """\
stack ev_top     = {U}/train.py:90:main ; @top
stack ev_in      = {U}/train.py:71:evaluate ; @ev_top
stack ev_out     = {P}/nn/modules/linear.py:125:forward ; @call ; {U}/model.py:104:encode ; {U}/train.py:72:evaluate ; @ev_top
stack ev_score   = {U}/model.py:110:score ; {U}/train.py:72:evaluate ; @ev_top
stack ev_cat     = {U}/train.py:74:evaluate ; @ev_top
""",
}


def begin(g, header_extra=(), extra=()):
    g.stmt("era %s" % g.era)
    g.stmt("device 0")
    g.comment("")
    for line in STACKS.splitlines():
        g.stmt(line)
    for key in extra:
        for line in EXTRA_STACKS[key].format(U=USER, P=TORCH).splitlines():
            g.stmt(line)
    g.comment("")


def finding(kind, severity, stack, x, lo=0.75, hi=1.1, at_least=None, at_most=None):
    return {"kind": kind, "severity_at_least": severity, "stack_contains": stack,
            "bytes_at_least": int(at_least if at_least is not None else x * lo),
            "bytes_at_most": int(at_most if at_most is not None else -(-x * hi // 1))}


# --------------------------------------------------------------------------------------------
# scenarios


def run_loop(g, loop, steps):
    loop.build()
    for k in range(steps):
        loop.step(k)


def sc_clean(name, era="2.11", annotations=True):
    g = Gen(name, era, annotations, seed=11)
    begin(g)
    run_loop(g, Loop(g), 10)
    basis = ("ProfilerStep#N / Optimizer.* external_annotations" if g.annotations else
             "no external_annotations (iterations must be detected from the repeating pattern)")
    if era == "2.0":
        basis = "era 2.0 fields: no time_us, no annotations, block history instead of frames"
    desc = ("Clean steady-state training: 10 steps, Adam state created once at step 0, "
            "gradients freed by zero_grad(set_to_none=True) every step; %s." % basis)
    return g, desc, [], list(ALL_KINDS)


def sc_leak(name, era="2.11"):
    g = Gen(name, era, True, seed=12)
    begin(g, extra=["leak"])
    run_loop(g, Loop(g, leak=True), 10)
    x = g.live_tag_bytes("leak")
    sev = "high" if g.annotations else "warning"
    desc = ("Each step appends a detached GPU tensor to a Python list: train.py:58 "
            "`probs_history.append(logits.detach().softmax(-1))` (32 MiB per step, never freed): "
            "live bytes grow linearly, all from one stack.")
    if era == "2.0":
        desc += " Era 2.0 fields (no time_us, no annotations): iterations must be detected."
    return g, desc, [finding("leak", sev, "train.py:58", x)], \
        [k for k in KINDS if k not in ("leak",)]


def sc_kept_graph(name):
    g = Gen(name, "2.11", True, seed=13)
    begin(g, extra=["kept"])
    run_loop(g, Loop(g, kept_graph=True), 10)
    x = g.live_tag_bytes("act")
    desc = ("`loss.backward(retain_graph=True)` (train.py:55) plus `total_loss += loss` "
            "(train.py:58, no .item()): the graph referenced from total_loss keeps every step's "
            "saved forward activations (and its x/y batch) alive after backward and the optimizer "
            "step. Retained activations carry the forward stacks (model.py forward lines under "
            "train.py:53 `logits = model(x)`).")
    desc += (" Live bytes grow step over step without bound: a leak (issue 13: whatever the "
             "category), not activation retention (which is bounded to the next step).")
    return g, desc, [finding("leak", "high", "train.py:53", x, lo=0.5)], \
        ["activation_retention", "optimizer_state_bloat", "oom_fragmentation", "cache_bloat",
         "temporary_spike", "pending_free_retention", "device_imbalance", "incomplete_history"]


def sc_leak_history(name):
    g = Gen(name, "2.11", True, seed=19)
    begin(g, extra=["keep_out"])
    run_loop(g, Loop(g, keep_output=True), 10)
    x = g.live_tag_bytes("kept_out")
    assert x == 10 * SMALL_GPT.LOGITS
    desc = ("Each step stores the model output without detach: `history.append(logits)` "
            "(train.py:58) after `logits = model(x)` (train.py:53). backward() (no "
            "retain_graph) frees the saved activations, but the output tensor itself (33554432 "
            "bytes, allocated by lm_head under model.py:94 / train.py:53, a forward stack) "
            "survives every later step: live bytes grow by 32 MiB per step, without bound. A "
            "leak, although the surviving bytes were made by forward (category activation); not "
            "activation retention. bytes = what the leaking stack holds at the end (10 x "
            "33554432).")
    return g, desc, [finding("leak", "high", "train.py:53", x)], \
        [k for k in ALL_KINDS if k not in ("leak", "activation_checkpointing")]


def retention_drop(g, loop, names_of_step):
    """The fix activation retention checks, computed here independently of the analyzer: each
    named tensor of step k freed where step k's optimizer.step() begins (its backward is over)
    instead of where it was freed. Returns (drop of the requested peak, the peak with the fix)."""
    delta = [0] * (len(g.levels) + 1)
    for k in sorted(loop.opt_starts):
        start = loop.opt_starts[k]
        for name in names_of_step(k):
            size = g.live[name]["size"] if name in g.live else None
            at, freed = g.spans.get(name, (None, len(g.levels)))
            if size is None:
                size = g.levels[at] - (g.levels[at - 1] if at > 0 else 0)
            if freed > start:
                delta[start] -= size
                delta[freed] += size
    fixed, shift = [], 0
    for i, v in enumerate(g.levels):
        shift += delta[i]
        fixed.append(v + shift)
    return max(g.levels) - max(fixed), max(fixed)


def sc_hook(name):
    g = Gen(name, "2.11", True, seed=20)
    begin(g, extra=["hook"])
    loop = Loop(g, hook=True)
    run_loop(g, loop, 10)
    per_step = g.live_tag_bytes("hook")
    m = SMALL_GPT
    assert per_step == m.NBLK * (m.QKV + m.ACT + m.HIDDEN + m.ACT) + m.LOGITS
    sites = ["b%d.%s" % (b, x) for b in range(m.NBLK) for x in ("qkv", "proj", "fc1", "fc2")]
    drop, _ = retention_drop(g, loop, lambda k: ["s%d.hook.%s" % (k, x) for x in sites + ["head"]])
    assert drop < 16 << 20, drop
    g.marks.update(retained_per_step=per_step, retention_drop=drop)
    desc = ("A feature-extraction forward hook on every nn.Linear (train.py:35 `save_hook`: "
            "`acts[name] = out.detach().clone()`) keeps a clone of each Linear output (qkv, "
            "proj, fc1, fc2 of both blocks and lm_head: %d bytes per step) until the same "
            "module's hook runs in the NEXT step's forward and overwrites the dict entry. "
            "Bounded (live bytes after each step stay constant, no leak). The clones outlive "
            "their step's backward, but each is released in the next forward as its "
            "replacement is made, and the next step's peak comes later: freed where their "
            "backward ends, the requested peak drops by %d bytes, under activation retention's "
            "16 MiB minimum, so it must not fire (it did before issue 28 item 5, for 71303168 "
            "bytes it could not give back). The clones cost memory in the step that makes "
            "them; no finding names that yet." % (per_step, drop))
    return g, desc, [], list(ALL_KINDS)


def sc_kept_logits(name):
    g = Gen(name, "2.11", True, seed=23)
    begin(g)
    loop = Loop(g, keep_prev=True)
    run_loop(g, loop, 10)
    drop, fixed_peak = retention_drop(g, loop, lambda k: ["s%d.logits" % k])
    assert drop == SMALL_GPT.LOGITS, drop
    g.marks.update(retention_drop=drop, peak_with_fix=fixed_peak)
    desc = ("The training loop keeps each step's output: `logits = train_step(batch)` "
            "(train.py:86) holds the logits (33554432 bytes, made by lm_head under model.py:94 / "
            "train.py:53) after the step's backward and optimizer.step(), until the next "
            "train_step returns. From step 1 every peak holds two steps' logits. Freeing each "
            "step's logits where its backward ends (before optimizer.step()) lowers the peak "
            "requested bytes from %d to %d: activation retention of exactly %d bytes, at info "
            "(under the 256 MiB warning floor), naming the model's call site. Bounded: no leak."
            % (max(g.levels), fixed_peak, drop))
    return g, desc, [finding("activation_retention", "info", "train.py:53", drop, lo=1.0,
                             hi=1.0)], \
        [k for k in ALL_KINDS if k != "activation_retention"]


# the checkpointing scenario's model: 12 blocks, vocab 4096, d_model 1024, 32 heads,
# batch 8 x 1024 tokens
DEEP_GPT = Model(V=4096, D=1024, batch=8, seq=1024, heads=32, NBLK=12)


def block_saved_bytes(m):
    """Bytes one block saves for backward (what the Loop keeps: n1, qkv, probs, ctx, x_mid, n2,
    fc1, gelu, x_out and the two rstd)."""
    return 2 * m.RSTD + 5 * m.ACT + m.QKV + m.SCORES + 2 * m.HIDDEN


def sc_checkpoint(name):
    g = Gen(name, "2.11", True, seed=21)
    begin(g)
    m = DEEP_GPT
    run_loop(g, Loop(g, model=m), 3)
    act = g.peak["tags"].get("act", 0)
    share = act / g.peak["requested"]
    a_b = block_saved_bytes(m)
    # torch.utils.checkpoint around each block (model.py:92): a block saves only its input
    # (ACT) in forward and recomputes its activations one block at a time in backward
    estimate = m.NBLK * (a_b - m.ACT) - a_b
    g.marks.update(activations_at_peak=act, block_saved_bytes=a_b,
                   checkpoint_estimate_bytes=estimate)
    assert share >= 0.75 and act >= 2 * GIB, (share, act)
    desc = ("A deeper model on long sequences (12 blocks, vocab 4096, d_model 1024, 32 heads, "
            "batch 8 x "
            "1024 tokens, fp32, 3 steps): each block saves %d bytes for backward (the "
            "[8, 32, 1024, 1024] attention probs alone are 1073741824), so activations held "
            "for backward are %d bytes, %.1f %% of the %d-byte requested peak. Activation "
            "checkpointing of each block (`for blk in self.blocks: x = blk(x)`, model.py:92; "
            "`checkpoint(blk, x)`) would keep only the block inputs and recompute one block at "
            "a time in backward: the peak would drop by about N x (saved - input) - saved = %d "
            "bytes. bytes = that estimate (range 0.5 x up to every activation byte at the "
            "peak)." % (a_b, act, 100 * share, g.peak["requested"], estimate))
    return g, desc, [finding("activation_checkpointing", "warning", "model.py:92", estimate,
                             at_least=estimate // 2, at_most=act)], \
        [k for k in ALL_KINDS if k not in ("activation_checkpointing", "cache_bloat")]


def sc_forward_only(name):
    g = Gen(name, "2.11", True, seed=23)
    begin(g)
    m = DEEP_GPT
    run_loop(g, Loop(g, model=m, forward_only=True), 3)
    act = g.peak["tags"].get("act", 0)
    share = act / g.peak["requested"]
    assert share >= 0.75 and act >= 8 * GIB, (share, act)
    # Under no_grad a block holds at most its attention scores and probs (2 x 1 GiB) with a few
    # smaller tensors at once: the peak drops by the activations less about that.
    at_least = act - 3 * m.SCORES
    g.marks.update(activations_at_peak=act)
    desc = ("The deep model of checkpointing_opportunity (12 blocks, [8, 32, 1024, 1024] attention "
            "probs of 1073741824 bytes) run forward only with autograd on, 3 steps: "
            "`logits = model(x)` (train.py:53) and the loss, no backward, no optimizer (an "
            "evaluation or benchmark loop without torch.no_grad()). Autograd keeps every block's "
            "activations for a backward that never runs, %d bytes at the requested peak (%.1f %%), "
            "and frees them when the loss goes at the step's end. torch.inference_mode() at "
            "train.py:53 frees each intermediate once the next operator has used it: "
            "inference_with_grad must say so (bytes: at least the activations less 3 x 1 GiB of "
            "scores, at most the activations); activation checkpointing (the issue 28 false "
            "alarm: recompute for a backward that never runs) must not." % (act, 100 * share))
    return g, desc, [finding("inference_with_grad", "warning", "train.py:53", act,
                             at_least=at_least, at_most=act)], \
        [k for k in ALL_KINDS if k != "inference_with_grad"]


def sc_ring1(name):
    g = Gen(name, "2.11", True, seed=22)
    begin(g)
    g.stmt("max_entries 1")
    g.comment("(torch.cuda.memory._record_memory_history(max_entries=1): the ring buffer keeps "
              "only the newest entry)")
    run_loop(g, Loop(g), 3)
    g.marks["note"] = ("peak/final/iteration facts describe the recorded run, not what the "
                       "1-entry trace can show")
    desc = ("Three clean training steps recorded with `_record_memory_history(max_entries=1)`: "
            "the trace kept only its newest entry (the last free of step 2) while the segments "
            "hold the parameters and Adam state (%d live requested bytes). The file cannot "
            "explain its state (no allocation of any live block is in the trace): "
            "incomplete_history, and no other finding." % g.requested)
    return g, desc, [{"kind": "incomplete_history", "severity_at_least": "info"}], \
        [k for k in ALL_KINDS if k != "incomplete_history"]


def ring_size(n):
    """A count PyTorch's ring buffer leaves (the analyzer's rule, detect_history.cc ringSize)."""
    return n == 1 or (n >= 1000 and (n % 1000 == 0 or (n & (n - 1)) == 0))


def trimmed_clean_run(name, seed, keep_of, comment, note, desc, fix):
    """Ten clean steps whose trace keeps only its newest entries: keep_of(total entries, entry
    count when step 2 began) says how many; an incomplete_history at info whose fix says `fix`."""
    g = Gen(name, "2.11", True, seed=seed)
    begin(g)
    loop = Loop(g)
    loop.build()
    step2 = None
    for k in range(10):
        if k == 2:
            step2 = g.events()
        loop.step(k)
    total = g.events()
    keep = keep_of(total, step2)
    g.stmt("max_entries %d" % keep)
    g.comment(comment % {"total": total, "keep": keep})
    g.marks.update(recorded_entries=total, kept_entries=keep, note=note)
    return g, desc % {"total": total, "keep": keep}, \
        [{"kind": "incomplete_history", "severity_at_least": "info", "fix_contains": fix}], \
        [k for k in ALL_KINDS if k != "incomplete_history"]


def sc_ring_wrapped(name):
    def keep_of(total, _):
        assert total > 2000 and ring_size(2000)
        return 2000
    return trimmed_clean_run(
        name, 24, keep_of,
        "(torch.cuda.memory._record_memory_history(max_entries=2000): the ring buffer kept the "
        "newest %(keep)d of the run's %(total)d entries)",
        "peak/final/iteration facts describe the recorded run",
        "Ten clean training steps recorded with `_record_memory_history(max_entries=2000)`: the "
        "run made %(total)d entries, the ring buffer kept the newest %(keep)d, so the trace begins "
        "inside a step, with frees of blocks allocated before its first entry. The peak is "
        "inside the trace. incomplete_history at info, whose fix is to raise max_entries (the "
        "count is a ring buffer's size); no other finding.",
        "raise max_entries")


def sc_late_start(name):
    def keep_of(total, step2):
        # _record_memory_history called from a callback in step 2's forward, 60 entries in
        keep = total - (step2 + 60)
        while ring_size(keep):
            keep -= 1
        return keep
    return trimmed_clean_run(
        name, 25, keep_of,
        "(the recording began late, in step 2's forward: the trace holds the %(keep)d entries "
        "made after it)",
        "peak/final/iteration facts describe the whole run",
        "Ten clean training steps whose recording began late: `_record_memory_history()` was "
        "called from a callback in step 2's forward, so the trace holds the %(keep)d entries made "
        "after it (not a ring buffer's size), beginning with frees of activations allocated "
        "before. incomplete_history at info, whose fix is to start recording before the model is "
        "built (not to raise max_entries); no other finding.",
        "before the model is built")


def sc_dup_opt(name):
    g = Gen(name, "2.11", True, seed=14)
    begin(g, extra=["dup"])
    run_loop(g, Loop(g, dup_opt=True), 10)
    state = g.live_tag_bytes("optstate")
    assert state == 4 * PARAM_BYTES
    desc = ("Two Adam optimizers over the same parameters: `optimizer.step()` (train.py:56) and "
            "`aux_optimizer.step()` (train.py:57, built with model.parameters() instead of the "
            "head's): optimizer state is 4x the parameter bytes instead of 2x. bytes = the extra "
            "state (state - 2 x parameters).")
    return g, desc, [finding("optimizer_state_bloat", "high", "train.py:57",
                             state - 2 * PARAM_BYTES)], \
        [k for k in KINDS if k != "optimizer_state_bloat"]


def sc_frag_oom(name):
    g = Gen(name, "2.11", True, seed=15)
    begin(g, extra=["eval"])
    loop = Loop(g)
    run_loop(g, loop, 4)
    g.step = -1
    g.comment("")
    g.comment("=== evaluate() (train.py:90): variable-length batches, every encoding kept in `outs` ===")
    g.adv(30000, 40000)
    rng = random.Random(1505)
    kept = []
    n_items = 64
    for i in range(n_items):
        L = rng.randint(2100, 6000)       # tokens in this validation batch
        g.adv(30, 90)
        g.alloc("e%d.in" % i, L * 8, "ev_in", "tmp", note="batch.cuda(): [%d] int64" % L)
        g.adv(60, 200)
        g.alloc("e%d.out" % i, L * 256 * F32, "ev_out", "eval_out",
                note="model.encode(batch): [%d, 256] fp32, kept in outs" % L)
        g.adv(20, 50)
        g.alloc("e%d.score" % i, 4 * rng.randint(64, 1024), "ev_score", "eval_out",
                note="scores.append(model.score(...)): small, kept")
        g.adv(5, 10)
        g.free("e%d.in" % i)
    g.comment("")
    g.comment("outs = [o for o, s in zip(outs, scores) if s.max() > thr] (train.py:73): the "
              "rejected outputs are freed, leaving holes between the kept ones")
    for i in range(n_items):
        if rng.randint(0, 99) < 55:
            g.adv(4, 9)
            g.free("e%d.out" % i)
        else:
            kept.append("e%d.out" % i)
    request = sf.round_size(sum(g.live[n]["size"] for n in kept))
    g.comment("")
    g.comment("full = torch.cat(outs) (train.py:74) needs %d bytes: no cached block fits and "
              "cudaMalloc fails;" % request)
    g.comment("the retry path releases the fully free cached segments, cudaMalloc fails again")
    g.adv(40, 80)
    assert not g.fits(request, 0)
    released = g.release_cached()
    free_large = [b.size for b, _ in g.free_blocks("large", 0)]
    total_free = sum(free_large)
    largest = max(free_large)
    device_free = 18 * MIB + 393216
    assert largest < request <= total_free, (largest, request, total_free)
    assert device_free < seg_size_for(request)
    g.adv(30, 60)
    g.ev("oom %d device_free=%d stack=ev_cat" % (request, device_free))
    g.marks.update(oom_request=request, oom_cached_free=total_free, oom_largest_free=largest,
                   oom_released=released, oom_device_free=device_free)
    desc = ("4 clean training steps, then evaluate() encodes 64 validation batches of random "
            "length (2-6 MiB outputs, model.py:104 under train.py:72, each with a small score "
            "tensor) and keeps them; a filter (train.py:73) then frees the rejected 55%%, leaving "
            "holes between the kept outputs in the cached segments. torch.cat(outs) "
            "(train.py:74) asks for %d bytes: the large pool holds %d free bytes in cached "
            "segments, but the largest free block is %d bytes, and cudaMemGetInfo reports only "
            "%d bytes free (after the retry path released %d bytes of fully free segments): OOM "
            "by fragmentation. bytes = the failed request (at least) up to the cached free bytes."
            % (request, total_free, largest, device_free, released))
    return g, desc, [finding("oom_fragmentation", "high", "train.py:74", request,
                             at_least=request, at_most=total_free)], \
        ["optimizer_state_bloat", "pending_free_retention", "activation_retention"]


def sc_cache_bloat(name):
    g = Gen(name, "2.11", True, seed=16)
    begin(g, extra=["bloat"])
    run_loop(g, Loop(g, bloat=True), 10)
    active_end = g.requested
    steady_peak = max(v for k, v in g.step_max.items() if k >= 2)
    x = g.reserved - active_end
    g.marks.update(steady_peak=steady_peak, final_reserved=g.reserved, final_active=active_end)
    desc = ("At step 0 a one-off check runs lm_head over a 32768-token validation set "
            "(train.py:60-62; the 1 GiB `ref_logits` at train.py:61 and its 64 MiB input): they "
            "are freed at once, but the cached segments stay reserved for the rest of the run. "
            "At the end %d bytes are reserved, %d active; the per-step peak after step 1 is %d. "
            "bytes = reserved - active at the end." % (g.reserved, active_end, steady_peak))
    return g, desc, [finding("cache_bloat", "warning", "train.py:61", x)], \
        ["leak", "activation_retention", "optimizer_state_bloat", "oom_fragmentation",
         "pending_free_retention"]


def sc_spike(name):
    g = Gen(name, "2.11", True, seed=17)
    begin(g, extra=["spike"])
    run_loop(g, Loop(g, spike=True), 10)
    desc = ("From step 1 on (the memory bank is empty at step 0), block 1's attention also "
            "attends over a 12288-entry memory bank: model.py:44 "
            "`attn = q @ self.mem_k.transpose(-2, -1)` materializes a [8, 8, 128, 12288] fp32 "
            "tensor (%d bytes) that lives only until the top-k on model.py:45, every step. It "
            "sets every step's peak; its cached segment is reused by every step (reserved stays "
            "at the peak, so a dump between steps shows it cached but unused). bytes = the "
            "temporary's size. The cache that holds it is the working set of every step, so keeping "
            "it at the end is no cache bloat." % SPIKE_BYTES)
    return g, desc, [finding("temporary_spike", "warning", "model.py:44", SPIKE_BYTES)], \
        ["leak", "activation_retention", "optimizer_state_bloat", "oom_fragmentation",
         "pending_free_retention", "cache_bloat"]


SWAP_STATE_BYTES = 448 * MIB
SWAP_STEPS = 40


def sc_plateau(name):
    g = Gen(name, "2.11", True, seed=20)
    g.model_text = False
    begin(g, extra=["swap"])
    g.alloc("state0", SWAP_STATE_BYTES, "sw_init", "state")
    for k in range(SWAP_STEPS):
        g.step = k
        g.annotate("ProfilerStep#%d" % k, "START")
        g.adv(200, 400)
        g.alloc("coef%d" % k, 4 * MIB, "sw_tmp", "tmp")
        g.adv(100, 200)
        g.alloc("state%d" % (k + 1), SWAP_STATE_BYTES, "sw_step", "state",
                note="new = f(old)" if k == 0 else None)
        g.adv(5000, 9000)
        g.free("coef%d" % k)
        g.free("state%d" % k, note="old freed" if k == 0 else None)
        g.step_end[k] = g.requested
        g.annotate("ProfilerStep#%d" % k, "END")
    desc = ("A state-space loop that swaps two state buffers: every step computes the new %d-byte "
            "state from the old one (simulate.py:36, `new = f(old)`), then frees the old one; %d "
            "steps. Two buffers must exist at once, so the requested peak (two states and a 4 MiB "
            "coefficient) is a level the run holds for about half of its time, not a spike: "
            "nothing can go, no finding may fire." % (SWAP_STATE_BYTES, SWAP_STEPS))
    return g, desc, [], list(ALL_KINDS)


STACK_LAYERS = 24
STACK_OUT = 8192 * 1024 * F32      # 32 MiB: one layer's [8192 x 1024] fp32 output
STACK_WEIGHT = 1024 * 1024 * F32   # 4 MiB: one Linear(1024, 1024, bias=False)


def stack_segment_estimate():
    """Checkpointing the 24 layers in segments of k keeps ceil(24 / k) inputs and recomputes one
    segment in backward; least at k = 4 (6 + 4 outputs): the held outputs less that."""
    best = min(-(-STACK_LAYERS // k) * STACK_OUT + k * STACK_OUT
               for k in range(1, STACK_LAYERS + 1))
    return STACK_LAYERS * STACK_OUT - best


def sc_layer_stack(name):
    g = Gen(name, "2.11", True, seed=24)
    g.model_text = False
    begin(g, extra=["stack"])
    for i in range(STACK_LAYERS):
        g.adv(150, 400)
        g.alloc("w%d" % i, STACK_WEIGHT, "ls_init", "param")
    for k in range(3):
        g.step = k
        g.annotate("ProfilerStep#%d" % k, "START")
        g.adv(200, 400)
        g.alloc("x", STACK_OUT, "batch_x", "data", note="x = batch.to('cuda')" if k == 0 else None)
        for i in range(STACK_LAYERS):
            g.adv(20, 60)
            g.alloc("out%d" % i, STACK_OUT, "ls_layer", "act",
                    note="for layer in self.layers: x = layer(x); each Linear saves its input "
                    "(the previous output)" if k == 0 and i == 0 else None)
        g.adv(20, 60)
        g.alloc("loss", 4, "ls_loss", "tmp")
        g.adv(250, 400)
        for i in reversed(range(STACK_LAYERS)):
            g.adv(40, 120)
            g.alloc("gw%d" % i, STACK_WEIGHT, "bwd", "grad")
            g.adv(20, 60)
            g.alloc("gx%d" % i, STACK_OUT, "bwd", "tmp")
            if i + 1 < STACK_LAYERS:
                g.adv(3, 8)
                g.free("gx%d" % (i + 1))
            g.adv(3, 8)
            g.free("out%d" % i)
        g.adv(3, 8)
        g.free("gx0")
        g.adv(30, 60)
        g.annotate("Optimizer.step#SGD.step", "START")
        g.adv(200, 400)
        g.annotate("Optimizer.step#SGD.step", "END")
        g.annotate("Optimizer.zero_grad#SGD.zero_grad", "START")
        for i in range(STACK_LAYERS):
            g.adv(3, 6)
            g.free("gw%d" % i)
        g.annotate("Optimizer.zero_grad#SGD.zero_grad", "END")
        g.adv(3, 8)
        g.free("loss")
        g.adv(3, 8)
        g.free("x")
        g.step_end[k] = g.requested
        g.annotate("ProfilerStep#%d" % k, "END")
    act = g.peak["tags"].get("act", 0)
    est = stack_segment_estimate()
    g.marks.update(activations_at_peak=act, segment_estimate_bytes=est)
    # the peak is in backward, just after the last layer's output was freed
    assert act >= (STACK_LAYERS - 1) * STACK_OUT and act * 2 >= g.peak["requested"], (act, g.peak)
    desc = ("A stack of %d bias-free Linear(1024, 1024) layers (model.py:60, `for layer in "
            "self.layers: x = layer(x)`) trained with SGD, 3 steps: each layer keeps only its "
            "%d-byte output, the next layer's saved input, so the %d bytes of activations at the "
            "peak (early in backward, %.1f %% of it) cannot be lowered by checkpointing each layer on its own (it "
            "keeps every input, which is all a layer holds). checkpoint_sequential in segments "
            "of about sqrt(24) layers (4: 6 segment inputs kept, one segment recomputed in "
            "backward) lowers the peak by about %d bytes. bytes = that estimate (0.5 x it up to "
            "every activation byte: the last layers' outputs, freed soon after they are made, "
            "count as temporaries)." %
            (STACK_LAYERS, STACK_OUT, act, 100.0 * act / g.peak["requested"], est))
    return g, desc, [finding("activation_checkpointing", "warning", "model.py:60", est,
                             at_least=est // 2, at_most=act)], \
        [k for k in ALL_KINDS if k != "activation_checkpointing"]


GROW_STEPS = 12
GROW_BUFFERS = 6


# replicas_uneven: two DDP ranks of one encoder whose length-bucketing sampler gives them different
# numbers of micro-batches of the same shape: every tensor is the same size on both ranks
RP_MICRO = [8, 45]                 # micro-batches per step on rank 0 and rank 1
RP_X = 2048 * 1024 * F32           # 8 MiB: one micro-batch's [2048 x 1024] fp32 input
RP_H = 2048 * 4096 * F32           # 32 MiB: its fc1 output (ReLU in place: saved for backward)
RP_OUT = 2048 * 1024 * F32         # 8 MiB: fc2's output, used by the loss only
RP_W = 4096 * 1024 * F32           # 16 MiB: fc1.weight and fc2.weight
RP_STEPS = 4


def replica_rank(g, micro):
    """One rank: the encoder's weights, then RP_STEPS steps of `loss = sum over micro-batches`
    (train.py:66-68: each micro-batch's graph is kept until the one backward), backward,
    Adam, zero_grad."""
    params = [("fc1.weight", RP_W), ("fc2.weight", RP_W)]
    for n, size in params:
        g.adv(150, 400)
        g.alloc(n, size, "dp_init", "param")
    for k in range(RP_STEPS):
        g.step = k
        g.comment("")
        g.comment("=== step %d: %d micro-batches ===" % (k, micro))
        g.adv(18000, 24000)
        g.annotate("ProfilerStep#%d" % k, "START")
        for j in range(micro):
            g.adv(30, 80)
            g.alloc("x%d" % j, RP_X, "dp_mb", "act",
                    note="x = next(micro_batches).to('cuda')" if k == 0 and j == 0 else None)
            g.adv(30, 80)
            g.alloc("h%d" % j, RP_H, "dp_fc1", "act",
                    note="h = relu_(fc1(x)): saved for backward" if k == 0 and j == 0 else None)
            g.adv(30, 80)
            g.alloc("out%d" % j, RP_OUT, "dp_fc2", "tmp")
            g.adv(20, 40)
            g.alloc("loss%d" % j, 512, "dp_loss", "act")
            g.adv(3, 8)
            g.free("out%d" % j)
            if j > 0:
                g.adv(3, 8)
                g.free("loss%d" % (j - 1))
        g.comment("loss.backward(): one backward through every micro-batch's graph")
        g.adv(250, 400)
        for j in reversed(range(micro)):
            g.adv(40, 120)
            g.alloc("g_out%d" % j, RP_OUT, "bwd", "tmp")
            if j == micro - 1:
                g.adv(20, 40)
                g.alloc("fc2.weight.grad", RP_W, "bwd", "grad")
            g.adv(40, 120)
            g.alloc("g_h%d" % j, RP_H, "bwd", "tmp")
            g.adv(3, 8)
            g.free("g_out%d" % j)
            if j == micro - 1:
                g.adv(20, 40)
                g.alloc("fc1.weight.grad", RP_W, "bwd", "grad")
            g.adv(20, 60)
            g.free("g_h%d" % j)
            g.adv(3, 8)
            g.free("h%d" % j)
            g.adv(3, 8)
            g.free("x%d" % j)
        g.adv(3, 8)
        g.free("loss%d" % (micro - 1))
        g.adv(60, 120)
        g.annotate("Optimizer.step#Adam.step", "START")
        for n, size in params:
            if k == 0:
                g.adv(15, 30)
                g.alloc(n + ".exp_avg", size, "adam_exp_avg", "optstate")
                g.adv(15, 30)
                g.alloc(n + ".exp_avg_sq", size, "adam_exp_avg_sq", "optstate")
            g.adv(10, 25)
            g.alloc(n + ".denom", size, "adam_denom", "tmp")
            g.adv(10, 25)
            g.free(n + ".denom")
        g.annotate("Optimizer.step#Adam.step", "END")
        g.adv(30, 60)
        g.annotate("Optimizer.zero_grad#Adam.zero_grad", "START")
        for n, _ in params:
            g.adv(3, 6)
            g.free(n + ".grad")
        g.annotate("Optimizer.zero_grad#Adam.zero_grad", "END")
        g.adv(10, 30)
        g.annotate("ProfilerStep#%d" % k, "END")
        g.step_end[k] = g.requested


def sc_replicas(name):
    ranks = []
    for r, micro in enumerate(RP_MICRO):
        g = Gen(name, "2.11", True, seed=40 + r)
        g.model_text = False
        begin(g, extra=["ddp"])
        preamble = len(g.lines)
        g.next_seg = SEG_BASE + r * (1 << 40)
        replica_rank(g, micro)
        ranks.append((g, preamble))
    g0 = ranks[0][0]
    for r, (g, preamble) in enumerate(ranks[1:], start=1):
        g0.lines += ["", "# " + "=" * 30 + " rank %d (cuda:%d) " % (r, r) + "=" * 30,
                     "device %d" % r] + g.lines[preamble:]
    g0.extra_devices = [g for g, _ in ranks[1:]]
    g1 = ranks[1][0]
    p0, p1 = g0.peak["requested"], g1.peak["requested"]
    g0.marks.update(rank_peaks_requested=[p0, p1], rank_micro_batches=RP_MICRO,
                    peak_ratio=round(p1 / p0, 2))
    assert p1 >= 1.5 * p0 and p1 - p0 >= GIB, (p0, p1)
    desc = ("Two DistributedDataParallel ranks of one 2-layer encoder (fc1 1024->4096, ReLU in "
            "place, fc2 4096->1024, fp32, Adam): each step sums the loss over its micro-batches "
            "(train.py:66-68) and runs one backward, so every micro-batch's input (8 MiB) and fc1 "
            "output (32 MiB, encoder.py:44) stay alive until then. A length-bucketing sampler "
            "gives rank 0 %d micro-batches per step and rank 1 %d, all of the same shape: no "
            "tensor is larger on either rank (the largest is 32 MiB), yet the requested peaks "
            "are %d and %d bytes (%.2fx). device_imbalance must say so from the peaks (bytes: "
            "the difference of encoder.py:44's bytes live at the two peaks), at warning (no "
            "OOM), naming encoder.py:44." % (RP_MICRO[0], RP_MICRO[1], p0, p1, p1 / p0))
    # the line that differs most: encoder.py:44 (fc1's outputs), all live at each rank's peak
    line_delta = (RP_MICRO[1] - RP_MICRO[0]) * RP_H
    return g0, desc, [dict(finding("device_imbalance", "warning", "encoder.py:44", line_delta,
                                   lo=1.0, hi=1.0), device=1)], \
        [k for k in ALL_KINDS if k not in ("device_imbalance", "activation_checkpointing")]


def grow_buffer_bytes(k):
    return 24 * MIB + k * 8 * MIB


def sc_growing(name):
    g = Gen(name, "2.11", True, seed=21)
    g.model_text = False
    begin(g, extra=["grow"])
    g.alloc("weights", 64 * MIB, "gr_init", "param")
    for k in range(GROW_STEPS):
        g.step = k
        g.annotate("ProfilerStep#%d" % k, "START")
        for j in range(GROW_BUFFERS):
            g.adv(100, 300)
            g.alloc("s%d.buf%d" % (k, j), grow_buffer_bytes(k), "gr_buf", "tmp",
                    note="each step's buffers are longer than the last's" if k == 1 and j == 0
                    else None)
            for t in range(4):
                g.adv(20, 60)
                g.alloc("s%d.tmp%d.%d" % (k, j, t), 256 * KIB, "gr_tmp", "tmp")
                g.adv(20, 60)
                g.free("s%d.tmp%d.%d" % (k, j, t))
        for j in range(GROW_BUFFERS):
            g.adv(50, 100)
            g.free("s%d.buf%d" % (k, j))
        g.step_end[k] = g.requested
        g.annotate("ProfilerStep#%d" % k, "END")
    peak_active = 64 * MIB + GROW_BUFFERS * grow_buffer_bytes(GROW_STEPS - 1)
    g.marks.update(peak_active=peak_active)
    desc = ("Batches of growing length: every step pads its %d buffers (train.py:64 collate) to "
            "its longest sequence, 8 MiB more per buffer than the step before (24 MiB at step 0, "
            "%d at step %d), and frees them at its end. No freed block fits the next, larger "
            "requests, so every step reserves new segments: reserved ends at %d bytes while at "
            "most %d are in use. With expandable_segments:True the segments grow in place and "
            "the freed pages are reused: the allocator_setting finding must say so, checked by "
            "replay. bytes = recorded peak reserved - the replay's." %
            (GROW_BUFFERS, grow_buffer_bytes(GROW_STEPS - 1), GROW_STEPS - 1, g.reserved,
             peak_active))
    return g, desc, [finding("allocator_setting", "warning", "train.py:64",
                             g.reserved - peak_active, lo=0.8, hi=1.0)], \
        ["leak", "activation_retention", "optimizer_state_bloat", "oom_fragmentation",
         "cache_bloat", "temporary_spike", "pending_free_retention"]


def sc_pending(name):
    g = Gen(name, "2.11", True, seed=18)
    begin(g, extra=["prefetch"])
    run_loop(g, Loop(g, prefetch=True), 10)
    pend = g.peak["pending"]
    desc = ("A prefetcher copies each batch (input ids, targets and [1024 x 8192] fp32 teacher "
            "logits, 32 MiB) on a side stream (stream %d, train.py:31) and the loop calls "
            "record_stream on the compute stream. With no host sync per step, each batch's free "
            "is requested at the end of its step but completes only %d steps later: %d bytes "
            "are active_pending_free at the active-bytes peak. bytes = pending-free bytes at "
            "the peak." % (SIDE_STREAM, PREFETCH_LAG, pend))
    return g, desc, [finding("pending_free_retention", "warning", "train.py:31", pend)], \
        ["leak", "activation_retention", "optimizer_state_bloat", "oom_fragmentation",
         "cache_bloat", "temporary_spike"]


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


SCENARIOS = [
    ("clean_adam", lambda n: sc_clean(n)),
    ("clean_no_annotations", lambda n: sc_clean(n, annotations=False)),
    ("clean_era20", lambda n: sc_clean(n, era="2.0")),
    ("leak_list_append", lambda n: sc_leak(n)),
    ("leak_list_append_era20", lambda n: sc_leak(n, era="2.0")),
    ("kept_loss_graph", sc_kept_graph),
    ("duplicated_optimizer", sc_dup_opt),
    ("fragmentation_oom", sc_frag_oom),
    ("cache_bloat", sc_cache_bloat),
    ("temporary_spike", sc_spike),
    ("pending_free_cross_stream", sc_pending),
    ("leak_history_append", sc_leak_history),
    ("activation_retention_hook", sc_hook),
    ("retention_kept_logits", sc_kept_logits),
    ("checkpointing_opportunity", sc_checkpoint),
    ("forward_only_grad", sc_forward_only),
    ("layer_stack", sc_layer_stack),
    ("ring_of_1", sc_ring1),
    ("ring_wrapped", sc_ring_wrapped),
    ("late_start", sc_late_start),
    ("plateau_swap", sc_plateau),
    ("growing_batches", sc_growing),
    ("replicas_uneven", sc_replicas),
]


def forward_made_bytes(tags):
    """Bytes made by forward and alive: saved for backward ("act"), plus forward outputs kept
    past their step ("kept_out", "hook"); a detector cannot tell them apart by stack."""
    return sum(tags.get(t, 0) for t in ("act", "kept_out", "hook", "kept_prev"))


def build_one(name, fn, out_dir):
    g, desc, findings, must_not = fn(name)
    share = forward_made_bytes(g.peak["tags"]) / g.peak["requested"]
    expected_kinds = {f["kind"] for f in findings}
    for k in NEW_KINDS:
        # one device, a complete history: neither job findings nor an incomplete history; the
        # checkpointing advice only where activations hold less than half of the peak
        if k in expected_kinds or k in must_not:
            continue
        if k != "activation_checkpointing" or share < 0.5:
            must_not = must_not + [k]
    header = [
        "%s.fixture - generated by tools/make_scenarios.py; do not edit (regenerate instead)."
        % name,
        "Compile: python3 tools/snapshot_fixture.py snapshots/scenarios/%s.fixture -o %s.pickle"
        % (name, name),
        "",
    ] + wrap(desc, 96) + ([] if not g.model_text else [
        "",
        "Model: vocab 8192, d_model 512, 2 blocks (RMSNorm, fused qkv, 8 heads, GELU MLP 512->2048"
        "->512),",
        "untied embedding and lm_head, no biases, batch 8 x 128 tokens, fp32; parameters %d bytes."
        % PARAM_BYTES,
        "Adam(foreach=False): exp_avg/exp_avg_sq created at the first step (train.py:56), one",
        "denom temporary pair per parameter per step; zero_grad(set_to_none=True) frees the",
        "gradients every step (backward allocates them again). Backward allocations carry the",
        "loss.backward() call site (train.py:55) as their stack.",
    ])
    text = g.fixture_text(header)
    obj = sf.compile_fixture(name + ".fixture", text)
    data = pickle.dumps(obj, protocol=4)
    events = sum(len(t) for t in obj["device_traces"])
    facts = {
        "era": g.era,
        "external_annotations": len(obj.get("external_annotations", [])),
        "events": events,
        "iterations": len(g.step_end),
        "parameter_bytes": PARAM_BYTES,
        "peak_requested_bytes": g.peak["requested"],
        "peak_event": g.peak["event"],
        "peak_reserved_bytes": g.peak_reserved,
        "final_requested_bytes": g.requested,
        "final_reserved_bytes": g.reserved,
        "pending_at_peak_bytes": g.peak["pending"],
        "requested_after_each_iteration": [g.step_end[k] for k in sorted(g.step_end)],
        "activation_bytes_at_peak": g.peak["tags"].get("act", 0),
        "activation_share_at_peak": round(g.peak["tags"].get("act", 0) / g.peak["requested"], 4),
        "forward_made_bytes_at_peak": forward_made_bytes(g.peak["tags"]),
        "forward_made_share_at_peak": round(
            forward_made_bytes(g.peak["tags"]) / g.peak["requested"], 4),
    }
    facts.update(g.marks)
    expected = {"scenario": name, "description": desc, "findings": findings,
                "must_not_fire": must_not, "facts": facts}
    if g.extra_devices:
        # several devices: each device's own figures (the facts above are device 0's)
        expected["device_facts"] = {
            str(d): {"events": sum(1 for _ in obj["device_traces"][d]),
                     "peak_requested_bytes": x.peak["requested"],
                     "peak_reserved_bytes": x.peak_reserved,
                     "final_requested_bytes": x.requested, "final_reserved_bytes": x.reserved,
                     "iterations": len(x.step_end)}
            for d, x in enumerate([g] + g.extra_devices)}
    with open(os.path.join(out_dir, name + ".fixture"), "w", encoding="utf-8") as f:
        f.write(text)
    with open(os.path.join(out_dir, name + ".pickle"), "wb") as f:
        f.write(data)
    with open(os.path.join(out_dir, name + ".expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, indent=2)
        f.write("\n")
    return name, events, len(data), facts


def wrap(text, width):
    out, line = [], ""
    for w in text.split():
        if line and len(line) + 1 + len(w) > width:
            out.append(line)
            line = w
        else:
            line = (line + " " + w) if line else w
    if line:
        out.append(line)
    return out


def generate(out_dir, quiet=False):
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for name, fn in SCENARIOS:
        rows.append(build_one(name, fn, out_dir))
    rows.append(build_dp(out_dir))
    if not quiet:
        for name, events, nbytes, facts in rows:
            print("%-28s %5d events %7d bytes  peak requested %10d  peak reserved %10d"
                  % (name, events, nbytes, facts["peak_requested_bytes"],
                     facts["peak_reserved_bytes"]))
    return rows


def generated_files():
    exts = (".fixture", ".pickle", ".expected.json")
    return sorted([n + ext for n, _ in SCENARIOS for ext in exts]
                  + [DP_NAME + ext for ext in (".txt", ".pickle", ".expected.json")])


def check(out_dir):
    tmp = tempfile.mkdtemp(prefix="scenarios-")
    try:
        generate(tmp, quiet=True)
        bad = []
        for fn in generated_files():
            mine = os.path.join(out_dir, fn)
            if not os.path.exists(mine):
                bad.append("%s: missing (run tools/make_scenarios.py --out %s)" % (mine, out_dir))
            elif not filecmp.cmp(mine, os.path.join(tmp, fn), shallow=False):
                bad.append("%s: differs from a fresh generation" % mine)
        known = set(generated_files()) | {"README.md"}
        for fn in sorted(os.listdir(out_dir)) if os.path.isdir(out_dir) else []:
            if fn not in known:
                bad.append("%s: not produced by the generator" % os.path.join(out_dir, fn))
        for b in bad:
            print("make_scenarios --check: " + b, file=sys.stderr)
        if not bad:
            print("make_scenarios --check: %d files up to date in %s"
                  % (len(generated_files()), out_dir))
        return 1 if bad else 0
    finally:
        shutil.rmtree(tmp)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_out = os.path.join(os.path.dirname(HERE), "snapshots", "scenarios")
    ap.add_argument("--out", default=default_out, help="output folder (default %(default)s)")
    ap.add_argument("--check", action="store_true",
                    help="regenerate into a temporary folder and compare with --out")
    args = ap.parse_args(argv)
    if args.check:
        return check(args.out)
    generate(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
