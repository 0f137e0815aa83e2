"""`dllm-rl generate [MODEL_DIR | CONFIG.yaml] [key=value ...] [--key value ...]`: decode completions
(:class:`~dllm_rl.sampling.config.GenerateConfig`; ``--prompt TEXT`` repeatable); ``--trace`` writes each token's
step."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from dllm_rl.config import to_dict
from dllm_rl.errors import UserError
from dllm_rl.jsonl import iter_jsonl, write_jsonl
from dllm_rl.sampling.config import DecodeConfig


def read_prompts_file(path: str | Path) -> list[str]:
    """Prompts from a JSONL file: one object per line with a ``prompt`` string (or a bare JSON string)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: prompts file not found")
    prompts = []
    for lineno, row in iter_jsonl(path, torn_last_line="error", objects=False):
        text = row.get("prompt") if isinstance(row, dict) else row
        if not isinstance(text, str):
            raise UserError(f"{path}:{lineno}: expected an object with a string 'prompt' field (or a JSON string)")
        prompts.append(text)
    if not prompts:
        raise UserError(f"{path}: no prompts")
    return prompts


def load_model_command(cls: type, args: argparse.Namespace, usage: str):
    """The config of a command that loads one checkpoint (``generate``, ``serve``: a ``model:`` section whose
    ``model.path`` a bare first word sets, :func:`~dllm_rl.config.command.load_command`); no model is one line
    naming ``usage``."""
    from dllm_rl.config.command import given_flags, load_command

    cfg = load_command(cls, args, usage, positional="model.path") if args.words or given_flags(args) else None
    if cfg is None or not cfg.model.path:
        raise UserError(f"give the model: {usage} (or model.path=DIR, or a config file that names it)")
    return cfg


def trace_records(rollout, prompts: list[str], config: DecodeConfig, tokenizer, block: int) -> list[dict]:
    """One JSON-ready dict per prompt: text and token ids of the prompt, token ids/strings, step and confidence
    per generated token."""
    records = []
    for i in range(len(rollout)):
        if rollout.uniform is not None:
            records.append(_uniform_record(rollout, i, prompts[i], config, tokenizer, block))
            continue
        generated = rollout.step_map[i] >= 0
        ids = rollout.completion_ids[i][generated].tolist()
        records.append({
            "prompt": prompts[i],
            "prompt_ids": rollout.prompt_ids[i][rollout.prompt_mask[i].bool()].tolist(),
            "completion": rollout.texts[i] if rollout.texts is not None else None,
            "token_ids": ids,
            "tokens": tokenizer.convert_ids_to_tokens(ids),
            "steps": rollout.step_map[i][generated].tolist(),
            "confidence": [round(c, 6) for c in rollout.confidence[i][generated].tolist()],
            "answer_length": int(rollout.completion_mask[i].sum()),
            "nfe": int(rollout.nfe[i]),
            "finish_reason": rollout.finish_reason[i],
            "decode_config": {**to_dict(config), "decode_block_length": block},
        })
    return records


def _uniform_record(rollout, i: int, prompt: str, config: DecodeConfig, tokenizer, canvas: int) -> dict:
    """A uniform-state rollout's trace record: every completion position (its step_map: the counted step that last
    accepted the kept token, -1 none) and the steps themselves (``uniform_steps``, what ``dllm-rl trace`` draws)."""
    from dllm_rl.sampling.uniform_rollout import uniform_steps

    ids = rollout.completion_ids[i].tolist()
    return {
        "prompt": prompt, "prompt_ids": rollout.prompt_ids[i][rollout.prompt_mask[i].bool()].tolist(),
        "completion": rollout.texts[i] if rollout.texts is not None else None, "token_ids": ids,
        "tokens": tokenizer.convert_ids_to_tokens(ids), "steps": rollout.step_map[i].tolist(),
        "answer_length": int(rollout.completion_mask[i].sum()), "nfe": int(rollout.nfe[i]),
        "finish_reason": rollout.finish_reason[i], "block_length": canvas,
        "uniform_steps": uniform_steps(rollout.uniform, i, lambda t: tokenizer.convert_ids_to_tokens(int(t)) or ""),
        "decode_config": {**to_dict(config), "decode_block_length": canvas},
    }


def generate_command(args: argparse.Namespace) -> int:
    from dllm_rl.sampling.batched import generate_batched
    from dllm_rl.sampling.config import GenerateConfig
    from dllm_rl.sampling.inputs import decode_block_length

    cfg = load_model_command(GenerateConfig, args, "dllm-rl generate MODEL_DIR --prompt TEXT")
    texts = list(cfg.prompt)
    if cfg.prompts_file:
        texts += read_prompts_file(cfg.prompts_file)
    if not texts:
        raise UserError("give at least one --prompt TEXT or --prompts-file F.jsonl")
    if cfg.chat_template and not cfg.chat:
        raise UserError("--chat-template FILE is the template of --chat; add --chat")
    config, path = cfg.decode.decode_config(), cfg.model.path
    head = None
    if cfg.decoding == "learned":
        from dllm_rl.sampling.threshold_head import load_head

        head = load_head(path)  # before the model: a checkpoint without one is refused at once
    model, tokenizer = _load(cfg)
    texts, images = _with_images(texts, cfg.image, model.family.name)
    prompts, pim = _encode(cfg, model, tokenizer, texts, images)
    t0 = time.perf_counter()
    engine = None
    if cfg.slots is not None:
        from dllm_rl.sampling.engine import EngineConfig

        engine = EngineConfig(slots=cfg.slots)
    rollout = generate_batched(model, prompts, config, tokenizer=tokenizer, batch_size=cfg.batch_size,
                               progress=cfg.progress, images=pim, engine=engine,
                               thresholds=_learned(head, model, prompts))
    elapsed = time.perf_counter() - t0
    for i, text in enumerate(rollout.texts):
        if len(texts) > 1:
            print(f"=== [{i}] {rollout.finish_reason[i]}, {int(rollout.nfe[i])} NFE")
        print(text)
    tokens = int(rollout.decoded_tokens().sum())
    print(f"generate: {len(texts)} prompt(s), {tokens} tokens, {int(rollout.nfe.sum())} NFE, "
          f"{elapsed:.2f}s ({tokens / max(elapsed, 1e-9):.1f} tok/s)", file=sys.stderr)
    if cfg.trace:
        out = Path(cfg.trace)
        out.parent.mkdir(parents=True, exist_ok=True)
        block = decode_block_length(model, config)
        write_jsonl(out, trace_records(rollout, texts, config, tokenizer, block))
        print(f"generate: trace written to {out}", file=sys.stderr)
    return 0


def _load(cfg):
    """The ``model:`` section's model (device and dtype resolved: auto is CUDA in bfloat16 when there is one) and its
    tokenizer (``model.tokenizer``, else the checkpoint's), with ``chat_template``'s file when given."""
    from dllm_rl.models import load_model, load_tokenizer
    from dllm_rl.models.devices import resolve_device, resolve_eval_dtype
    from dllm_rl.threads import use_cpu_threads

    device = resolve_device(cfg.model.device, "model.device")
    model = load_model(cfg.model.path, dtype=resolve_eval_dtype(cfg.model.dtype, device), device=device,
                       tokenizer_dir=cfg.model.tokenizer)
    use_cpu_threads(model.device)
    tokenizer = load_tokenizer(cfg.model.tokenizer or cfg.model.path, mask_token_id=model.mask_token_id,
                               noise=model.family.noise)
    if cfg.chat_template:
        from dllm_rl.models.tokenizer import use_chat_template

        use_chat_template(tokenizer, cfg.chat_template)
    return model, tokenizer


def _encode(cfg, model, tokenizer, texts: list[str], images: list[list] | None) -> tuple[list[list[int]], list | None]:
    """The prompts' ids (through the chat template with ``chat``) and, with images, their image inputs: the tasks'
    and the server's way from text and images to prompt ids."""
    from dllm_rl.models.tokenizer import encode_prompts, require_chat_template

    if images is None:
        return encode_prompts(tokenizer, texts, cfg.chat, cfg.model.path), None
    from dllm_rl.hub import resolve_model_path
    from dllm_rl.models.image_inputs import PromptEncoder

    if cfg.chat:
        require_chat_template(tokenizer, cfg.model.path)
    shown = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                           tokenize=False) for t in texts] if cfg.chat else texts
    return PromptEncoder(tokenizer, resolve_model_path(cfg.model.path)).encode(model, shown, images)


def _learned(head, model, prompts: list[list[int]]) -> list[float] | None:
    """Each prompt's learned threshold (the head's mean; None without a head)."""
    if head is None:
        return None
    from dllm_rl.sampling.threshold_head import prompt_features, prompt_thresholds

    return prompt_thresholds(head, prompt_features(model, prompts))[0]


def _with_images(texts: list[str], paths: list[str], family: str) -> tuple[list[str], list[list] | None]:
    """``--image`` files handed to the prompts' ``<image>`` placeholders (one prompt without any: one per image at
    its start), through the tasks' bounded loader; None without images. A text-only model, a count that does not
    match or more images than the family takes in a prompt: one line."""
    if not paths:
        return texts, None
    from dllm_rl.models.image_inputs import max_images, refuse_images
    from dllm_rl.tasks.images import placeholder_images

    refuse_images(family, "--image was given")
    texts, images = placeholder_images(texts, paths)
    most = max_images(family)
    if most is not None and max(map(len, images)) > most:
        raise UserError(f"--image: a prompt has {max(map(len, images))} images, but a {family} model takes at most "
                        f"{most} per prompt")
    return texts, images


def register(sub) -> None:
    from dllm_rl.config import describe
    from dllm_rl.config.command import add_command_arguments
    from dllm_rl.config.reference import help_config_argument
    from dllm_rl.sampling.config import GenerateConfig

    p = sub.add_parser("generate", help="decode completions with a diffusion LM (optionally write the trace)",
                       description="Decode completions; --trace writes each token's unmasking step as JSONL.")
    add_command_arguments(p, GenerateConfig, positional="model.path", words_help="the checkpoint (a directory in a "
                          "published layout, with its tokenizer, or a hub id org/name[@revision]) or a YAML config, "
                          "then key=value overrides, e.g. decode.gen_length=64; every key is also a --flag")
    help_config_argument(p, lambda: describe(GenerateConfig, defaults=GenerateConfig()))
    p.set_defaults(func=generate_command)
