"""``decoding: learned`` in ``dllm-rl eval``: each item decoded at the threshold the checkpoint's threshold head
gives its prompt (DiFFPO's per-prompt threshold, :mod:`dllm_rl.sampling.threshold_head`), as ``dllm-rl generate
--decoding learned`` decodes it: the head's mean (no draw), one threshold per item, the same for each of its samples
and every learned setting, written into the item's records (``threshold``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dllm_rl.errors import UserError


def learned_head(decodes: Mapping[str, Any], decoding: str, model_dir: Path, family: Any, image_task: bool):
    """The checkpoint's threshold head when a setting of ``decodes`` (name -> ResolvedSetting) decodes learned, else
    None; refused in one line naming the key that asked for it (eval's ``decoding``, else the setting's) where it
    cannot apply: a uniform-state family, an image task, or a checkpoint saved without one."""
    from dllm_rl.sampling.threshold_head import load_head

    learned = [name for name, rs in decodes.items() if rs.learned]
    if not learned:
        return None
    asked = "decoding=learned" if decoding == "learned" else f"setting {learned[0]!r}: decoding=learned"
    if family.noise == "uniform":
        raise UserError(f"{asked}: {family.name} is uniform-state diffusion, whose sampler has no confidence "
                        "threshold; decode it with its own schedule")
    if image_task:
        raise UserError(f"{asked}: the threshold head reads a text prompt's features; an image task's prompts are "
                        "not read without their images")
    return load_head(model_dir, asked)


def head_meta(head) -> dict[str, Any]:
    """What meta.json pins of the head besides its weights (which the model fingerprint hashes)."""
    return {"t_min": head.t_min, "t_max": head.t_max, "sigma": head.sigma}


class LearnedThresholds:
    """Each item's learned threshold, from its prompt ids; an item's prompt features are computed once."""

    def __init__(self, head, model):
        self.head, self.model = head, model
        self.cache: dict[int, float] = {}

    def __call__(self, items: list[int], ids: list[list[int]]) -> list[float]:
        from dllm_rl.sampling.threshold_head import prompt_features, prompt_thresholds

        todo = sorted({i: p for i, p in zip(items, ids) if i not in self.cache}.items())
        if todo:
            taus, _ = prompt_thresholds(self.head, prompt_features(self.model, [p for _, p in todo]))
            self.cache.update(zip([i for i, _ in todo], taus))
        return [self.cache[i] for i in items]


__all__ = ["LearnedThresholds", "head_meta", "learned_head"]
