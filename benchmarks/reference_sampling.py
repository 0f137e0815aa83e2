"""Our decoders beside the published reference samplers, on the shipped demo models, side by side in one run.

    .venv/bin/python benchmarks/reference_sampling.py --espo ESPO_CHECKOUT --trado DLLM_RL_CHECKOUT [--limit 500]
    .venv/bin/python benchmarks/reference_sampling.py --sweep   # our decoding settings: accuracy vs passes
    .venv/bin/python benchmarks/reference_sampling.py --espo ESPO_CHECKOUT --llada-model runs/cf/llada/model \
        --threshold 0.5   # a trained checkpoint of the demo's shape on both sides, ours at its own threshold

The references run from checkouts of their repositories (``ML-GSAI/ESPO`` and ``Gen-Verse/dLLM-RL``), read at run
time; the project ships none of their code:

* **ESPO** (LLaDA rollouts): ``ESPOTrainer.generate`` in ``espo/espo_trainer.py``. That module imports trl and
  wandb; only the three methods the sampler uses (``generate``, ``add_gumbel_noise``, ``get_num_transfer_tokens``)
  are compiled from the file (``ast``), so neither needs installing. It runs the RL rollout call (left-padded
  prompts with their attention mask, one token per step) on the LLaDA-shaped demo model at the demo's rollout shape
  (16 tokens, one block of 16, 16 steps), greedy, on ``--batch`` prompts at a time.
* **Fast-dLLM** (its LLaDA prefix and dual caches): ``generate_with_prefix_cache`` and ``generate_with_dual_cache``
  in ``llada/generate.py`` of ``NVlabs/Fast-dLLM`` (compiled from the file like ESPO's, without the module's
  imports). They decode one prompt at a time and call the model with legacy key/value tuples (and
  ``replace_position`` for the dual cache, their modified LLaDA's keyword); :class:`LegacyKV` gives our model that
  call. Greedy, threshold 0.9, on the LLaDA-shaped demo: one block of 16 (prefix cache) and blocks of 8 (dual).
* **TraDo** (SDAR block models): ``block_diffusion_generate`` in ``generate.py``, with the reference's evaluation
  settings (its ``sdar_eval.yaml``: temperature 1, ``low_confidence_dynamic`` at 0.9, 4 steps per block of 4)
  on the block demo model. It decodes one prompt at a time and calls the model with ``store_kv`` (the SDAR modeling
  code's own keyword); :class:`StoreKV` gives our model that call (``store_kv=False`` forwards against the
  ``DynamicCache`` and crops it back). It cannot decode greedily (it divides by the temperature), so the SDAR rows
  are sampled: accuracies carry a binomial sd (printed) and the same prompts are compared.

``--llada-model`` / ``--sdar-model`` put another checkpoint of the demo's shape on both sides (a model trained to
decode in fewer passes, ``configs/demo-sft-certainty-forcing*.yaml``), and ``--threshold`` sets our threshold rows'
threshold (0.9 by default; the references keep their own settings): the SDAR rows then add ours greedy at that
threshold, the decoding that ``dllm-rl eval --thresholds`` measures. As for ESPO, the "bf16" rows decode a
bfloat16 copy on both sides (what ``rollout.dtype: auto`` picks on a CPU with AMX/AVX512-BF16).

Both references call the same model object ours do, so the ratios compare decoders, not model code. Rounds interleave
the rows; the best time of ``--rounds`` is kept. Accuracy: the demo task's reward on the held-out puzzles (the first
``--limit``). ESPO's sampler uses CUDA autocast, which does nothing on a CPU: its CPU runs are float32 unless it is
handed a bfloat16 model (the "bf16" rows, where both sides decode a bfloat16 copy). Issue 37's goal: 3x the ESPO
reference at equal accuracy (within 1 point).
"""

from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import functools
import importlib.util
import math
import time
import types
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import dllm_rl
from dllm_rl.models import load_model, load_tokenizer
from dllm_rl.models.image_inputs import PromptEncoder
from dllm_rl.rl.rollout_copy import RolloutCopy
from dllm_rl.sampling import DecodeConfig, generate_batched
from dllm_rl.sampling.engine import EngineConfig
from dllm_rl.tasks import get_task

DEMO = Path(dllm_rl.__file__).parent / "assets" / "demo"


def compiled_functions(path: Path, wanted: set[str], holder: str | None = None) -> dict:
    """The functions ``wanted`` of the Python file ``path`` (methods of the class defining ``holder`` when given),
    compiled alone, without the module's imports (torch, ``F`` and ``np`` are given)."""
    tree = ast.parse(path.read_text())
    body = tree.body
    if holder is not None:
        body = next(node for node in tree.body if isinstance(node, ast.ClassDef) and any(
            isinstance(m, ast.FunctionDef) and m.name == holder for m in node.body)).body
    found = [m for m in body if isinstance(m, ast.FunctionDef) and m.name in wanted]
    if {m.name for m in found} != wanted:
        raise SystemExit(f"{path}: expected functions {sorted(wanted)}")
    namespace = {"torch": torch, "F": F, "np": np}
    module = ast.Module(body=found, type_ignores=[])
    exec(compile(ast.fix_missing_locations(module), str(path), "exec"), namespace)
    return {name: namespace[name] for name in wanted}


def fast_dllm_reference(checkout: Path) -> dict:
    """Fast-dLLM's LLaDA cache samplers and the helpers they call."""
    return compiled_functions(checkout / "llada" / "generate.py", {
        "generate_with_prefix_cache", "generate_with_dual_cache", "get_transfer_index", "get_num_transfer_tokens",
        "add_gumbel_noise"})


class LegacyKV:
    """Our full-attention model behind the call of Fast-dLLM's modified LLaDA: ``model(x, use_cache=True)`` returns
    ``past_key_values`` as per-layer ``(keys, values)`` tuples ``[B, H, T, D]``; ``model(x_part,
    past_key_values=tuples, use_cache=True)`` forwards ``x_part`` after the cached columns; with
    ``replace_position`` (a ``[B, T]`` bool over the whole canvas) the cache holds every column and ``x_part``
    replaces the marked ones. Attention is full, as LLaDA's."""

    def __init__(self, model):
        self.model, self.device = model, model.device

    def __call__(self, x, past_key_values=None, use_cache=False, replace_position=None):
        from transformers import DynamicCache

        cache, start, keep = DynamicCache(), 0, None
        if past_key_values is not None:
            start = past_key_values[0][0].shape[2]
            if replace_position is not None:  # the marked columns are replaced: cache the others (keys carry RoPE)
                cols = replace_position[0].nonzero().flatten()
                start, keep = int(cols[0]), ~replace_position[0]
            for i, (k, v) in enumerate(past_key_values):
                cache.update(k[:, :, keep] if keep is not None else k, v[:, :, keep] if keep is not None else v, i)
        width = x.shape[1]
        cached = cache.get_seq_length() if past_key_values is not None else 0
        bias = torch.zeros((x.shape[0], 1, width, cached + width), dtype=self.model.dtype)
        pos = torch.arange(start, start + width)[None].expand(x.shape[0], -1)
        out = self.model(x, attn_bias=bias, position_ids=pos, past_key_values=cache, use_cache=True)
        tuples = [(layer.keys, layer.values) for layer in cache.layers]
        return types.SimpleNamespace(logits=out.logits, past_key_values=tuples)


def espo_reference(checkout: Path):
    """ESPO's rollout sampler, compiled from its trainer file: an object whose ``generate`` is the published method."""
    methods = compiled_functions(checkout / "espo" / "espo_trainer.py",
                                 {"generate", "add_gumbel_noise", "get_num_transfer_tokens"}, holder="generate")
    sampler = type("Reference", (), methods)()
    sampler.args = types.SimpleNamespace(fp16=False)  # the trainer's autocast flag (CUDA only)
    return sampler


def trado_reference(checkout: Path):
    """TraDo's ``block_diffusion_generate`` (the module imports only torch and transformers)."""
    spec = importlib.util.spec_from_file_location("trado_reference_generate", checkout / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.block_diffusion_generate


class StoreKV:
    """Our model behind the SDAR modeling code's call: ``model(x, attention_mask=[1,1,q,k] 0/1, position_ids=,
    past_key_values=DynamicCache, use_cache=True, store_kv=)``; ``store_kv=False`` leaves the cache as it was."""

    def __init__(self, model):
        self.model, self.device = model, model.device

    def eval(self):
        self.model.eval()
        return self

    def __call__(self, input_ids, attention_mask, position_ids, past_key_values, use_cache=True, store_kv=False):
        before = past_key_values.get_seq_length()
        bias = torch.zeros(attention_mask.shape, dtype=self.model.dtype, device=self.device)
        bias = bias.masked_fill(attention_mask == 0, torch.finfo(bias.dtype).min)
        out = self.model(input_ids, attn_bias=bias, position_ids=position_ids, past_key_values=past_key_values,
                         use_cache=True)
        added = past_key_values.get_seq_length() - before
        if not store_kv and added:
            past_key_values.crop(-added)  # transformers' crop takes the count to remove, negated
        return out


def answer_text(tokenizer, row: list[int], eos: int) -> str:
    return tokenizer.decode(row[: row.index(eos)] if eos in row else row, skip_special_tokens=True)


class Bench:
    """A demo model and Countdown puzzles: the first ``limit`` held-out ones, or with ``last_of`` the last ``limit``
    of that file in the demo folder."""

    def __init__(self, name: str | Path, limit: int, seed: int, last_of: str | None = None):
        path = name if isinstance(name, Path) else DEMO / name  # a shipped demo's name, or a checkpoint's path
        self.model = load_model(path, device="cpu").eval()
        self.tokenizer = load_tokenizer(path)
        data = DEMO / (last_of or "countdown_heldout.jsonl")
        self.task = get_task("countdown", prompt_style="compact", data=str(data))
        self.examples = self.task.examples[-limit:] if last_of else self.task.examples[:limit]
        _, self.ids, _ = PromptEncoder(self.tokenizer).task_prompts(self.model, self.task, self.examples)
        self.seeds = [seed + i for i in range(len(self.ids))]

    @functools.cached_property
    def bf16(self):
        """A bfloat16 copy of the model (made when a row first asks for it)."""
        return copy.deepcopy(self.model).to(torch.bfloat16)

    @functools.cached_property
    def compiled_bf16(self):
        """A bfloat16 copy under ``torch.compile`` as ``rollout.compile`` makes it (``--compile``). KV-cached block
        decoding over several batches meets more guard variants (empty or filled cache, the prefill's keywords
        against a step's, the cache buffer growing or not, the last batch's size) than dynamo's default of 8 per
        frame, past which it falls back to eager frames; this process raises the limit so each compiles once."""
        import torch._dynamo.config as dynamo_config

        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 64)
        return RolloutCopy(self.model, torch.bfloat16, compile=True).model

    def accuracy(self, texts: list[str]) -> float:
        return 100 * self.task.metrics(self.task.score_examples(texts, self.examples))["accuracy"]

    def ours(self, config: DecodeConfig, batch: int, engine: EngineConfig | None = None, bf16: bool = False,
             compiled: bool = False):
        model = self.compiled_bf16 if compiled else self.bf16 if bf16 else self.model
        out = generate_batched(model, self.ids, config, seeds=self.seeds,
                               tokenizer=self.tokenizer, batch_size=batch, engine=engine)
        return list(out.texts), float(out.nfe.float().mean())


def espo_rows(bench: Bench, reference, batch: int, threshold: float = 0.9) -> dict:
    gen = 16
    eos, pad, mask = bench.model.eos_token_id, bench.model.pad_token_id, bench.model.mask_token_id
    bf16_model = bench.bf16  # the copy is made here, before any row is timed

    def reference_run(bf16: bool):
        model, texts = bf16_model if bf16 else bench.model, []
        for i in range(0, len(bench.ids), batch):
            chunk = bench.ids[i:i + batch]
            width = max(map(len, chunk))
            prompt = torch.full((len(chunk), width), pad)
            attention = torch.zeros((len(chunk), width), dtype=torch.long)
            for r, ids in enumerate(chunk):
                prompt[r, width - len(ids):] = torch.tensor(ids)
                attention[r, width - len(ids):] = 1
            out = reference.generate(model, attention, prompt, steps=gen, gen_length=gen, block_length=gen,
                                     temperature=0.0, mask_id=mask)
            texts += [answer_text(bench.tokenizer, row, eos) for row in out[:, width:].tolist()]
        return texts, float(gen)

    static = DecodeConfig(gen_length=gen, block_length=gen, temperature=0.0)
    dynamic = DecodeConfig(gen_length=gen, block_length=gen, temperature=0.0, threshold=threshold)
    slots = EngineConfig(slots=batch)
    return {
        "ESPO reference": lambda: reference_run(False),
        "ours, same decoding": lambda: bench.ours(static, batch),
        f"ours, threshold {threshold}": lambda: bench.ours(dynamic, batch),
        f"ours, threshold {threshold}, engine": lambda: bench.ours(dynamic, batch, slots),
        f"ours, threshold {threshold}, prefix cache": lambda: bench.ours(
            dataclasses.replace(dynamic, cache="prefix"), batch),
        "ESPO reference, bf16": lambda: reference_run(True),
        f"ours, threshold {threshold}, engine, bf16": lambda: bench.ours(dynamic, batch, slots, bf16=True),
    }


def fast_dllm_rows(bench: Bench, reference: dict, batch: int, cache: str) -> dict:
    """Fast-dLLM's sampler with ``cache`` (prefix: one block of 16; dual: blocks of 8) beside ours."""
    gen, mask, eos = 16, bench.model.mask_token_id, bench.model.eos_token_id
    block = gen if cache == "prefix" else 8
    wrapped = LegacyKV(bench.model)

    def reference_run():
        texts, nfes = [], []
        for ids in bench.ids:
            out, nfe = reference[f"generate_with_{cache}_cache"](
                wrapped, torch.tensor([ids]), steps=gen, gen_length=gen, block_length=block, temperature=0.0,
                mask_id=mask, threshold=0.9)
            texts.append(answer_text(bench.tokenizer, out[0, len(ids):].tolist(), eos))
            nfes.append(nfe)
        return texts, float(np.mean(nfes))

    config = DecodeConfig(gen_length=gen, block_length=block, temperature=0.0, threshold=0.9, cache=cache)
    return {
        "Fast-dLLM reference (one prompt at a time)": reference_run,
        "ours, one prompt at a time": lambda: bench.ours(config, 1),
        f"ours, engine {batch} slots": lambda: bench.ours(config, batch, EngineConfig(slots=batch)),
    }


def trado_rows(bench: Bench, reference, batch: int, threshold: float = 0.9, compiled: bool = False) -> dict:
    gen, block = 32, 4
    eos, mask = bench.model.eos_token_id, bench.model.mask_token_id
    wrapped = {False: StoreKV(bench.model), True: StoreKV(bench.bf16)}  # the copy is made here, before any timing

    def reference_run(bf16: bool = False):
        texts = []
        for seed, ids in zip(bench.seeds, bench.ids):
            torch.manual_seed(seed)  # the reference samples from the global generator
            prompt = {"input_ids": torch.tensor([ids])}
            out = reference(wrapped[bf16], prompt, mask, gen_length=gen, block_length=block, denoising_steps=block,
                            temperature=1.0, top_k=0, top_p=1.0, remasking_strategy="low_confidence_dynamic",
                            confidence_threshold=0.9, stopping_criteria_idx=[eos])
            texts.append(answer_text(bench.tokenizer, out[0, len(ids):len(ids) + gen].tolist(), eos))
        return texts, float("nan")

    config = DecodeConfig(gen_length=gen, block_length=block, temperature=1.0, threshold=0.9)
    greedy = DecodeConfig(gen_length=gen, block_length=block, temperature=0.0, threshold=threshold)
    rows = {
        "TraDo reference (one prompt at a time)": reference_run,
        "ours, one prompt at a time": lambda: bench.ours(config, 1),
        f"ours, batch {batch}": lambda: bench.ours(config, batch),
        f"ours, engine {batch} slots": lambda: bench.ours(config, batch, EngineConfig(slots=batch)),
    }
    if threshold != 0.9:  # ours greedy at the threshold asked for (the reference cannot decode greedily)
        rows[f"ours, greedy, threshold {threshold}, batch {batch}"] = lambda: bench.ours(greedy, batch)
    rows["TraDo reference, bf16"] = lambda: reference_run(True)
    rows[f"ours, batch {batch}, bf16"] = lambda: bench.ours(config, batch, bf16=True)
    if threshold != 0.9:
        rows[f"ours, greedy, threshold {threshold}, batch {batch}, bf16"] = lambda: bench.ours(greedy, batch, bf16=True)
    if compiled:  # compiled before any timing: the first decode compiles every variant (tens of seconds)
        bench.ours(greedy, batch, compiled=True)
        rows[f"ours, greedy, threshold {threshold}, batch {batch}, bf16, compiled"] = (
            lambda: bench.ours(greedy, batch, compiled=True))
    return rows


SWEEP = [(block, rule, threshold) for block in (16, 8, 4)
         for rule, thresholds in (("prob", (0.9, 0.8, 0.7)), ("margin", (0.9, 0.7, 0.6, 0.5, 0.4)))
         for threshold in thresholds]


def sweep(limit: int, batch: int, seed: int) -> None:
    """Issue 37's 3x at equal accuracy, without the reference: every forward of the LLaDA demo costs the same in
    ESPO's sampler and ours, so the speed-up at equal arithmetic is the pass count's (16 / mean NFE). Which of our
    decoding settings (decoding block, commit rule, threshold) needs the fewest passes within 1 point of the
    one-token-per-step decoding? Chosen on the last ``limit`` training puzzles, read on the held-out ones."""
    sets = {"chosen on": Bench("llada-countdown", limit, seed, last_of="countdown_train.jsonl"),
            "held-out": Bench("llada-countdown", limit, seed)}
    base = DecodeConfig(gen_length=16, block_length=16, temperature=0.0)
    settings = {"one token per step": base} | {
        f"block {b}, {rule} > {t}": dataclasses.replace(base, block_length=b, threshold=t, confidence=rule)
        for b, rule, t in SWEEP}
    print(f"\nour decoding settings, LLaDA-shaped demo, gen 16, greedy: accuracy and mean NFE on {limit} training "
          "puzzles (where the setting is chosen) and on the held-out ones")
    got = {}
    with torch.no_grad():
        for name, config in settings.items():
            got[name] = {k: (b.accuracy(texts), nfe) for k, b in sets.items()
                         for texts, nfe in [b.ours(config, batch)]}
            row = "  ".join(f"{k} {acc:5.1f}% NFE {nfe:5.2f}" for k, (acc, nfe) in got[name].items())
            print(f"  {name:<24} {row}", flush=True)
    floor = got["one token per step"]["chosen on"][0] - 1.0
    name = min((n for n in got if got[n]["chosen on"][0] >= floor), key=lambda n: got[n]["chosen on"][1])
    (acc, nfe), (acc0, _) = got[name]["held-out"], got["one token per step"]["held-out"]
    print(f"  fewest passes within 1 point on the training puzzles: {name}; held-out {acc:.1f}% against {acc0:.1f}%, "
          f"{16 / nfe:.2f}x fewer passes (issue 37's goal: 3x)")


def run(title: str, bench: Bench, rows: dict, rounds: int, sampled: bool) -> None:
    best, results = {}, {}
    with torch.no_grad():
        for _ in range(rounds):
            for name, fn in rows.items():
                t0 = time.perf_counter()
                results[name] = fn()
                best[name] = min(best.get(name, math.inf), time.perf_counter() - t0)
    base_name = next(iter(rows))
    base_texts = results[base_name][0]
    n = len(bench.examples)
    print(f"\n{title}: {n} held-out puzzles, best of {rounds} interleaved rounds")
    for name, (texts, nfe) in results.items():
        acc = bench.accuracy(texts)
        same = sum(a == b for a, b in zip(texts, base_texts))
        extra = f"sd {100 * math.sqrt(acc / 100 * (1 - acc / 100) / n):.1f}" if sampled else f"same answer {same}/{n}"
        nfe_text = "    -" if math.isnan(nfe) else f"{nfe:5.2f}"
        print(f"  {name:<40} {best[name]:7.2f} s  {best[base_name] / best[name]:5.2f}x  accuracy {acc:5.1f}% "
              f"({extra})  mean NFE {nfe_text}")


def label(path: Path) -> str:
    """A shipped demo model's name; another checkpoint's path as given."""
    return f"the {path.name} demo model" if path.parent == DEMO else str(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--espo", type=Path, help="a checkout of ML-GSAI/ESPO (skipped without it)")
    ap.add_argument("--trado", type=Path, help="a checkout of Gen-Verse/dLLM-RL (skipped without it)")
    ap.add_argument("--fast-dllm", type=Path, help="a checkout of NVlabs/Fast-dLLM (skipped without it)")
    ap.add_argument("--limit", type=int, default=500, help="held-out puzzles (default 500)")
    ap.add_argument("--batch", type=int, default=128, help="prompts per batch / engine slots (default 128, the demo's)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--llada-model", type=Path, default=DEMO / "llada-countdown",
                    help="the LLaDA-shaped checkpoint both sides decode (default: the shipped demo)")
    ap.add_argument("--sdar-model", type=Path, default=DEMO / "sdar-countdown",
                    help="the SDAR-shaped checkpoint both sides decode (default: the shipped demo)")
    ap.add_argument("--threshold", type=float, default=0.9, help="our threshold rows' threshold (default 0.9)")
    ap.add_argument("--compile", action="store_true",
                    help="add our greedy threshold row decoded by a compiled bfloat16 copy (rollout.compile) to the "
                         "TraDo rows; its compile runs before the timing")
    ap.add_argument("--sweep", action="store_true",
                    help="our decoding settings' accuracy and passes on the LLaDA demo (needs no reference)")
    args = ap.parse_args(argv)
    if args.espo is None and args.trado is None and args.fast_dllm is None and not args.sweep:
        ap.error("give --espo, --trado and/or --fast-dllm (checkouts of the reference repositories), or --sweep")
    torch.set_num_threads(args.threads)
    if args.sweep:
        sweep(args.limit, args.batch, args.seed)
    if args.espo is not None:
        bench = Bench(args.llada_model, args.limit, args.seed)
        run(f"ESPO reference generate vs ours, {label(args.llada_model)} (gen 16, one block, greedy)", bench,
            espo_rows(bench, espo_reference(args.espo), args.batch, args.threshold), args.rounds, sampled=False)
    if args.fast_dllm is not None:
        bench = Bench("llada-countdown", args.limit, args.seed)
        reference = fast_dllm_reference(args.fast_dllm)
        for cache, blocks in (("prefix", "one block of 16"), ("dual", "blocks of 8")):
            run(f"Fast-dLLM's {cache} cache vs ours, LLaDA-shaped demo model (gen 16 in {blocks}, greedy, threshold "
                "0.9)", bench, fast_dllm_rows(bench, reference, args.batch, cache), args.rounds, sampled=False)
    if args.trado is not None:
        bench = Bench(args.sdar_model, args.limit, args.seed)
        run(f"TraDo reference sampler vs ours, {label(args.sdar_model)} (gen 32, block 4, temperature 1, "
            "threshold 0.9)", bench, trado_rows(bench, trado_reference(args.trado), args.batch, args.threshold,
                                         args.compile),
            args.rounds, sampled=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
