"""`dllm-rl serve MODEL [--host 127.0.0.1] [--port 8000]`: the OpenAI-compatible server under uvicorn."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import typing

from dllm_rl.config import FieldError, describe
from dllm_rl.config.reference import help_config_argument
from dllm_rl.errors import UserError
from dllm_rl.serve.config import ServeConfig

API_KEY_ENV = "DLLM_RL_API_KEY"  # the --api-key default (keeps the key out of the process list)


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


def port_number(text: str) -> int:
    """``--port``: 0 to 65535 (0: any free port, the start-up line names it); argparse makes a refusal one line."""
    port = int(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (0 to 65535; 0: any free one)")
    return port


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


def build_server(model_dir: str, decode, limits: ServeConfig, device: str = "cpu", dtype: str = "float32",
                 loras: dict[str, str] | None = None, api_key: str | None = None,
                 served_names: list[str] | None = None, chat_template: str | None = None):
    """Load the model, its tokenizer (with the Jinja template file ``chat_template`` when given), MMaDA's VQ
    encoder and the LoRA adapters ``loras`` (name -> adapter folder) and wrap them in a
    :class:`~dllm_rl.serve.app.Server` (engines not started). ``served_names`` (``--served-model-name``): the
    names the base model answers to, the first one reported (default: the checkpoint folder's name)."""
    from pathlib import Path

    from dllm_rl.hub import resolve_model_path
    from dllm_rl.models import load_model, load_tokenizer
    from dllm_rl.models.image_inputs import PromptEncoder
    from dllm_rl.models.tokenizer import use_chat_template
    from dllm_rl.serve.app import Server
    from dllm_rl.threads import use_cpu_threads
    from dllm_rl.training.accel import resolve_device
    from dllm_rl.training.lora import load_named_adapters, mixed_batch_refusal

    root = Path(model_dir).name or str(model_dir)
    names = list(dict.fromkeys(served_names or [root]))
    if not all(n.strip() for n in names):
        raise UserError("--served-model-name: a name is empty; give names a request's \"model\" can carry")
    for name in names:
        if name in (loras or {}):
            raise UserError(f"--lora: {name!r} is the base model's name; give the adapter another")
    model = load_model(model_dir, dtype=dtype, device=resolve_device(device, "--device"))
    use_cpu_threads(model.device)
    tokenizer = load_tokenizer(model_dir, mask_token_id=model.mask_token_id, noise=model.family.noise)
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
    from dllm_rl.sampling.cli import decode_config_from_args

    try:
        limits = ServeConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ServeConfig)})
    except FieldError as err:
        raise UserError(f"--{err.key.replace('_', '-')}: {err.problem}") from None
    api_key, loras, decode = api_key_from(args.api_key), parse_loras(args.lora), decode_config_from_args(args)
    sock = bind(args.host, args.port)  # before the model loads: a port in use is refused at once
    try:
        server = build_server(args.model_dir, decode, limits, args.device, args.dtype, loras, api_key,
                              args.served_model_name, args.chat_template)
        served = f"; LoRA adapters (the request's \"model\"): {', '.join(server.adapters)}" if server.adapters else ""
        served += ("; /v1 requests need the API key" if server.api_key
                   else f"; the server is open (no API key; --api-key or ${API_KEY_ENV} sets one)")
        host = f"[{args.host}]" if ":" in args.host else args.host
        print(f"serve: {server.name} on http://{host}:{sock.getsockname()[1]} ({limits.slots} slots, decoding in "
              f"blocks of {server.block}{served}); POST /v1/completions, /v1/chat/completions", file=sys.stderr,
              flush=True)
        GracefulServer(server, args.log_level).run(sockets=[sock])
    finally:
        sock.close()
    return 0


def register(sub) -> None:
    from dllm_rl.sampling.cli import add_decode_arguments

    p = sub.add_parser("serve", help="serve a model over HTTP (OpenAI-compatible, continuous batching)",
                       description="An OpenAI-compatible HTTP server: POST /v1/completions and /v1/chat/completions "
                       "(streaming with \"stream\": true), GET /health and /metrics. Requests join the engine's "
                       "continuous batch; each may set temperature, top_p, top_k, threshold, steps, seed and "
                       "max_tokens. The decoding flags below are the defaults of every request.")
    p.add_argument("model_dir", help="checkpoint directory in a published layout, with its tokenizer, "
                   "or a hub id org/name[@revision]")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=port_number, default=8000, help="port, 0 to 65535 (default: 8000; 0: any free "
                   "port, named by the start-up line); one in use is refused before the model loads")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16 (default: float32)")
    p.add_argument("--log-level", default="warning", help="uvicorn's log level (default: warning)")
    p.add_argument("--api-key", default=None, help="require \"Authorization: Bearer KEY\" on the /v1 routes (401 "
                   f"without it; /health, /metrics and /docs stay open); default: ${API_KEY_ENV} if set, else none "
                   "(an open server); an empty key is refused")
    p.add_argument("--lora", action="append", metavar="NAME=DIR",
                   help="serve a LoRA adapter folder (peft's adapter_config.json + weights, e.g. a run's "
                   "checkpoints/step-N/adapter) as model NAME: a request whose \"model\" is NAME decodes with it, "
                   "others with the base model (repeatable; every adapter shares the --slots slots)")
    p.add_argument("--served-model-name", nargs="+", metavar="NAME",
                   help="the names the base model is served as (a request's \"model\" may give any; responses and "
                   "/v1/models report the first); default: the checkpoint folder's name (a run's final/ is served "
                   "as \"final\" without it)")
    p.add_argument("--chat-template", metavar="FILE", default=None,
                   help="a Jinja chat template file for /v1/chat/completions (for a model whose tokenizer has none, "
                   "or to replace its own); without one, a model with no template answers chat requests 400")
    limits = p.add_argument_group("limits (ServeConfig)")
    hints = typing.get_type_hints(ServeConfig)
    for f in dataclasses.fields(ServeConfig):
        flag = "--" + f.name.removesuffix("_s").replace("_", "-")  # timeout_s: --timeout (seconds, as the help says)
        text = f.metadata["help"] + f" (default: {f.default})"
        if hints[f.name] is bool:
            limits.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=f.default,
                                help=text)
        else:
            kind = next(t for t in typing.get_args(hints[f.name]) or (hints[f.name],) if t is not type(None))
            limits.add_argument(flag, dest=f.name, type=kind, default=f.default, metavar=f.name.upper(), help=text)
    p.add_argument("--preset", choices=["llada2", "fast_dllm_v2", "sdar"],
                   help="a family's published sampler defaults (dllm_rl.sampling.presets); flags given override it")
    add_decode_arguments(p, exclude=("seed",))
    p.add_argument("--seed", type=int, default=0, help="the seed of a request that gives none (default: 0); a "
                   "request's answer never depends on the others served beside it")
    help_config_argument(p, lambda: ["limits:"] + describe(ServeConfig) + ["decoding (request defaults):"]
                         + describe(_decode_config()))
    p.set_defaults(func=serve_command)


def _decode_config():
    from dllm_rl.sampling.config import DecodeConfig

    return DecodeConfig
