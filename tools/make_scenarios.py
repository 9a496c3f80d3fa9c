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
.fixture; see dp_job / build_dp in tools/scenario_dp.py (the loop machinery is in
tools/scenario_base.py).

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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scenario_base import *  # noqa: E402,F401,F403 (constants, Gen, Loop, helpers)
from scenario_base import sf  # noqa: E402,F401
from scenario_dp import DP_NAME, build_dp, sc_dp  # noqa: E402,F401

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
    # What chunking model.py:44 gives: the peak of the same run without the temporary (the
    # finding promises that drop, not the temporary's size: the step's next highest moment holds
    # much of the rest).
    without = Gen(name + "_without", "2.11", True, seed=17)
    begin(without, extra=["spike"])
    run_loop(without, Loop(without, spike=False), 10)
    drop = max(g.step_max.values()) - max(without.step_max.values())
    desc = ("From step 1 on (the memory bank is empty at step 0), block 1's attention also "
            "attends over a 12288-entry memory bank: model.py:44 "
            "`attn = q @ self.mem_k.transpose(-2, -1)` materializes a [8, 8, 128, 12288] fp32 "
            "tensor (%d bytes) that lives only until the top-k on model.py:45, every step. It "
            "sets every step's peak; its cached segment is reused by every step (reserved stays "
            "at the peak, so a dump between steps shows it cached but unused). bytes = how much "
            "lower the run's requested peak is without it (%d: the same run generated without the "
            "temporary). The cache that holds it is the working set of every step, so keeping "
            "it at the end is no cache bloat." % (SPIKE_BYTES, drop))
    return g, desc, [finding("temporary_spike", "warning", "model.py:44", drop)], \
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
