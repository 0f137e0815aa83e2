"""Each family's published sampler defaults as named decoding presets (``dllm-rl generate --preset NAME``).

Block models always decode in their own block with the exact block KV cache (tokens equal to the uncached
path), so a preset sets the schedule only:

* ``llada2``: LLaDA2.0 / 2.1 sampler, block 32 (the family's), dynamic threshold 0.95. LLaDA2.1's editing of
  committed tokens is not implemented.
* ``fast_dllm_v2``: Fast-dLLM v2, block 32 (``bd_size``), sub-blocks of 8 finished left to right, threshold 0.9
  within the current sub-block; each block's first token reads the previous block's last logit (the shifted
  logits through the cache, as Dream's).
* ``sdar``: SDAR / TraDo and SDAR-30B-A3B, block 4, dynamic threshold 0.9 (``low_confidence_dynamic``).
* ``diffusion_gemma``: DiffusionGemma's stock generation config (uniform-state diffusion): 256 new tokens (one canvas
  of the published model; the canvas itself is the model's ``canvas_length``), at most 48 denoising steps per canvas,
  temperature 0.8 -> 0.4, entropy bound 0.1, adaptive stopping after 1 stable step below mean entropy 0.005.
"""

from __future__ import annotations

from typing import Any

from dllm_rl.errors import UserError

PRESETS: dict[str, dict[str, Any]] = {
    "llada2": {"threshold": 0.95, "steps": None, "temperature": 0.0},
    "fast_dllm_v2": {"threshold": 0.9, "steps": None, "temperature": 0.0, "sub_block": 8},
    "sdar": {"threshold": 0.9, "steps": None, "temperature": 0.0},
    "diffusion_gemma": {"gen_length": 256, "max_denoising_steps": 48, "t_min": 0.4, "t_max": 0.8, "entropy_bound": 0.1,
                        "stability_threshold": 1, "confidence_threshold": 0.005},
}


def preset(name: str) -> dict[str, Any]:
    """The DecodeConfig values of preset ``name``; an unknown name lists the presets."""
    if name not in PRESETS:
        raise UserError(f"unknown decoding preset {name!r}; choose one of {', '.join(PRESETS)}")
    return dict(PRESETS[name])
