"""The sequence-classification reward model: scores as a direct transformers forward gives them, independent of
batching and padding; normalisation that resumes exactly; the checkpoints it refuses."""

from __future__ import annotations

import pytest
import torch
from reward_helpers import tiny_llama as _tiny

from dllm_rl.errors import UserError
from dllm_rl.rewards.reward_model import RewardModel, RewardModelConfig, RunningMoments


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    return _tiny(tmp_path_factory.mktemp("rm") / "rm")


PROMPTS = ["2+2?", "name a colour", "x"]
COMPLETIONS = ["4", "blue, or maybe a much longer answer about red", "y" * 30]


def _direct(path, prompt, completion):
    """One unpadded forward through transformers itself."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    text = tok.apply_chat_template([{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}],
                                   tokenize=False)
    ids = tok(text, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        return float(model(**ids).logits[0, 0])


def test_scores_equal_a_direct_forward_whatever_the_batching(rm_dir):
    want = [_direct(rm_dir, p, c) for p, c in zip(PROMPTS, COMPLETIONS)]
    assert len(set(want)) == 3  # the pairs score differently, so a mix-up would show
    for bs in (1, 2, 3):
        rm = RewardModel(RewardModelConfig(model=str(rm_dir), batch_size=bs, device="cpu", dtype="float32"))
        got = rm(PROMPTS, COMPLETIONS)
        assert got == pytest.approx(want, abs=1e-5), bs
    assert rm.texts(PROMPTS[:1], COMPLETIONS[:1], {}) == ["<user>2+2?\n<assistant>4\n"]


def test_prompt_column_chat_prompts_normalisation_clip_and_exact_resume(rm_dir):
    base = RewardModel(RewardModelConfig(model=str(rm_dir), device="cpu", dtype="float32"))
    raw = base(PROMPTS, COMPLETIONS)
    # a column as the user turn, or a prompt given as chat messages, is what the model reads
    assert base.texts(["ignored"], ["4"], {"question": ["2+2?"]}) == ["<user>ignored\n<assistant>4\n"]
    col = RewardModel(RewardModelConfig(model=str(rm_dir), device="cpu", dtype="float32", prompt_column="question"),
                      loaded=(base.model, base.tokenizer))
    assert col.texts(["ignored"], ["4"], {"question": ["2+2?"]}) == ["<user>2+2?\n<assistant>4\n"]
    assert base.texts([[{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]], ["a"], {}) == [
        "<system>s\n<user>q\n<assistant>a\n"]
    # chat data (the chat task's messages column): the conversation before the completion, by default
    assert base.texts(["ignored"], ["a"], {"messages": [[{"role": "user", "content": "q"}]]}) == [
        "<user>q\n<assistant>a\n"]
    with pytest.raises(UserError, match="reward.model: prompt_column 'nope' is not a column"):
        RewardModel(RewardModelConfig(model=str(rm_dir), device="cpu", prompt_column="nope"),
                    loaded=(base.model, base.tokenizer))(["p"], ["c"])
    cfg = RewardModelConfig(model=str(rm_dir), device="cpu", dtype="float32", normalize=True, clip=1.0)
    rm = RewardModel(cfg, loaded=(base.model, base.tokenizer))
    first = rm(PROMPTS, COMPLETIONS)
    mean = sum(raw) / 3
    std = (sum((v - mean) ** 2 for v in raw) / 3) ** 0.5
    assert first == pytest.approx([max(-1.0, min(1.0, (v - mean) / std)) for v in raw], abs=1e-6)
    assert rm.last_raw == pytest.approx(raw, abs=1e-6)
    state = rm.state_dict()
    again = RewardModel(cfg, loaded=(base.model, base.tokenizer))
    again.load_state_dict(state)
    assert again(PROMPTS[:2], COMPLETIONS[:2]) == rm(PROMPTS[:2], COMPLETIONS[:2])  # resumed: same moments


def test_running_moments_merge_batches_as_one():
    m = RunningMoments()
    m.update([1.0, 2.0])
    m.update([4.0])
    m.update([])
    assert (m.count, m.mean) == (3, pytest.approx(7 / 3))
    assert m.std == pytest.approx(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) ** 0.5 / 3 ** 0.5)


def test_bad_reward_models_are_one_line_user_errors(tmp_path, rm_dir):
    causal = _tiny(tmp_path / "causal", "LlamaForCausalLM")
    with pytest.raises(UserError, match=r"^reward.model: .*causal' has no classification head \(architectures: "
                                        r"LlamaForCausalLM\)") as e:
        RewardModel(RewardModelConfig(model=str(causal), device="cpu"))
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match=r"^rewards\[1\].model: cannot load .*missing"):
        RewardModel(RewardModelConfig(model=str(tmp_path / "missing"), device="cpu"), key="rewards[1].model")
    import json

    headless = _tiny(tmp_path / "headless")  # a classifier config over weights without the head
    from safetensors.torch import load_file, save_file

    weights = load_file(headless / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.startswith("score")}, headless / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"^reward.model: .* has no weights for score.weight: its classification"):
        RewardModel(RewardModelConfig(model=str(headless), device="cpu"))
    conf = json.loads((rm_dir / "tokenizer_config.json").read_text())
    plain = _tiny(tmp_path / "plain")
    conf.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(conf))
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(UserError, match=r"^reward.model: the tokenizer of .* has no chat template"):
        RewardModel(RewardModelConfig(model=str(plain), device="cpu"))
