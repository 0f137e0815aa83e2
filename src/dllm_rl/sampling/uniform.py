"""The sampler of uniform-state diffusion (DiffusionGemma), written here rather than called through ``generate``.

Its rule is the stock one (transformers' ``generation_diffusion_gemma``), canvas by canvas:

1. the encoder adds the prompt (later: the last finished canvas) to the KV cache;
2. the canvas starts as uniformly random ids; each step (``step`` counts down from ``max_denoising_steps`` to 1):
   the decoder reads the canvas and the previous step's tempered logits (self-conditioning; none on the first
   step), the logits are divided by the linear schedule ``t_min + (t_max - t_min) * step / max_denoising_steps``,
   one id per position is drawn from their softmax, the entropy bound accepts the lowest-entropy positions while
   ``cumsum(sorted entropy) - entropy <= entropy_bound`` (arXiv 2505.24857), and every other position gets a fresh
   random id;
3. a row stops when its argmax canvas is unchanged for ``stability_threshold`` steps and its mean entropy is below
   ``confidence_threshold``; a stopped row keeps its canvas and logits while the others go on;
4. the canvas kept is the argmax of the last tempered logits (not the last drawn canvas); a row with EOS in it is
   finished: its tokens after the first EOS, and its later canvases, become pad.

``final_tokens="sampled"`` (not stock; for RL's rollouts) keeps instead the ids the row's last step drew at every
position, and marks them accepted in that step's record. Why: under the stock rule only the low-entropy positions a
step accepts are draws of the policy; the positions still uncertain at the end are settled by the argmax, which no
step's log-probability counts, so a trajectory policy gradient can sharpen what the model is already sure of but
never move a choice it is unsure of. With sampled final tokens every kept token is a draw the trajectory
log-probability counts (the random numbers are the stock ones: the draws are made either way).

Random numbers are drawn in the stock order (the canvas's ``randint``, then per step one ``multinomial`` over all
positions and one ``randint`` for the re-noising, for every row, stopped or not) from ``generator`` (None: torch's
global generator), so under the same seed the tokens equal ``model.generate``'s. A list of generators, one per row,
draws each row's numbers from its own in the same order: a row's tokens are then those it gets alone under its
generator's seed, whatever its batch (the library's batch invariance; :func:`dllm_rl.sampling.generate` does this).

Each step is recorded (:class:`UniformStep`) with what a trajectory policy gradient needs: the canvas fed in,
whether self-conditioning was on, the drawn ids, the accepted positions, which rows were still counted. The logits
are not kept by default: they are ``[B, canvas, vocab]`` per step (a 262k vocabulary makes one step of one
256-token canvas 268 MB in float32), and they are recomputed exactly from the record
(:func:`dllm_rl.sampling.uniform_trace.replay_logits`); ``keep_logits`` stores them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.distributions import Categorical
from transformers import DynamicCache

from dllm_rl.config import Checked, FieldError, field


@dataclass
class UniformDecodeConfig(Checked):
    """The knobs of the uniform-state sampler; the defaults are the stock ``generate``'s."""

    max_new_tokens: int = field(256, ge=1, help="Completion budget in tokens, rounded up to whole canvases.")
    max_denoising_steps: int = field(48, ge=1, help="Denoising steps per canvas at most (adaptive stopping may end "
                                                    "a row sooner).")
    t_min: float = field(0.4, ge=0, help="Temperature at the last step of the linear schedule.")
    t_max: float = field(0.8, ge=0, help="Temperature at the first step of the linear schedule (> t_min).")
    entropy_bound: float = field(0.1, gt=0, help="Entropy-bound acceptance: the lowest-entropy positions are "
                                                 "accepted while their entropy sum minus the largest is at most this.")
    stability_threshold: int = field(1, ge=0, help="Adaptive stopping: steps for which the argmax canvas must be "
                                                   "unchanged (0: no stability condition).")
    confidence_threshold: float = field(0.005, ge=0, help="Adaptive stopping: the mean entropy of the tempered "
                                                          "logits must be below this (0: no adaptive stopping, every "
                                                          "row takes max_denoising_steps; the stock generate refuses "
                                                          "0).")
    final_tokens: str = field("argmax", choices=("argmax", "sampled"),
                              help="What a canvas keeps at its row's last step: argmax (stock: the argmax of the last "
                                   "tempered logits) or sampled (the ids that step drew at every position, which "
                                   "the record then marks accepted there: a trajectory's every kept token is a draw "
                                   "of the policy, as RL's trajectory log-probability needs).")
    keep_logits: bool = field(False, help="Store each step's tempered logits in the record ([B, canvas, vocab] per "
                                          "step; by default they are recomputed from the record when needed).")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.t_max <= self.t_min:
            raise FieldError("t_max", f"must be above t_min ({self.t_min})")


@dataclass
class UniformStep:
    """One denoising step of a batch. ``canvas`` ``[B, C]``: the ids fed in; ``self_conditioned``: whether the
    previous step's tempered logits were fed too (False on a canvas's first step); ``sampled`` ``[B, C]``: the ids
    drawn; ``accepted`` ``[B, C]``: the positions that kept their draw (the rest were re-noised); ``stopped`` ``[B]``:
    rows stopped before this step (their canvas and logits are carried unchanged); ``done`` ``[B]``: rows finished in
    an earlier canvas (EOS). ``logits``: the tempered logits, only with ``keep_logits``."""

    canvas_index: int
    step: int  # counts down from max_denoising_steps to 1, as the temperature schedule reads it
    canvas: torch.Tensor
    self_conditioned: bool
    sampled: torch.Tensor
    accepted: torch.Tensor
    stopped: torch.Tensor
    done: torch.Tensor
    logits: torch.Tensor | None = None

    @property
    def active(self) -> torch.Tensor:
        """``[B]`` rows this step counts for (the stock ``decoder_forward_passes`` counts them)."""
        return ~(self.stopped | self.done)


@dataclass
class UniformRollout:
    """``sequences`` ``[B, L + n * C]``: prompt then the kept canvases (pad after EOS); ``forward_passes`` ``[B]``:
    the denoising steps each row was counted for (the stock ``decoder_forward_passes``)."""

    prompt_ids: torch.Tensor
    attention_mask: torch.Tensor
    sequences: torch.Tensor
    steps: list[UniformStep]
    forward_passes: torch.Tensor

    @property
    def completion_ids(self) -> torch.Tensor:
        return self.sequences[:, self.prompt_ids.shape[1]:]


class CanvasContext:
    """A batch's encoder KV cache and positions: the prompt takes positions 0..L-1 (the same for every row, as the
    stock model numbers them; padding is masked, not shifted), each canvas the next C; the decoder reads a canvas
    bidirectionally against the cache and never writes it."""

    def __init__(self, model: torch.nn.Module, prompt_ids: torch.Tensor, attention_mask: torch.Tensor):
        self.model = model
        # the two stacks (``DiffusionGemmaModel``), under a peft wrapper too, whose adapters sit inside them
        self.stacks = (model.get_base_model() if hasattr(model, "get_base_model") else model).model
        self.cache = DynamicCache(config=model.config.get_text_config(decoder=True))
        self.mask = attention_mask.bool()
        self.length = 0
        self._encode(prompt_ids)

    def _encode(self, ids: torch.Tensor) -> None:
        positions = torch.arange(self.length, self.length + ids.shape[1], device=ids.device)[None]
        self.stacks.encoder(input_ids=ids, attention_mask=self.mask, cache=self.cache, position_ids=positions)
        self.length += ids.shape[1]

    def append(self, canvas: torch.Tensor) -> None:
        """Encode a finished canvas into the cache."""
        self.mask = torch.nn.functional.pad(self.mask, (0, canvas.shape[1]), value=True)
        self._encode(canvas)

    def hidden(self, canvas: torch.Tensor, self_conditioning: torch.Tensor | None = None,
               self_conditioning_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The decoder's last hidden states ``[B, C, H]`` of ``canvas`` (before the LM head), for scorers that project
        them onto the vocabulary a chunk at a time; ``self_conditioning_mask`` ``[B]`` zeroes some rows' input."""
        width = canvas.shape[1]
        mask = torch.nn.functional.pad(self.mask, (0, width), value=True)
        positions = torch.arange(self.length, self.length + width, device=canvas.device)[None]
        return self.stacks.decoder(
            decoder_input_ids=canvas, cache=self.cache, self_conditioning_logits=self_conditioning,
            self_conditioning_mask=self_conditioning_mask, decoder_attention_mask=mask,
            decoder_position_ids=positions).last_hidden_state

    def decode(self, canvas: torch.Tensor, self_conditioning: torch.Tensor | None) -> torch.Tensor:
        """Raw (soft-capped, float32) logits ``[B, C, V]`` of ``canvas`` after everything encoded so far."""
        width = canvas.shape[1]
        mask = torch.nn.functional.pad(self.mask, (0, width), value=True)
        positions = torch.arange(self.length, self.length + width, device=canvas.device)[None]
        return self.model(decoder_input_ids=canvas, cache=self.cache, self_conditioning_logits=self_conditioning,
                          decoder_attention_mask=mask, decoder_position_ids=positions).logits

    @property
    def embedding_dtype(self) -> torch.dtype:
        return self.stacks.decoder.embed_tokens.weight.dtype


def temperature(cfg: UniformDecodeConfig, step: int) -> torch.Tensor:
    """The schedule's temperature at ``step`` as a float32 scalar, computed in float32 as the stock schedule does
    with its step tensor, so the tempered logits agree to the bit."""
    return cfg.t_min + (cfg.t_max - cfg.t_min) * (torch.tensor(step) / cfg.max_denoising_steps)


def entropy_bound_accept(entropy: torch.Tensor, bound: float) -> torch.Tensor:
    """``[B, C]`` bool: the lowest-entropy positions whose entropy sum, less the largest of them, is <= ``bound``."""
    ordered, order = torch.sort(entropy, dim=-1)
    keep = torch.cumsum(ordered, dim=-1) - ordered <= bound
    return torch.zeros_like(keep).scatter(-1, order, keep)


class _Stopping:
    """Adaptive stopping: argmax unchanged for ``stability_threshold`` steps and mean entropy below the threshold."""

    def __init__(self, cfg: UniformDecodeConfig, shape: tuple[int, int], device: torch.device):
        self.threshold = cfg.confidence_threshold
        self.history = torch.full((cfg.stability_threshold, *shape), -1, dtype=torch.long, device=device)

    def __call__(self, argmax: torch.Tensor, entropy: torch.Tensor) -> torch.Tensor:
        stable = (self.history == argmax[None]).all(dim=-1).all(dim=0)
        if len(self.history):
            self.history = torch.cat([self.history[1:], argmax[None]])
        return stable & (entropy.mean(dim=-1) < self.threshold)


Generators = torch.Generator | list[torch.Generator] | None


def _randint(vocab: int, shape: tuple[int, int], generator: Generators, device: torch.device,
             active: list[bool] | None = None) -> torch.Tensor:
    """Uniform ids ``[B, C]``. With one generator per row, only the ``active`` rows draw (the others get zeros, which
    nothing reads): a row then draws what it draws alone, where it stops as soon as it is stopped or finished."""
    if not isinstance(generator, list):
        return torch.randint(0, vocab, shape, generator=generator, device=device)
    return torch.cat([torch.randint(0, vocab, (1, shape[1]), generator=g, device=device) if a
                      else torch.zeros((1, shape[1]), dtype=torch.long, device=device)
                      for g, a in zip(generator, active or [True] * len(generator), strict=True)])


def _multinomial(probs: torch.Tensor, generator: Generators, active: list[bool] | None = None) -> torch.Tensor:
    """One draw per position of ``probs`` ``[B, C, V]``: ``[B, C]`` (``active``: as :func:`_randint`)."""
    if not isinstance(generator, list):
        return torch.multinomial(probs.flatten(0, 1), 1, generator=generator).view(probs.shape[:2])
    return torch.stack([torch.multinomial(p, 1, generator=g)[:, 0] if a
                        else torch.zeros(p.shape[0], dtype=torch.long, device=p.device)
                        for p, g, a in zip(probs, generator, active or [True] * len(generator), strict=True)])


@dataclass
class StepDraw:
    """What one denoising step drew from its tempered logits ``[B, C, V]``: the ids ``sampled``, the ``accepted``
    positions, the re-noising ids ``noise`` and the per-position ``entropy`` (all ``[B, C]``)."""

    logits: torch.Tensor
    sampled: torch.Tensor
    accepted: torch.Tensor
    noise: torch.Tensor
    entropy: torch.Tensor


def denoise_step(raw: torch.Tensor, cfg: UniformDecodeConfig, step: int, generator: Generators,
                 active: list[bool] | None = None) -> StepDraw:
    """One step of the stock rule on a canvas's raw logits ``[B, C, V]``: temper by the schedule at ``step``, draw one
    id per position from the softmax, accept by the entropy bound, draw the re-noising ids (the stock order of
    random numbers). The fixed batches' loop and the engine's slots (:mod:`~dllm_rl.sampling.uniform_engine`) both
    take their steps here."""
    logits = raw / temperature(cfg, step)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    sampled = _multinomial(probs, generator, active)
    del probs
    entropy = Categorical(logits=logits).entropy()
    accepted = entropy_bound_accept(entropy, cfg.entropy_bound)
    noise = _randint(logits.shape[-1], tuple(logits.shape[:2]), generator, logits.device, active)
    return StepDraw(logits, sampled, accepted, noise, entropy)


def _denoise_canvas(ctx: CanvasContext, cfg: UniformDecodeConfig, done: torch.Tensor, index: int,
                    generator: Generators, record: list[UniformStep]) -> tuple[torch.Tensor, torch.Tensor]:
    """One canvas: the argmax canvas kept and the steps each row was counted for."""
    batch, width = done.shape[0], ctx.model.config.canvas_length
    vocab, device = ctx.model.config.get_text_config().vocab_size, done.device
    per_row = isinstance(generator, list)  # then a row draws only while it counts (batch invariance)
    canvas = _randint(vocab, (batch, width), generator, device, (~done).tolist() if per_row else None)
    argmax, self_cond = canvas, None
    stopped = torch.zeros(batch, dtype=torch.bool, device=device)
    passes = torch.zeros(batch, dtype=torch.long, device=device)
    drawn, last = canvas, torch.full((batch,), -1, dtype=torch.long, device=device)  # final_tokens="sampled"
    stopping = _Stopping(cfg, (batch, width), device)
    for step in range(cfg.max_denoising_steps, 0, -1):
        passes += ~(stopped | done)
        draw = denoise_step(ctx.decode(canvas, self_cond), cfg, step, generator,
                            (~(stopped | done)).tolist() if per_row else None)
        logits = draw.logits
        record.append(UniformStep(index, step, canvas, self_cond is not None, draw.sampled, draw.accepted,
                                  stopped.clone(), done.clone(), logits if cfg.keep_logits else None))
        counted = ~(stopped | done)
        drawn, last = torch.where(counted[:, None], draw.sampled, drawn), torch.where(counted, len(record) - 1, last)
        new_argmax, canvas_next = logits.argmax(dim=-1), torch.where(draw.accepted, draw.sampled, draw.noise)
        if stopped.any():  # stopped rows carry their canvas, argmax and logits unchanged
            new_argmax = torch.where(stopped[:, None], argmax, new_argmax)
            canvas_next = torch.where(stopped[:, None], canvas, canvas_next)
            logits = torch.where(stopped[:, None, None], self_cond, logits)
        stopped = stopped | stopping(new_argmax, draw.entropy)  # (a stopped row's own entropy no longer matters)
        self_cond, canvas, argmax = logits.to(ctx.embedding_dtype), canvas_next, new_argmax
        if bool(stopped.all()):
            break
    if cfg.final_tokens == "argmax":
        return argmax, passes
    for s in last.unique().tolist():  # each row's last counted step accepts every position: its draws are kept
        if s >= 0:
            record[s].accepted = record[s].accepted | (last == s)[:, None]
    return drawn, passes


def finish_canvas(kept: torch.Tensor, done: torch.Tensor, eos: torch.Tensor | None,
                  pad: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """A kept canvas as it enters the sequence, and the rows finished after it: a row with an EOS in it is finished;
    rows finished before become all pad, and tokens after a row's first EOS become pad."""
    if eos is None:
        return kept, done
    ended = torch.isin(kept, eos).any(dim=-1)
    if pad is None or not bool((done | ended).any()):
        return kept, done | ended
    kept = kept.masked_fill(done[:, None], pad)
    is_eos = torch.isin(kept, eos)
    seen = is_eos.cumsum(dim=-1)
    return kept.masked_fill((seen > 0) & ~((seen == 1) & is_eos), pad), done | ended


@torch.no_grad()
def sample_uniform(model: torch.nn.Module, prompt_ids: torch.Tensor, cfg: UniformDecodeConfig | None = None,
                   attention_mask: torch.Tensor | None = None, generator: Generators = None,
                   eos_token_id: int | list[int] | None = None, pad_token_id: int | None = None) -> UniformRollout:
    """Decode ``prompt_ids`` ``[B, L]`` (left padding masked by ``attention_mask``) with a DiffusionGemma model (a
    :class:`~dllm_rl.models.diffusion_lm.DiffusionLM` or the stock module) canvas by canvas; see the module notes.
    ``eos_token_id`` / ``pad_token_id``: None finishes no row early / pads nothing, as the stock ``generate``."""
    cfg = cfg or UniformDecodeConfig()
    model = getattr(model, "hf_model", model)
    mask = torch.ones_like(prompt_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    ctx = CanvasContext(model, prompt_ids, mask)
    eos = None if eos_token_id is None else torch.tensor(eos_token_id, device=prompt_ids.device).reshape(-1)
    done = torch.zeros(prompt_ids.shape[0], dtype=torch.bool, device=prompt_ids.device)
    passes = torch.zeros_like(done, dtype=torch.long)
    pieces, steps = [prompt_ids], []
    for index in range(math.ceil(cfg.max_new_tokens / model.config.canvas_length)):
        if index:
            ctx.append(pieces[-1])
        kept, counted = _denoise_canvas(ctx, cfg, done, index, generator, steps)
        passes += counted
        kept, done = finish_canvas(kept, done, eos, pad_token_id)
        pieces.append(kept)
        if bool(done.all()):
            break
    return UniformRollout(prompt_ids, mask, torch.cat(pieces, dim=-1), steps, passes)
