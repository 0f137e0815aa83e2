"""What generates an LLM judge's judgements (:mod:`dllm_rl.rewards.judge`): a transformers causal LM, or vLLM where
it is installed. Each turns judge prompts into ``n`` continuations per prompt; the judge builds the prompts and reads
the scores.

A judge prompt carries untrusted text (the completion), so it is encoded with the judge tokenizer's special tokens
split into plain text: a completion that spells a role marker (``<|im_end|>``) cannot end the user turn of the chat
template; only the template's own markers are special tokens."""

from __future__ import annotations

import torch

from dllm_rl.errors import UserError
from dllm_rl.models.devices import resolve_device, resolve_eval_dtype
from dllm_rl.rewards.judge_config import JudgeConfig

#: stands for the judge prompt while the chat template is rendered, to find where the prompt goes
_SLOT = "\x00judge-prompt\x00"


class HFGenerator:
    """Judgements from a transformers causal LM: left-padded batches, ``n`` sampled continuations per prompt."""

    def __init__(self, cfg: JudgeConfig, key: str = "judge.model"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.cfg, self.key = cfg, key
        device = resolve_device(cfg.device, f"{key.rsplit('.', 1)[0]}.device")
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

    def encode(self, text: str) -> list[int]:
        """The token ids of a judge prompt as the model reads it: the chat template's own text with its special
        tokens, and ``text`` with any special token it spells encoded as plain text."""
        tok = self.tokenizer
        if not (self.cfg.chat_template and getattr(tok, "chat_template", None)):
            return tok(text, split_special_tokens=True)["input_ids"]
        head, *tail = self.chat(_SLOT).split(_SLOT)
        if len(tail) != 1:
            raise UserError(f"{self.key}: the chat template of {self.cfg.model!r} does not paste the user turn "
                            "verbatim, so the judge prompt cannot be kept apart from its markup; set the judge's "
                            "chat_template: false")
        return [i for part, split in ((head, False), (text, True), (tail[0], False)) if part
                for i in tok(part, add_special_tokens=False, split_special_tokens=split)["input_ids"]]

    @torch.no_grad()
    def __call__(self, texts: list[str], n: int, seed: int) -> list[list[str]]:
        """``n`` continuations of each text (one ``generate`` call per ``batch_size`` texts)."""
        cfg, tok, out = self.cfg, self.tokenizer, []
        sample = cfg.temperature > 0
        for i in range(0, len(texts), cfg.batch_size):
            enc = tok.pad({"input_ids": [self.encode(t) for t in texts[i:i + cfg.batch_size]]}, padding=True,
                          return_tensors="pt").to(self.model.device)
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
        self.cfg, self.key, self._params = cfg, key, SamplingParams
        dtype = "auto" if cfg.dtype == "auto" else cfg.dtype
        try:
            self.llm = LLM(model=cfg.model, dtype=dtype, seed=cfg.seed)
        except (OSError, ValueError) as exc:
            raise UserError(f"{key}: vllm cannot load {cfg.model!r} ({type(exc).__name__}: {exc})") from None
        self.tokenizer = self.llm.get_tokenizer()

    chat, encode = HFGenerator.chat, HFGenerator.encode

    def __call__(self, texts: list[str], n: int, seed: int) -> list[list[str]]:
        cfg = self.cfg
        params = self._params(n=n, temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_new_tokens,
                              seed=seed)
        outputs = self.llm.generate([{"prompt_token_ids": self.encode(t)} for t in texts], params)
        return [[o.text for o in r.outputs] for r in outputs]
