"""The FastAPI application: OpenAI-compatible completions and chat completions over the engine's worker.

A request's decoding options (``temperature``, ``top_p``, ``top_k``, ``threshold``, ``steps``, ``seed``,
``max_tokens``, and ``preset``: a family's published schedule, :mod:`~dllm_rl.sampling.presets`, under the
request's own options) act per request: the engine applies each request's own rules after a shared forward
(:data:`~dllm_rl.sampling.engine.PER_REQUEST`). ``block_length`` / ``block_size`` shape the shared forward, so a
request asking for other values than the server's is refused with 400 naming the field. ``max_tokens`` is rounded
up to the decoding block for the engine and the answer cut back to it. ``seed`` defaults to the server's
(``--seed``), never to the arrival order, so a request's answer does not depend on who else is served.

With ``"stream_canvas": true`` (and ``"stream": true``) the stream also carries the whole canvas after each of the
request's steps, for viewers: ``{"object": "canvas", "step": N, "tokens": [...], "text": ...}`` events, the
completion's first ``max_tokens`` token ids with the mask id where still masked and their text with special
tokens shown.

``stop`` (a string or up to :data:`MAX_STOPS`) ends the answer before the first stop sequence it holds
(``finish_reason: "stop"``). A diffusion model commits tokens out of order, so the text is checked as it settles
(committed without a gap from the answer's start, which later steps never change; under RCR remasking, which
takes back tokens of the block being decoded, only finished blocks'): once the settled text holds a
stop sequence the answer up to it is final, and the request leaves its slot at once. A stream holds back the last
``len(longest stop) - 1`` characters until they cannot begin a stop sequence.

``n`` asks for that many choices: choice ``k`` decodes with seed ``seed + k`` in a slot of its own, its streamed
chunks carrying its ``index``.

``max_completion_tokens`` wins over ``max_tokens``; a completion's ``prompt`` may be a list (texts or token ids), its
choices ``i * n + k``; ``stream_options.include_usage`` ends a stream with a chunk of no choices and the usage;
``logprobs`` (completions: a count; chat: ``logprobs`` + ``top_logprobs``) gives each token's log-probability at the
step that committed it (:mod:`~dllm_rl.sampling.logprobs`, shaped by :mod:`~dllm_rl.serve.logprob_shapes`; a stream
sends a choice's whole with its last chunk); ``echo`` prepends the prompt (its tokens' log-probabilities null). A
field the server cannot honour is a 400 naming it unless neutral, and an unknown field is one too
(:mod:`~dllm_rl.serve.fields`).

A request's ``model`` names the base model (any of its served names; also when left out) or a LoRA adapter loaded with
``--lora NAME=DIR``; requests with different adapters share the engine's steps (each row with its own adapter), so a
request decodes with its adapter as it would alone.

Errors follow OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``: 400 (``param`` names the
field; an integer field outside 64 bits included), 404 (an unknown ``model``: ``"type": "NotFoundError"``,
``"code": "model_not_found"``, as vLLM), 413 (a body over ``--max-request-bytes``,
:mod:`~dllm_rl.serve.guards`), 429 (queue full), 504 (timeout), 503 (shutting down, or decoding failed: one
log line each).

One file (about 700 lines) for the HTTP side of one :class:`Server`: its request checks (fields, decoding, prompts,
images), the routes and the answers, whole or streamed, all read the same server state (the worker, the limits,
the model's names and counters), and a request is checked in the order its answer needs (the decoding before the
prompts it bounds, the prompts before the tickets). What stands apart is elsewhere: the request bodies in
:mod:`~dllm_rl.serve.schema`, the field policy in :mod:`~dllm_rl.serve.fields`, the framework's own refusals in
:mod:`~dllm_rl.serve.http_errors`, log-probability shapes in :mod:`~dllm_rl.serve.logprob_shapes`, images in
:mod:`~dllm_rl.serve.media`, the guards in :mod:`~dllm_rl.serve.guards`, the engine's thread in
:mod:`~dllm_rl.serve.worker`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from dllm_rl.config import FieldError
from dllm_rl.errors import UserError
from dllm_rl.models.image_inputs import PromptEncoder
from dllm_rl.models.prompt_images import PromptImages
from dllm_rl.sampling.config import UNIFORM_FIELDS, DecodeConfig
from dllm_rl.sampling.copies import metric_rows
from dllm_rl.sampling.engine import Engine, EngineConfig
from dllm_rl.sampling.inputs import check_config, check_inputs, positions_needed, uniform_decode_config, uniform_noise
from dllm_rl.sampling.logprobs import MAX_TOP
from dllm_rl.sampling.presets import preset
from dllm_rl.serve.config import ServeLimits
from dllm_rl.serve.fields import REFUSED, UNIFORM_NEUTRAL, best_of_refusal, neutral, refusal
from dllm_rl.serve.guards import BodyLimit, KeyCheck
from dllm_rl.serve.http_errors import framework_error, schema_error
from dllm_rl.serve.logprob_shapes import chat_shape, completion_shape, kept
from dllm_rl.serve.media import MediaError, fetch_image, flatten
from dllm_rl.serve.schema import ApiError, ChatRequest, CompletionRequest, Decoding
from dllm_rl.serve.worker import Ticket, Worker, cut_at_stop
from dllm_rl.tasks.images import placeholder_count

DISCONNECT_POLL_S = 0.05  # how often a waiting non-streaming request checks that its client is still there
log = logging.getLogger("uvicorn.error")  # uvicorn's own log (its format and level under `dllm-rl serve`)
def api_key_problem(key: str) -> str | None:
    """What makes ``key`` unusable as the API key, or None. An empty one (``--api-key "$KEY"`` with KEY unset) must not
    turn the key check off; whitespace at its ends, or a control character, cannot travel in an HTTP header."""
    if not key.strip():
        return "the API key is empty"
    if key != key.strip() or not key.isprintable():
        return "the API key has whitespace at an end or a control character, which an HTTP header cannot carry"
    return None


OPTIONS = ("temperature", "top_p", "top_k", "threshold", "steps", "seed")
#: a uniform-state family's request options (DiffusionGemma's sampler knobs), and the masked ones it refuses
UNIFORM_OPTIONS = (*UNIFORM_FIELDS, "seed")
MASK_ONLY = ("temperature", "top_p", "top_k", "threshold", "steps", "block_length", "block_size")
MAX_STOPS = 4  # OpenAI's limit on stop sequences


class Server:
    """The model, its tokenizer, the worker and the limits behind one app. ``adapters`` names the LoRA adapters
    loaded into the model (:func:`~dllm_rl.training.lora.load_named_adapters`): a request's ``model`` field picks one
    (or the base model, ``name``); all of them share the engine's ``limits.slots`` slots and its KV pool.
    ``encoder`` turns chat prompts with images into prompt ids (and LLaDA-V's features): the tasks'
    :class:`~dllm_rl.models.image_inputs.PromptEncoder` (MMaDA's needs the model directory, for its VQ encoder)."""

    def __init__(self, model, tokenizer, decode: DecodeConfig, limits: ServeLimits, name: str,
                 adapters: tuple[str, ...] = (), api_key: str | None = None, aliases: tuple[str, ...] = (),
                 roots: dict[str, str] | None = None, encoder: PromptEncoder | None = None):
        self.model, self.tokenizer, self.decode, self.limits, self.name = model, tokenizer, decode, limits, name
        self.names = (name, *(a for a in aliases if a != name))  # --served-model-name: the first is reported
        self.roots = dict(roots or {})  # a served id -> what /v1/models gives as its root (default: the id)
        self.created = int(time.time())
        self.encoder = encoder or PromptEncoder(tokenizer)
        if api_key is not None and (problem := api_key_problem(api_key)):
            raise UserError(f"api_key: {problem}; give another key, or None to serve without one")
        self.api_key = api_key  # set: every /v1 request must carry "Authorization: Bearer <api_key>"
        self.adapters = tuple(adapters)
        engine = Engine(model, decode, EngineConfig(slots=limits.slots, early_stop=limits.early_stop,
                                                    max_positions=limits.max_positions), tokenizer)
        self.block = engine.block
        self.worker = Worker(engine, engine.eos_ids, lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
        self.held = 0  # requests accepted and not answered yet (asyncio thread only): the slots and the queue
        self.closing = False

    # ---- requests -> tickets ---------------------------------------------------------------------------------
    def adapter_for(self, req: Decoding) -> str | None:
        """The LoRA adapter the request's ``model`` names (None: the base model, also when it names none), or a
        400 naming ``model``."""
        if req.model is None or req.model in self.names:
            return None
        if req.model in self.adapters:
            return req.model
        raise ApiError(404, f"The model `{req.model}` does not exist; served: "
                       f"{', '.join([*self.names, *self.adapters])}", "model", kind="NotFoundError",
                       code="model_not_found")

    def model_card(self, name: str) -> dict:
        """``/v1/models/{name}``: the card of a served name or adapter, or a 404 as for an unknown request ``model``."""
        card = next((c for c in self.models() if c["id"] == name), None)
        if card is None:
            self.adapter_for(Decoding(model=name))  # the 404 naming what is served
        return card

    def models(self) -> list[dict]:
        """``/v1/models``: every served name of the base model, then the adapters (``parent``: the base model)."""
        card = {"object": "model", "created": self.created, "owned_by": "dllm-rl"}
        return ([{"id": n, **card, "root": self.roots.get(n, n), "parent": None} for n in self.names]
                + [{"id": a, **card, "root": self.roots.get(a, a), "parent": self.name} for a in self.adapters])

    @staticmethod
    def check_fields(req: Decoding) -> int | None:
        """The fields the server cannot honour (a 400 naming the first, unless neutral), and the log-probability
        alternatives asked for (None: no log-probabilities)."""
        if (refused := refusal({name: getattr(req, name, None) for name in REFUSED})) is not None:
            raise ApiError(400, refused[1], refused[0])
        options = req.stream_options
        if options is not None and not req.stream:
            raise ApiError(400, "stream_options: only with \"stream\": true", "stream_options")
        if options is not None and options.include_obfuscation:
            raise ApiError(400, "stream_options.include_obfuscation: true cannot be honoured: no obfuscation field "
                           "is sent; leave it out or false", "stream_options")
        if isinstance(req, CompletionRequest):
            if (problem := best_of_refusal(req.best_of, req.n or 1)) is not None:
                raise ApiError(400, problem, "best_of")
            asked, name = req.logprobs, "logprobs"
        else:
            if req.top_logprobs and not req.logprobs:
                raise ApiError(400, "top_logprobs: set \"logprobs\": true too", "top_logprobs")
            asked, name = (req.top_logprobs or 0) if req.logprobs else None, "top_logprobs"
        if asked is not None and not 0 <= asked <= MAX_TOP:
            raise ApiError(400, f"{name}: {asked} alternatives asked; give 0 to {MAX_TOP}", name)
        return asked

    def config_for(self, req: Decoding) -> tuple[DecodeConfig, int]:
        """The request's DecodeConfig and its max_tokens (``max_completion_tokens`` wins over ``max_tokens``), or a
        400 naming the field."""
        n = 1 if req.n is None else req.n
        if not 1 <= n <= self.limits.slots + self.limits.max_queue:
            raise ApiError(400, f"n: {n} completions asked; give 1 to {self.limits.slots + self.limits.max_queue} "
                           "(the server's --slots plus --max-queue)", "n")
        if req.stream_canvas and not req.stream:
            raise ApiError(400, "stream_canvas: the canvas is streamed; set \"stream\": true too", "stream_canvas")
        over = self.request_options(req)
        for name in ("block_length", "block_size"):
            value, own = getattr(req, name), getattr(self.decode, name)
            if value is not None and value != own:
                raise ApiError(400, f"{name}: {value} asked, but this server decodes with {name} {own} (every "
                               f"request shares its forward passes); leave {name} out or restart the server with "
                               f"--{name.replace('_', '-')} {value}", name)
        field = self.budget_field(req)
        asked = getattr(req, field)
        max_tokens = self.decode.gen_length if asked is None else asked
        if not 1 <= max_tokens <= self.limits.max_tokens:
            raise ApiError(400, f"{field}: {max_tokens} is outside [1, {self.limits.max_tokens}] (the server's "
                           "--max-tokens)", field)
        base = self.decode
        rcr = "this server decodes with RCR remasking (--remasking rcr), which re-masks on the static schedule"
        if req.preset is not None:  # a family's published schedule (dllm_rl.sampling.presets), then the request's own
            try:
                schedule = preset(req.preset)
                if base.remasking == "rcr" and schedule.get("threshold") is not None:
                    raise ApiError(400, f"preset: {req.preset!r} decodes with a threshold; {rcr}", "preset")
                base = dataclasses.replace(base, **schedule)
            except (UserError, FieldError) as err:
                raise ApiError(400, f"preset: {err}", "preset") from None
        if "threshold" in over and base.remasking == "rcr":
            raise ApiError(400, f"threshold: {rcr}: set steps, not threshold", "threshold")
        if "threshold" in over and "steps" not in over:
            over["steps"] = None  # a request's threshold replaces the server's static schedule
        if "steps" in over and "threshold" not in over:
            over["threshold"], over["sub_block"] = None, None
        gen = -(-max_tokens // self.block) * self.block
        try:
            config = dataclasses.replace(base, gen_length=gen, **over)
        except FieldError as err:
            raise ApiError(400, str(err), err.key) from None
        self._check_schedule(req, config)
        return config, max_tokens

    @staticmethod
    def budget_field(req: Decoding) -> str:
        """The field that sets the request's completion budget, named in its errors: ``max_completion_tokens``
        when given (it wins), else ``max_tokens``."""
        return "max_tokens" if req.max_completion_tokens is None else "max_completion_tokens"

    def _check_schedule(self, req: Decoding, config: DecodeConfig) -> None:
        """A preset's schedule must fit this model (its sub-blocks its block), a uniform-state request's knobs must
        make a schedule (``t_max`` above ``t_min``) of at most the server's ``--max-request-denoising-steps`` steps
        per canvas: else a 400 naming the preset or the knob."""
        if req.preset is None and not uniform_noise(self.model):
            return
        try:
            check_config(self.model, config)
        except UserError as err:
            if req.preset is not None:
                raise ApiError(400, f"preset: {req.preset!r} does not fit this model: {err}", "preset") from None
            raise ApiError(400, str(err), str(err).split(":")[0]) from None
        limit = self.limits.max_request_denoising_steps
        if uniform_noise(self.model) and (steps := uniform_decode_config(config).max_denoising_steps) > limit:
            whose = "" if req.max_denoising_steps is not None else (
                f" (preset {req.preset!r}'s)" if req.preset is not None else " (the server's decode default)")
            raise ApiError(400, f"max_denoising_steps: {steps}{whose} is above the server's "
                           f"--max-request-denoising-steps {limit}; ask for at most {limit}", "max_denoising_steps")

    def request_options(self, req: Decoding) -> dict[str, Any]:
        """The decoding options the request sets for itself, those of the model's kind of noise; the other kind's
        are one 400 naming every one given (a uniform-state family takes no mask schedule, block or temperature: its
        schedule is ``t_min`` / ``t_max``; a masked family has no uniform-state knobs). The neutral values of the other
        kind's (:data:`~dllm_rl.serve.fields.UNIFORM_NEUTRAL`, what SDKs send by default) are accepted and dropped."""
        uniform = uniform_noise(self.model)
        own, other = (UNIFORM_OPTIONS, MASK_ONLY) if uniform else (OPTIONS, UNIFORM_FIELDS)
        accepted = UNIFORM_NEUTRAL if uniform else {}  # (the SDKs' defaults: neutral, as fields.REFUSED's)
        if wrong := [k for k in other if not neutral(getattr(req, k), accepted.get(k, ()))]:
            name = self.model.family.name
            why = (f"masked-diffusion options; {name} is uniform-state diffusion (no mask token), whose requests take "
                   f"{', '.join(UNIFORM_OPTIONS)}" if uniform else
                   f"uniform-state diffusion options (DiffusionGemma); {name} is masked diffusion")
            given_neutral = [f"{k} {accepted[k][0]}" for k in wrong if k in accepted]
            besides = f" (or give {', '.join(given_neutral)}: neutral)" if given_neutral else ""
            raise ApiError(400, f"{', '.join(wrong)}: {why}; leave {', '.join(wrong)} out{besides}", wrong[0])
        return {k: getattr(req, k) for k in own if getattr(req, k) is not None}

    @staticmethod
    def stops_for(req: Decoding) -> tuple[str, ...]:
        """The request's stop sequences, or a 400 naming ``stop``."""
        stops = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
        if len(stops) > MAX_STOPS or not all(stops):
            raise ApiError(400, f"stop: give at most {MAX_STOPS} non-empty stop sequences, got {list(stops)!r}",
                           "stop")
        return stops

    async def chat_prompt(self, req: ChatRequest) -> tuple[list[int], PromptImages | None]:
        """The chat's prompt ids (the chat template over the messages, each image part the model's placeholder where
        it stands: :mod:`~dllm_rl.serve.media`) and LLaDA-V's image features, or a 400 naming what cannot be taken.
        Images are read off the event loop; their encoding (the model's vision tower or VQ encoder) waits for the
        engine's thread between two steps (:attr:`Worker.model_lock`)."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise ApiError(400, "messages: this model's tokenizer has no chat template; start the server with "
                           "--chat-template FILE (a Jinja chat template), or use /v1/completions", "messages")
        if not req.messages:
            raise ApiError(400, "messages: give at least one message", "messages")
        try:
            messages, urls = flatten([m.model_dump() for m in req.messages], self.model.family.name)
            images = [await asyncio.to_thread(fetch_image, url, where, self.limits.allowed_local_media_path)
                      for url, where in urls]
        except MediaError as err:
            raise ApiError(400, str(err), "messages") from None
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        if placeholder_count(text) != len(images):
            raise ApiError(400, f"messages: the chat template's prompt holds {placeholder_count(text)} image "
                           f"placeholder(s) for {len(images)} image(s); it must keep each message's content as "
                           "it is", "messages")
        if not images:
            return self.encoder.encode(self.model, [text], None)[0][0], None
        try:
            ids, pim = await asyncio.to_thread(self._encode, text, images)
        except UserError as err:
            raise ApiError(400, f"messages: {str(err).replace('prompt 0 ', 'the prompt ')}", "messages") from None
        return ids[0], pim

    def _encode(self, text: str, images: list) -> tuple[list[list[int]], PromptImages | None]:
        with self.worker.model_lock:  # the engine's thread is between steps
            return self.encoder.encode(self.model, [text], [images])

    def text_prompts(self, req: CompletionRequest, config: DecodeConfig, max_tokens: int
                     ) -> list[tuple[list[int], str]]:
        """Each prompt's token ids, checked (:meth:`check_prompt`), and text (what ``echo`` shows): ``prompt`` is a
        text, token ids, or a list of either. Token ids are decoded only once checked: the tokenizer overflows on
        an id outside its vocabulary's integer type (a negative one) rather than answering it."""
        prompt = req.prompt
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            prompt = [prompt]
        if not prompt:
            raise ApiError(400, "prompt: give at least one prompt", "prompt")
        ids = [self.tokenizer.encode(p, add_special_tokens=False) if isinstance(p, str) else list(p) for p in prompt]
        for one in ids:
            self.check_prompt(one, config, max_tokens, "prompt", budget=self.budget_field(req))
        return [(one, p if isinstance(p, str) else self.tokenizer.decode(one, skip_special_tokens=True))
                for one, p in zip(ids, prompt)]

    def check_prompt(self, ids: list[int], config: DecodeConfig, max_tokens: int, param: str,
                     images: PromptImages | None = None, budget: str = "max_tokens") -> None:
        """The prompt ``ids`` (``param``: the field it came from) fits the model and the server with its
        ``max_tokens`` (``budget``: the field that gave it), or a 400 naming ``param``."""
        try:
            check_inputs(self.model, [ids], config, None, images, budget=(budget, max_tokens))
        except UserError as err:
            raise ApiError(400, f"{param}: {str(err).replace('prompt 0 ', 'the prompt ')}", param) from None
        need = positions_needed(self.model, len(ids), config.gen_length, self.block)
        if self.limits.max_positions is not None and need > self.limits.max_positions:
            raise ApiError(400, f"{param}: the prompt's {len(ids)} tokens and {budget} {max_tokens} (decoded as "
                           f"{config.gen_length} slots, whole blocks) need {need} positions, more than the server's "
                           f"--max-positions {self.limits.max_positions}; shorten the prompt or {budget}", param)

    def tickets(self, prompts: list[list[int]], config: DecodeConfig, n: int, stream: bool,
                adapter: str | None = None, canvas: bool = False, stop: tuple[str, ...] = (),
                max_tokens: int | None = None, logprobs: int | None = None,
                images: list[PromptImages | None] | None = None) -> list[Ticket]:
        """The ``n`` tickets of each prompt, sharing one event queue: choice ``i * n + k`` is prompt ``i``'s ``k``-th,
        decoded with seed ``config.seed + k`` (OpenAI's and vLLM's order of a list prompt's choices), with prompt
        ``i``'s ``images[i]`` (LLaDA-V's features, shared by its tickets); 429 when the queue has no room for all of
        them, 503 while shutting down."""
        if self.closing:
            raise ApiError(503, "the server is shutting down", kind="server_error")
        if self.held + n * len(prompts) > self.limits.slots + self.limits.max_queue:
            self.worker.counters.rejected_queue_full += 1
            raise ApiError(429, f"the queue is full ({self.limits.slots} running, {self.limits.max_queue} waiting); "
                           "retry later", kind="rate_limit_error")
        events, loop = asyncio.Queue(), asyncio.get_running_loop()
        configs = [dataclasses.replace(config, seed=config.seed + k) for k in range(n)]
        images = images or [None] * len(prompts)
        return [Ticket(ids, cfg, cfg.gen_length, cfg.seed, stream, events, loop, adapter, canvas, stop, max_tokens,
                       i * n + k, logprobs=logprobs, images=images[i])
                for i, ids in enumerate(prompts) for k, cfg in enumerate(configs)]

    # ---- answers ---------------------------------------------------------------------------------------------
    def final(self, kind: str, value, max_tokens: int, stops: tuple[str, ...], ticket: Ticket | None = None
              ) -> Answer:
        """The answer of a choice's final event: ``("done", rollout)`` or ``("stopped", text)`` (its tokens, for
        log-probabilities, from ``ticket``)."""
        if kind == "stopped":
            lp = ticket.logprobs_at_end if ticket is not None else None
            return Answer(*self.stopped(value), ids=lp.tokens[:max_tokens] if lp is not None else [], cut=True)
        return self.answer(value, max_tokens, stops)

    def answer(self, rollout, max_tokens: int, stops: tuple[str, ...] = ()) -> Answer:
        """The answer of a one-row rollout cut to ``max_tokens``, then before its first stop sequence."""
        ids = rollout.completion_ids[0][rollout.completion_mask[0]].tolist()
        ended = rollout.finish_reason[0] == "eos"
        if ended:
            ids = ids[:-1]
        if len(ids) > max_tokens:
            ids, ended = ids[:max_tokens], False
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cut, stopped = cut_at_stop(text, stops)
        if stopped:
            return Answer(*self.stopped(cut), ids=ids, cut=True)
        return Answer(text, "stop" if ended else "length", len(ids), ids)

    def choice_logprobs(self, ticket: Ticket, answer: Answer, chat: bool, echo: tuple[list[int], str] | None
                        ) -> dict | None:
        """A choice's ``logprobs`` in the endpoint's shape (:mod:`~dllm_rl.serve.logprob_shapes`), or None when
        not asked for. ``echo``: the echoed prompt's ids and text."""
        lp = ticket.logprobs_at_end
        if ticket.logprobs is None or lp is None:
            return None
        count = kept(self.tokenizer, answer.ids, answer.text) if answer.cut else len(answer.ids)
        if chat:
            return chat_shape(self.tokenizer, lp, count, ticket.logprobs)
        return completion_shape(self.tokenizer, lp, count, *(echo or (None, "")))

    def stopped(self, text: str) -> tuple[str, str, int]:
        """The answer ended at a stop sequence: ``text`` (before it), ``"stop"``, and its token count."""
        return text, "stop", len(self.tokenizer.encode(text, add_special_tokens=False))


@dataclass
class Answer:
    """A choice's answer: its text, finish reason and completion tokens (usage), and the token ids its text was
    decoded from (``cut``: then cut at a stop sequence)."""

    text: str
    reason: str
    tokens: int
    ids: list[int]
    cut: bool = False


class Gone(Exception):
    """The request's client left or its time ran out; its slot has been freed (``status``: 499 or 504)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


async def _next_event(server: Server, tickets: list[Ticket], done: set[int], request: Request | None):
    """The request's next event, ``(choice index, kind, value)``; frees the slots of its choices not ``done`` and
    raises :class:`Gone` if the client leaves or time runs out (checked every :data:`DISCONNECT_POLL_S`: the server
    notices a departed client only when it looks). A streamed request passes no ``request``: Starlette's streaming
    response watches the connection itself and closes the stream when the client leaves (whose ``finally`` frees
    the slots), and a second reader of the connection's messages could take a message meant for it."""
    deadline = tickets[0].arrived + server.limits.timeout_s
    while True:
        if time.monotonic() <= deadline:  # checked before each wait: a canvas stream's events come every step
            try:
                return await asyncio.wait_for(tickets[0].events.get(), DISCONNECT_POLL_S)
            except TimeoutError:
                pass
        if request is not None and await request.is_disconnected():
            _abort(server, tickets, done, "aborted_disconnect")
            raise Gone(499, "client closed the request")
        if time.monotonic() > deadline:
            _abort(server, tickets, done, "timed_out")
            raise Gone(504, f"the request took longer than the server's --timeout-s ({server.limits.timeout_s:g} s)")


def _abort(server: Server, tickets: list[Ticket], done: set[int], why: str) -> None:
    for ticket in tickets:
        if ticket.index not in done:
            server.worker.abort(ticket, why)


FINAL = ("done", "stopped", "error")  # the events that end a choice


async def _wait(server: Server, tickets: list[Ticket], request: Request) -> list[tuple[str, Any]]:
    """Each choice's final event, in choice order: ``("done", rollout)``, ``("stopped", text)`` or
    ``("error", message)``."""
    finals: dict[int, tuple[str, Any]] = {}
    while len(finals) < len(tickets):
        try:
            k, kind, value = await _next_event(server, tickets, set(finals), request)
        except Gone as gone:
            raise ApiError(gone.status, str(gone), kind="timeout" if gone.status == 504 else "client_closed") from None
        if kind in FINAL:
            finals[k] = (kind, value)
    return [finals[k] for k in range(len(tickets))]


def create_app(server: Server) -> BodyLimit:
    """The application: FastAPI's routes behind the guards (:mod:`~dllm_rl.serve.guards`): the body limit,
    outermost, then the API key's check of the /v1 routes, both before the body is read."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        server.worker.start()
        yield
        server.closing = True
        server.worker.stop()

    app = FastAPI(title="dllm-rl serve", lifespan=lifespan)

    def refuse(err: ApiError, headers: dict | None = None):
        """Every refusal's answer, a 400 counted as invalid; ``headers``: the framework's own (a 405's Allow)."""
        if err.status == 400:
            server.worker.counters.rejected_invalid += 1
        response = err.response()
        response.headers.update(headers or {})
        return response

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError):
        return refuse(err)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError):
        return refuse(schema_error(err))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException):
        return refuse(framework_error(request, err), err.headers)

    @app.get("/health")
    async def health():
        return {"status": "shutting down" if server.closing else "ok", "model": server.name}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(_metrics_text(server))

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": server.models()}

    @app.get("/v1/models/{name:path}")  # (a served name may hold a slash: org/model)
    async def model(name: str):
        return server.model_card(name)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        return await _serve(server, req, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: Request):
        return await _serve(server, req, request, chat=True)

    def too_large():
        server.worker.counters.rejected_too_large += 1
        return ApiError(413, f"the request body is larger than the server's --max-request-bytes "
                        f"({server.limits.max_request_bytes} bytes)", code="request_too_large").response()

    def unauthorized():
        server.worker.counters.rejected_unauthorized += 1
        return ApiError(401, "a valid API key is needed: send the header 'Authorization: Bearer <key>' with the "
                        "key the server was started with (--api-key)", code="invalid_api_key").response()

    return BodyLimit(KeyCheck(app, server.api_key, unauthorized), server.limits.max_request_bytes, too_large)


async def _serve(server: Server, req: CompletionRequest | ChatRequest, request: Request, chat: bool):
    """One completion or chat request: its fields, decoding and prompts checked, then answered whole or streamed,
    with ``n`` choices per prompt."""
    adapter = server.adapter_for(req)
    logprobs = server.check_fields(req)
    config, max_tokens = server.config_for(req)
    if chat:
        ids, images = await server.chat_prompt(req)
        server.check_prompt(ids, config, max_tokens, "messages", images, server.budget_field(req))
        prompts, prompt_images = [(ids, "")], [images]
    else:
        prompts = server.text_prompts(req, config, max_tokens)
        prompt_images = [None] * len(prompts)
    stream, stops, n = bool(req.stream), server.stops_for(req), req.n or 1
    tickets = server.tickets([ids for ids, _ in prompts], config, n, stream, adapter, req.stream_canvas, stops,
                             max_tokens, logprobs, prompt_images)
    echoes = [prompts[t.index // n] if not chat and req.echo else None for t in tickets]
    server.held += len(tickets)
    server.worker.counters.requests += 1
    for ticket in tickets:
        server.worker.submit(ticket)
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    prompt_tokens = sum(len(ids) for ids, _ in prompts)
    if stream:
        usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(_stream(server, tickets, max_tokens, rid, chat, echoes, prompt_tokens if usage
                                         else None), media_type="text/event-stream")
    try:
        finals = await _wait(server, tickets, request)
    finally:
        server.held -= len(tickets)
    if errors := [value for kind, value in finals if kind == "error"]:
        log.warning("%s answered 503: %s", rid, errors[0])
        raise ApiError(503, errors[0], kind="server_error")
    choices, completion_tokens, nfe = [], 0, 0
    for k, ((kind, value), ticket) in enumerate(zip(finals, tickets)):
        answer = server.final(kind, value, max_tokens, stops, ticket)
        completion_tokens += answer.tokens
        nfe = max(nfe, ticket.steps if kind == "stopped" else int(value.nfe[0]))
        lp = server.choice_logprobs(ticket, answer, chat, echoes[k])
        choices.append({"index": k, "message": {"role": "assistant", "content": answer.text}, "logprobs": lp,
                        "finish_reason": answer.reason} if chat else
                       {"index": k, "text": (echoes[k][1] if echoes[k] else "") + answer.text, "logprobs": lp,
                        "finish_reason": answer.reason})
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
             "total_tokens": prompt_tokens + completion_tokens}
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": adapter or server.name, "choices": choices, "usage": usage, "nfe": nfe}


def _chunk(model: str, rid: str, chat: bool, text: str | None, reason: str | None, first: bool = False,
           index: int = 0, logprobs: dict | None = None, usage: bool = False) -> str:
    """One streamed chunk of choice ``index`` (``usage``: with ``"usage": null``, as under include_usage)."""
    if chat:
        delta = {"role": "assistant"} if first else {}
        choice = {"index": index, "delta": delta | ({} if text is None else {"content": text}),
                  "logprobs": logprobs, "finish_reason": reason}
    else:
        choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": reason}
    body = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": [choice]} | ({"usage": None} if usage else {})
    return f"data: {json.dumps(body)}\n\n"


async def _stream(server: Server, tickets: list[Ticket], max_tokens: int, rid: str, chat: bool,
                  echoes: list | None = None, prompt_tokens: int | None = None):
    """Server-sent events: each choice's text as it settles (block by block, chunks carrying the choice's index;
    an echoed prompt first), each choice's finish reason (with its log-probabilities, all its tokens at once, when
    asked for), then, with ``prompt_tokens`` (include_usage), a chunk with ``"choices": []`` and the usage, and
    ``[DONE]`` after the last. A client that leaves (the generator is closed or cancelled) frees the slots."""
    model, stop = tickets[0].adapter or server.name, tickets[0].stop
    sent, done, completion_tokens = [""] * len(tickets), set(), 0
    echoes = echoes or [None] * len(tickets)
    usage = prompt_tokens is not None
    holdback = max(map(len, stop), default=1) - 1  # characters that may begin a stop sequence
    try:
        for k in range(len(tickets)):
            if chat:
                yield _chunk(model, rid, True, "", None, first=True, index=k, usage=usage)
            elif echoes[k]:
                yield _chunk(model, rid, False, echoes[k][1], None, index=k, usage=usage)
        while len(done) < len(tickets):
            try:
                k, kind, value = await _next_event(server, tickets, done, None)
            except Gone as gone:
                done.update(range(len(tickets)))  # their slots are freed already
                yield f"data: {json.dumps({'error': {'message': str(gone), 'type': 'timeout'}})}\n\n"
                return
            if kind == "error":
                done.add(k)
                log.warning("%s (a stream) ended with an error: %s", rid, value)
                yield f"data: {json.dumps({'error': {'message': value, 'type': 'server_error'}})}\n\n"
                return
            if kind == "canvas":
                step, tokens = value
                tokens = tokens[:max_tokens]  # the engine decodes max_tokens rounded up to the block: not shown
                body = {"id": rid, "object": "canvas", "created": int(time.time()), "model": model, "index": k,
                        "step": step, "tokens": tokens,
                        "text": server.tokenizer.decode(tokens, skip_special_tokens=False)}
                yield f"data: {json.dumps(body)}\n\n"
                continue
            answer = None
            if kind == "text":  # held back where it may begin a stop sequence, or ends inside a character
                text = server.tokenizer.decode(value[:max_tokens], skip_special_tokens=True)
                text = text[: len(text) - holdback].rstrip("\ufffd")  # (a byte-level BPE's bytes)
            else:
                done.add(k)
                answer = server.final(kind, value, max_tokens, stop, tickets[k])
                text = answer.text
                completion_tokens += answer.tokens
            if text.startswith(sent[k]) and len(text) > len(sent[k]):
                yield _chunk(model, rid, chat, text[len(sent[k]):], None, index=k, usage=usage)
                sent[k] = text
            if answer is not None:
                yield _chunk(model, rid, chat, None, answer.reason, index=k, usage=usage,
                             logprobs=server.choice_logprobs(tickets[k], answer, chat, echoes[k]))
        if usage:
            body = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                    "created": int(time.time()), "model": model, "choices": [],
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                              "total_tokens": prompt_tokens + completion_tokens}}
            yield f"data: {json.dumps(body)}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        server.held -= len(tickets)
        _abort(server, tickets, done, "aborted_disconnect")


def _metrics_text(server: Server) -> str:
    """Prometheus text format: counters since start, and the engine's current occupancy."""
    c, w = server.worker.counters, server.worker
    rows = [
        ("requests_total", "counter", "requests accepted", c.requests),
        ("requests_finished_total", "counter", "requests answered in full", c.finished),
        ("requests_rejected_queue_full_total", "counter", "requests answered 429", c.rejected_queue_full),
        ("requests_rejected_invalid_total", "counter", "requests answered 400", c.rejected_invalid),
        ("requests_rejected_too_large_total", "counter", "requests answered 413 (a body over --max-request-bytes)",
         c.rejected_too_large),
        ("requests_rejected_unauthorized_total", "counter", "requests answered 401 (no or a wrong API key)",
         c.rejected_unauthorized),
        ("requests_aborted_disconnect_total", "counter", "slots freed because the client left",
         c.aborted_disconnect),
        ("requests_timed_out_total", "counter", "slots freed by the timeout", c.timed_out),
        ("requests_stopped_total", "counter", "requests answered at a stop sequence before their decoding ended",
         c.stopped),
        ("requests_failed_shutdown_total", "counter", "requests failed at shutdown", c.failed_shutdown),
        ("engine_steps_total", "counter", "denoising steps (one forward per group of rows)", c.steps),
        ("completion_tokens_total", "counter", "answer tokens produced", c.tokens),
        ("requests_running", "gauge", "requests in a slot", w.running),
        ("requests_waiting", "gauge", "requests queued for a slot", w.waiting),
        ("slots", "gauge", "the engine's slots (--slots, shared by the base model and the adapters)",
         server.limits.slots),
        *metric_rows(server.worker.engine.copies),
    ]
    out = []
    for name, kind, help_text, value in rows:
        out += [f"# HELP dllm_rl_{name} {help_text}", f"# TYPE dllm_rl_{name} {kind}", f"dllm_rl_{name} {value}"]
    return "\n".join(out) + "\n"
