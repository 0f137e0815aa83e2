"""The ``chat`` task: conversations in the layouts of UltraFeedback, HH-RLHF and TRL's conversational format become
prompts through the chat template; with no verifier, an RL run must name its scorer."""

from __future__ import annotations

import json
import re

import pytest
from hub_fixture import populate_hub_cache

from dllm_rl.config import ConfigError, load_config
from dllm_rl.rewards.reward_terms import RewardTerm, build_reward
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.trainer import check_scored
from dllm_rl.tasks import DataError, get_task
from dllm_rl.tasks.chat import hh_turns

HH = "\n\nHuman: Hi there\n\nAssistant: Hello!\n\nHuman: What is 2+2?\n\nAssistant: 4"
UF = {"prompt": "Name a colour.", "prompt_id": "p0",
      "chosen": [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}],
      "rejected": [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "No."}],
      "messages": [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}],
      "score_chosen": 8.0, "score_rejected": 2.0}


class TemplateTokenizer:
    chat_template = "tag"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        body = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        return body + ("<assistant>" if add_generation_prompt else "")


def test_hh_text_is_split_into_turns():
    assert hh_turns(HH) == [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"},
                            {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]
    with pytest.raises(ValueError, match="not an HH conversation"):
        hh_turns("Human: no leading blank lines")


def test_each_layout_gives_the_conversation_up_to_the_last_user_turn():
    rows = [UF, {"chosen": HH, "rejected": HH[:-1] + "5"}, {"prompt": "plain question"},
            {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q"}]}]
    task = get_task("chat", data=rows)
    assert [ex["messages"] for ex in task.examples] == [
        [{"role": "user", "content": "Name a colour."}],
        [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"},
         {"role": "user", "content": "What is 2+2?"}],
        [{"role": "user", "content": "plain question"}],
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q"}]]
    tok = TemplateTokenizer()
    assert task.build_prompt(task.examples[1], tok) == (
        "<user>Hi there\n<assistant>Hello!\n<user>What is 2+2?\n<assistant>")
    assert task.examples[1]["prompt"] == "What is 2+2?"
    sys_task = get_task("chat", data=rows, system_prompt="S")
    assert sys_task.build_prompt(sys_task.examples[0], tok) == "<system>S\n<user>Name a colour.\n<assistant>"
    assert sys_task.build_prompt(sys_task.examples[3], tok) == "<system>be brief\n<user>q\n<assistant>"  # its own


@pytest.mark.parametrize("row, message", [
    ({"messages": [{"role": "assistant", "content": "a"}]}, "rows[0]: column 'messages' has no user turn to answer"),
    ({"messages": [{"role": "user"}]}, "rows[0]: column 'messages' must be a string or a non-empty list of"),
    ({"question": "q"}, "rows[0]: missing field 'messages' or 'prompt' or 'chosen' needed by the chat task"),
])
def test_bad_rows_name_the_row_and_column(row, message):
    with pytest.raises(DataError, match=re.escape(message)):
        get_task("chat", data=[row]).load()


def test_an_ultrafeedback_layout_dataset_loads_by_hub_id(offline_hub):
    card = ("---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train_prefs\n"
            "    path: data/train_prefs-*\n---\n")
    populate_hub_cache(offline_hub, "HuggingFaceH4/ultrafeedback_binarized",
                       {"README.md": card, "data/train_prefs-00000-of-00001.jsonl": json.dumps(UF) + "\n"},
                       repo_type="dataset")
    task = get_task("hf:HuggingFaceH4/ultrafeedback_binarized@train_prefs", task_type="chat")
    assert task.examples[0]["messages"] == [{"role": "user", "content": "Name a colour."}]


def test_an_rl_run_on_chat_data_must_name_its_scorer():
    task = get_task("chat", data=[UF])
    bare = load_config(RLConfig, None, ["model.path=m", "data.task=chat"])
    with pytest.raises(ConfigError, match="data.task: the chat task has no verifier; score it with reward.model"):
        check_scored(task, bare)
    scored = load_config(RLConfig, None, ["model.path=m", "data.task=chat", "reward.model=org/rm"])
    with pytest.raises(ConfigError, match="eval.limit: the chat task has no verifier for held-out accuracy"):
        check_scored(task, scored)
    check_scored(task, load_config(RLConfig, None, ["model.path=m", "data.task=chat", "reward.model=org/rm",
                                                     "eval.limit=0"]))
    with pytest.raises(Exception, match=r"reward.terms\[0\].task: the chat task has no verifier"):
        build_reward([RewardTerm(task="chat")], task=task)


def test_an_evaluation_of_chat_data_needs_a_reward(tmp_path):
    from dllm_rl.config.vocabulary import ModelSection
    from dllm_rl.errors import UserError
    from dllm_rl.eval.harness import EvalRunConfig, load_task

    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps(UF) + "\n")
    with pytest.raises(UserError, match="task 'chat' has no verifier to score an evaluation; pass --task-options "
                                        "reward_fn=package.module:function"):
        load_task(EvalRunConfig(model=ModelSection(path="m"), task="chat", data=str(data)))
