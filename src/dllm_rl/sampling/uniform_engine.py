"""Continuous batching for uniform-state diffusion (DiffusionGemma): the engine's slots, canvas by canvas.

:class:`~dllm_rl.sampling.engine.Engine` hands a model whose family's noise is uniform (``Family.noise``, read by
:func:`~dllm_rl.sampling.inputs.uniform_noise` in the engine's constructor, the one place) to :class:`UniformEngine`,
which serves the same API (``add_request`` / ``step`` / ``run`` / ``abort`` / ``completions``; ``running`` and
``waiting`` for the server's worker) with the stock sampler's rule (:mod:`~dllm_rl.sampling.uniform`), one step of
every running request per :meth:`UniformEngine.step`:

1. waiting requests take free slots; a joining request's prompt, and the canvas a request finished in the last step,
   go through the **encoder** in one forward (rows right-padded), which writes their keys into the slot's columns
   of the KV pool (:class:`~dllm_rl.sampling.slot_cache.SlotCache`, column = position: the prompt at 0..L-1, canvas
   ``k`` at ``L + kC``);
2. one **decoder** forward for every running request: its canvas, its previous step's tempered logits
   (self-conditioning; a row at its canvas's first step has none, which ``self_conditioning_mask`` zeroes exactly as
   an absent input) and its positions, reading its slot's cached columns in place (the stock decoder then
   concatenates them with the canvas's own keys, one copy per layer, as in ``generate``);
3. per request, the step of :func:`~dllm_rl.sampling.uniform.denoise_step` on its own ``[1, C, V]`` logits with its own
   generator (and its own knobs: schedule, entropy bound, stopping), then its stopping rule. A request whose canvas
   ends (adaptive stop or its last step) keeps the argmax canvas; with ``stop_on_eos`` an EOS in it (any of the
   model's ``eos_token_ids``) finishes the request (pad after it), as does its last canvas; otherwise it draws its
   next canvas and encodes the kept one at the next step.

**Exactness.** A request draws its random numbers in the order ``generate([prompt], seeds=[seed])`` draws them, from
its own generator, and only while it denoises (:mod:`~dllm_rl.sampling.uniform`'s per-row draws), its attention
sees exactly its own columns (masks built here: full attention over its cached positions, the sliding layers'
encoder window ``sliding_window``, the decoder's sliding layers over the last ``sliding_window - 1`` cached
positions as the stock sliding cache keeps them), and its step records are those of the sampler alone. So its tokens,
step count and trajectory (``Rollout.uniform``) equal ``generate``'s whoever shares its steps (tested in float32;
a batch of another shape may round a float differently, as for the masked engine).

**Memory** per slot: the KV pool's columns (``EngineConfig.max_positions`` or the longest request so far), the
canvas ``[C]`` and the previous step's tempered logits ``[C, V]`` in the model's dtype (the self-conditioning input the
stock rule needs whole: 256 x 262,144 values, 134 MB a slot in bfloat16 for the 26B-A4B model), plus a step's
``[C, V]`` float32 temporaries of one request at a time (the step runs request by request).

Not served here (refused in one line): prefill, images, record_steps, until_block and LoRA adapters (a uniform-state
rollout has no masks to prefill or record; LoRA for this family is not wired into the engine's forwards yet).

One file (about 420 lines) for one job, the scheduler of uniform-state requests: the slot bookkeeping, the encoder
and decoder forwards over the slots and the per-request step share the slots' state (KV columns, canvases,
self-conditioning logits, generators) and are read top to bottom as the three stages above; the sampler's rule itself
lives in :mod:`~dllm_rl.sampling.uniform`, the record's Rollout in :mod:`~dllm_rl.sampling.uniform_result`.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass

import torch

from dllm_rl.config import FieldError
from dllm_rl.errors import UserError
from dllm_rl.sampling.config import DecodeConfig
from dllm_rl.sampling.copies import CopyCounter
from dllm_rl.sampling.decode import evaluating
from dllm_rl.sampling.engine_api import BASE_MODEL, Completion, EngineConfig, RequestSlots
from dllm_rl.sampling.inputs import check_inputs, uniform_decode_config
from dllm_rl.sampling.logprobs import MAX_TOP, LogprobMaps, TokenLogprobs
from dllm_rl.sampling.rollout import Rollout
from dllm_rl.sampling.slot_cache import SlotCache, StepPlan
from dllm_rl.sampling.uniform import UniformDecodeConfig, UniformRollout, UniformStep, denoise_step, finish_canvas
from dllm_rl.sampling.uniform_result import to_uniform_rollout


@dataclass
class UniformSequence:
    """One request's state (its slot's tensors live in :class:`UniformEngine`)."""

    request_id: int
    prompt: list[int]
    config: DecodeConfig
    cfg: UniformDecodeConfig
    generator: torch.Generator
    canvases: int  # canvases to decode (gen_length / C)
    logprobs: LogprobMaps | None = None
    slot: int = -1
    length: int = 0  # positions in its slot's KV columns (the prompt, then each finished canvas)
    pending: list[int] | None = None  # ids to encode before its next decoder pass (its prompt, or a kept canvas)
    canvas_index: int = 0
    step: int = 0  # the schedule's step of its next pass (counts down to 1)
    nfe: int = 0
    kept: list[torch.Tensor] = dataclasses.field(default_factory=list)  # finished canvases, [1, C] each
    steps: list[UniformStep] = dataclasses.field(default_factory=list)  # its record, as the sampler's alone

    def final_slots(self) -> int:
        """The completion slots no later step changes: those of its finished canvases."""
        return sum(k.shape[1] for k in self.kept)

    def token_logprobs(self) -> TokenLogprobs | None:
        if self.logprobs is None:
            return None
        ids = torch.cat(self.kept, dim=1)[0] if self.kept else torch.zeros(0, dtype=torch.long)
        steps = torch.zeros_like(ids)
        return self.logprobs.read(ids, steps, 0, ids.shape[0])


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[n, 1, q, k]`` additive mask (0 / the dtype's minimum) of a boolean ``[n, q, k]`` (eager attention adds a
    boolean mask as numbers, so only an additive one works with every kernel)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
        ~allowed, torch.finfo(dtype).min)[:, None]


class _ReadCache:
    """The decoder's read-only view of the pool: what ``DiffusionGemmaDecoderTextAttention`` reads of a cache (each
    layer's ``keys`` / ``values``, here views of the running slots' columns ``[0, width)``)."""

    is_compileable = False

    def __init__(self, pool: SlotCache, first: int, n: int, width: int):
        rows = slice(first, first + n)
        self.layers = [dataclasses.replace(_Layer(), keys=k[rows, :, :width], values=v[rows, :, :width])
                       for k, v in zip(pool.keys, pool.values, strict=True)]


@dataclass
class _Layer:
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None


class UniformEngine(RequestSlots):
    """Continuous-batching decoder of a uniform-state model (see the module docstring)."""

    def __init__(self, model, config: DecodeConfig, engine=None, tokenizer=None):
        if not isinstance(config, DecodeConfig):
            raise TypeError(f"config must be a DecodeConfig, got {type(config).__name__}")
        if getattr(model.model, "peft_config", None):
            raise UserError(f"the continuous-batching engine serves {model.family.name} without LoRA adapters for "
                            "now; merge the adapter into the weights or decode in fixed batches")
        uniform_decode_config(config)  # the server's own knobs are valid
        self.model, self.config, self.tokenizer = model, config, tokenizer
        self.engine = engine if engine is not None else EngineConfig()
        self.hf = model.hf_model
        text = self.hf.config.get_text_config()
        self.block = int(self.hf.config.canvas_length)  # the canvas: what the server rounds max_tokens up to
        self.vocab, self.window = int(text.vocab_size), getattr(text, "sliding_window", None)
        self.sliding = [t == "sliding_attention" for t in text.layer_types]
        self.device = model.device
        self.waiting: deque[UniformSequence] = deque()
        self.running: list[UniformSequence | None] = [None] * self.engine.slots
        self.copies = CopyCounter()
        self.cache = SlotCache(self.engine.slots, self.copies)
        slots, c = self.engine.slots, self.block
        self.canvas = torch.zeros((slots, c), dtype=torch.long, device=self.device)
        self.conditioned = torch.zeros(slots, dtype=torch.bool, device=self.device)  # self-conditioning on
        self.self_cond: torch.Tensor | None = None  # [slots, C, V] in the model's dtype, allocated at the first step
        self.last_argmax = torch.full((slots, c), -1, dtype=torch.long, device=self.device)
        self.unchanged = torch.zeros(slots, dtype=torch.long, device=self.device)  # steps the argmax held
        self.eos_ids: tuple[int, ...] = model.eos_token_ids  # every id that ends a request, as in the sampler
        self._eos = torch.tensor(self.eos_ids, device=self.device)
        self._not_done = torch.zeros(1, dtype=torch.bool, device=self.device)
        self._next_id = 0

    # ---- the serving API -------------------------------------------------------------------------------------
    def add_request(self, prompt, seed: int | None = None, gen_length: int | None = None,
                    config: DecodeConfig | None = None, images=None, prefill=None, adapter: str | None = None,
                    record_steps: str | None = None, until_block: int | None = None,
                    logprobs: int | None = None) -> int:
        """Queue one prompt (token ids); returns its request id (:meth:`Engine.add_request`'s arguments; those
        a uniform-state rollout has no use for are refused)."""
        rid = self._next_id
        given = {"images": images is not None, "prefill": prefill is not None, "record_steps": bool(record_steps),
                 "until_block": until_block is not None, "adapter": adapter not in (None, BASE_MODEL)}
        if refused := [k for k, v in given.items() if v]:
            raise UserError(f"request {rid}: {', '.join(refused)} not served for {self.model.family.name} "
                            "(uniform-state diffusion) by the engine: it decodes whole canvases from random ids, with "
                            "no mask to prefill, stop or record, and without LoRA adapters")
        config = config if config is not None else self.config
        if gen_length is not None:
            config = dataclasses.replace(config, gen_length=gen_length)
        try:
            [ids] = check_inputs(self.model, [prompt], config, None, None, self.engine.max_positions)
        except UserError as err:
            raise UserError(str(err).replace("prompt 0", f"request {rid}")) from None
        if logprobs is not None and not 0 <= logprobs <= MAX_TOP:
            raise FieldError("logprobs", f"request {rid}: {logprobs} alternatives asked; give 0 to {MAX_TOP}")
        return self._queue(ids, config, config.seed + rid if seed is None else seed, logprobs)

    def _queue(self, ids: list[int], config: DecodeConfig, seed: int, logprobs: int | None = None) -> int:
        rid = self._next_id
        seq = UniformSequence(rid, ids, config, uniform_decode_config(config),
                              torch.Generator(device=self.device).manual_seed(int(seed)),
                              config.gen_length // self.block)
        if logprobs is not None:
            seq.logprobs = LogprobMaps(config.gen_length, logprobs, self.device)
        self._next_id += 1
        self.waiting.append(seq)
        return rid

    def adapters(self) -> tuple[str, ...]:
        return ()

    def completions(self, request_ids: list[int] | None = None) -> dict[int, tuple[list[int], list[bool]]]:
        """``{request id: (token ids, still open)}`` of the running requests: the finished canvases' tokens (final),
        then the current canvas as it stands and the pad of the canvases to come (open), for streams
        (:func:`~dllm_rl.sampling.sequence.settled`: the settled text is the finished canvases' up to EOS) and
        canvas viewers."""
        wanted = None if request_ids is None else set(request_ids)
        out = {}
        for seq in self.running:
            if seq is None or (wanted is not None and seq.request_id not in wanted):
                continue
            done = torch.cat(seq.kept, dim=1)[0].tolist() if seq.kept else []
            current = self.canvas[seq.slot].tolist()
            rest = seq.config.gen_length - len(done) - len(current)
            out[seq.request_id] = (done + current + [self.model.pad_token_id] * rest,
                                   [False] * len(done) + [True] * (len(current) + rest))
        return out

    def step(self) -> list:
        """Fill free slots, run one denoising step of every running request, return the requests that finished."""
        self.copies.begin_step()
        finished = []
        with evaluating(self.model), torch.inference_mode():
            self._admit()
            running = [s for s in self.running if s is not None]
            if running:
                self._encode([s for s in running if s.pending is not None])
                finished = self._denoise(running)
        self.copies.end_step()
        for seq in finished:
            self.running[seq.slot] = None
        return [Completion(s.request_id, self._rollout(s), s.token_logprobs()) for s in finished]

    def run(self, prompts, seeds: list[int] | None = None, images=None, prefill=None, record_steps=None,
            until_block=None) -> Rollout:
        """Decode ``prompts`` and return their rollout in input order (seed ``seeds[i]``, default
        ``config.seed + i``, as :func:`~dllm_rl.sampling.generate`)."""
        for name, value in (("images", images), ("prefill", prefill), ("record_steps", record_steps),
                            ("until_block", until_block)):
            if value:
                raise UserError(f"generate: {name} is not supported for {self.model.family.name} (uniform-state "
                                "diffusion): its sampler decodes whole canvases from random ids, with no mask to "
                                "prefill, stop or record")
        prompts = check_inputs(self.model, prompts, self.config, seeds, None, self.engine.max_positions)
        seeds = list(seeds) if seeds is not None else [self.config.seed + i for i in range(len(prompts))]
        order = {self._queue(p, self.config, s): i for i, (p, s) in enumerate(zip(prompts, seeds, strict=True))}
        out: list[Rollout | None] = [None] * len(order)
        with evaluating(self.model):
            while any(r is None for r in out):
                for c in self.step():
                    if c.request_id in order:
                        out[order[c.request_id]] = c.rollout
        return Rollout.cat(out)

    # ---- scheduling ------------------------------------------------------------------------------------------
    def _admit(self) -> None:
        """Keep the running requests in slots ``0 .. n - 1`` (the forwards read consecutive slots of the pool): the
        last ones move into the holes finished requests left (their cached columns once), then waiting requests
        take the free slots, each drawing its first canvas (its prompt is encoded before its first pass)."""
        live = [s for s in self.running if s is not None]
        for hole in range(len(live)):
            if self.running[hole] is None:
                self._move(max(live, key=lambda s: s.slot), hole)
                live = [s for s in self.running if s is not None]
        while self.waiting and len(live) < len(self.running):
            seq = self.waiting.popleft()
            seq.slot, seq.pending = len(live), list(seq.prompt)
            self.running[seq.slot] = seq
            live.append(seq)
            self._begin_canvas(seq)

    def _move(self, seq: UniformSequence, slot: int) -> None:
        if seq.length:
            self.cache.move(seq.slot, slot, seq.length)
        for t in (self.canvas, self.conditioned, self.self_cond, self.last_argmax, self.unchanged):
            if t is not None:
                t[slot] = t[seq.slot]
        self.running[seq.slot], self.running[slot], seq.slot = None, seq, slot

    def _begin_canvas(self, seq: UniformSequence) -> None:
        """A canvas's first state: uniformly random ids from the request's generator (the stock canvas draw), no
        self-conditioning, no argmax history."""
        self.canvas[seq.slot] = torch.randint(0, self.vocab, (1, self.block), generator=seq.generator,
                                              device=self.device)[0]
        self.conditioned[seq.slot] = False
        self.last_argmax[seq.slot] = -1
        self.unchanged[seq.slot] = 0
        seq.step = seq.cfg.max_denoising_steps

    # ---- the forwards ----------------------------------------------------------------------------------------
    def _masks(self, q_pos: torch.Tensor, keys: int, kv_len: torch.Tensor, canvas: bool) -> dict[str, torch.Tensor]:
        """Per layer type, the additive masks of queries at positions ``q_pos`` ``[n, q]`` over the pool's columns
        ``[0, keys)`` (a row's own ``[0, kv_len)``), then, for the decoder (``canvas``), the canvas's own ``q``
        columns. The encoder is causal (its sliding layers: within ``sliding_window``); the decoder sees every cached
        column (its sliding layers: the last ``sliding_window - 1``, which the stock sliding cache keeps) and the
        whole canvas."""
        col = torch.arange(keys, device=self.device)[None, None, :]
        valid = col < kv_len[:, None, None]
        full = valid & (col <= q_pos[:, :, None]) if not canvas else valid.expand(-1, q_pos.shape[1], -1)
        out = {"full_attention": full}
        if self.window is not None:
            if canvas:
                out["sliding_attention"] = full & (col >= (kv_len - self.window + 1)[:, None, None])
            else:
                out["sliding_attention"] = full & (col > q_pos[:, :, None] - self.window)
        if canvas:
            own = torch.ones((*q_pos.shape, q_pos.shape[1]), dtype=torch.bool, device=self.device)
            out = {k: torch.cat([v, own], dim=-1) for k, v in out.items()}
        dtype = self.model.dtype
        return {k: _additive(v, dtype) for k, v in out.items()}

    def _long(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def _encode(self, group: list[UniformSequence]) -> None:
        """One encoder forward of the pending ids (prompts, kept canvases) of ``group``, right-padded, over the
        consecutive slots from its first to its last (rows between with nothing pending ride along with no query
        written), storing their keys at their positions."""
        if not group:
            return
        first, last = min(s.slot for s in group), max(s.slot for s in group)
        rows = [self.running[i] for i in range(first, last + 1)]
        lens = [len(s.pending) if s.pending is not None else 0 for s in rows]
        width_q = max(lens)
        ids = torch.full((len(rows), width_q), self.model.pad_token_id, dtype=torch.long, device=self.device)
        for i, s in enumerate(rows):
            if lens[i]:
                ids[i, : lens[i]] = self._long(s.pending)
        start, q_len = self._long([s.length for s in rows]), self._long(lens)
        j = torch.arange(width_q, device=self.device)[None, :]
        q_pos = start[:, None] + torch.minimum(j, (q_len - 1).clamp(min=0)[:, None])  # padding: the last query's
        write_row = torch.repeat_interleave(torch.arange(len(rows), device=self.device), q_len)
        write_query = torch.cat([torch.arange(n, device=self.device) for n in lens])
        ends = [s.length + n for s, n in zip(rows, lens, strict=True)]
        width = max(ends)
        self.cache.reserve(self.engine.max_positions or width)
        plan = StepPlan(first, len(rows), write_row, write_query, start[write_row] + write_query, width)
        masks = self._masks(q_pos, width, self._long(ends), canvas=False)
        self.hf.model.encoder(input_ids=ids, attention_mask=masks, cache=self.cache.step_cache(plan),
                              position_ids=q_pos)
        for s, n in zip(rows, lens, strict=True):
            if n:
                s.length, s.pending = s.length + n, None

    def _denoise(self, running: list[UniformSequence]) -> list[UniformSequence]:
        """One decoder forward of every running request, then each one's step; returns those that finished."""
        n, c = len(running), self.block
        length = self._long([s.length for s in running])
        q_pos = length[:, None] + torch.arange(c, device=self.device)[None, :]
        width = max(s.length for s in running)
        conditioned = self.conditioned[:n]
        any_cond = any(s.step < s.cfg.max_denoising_steps for s in running)
        out = self.hf(decoder_input_ids=self.canvas[:n], cache=_ReadCache(self.cache, 0, n, width),
                      self_conditioning_logits=self.self_cond[:n] if any_cond else None,
                      self_conditioning_mask=conditioned if any_cond else None,
                      decoder_attention_mask=self._masks(q_pos, width, length, canvas=True),
                      decoder_position_ids=q_pos)
        finished = []
        for i, seq in enumerate(running):
            if self._step(seq, out.logits[i : i + 1]):
                finished.append(seq)
        return finished

    def _step(self, seq: UniformSequence, raw: torch.Tensor) -> bool:
        """``seq``'s step on its raw logits ``[1, C, V]`` (the sampler's for a batch of one); True when it finished."""
        slot, cfg, canvas = seq.slot, seq.cfg, self.canvas[seq.slot : seq.slot + 1].clone()
        draw = denoise_step(raw, cfg, seq.step, [seq.generator])
        seq.steps.append(UniformStep(seq.canvas_index, seq.step, canvas, bool(self.conditioned[slot]), draw.sampled,
                                     draw.accepted, torch.zeros(1, dtype=torch.bool, device=self.device),
                                     torch.zeros(1, dtype=torch.bool, device=self.device)))
        seq.nfe += 1
        argmax = draw.logits.argmax(dim=-1)
        held = bool((argmax == self.last_argmax[slot]).all())
        self.unchanged[slot] = self.unchanged[slot] + 1 if held else 0
        self.last_argmax[slot] = argmax[0]
        stop = int(self.unchanged[slot]) >= cfg.stability_threshold and \
            bool(draw.entropy.mean(dim=-1) < cfg.confidence_threshold)  # (compared in float32, as the sampler)
        if self.self_cond is None:
            self.self_cond = torch.zeros((len(self.running), *draw.logits.shape[1:]), dtype=self._embedding_dtype,
                                         device=self.device)
        self.canvas[slot] = torch.where(draw.accepted, draw.sampled, draw.noise)[0]
        self.self_cond[slot] = draw.logits[0].to(self._embedding_dtype)
        self.conditioned[slot] = True
        seq.step -= 1
        if not stop and seq.step > 0:
            return False
        if cfg.final_tokens == "sampled":  # the canvas keeps this step's draws, all accepted (sampling.uniform)
            seq.steps[-1].accepted = torch.ones_like(draw.accepted)
            return self._end_canvas(seq, draw.sampled, draw.logits)
        return self._end_canvas(seq, argmax, draw.logits)

    @property
    def _embedding_dtype(self) -> torch.dtype:
        return self.hf.model.decoder.embed_tokens.weight.dtype

    def _end_canvas(self, seq: UniformSequence, kept: torch.Tensor, logits: torch.Tensor) -> bool:
        """The canvas ``seq`` just finished keeps ``kept`` (the argmax, or the draws, ``[1, C]``); True when the request
        ends here (an EOS in it under ``stop_on_eos``, or its last canvas)."""
        ended = False
        if seq.config.stop_on_eos:  # the sampler's own rule: any EOS id ends it, the tokens after the first are pad
            kept, done = finish_canvas(kept, self._not_done, self._eos, self.model.pad_token_id)
            ended = bool(done[0])
        if seq.logprobs is not None:
            self._logprobs(seq, kept, logits)
        seq.kept.append(kept)
        seq.canvas_index += 1
        if ended or seq.canvas_index == seq.canvases:
            return True
        seq.pending = kept[0].tolist()
        self._begin_canvas(seq)
        return False

    def _logprobs(self, seq: UniformSequence, kept: torch.Tensor, logits: torch.Tensor) -> None:
        """A kept canvas's tokens' log-probabilities under the distribution they were read from: the tempered
        softmax of the canvas's last step, whose argmax they are, with its ``top`` likeliest alternatives."""
        logp = torch.log_softmax(logits[0].double(), dim=-1)
        values, ids = torch.topk(logp, min(max(seq.logprobs.top, 1), logp.shape[-1]), dim=-1)
        start = seq.canvas_index * self.block
        seq.logprobs.write(start, torch.ones(self.block, dtype=torch.bool, device=self.device),
                           logp.gather(-1, kept[0][:, None])[:, 0], values, ids)

    def _rollout(self, seq: UniformSequence) -> Rollout:
        prompt = self._long(seq.prompt)[None]
        record = UniformRollout(prompt, torch.ones_like(prompt, dtype=torch.bool), torch.cat([prompt, *seq.kept], 1),
                                seq.steps, self._long([seq.nfe]))
        return to_uniform_rollout(self.model, record, seq.config, seq.cfg, self.tokenizer)
