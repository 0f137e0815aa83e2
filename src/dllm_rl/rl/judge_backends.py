"""What generates an LLM judge's judgements (:mod:`dllm_rl.rl.judge`): a transformers causal LM, or vLLM where it is
installed. Each turns judge prompts into ``n`` continuations per prompt; the judge builds the prompts and reads the
scores."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from dllm_rl.errors import UserError
from dllm_rl.training.accel import resolve_device, resolve_eval_dtype

if TYPE_CHECKING:
    from dllm_rl.rl.judge import JudgeConfig


class HFGenerator:
    """Judgements from a transformers causal LM: left-padded batches, ``n`` sampled continuations per prompt."""

    def __init__(self, cfg: JudgeConfig, key: str = "judge.model"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.cfg = cfg
        device = resolve_device(cfg.device)
        dtype = getattr(torch, resolve_eval_dtype(cfg.dtype, device))
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(cfg.model)
            self.model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=dtype).to(device).eval()
        except (OSError, ValueError, KeyError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise UserError(f"{key}: cannot load {cfg.model!r} as a causal LM ({type(exc).__name__}: {first[:200]})"
                            "; give ORG/NAME or a folder of a causal LM that transformers loads") from None
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "left"  # the continuation starts right after every prompt

    def chat(self, text: str) -> str:
        """The judge prompt as the model reads it."""
        if self.cfg.chat_template and getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                      add_generation_prompt=True)
        return text

    @torch.no_grad()
    def __call__(self, texts: list[str], n: int, seed: int) -> list[list[str]]:
        """``n`` continuations of each text (one ``generate`` call per ``batch_size`` texts)."""
        cfg, tok, out = self.cfg, self.tokenizer, []
        sample = cfg.temperature > 0
        for i in range(0, len(texts), cfg.batch_size):
            enc = tok([self.chat(t) for t in texts[i:i + cfg.batch_size]], return_tensors="pt", padding=True,
                      add_special_tokens=not (cfg.chat_template and getattr(tok, "chat_template", None)))
            enc = enc.to(self.model.device)
            kwargs = {"do_sample": True, "temperature": cfg.temperature, "top_p": cfg.top_p} if sample else {
                "do_sample": False}
            with torch.random.fork_rng(devices=[self.model.device] if self.model.device.type == "cuda" else []):
                torch.manual_seed(seed + i)
                gen = self.model.generate(**enc, max_new_tokens=cfg.max_new_tokens, num_return_sequences=n,
                                          pad_token_id=tok.pad_token_id, **kwargs)
            words = tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            out.extend(words[j:j + n] for j in range(0, len(words), n))
        return out


class VLLMGenerator:  # pragma: no cover - needs vllm and a GPU
    """Judgements from vLLM (optional backend), with the same prompts as :class:`HFGenerator`."""

    def __init__(self, cfg: JudgeConfig, key: str = "judge.model"):
        try:
            from vllm import LLM, SamplingParams
        except ImportError:
            raise UserError(f"{key}: judge.backend=vllm needs vllm (pip install vllm); or set "
                            "judge.backend=transformers") from None
        self.cfg, self._params = cfg, SamplingParams
        dtype = "auto" if cfg.dtype == "auto" else cfg.dtype
        try:
            self.llm = LLM(model=cfg.model, dtype=dtype, seed=cfg.seed)
        except (OSError, ValueError) as exc:
            raise UserError(f"{key}: vllm cannot load {cfg.model!r} ({type(exc).__name__}: {exc})") from None
        self.tokenizer = self.llm.get_tokenizer()

    chat = HFGenerator.chat

    def __call__(self, texts: list[str], n: int, seed: int) -> list[list[str]]:
        cfg = self.cfg
        params = self._params(n=n, temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_new_tokens,
                              seed=seed)
        outputs = self.llm.generate([self.chat(t) for t in texts], params)
        return [[o.text for o in r.outputs] for r in outputs]
