"""Every estimator on LLaDA-V rollouts: the rollout's image features (``ScoringBatch.images``) are spliced into
every row of their sample at its prompt columns; image positions are never masked or scored. Model: the
published-layout tiny checkpoint of tests/models/fixtures/llada_v with "pad" images (730 positions each)."""

import pytest
import torch
from llada_v_images import pattern, sharp_llada_v

from dllm_rl.estimators import ScoringBatch, estimate, plan_rows
from dllm_rl.models.llava_images import IMAGE_TOKEN_INDEX, prompt_images
from dllm_rl.models.prompt_images import PromptImages
from dllm_rl.sampling import DecodeConfig, generate

OPTIONS = {"trace": {}, "elbo": {"num_mc": 2}, "mean_field": {"p_mask_prompt": 0.5}, "random_mask": {"lo": 0.5},
           "coupled": {}, "block": {"block_size": 4, "mask_ratio": 1.0}, "ar": {}}


@pytest.fixture(scope="module")
def dlm():
    return sharp_llada_v()


@pytest.fixture(scope="module")
def rollout(dlm):
    """Two samples of one image prompt (one encoding), one prompt with another image, one without any."""
    prompts = [[5, IMAGE_TOKEN_INDEX, 7], [5, IMAGE_TOKEN_INDEX, 7], [IMAGE_TOKEN_INDEX, 9, 10, 11], [12, 13]]
    a, b = pattern(90, 50, 1), pattern(40, 70, 4)
    widened, pim = prompt_images(dlm, prompts, [[a], [a], [b], []])
    conf = DecodeConfig(gen_length=8, block_length=4, steps=8, temperature=1.0, stop_on_eos=False)
    return generate(dlm, widened, conf, seeds=[1, 2, 3, 4], images=pim)


def run(dlm, name, batch, seed=0, **kw):
    return estimate(dlm, name, batch, torch.Generator().manual_seed(seed), **{**OPTIONS[name], **kw})


@pytest.mark.parametrize("name", list(OPTIONS))
def test_estimator_scores_with_images_are_finite_differentiable_and_depend_on_the_image(dlm, rollout, name):
    batch = ScoringBatch.from_rollout(rollout)
    assert batch.images is rollout.images
    dlm.zero_grad()
    scores = run(dlm, name, batch)
    seq = scores.sequence_score()
    assert torch.isfinite(seq).all() and bool((seq < 0).all())
    seq.sum().backward()
    grad = dlm.lm_head.weight.grad
    assert grad is not None and torch.isfinite(grad).all() and float(grad.abs().sum()) > 0
    # the other image in the first three rows' place: the text rows keep their scores, the image rows change
    feats = rollout.images.features
    swapped = ScoringBatch.from_rollout(rollout)
    swapped.images = PromptImages([feats[1], feats[0]], rollout.images.rows)
    with torch.no_grad():
        other = run(dlm, name, swapped).sequence_score()
    assert bool((other[:3] - seq.detach()[:3]).abs().min() > 1e-4)
    torch.testing.assert_close(other[3], seq.detach()[3], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", list(OPTIONS))
def test_old_and_current_scores_are_equal_before_an_update(dlm, rollout, name):
    """Common random numbers: the same generator seed gives the same masks, and the same features the same
    scores, under no_grad (old) and under grad (current): every first ratio is exactly 1."""
    batch = ScoringBatch.from_rollout(rollout)
    with torch.no_grad():
        old = run(dlm, name, batch, seed=7)
    cur = run(dlm, name, batch, seed=7)
    assert torch.equal(cur.weight, old.weight)
    assert torch.equal(cur.logp.detach(), old.logp)


@pytest.mark.parametrize("name", list(OPTIONS))
def test_a_splice_of_token_embeddings_scores_exactly_as_those_tokens(dlm, name):
    """Features equal to the embeddings of ids score exactly as the text batch holding those ids, for every
    estimator: every row splices its sample's features at that sample's prompt columns, whatever the padding,
    the row order or the draw, and never a completion column."""
    emb = dlm.causal_lm.get_input_embeddings().weight.detach()
    img = [[3, 9, 27, 40, 11], [50, 2, 17]]
    pad = dlm.pad_token_id
    text_p = [[5, *img[0], 6], [*img[1], 8, 9, *img[0]], [12, 13]]
    spliced_p = [[5] + [pad] * 5 + [6], [pad] * 3 + [8, 9] + [pad] * 5, [12, 13]]
    pim = PromptImages([emb[i] for i in img], [((1, 0),), ((0, 1), (5, 0)), ()])
    width = 10
    g = torch.Generator().manual_seed(3)
    comp = torch.randint(0, 60, (3, 8), generator=g)
    comp_mask = torch.ones(3, 8, dtype=torch.bool)
    comp_mask[2, 5:] = False
    step_map = torch.stack([torch.randperm(8, generator=g) for _ in range(3)])

    def batch(prompts, images):
        ids = torch.full((3, width), pad)
        mask = torch.zeros(3, width, dtype=torch.bool)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = True
        return ScoringBatch(ids, mask, comp, comp_mask, step_map, images=images)

    # mean_field: the text batch would mask the ids that stand for the image, which an image never is
    kw = {"p_mask_prompt": 0.0} if name == "mean_field" else {}
    with torch.no_grad():
        spliced = run(dlm, name, batch(spliced_p, pim), seed=5, **kw)
        text = run(dlm, name, batch(text_p, None), seed=5, **kw)
    assert torch.equal(spliced.weight, text.weight) and bool(spliced.weight.ne(0).any())
    assert torch.equal(spliced.logp, text.logp)


def test_mean_field_never_masks_an_image_position(dlm, rollout):
    batch = ScoringBatch.from_rollout(rollout)
    rows = plan_rows(dlm, "mean_field", batch, torch.Generator().manual_seed(0), p_mask_prompt=1.0)
    image = batch.image_mask()
    assert image.sum(-1).tolist() == [730, 730, 730, 0]
    masked = rows.info["prompt_masked"][0]
    assert not bool((masked & image).any())
    assert torch.equal(masked, batch.prompt_mask & ~image)  # every text prompt token is masked at p = 1
    assert bool((rows.input_ids[:, : batch.prompt_len][image] == dlm.pad_token_id).all())


def test_select_keeps_each_samples_images(dlm, rollout):
    batch = ScoringBatch.from_rollout(rollout)
    with torch.no_grad():
        full = estimate(dlm, "trace", batch, None).sequence_score()
        part = estimate(dlm, "trace", batch.select([3, 2]), None).sequence_score()
    assert batch.select([3, 2]).images.rows == [(), ((0, 1),)]
    torch.testing.assert_close(part, full[[3, 2]], atol=1e-5, rtol=0)


def test_images_that_do_not_fit_the_batch_are_refused(dlm, rollout, models):
    batch = ScoringBatch.from_rollout(rollout)
    with pytest.raises(ValueError, match="ScoringBatch: images: PromptImages has 4 rows for 2 prompts"):
        ScoringBatch(batch.prompt_ids[:2], batch.prompt_mask[:2], batch.completion_ids[:2],
                     batch.completion_mask[:2], images=rollout.images)
    sdar = ScoringBatch(torch.tensor([[1, 2]]), torch.ones(1, 2), torch.tensor([[3, 4]]), torch.ones(1, 2),
                        images=PromptImages.none(1))
    with pytest.raises(ValueError, match="a sdar model takes none"):
        estimate(models["sdar"], "elbo", sdar, torch.Generator().manual_seed(0))
