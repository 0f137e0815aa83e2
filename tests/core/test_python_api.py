"""The Python API (``dllm_rl.api``, ``docs/python.md``): the page's examples run, and each name calls the command's
code path (``evaluate`` returns the numbers ``dllm-rl eval`` writes); reward functions and task classes given in
Python go through the configs and the task registry."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import dllm_rl
from dllm_rl.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "src" / "dllm_rl" / "assets" / "demo"
PAGE = ROOT / "docs" / "python.md"


def test_the_python_page_runs(tmp_path, monkeypatch):
    """Every ```python block of docs/python.md, in order, in one namespace (as a reader pastes them), in a scratch
    folder; then what they made is checked."""
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), flags=re.M | re.S)
    assert len(blocks) == 5
    ns: dict = {"__name__": "__main__"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{PAGE.name} block {i + 1}", "exec"), ns)  # noqa: S102 - the page's own examples
    assert ns["rollout"].texts[0].startswith("<answer>") and ns["rollout"].finish_reason[0] == "eos"
    assert ns["done"][ns["ids"][1]].startswith("<answer>")
    assert ns["summary"]["items"] == 4 and ns["summary"]["task"] == "short_countdown"  # the evaluation (bound last)
    rl = json.loads((tmp_path / "runs" / "python-rl" / "summary.json").read_text())
    assert rl["steps"] == 2 and Path(rl["final_model"]).is_dir()
    assert "function: __main__:short_answers" in (tmp_path / "runs" / "python-rl" / "config.yaml").read_text()
    assert ns["result"].step == 2 and (tmp_path / "runs" / "python-sft" / "model" / "config.json").is_file()


def test_evaluate_gives_the_numbers_of_the_command(tmp_path):
    """``evaluate`` with a loaded model and a Task object writes the metrics ``dllm-rl eval`` writes for the same
    items and decoding; the object is registered for the call only."""
    from dllm_rl.cli import main
    from dllm_rl.tasks import task_factory
    from dllm_rl.tasks.countdown import CountdownTask

    model_dir, data = DEMO / "sdar-countdown", DEMO / "countdown_heldout.jsonl"
    assert main(["eval", str(model_dir), "--task", "countdown", "--data", str(data), "--prompt-style", "compact",
                 "--limit", "3", "--gen-length", "32", "--block-length", "4", "--no-progress",
                 "-o", str(tmp_path / "cli")]) == 0
    command = json.loads((tmp_path / "cli" / "summary.json").read_text())["settings"]["default"]["metrics"]
    model = dllm_rl.load_model(model_dir, device="cpu")
    task = CountdownTask(data=str(data), prompt_style="compact", limit=3)
    summary = dllm_rl.evaluate(model, task, gen_length=32, block_length=4, output_dir=tmp_path / "api",
                               progress=False)
    metrics = summary["settings"]["default"]["metrics"]
    for key in ("accuracy", "nfe_mean", "mean_length"):
        assert metrics[key] == command[key], key
    assert task_factory("countdown") is CountdownTask  # the built-in is back


def _shorter(prompts, completions, **columns):
    return [-float(len(c)) for c in completions]


def _nonempty(prompts, completions, **columns):
    return [float(bool(c)) for c in completions]


def test_reward_functions_go_into_the_reward_section():
    """One function is reward.function; several (or weighted) are reward.terms, built and summed by the terms'
    machinery; the run's config records them by module:function."""
    from dllm_rl.api import with_rewards
    from dllm_rl.config import ConfigError, to_dict
    from dllm_rl.rewards.reward_terms import build_reward
    from dllm_rl.rl.config import RLConfig

    one = with_rewards(RLConfig(), _shorter)
    assert one.reward.function is _shorter and not one.reward.terms
    assert to_dict(one)["reward"]["function"] == f"{__name__}:_shorter"
    two = with_rewards(RLConfig(), [_shorter, _nonempty], [0.5, 2.0])
    assert [(t.label, t.weight) for t in two.reward.terms] == [("_shorter", 0.5), ("_nonempty", 2.0)]
    reward = build_reward(two.reward.terms)
    assert [float(s) for s in reward(["p", "p"], ["abcd", ""])] == [0.5 * -4 + 2.0, 0.0]
    assert reward.last_terms == {"_shorter": [-4.0, 0.0], "_nonempty": [1.0, 0.0]}
    with pytest.raises(ConfigError, match=r"^reward_weights: 1 weights for 2 reward functions$"):
        with_rewards(RLConfig(), [_shorter, _nonempty], [1.0])


def test_a_task_class_is_registered_under_its_name():
    from dllm_rl.api import task_name
    from dllm_rl.tasks import get_task, unregister_task
    from dllm_rl.tasks.countdown import CountdownTask

    class Strict(CountdownTask):
        name = "strict_countdown_test"

    class Renamed(CountdownTask):  # keeps the built-in's name
        pass

    try:
        assert task_name(Strict) == "strict_countdown_test"
        task = get_task("strict_countdown_test", data=[{"nums": [1, 2, 3], "target": 6}], prompt_style="compact")
        assert isinstance(task, Strict) and len(task) == 1
        assert task_name(CountdownTask) == "countdown"  # the built-in class names itself
        with pytest.raises(UserError, match=r"the name 'countdown' is taken by another task .*give the class its own "
                                            r"name = '...'$"):
            task_name(Renamed)
        with pytest.raises(UserError, match=r"is a Task object; a trainer builds its training and held-out sets"):
            task_name(task)
    finally:
        unregister_task("strict_countdown_test")


def test_the_public_names():
    assert set(dllm_rl.__all__) <= set(dir(dllm_rl))
    for name in dllm_rl.__all__:
        assert getattr(dllm_rl, name) is not None
    assert dllm_rl.RLTrainer.train is not None and issubclass(dllm_rl.RLTrainer, __import__(
        "dllm_rl.rl.trainer", fromlist=["RLTrainer"]).RLTrainer)
    with pytest.raises(AttributeError, match="module 'dllm_rl' has no attribute 'nothing'"):
        dllm_rl.nothing  # noqa: B018


@pytest.mark.parametrize("call,message", [
    (lambda m: dllm_rl.generate(m, "1", temprature=0.5),
     "decode: unknown key 'temprature'; did you mean 'temperature'?"),
    (lambda m: dllm_rl.generate(m, "1", temperature="hot"), "decode.temperature: expected a number, got 'hot'"),
    (lambda m: dllm_rl.generate(m, "1", dllm_rl.DecodeConfig(temperature="hot")),
     "temperature: expected a number, got 'hot'"),
    (lambda m: dllm_rl.DecodeConfig(gen_length="8"), "gen_length: expected an integer, got '8'"),
    (lambda m: dllm_rl.DecodeConfig(seed=True), "seed: expected an integer, got True"),
    (lambda m: dllm_rl.DecodeConfig(stop_on_eos="no"), "stop_on_eos: expected true/false, got 'no'"),
    (lambda m: dllm_rl.RLConfig(model="x"), "model: expected a RLModelConfig (a mapping in YAML), got 'x'"),
])
def test_wrong_types_and_unknown_keywords_are_one_line_user_errors(call, message):
    """A config built in code is checked as a YAML file is: a value of the wrong type or an unknown keyword is a
    UserError naming it, not a TypeError from deep inside the sampler."""
    model = dllm_rl.load_model(DEMO / "sdar-countdown", device="cpu")
    with pytest.raises(UserError) as err:
        call(model)
    assert str(err.value).startswith(message)


FORMS = "give a string, a list of strings, a list of token ids or a list of lists of token ids"


@pytest.mark.parametrize("prompts,message", [
    ([[1.5, 2]], "prompt 0 has 1.5 (float) at position 0; token ids are integers"),  # once decoded as [1, 2]
    ([1, 2.0], "prompt 0 has 2.0 (float) at position 1; token ids are integers"),
    ([[1, True]], "prompt 0 has True (bool) at position 1; token ids are integers"),
    (["a", [1, 2]], f"prompts mix strings and other values (prompt 0 is a string, prompt 1 is [1, 2] (list)); {FORMS}"),
    (5, f"prompts is 5 (int); {FORMS}"),
    (None, f"prompts is None (NoneType); {FORMS}"),
    ([[1, 2], 7], "prompt 0 has [1, 2] (list) at position 0; token ids are integers"),
    ([None], "prompt 0 is None (NoneType); give a list of token ids (integers)"),
])
def test_prompts_of_the_wrong_shape_or_type_are_one_line_user_errors(prompts, message):
    """``generate``'s prompts are a string, strings, token ids or lists of them (integers): anything else is a
    UserError naming what was given, not a silent int() of a float nor a TypeError from the sampler."""
    model = dllm_rl.load_model(DEMO / "sdar-countdown", device="cpu")
    with pytest.raises(UserError) as err:
        dllm_rl.generate(model, prompts, gen_length=4, block_length=4)
    assert str(err.value) == message


def test_prompts_as_one_list_of_ids_tensors_and_arrays():
    """A flat list of ids is one prompt; a 2-D tensor's rows and an array are prompts as lists are."""
    import numpy as np
    import torch

    model = dllm_rl.load_model(DEMO / "sdar-countdown", device="cpu")
    one = dllm_rl.generate(model, [5, 6, 7], gen_length=4, block_length=4, temperature=0)
    assert len(one.texts) == 1
    rows = dllm_rl.generate(model, torch.tensor([[5, 6, 7], [5, 6, 7]]), gen_length=4, block_length=4, temperature=0)
    assert rows.texts == one.texts * 2
    assert dllm_rl.generate(model, np.array([5, 6, 7]), gen_length=4, block_length=4, temperature=0).texts == one.texts


def test_the_engine_and_the_sampler_refuse_non_integer_ids():
    """The check is check_inputs's, so the engine's requests and generate_batched refuse a float id as generate
    does, naming the request; a text given where ids are taken is a UserError too."""
    from dllm_rl.sampling import DecodeConfig
    from dllm_rl.sampling.batched import generate_batched
    from dllm_rl.sampling.engine import Engine, EngineConfig

    model = dllm_rl.load_model(DEMO / "sdar-countdown", device="cpu")
    engine = Engine(model, DecodeConfig(gen_length=4, block_length=4), EngineConfig(slots=1))
    with pytest.raises(UserError, match=r"^request 0 has 1\.5 \(float\) at position 1; token ids are integers$"):
        engine.add_request([1, 1.5])
    with pytest.raises(UserError, match=r"^request 0 is 5 \(int\); give a list of token ids \(integers\)$"):
        engine.add_request(5)
    with pytest.raises(UserError, match=r"^prompt 1 is a string \('abc' \(str\)\); tokenize it first"):
        generate_batched(model, [[1, 2], "abc"], DecodeConfig(gen_length=4, block_length=4))
    with pytest.raises(UserError, match=r"^prompts is 3 \(int\); give a list of prompts, each a list of token ids$"):
        generate_batched(model, 3, DecodeConfig(gen_length=4, block_length=4))
