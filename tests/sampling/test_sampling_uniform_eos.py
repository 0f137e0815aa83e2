"""Several EOS ids (Gemma's configs list end of sequence and end of turn): a uniform-state row ends on any of them,
as the stock ``generate(eos_token_id=[a, b])`` ends it, through the front door, the engine, the server's settled text
and the command line."""

from __future__ import annotations

import json

import torch

from dllm_rl.cli import main
from dllm_rl.models import build_model, char_tokenizer, save_model, tiny_config
from dllm_rl.sampling import DecodeConfig, generate
from dllm_rl.sampling.engine import Engine, EngineConfig
from dllm_rl.sampling.sequence import settled

CANVAS, EOS, PAD = 8, 1, 0
# a token of row 1's first canvas, before any EOS (1): as a second EOS id it ends that row one canvas early
SECOND = 11
PROMPTS = [[4, 5, 6, 7, 8], [9, 10], [5, 5, 11]]
DECODE = DecodeConfig(gen_length=2 * CANVAS, max_denoising_steps=4, seed=3)
TOK = char_tokenizer("abcdefgh ")  # pad 0, eos 1, mask 2, unk 3, then 9 characters: 13 ids


def _pub(eos) -> dict:
    cfg = tiny_config("diffusion_gemma", vocab_size=16, hidden_size=32, num_heads=2, num_kv_heads=1,
                      intermediate_size=64, block_size=CANVAS, max_position_embeddings=128)
    cfg["text_config"]["eos_token_id"] = eos
    return cfg


def _pair():
    """The tiny model with one EOS id, and the same weights with ``[EOS, SECOND]``."""
    one, two = (build_model("diffusion_gemma", _pub(eos), seed=0) for eos in (EOS, [EOS, SECOND]))
    assert all(torch.equal(a, b) for a, b in zip(one.state_dict().values(), two.state_dict().values()))
    return one, two


def test_a_row_ends_on_the_second_eos_id_as_the_stock_generate_ends_it():
    """Row 1 ends on its first canvas's SECOND (at column 5) where with one id it decoded two canvases: its tokens and
    step count are the stock ``generate(eos_token_id=[1, 11])``'s; its completion mask runs up to and including that
    id, its finish reason is "eos" and its text leaves the id out. Rows without it are as before."""
    one, two = _pair()
    assert (two.eos_token_ids, two.eos_token_id) == ((EOS, SECOND), EOS)
    before, roll = generate(one, PROMPTS, DECODE), generate(two, PROMPTS, DECODE, tokenizer=TOK)
    assert before.nfe.tolist() == [4, 8, 4] and before.completion_ids[1, 5] == SECOND
    for i, p in enumerate(PROMPTS):
        torch.manual_seed(3 + i)
        stock = two.hf_model.generate(torch.tensor([p]), max_new_tokens=2 * CANVAS, max_denoising_steps=4,
                                      eos_token_id=[EOS, SECOND], pad_token_id=PAD)
        got = stock.sequences[0, len(p):].tolist()
        assert got + [PAD] * (2 * CANVAS - len(got)) == roll.completion_ids[i].tolist()
        # the stock step count, as it reports it: generated tokens (not pad) per decoder forward pass
        assert float(stock.tokens_per_forward[0]) == sum(t != PAD for t in got) / int(roll.nfe[i])
    assert roll.nfe.tolist() == [4, 4, 4] and roll.finish_reason == ["eos", "eos", "eos"]
    assert roll.completion_ids[1].tolist() == [4, 5, 5, 3, 7, SECOND] + [PAD] * 10
    assert roll.completion_mask.sum(1).tolist() == [3, 6, 3] and bool(roll.completion_mask[1, 5])
    assert roll.texts[1] == TOK.decode([4, 5, 5, 3, 7], skip_special_tokens=True) == "abbd"  # no "h" (11)
    assert torch.equal(roll.completion_ids[[0, 2]], before.completion_ids[[0, 2]])


def test_the_engine_and_the_servers_settled_text_end_on_either_id():
    """The engine's request ends where ``generate`` ends it (tokens, mask, step counts, reason); it reports the ids it
    ends on (what the server's worker cuts its settled text at), and ``settled`` cuts at the first of any of them."""
    one, two = _pair()
    engine = Engine(two, DECODE, EngineConfig(slots=2))
    assert engine.eos_ids == (EOS, SECOND) and Engine(one, DECODE).eos_ids == (EOS,)
    got, want = engine.run(PROMPTS), generate(two, PROMPTS, DECODE)
    for name in ("completion_ids", "completion_mask", "step_map", "nfe"):
        assert torch.equal(getattr(want, name), getattr(got, name)), name
    assert got.finish_reason == want.finish_reason == ["eos", "eos", "eos"] and got.nfe.tolist() == [4, 4, 4]
    assert settled([4, 5, SECOND, 1, 6], [False] * 5, (EOS, SECOND)) == ([4, 5], True)
    assert settled([4, 5, SECOND, 1, 6], [False] * 5, EOS) == ([4, 5, SECOND], True)


def test_generate_cli_on_a_checkpoint_whose_config_lists_its_eos_ids(tmp_path, capsys):
    """The command line checks the tokenizer's EOS against the listed ids (1 is among them; Gemma's configs list
    them at the top level too) and decodes the row up to its second id; a tokenizer whose EOS is not listed is refused
    in one line. (Before, reading a top-level list raised a TypeError.)"""
    _, two = _pair()
    save_model(two, tmp_path, tokenizer=TOK)
    pub = json.loads((tmp_path / "config.json").read_text())
    assert pub["text_config"]["eos_token_id"] == [EOS, SECOND]
    (tmp_path / "config.json").write_text(json.dumps({**pub, "eos_token_id": [5, SECOND]}))
    trace = ["trace", str(tmp_path), "--prompt", "fg", "--gen-length", "8", "--max-denoising-steps", "2", "--device",
             "cpu", "-o", str(tmp_path / "t.html")]  # (the command that checks the tokenizer before loading)
    assert main(trace) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "eos id 1 != model eos_token_id [5, 11]" in err[0]
    (tmp_path / "config.json").write_text(json.dumps({**pub, "eos_token_id": [EOS, SECOND]}))
    assert main(trace) == 0
    out = tmp_path / "rows.jsonl"
    assert TOK.encode("fg") == PROMPTS[1]  # row 1 of the tests above, under its seed there (3 + 1)
    assert main(["generate", str(tmp_path), "--prompt", "fg", "--gen-length", "16", "--max-denoising-steps", "4",
                 "--seed", "4", "--trace", str(out)]) == 0
    row = json.loads(out.read_text().splitlines()[0])
    assert row["token_ids"][:6] == [4, 5, 5, 3, 7, SECOND] and row["nfe"] == 4
    assert row["answer_length"] == 6
