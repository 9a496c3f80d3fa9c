"""The scenario corpus's building blocks (tools/make_scenarios.py): the model's sizes and stacks,
the segment-size rule, the event generator (Gen) and the training loop (Loop) every scenario
drives, and the expected-findings helpers. Python 3 standard library only."""
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
