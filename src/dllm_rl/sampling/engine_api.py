"""What both continuous-batching engines share with their callers: the scheduling settings
(:class:`EngineConfig`), a finished request (:class:`Completion`), the base model's adapter name, and the queue
bookkeeping of waiting and running requests (:class:`RequestSlots`). The masked engine
(:mod:`dllm_rl.sampling.engine`) and the uniform-state one (:mod:`dllm_rl.sampling.uniform_engine`) both import
these, so neither imports the other for them."""

from __future__ import annotations

from dataclasses import dataclass

from dllm_rl.config import Checked, field
from dllm_rl.sampling.logprobs import TokenLogprobs
from dllm_rl.sampling.rollout import Rollout

#: ``add_request(adapter=BASE_MODEL)``: the base model, LoRA adapters off (``peft``'s name in a mixed-adapter batch).
BASE_MODEL = "__base__"


@dataclass
class EngineConfig(Checked):
    """How the continuous-batching engine schedules (the decoding itself is a :class:`DecodeConfig`)."""

    slots: int = field(
        32, ge=1,
        help="Sequences decoded at once (the batch of every step). A finished sequence's slot goes to the next "
        "waiting request at once; memory grows with the slots, never with the queue.",
    )
    early_stop: bool = field(
        False,
        help="Stop a sequence as soon as its answer is decided (a committed EOS with every slot before it committed) "
        "and fill its masked slots with EOS (not a partial decode's, whose later blocks stay masked). Same answers, "
        "fewer forward passes; the tokens after the first EOS and the NFE differ from the published samplers, hence "
        "off by default. A request without stop_on_eos is never stopped early (it decodes its whole length, as "
        "generate does).",
    )
    max_positions: int | None = field(
        None, ge=1,
        help="The positions a request may take (prompt plus completion slots); a request needing more is refused. "
        "It bounds memory: a block model's KV cache (or a full-attention model's Fast-dLLM prefix / dual cache) is "
        "slots x max_positions columns, allocated at the first step (without it, grown to the longest request so "
        "far), and a full-attention model without a cache pads every running row to the longest request. None: the "
        "model's context.",
    )


@dataclass
class Completion:
    """A finished request: its id (from :meth:`Engine.add_request`), its one-row :class:`Rollout` and, if it asked,
    its tokens' log-probabilities at commit."""

    request_id: int
    rollout: Rollout
    logprobs: TokenLogprobs | None = None


class RequestSlots:
    """What an engine's ``waiting`` queue and its ``running`` slots (a request, or None for a free slot) answer
    alike for both engines."""

    waiting: list
    running: list

    def has_unfinished(self) -> bool:
        return bool(self.waiting) or any(s is not None for s in self.running)

    def abort(self, request_id: int) -> bool:
        """Drop a waiting or running request (a client gone); its slot is free for the next step. False if unknown."""
        for seq in list(self.waiting):
            if seq.request_id == request_id:
                self.waiting.remove(seq)
                return True
        for i, seq in enumerate(self.running):
            if seq is not None and seq.request_id == request_id:
                self.running[i] = None
                return True
        return False


__all__ = ["BASE_MODEL", "Completion", "EngineConfig", "RequestSlots"]
