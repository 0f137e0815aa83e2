"""Errors the user can fix: one line `dllm-rl COMMAND: error: ...` naming the file or key, exit status 2, no
traceback. Every case of the ``cli`` fixture is a real ``python -m dllm_rl`` process, all forked from one
interpreter that imported torch once (``cli_forks.py``); variants of a case run through ``cli.main``
in-process (the same handler)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dllm_rl.cli import main
from dllm_rl.config import ConfigError, load_config
from dllm_rl.models import load_model
from dllm_rl.rl.config import RLConfig, RolloutConfig

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "src" / "dllm_rl" / "assets" / "demo"

#: the config keys the settings cases below set, as the commands spell them; each case's one line must name its key
KEYS = {"max_steps": "train.max_steps", "estimator_options": "estimator_options", "lr": "optim.lr", "beta": "beta",
        "output_dir": "run.output_dir", "sft_output_dir": "run.output_dir", "model": "model.path",
        "train_data": "data.train_file", "algorithm": "algorithm"}
#: settings that cannot train, each a real command line: name -> (command, key, value, the problem part of the one
#: line; {root}: the fixture's folder, whose home/ is $HOME)
SETTINGS = {
    "rl_max_steps": ("rl", "max_steps", "0", "must be >= 1, got 0"),
    "rl_num_mc": ("rl", "estimator_options", "{{num_mc: -4}}", "num_mc must be an integer >= 1, got -4"),
    "rl_lr_inf": ("rl", "lr", "inf", "must be a finite number, got inf"),
    "rl_beta_inf": ("rl", "beta", "inf", "must be a finite number, got inf"),
    "rl_dangling": ("rl", "output_dir", "{root}/dangling", "={root}/dangling is a symbolic link to {root}/nowhere, "
                    "which does not exist; create that directory or choose another "),
    "rl_tilde": ("rl", "output_dir", "~/a_file", "={root}/home/a_file is a file, not a directory; choose another "),
    "sft_dangling": ("sft", "sft_output_dir", "{root}/dangling", "={root}/dangling is a symbolic link to "
                     "{root}/nowhere, which does not exist; create that directory or choose another "),
    "sft_tilde": ("sft", "sft_output_dir", "~/a_file", "={root}/home/a_file is a file, not a directory; choose "
                  "another "),
}


def _run_all(runs: dict, envs: dict | None = None) -> dict:
    """Run every ``name -> (inputs, args)`` as ``python -m dllm_rl ARGS`` (a forked process each, see
    ``cli_forks.py``; ``envs``: name -> the variables that case sets); name -> (inputs, return code, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cases = {name: {"args": [str(a) for a in args], "env": (envs or {}).get(name, {})}
             for name, (_, args) in runs.items()}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("cli_forks.py"))], input=json.dumps(cases),
                          capture_output=True, text=True, env=env, timeout=900, check=True)
    results = json.loads(proc.stdout)
    return {name: (inputs, *results[name]) for name, (inputs, _) in runs.items()}


def _settings(root: Path) -> tuple[dict, dict]:
    """The :data:`SETTINGS` cases as command lines (name -> (root, args)) and their environments (``$HOME`` is
    ``root/home``, which holds a file ``a_file``; ``root/dangling`` links to nothing). The RL ones name the shipped
    block demo model (a cheap load: ``estimator_options`` are checked on the loaded model) and data."""
    (root / "home").mkdir(parents=True)
    (root / "home" / "a_file").write_text("not a directory\n")
    (root / "dangling").symlink_to(root / "nowhere")
    rl = ["rl", str(DEMO / "rl-block.yaml"), f"{KEYS['model']}={DEMO / 'sdar-countdown'}",
          f"{KEYS['train_data']}={DEMO / 'countdown_train.jsonl'}", f"{KEYS['algorithm']}=espo"]
    sft = ["sft", str(REPO / "configs" / "demo-sft-block.yaml")]
    runs, envs = {}, {}
    for name, (command, key, value, _) in SETTINGS.items():
        out = [f"{KEYS['output_dir']}={root / name}"] if command == "rl" and key != "output_dir" else []
        runs[name] = (root, [*(rl if command == "rl" else sft), *out, f"{KEYS[key]}={value.format(root=root)}"])
        envs[name] = {"HOME": str(root / "home")}
    return runs, envs


def _bomb(levels: int = 9, width: int = 9) -> str:
    """A 1 KB YAML alias bomb under estimator_options: ``width ** levels`` (387 million) values once expanded."""
    lines = ["estimator_options:", f"  l0: &l0 [{', '.join(['x'] * width)}]"]
    lines += [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def _image_rows(root: Path) -> dict[str, Path]:
    """Shapes data files with one mistake each (issue 34's bad input): an unreadable image, no image column, a
    placeholder count that differs from the images, an image over the limits (a few hundred bytes of PNG that
    declare 20000 x 1, 1 x 40000 or 13000 x 13000 pixels, written as ``NAME.png``); and a good one."""
    from big_images import zero_png

    from dllm_rl.tasks.shapes import make_shapes, write_shapes

    good = root / "shapes.jsonl"
    rows = write_shapes(good, make_shapes(2, seed=0, size=32))
    (root / "bad.png").write_bytes(b"not a png")
    files = {
        "unreadable": [rows[0], {**rows[1], "image": "bad.png"}],
        "no_column": [{k: v for k, v in r.items() if k != "image"} for r in rows],
        "placeholders": [rows[0], {**rows[1], "query": "<image> <image> " + rows[1]["query"]}],
    }
    for name, size in BIG_IMAGES.items():
        zero_png(*size, root / f"{name}.png")
        files[name] = [rows[0], {**rows[1], "image": f"{name}.png"}]
    out = {"good": good}
    for name, content in files.items():
        out[name] = root / f"shapes_{name}.jsonl"
        out[name].write_text("".join(json.dumps(r) + "\n" for r in content))
    return out


#: images over the limits (ImageLimits): name -> (width, height)
BIG_IMAGES = {"wide": (20000, 1), "tall": (1, 40000), "bomb": (13000, 13000)}


def _mistakes(root: Path) -> dict:
    """The user's mistakes of issue 39, each a real command line that must fail with one line (name ->
    (inputs, args)); the files they read are written under ``root``. None loads a model."""
    model, heldout = str(DEMO / "sdar-countdown"), str(DEMO / "countdown_heldout.jsonl")
    (root / "bad.parquet").write_bytes(b"PAR1 not really parquet PAR1")
    (root / "latin1.csv").write_bytes("expression,answer\n1+1,2\ncaf\xe9,3\n".encode("latin-1"))
    (root / "latin1.yaml").write_bytes("seed: 0\n# caf\xe9\n".encode("latin-1"))
    (root / "self.yaml").write_text("loss_options: &opts {mode: *opts}\n")
    (root / "deep.yaml").write_text("loss_options: " + "[" * 5000 + "]" * 5000 + "\n")
    (root / "bomb.yaml").write_text(_bomb())
    (root / "no_usable.jsonl").write_text('{"question": "1+1"}\n')
    (root / "settings_list.yaml").write_text("- {threshold: 0.9}\n")
    (root / "trace_null.jsonl").write_text('{"tokens": ["a", "b"], "steps": [0, null]}\n')
    (root / "run").mkdir()
    (root / "run" / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n')
    sft = ["sft", str(REPO / "configs" / "demo-sft-block.yaml")]  # each case its own run.output_dir (a lock)
    ev = ["eval", model, "--task", "countdown", "--data", heldout, "-o", str(root / "ev")]
    shapes = _image_rows(root)
    ev_shapes = ["eval", str(DEMO / "llada-countdown"), "--task", "shapes", "--prompt-style", "compact", "-o",
                 str(root / "ev_shapes"), "--data"]
    llada_v = str(DEMO / "llada_v-shapes")
    big = {f"image_{name}": ((shapes[name], root / f"{name}.png"),
                             ["eval", llada_v, "--task", "shapes", "--data", shapes[name], "-o", root / f"ev_{name}"])
           for name in BIG_IMAGES}
    big |= {f"trace_image_{name}": ((root / f"{name}.png",) * 2,
                                    ["trace", llada_v, "--prompt", "<image>\ncount red circle\n", "--image",
                                     root / f"{name}.png", "-o", root / f"{name}.html"])
            for name in BIG_IMAGES}
    return {
        **big,
        "hf_parent": ("../../etc", ["data", "show", "hf:../../etc", "--task-type", "countdown"]),
        "hf_empty": ("", ["data", "show", "hf:", "--task-type", "countdown"]),
        "hf_nested": ("a/b/c", ["data", "show", "hf:a/b/c", "--task-type", "countdown"]),
        "model_id": ("org/name-", ["info", "org/name-"]),
        "parquet": (root / "bad.parquet", ["data", "show", str(root / "bad.parquet"), "--task-type", "countdown"]),
        "csv_latin1": (root / "latin1.csv", ["data", "show", str(root / "latin1.csv"), "--task-type", "arith"]),
        "yaml_latin1": (root / "latin1.yaml", ["rl", str(root / "latin1.yaml")]),
        "yaml_self": (root / "self.yaml", ["rl", str(root / "self.yaml")]),
        "yaml_deep": (root / "deep.yaml", ["rl", str(root / "deep.yaml")]),
        "yaml_bomb": (root / "bomb.yaml", ["rl", str(root / "bomb.yaml")]),
        "sft_parquet": (root / "bad.parquet", [*sft, f"data.train_file={root / 'bad.parquet'}",
                                               f"run.output_dir={root / 'sft1'}"]),
        "sft_no_usable": (root / "no_usable.jsonl", [*sft, f"data.train_file={root / 'no_usable.jsonl'}",
                                                       "data.task=null", f"run.output_dir={root / 'sft2'}"]),
        "tokenizer": (DEMO / "llada-countdown", [*ev, "--model.tokenizer", str(DEMO / "llada-countdown")]),
        "digits": (None, ["data", "make", "arith", "--n", "2", "--digits", "10000", "--out", str(root / "a.jsonl")]),
        "same_out": (root / "x.jsonl", ["data", "make", "arith", "--n", "20", "--out", str(root / "x.jsonl"),
                                        "--test-out", str(root / "." / "x.jsonl")]),
        "limit": (None, [*ev, "--limit", "0"]),
        "batch_size": (None, [*ev, "--batch-size", "0"]),
        "num_samples": (None, [*ev, "--num-samples", "0"]),
        "block_size": (None, [*ev, "--decode.block-size", "0"]),
        "eval_trace_items": (None, [*ev, "--trace-items", "-1"]),
        "threads": (None, [*ev, "--threads", "0"]),
        "gen_length": (None, [*ev, "--decode.gen-length", "0"]),
        "setting_pair": (None, [*ev, "--setting", "dyn:threshold"]),
        "setting_name": (None, [*ev, "--setting", "my setting"]),
        "setting_key": (None, [*ev, "--setting", "dyn:treshold=0.9"]),
        "setting_range": (None, [*ev, "--setting", "dyn:threshold=2"]),
        "setting_tps": (None, [*ev, "--setting", "s:tokens_per_step=0"]),
        "setting_twice": (None, [*ev, "--setting", "a", "--setting", "a"]),
        "settings_file": (root / "settings_list.yaml", [*ev, "--settings-file", str(root / "settings_list.yaml")]),
        "settings_latin1": (root / "latin1.yaml", [*ev, "--settings-file", str(root / "latin1.yaml")]),
        "task_option": (None, [*ev, "--task-options", "foo=1"]),
        "prompt_style": (None, [*ev, "--prompt-style", "fancy"]),
        "device": (None, [*ev, "--model.device", "tpu"]),
        "output_file": (heldout, [*ev[:-1], heldout]),
        "plot_suffix": (root / "out.txt", ["plot", str(root / "run"), "-o", str(root / "out.txt")]),
        "trace_null": (root / "trace_null.jsonl", ["trace", "--from-trace", str(root / "trace_null.jsonl"), "-o",
                                                   str(root / "t.html")]),
        # a bad choice, a value of the wrong type, nothing given (the config's checks); argparse's own errors
        "eval_choice": (None, [*ev, "--decode.confidence", "nope"]),
        "eval_type": (None, [*ev, "--limit", "two"]),
        "eval_missing": (None, ["eval"]),
        "argparse_flag": (None, [*ev, "--no-such-flag"]),
        "argparse_command": (None, ["evaluate"]),
        "image_unreadable": (shapes["unreadable"], [*ev_shapes, shapes["unreadable"]]),
        "image_column": (shapes["no_column"], [*ev_shapes, shapes["no_column"]]),
        "image_placeholders": (shapes["placeholders"], [*ev_shapes, shapes["placeholders"]]),
        "image_text_family": (shapes["good"], [*ev_shapes, shapes["good"]]),
    }


@pytest.fixture(scope="module")
def cli(tmp_path_factory) -> dict:
    """The real command lines (name -> (inputs, args)), run together: name -> (inputs, return code, stderr)."""
    root = tmp_path_factory.mktemp("user_errors")
    truncated = root / "truncated"
    shutil.copytree(DEMO / "sdar-countdown", truncated)
    good = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(good[: len(good) // 2])  # an interrupted download
    no_mask = root / "no_mask"  # config.json without mask_token_id, and no tokenizer to take it from
    shutil.copytree(DEMO / "sdar-countdown", no_mask)
    pub = json.loads((no_mask / "config.json").read_text())
    del pub["mask_token_id"]
    (no_mask / "config.json").write_text(json.dumps(pub))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (no_mask / name).unlink()
    empty = root / "empty.jsonl"
    empty.write_text("")
    config = str(DEMO / "rl-block.yaml")  # names its model relative to the demo folder: never loaded here
    runs = {
        "truncated": (truncated, ["info", str(truncated)]),
        "reward": (None, ["rl", config, "reward.function=no_such_module:score"]),
        "no_mask": (no_mask, ["info", str(no_mask)]),
        "empty": (empty, ["eval", str(DEMO / "sdar-countdown"), "--task", str(empty), "--task-type", "countdown",
                          "-o", str(root / "ev")]),
        "temperature": (None, ["rl", config, f"model.path={root / 'missing'}", "rollout.temperature=-1"]),
    }
    runs.update(_mistakes(root))
    settings, envs = _settings(root / "settings")
    runs.update(settings)
    return _run_all(runs, envs)


def _one_error_line(stderr: str, command: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1, stderr
    prefix = f"dllm-rl {command}: error: " if command else "dllm-rl: error: "  # "": the top-level parser
    assert lines[0].startswith(prefix), lines[0]
    return lines[0]


def _in_process(capsys, *args: str) -> str:
    capsys.readouterr()
    assert main(list(args)) == 2
    return _one_error_line(capsys.readouterr().err, args[0])


@pytest.fixture()
def sdar_copy(tmp_path) -> Path:
    """A copy of the shipped block demo checkpoint (91-token character vocabulary, mask id 2)."""
    d = tmp_path / "sdar"
    shutil.copytree(DEMO / "sdar-countdown", d)
    return d


def test_corrupt_weights_name_the_file(cli, sdar_copy, capsys):
    truncated, rc, err = cli["truncated"]
    assert rc == 2
    line = _one_error_line(err, "info")
    assert line.startswith(f"dllm-rl info: error: {truncated / 'model.safetensors'}: not a readable safetensors file")
    assert "corrupt or truncated" in line
    weights = sdar_copy / "model.safetensors"
    for broken in (b"", b"not a safetensors file at all" * 8):  # empty, garbage
        weights.write_bytes(broken)
        line = _in_process(capsys, "info", str(sdar_copy))
        assert f"{weights}: not a readable safetensors file" in line and f"{len(broken)} bytes" in line


def test_custom_reward_that_does_not_import_fails_at_config_time(cli, tmp_path, capsys):
    (tmp_path / "bad_reward.py").write_text("raise RuntimeError('needs a GPU')\n")
    (tmp_path / "good_reward.py").write_text("def score(prompts, completions, **cols):\n    return [0.0]\n")
    config = str(DEMO / "rl-block.yaml")  # names the model relative to the demo folder: nothing is loaded
    _, rc, err = cli["reward"]
    assert rc == 2
    line = _one_error_line(err, "rl")
    assert line.endswith("reward.function: 'no_such_module:score': no module named 'no_such_module' (is its folder on "
                         "PYTHONPATH?)")
    sys.path.insert(0, str(tmp_path))
    try:
        line = _in_process(capsys, "rl", config, "reward.function=good_reward:scor")
        assert line.endswith("reward.function: 'good_reward:scor': 'good_reward' has no attribute 'scor'")
        line = _in_process(capsys, "rl", config, "reward.function=bad_reward:score")
        assert line.endswith("reward.function: 'bad_reward:score': importing 'bad_reward' raised RuntimeError: needs "
                             "a GPU")
        line = _in_process(capsys, "rl", config, "reward.function=score")
        assert line.endswith("reward.function: 'score': expected 'package.module:function'")
        assert load_config(RLConfig, None, ["reward.function=good_reward:score"]).reward.function == "good_reward:score"
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("good_reward", None)


def test_mask_id_comes_from_the_tokenizer_when_config_json_lacks_it(cli, sdar_copy, capsys):
    cfg_file = sdar_copy / "config.json"
    pub = json.loads(cfg_file.read_text())
    del pub["mask_token_id"]
    cfg_file.write_text(json.dumps(pub))
    assert load_model(sdar_copy).mask_token_id == 2  # the tokenizer's <mask>, not SDAR's 151669
    no_mask, rc, err = cli["no_mask"]  # the same, without a tokenizer
    assert rc == 2
    line = _one_error_line(err, "info")
    no_mask_cfg = no_mask / "config.json"
    assert line == (f"dllm-rl info: error: {no_mask_cfg} has no mask_token_id, {no_mask} has no mask token, and the "
                    f"sdar default (151669) is outside the vocabulary (vocab_size 91); set mask_token_id in "
                    f"{no_mask_cfg} to the id of the mask token")
    pub["mask_token_id"] = 91
    cfg_file.write_text(json.dumps(pub))
    assert _in_process(capsys, "info", str(sdar_copy)).endswith(
        f"{cfg_file}: mask_token_id 91 is outside the vocabulary (vocab_size 91); set mask_token_id in {cfg_file} "
        "to the id of the mask token")


def test_empty_held_out_file_is_refused(cli, sdar_copy, tmp_path, capsys):
    empty, rc, err = cli["empty"]
    assert rc == 2
    line = _one_error_line(err, "eval")
    assert line == (f"dllm-rl eval: error: {empty}: no items to evaluate (task '{empty}'); give a file with at "
                    "least one item")
    line = _in_process(capsys, "rl", str(DEMO / "rl-block.yaml"), f"model.path={sdar_copy}",
                       f"data.train_file={DEMO / 'countdown_train.jsonl'}", f"eval.data={empty}", "model.device=cpu",
                       f"run.output_dir={tmp_path / 'run'}")
    assert line == (f"dllm-rl rl: error: {empty}: no held-out examples (eval.data); give a file with at least one "
                    "item or eval.limit=0 to turn the held-out evaluation off")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_bad_rollout_value_fails_before_anything_is_loaded(cli):
    """The sampler's check (temperature >= 0) used to run at the first rollout, after the first held-out
    evaluation; it now runs when the config is built, so even a missing model directory is not reached."""
    _, rc, err = cli["temperature"]
    assert rc == 2
    line = _one_error_line(err, "rl")
    assert line == f"dllm-rl rl: error: {DEMO / 'rl-block.yaml'}: rollout.temperature: must be >= 0, got -1.0"
    with pytest.raises(ConfigError, match=r"^temperature: must be >= 0, got -1$"):
        RolloutConfig(temperature=-1)
    with pytest.raises(ConfigError, match=r"^rollout.top_p: must be in \(0, 1\], got 0.0$"):
        load_config(RLConfig, None, ["rollout.top_p=0"])


def test_a_bug_keeps_its_traceback(monkeypatch):
    """Only the user-error types are reported as one line; a KeyError from a bug propagates."""
    from dllm_rl import cli

    def buggy(args):
        raise KeyError("layer.3")

    real_build = cli.build_parser

    def build(command=None):
        parser = real_build(command)
        parser._subparsers._group_actions[0].choices["info"].set_defaults(func=buggy)
        return parser

    monkeypatch.setattr(cli, "build_parser", build)
    with pytest.raises(KeyError, match="layer.3"):
        cli.main(["info", "somewhere"])


#: what each mistake of :func:`_mistakes` says ({inputs}: the file or id it names): the key part of the one line
SAYS = {
    "hf_parent": "dataset '{inputs}' is not a local file and not a hub repository id (",
    "hf_empty": "dataset '{inputs}' is not a local file and not a hub repository id (",
    "hf_nested": "dataset '{inputs}' is not a local file and not a hub repository id (",
    "model_id": "model '{inputs}' is not a local directory and not a hub repository id (",
    "parquet": "{inputs}: not a readable Parquet file (ArrowInvalid: ",
    "csv_latin1": "{inputs}, line 3: not UTF-8 text; save the file as UTF-8",
    "yaml_latin1": "{inputs}: not UTF-8 text (byte 0xe9 on line 2); save the file as UTF-8",
    "yaml_self": "{inputs}: line 1: an alias (*name) refers to a value that contains it",
    "yaml_deep": "{inputs}: line 1: nested deeper than 100 levels",
    "yaml_bomb": "{inputs}: line 7: its aliases (*name) expand to more than 100,000 values",
    "sft_parquet": "{inputs}: not a readable Parquet file (ArrowInvalid: ",
    "sft_no_usable": "{inputs}: no usable rows ({inputs}: read 1 rows, kept 0, dropped 1 (missing_field=1))",
    "tokenizer": "tokenizer {inputs} has 93 tokens but the model ",
    "digits": "arith --digits 10000 with --operands 3: an answer could have 30000 digits, more than Python converts "
              "to text (4300); use --digits <= 1433",
    "same_out": "--out and --test-out are the same file ({inputs}): the train rows would replace the test rows",
    "limit": "error: limit: must be >= 1, got 0",
    "batch_size": "error: batch_size: must be >= 1, got 0",
    "num_samples": "error: num_samples: must be >= 1, got 0",
    "block_size": "error: decode.block_size: must be >= 1, got 0",
    "eval_trace_items": "error: trace_items: must be >= 0, got -1",
    "threads": "error: threads: must be >= 1, got 0",
    "gen_length": "error: decode.gen_length: must be >= 1, got 0",
    "setting_pair": "--setting 'dyn:threshold': 'threshold' must look like key=value",
    "setting_name": "setting name 'my setting': use letters, digits and _ . + - only",
    "setting_key": "setting 'dyn': unknown key 'treshold'; did you mean 'threshold', 'stability_threshold', "
                   "'confidence_threshold'?",
    "setting_range": "setting 'dyn': threshold: must be in (0, 1], got 2.0",
    "setting_tps": "setting 's': tokens_per_step must be >= 1",
    "setting_twice": "setting name 'a' is used twice",
    "settings_file": "{inputs}: entry 0 must be a mapping with a 'name'",
    "settings_latin1": "{inputs}: not UTF-8 text (byte 0xe9 on line 2)",
    "task_option": "task 'countdown' takes no option foo=1; remove it from task_options",
    "prompt_style": "task 'countdown' has no prompt_style 'fancy'; choose one of chat, plain, compact",
    "device": "device 'tpu': not a torch device; use auto, cpu, cuda or cuda:N",
    "output_file": "output directory {inputs} is a file; give a directory (-o)",
    "plot_suffix": "-o {inputs}: not an image file name (.txt); give FILE.png",
    "trace_null": "{inputs}:1: step_map[1] is null; every position needs the integer step",
    "eval_choice": "error: decode.confidence: 'nope' is not allowed; choose one of prob, margin, entropy, random",
    "eval_type": "error: limit: expected an integer, got 'two'",
    "eval_missing": "error: give a config file (e.g. configs/eval-sdar-demo.yaml, or MODEL_DIR --task NAME), "
                    "key=value overrides and/or --key value flags",
    "argparse_flag": "unrecognized arguments: --no-such-flag (see dllm-rl --help)",
    "argparse_command": "argument COMMAND: invalid choice: 'evaluate'",
    "image_unreadable": "{inputs}, line 2: column 'image': image file ",
    "image_column": "{inputs}, line 1: no image column ('image' or 'images') in the row (row has: answer, kind, "
                    "objects, query, question, size); add one",
    "image_placeholders": "{inputs}, line 2: the prompt has 2 '<image>' placeholder(s) but column 'image' holds 1 "
                          "image(s); give one image per placeholder",
    "image_text_family": "task 'shapes' has images, but a llada model reads text only; use a model of an image "
                         "family (llada_v, mmada) or a text task",
    # the probe's images, refused from their header in the shipped llada_v model's eval and trace (they used to run
    # at 5.4 GB, 20 GB and 4 GB)
    **{f"{cmd}image_{name}": f"{where}: image file {{inputs[1]}} ({size[0]}x{size[1]} px): {says}"
       for cmd, where in (("", "{inputs[0]}, line 2: column 'image'"), ("trace_", "--image {inputs[0]}"))
       for name, size, says in (
           ("wide", (20000, 1), "its 20000 px side is over the limit of 16384 px (image_limits.max_side); use a "
                                "smaller image or raise the limit"),
           ("tall", (1, 40000), "its 40000 px side is over the limit of 16384 px (image_limits.max_side)"),
           ("bomb", (13000, 13000), "its 169,000,000 pixels are over the limit of 40,000,000 "
                                    "(image_limits.max_pixels)"))},
}


#: the command of each mistake, by the first word of its name (default: eval)
SAYS_COMMAND = {"argparse_command": "", "argparse_flag": "",  # reported by the top-level parser
                "hf": "data", "model": "info", "parquet": "data", "csv": "data", "yaml": "rl", "sft": "sft",
                "digits": "data", "same": "data", "plot": "plot", "trace": "trace"}


@pytest.mark.parametrize("name", sorted(SAYS))
def test_every_mistake_is_one_line(cli, name):
    """Each mistake of issue 39 (a traceback, a hang or a silent overwrite before) exits 2 with one line that
    names what is wrong; none loads a model."""
    inputs, rc, err = cli[name]
    command = SAYS_COMMAND.get(name, SAYS_COMMAND.get(name.split("_")[0], "eval"))
    line = _one_error_line(err, command)
    assert rc == 2
    assert SAYS[name].format(inputs=inputs) in line, line



def test_images_given_to_generate_of_a_text_family_are_one_user_error():
    """``generate(images=)`` on a full-attention text family (llada) used to splice features into its prompt."""
    from dllm_rl.errors import UserError
    from dllm_rl.models.prompt_images import PromptImages
    from dllm_rl.sampling import DecodeConfig, generate

    model = load_model(DEMO / "llada-countdown")
    images = PromptImages([torch.zeros(2, int(model.config.hidden_size))], [((0, 0),)])
    with pytest.raises(UserError, match=r"^images: image features are spliced into llada_v prompts "
                                        r"only; a llada model takes none"):
        generate(model, [[5, 6, 7]], DecodeConfig(gen_length=4, block_length=4), images=images)


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_settings_that_cannot_train_are_one_line_in_a_real_process(cli, name):
    """max_steps=0, num_mc=-4, a non-finite lr or beta, an output directory that links to nothing or (given with
    ``~``, expanded to $HOME) is a file: exit 2 and one line naming the key, before any compute."""
    command, key, _, problem = SETTINGS[name]
    root, rc, err = cli[name]
    line = _one_error_line(err, command)
    assert rc == 2
    assert problem.format(root=root) in line and KEYS[key] in line, line
    assert not (root / name / "metrics.jsonl").exists()
