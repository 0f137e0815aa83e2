"""`dllm-rl serve [MODEL_DIR | CONFIG.yaml] [key=value ...] [--key value ...]` (``--host``, ``--port``, ...;
:class:`~dllm_rl.serve.config.ServeConfig`): the OpenAI-compatible server under uvicorn."""

from __future__ import annotations

import argparse
import os
import sys

from dllm_rl.errors import UserError
from dllm_rl.serve.config import API_KEY_ENV, ServeConfig, ServeLimits


def parse_loras(values: list[str] | None) -> dict[str, str]:
    """``--lora NAME=DIR`` flags -> {name: folder}; a malformed or repeated name is a one-line error."""
    out: dict[str, str] = {}
    for value in values or []:
        name, sep, folder = value.partition("=")
        if not sep or not name or not folder:
            raise UserError(f"--lora: {value!r} is not NAME=DIR (a LoRA adapter folder served as model NAME)")
        if name in out:
            raise UserError(f"--lora: the name {name!r} is given twice")
        out[name] = folder
    return out


def api_key_from(flag: str | None, environ=os.environ) -> str | None:
    """The API key: ``--api-key``, else ``$DLLM_RL_API_KEY``, else None (an open server). A key option given empty
    (``--api-key "$KEY"`` with KEY unset) or unusable is a one-line error, never an open server."""
    from dllm_rl.serve.app import api_key_problem

    for source, key, leave in (("--api-key", flag, "leave --api-key out"),
                               (f"${API_KEY_ENV}", environ.get(API_KEY_ENV), f"unset {API_KEY_ENV}")):
        if key is not None:
            if problem := api_key_problem(key):
                raise UserError(f"{source}: {problem}; give another key, or {leave} to serve without one")
            return key
    return None


def build_server(model_dir: str, decode, limits: ServeLimits, device: str = "cpu", dtype: str = "float32",
                 loras: dict[str, str] | None = None, api_key: str | None = None,
                 served_names: list[str] | None = None, chat_template: str | None = None,
                 tokenizer_dir: str | None = None):
    """Load the model on ``device`` (auto: CUDA when there is one) in ``dtype`` (auto: bfloat16 on CUDA, else
    float32), its tokenizer (``tokenizer_dir``'s, default the checkpoint's; with the Jinja template file
    ``chat_template`` when given), MMaDA's VQ encoder and the LoRA adapters ``loras`` (name -> adapter folder) and
    wrap them in a :class:`~dllm_rl.serve.app.Server` (engines not started). ``served_names``
    (``--served-model-name``): the names the base model answers to, the first one reported (default: the checkpoint
    folder's name)."""
    from pathlib import Path

    from dllm_rl.hub import resolve_model_path
    from dllm_rl.models import load_model, load_tokenizer
    from dllm_rl.models.devices import resolve_device, resolve_eval_dtype
    from dllm_rl.models.image_inputs import PromptEncoder
    from dllm_rl.models.tokenizer import use_chat_template
    from dllm_rl.serve.app import Server
    from dllm_rl.threads import use_cpu_threads
    from dllm_rl.training.lora import load_named_adapters, mixed_batch_refusal

    root = Path(model_dir).name or str(model_dir)
    names = list(dict.fromkeys(served_names or [root]))
    if not all(n.strip() for n in names):
        raise UserError("--served-model-name: a name is empty; give names a request's \"model\" can carry")
    for name in names:
        if name in (loras or {}):
            raise UserError(f"--lora: {name!r} is the base model's name; give the adapter another")
    dev = resolve_device(device, "model.device")
    model = load_model(model_dir, dtype=resolve_eval_dtype(dtype, dev), device=dev, tokenizer_dir=tokenizer_dir)
    use_cpu_threads(model.device)
    tokenizer = load_tokenizer(tokenizer_dir or model_dir, mask_token_id=model.mask_token_id,
                               noise=model.family.noise)
    if chat_template is not None:
        use_chat_template(tokenizer, chat_template)
    encoder = PromptEncoder(tokenizer, resolve_model_path(model_dir))
    if model.family.name == "mmada":
        encoder.vq(model.device)  # its images' VQ encoder, loaded now: a missing one stops the start, not a request
    if loras:
        load_named_adapters(model, loras)
        for adapter in loras:
            if (refusal := mixed_batch_refusal(model, adapter)) is not None:
                raise UserError(f"--lora: {refusal}")
    roots = {n: root for n in names} | {a: Path(folder).name for a, folder in (loras or {}).items()}
    return Server(model, tokenizer, decode, limits, names[0], tuple(loras or ()), api_key, tuple(names[1:]), roots,
                  encoder)


def serve_command(args: argparse.Namespace) -> int:
    try:
        import dllm_rl.serve.app  # noqa: F401  (FastAPI)
        from dllm_rl.serve.listen import GracefulServer, bind
    except ImportError as err:
        raise UserError(f"dllm-rl serve needs FastAPI and uvicorn ({err.name} is missing): pip install "
                        "'dllm-rl[serve]'") from None
    from dllm_rl.sampling.cli import load_model_command

    cfg = load_model_command(ServeConfig, args, "dllm-rl serve MODEL_DIR")
    api_key, loras, decode = api_key_from(cfg.api_key), parse_loras(cfg.lora), cfg.decode.decode_config()
    sock = bind(cfg.host, cfg.port)  # before the model loads: a port in use is refused at once
    try:
        server = build_server(cfg.model.path, decode, cfg, cfg.model.device, cfg.model.dtype, loras, api_key,
                              cfg.served_model_name, cfg.chat_template, cfg.model.tokenizer)
        served = f"; LoRA adapters (the request's \"model\"): {', '.join(server.adapters)}" if server.adapters else ""
        served += ("; /v1 requests need the API key" if server.api_key
                   else f"; the server is open (no API key; --api-key or ${API_KEY_ENV} sets one)")
        host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
        print(f"serve: {server.name} on http://{host}:{sock.getsockname()[1]} ({cfg.slots} slots, decoding in "
              f"blocks of {server.block}{served}); POST /v1/completions, /v1/chat/completions", file=sys.stderr,
              flush=True)
        GracefulServer(server, cfg.log_level).run(sockets=[sock])
    finally:
        sock.close()
    return 0


def register(sub) -> None:
    from dllm_rl.config import describe
    from dllm_rl.config.command import add_command_arguments
    from dllm_rl.config.reference import help_config_argument

    p = sub.add_parser("serve", help="serve a model over HTTP (OpenAI-compatible, continuous batching)",
                       description="An OpenAI-compatible HTTP server: POST /v1/completions and /v1/chat/completions "
                       "(streaming with \"stream\": true), GET /health and /metrics. Requests join the engine's "
                       "continuous batch; each may set temperature, top_p, top_k, threshold, steps, seed and "
                       "max_tokens. The decode keys are the defaults of every request.")
    add_command_arguments(p, ServeConfig, positional="model.path", words_help="the checkpoint (a directory in a "
                          "published layout, with its tokenizer, or a hub id org/name[@revision]) or a YAML config, "
                          "then key=value overrides, e.g. slots=8; every key is also a --flag")
    help_config_argument(p, lambda: describe(ServeConfig, defaults=ServeConfig()))
    p.set_defaults(func=serve_command)
