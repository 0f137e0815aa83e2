"""DiFFPO's learned per-prompt threshold (dllm_rl.sampling.threshold_head): its log-prob and gradient against a hand
computation, save / load, and ``--decoding learned`` decoding each prompt at its own threshold."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from dllm_rl.errors import UserError
from dllm_rl.sampling.threshold_head import (
    ThresholdHead,
    load_head,
    policy_gradient_loss,
    prompt_features,
    prompt_thresholds,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rl"))


def _head() -> ThresholdHead:
    head = ThresholdHead(2, t_min=0.5, t_max=0.9, sigma=0.5)
    with torch.no_grad():
        head.linear.weight.copy_(torch.tensor([[1.0, -2.0]]))
        head.linear.bias.fill_(0.25)
    return head


def test_log_prob_gradient_and_threshold_by_hand():
    head = _head()
    h = torch.tensor([[0.5, 0.25], [1.0, 1.0]])
    z = torch.tensor([1.0, -1.0])
    adv = torch.tensor([2.0, -1.0])
    # mu = w.h + b: 0.5 - 0.5 + 0.25 = 0.25 ; 1 - 2 + 0.25 = -0.75
    mu = [0.25, -0.75]
    lp = [-0.5 * ((zi - m) / 0.5) ** 2 - math.log(0.5) - 0.5 * math.log(2 * math.pi) for zi, m in zip([1.0, -1.0], mu)]
    assert head.log_prob(h, z).tolist() == pytest.approx(lp)
    loss = policy_gradient_loss(head, h, z, adv)
    assert float(loss.detach()) == pytest.approx(-(2.0 * lp[0] - 1.0 * lp[1]) / 2)
    loss.backward()
    # d log N / d mu = (z - mu) / sigma^2 = 3.0 and -1.0; d loss / d w = -mean(A * (z - mu) / sigma^2 * h)
    g = [2.0 * 3.0, -1.0 * -1.0]
    assert head.linear.weight.grad[0].tolist() == pytest.approx([-(g[0] * 0.5 + g[1] * 1.0) / 2,
                                                                 -(g[0] * 0.25 + g[1] * 1.0) / 2])
    assert float(head.linear.bias.grad) == pytest.approx(-(g[0] + g[1]) / 2)
    # tau = t_min + (t_max - t_min) sigmoid(z); inference takes z = mu
    taus, zs = prompt_thresholds(head, h)
    assert zs.tolist() == pytest.approx(mu)
    assert taus == pytest.approx([0.5 + 0.4 / (1 + math.exp(-m)) for m in mu])


def test_draws_follow_each_rows_generator_and_save_load(tmp_path):
    head = _head()
    h = torch.tensor([[0.5, 0.25], [0.5, 0.25]])
    gens = [torch.Generator().manual_seed(s) for s in (3, 4)]
    taus, z = prompt_thresholds(head, h, gens)
    eps = [float(torch.randn(1, generator=torch.Generator().manual_seed(s))) for s in (3, 4)]
    assert z.tolist() == pytest.approx([0.25 + 0.5 * e for e in eps])
    assert all(0.5 < t < 0.9 for t in taus)
    head.save(tmp_path)
    back = load_head(tmp_path)
    assert (back.t_min, back.t_max, back.sigma) == (0.5, 0.9, 0.5)
    assert torch.equal(back.linear.weight, head.linear.weight)
    with pytest.raises(UserError, match="no learned threshold head"):
        load_head(tmp_path / "elsewhere")


@pytest.fixture(scope="module")
def llada_dir(tmp_path_factory):
    from rl_helpers import countdown_root

    return countdown_root(tmp_path_factory.mktemp("learned"), ["llada"], 2, 2) / "llada"


def test_generate_learned_uses_each_prompts_threshold(llada_dir, tmp_path, capsys):
    from dllm_rl.cli import main
    from dllm_rl.models import load_model, load_tokenizer
    from dllm_rl.sampling import generate
    from dllm_rl.sampling.config import DecodeConfig

    model = load_model(llada_dir, device="cpu")
    tok = load_tokenizer(llada_dir, mask_token_id=model.mask_token_id)
    texts = ["1 2 3", "9 8 7 6 5"]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    head = ThresholdHead(int(model.config.hidden_size), 0.005, 0.05, 0.5)  # a random model is unsure
    feats = prompt_features(model, prompts)
    with torch.no_grad():  # a head whose two prompts get far-apart thresholds: mu = +-2
        d = feats[0] - feats[1]
        head.linear.weight.copy_(4 * d / d.dot(d))
        head.linear.bias.fill_(-float(head.linear.weight[0].dot(feats.mean(0))))
    ckpt = tmp_path / "ckpt"
    import shutil

    shutil.copytree(llada_dir, ckpt)
    head.save(ckpt)
    taus, _ = prompt_thresholds(head, feats)
    assert abs(taus[0] - taus[1]) > 0.02
    base = ["--gen-length", "16", "--block-length", "16", "--temperature", "0"]
    assert main(["generate", str(ckpt), "--prompt", texts[0], "--prompt", texts[1], "--decoding", "learned",
                 *base]) == 0
    out = capsys.readouterr().out
    nfes = []
    for i, (p, t) in enumerate(zip(prompts, taus)):
        alone = generate(model, [p], DecodeConfig(gen_length=16, block_length=16, threshold=t), seeds=[i],
                         tokenizer=tok)
        assert f"=== [{i}] {alone.finish_reason[0]}, {int(alone.nfe[0])} NFE\n{alone.texts[0]}\n" in out
        nfes.append(int(alone.nfe[0]))
        other = generate(model, [p], DecodeConfig(gen_length=16, block_length=16, threshold=taus[1 - i]),
                         seeds=[i])
        nfes.append(int(other.nfe[0]))
    assert nfes[0] != nfes[1] or nfes[2] != nfes[3]  # the two thresholds decode differently
    # without the head: one line, exit 2
    assert main(["generate", str(llada_dir), "--prompt", "1", "--decoding", "learned", *base]) == 2
    assert "no learned threshold head" in capsys.readouterr().err
