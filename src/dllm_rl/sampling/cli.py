"""`dllm-rl generate MODEL_DIR --prompt TEXT`: decode completions; ``--trace`` writes each token's step."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from dllm_rl.config import describe, to_dict
from dllm_rl.config.flags import add_config_arguments, given_values
from dllm_rl.config.reference import help_config_argument
from dllm_rl.errors import UserError
from dllm_rl.jsonl import iter_jsonl, write_jsonl
from dllm_rl.sampling.config import DecodeConfig, GenerateOptions


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


def add_decode_arguments(parser: argparse.ArgumentParser, exclude: tuple[str, ...] = (), dest_prefix: str = "",
                         with_defaults: bool = True, title: str = "decoding (DecodeConfig)") -> None:
    """One ``--flag`` per :class:`DecodeConfig` field, with the field's help text (:func:`add_config_arguments`).

    ``dest_prefix`` namespaces the parsed values (``decode_gen_length``); with ``with_defaults=False``
    unset flags stay None, so a caller can tell which settings the user gave.
    """
    add_config_arguments(parser, DecodeConfig, exclude=exclude, dest_prefix=dest_prefix, with_defaults=with_defaults,
                         title=title)


def decode_config_from_args(args: argparse.Namespace) -> DecodeConfig:
    """The DecodeConfig of the flags; a ``--preset`` fills every field whose flag was left at its default."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(DecodeConfig)}
    if getattr(args, "preset", None):
        from dllm_rl.sampling.presets import preset

        defaults = {f.name: f.default for f in dataclasses.fields(DecodeConfig)}
        values.update({k: v for k, v in preset(args.preset).items() if values[k] == defaults[k]})
    return DecodeConfig(**values)


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
    from dllm_rl.config import FieldError
    from dllm_rl.models import load_model, load_tokenizer
    from dllm_rl.models.tokenizer import encode_prompts, require_chat_template
    from dllm_rl.sampling.batched import generate_batched
    from dllm_rl.sampling.inputs import decode_block_length
    from dllm_rl.threads import use_cpu_threads
    from dllm_rl.training.accel import resolve_device

    try:  # the flags are GenerateOptions' fields: its ranges checked here, before any loading
        GenerateOptions(**given_values(args, GenerateOptions))
    except FieldError as exc:
        raise UserError(f"--{exc.key.replace('_', '-')}: {exc.problem}") from None
    texts = list(args.prompt or [])
    if args.prompts_file:
        texts += read_prompts_file(args.prompts_file)
    if not texts:
        raise UserError("give at least one --prompt TEXT or --prompts-file F.jsonl")
    if args.chat_template and not args.chat:
        raise UserError("--chat-template FILE is the template of --chat; add --chat")
    config = decode_config_from_args(args)
    head = None
    if args.decoding == "learned":
        from dllm_rl.sampling.threshold_head import load_head

        head = load_head(args.model_dir)  # before the model: a checkpoint without one is refused at once
    model = load_model(args.model_dir, dtype=args.dtype, device=resolve_device(args.device, "--device"))
    use_cpu_threads(model.device)
    tokenizer = load_tokenizer(args.model_dir, mask_token_id=model.mask_token_id, noise=model.family.noise)
    texts, images = _with_images(texts, args.image or [], model.family.name)
    if args.chat_template:
        from dllm_rl.models.tokenizer import use_chat_template

        use_chat_template(tokenizer, args.chat_template)
    pim = None
    if images is not None:  # the tasks' and the server's way from text and images to prompt ids
        from dllm_rl.hub import resolve_model_path
        from dllm_rl.models.image_inputs import PromptEncoder

        if args.chat:
            require_chat_template(tokenizer, args.model_dir)
        shown = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                               tokenize=False) for t in texts] if args.chat else texts
        prompts, pim = PromptEncoder(tokenizer, resolve_model_path(args.model_dir)).encode(model, shown, images)
    else:
        prompts = encode_prompts(tokenizer, texts, args.chat, args.model_dir)
    t0 = time.perf_counter()
    engine = None
    if args.slots is not None:
        from dllm_rl.sampling.engine import EngineConfig

        engine = EngineConfig(slots=args.slots)
    rollout = generate_batched(model, prompts, config, tokenizer=tokenizer, batch_size=args.batch_size,
                               progress=args.progress, images=pim, engine=engine,
                               thresholds=_learned(head, model, prompts))
    elapsed = time.perf_counter() - t0
    for i, text in enumerate(rollout.texts):
        if len(texts) > 1:
            print(f"=== [{i}] {rollout.finish_reason[i]}, {int(rollout.nfe[i])} NFE")
        print(text)
    tokens = int(rollout.decoded_tokens().sum())
    print(f"generate: {len(texts)} prompt(s), {tokens} tokens, {int(rollout.nfe.sum())} NFE, "
          f"{elapsed:.2f}s ({tokens / max(elapsed, 1e-9):.1f} tok/s)", file=sys.stderr)
    if args.trace:
        out = Path(args.trace)
        out.parent.mkdir(parents=True, exist_ok=True)
        block = decode_block_length(model, config)
        write_jsonl(out, trace_records(rollout, texts, config, tokenizer, block))
        print(f"generate: trace written to {out}", file=sys.stderr)
    return 0


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
    p = sub.add_parser("generate", help="decode completions with a diffusion LM (optionally write the trace)",
                       description="Decode completions; --trace writes each token's unmasking step as JSONL.")
    p.add_argument("model_dir", help="checkpoint directory in a published layout, with its tokenizer, "
                   "or a hub id org/name[@revision]")
    p.add_argument("--prompt", action="append", help="prompt text (repeatable)")
    p.add_argument("--prompts-file", help="JSONL file, one {\"prompt\": TEXT} per line")
    p.add_argument("--image", action="append", metavar="FILE", help="an image for the prompts' <image> "
                   "placeholders, in order (repeatable; one prompt without a placeholder gets the images at its "
                   "start); llada_v and mmada models, read as the image tasks read theirs")
    p.add_argument("--trace", help="write one JSON object per prompt (tokens, steps, confidence, nfe) here")
    add_config_arguments(p, GenerateOptions, title="generate (GenerateOptions)")
    add_decode_arguments(p)
    help_config_argument(p, lambda: ["generate (one --flag per key: --batch-size, --slots, ...):"]
                         + describe(GenerateOptions) + ["", "decoding (one --flag per key: --gen-length, "
                                                            "--threshold, ...):"] + describe(DecodeConfig))
    p.set_defaults(func=generate_command)
