"""Images through the sampler: LLaDA-V prompts carry image features as data (``generate(..., images=)``), MMaDA
prompts carry image codes as ordinary ids. Tiny models: the published-layout LLaDA-V checkpoint of
tests/models/fixtures/llada_v ("pad" images: 729 patches + 1 newline = 730 positions) and a tiny MMaDA."""

import pytest
import torch
from llada_v_images import pattern, sharp_llada_v

from dllm_rl.errors import UserError
from dllm_rl.models import build_model, tiny_config
from dllm_rl.models.llava_images import IMAGE_TOKEN_INDEX, prompt_images
from dllm_rl.models.prompt_images import PromptImages
from dllm_rl.sampling import DecodeConfig, generate, generate_batched


@pytest.fixture(scope="module")
def dlm():
    return sharp_llada_v()


def cfg(cache="none", temperature=0.0, gen=8, block=4, steps=8):
    return DecodeConfig(gen_length=gen, block_length=block, steps=steps, temperature=temperature, cache=cache,
                        stop_on_eos=False)


def same(a, b, rows_a=None):
    ra = a if rows_a is None else a.select(rows_a)
    assert torch.equal(ra.completion_ids, b.completion_ids)
    assert torch.equal(ra.step_map, b.step_map)


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_splice_of_token_embeddings_decodes_exactly_as_those_tokens(dlm, cache, temperature):
    """Features equal to the embeddings of some ids must decode exactly as the text prompt holding those ids, in
    every cache mode (prefix / dual are Fast-dLLM's approximation on both paths): the splice lands at the prompt's
    columns whatever the left padding, in every forward, and never on a completion column."""
    emb = dlm.causal_lm.get_input_embeddings().weight.detach()
    img_ids = [[3, 9, 27, 40, 11], [50, 2, 17]]
    pim = PromptImages([emb[ids] for ids in img_ids], [((1, 0),), ((0, 1), (5, 0)), ()])
    pad = dlm.pad_token_id
    widened = [[5] + [pad] * 5 + [6, 7], [pad] * 3 + [8, 9] + [pad] * 5 + [10], [12, 13]]
    text = [[5, *img_ids[0], 6, 7], [*img_ids[1], 8, 9, *img_ids[0], 10], [12, 13]]
    with_images = generate(dlm, widened, cfg(cache, temperature), seeds=[4, 5, 6], images=pim)
    as_text = generate(dlm, text, cfg(cache, temperature), seeds=[4, 5, 6])
    same(with_images, as_text)
    torch.testing.assert_close(with_images.confidence, as_text.confidence, atol=0, rtol=0)
    assert with_images.images is pim and as_text.images is None


def _reference_greedy(dlm, widened, pim, gen, block):
    """LLaDA's reference loop written out (one token per step, highest probability first), full forward with the
    splice every step: ``(completion ids, step map)``."""
    p = len(widened)
    ids = torch.tensor([widened + [dlm.mask_token_id] * gen])
    splice = pim.splice(torch.tensor([0]), p + gen)
    steps = torch.full((gen,), -1)
    with torch.no_grad():
        for step in range(gen):
            b = step // block
            logits = dlm(ids, splice=splice).logits[0, p:].float()
            prob, tok = logits.softmax(-1).max(-1)
            todo = ids[0, p:] == dlm.mask_token_id
            todo[(b + 1) * block:] = False
            col = int(torch.where(todo, prob, -1.0).argmax())
            ids[0, p + col] = tok[col]
            steps[col] = step
    return ids[0, p:], steps


def test_greedy_cache_none_equals_the_reference_loop_with_the_image(dlm):
    widened, pim = prompt_images(dlm, [[5, IMAGE_TOKEN_INDEX, 7, 8]], [[pattern(90, 50, 1)]])
    ref_ids, ref_steps = _reference_greedy(dlm, widened[0], pim, gen=8, block=4)
    out = generate(dlm, widened, cfg("none"), images=pim)
    assert out.completion_ids[0].tolist() == ref_ids.tolist()
    assert out.step_map[0].tolist() == ref_steps.tolist()
    # the image matters: another image, other tokens or another order
    widened_b, pim_b = prompt_images(dlm, [[5, IMAGE_TOKEN_INDEX, 7, 8]], [[pattern(40, 70, 4)]])
    other = generate(dlm, widened_b, cfg("none"), images=pim_b)
    assert not (torch.equal(other.completion_ids, out.completion_ids) and torch.equal(other.step_map, out.step_map))


@pytest.mark.parametrize("cache,temperature", [("none", 0.0), ("none", 1.0), ("dual", 1.0)])
def test_a_prompt_with_its_image_decodes_the_same_alone_or_batched(dlm, cache, temperature):
    a, b = pattern(90, 50, 1), pattern(40, 70, 4)
    prompts = [[IMAGE_TOKEN_INDEX, 8, 9, 10, 11, 12], [5, IMAGE_TOKEN_INDEX, 7], [20, 21, 22]]
    widened, pim = prompt_images(dlm, prompts, [[b], [a], []])
    batched = generate(dlm, widened, cfg(cache, temperature), seeds=[1, 2, 3], images=pim)
    for i in range(3):
        alone = generate(dlm, [widened[i]], cfg(cache, temperature), seeds=[i + 1], images=pim.select([i]))
        same(batched, alone, [i])
    assert [len(r) for r in widened] == [735, 732, 3]
    assert batched.prompt_mask.sum(-1).tolist() == [735, 732, 3]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("cache", ["none", "dual"])
def test_the_engine_decodes_image_prompts_as_generate(dlm, temperature, cache):
    """Continuous batching with images: 1 and 2 slots over 4 prompts of different lengths (two with images, one with two
    copies of one image, one without), rows joining mid-run beside others; tokens, step maps and the rollout's
    images equal one fixed batch's, also under Fast-dLLM's dual cache (the images' keys cached with the prompt's)."""
    from dllm_rl.sampling.engine import Engine, EngineConfig

    a, b = pattern(90, 50, 1), pattern(40, 70, 4)
    prompts = [[IMAGE_TOKEN_INDEX, 8, 9], [20, 21, 22, 23], [5, IMAGE_TOKEN_INDEX, 7, IMAGE_TOKEN_INDEX], [6]]
    widened, pim = prompt_images(dlm, prompts, [[b], [], [a, a.copy()], []])
    config = DecodeConfig(gen_length=8, block_length=4, temperature=temperature, threshold=0.9, stop_on_eos=False,
                          cache=cache)
    whole = generate(dlm, widened, config, seeds=[3, 4, 5, 6], images=pim)
    for slots in (1, 2):  # one slot: the prompts without images also run alone
        got = Engine(dlm, config, EngineConfig(slots=slots)).run(widened, seeds=[3, 4, 5, 6], images=pim)
        same(whole, got)
    assert torch.equal(got.prompt_ids, whole.prompt_ids) and torch.equal(got.nfe, whole.nfe)
    assert [got.images.spans(i) for i in range(4)] == [pim.spans(i) for i in range(4)]
    assert got.images.features[0] is pim.features[pim.rows[0][0][1]]  # shared, not copied
    assert len(set(whole.nfe.tolist())) > 1  # rows finish at different steps: later ones join a running batch
    through = generate_batched(dlm, widened, config, seeds=[3, 4, 5, 6], images=pim, engine=EngineConfig(slots=3))
    same(whole, through)  # rollouts and evaluation (rollout.engine) hand their images to the engine


def test_the_engine_refuses_image_prompts_on_block_models_as_generate_does(dlm, tiny_models):
    from dllm_rl.sampling.engine import Engine, EngineConfig

    widened, pim = prompt_images(dlm, [[5, IMAGE_TOKEN_INDEX, 7]], [[pattern(90, 50, 1)]])
    engine = Engine(tiny_models["sdar"], DecodeConfig(gen_length=4), EngineConfig(slots=1))
    refusal = r"^images: image features are spliced into llada_v prompts only; a sdar model takes none"
    with pytest.raises(UserError, match=refusal):
        engine.add_request([5, 6, 7], images=pim)
    with pytest.raises(UserError, match=refusal):
        generate(tiny_models["sdar"], [[5, 6, 7]], DecodeConfig(gen_length=4), images=pim)


def test_a_group_encodes_each_distinct_image_once(dlm):
    """G = 4 samples of two prompts (one image each, the second also as a pixel-equal copy): one tower call over
    2 tiles, then sampling and scoring reuse the features (no more tower calls)."""
    from dllm_rl.estimators import ScoringBatch, estimate

    calls = []
    tower = dlm.causal_lm.model.vision_tower
    handle = tower.register_forward_hook(lambda m, args, kw_out: calls.append(int(args[0].shape[0])))
    try:
        a, b = pattern(90, 50, 1), pattern(40, 70, 4)
        prompts = [[5, IMAGE_TOKEN_INDEX, 7]] * 4 + [[IMAGE_TOKEN_INDEX, 9]] * 4
        widened, pim = prompt_images(dlm, prompts, [[a]] * 4 + [[b], [b.copy()], [b], [b.copy()]])
        assert calls == [2] and len(pim.features) == 2
        assert pim.rows == [((1, 0),)] * 4 + [((0, 1),)] * 4
        rollout = generate(dlm, widened, cfg("dual", 1.0), images=pim)
        scores = estimate(dlm, "elbo", ScoringBatch.from_rollout(rollout), torch.Generator().manual_seed(0))
        assert calls == [2]
        assert torch.isfinite(scores.sequence_score()).all()
    finally:
        handle.remove()


def test_rollout_select_and_cat_keep_each_rows_images(dlm):
    from dllm_rl.sampling.rollout import Rollout

    widened, pim = prompt_images(dlm, [[5, IMAGE_TOKEN_INDEX], [7, 8]], [[pattern(90, 50, 1)], []])
    r = generate(dlm, widened, cfg(gen=4), images=pim)
    text = generate(dlm, [[9, 9, 9]], cfg(gen=4))
    both = Rollout.cat([text, r.select([1, 0])])
    assert both.images.rows == [(), (), ((1, 0),)]
    assert both.images.features[0] is pim.features[0]
    assert both.select([2]).images.spans(0) == [(1, 730)]
    assert Rollout.cat([text, text]).images is None


def test_image_inputs_that_do_not_fit_are_one_line_user_errors(dlm, tiny_models):
    widened, pim = prompt_images(dlm, [[5, IMAGE_TOKEN_INDEX, 7]], [[pattern(90, 50, 1)]])
    with pytest.raises(UserError, match="^generate: PromptImages has 1 rows for 2 prompts; build prompts and images "
                                        "with dllm_rl.models.llava_images.prompt_images$"):
        generate(dlm, widened * 2, cfg(), images=pim)
    with pytest.raises(UserError, match="row 0: image 0 at offset 1 \\(730 positions\\) overlaps another or leaves "
                                        "the prompt of 40 tokens"):
        generate(dlm, [widened[0][:40]], cfg(), images=pim)
    with pytest.raises(UserError, match="a sdar model takes none"):
        generate(tiny_models["sdar"], [[1, 2]], DecodeConfig(gen_length=4, steps=4), images=PromptImages.none(1))


# ----------------------------------------------------------------------------------------------------------------
# MMaDA: image codes are prompt ids; the sampler and the estimators need nothing else.

CODE_OFFSET = 126464  # the tiny model's text vocabulary; codes follow it, as in the published vocabulary


@pytest.fixture(scope="module")
def mmada():
    cfg_ = tiny_config("mmada", vocab_size=CODE_OFFSET + 32, hidden_size=32, num_layers=2, num_heads=2,
                       num_kv_heads=1, intermediate_size=64, mask_token_id=126336, eos_token_id=126081,
                       pad_token_id=126081)
    cfg_.update(llm_vocab_size=CODE_OFFSET, codebook_size=32, new_vocab_size=CODE_OFFSET + 32)
    model = build_model("mmada", cfg_, seed=3)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


def test_mmada_understanding_prompts_from_vq_codes_generate_and_score_batch_invariantly(mmada):
    from dllm_rl.estimators import ScoringBatch, estimate
    from dllm_rl.models.magvit import MagvitConfig, MagvitEncoder
    from dllm_rl.models.mmada_image import image_transform, understanding_ids

    with torch.random.fork_rng():
        torch.manual_seed(0)
        vq = MagvitEncoder(MagvitConfig(ch=32, ch_mult=(1, 2), num_res_blocks=(1, 1), z_channels=5)).eval()
    codes = vq.codes(torch.stack([image_transform(pattern(90, 50, 1), 16), image_transform(pattern(40, 70, 4), 16)]))
    assert codes.shape == (2, 64) and int(codes.max()) < 32 and len(codes.unique()) > 4
    prompts = [understanding_ids(codes[0], [5, 6, 7], CODE_OFFSET, vocab_size=CODE_OFFSET + 32).tolist(),
               understanding_ids(codes[1], [8], CODE_OFFSET, vocab_size=CODE_OFFSET + 32).tolist(), [9, 10]]
    conf = DecodeConfig(gen_length=8, block_length=4, steps=8, temperature=1.0, stop_on_eos=False)
    batched = generate(mmada, prompts, conf, seeds=[1, 2, 3])
    assert batched.images is None and batched.prompt_mask.sum(-1).tolist() == [70, 68, 2]
    for i in range(3):
        same(batched, generate(mmada, [prompts[i]], conf, seeds=[i + 1]), [i])
    batch = ScoringBatch.from_rollout(batched)
    for name in ("trace", "elbo"):
        full = estimate(mmada, name, batch, torch.Generator().manual_seed(0)).sequence_score()
        assert torch.isfinite(full).all() and bool((full < 0).all())
    alone = estimate(mmada, "trace", batch.select([0]), None).sequence_score()
    torch.testing.assert_close(alone, estimate(mmada, "trace", batch, None).sequence_score()[:1], atol=1e-5, rtol=0)
