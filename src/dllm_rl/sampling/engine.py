"""Continuous batching: a fixed number of slots kept busy, each finished sequence replaced at once by a waiting one.

A fixed batch (:func:`~dllm_rl.sampling.generate`) lasts as long as its slowest row: with threshold decoding or
EOS stops, rows finish after very different numbers of forward passes and the finished ones idle. The engine
schedules requests the way nano-vllm / vLLM do: :meth:`Engine.add_request` queues a prompt, each
:meth:`Engine.step` fills free slots from the queue (first come, first served), runs one denoising step for every
running sequence and returns the sequences that finished in it (EOS or length), whose slots the next step hands to
waiting prompts. :meth:`Engine.run` is the batch convenience (results in input order). The running sequences'
tokens live in one row per slot (:class:`~dllm_rl.sampling.sequence.SlotRows`), so a step chooses, commits and
checks every row in batched ops and reads the device once, however many slots run.

* **Full-attention models** (LLaDA, Dream; ``cache="none"``): every sequence has its own canvas and any block may
  sit beside any other: a step left-pads the canvases so that every row's current block occupies the same columns
  and forwards them together, so a sequence joins or leaves at any step. With Fast-dLLM's caches (``cache="prefix"``
  or ``"dual"``) each slot keeps its canvas's keys (:mod:`~dllm_rl.sampling.slot_cache`): a sequence at its block's
  first step refreshes them (a forward of its whole canvas that only writes the pool), the others forward their
  block (dual) or their block and what follows (prefix) against their slot, as ``generate`` does for one row.
* **Block models** (SDAR/TraDo, LLaDA2, Fast-dLLM v2): each slot keeps its own exact block KV cache
  (:mod:`~dllm_rl.sampling.slot_cache`). A step forwards each row's current block (after its just-finished block,
  whose keys the same forward stores: the fold of :mod:`~dllm_rl.sampling.runner`'s ``block`` mode) against its own
  cached columns, read in place: the running sequences hold consecutive slots (a finished one's hole is taken by a
  newcomer, else by the last running one, moved once), so a forward's cache is a view of the pool. A sequence joins
  at its first block: a long prompt is forwarded in a group of its own (with the other long joining prompts), so it
  never widens the others' forward. Fast-dLLM v2's logits are shifted (position ``i`` scores token ``i + 1``): a
  block's first column reads the column before it, from the forward that folds it in or from the slot's stored copy.

**Batch invariance.** A sequence decodes its own one-prompt canvas (the layout ``generate`` gives it alone) with its
own ``torch.Generator`` (seed ``seed`` of :meth:`~Engine.add_request`; :meth:`~Engine.run` uses ``config.seed + i``
as ``generate`` does), with the draw shapes and the rules of :func:`~dllm_rl.sampling.decode.decode`, and spends a
step only when it decodes. So its tokens, step map and NFE equal ``generate([prompt], seeds=[seed])`` whoever
shares its steps, and the results equal a fixed batch's: exactly in float32 in the tests (the confidences to about
1e-6: a batch of another shape sums its softmax in another order, so an exact tie between two slots, which orders
commits and RCR's re-masking, could in principle break the other way); in bfloat16 kernels chosen by batch shape
round differently and can flip a near-tied sampled choice (about 1 row in 50).

**Memory** is bounded by the slots, not the queue: a waiting request holds its one-prompt canvas (token ids); the KV
pool is ``slots x capacity`` (capacity: ``EngineConfig.max_positions``, allocated at the first step; without it,
the widest canvas of :meth:`~Engine.run`'s prompts, or the longest request admitted so far), and the engine copies
none of it per step: a step stores its rows' new columns and reads the rest in place (``Engine.copies`` counts the
bytes, :mod:`~dllm_rl.sampling.copies`); the attention reads grouped key/value heads once for a step's queries
(:mod:`dllm_rl.models.attention`; a query span of ``2 x KV heads x head dim`` or more, as a long prompt's fold or
a prefix-cache suffix, takes transformers' path, which repeats them).

**Early stop** (``EngineConfig.early_stop``, off by default): a sequence whose answer is decided — a committed EOS
with every slot before it committed — stops at once and its masked slots are filled with EOS (never generated,
``step_map`` -1), as ``stop_on_eos`` fills them after an all-EOS block. The answer (``completion_mask``, ``texts``,
``finish_reason``) is the same as without it, since later steps can only fill slots after that EOS; the tokens
*after* the first EOS, their step map and the NFE differ from the published samplers (which decode on until a
whole block holds only EOS/padding), so it is off by default. It is an EOS stop: a request without ``stop_on_eos``
is never stopped early and decodes its whole length, its tokens and NFE those of ``generate`` (as is a partial
decode's, ``until_block``, whose later blocks stay masked).

**Images** (LLaDA-V, full attention): a request brings its prompt's image features, encoded already (one row of
:class:`~dllm_rl.models.prompt_images.PromptImages`, shared, not copied), made ready for its forwards once when
queued; a forward of its prompt columns writes them in place at its row's columns
(:mod:`~dllm_rl.sampling.row_splice`).

**LoRA adapters** (``add_request(adapter=NAME)``, the server's ``--lora``): requests naming different adapters
loaded in the model, or the base model, share every step (a forward mixing adapters takes ``peft``'s mixed-adapter
batch, each row's adapter applied to its own row; a forward of one adapter switches to it for that forward), so one
pool of slots and one KV pool serve them all.

**Prefilled tokens** (``prefill``: IGPO's hints, inpainting) are committed before decoding, as ``generate`` does;
a block they leave nothing to decode in costs no step, and ends the answer if it holds only EOS (an EOS stop).

**Per-step records** (``record_steps``: MDPO, EGSPO) keep each step's prediction per sequence, as ``generate``'s
:class:`~dllm_rl.sampling.step_record.StepRecorder` does for a batch of one.

**Log-probabilities** (``add_request(logprobs=K)``, the server's ``logprobs``): each committed token's
log-probability under the distribution of the step that committed it, and its ``K`` likeliest alternatives
(:mod:`~dllm_rl.sampling.logprobs`), computed for the rows that asked only and kept for their committed slots only.

**Partial decodes** (``until_block``: d-TreeRPO's tree nodes) end a sequence before its ``until_block``-th decoded
block, the rest of its completion left masked.

**RCR** (``remasking="rcr"``, MDPO's Running-Confidence Remasking) fills every masked slot of a row's block, then
re-masks the least confident of the slots that block began with (``SlotRows.drawn``), as ``decode`` does.

Every decoding ``generate`` serves, the engine serves; a uniform-state family (DiffusionGemma) through
:class:`~dllm_rl.sampling.uniform_engine.UniformEngine`, which ``Engine(model, ...)`` returns for it (the same API).
Under RCR a committed token of the block being decoded is not
final: early stop and the settled text (:meth:`Sequence.final_slots`) read only finished blocks there.

One file on purpose (about 700 lines, a third of them this docstring and the help texts): it is one state machine.
The scheduling (admission, compaction, groups) and the step (the forward's layout, the choice, the finish checks)
keep the same invariants between them (the running sequences hold slots ``0 .. n - 1``, a forward's rows are
consecutive slots, a step reads the device once), so they are read and changed together; the state they share
lives in :mod:`~dllm_rl.sampling.sequence` (the slot rows) and :mod:`~dllm_rl.sampling.slot_cache` (the KV pool).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass

import torch

from dllm_rl.config import FieldError
from dllm_rl.errors import UserError
from dllm_rl.models import DiffusionLM, attention_bias, block_index
from dllm_rl.models.eos import eos_mask
from dllm_rl.models.prompt_images import PromptImages
from dllm_rl.sampling.canvas import canvas_width
from dllm_rl.sampling.confidence import choose_tokens, left_after, rcr_remask
from dllm_rl.sampling.config import DecodeConfig
from dllm_rl.sampling.copies import CopyCounter
from dllm_rl.sampling.decode import evaluating, step_commits, to_rollout
from dllm_rl.sampling.engine_api import BASE_MODEL, Completion, EngineConfig, RequestSlots
from dllm_rl.sampling.inputs import check_inputs, decode_block_length, uniform_noise
from dllm_rl.sampling.logprobs import MAX_TOP, LogprobMaps, step_logprobs
from dllm_rl.sampling.rollout import Rollout
from dllm_rl.sampling.row_splice import RowSplice, request_images
from dllm_rl.sampling.sequence import Sequence, SlotRows
from dllm_rl.sampling.slot_cache import SlotCache, StepPlan
from dllm_rl.sampling.step_record import PREDICTIONS, step_prediction
from dllm_rl.sampling.uniform_engine import UniformEngine

# DecodeConfig fields a request may set for itself (they act after the forward) and those it shares with the engine.
PER_REQUEST = ("steps", "threshold", "sub_block", "confidence", "temperature", "top_k", "top_p", "remasking",
               "stop_on_eos", "seed", "gen_length")
SHARED = ("block_length", "block_size", "cache")
CHOICE = ("steps", "threshold", "sub_block", "confidence", "temperature", "top_k", "top_p", "remasking")  # one step's

# Block models: a joining sequence whose first forward (uncached prompt plus first block) exceeds this many blocks
# runs in a forward of its own rather than widening every running row's queries to its length.
JOIN_APART = 2


@dataclass
class _Canvases:
    """A full-attention forward's layout (:meth:`Engine._canvases`): ``ids``, ``valid`` and each column's canvas
    column ``col`` ``[n, width]``, each row's left offset and canvas length ``[n]``, the kept (block) columns and
    the image splice."""

    ids: torch.Tensor
    valid: torch.Tensor
    col: torch.Tensor
    offset: torch.Tensor
    lens: torch.Tensor
    keep: torch.Tensor
    splice: object | None


class Engine(RequestSlots):
    """Continuous-batching decoder over one model and one :class:`DecodeConfig` (see the module docstring)."""

    def __new__(cls, model: DiffusionLM, *args, **kwargs):
        """A uniform-state family (DiffusionGemma) gets its own slots' step, canvas by canvas
        (:class:`~dllm_rl.sampling.uniform_engine.UniformEngine`, the same API): the one place the engine reads the
        family's noise."""
        if cls is Engine and uniform_noise(model):
            return UniformEngine(model, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, model: DiffusionLM, config: DecodeConfig, engine: EngineConfig | None = None, tokenizer=None):
        if not isinstance(config, DecodeConfig):
            raise TypeError(f"config must be a DecodeConfig, got {type(config).__name__}")
        self.model, self.config, self.tokenizer = model, config, tokenizer
        self.engine = engine if engine is not None else EngineConfig()
        self.block = decode_block_length(model, config)
        self.eos_ids: tuple[int, ...] = model.eos_token_ids  # every id that ends a request, as in the sampler
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence | None] = [None] * self.engine.slots
        self.device = model.device
        self.rows = SlotRows(self.engine.slots, self.device)
        self.copies = CopyCounter()  # the bytes of keys/values and image features each step copies
        # the KV pool: block models' exact cache, or Fast-dLLM's prefix / dual cache of a full-attention model
        self.cache = (SlotCache(self.engine.slots, self.copies) if model.is_block_causal or config.cache != "none"
                      else None)
        self._next_id = 0

    # ---- the serving API -------------------------------------------------------------------------------------
    def add_request(self, prompt, seed: int | None = None, gen_length: int | None = None,
                    config: DecodeConfig | None = None, images: PromptImages | None = None,
                    prefill: dict[int, int] | None = None, adapter: str | None = None,
                    record_steps: str | None = None, until_block: int | None = None,
                    logprobs: int | None = None) -> int:
        """Queue one prompt (token ids); returns its request id. ``seed`` seeds its generator (default
        ``config.seed + request id``); ``gen_length`` overrides the config's for this request; ``images`` (one row,
        LLaDA-V) are the prompt's image features, spliced at its placeholder positions.

        ``prefill`` (completion offset -> token id) commits those tokens before decoding, as ``generate(prefill=)``
        does (blocks it leaves nothing to decode in cost no step).

        ``adapter`` names the LoRA adapter (loaded in the model by name) this request decodes with, or
        :data:`BASE_MODEL` for the base model with the adapters off; None: the model as it is called. Requests
        with different adapters share every step, each row decoded as it would be alone, so all of them share the
        slots and the KV pool (:meth:`_forward`).

        ``record_steps`` (``"sampled"`` | ``"greedy"``) keeps each step's prediction in the rollout, as
        ``generate(record_steps=)`` does (:mod:`~dllm_rl.sampling.step_record`: MDPO, EGSPO). ``until_block``
        stops the request after its first ``until_block`` decoded blocks, the rest of its completion left masked, as
        ``generate(until_block=)`` (d-TreeRPO's partial trees). ``logprobs`` (0 to :data:`MAX_TOP`) records each
        committed token's log-probability at its commit step and that many alternatives
        (:meth:`Sequence.token_logprobs`, :attr:`Completion.logprobs`).

        ``config`` decodes this request with its own choice rules (:data:`PER_REQUEST`: sampling, schedule, order,
        EOS stop); it shares every step's forward with the others, so the fields that shape the forward (the
        block, the cache) must be the engine's: a request differing there is refused, naming the field."""
        rid = self._next_id
        config = self._request_config(config if config is not None else self.config, gen_length)
        if adapter is not None and adapter != BASE_MODEL:
            if adapter not in self.adapters():
                raise FieldError("adapter", f"request {rid}: the model has no LoRA adapter {adapter!r}; loaded: "
                                 f"{', '.join(self.adapters()) or 'none'}")
            from dllm_rl.training.lora import mixed_batch_refusal

            if (refusal := mixed_batch_refusal(self.model, adapter)) is not None:
                raise FieldError("adapter", f"request {rid}: {refusal}")
        try:
            [ids] = check_inputs(self.model, [prompt], config, None, images, self.engine.max_positions)
        except UserError as err:
            raise UserError(str(err).replace("prompt 0", f"request {rid}")) from None
        if logprobs is not None and not 0 <= logprobs <= MAX_TOP:
            raise FieldError("logprobs", f"request {rid}: {logprobs} alternatives asked; give 0 to {MAX_TOP}")
        rid = self._queue(ids, config, seed, images, prefill, adapter, record_steps, until_block)
        if logprobs is not None:
            self.waiting[-1].logprobs = LogprobMaps(self.waiting[-1].width, logprobs, self.device)
        return rid

    def adapters(self) -> tuple[str, ...]:
        """The names of the LoRA adapters loaded in the model (none without ``peft``)."""
        return tuple(getattr(self.model.model, "peft_config", None) or ())

    def _queue(self, ids: list[int], config: DecodeConfig, seed: int | None, images: PromptImages | None,
               prefill: dict[int, int] | None, adapter: str | None = None, record_steps: str | None = None,
               until_block: int | None = None) -> int:
        """Queue a checked prompt; returns its request id."""
        if record_steps is not None and record_steps not in PREDICTIONS:
            raise ValueError(f"record_steps must be one of {', '.join(PREDICTIONS)}, got {record_steps!r}")
        rid = self._next_id
        try:
            seq = Sequence.new(rid, ids, config.gen_length, self.block, self.model.is_block_causal,
                               self.model.mask_token_id, self.model.pad_token_id, self.device,
                               config.seed + rid if seed is None else seed,
                               images.to(self.device) if images is not None else None, prefill,
                               self.eos_ids)
        except ValueError as err:  # a prefill offset outside the completion
            raise UserError(f"request {rid}: {err}".replace("prefill[0]", "prefill")) from None
        seq.config, seq.adapter, seq.record, seq.until = config, adapter, record_steps, until_block
        seq.embeds = request_images(seq.images, self.device, self.model.dtype)  # once for the request
        self._next_id += 1
        self.waiting.append(seq)
        return rid

    def _request_config(self, config: DecodeConfig, gen_length: int | None) -> DecodeConfig:
        if not isinstance(config, DecodeConfig):
            raise TypeError(f"config must be a DecodeConfig, got {type(config).__name__}")
        for name in SHARED:
            if getattr(config, name) != getattr(self.config, name):
                raise FieldError(name, f"{getattr(config, name)!r} differs from the engine's "
                                 f"{getattr(self.config, name)!r}; every request shares the engine's {name} "
                                 "(it shapes the shared forward)")
        return config if gen_length is None else dataclasses.replace(config, gen_length=gen_length)

    def completions(self, request_ids: list[int] | None = None) -> dict[int, tuple[list[int], list[bool]]]:
        """The completion slots of the running requests ``request_ids`` (default all) as they stand:
        ``{request id: (token ids, still masked)}`` (the mask id where still masked), read from the device at once
        (only those columns), for streams (:func:`~dllm_rl.sampling.sequence.settled`) and viewers."""
        wanted = None if request_ids is None else set(request_ids)
        seqs = [s for s in self.running if s is not None and (wanted is None or s.request_id in wanted)]
        if not seqs:
            return {}
        width = max(s.comp[1] - s.comp[0] for s in seqs)
        cols = self._long([s.comp[0] for s in seqs])[:, None] + torch.arange(width, device=self.device)
        cols = cols.clamp(max=self.rows.width - 1)
        slots = self._long([s.slot for s in seqs])[:, None]
        x, todo = torch.stack([self.rows.x[slots, cols], self.rows.todo[slots, cols].long()]).tolist()
        return {s.request_id: (x[i][: s.comp[1] - s.comp[0]], [bool(t) for t in todo[i][: s.comp[1] - s.comp[0]]])
                for i, s in enumerate(seqs)}

    def step(self) -> list[Completion]:
        """Fill free slots from the queue, run one denoising step of every running sequence, and return the
        requests that finished in it."""
        self.copies.begin_step()
        with evaluating(self.model), torch.inference_mode():
            finished = self._admit()  # those whose prefill left nothing to decode
            running = [s for s in self.running if s is not None]
            if running:
                for group in self._groups(running):
                    self._decode(group, self._logits(group))
                finished += self._finished(running)
        self.copies.end_step()
        for seq in finished:  # (rollouts are built outside inference mode: training reads them)
            if seq.rows is not None:
                self.running[seq.slot] = None
        return [Completion(seq.request_id, self._rollout(seq), seq.token_logprobs()) for seq in finished]

    def run(self, prompts, seeds: list[int] | None = None, images: PromptImages | None = None,
            prefill: list[dict[int, int]] | None = None, record_steps: str | None = None,
            until_block: list[int] | None = None, configs: list[DecodeConfig] | None = None) -> Rollout:
        """Decode ``prompts`` (token ids) and return their rollout in input order; prompt ``i`` uses seed
        ``seeds[i]`` (default ``config.seed + i``, as :func:`~dllm_rl.sampling.generate`) and shows the images of
        row ``i`` of ``images`` (encoded already, as ``generate`` takes them), commits ``prefill[i]`` first and
        stops after ``until_block[i]`` decoded blocks; ``record_steps`` as :meth:`add_request`. ``configs[i]`` decodes
        prompt ``i`` with its own choice rules (:data:`PER_REQUEST`, as ``add_request(config=)``; e.g. a learned
        per-prompt threshold, :mod:`~dllm_rl.sampling.threshold_head`)."""
        prompts = check_inputs(self.model, prompts, self.config, seeds, images, self.engine.max_positions)
        seeds = list(seeds) if seeds is not None else [self.config.seed + i for i in range(len(prompts))]
        for name, per in (("prefill", prefill), ("until_block", until_block), ("configs", configs)):
            if per is not None and len(per) != len(prompts):
                raise ValueError(f"{name} has {len(per)} entries for {len(prompts)} prompts")
        if self.cache is not None and self.engine.max_positions is None:  # every canvas is known: no regrowth
            self.cache.reserve(max(canvas_width(len(p), self.config.gen_length, self.block, self.model.is_block_causal)
                                   for p in prompts))
        configs = [self._request_config(c, None) for c in configs] if configs is not None else [self.config] * len(
            prompts)
        ids = [self._queue(p, configs[i], s, images.row(i) if images is not None else None,
                           prefill[i] if prefill is not None else None, record_steps=record_steps,
                           until_block=until_block[i] if until_block is not None else None)
               for i, (p, s) in enumerate(zip(prompts, seeds))]  # (checked above, all of them)
        order = {rid: i for i, rid in enumerate(ids)}
        out: list[Rollout | None] = [None] * len(ids)
        with evaluating(self.model):  # once for the run: switching a module tree's mode each step costs ~6% here
            while any(r is None for r in out):
                for c in self.step():
                    if c.request_id in order:
                        out[order[c.request_id]] = c.rollout
        return Rollout.cat(out)

    # ---- scheduling ------------------------------------------------------------------------------------------
    def _admit(self) -> list[Sequence]:
        """Give free slots to waiting requests, first come first served, keeping the running sequences in slots
        ``0 .. n - 1`` so that every forward reads consecutive slots of the KV pool. Newcomers that will run apart
        (:meth:`_groups`) take the last of those slots; the others fill the holes finished or aborted sequences
        left, so that under load no running sequence moves (a newcomer's keys are written by its own first
        forward); a running sequence moves (its cached keys once, :meth:`_move`) only into a hole no newcomer
        fills, or out of the newcomers' run. Returns the requests their prefill left nothing to decode (finished
        without a slot)."""
        with torch.inference_mode():  # it writes the slot rows and the KV pool, inference tensors
            live = [s for s in self.running if s is not None]
            new, done = [], []
            while self.waiting and len(live) + len(new) < len(self.running):
                seq = self.waiting.popleft()
                (done if self._skip_prefilled(seq) else new).append(seq)
            apart = [s for s in new if self._joins_apart(s)]
            front = len(live) + len(new) - len(apart)  # slots [0, front): the running rows and those riding along
            holes = [i for i in range(front) if self.running[i] is None]
            for hole, seq in zip(holes, [s for s in live if s.slot >= front]):
                self._move(seq, hole)
            riders = [s for s in new if not self._joins_apart(s)]
            free = [i for i in range(front) if self.running[i] is None] + list(range(front, front + len(apart)))
            for slot, seq in zip(free, riders + apart, strict=True):
                seq.place(self.rows, slot)
                seq.joining = True
                self.running[slot] = seq
            self._begin_blocks(new)
        return done

    def _move(self, seq: Sequence, slot: int) -> None:
        """Move a running sequence to the free ``slot``, its cached keys with it."""
        self.rows.move(seq.slot, slot)
        if self.cache is not None and seq.cached:
            self.cache.move(seq.slot, slot, seq.cached)
        self.running[seq.slot], self.running[slot], seq.slot = None, seq, slot

    def _joins_apart(self, seq: Sequence) -> bool:
        return self.model.is_block_causal and seq.cols()[1] - seq.cached > JOIN_APART * self.block

    def _skip_prefilled(self, seq: Sequence) -> bool:
        """Move ``seq`` past the blocks its prefill left nothing to decode in, without a step (as ``generate``
        does), an EOS stop ending it where such a block holds only EOS / padding; True when it is finished (its
        last block, or the block its ``until_block`` stops before)."""
        while seq.until is None or seq.block_idx < seq.until:
            if seq.empty is None or seq.block_idx not in seq.empty:
                return seq.block_idx >= seq.canvas.num_blocks
            if seq.config.stop_on_eos and seq.empty[seq.block_idx]:
                seq.stop_after(seq.cols()[1], self.eos_ids[0])
                return True
            seq.block_idx += 1
        return True

    def _groups(self, running: list[Sequence]) -> list[list[Sequence]]:
        """The forwards of a step: one for full attention. For block models one too, except that sequences whose
        uncached prompt is longer than :data:`JOIN_APART` blocks (joining) run apart, since a forward pads every
        row to its longest query; shorter ones ride along (a forward's fixed cost outweighs a little padding).
        Each group holds consecutive slots: the ones apart are the last run of newcomers (:meth:`_admit` seats
        them last); any other long row (one that skipped prefilled blocks) rides along."""
        split = len(running)
        while split and running[split - 1].joining and self._joins_apart(running[split - 1]):
            split -= 1
        for seq in running:
            seq.joining = False
        return [g for g in (running[:split], running[split:]) if g]

    def _finished(self, running: list[Sequence]) -> list[Sequence]:
        """After a step (``running`` holds slots ``0 .. n - 1``): which sequences are finished, and the others moved
        to their next block where this one is done. Decided for every row at once, with one host
        synchronisation for the step."""
        eos, pad, device = self.eos_ids, self.model.pad_token_id, self.device
        rows, n = self.rows, len(running)
        if running[-1].slot != n - 1:
            raise RuntimeError(f"engine: the running sequences must hold slots 0 .. {n - 1}, got "
                               f"{[s.slot for s in running]}")
        c0, c1 = self._long([s.comp[0] for s in running])[:, None], self._long([s.comp[1] for s in running])[:, None]
        _, cols = self._current_blocks(running)
        x, todo = rows.x[:n], rows.todo[:n]
        flags = [~todo.gather(1, cols).any(-1)]  # the current block is done
        blk = x.gather(1, cols)  # an EOS stop: a done block holding only EOS / padding in its completion slots
        flags.append((eos_mask(blk, eos) | (blk == pad) | (cols < c0) | (cols >= c1)).all(-1))
        if self.engine.early_stop:  # the answer is decided: a committed EOS with every slot before it committed
            col = torch.arange(rows.width, device=device)[None, :]  # (and final: RCR takes back its block's tokens)
            inside = (col >= c0) & (col < c1)
            final = self._long([s.comp[0] + s.final_slots() for s in running])[:, None]
            is_eos = eos_mask(x, eos) & ~todo & inside & (col < final)
            first = torch.where(is_eos, col, rows.width).min(-1).values
            flags.append(is_eos.any(-1) & ~(todo & inside & (col < first[:, None])).any(-1))
        flags = torch.stack(flags, dim=1).tolist()  # the step's one synchronisation
        done, begin = [], []
        for seq, (block_done, eos_block, *ended) in zip(running, flags):
            # an early stop is an EOS stop: never for a request without stop_on_eos (it decodes its whole length,
            # as generate does), nor for a partial decode (its later blocks stay masked)
            if ended and ended[0] and seq.config.stop_on_eos and seq.until is None:
                seq.fill_rest(eos[0])
                done.append(seq)
            elif block_done and seq.config.stop_on_eos and eos_block:
                seq.stop_after(seq.cols()[1], eos[0])
                done.append(seq)
            elif block_done:
                seq.block_idx += 1
                (done if self._skip_prefilled(seq) else begin).append(seq)
        self._begin_blocks(begin)
        return done

    def _long(self, values: list[int]) -> torch.Tensor:
        """Host integers as a long tensor on the model's device, copied without waiting for the device: a plain
        host-to-GPU copy synchronises the stream, which would cost a round trip per call; from pinned memory it
        is queued like a kernel (the pinned block is not reused before the copy ran)."""
        host = torch.tensor(values, dtype=torch.long, pin_memory=self.device.type == "cuda")
        return host.to(self.device, non_blocking=True)

    def _current_blocks(self, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(slots [n, 1], cols [n, block])``: each sequence's slot and its current block's columns (index pairs
        into :class:`~dllm_rl.sampling.sequence.SlotRows`)."""
        cols = self._long([s.cols()[0] for s in seqs])[:, None] + torch.arange(self.block, device=self.device)
        return self._long([s.slot for s in seqs])[:, None], cols

    def _begin_blocks(self, seqs: list[Sequence]) -> None:
        """Start each sequence's current block: no step spent on it yet; ``masked0``, its masks, counted on the
        device for all of them at once."""
        if not seqs:
            return
        slots, cols = self._current_blocks(seqs)
        self.rows.drawn[slots, cols] = self.rows.todo[slots, cols]
        self.rows.masked0[slots[:, 0]] = self.rows.todo[slots, cols].sum(-1)
        for seq in seqs:
            seq.local_step = 0

    def _rollout(self, seq: Sequence) -> Rollout:
        rollout = to_rollout(*seq.result(), self.model, self.tokenizer)
        rollout.block_size = self.block if self.model.is_block_causal else None
        rollout.images = seq.images
        if seq.prefill is not None:
            rollout.prefilled = torch.zeros_like(rollout.completion_mask)
            rollout.prefilled[0, [int(k) for k in seq.prefill]] = True
        return rollout

    # ---- one step --------------------------------------------------------------------------------------------
    def _logits(self, group: list[Sequence]) -> torch.Tensor:
        """Logits ``[n, block, V]`` of each sequence's current block."""
        if self.model.is_block_causal:
            return self._block_logits(group)
        return self._full_logits(group) if self.cache is None else self._fast_dllm_logits(group)

    def _full_logits(self, group: list[Sequence]) -> torch.Tensor:
        """Every row's canvas, left-padded so that the current blocks share their columns."""
        lay = self._canvases(group)
        return self._forward(group, lay.ids, attention_mask=lay.valid, logits_to_keep=lay.keep,
                             splice=lay.splice).logits

    def _canvases(self, group: list[Sequence]) -> _Canvases:
        """The rows' whole canvases, left-padded so that every current block occupies the same columns (a
        full-attention forward's layout, with the rows' image splice)."""
        device = self.device
        starts = [s.cols()[0] for s in group]
        left = max(starts)
        width = left + max(s.width - st for s, st in zip(group, starts))
        host_offset = [left - st for st in starts]
        offset, lens = self._long(host_offset), self._long([s.width for s in group])
        col = torch.arange(width, device=device)[None, :] - offset[:, None]  # each column's canvas column
        valid = (col >= 0) & (col < lens[:, None])
        ids = self.rows.x[self._long([s.slot for s in group])[:, None], col.clamp(0, self.rows.width - 1)]
        splice = RowSplice.of([s.embeds for s in group], host_offset, width, self.copies)  # a prompt starts there
        return _Canvases(ids.masked_fill(~valid, self.model.pad_token_id), valid, col, offset, lens,
                         torch.arange(left, left + self.block, device=device), splice)

    def _row_pairs(self, lengths: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(row, index)`` of every item when row ``r`` has ``lengths[r]`` of them (``total`` in all), row by row:
        a forward's valid queries, to store in the KV pool (``nonzero`` without its host round trip)."""
        row = torch.repeat_interleave(torch.arange(len(lengths), device=self.device), lengths, output_size=total)
        return row, torch.arange(total, device=self.device) - (lengths.cumsum(0) - lengths)[row]

    def _fast_dllm_logits(self, group: list[Sequence]) -> torch.Tensor:
        """Fast-dLLM's prefix or dual cache (``config.cache``) on a full-attention model, per slot, as
        :class:`~dllm_rl.sampling.runner.ModelRunner`'s modes for one row alone: a row at its block's first step
        refreshes its slot (its whole canvas forwarded, every column's keys stored, :meth:`_refresh_logits`); the
        others forward their block (dual: against their cached prefix and suffix) or their block and all after it
        (prefix: against their cached prefix), storing their fresh keys over the stale ones. The running rows hold
        consecutive slots, so the cached forward takes them all (a refreshing row's block rides along, its logits
        replaced by the refresh's)."""
        self.cache.reserve(self.engine.max_positions or max(s.width for s in group))
        fresh = [i for i, seq in enumerate(group) if seq.local_step == 0]
        if len(fresh) == len(group):
            return self._refresh_logits(group)
        logits = self._cached_block_logits(group)
        if fresh:
            logits[self._long(fresh)] = self._refresh_logits([group[i] for i in fresh])
        return logits

    def _cached_block_logits(self, group: list[Sequence]) -> torch.Tensor:
        """Every row's current block ``[s, e)`` (dual) or ``[s, width)`` (prefix), right-padded, against its slot's
        columns read in place; logits of the block."""
        device, block, n, pad = self.device, self.block, len(group), self.model.pad_token_id
        starts = [s.cols()[0] for s in group]
        host_q_len = [(s.cols()[1] if self.config.cache == "dual" else s.width) - st for s, st in zip(group, starts)]
        widths = [s.width for s in group]
        width_q = max(host_q_len)
        start, q_len = self._long(starts), self._long(host_q_len)
        cols = torch.arange(width_q, device=device)[None, :]
        q_valid = cols < q_len[:, None]
        q_pos = torch.where(q_valid, start[:, None] + cols, (start + q_len - 1)[:, None])
        ids = self.rows.x[group[0].slot : group[0].slot + n].gather(1, q_pos).masked_fill(~q_valid, pad)
        keys = torch.arange(max(widths), device=device)[None, :] < self._long(widths)[:, None]
        bias = attention_bias(keys, num_queries=width_q, dtype=self.model.dtype)
        write_row, write_query = self._row_pairs(q_len, sum(host_q_len))
        plan = StepPlan(group[0].slot, n, write_row, write_query, start[write_row] + write_query, max(widths))
        prev = self._prev_raw(group) if self.model.family.shift else None
        keep = block if width_q == block else torch.arange(block, device=device)
        return self._forward(group, ids, attn_bias=bias, position_ids=q_pos,
                             past_key_values=self.cache.step_cache(plan), use_cache=True, prev_raw_logits=prev,
                             logits_to_keep=keep).logits

    def _refresh_logits(self, group: list[Sequence]) -> torch.Tensor:
        """The rows' whole canvases, left-padded so that their current blocks share columns (as
        :meth:`_full_logits`), with every column's keys stored in the rows' slots (any slots: the forward reads
        nothing cached); logits of the blocks. A shifted family (Dream) keeps each block's first aligned logits,
        the raw logits of the column before it, for the cached steps."""
        lay = self._canvases(group)
        write_row, write_col = self._row_pairs(lay.lens, sum(s.width for s in group))
        plan = StepPlan(0, len(group), write_row, lay.offset[write_row] + write_col, write_col, lay.ids.shape[1],
                        slots=self._long([s.slot for s in group]))
        out = self._forward(group, lay.ids, attention_mask=lay.valid,
                            attn_bias=attention_bias(lay.valid, dtype=self.model.dtype),
                            position_ids=lay.col.clamp(min=0), past_key_values=self.cache.step_cache(plan),
                            use_cache=True, logits_to_keep=lay.keep, splice=lay.splice)
        if self.model.family.shift:
            self._prev_raw(group, out.logits[:, 0])
        for seq in group:
            seq.cached = seq.width  # the slot holds every column of its canvas now
        return out.logits

    def _prev_raw(self, group: list[Sequence], store: torch.Tensor | None = None) -> torch.Tensor | None:
        """A shifted family's per-slot raw logits of the column before each row's block: stored (``store``
        ``[n, V]``) or read (``[n, 1, V]``)."""
        rows, slots = self.rows, self._long([s.slot for s in group])
        if store is not None:
            rows.raw_logits(store)[slots] = store
            return None
        return rows.prev_raw[slots][:, None, :]

    def _block_logits(self, group: list[Sequence]) -> torch.Tensor:
        """Each row's uncached columns (its prompt or just-finished block, then its current block), left-padded to
        the longest, attend to its slot's cached columns read in place (:mod:`~dllm_rl.sampling.slot_cache`)."""
        device, block = self.device, self.block
        if group[-1].slot != group[0].slot + len(group) - 1:
            raise RuntimeError(f"engine: a forward's sequences must hold consecutive slots, got "
                               f"{[s.slot for s in group]}")
        host_ends = [s.cols()[1] for s in group]
        host_q_len = [e - s.cached for s, e in zip(group, host_ends)]
        n, width_q, width = len(group), max(host_q_len), max(host_ends)
        cached, ends, q_len = self._long([s.cached for s in group]), self._long(host_ends), self._long(host_q_len)
        pad = width_q - q_len
        q_valid = torch.arange(width_q, device=device)[None, :] >= pad[:, None]
        q_pos = (cached - pad)[:, None] + torch.arange(width_q, device=device)[None, :]
        q_pos = torch.where(q_valid, q_pos, q_pos[:, -1:])  # padding queries sit in the row's current block
        ids = self.rows.x[group[0].slot : group[0].slot + n].gather(1, q_pos)
        ids = ids.masked_fill(~q_valid, self.model.pad_token_id)
        k_pos = torch.arange(width, device=device)[None, :].expand(n, -1)
        bias = attention_bias(k_pos < ends[:, None], query_block=block_index(q_pos, block),
                              key_block=block_index(k_pos, block), dtype=self.model.dtype)
        write_row, within = self._row_pairs(q_len, sum(host_q_len))  # the valid queries, row by row
        write_query = pad[write_row] + within
        plan = StepPlan(group[0].slot, n, write_row, write_query, q_pos[write_row, write_query], width)
        # with max_positions the pool takes its bound at once (never regrown: a growth holds old and new together)
        self.cache.reserve(self.engine.max_positions or max(s.width for s in group))
        shift = self.model.family.shift
        keep = min(width_q, block + 1) if shift else block  # a shifted family also wants the column before
        out = self._forward(group, ids, attn_bias=bias, position_ids=q_pos,
                            past_key_values=self.cache.step_cache(plan), use_cache=True, logits_to_keep=keep,
                            align=not shift)
        logits = self._shifted(group, out.logits) if shift else out.logits
        for seq in group:
            seq.cached = seq.cols()[0]  # the columns before the current block are final in the pool now
        return logits

    def _forward(self, group: list[Sequence], *args, **kwargs):
        """The model's forward of ``group``'s rows, each with its LoRA adapter (a row naming none: the model as it
        is called). Rows of one adapter run it directly (the base model's with the adapters off); only a forward
        that mixes adapters takes ``peft``'s mixed-adapter batch, which indexes each adapter's rows in every LoRA
        layer (a host-device synchronisation per layer on a GPU). Inside ``peft``'s ``disable_adapter()`` every
        row decodes with the base model."""
        if all(s.adapter is None for s in group) or not self.adapters():
            return self.model(*args, **kwargs)
        names = [s.adapter or self.model.model.active_adapter for s in group]
        if len(set(names)) > 1:
            return self.model(*args, adapter_names=names, **kwargs)
        if names[0] == self.model.model.active_adapter:  # (switching walks every LoRA layer)
            return self.model(*args, **kwargs)
        from dllm_rl.training.lora import active_adapter

        with active_adapter(self.model, None if names[0] == BASE_MODEL else names[0]):
            return self.model(*args, **kwargs)

    def _record(self, group: list[Sequence], slots: torch.Tensor, cols: torch.Tensor, logits: torch.Tensor,
                tokens: torch.Tensor, conf: torch.Tensor) -> None:
        """Each recording row's prediction of this step, before it commits, as
        :class:`~dllm_rl.sampling.step_record.StepRecorder` keeps it: its completion with the block's masked slots
        predicted (the sampled tokens, or the logits' argmax for ``"greedy"``), which slots are masked, and the
        predicted slots' confidences (a device tensor per row and step: no host read)."""
        greedy = self._long([s.record == "greedy" for s in group]).bool()[:, None]
        guess = torch.where(greedy, logits.argmax(-1), tokens)
        x, masked, score = step_prediction(self.rows.x[slots[:, 0]], self.rows.todo[slots[:, 0]], cols, guess, conf,
                                           self._long([s.comp[0] for s in group]),
                                           max(s.comp[1] - s.comp[0] for s in group))
        for i, seq in enumerate(group):
            if seq.record:
                g = seq.comp[1] - seq.comp[0]
                seq.records.append((x[i, :g], masked[i, :g], score[i, :g]))

    def _logprobs(self, group: list[Sequence], logits: torch.Tensor, tokens: torch.Tensor, chosen: torch.Tensor,
                  cfg: DecodeConfig) -> None:
        """The rows that asked record their committed tokens' log-probabilities under this step's distribution
        (:func:`~dllm_rl.sampling.logprobs.step_logprobs`; the others cost nothing)."""
        ask = [i for i, s in enumerate(group) if s.logprobs is not None]
        index = self._long(ask)
        top = max(group[i].logprobs.top for i in ask)
        lp, vals, ids = step_logprobs(logits.index_select(0, index), tokens.index_select(0, index), cfg.temperature,
                                      cfg.top_k, cfg.top_p, top)
        for j, i in enumerate(ask):
            group[i].logprobs.write(group[i].cols()[0], chosen[i], lp[j], vals[j], ids[j])

    def _shifted(self, group: list[Sequence], raw: torch.Tensor) -> torch.Tensor:
        """A shifted family's (Fast-dLLM v2) logits of each row's current block ``[s, e)`` from the raw logits of
        the forward's last query columns (column ``i`` scores token ``i + 1``): column ``i`` reads the raw logits of
        ``i - 1``. For column ``s`` that is the column before the block: in this forward when it folds the
        previous block (or the prompt) in, which stores it per slot (block-causal attention leaves it unchanged
        while the block decodes), else that stored copy; a row starting at column 0 reads its own, as
        :meth:`~dllm_rl.models.DiffusionLM.align_logits` does for a first token."""
        block, n_raw = self.block, raw.shape[1]
        starts = [s.cols()[0] for s in group]
        fold = [s.cached < st for s, st in zip(group, starts)]
        stored = self.rows.raw_logits(raw[:, 0])
        slots = self._long([s.slot for s in group])
        own = raw[:, n_raw - block :]  # raw logits of [s, e)
        first = stored[slots]
        if any(fold):  # then every row's window is longer than the block: raw holds the column before it
            before = raw[:, n_raw - block - 1]
            folded = self._long(fold).bool()
            first = torch.where(folded[:, None], before, first)
            stored[slots] = first
        first = torch.where(self._long([st == 0 for st in starts]).bool()[:, None], own[:, 0], first)
        return torch.cat([first[:, None], own[:, :-1]], dim=1)

    def _decode(self, group: list[Sequence], logits: torch.Tensor) -> None:
        """Choose and commit each row's tokens, as one step of :func:`~dllm_rl.sampling.decode.decode`, for each
        set of rows sharing their decoding rules (one set unless requests brought their own)."""
        rules: dict[tuple, list[int]] = {}
        for i, seq in enumerate(group):
            rules.setdefault(tuple(getattr(seq.config, n) for n in CHOICE), []).append(i)
        if len(rules) == 1:
            self._choose(group, logits, group[0].config)
            return
        for rows in rules.values():
            self._choose([group[i] for i in rows], logits.index_select(0, self._long(rows)), group[rows[0]].config)

    def _choose(self, group: list[Sequence], logits: torch.Tensor, cfg: DecodeConfig) -> None:
        """One step's choice and commits for ``group`` (rows sharing ``cfg``'s rules), in batched ops on the slot
        rows (no host synchronisation)."""
        slots, cols = self._current_blocks(group)
        rows = self.rows
        todo = rows.todo[slots, cols]
        needs_rng = cfg.temperature > 0 or cfg.confidence == "random"
        gens = [s.generator for s in group] if needs_rng else None
        tokens, conf, ent = choose_tokens(logits, cfg.temperature, cfg.top_k, cfg.top_p, cfg.confidence, gens)
        if any(s.record for s in group):
            self._record(group, slots, cols, logits, tokens, conf)
        local = self._long([s.local_step for s in group])
        steps, masked0 = cfg.steps or self.block, rows.masked0[slots[:, 0]]
        chosen = step_commits(cfg, conf, todo, masked0, steps, local)
        step = self._long([s.nfe for s in group])[:, None]
        x = torch.where(chosen, tokens, rows.x[slots, cols])
        todo = todo & ~chosen
        step_map = torch.where(chosen, step, rows.step_map[slots, cols])
        conf_map = torch.where(chosen, conf.float(), rows.conf[slots, cols])
        ent_map = torch.where(chosen, ent.float(), rows.entropy[slots, cols])
        if cfg.remasking == "rcr":
            back = rcr_remask(conf_map.double(), rows.drawn[slots, cols], left_after(masked0, steps, local))
            x = x.masked_fill(back, self.model.mask_token_id)
            todo, step_map = todo | back, step_map.masked_fill(back, -1)
            conf_map, ent_map = conf_map.masked_fill(back, 0.0), ent_map.masked_fill(back, 0.0)
            chosen = chosen & ~back
        if any(s.logprobs is not None for s in group):
            self._logprobs(group, logits, tokens, chosen, cfg)
        rows.x[slots, cols], rows.todo[slots, cols], rows.step_map[slots, cols] = x, todo, step_map
        rows.conf[slots, cols], rows.entropy[slots, cols] = conf_map, ent_map
        for seq in group:
            seq.nfe += 1
            seq.local_step += 1
