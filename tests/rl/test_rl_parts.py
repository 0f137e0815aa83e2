"""Hand-computed values for advantages, KL estimators and policy losses."""

import math
from dataclasses import dataclass

import pytest
import torch

from dllm_rl.rl.advantages import compute_advantages, group_filter, group_zscore, leave_one_out, pass_at_k
from dllm_rl.rl.kl import k1, k2, k3
from dllm_rl.rl.losses import POLICY_LOSSES, LossConfig, policy_objective, sequence_clipped_loss, token_clipped_loss


@dataclass
class Scores:  # the estimator interface the losses read (duck-typed TokenScores)
    logp: torch.Tensor
    weight: torch.Tensor

    def sequence_score(self):
        return (self.logp * self.weight).sum(-1).mean(0)


def test_group_zscore_hand_values():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    a = group_zscore(r, 3, "group")
    # both groups: unbiased std sqrt(1/3)
    s = math.sqrt(1 / 3)
    centred = torch.tensor([2 / 3, -1 / 3, -1 / 3, -2 / 3, 1 / 3, 1 / 3])
    torch.testing.assert_close(a, centred / (s + 1e-4))
    torch.testing.assert_close(group_zscore(r, 3, "none"), centred)
    bstd = r.std().item()
    torch.testing.assert_close(group_zscore(r, 3, "batch"), centred / (bstd + 1e-4))


def test_leave_one_out_hand_values():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    # r_i - mean of the other three: 1 - 1/3, 0 - 2/3, 0 - 2/3, 1 - 1/3
    torch.testing.assert_close(leave_one_out(r, 4), torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))
    with pytest.raises(ValueError, match="num_generations >= 2"):
        leave_one_out(r, 1)


def test_pass_at_k_hand_values():
    # one right answer in 8, k = 4: E[max] = C(7,3)/C(8,4) = 35/70 = 1/2; it sits only in subsets that pass
    # (1 - 1/2), a wrong one fails in C(6,3)/C(7,3) = 20/35 of its subsets (1 - 20/35 - 1/2 = -1/14)
    r = torch.tensor([0.0, 0, 1, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0])
    a = pass_at_k(r, 8, k=4)
    torch.testing.assert_close(a[:8], torch.tensor([-1 / 14] * 2 + [1 / 2] + [-1 / 14] * 5))
    # four right in 8: E[max] = 1 - C(4,4)/C(8,4) = 69/70; right 1/70; wrong 1 - C(3,3)/C(7,3) - 69/70 = 1/70 - 1/35
    torch.testing.assert_close(a[8:], torch.tensor([1 / 70] * 4 + [1 / 70 - 1 / 35] * 4))
    # scaled by the subset scores' std sqrt(p (1 - p)): p = 1/2 -> 1/2
    torch.testing.assert_close(pass_at_k(r, 8, "group", k=4)[:3], torch.tensor([-1 / 7, -1 / 7, 1.0]), atol=1e-3,
                               rtol=0)
    torch.testing.assert_close(pass_at_k(r, 8, k=1), group_zscore(r, 8, "none"))  # k = 1 is GRPO's r - mean
    with pytest.raises(ValueError, match=r"k must be in \[1, rollout.num_generations = 8\], got 9"):
        pass_at_k(r, 8, k=9)


def test_pass_at_k_equals_the_mean_over_every_subset_for_graded_rewards():
    import itertools

    r = torch.tensor([0.3, 0.9, 0.0, 0.3, 0.5, 1.0])  # a tie, graded rewards: the best of a subset scores it
    for k in (1, 2, 3, 6):
        subsets = list(itertools.combinations(range(6), k))
        best = {s: max(r[list(s)].tolist()) for s in subsets}
        mean = sum(best.values()) / len(subsets)
        want = [sum(b for s, b in best.items() if i in s) / sum(i in s for s in subsets) - mean for i in range(6)]
        torch.testing.assert_close(pass_at_k(r, 6, k=k), torch.tensor(want), atol=1e-6, rtol=0)


def test_advantage_options_reach_the_rule_and_unknown_ones_are_refused():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(compute_advantages("pass_at_k", r, 4, "none", {"k": 2}), pass_at_k(r, 4, k=2))
    with pytest.raises(ValueError, match=r"^advantage_options: k not read by the 'leave_one_out' advantage; "
                                         r"valid: \(none\)$"):
        compute_advantages("leave_one_out", r, 4, "none", {"k": 2})
    with pytest.raises(ValueError, match=r"^advantage_options: kk not read by the 'pass_at_k' advantage; valid: k$"):
        compute_advantages("pass_at_k", r, 4, "none", {"kk": 2})


def test_group_filter_counts_zero_variance_and_band():
    r = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    f = group_filter(r, 4)
    assert f.keep.tolist() == [True] * 4 + [False] * 4 + [True] * 4
    assert f.zero_variance_groups == 1
    f = group_filter(r, 4, accuracy_band=(0.2, 0.6))  # group accs 0.5, 1.0 (zero-var), 0.75
    assert f.keep.tolist() == [True] * 4 + [False] * 8
    assert (f.zero_variance_groups, f.out_of_band_groups) == (1, 1)


def test_kl_estimators_hand_values():
    logp, ref = torch.tensor([-1.0]), torch.tensor([-1.5])
    # log r = ref - logp = -0.5
    assert k1(logp, ref).item() == pytest.approx(0.5)
    assert k2(logp, ref).item() == pytest.approx(0.125)
    assert k3(logp, ref).item() == pytest.approx(math.exp(-0.5) - 1 + 0.5)
    same = torch.tensor([-2.0])
    assert k1(same, same).item() == k2(same, same).item() == k3(same, same).item() == 0.0


NO_LENGTHS = torch.tensor([])  # the token loss does not read completion lengths


def test_token_loss_first_pass_ratio_one_and_gradient():
    logp = torch.tensor([[[-1.0, -2.0, -0.5, 0.0]]], requires_grad=True)  # D=1, B=1, G=4
    w = torch.tensor([[[1.0, 1.0, 1.0, 0.0]]])
    new, old = Scores(logp, w), Scores(logp.detach().clone(), w)
    out = token_clipped_loss(new, old, None, torch.tensor([2.0]), NO_LENGTHS, LossConfig(epsilon=0.2))
    assert out.loss.item() == pytest.approx(-2.0)  # -(1 * A) averaged over 3 active tokens
    assert out.stats["clip_frac"] == 0.0 and out.stats["ratio_mean"] == pytest.approx(1.0)
    out.loss.backward()
    # d/dlogp of -(ratio*A)/3 at ratio 1 = -A/3 on active tokens, 0 on the inactive one
    torch.testing.assert_close(logp.grad, torch.tensor([[[-2 / 3, -2 / 3, -2 / 3, 0.0]]]))


def test_token_loss_clipping_and_aggregations():
    old = Scores(torch.zeros(1, 2, 3), torch.tensor([[[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]]))
    new_logp = torch.log(torch.tensor([[[1.5, 0.9, 1.0], [0.5, 1.0, 1.0]]]))
    new = Scores(new_logp, old.weight)
    adv = torch.tensor([1.0, -1.0])
    # seq 0 (A=+1): ratios 1.5 -> clipped 1.2, 0.9 -> 0.9: terms -1.2, -0.9
    # seq 1 (A=-1): ratio 0.5 -> min(-0.5, -0.8) = -0.8: term +0.8
    tm = token_clipped_loss(new, old, None, adv, NO_LENGTHS, LossConfig(epsilon=0.2, aggregation="token_mean"))
    assert tm.loss.item() == pytest.approx((-1.2 - 0.9 + 0.8) / 3)
    assert tm.stats["clip_frac"] == pytest.approx(2 / 3)
    sm = token_clipped_loss(new, old, None, adv, NO_LENGTHS, LossConfig(epsilon=0.2, aggregation="seq_mean"))
    assert sm.loss.item() == pytest.approx(((-1.2 - 0.9) / 2 + 0.8) / 2)
    fl = token_clipped_loss(new, old, None, adv, NO_LENGTHS,
                            LossConfig(epsilon=0.2, aggregation="fixed_length", max_length=4))
    assert fl.loss.item() == pytest.approx((-1.2 - 0.9 + 0.8) / (2 * 4))
    hi = token_clipped_loss(new, old, None, adv, NO_LENGTHS,
                            LossConfig(epsilon=0.2, epsilon_high=0.6, aggregation="token_mean"))
    assert hi.loss.item() == pytest.approx((-1.5 - 0.9 + 0.8) / 3)


def test_token_loss_kl_term_is_added_once_by_the_objective():
    w = torch.ones(1, 1, 2)
    new = Scores(torch.tensor([[[-1.0, -2.0]]]), w)
    ref = Scores(torch.tensor([[[-1.5, -2.0]]]), w)
    cfg = LossConfig(beta=0.1, kl_estimator="k3")
    assert "kl" not in token_clipped_loss(new, new, ref, torch.tensor([0.0]), NO_LENGTHS, cfg).stats  # no KL inside
    out = policy_objective(POLICY_LOSSES["token"], new, new, ref, torch.tensor([0.0]), NO_LENGTHS, cfg)
    kl = (math.exp(-0.5) - 1 + 0.5) / 2
    assert out.loss.item() == pytest.approx(0.1 * kl)
    assert out.stats["kl"] == pytest.approx(kl)


def test_espo_sequence_loss_hand_values():
    # Two sequences, one draw; sequence scores: new [-4, -6], old [-6, -6]; lengths [4, 2]
    w = torch.ones(1, 2, 4)
    new = Scores(torch.tensor([[[-1.0, -1.0, -1.0, -1.0], [-3.0, -3.0, 0.0, 0.0]]], requires_grad=True), w)
    old = Scores(torch.tensor([[[-1.5, -1.5, -1.5, -1.5], [-3.0, -3.0, 0.0, 0.0]]]), w)
    lengths = torch.tensor([4, 2])
    adv = torch.tensor([1.0, -1.0])
    out = sequence_clipped_loss(new, old, None, adv, lengths, LossConfig(epsilon=0.2))
    r0 = math.exp((-4 - -6) / 4)  # 1.6487 -> clipped at 1.2 for A>0
    assert out.loss.item() == pytest.approx((-min(r0, 1.2) * 1 + 1.0) / 2)
    assert out.stats["clip_frac"] == pytest.approx(0.5)
    out.loss.backward()
    # seq 0 is clipped: no gradient; seq 1 at ratio 1 with A=-1: d/dlogp = (+1/L)/2 per token
    assert new.logp.grad[0, 0].abs().sum().item() == 0.0
    torch.testing.assert_close(new.logp.grad[0, 1], torch.full((4,), 0.25))


def test_espo_first_pass_ratio_exactly_one_and_k2():
    w = torch.ones(2, 1, 3)
    s = Scores(torch.tensor([[[-1.0, -2.0, -3.0]], [[-1.0, -1.0, -1.0]]]), w)
    ref = Scores(s.logp - 0.3, w)
    out = policy_objective(POLICY_LOSSES["sequence"], s, s, ref, torch.tensor([1.0]), torch.tensor([3]),
                           LossConfig(beta=0.5, kl_estimator="k2"))
    assert out.stats["ratio_mean"] == 1.0 and out.stats["clip_frac"] == 0.0
    # E_new - E_ref = 0.9 (per draw, mean over the 2 draws) -> per token 0.3 -> k2 = 0.045
    assert out.stats["kl"] == pytest.approx(0.045, rel=1e-5)
    assert out.loss.item() == pytest.approx(-1.0 + 0.5 * 0.045, rel=1e-5)


def test_presets_fill_only_the_fields_left_unset():
    """Each preset fills the None fields (ESPO: masks shared by a prompt's rollouts; TraceRL's s by attention
    kind); whatever the user set stays."""
    from dllm_rl.rl.algorithms import resolve
    from dllm_rl.rl.config import RLConfig, RLModelConfig

    espo = resolve(RLConfig(model=RLModelConfig(path="m"), algorithm="espo"), "full")
    assert (espo.estimator, espo.estimator_noise, espo.advantage, espo.loss_type) == (
        "elbo", "group", "leave_one_out", "sequence")
    assert espo.estimator_options == {"num_mc": 2, "coupled": True}
    assert resolve(RLConfig(model=RLModelConfig(path="m"), algorithm="espo", estimator_noise="sample"),
                   "full").estimator_noise == "sample"
    for algo in ("tracerl", "diffu_grpo", "coupled_grpo", "random_mask_grpo"):
        assert resolve(RLConfig(model=RLModelConfig(path="m"), algorithm=algo), "full").estimator_noise == "sample"
    assert resolve(RLConfig(model=RLModelConfig(path="m"), algorithm="tracerl"),
                   "full").estimator_options == {"shrinkage": 8}
    assert resolve(RLConfig(model=RLModelConfig(path="m"), algorithm="tracerl"),
                   "block").estimator_options == {"shrinkage": 1}


def test_losses_kl_and_advantages_each_share_one_signature():
    import inspect

    from dllm_rl.rl.methods import ADVANTAGES, KL_ESTIMATORS, POLICY_LOSSES

    def params(fn):
        return list(inspect.signature(fn).parameters)

    # every method's loss too (each method module registers its own: the list grows with them)
    assert {"token", "sequence", "spg", "bgpo", "weighted_loglik", "ebpo", "egspo"} <= set(POLICY_LOSSES)
    assert {n: params(f) for n, f in POLICY_LOSSES.items()} == {
        n: ["new", "old", "ref", "advantages", "lengths", "config"] for n in POLICY_LOSSES}
    assert {n: params(f) for n, f in KL_ESTIMATORS.items()} == {n: ["logp", "logp_ref"] for n in ("k1", "k2", "k3")}
    # an advantage rule: three positional arguments, then its options (advantage_options), each with a default
    assert {n: params(f)[:3] for n, f in ADVANTAGES.items()} == {
        n: ["rewards", "group_size", "scale_rewards"] for n in ADVANTAGES}
    assert all(p.default is not inspect.Parameter.empty for f in ADVANTAGES.values()
               for p in list(inspect.signature(f).parameters.values())[3:])
    assert {"group_zscore", "leave_one_out", "wd1_weights", "pass_at_k"} <= set(ADVANTAGES)


def test_loss_config_is_read_from_the_resolved_rl_config_and_validated():
    from dllm_rl.rl.algorithms import resolve
    from dllm_rl.rl.config import RLConfig, RLModelConfig

    espo = resolve(RLConfig(model=RLModelConfig(path="m"), algorithm="espo", epsilon_high=0.28), "full")
    assert LossConfig.from_rl_config(espo, max_length=16) == LossConfig(
        epsilon=0.2, epsilon_high=0.28, aggregation="seq_mean", beta=0.01, kl_estimator="k2", max_length=16)
    assert LossConfig(epsilon=0.2).clip_high == 0.2 and LossConfig(epsilon_high=0.28).clip_high == 0.28
    with pytest.raises(ValueError, match="unknown loss aggregation 'sum'; choose token_mean, seq_mean, fixed_length"):
        LossConfig(aggregation="sum")
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        LossConfig(kl_estimator="k4")
    with pytest.raises(ValueError, match="max_length must be >= 1"):
        LossConfig(max_length=0)
