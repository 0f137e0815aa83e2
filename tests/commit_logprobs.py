"""Log-probabilities at commit recomputed independently of the engine (its tests and the server's): ``generate``'s
step records give the state before each step; forwarding it alone and taking the log-softmax at a slot gives the
value the engine must report for the token committed there."""

from __future__ import annotations

import torch

from dllm_rl.sampling import DecodeConfig, generate
from dllm_rl.sampling.confidence import filter_logits


def recomputed(model, prompt: list[int], config: DecodeConfig, seed: int):
    """``(tokens, logprob per slot, top-3 per slot)`` of ``generate``'s decode of ``prompt``: for each committed
    slot, the state before its commit step rebuilt from the step records, forwarded on its own, and the
    log-softmax of its (temperature-scaled, filtered) logits there. A full-attention model: canvas = prompt +
    completion."""
    roll = generate(model, [prompt], config, seeds=[seed], record_steps="sampled")
    tokens, steps = roll.completion_ids[0], roll.step_map[0]
    prompt_t = torch.tensor(prompt)
    values, tops = [], []
    for j, s in enumerate(steps.tolist()):
        if s < 0:
            values.append(None)
            tops.append([])
            continue
        state = torch.where(roll.step_masked[0, s], model.mask_token_id, roll.step_tokens[0, s].long())
        with torch.no_grad():
            logits = model(torch.cat([prompt_t, state])[None]).logits[0, len(prompt) + j].double()
        if config.temperature > 0:
            logits = filter_logits(logits / config.temperature, config.top_k, config.top_p)
        lsm = torch.log_softmax(logits, -1)
        values.append(float(lsm[tokens[j]]))
        v, i = torch.topk(lsm, 3)
        tops.append([(int(a), float(b)) for a, b in zip(i, v) if b != float("-inf")])
    return tokens.tolist(), values, tops
