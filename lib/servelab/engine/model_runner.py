"""The model runner: turns a scheduled step into one forward pass over a paged cache.

The scheduler's plan is a list of (sequence, how many new tokens). The runner
flattens it into one **ragged batch**: every scheduled token of every sequence,
one after another, each with its explicit position and the pool slot its K/V
goes to. Decode rows (one token each) come first, sorted by context length,
then the longer chunks:

    input_ids   [d | d | t0 t1 t2 t3 | c0 c1]   (two decodes, a prompt, a chunk)
    positions   [9 | 57| 0  1  2  3  | 32 33]
    slot_map    where each row's K/V is written in the pool

Matmuls (projections, MLP) see one [T, hidden] matrix regardless of who the rows
belong to; only attention needs to know. The runner does not compute the layers
itself: it builds a :class:`PagedStepContext` (block tables, slot mapping, the
pool) once per step and calls the model's own forward, whose attention layers
read their keys and values through it. Logits are computed only for the rows
that need them: the last row of each sequence that samples (a chunk in the
middle of a prompt samples nothing), or the last ``num_logits`` rows when the
plan asks for several (speculative decoding scores draft tokens that way).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from servelab.attention import decode_attention
from servelab.engine.scheduler import SchedulerOutput
from servelab.model import _STEP_CONTEXTS
from servelab.paged import blocks_for, group_decode_rows

__all__ = ["StepInput", "prepare_step", "PagedStepContext", "ModelRunner", "can_compile"]


@dataclass
class StepInput:
    """One step's ragged batch, in row order (decode rows first), as plain lists.

    Per-sequence lists (``query_lens``, ``context_lens``, ``block_tables``) follow
    the row order. ``sample_rows`` are the rows that get logits, in the plan's
    order (each scheduled sequence's ``num_logits`` trailing rows), so logits
    row ``i`` belongs to the ``i``-th such row of the plan.
    """

    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    query_lens: list[int]
    context_lens: list[int]
    block_tables: list[list[int]]
    sample_rows: list[int]
    num_decode_rows: int = 0  # leading rows that are single-token sequences
    logits_per_seq: list[int] = field(default_factory=list)  # plan order: rows of logits each

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)


def prepare_step(out: SchedulerOutput) -> StepInput:
    """Flatten the scheduler's plan into a ragged batch (no tensors yet).

    THE step preparation: the continuous engine and the static baselines both use it.
    A scheduled item needs ``.seq`` (with ``token_ids`` and ``block_table``),
    ``.start``, ``.num_new_tokens`` and ``.num_logits``.
    """
    items = list(out.scheduled)
    decodes = sorted((s for s in items if s.num_new_tokens == 1), key=lambda s: s.start)
    chunks = [s for s in items if s.num_new_tokens != 1]
    step = StepInput([], [], [], [], [], [], [], num_decode_rows=len(decodes))
    last_row = {}
    for s in decodes + chunks:
        seq, start, n = s.seq, s.start, s.num_new_tokens
        end = start + n
        step.input_ids.extend(seq.token_ids[start:end])
        step.positions.extend(range(start, end))
        step.slot_mapping.extend(seq.block_table.slots(start, end))
        step.query_lens.append(n)
        step.context_lens.append(end)
        step.block_tables.append(list(seq.block_table.block_ids))
        last_row[id(s)] = len(step.input_ids)
    for s in items:
        k = s.num_logits
        if k > s.num_new_tokens:
            raise ValueError(f"num_logits={k} but only {s.num_new_tokens} rows are computed for "
                             f"{getattr(s.seq, 'request_id', s.seq)}")
        step.logits_per_seq.append(k)
        end = last_row[id(s)]
        step.sample_rows.extend(range(end - k, end))
    return step


class PagedStepContext:
    """What the model's attention layers read during one engine step (nano-vllm's
    ``Context``): the pool of every layer, where each row's K/V goes (slot
    mapping), and how each sequence reads its past (block tables).

    Built once per step; every layer reuses its index tensors. Attention per row kind:

    * **decode rows** (one query): grouped by similar context length (they are
      sorted, so a group is a slice of rows); one ``index_select`` gathers K and
      V of the group's blocks at once from the fused pool, a mask hides padding;
    * **a chunk starting at position 0** (a fresh prompt): causal SDPA over its
      own new K/V, no gather, no mask;
    * **a later chunk**: gathers its context slots, causal mask offset by the
      cached part.

    A pool stored in a lower precision (``kv_dtype``) is converted per gathered
    block, never as a whole.

    Gathers write into one reusable buffer (``scratch``, kept by the runner
    across steps): a fresh multi-megabyte tensor per layer would be new memory
    from the operating system each time, paid for in page faults. A lone decode
    row whose blocks sit next to each other in the pool reads them as a view,
    with no gather at all.
    """

    ragged = True

    def __init__(self, pools, step: StepInput, block_size: int, max_padding: float = 0.25,
                 scratch: dict | None = None, slot_views=None):
        self.pools = pools
        # each pool as a row per slot (the runner keeps these views across steps)
        self.slot_views = slot_views or [p.view(-1, *p.shape[2:]) for p in pools]
        self.scratch = {} if scratch is None else scratch
        self.block_size = block_size
        self.max_position = max(step.positions) if step.positions else 0
        self.slots = torch.as_tensor(step.slot_mapping, dtype=torch.long)
        bs = block_size
        self.decode_groups = []  # (row0, row1, flat block ids, nblk, longest context, mask or None)
        nd = step.num_decode_rows
        ctx = step.context_lens
        for g in group_decode_rows(range(nd), ctx, bs, max_padding):
            r0, r1 = g[0], g[-1] + 1
            nblk = blocks_for(ctx[r1 - 1], bs)  # sorted: the last is longest
            ids = step.block_tables[r0][:nblk]
            if r1 - r0 == 1 and ids[-1] - ids[0] == nblk - 1 and ids == list(range(ids[0], ids[0] + nblk)):
                # one sequence whose blocks are consecutive in the pool: a view, no gather
                self.decode_groups.append((r0, r1, slice(ids[0], ids[0] + nblk), nblk, ctx[r0], None))
                continue
            table = torch.zeros(r1 - r0, nblk, dtype=torch.long)
            for row, i in enumerate(range(r0, r1)):
                ids = step.block_tables[i][:blocks_for(ctx[i], bs)]
                table[row, :len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            lens = ctx[r0:r1]
            longest = lens[-1]
            mask = None  # the gather is cut at the longest context; only shorter rows need a mask
            if lens[0] != longest:
                mask = (torch.arange(longest) < torch.as_tensor(lens)[:, None])[:, None, None, :]
            self.decode_groups.append((r0, r1, table.flatten(), nblk, longest, mask))
        self.chunks = []  # (row0, row1, None | context slots, None | mask)
        row = sum(step.query_lens[:nd])
        for i in range(nd, len(step.query_lens)):
            n, c = step.query_lens[i], ctx[i]
            if c == n:  # starts at position 0: attend to its own fresh K/V, causally
                self.chunks.append((row, row + n, None, None))
            else:
                ids = torch.as_tensor(step.block_tables[i][:blocks_for(c, bs)], dtype=torch.long)
                slots = (ids[:, None] * bs + torch.arange(bs)).flatten()[:c]
                mask = torch.arange(c)[None, :] <= torch.arange(c - n, c)[:, None]
                self.chunks.append((row, row + n, slots, mask))
            row += n

    def _gather(self, source, index):
        """``source.index_select(0, index)`` written into the reusable scratch buffer."""
        n = index.numel() * source[0].numel()
        buf = self.scratch.get(source.dtype)
        if buf is None or buf.numel() < n:
            buf = self.scratch[source.dtype] = torch.empty(max(n, 1 << 16), dtype=source.dtype)
        return torch.index_select(source, 0, index, out=buf[:n].view(index.numel(), *source.shape[1:]))

    def attend(self, layer_idx: int, q, kv, scale: float):
        """Write the rows' K/V (``kv [T, 2, KVH, D]``) into layer ``layer_idx``'s pool,
        then attend; returns [T, H, D]."""
        pool = self.pools[layer_idx]              # [num_blocks, block_size, 2, KVH, D]
        flat = self.slot_views[layer_idx]         # [num_slots, 2, KVH, D]
        flat.index_copy_(0, self.slots, kv if kv.dtype == pool.dtype else kv.to(pool.dtype))
        gqa = q.shape[1] != kv.shape[2]
        out = None
        bs = self.block_size
        for r0, r1, table, nblk, longest, mask in self.decode_groups:
            if isinstance(table, slice):          # consecutive blocks: a view of the pool
                g = pool[table]
            else:
                g = self._gather(pool, table)     # K and V of the group's blocks, one gather
            if g.dtype != q.dtype:
                g = g.to(q.dtype)                 # only the gathered blocks change precision
            g = g.view(r1 - r0, nblk * bs, *pool.shape[2:])[:, :longest]
            kk, vv = g[:, :, 0].transpose(1, 2), g[:, :, 1].transpose(1, 2)   # [B, KVH, L, D]
            o = decode_attention(q[r0:r1], kk, vv, mask, scale)
            if r1 - r0 == q.shape[0]:  # one group holds every row (all decodes): no copy
                return o
            if out is None:
                out = torch.empty_like(q)
            out[r0:r1] = o
        if out is None:
            out = torch.empty_like(q)
        for r0, r1, slots, mask in self.chunks:
            qp = q[r0:r1].transpose(0, 1)[None]   # [1, H, n, D]
            if slots is None:
                kk, vv = kv[r0:r1, 0].transpose(0, 1)[None], kv[r0:r1, 1].transpose(0, 1)[None]
                o = F.scaled_dot_product_attention(qp, kk, vv, is_causal=True, scale=scale, enable_gqa=gqa)
            else:
                g = self._gather(flat, slots)
                if g.dtype != q.dtype:
                    g = g.to(q.dtype)
                kk, vv = g[:, 0].transpose(0, 1)[None], g[:, 1].transpose(0, 1)[None]
                o = F.scaled_dot_product_attention(qp, kk, vv, attn_mask=mask, scale=scale, enable_gqa=gqa)
            out[r0:r1] = o[0].transpose(0, 1)
        return out


def can_compile() -> bool:
    """Whether ``torch.compile`` can build CPU code here: it needs a C++ compiler
    (``$CXX``, ``g++``, ``clang++`` or ``c++`` on the PATH)."""
    import os
    import shutil
    names = [os.environ.get("CXX")] + ["g++", "clang++", "c++"]
    return any(n and shutil.which(n) for n in names)


class _CompiledStep:
    """What the model sees as its cache inside a compiled step: ragged rows, positions
    inside the RoPE table (the runner checked), attention through ``step_attend``."""

    ragged = True
    max_position = 0

    def attend(self, layer_idx: int, q, kv, scale: float):
        # past dynamo's recompile limit (or with dynamo off) the step runs eagerly with this
        # same cache: attention goes to the running step's context, as the graph's operator does
        if not _STEP_CONTEXTS:
            raise RuntimeError("a compiled step's cache attends only inside an engine step")
        return _STEP_CONTEXTS[-1].attend(layer_idx, q, kv, scale)


_COMPILED_STEP = _CompiledStep()


class _LoneDecodeStep:
    """A compiled step of one decode row alone (a request decoding by itself): its
    attention reads its context's slots inside the graph, so the whole step is one
    graph with no call out to a step context."""

    ragged = True
    lone = True
    max_position = 0

    def __init__(self, slot_views, slot: torch.Tensor, context_slots: torch.Tensor):
        self.slot_views, self.slot, self.context_slots = slot_views, slot, context_slots

    def attend(self, layer_idx: int, q, kv, scale: float):
        flat = self.slot_views[layer_idx]                   # [num_slots, 2, KVH, D]
        flat.index_copy_(0, self.slot, kv)
        g = flat[self.context_slots]                        # [L, 2, KVH, D]: one short read
        return decode_attention(q, g[:, 0].transpose(0, 1)[None], g[:, 1].transpose(0, 1)[None], None, scale)


def _lone_decode_slots(step: StepInput, block_size: int) -> torch.Tensor | None:
    """The slots of the context of a step's one decode row, or None if the step is anything else."""
    if step.num_decode_rows != 1 or len(step.input_ids) != 1:
        return None
    length = step.context_lens[0]
    blocks = torch.as_tensor(step.block_tables[0][:blocks_for(length, block_size)], dtype=torch.long)
    slots = (blocks[:, None] * block_size + torch.arange(block_size)).flatten()[:length]
    if length >= 2:  # compiled for any length (one graph), not specialised to the first one seen
        torch._dynamo.mark_dynamic(slots, 0)
    return slots


def _model_step(model, ids, positions, rows, cache):
    return model(ids, positions, cache=cache, logits_rows=rows)


_COMPILED: list = []


def _compiled_model_step():
    """``torch.compile`` of one model step, made once per process: every runner shares it.

    Its graphs are kept per kind of step (the ones :meth:`ModelRunner.warm_up` runs) and
    per model shape: models of the same shape share them (the weights are graph
    inputs, read at every call). ``torch._dynamo``'s recompile limit (8 graphs per
    function) caps the shapes one process compiles; past it, steps run eagerly
    (with PyTorch's warning).
    """
    if not _COMPILED:
        # guards on PyTorch's own modules (nn.Linear, nn.Embedding: their weights are graph
        # inputs, read at each call) are skipped; the course's modules keep theirs, so
        # another model, a swapped projection type or a rebuilt fusion still recompiles or is
        # read afresh, and a step checks far fewer guards.
        skip = torch.compiler.skip_guard_on_inbuilt_nn_modules_unsafe
        _COMPILED.append(torch.compile(_model_step, dynamic=None, options={"guard_filter_fn": skip}))
    return _COMPILED[0]


class ModelRunner:
    """Runs a :class:`servelab.model.LlamaModel` over a paged KV pool.

    The pool is one tensor per layer holding K and V together,
    ``[num_blocks, block_size, 2, num_key_value_heads, head_dim]``, so one
    ``index_select`` gathers both. ``k_cache[l]`` and ``v_cache[l]`` are views of it.

    The forward pass is the model's own (its layers, its RoPE table, its fused
    Q/K/V and gate/up projections: ``LlamaModel.fuse_projections`` is called
    here; the weights become views of the fused matrices, nothing is copied).
    Only attention's source of keys and values differs: a
    :class:`PagedStepContext`. The tests check the logits against the model's
    plain forward pass.
    """

    def __init__(self, model, num_blocks: int, block_size: int, kv_dtype: torch.dtype | None = None,
                 compile: bool = False):
        self.model = model.eval()
        cfg = model.config
        self.config = cfg
        self.block_size = block_size
        self.dtype = model.embed_tokens.weight.dtype
        kv_dtype = kv_dtype or self.dtype
        shape = (num_blocks, block_size, 2, cfg.num_key_value_heads, cfg.head_dim)
        self.kv_pools = [torch.zeros(shape, dtype=kv_dtype) for _ in range(cfg.num_hidden_layers)]
        # views of one matrix each; in fp32 stored column-major, so batch-1 mat-vecs stream long
        # rows (on the EPYC measured, 1.4x faster at batch 1 and still faster at batch 8; in bf16
        # the 213M decoder's batch-8 step was ~10% slower that way, so bf16 keeps row-major)
        model.fuse_projections(column_major=self.dtype == torch.float32)
        self._scratch: dict = {}  # the step contexts' gather buffer, one per dtype, kept across steps
        if compile and not can_compile():
            raise RuntimeError("enforce_eager=False compiles the model with torch.compile, which needs a "
                               "C++ compiler for CPU code (none found: install g++ or set $CXX), or keep "
                               "enforce_eager=True")
        self.compiled = bool(compile)
        self._slot_views = [p.view(-1, *p.shape[2:]) for p in self.kv_pools]  # a row per slot
        if self.compiled:
            self.warm_up()

    def warm_up(self) -> None:
        """Compile every kind of step before the first request, as vLLM compiles at start-up.

        A graph is specialised on whether a step has one row or several, on how
        many rows get logits (all of them: no row list; none, one, several), and
        on whether it is one decode row alone (then attention is in the graph).
        One small synthetic step of each kind covers them all; the pool is zeroed after.
        """
        bs = self.block_size
        if len(self.kv_pools[0]) < 2 or bs < 2:
            return  # too small a pool for the synthetic steps: compiled on first use instead

        def step(q_lens, ctx_lens, rows, decodes):  # sequence i in block i
            tables = [[i] for i in range(len(q_lens))]
            slots = [i * bs + p for i, (c, n) in enumerate(zip(ctx_lens, q_lens)) for p in range(c - n, c)]
            positions = [p for c, n in zip(ctx_lens, q_lens) for p in range(c - n, c)]
            return StepInput(input_ids=[1] * len(slots), positions=positions, slot_mapping=slots,
                             query_lens=q_lens, context_lens=ctx_lens, block_tables=tables,
                             sample_rows=rows, num_decode_rows=decodes)
        n = min(3, bs)
        for s in (step([1], [2], [0], 1),                       # one row alone: attention in the graph
                  step([1, 1], [1, 1], [0, 1], 2),              # decodes: every row's logits
                  step([n], [n], [n - 1], 0),                   # a prompt: its last row's logits
                  step([1, n], [1, n], [0, n], 1),              # a decode and a prompt
                  step([n], [n], [], 0),                        # a chunk inside a prompt: no logits
                  step([1], [1], [], 0)):                       # a one-token chunk inside a prompt
            self.execute(s)
        for p in self.kv_pools:
            p.zero_()

    @property
    def k_cache(self) -> list[torch.Tensor]:
        return [p[:, :, 0] for p in self.kv_pools]

    @property
    def v_cache(self) -> list[torch.Tensor]:
        return [p[:, :, 1] for p in self.kv_pools]

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def kv_pool_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.kv_pools)

    def context(self, step: StepInput) -> PagedStepContext:
        return PagedStepContext(self.kv_pools, step, self.block_size, scratch=self._scratch,
                                slot_views=self._slot_views)

    @torch.inference_mode()
    def execute(self, step: StepInput) -> torch.Tensor:
        """Write every scheduled token's K/V; return fp32 logits [len(sample_rows), vocab]."""
        ids = torch.as_tensor(step.input_ids, dtype=torch.long)
        positions = torch.as_tensor(step.positions, dtype=torch.long)
        rows = step.sample_rows
        # every row samples (a pure decode step): no row gather before the head
        rows = None if rows == list(range(len(step.input_ids))) else torch.as_tensor(rows, dtype=torch.long)
        if self.compiled and max(step.positions, default=0) < self.model.rotary.max_positions:
            # compiled: what a graph cannot check is checked here
            self.model.refresh_fusions()
            self.model.rotary.table()
            same_dtype = self.kv_pools[0].dtype == self.dtype  # the lone path writes K/V as they are
            lone = _lone_decode_slots(step, self.block_size) if same_dtype else None
            if lone is not None:  # the whole step in the graph
                cache = _LoneDecodeStep(self._slot_views, ids.new_tensor(step.slot_mapping), lone)
                return _compiled_model_step()(self.model, ids, positions, rows, cache).float()
            _STEP_CONTEXTS.append(self.context(step))  # attention reads it through step_attend
            try:
                return _compiled_model_step()(self.model, ids, positions, rows, _COMPILED_STEP).float()
            finally:
                _STEP_CONTEXTS.pop()
        return self.model(ids, positions, cache=self.context(step), logits_rows=rows).float()
