"""Every command the README and ``docs/`` show works as shown.

Each line of a fenced shell block is one command (``\\`` continuations joined, ``#`` comments dropped):

* ``dllm-rl ...`` / ``python -m dllm_rl ...``: parsed by the real parser (a renamed flag or subcommand fails here),
  its config loaded with its overrides (a renamed key fails here); then, when it needs nothing but this
  repository, run in-process (``dllm_rl.cli.main``) on the shipped demo checkpoints with tiny settings
  (``CHEAP``: one step, two held-out items), in a scratch directory. A command that names a hub checkpoint or
  data the repository does not hold stops after the parse and the config: it needs a download, a GPU or hours.
* ``accelerate launch ...``: its options parse with accelerate's own parser, its ``--config_file`` exists, and the
  ``-m dllm_rl`` part is checked as above (parse and config; launches themselves run in ``tests/scale``).
* ``make ...``: the target and the variables exist in the Makefile (``make test`` is this suite).

Placeholders in upper case (``MODEL_DIR``, ``CONFIG.yaml``, ...) stand for the demo files (``PLACEHOLDERS``). A
command of any other program fails the test until this file says how to check it (``NOT_OURS`` lists the
third-party ones shown only for convenience).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from front_end_table import COMMANDS as FRONT_END
from front_end_table import command_name, config_class

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "src" / "dllm_rl" / "assets" / "demo"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(?:bash|sh|shell)\n(.*?)^```", re.M | re.S)
NOT_OURS = {"tensorboard", "curl"}  # a viewer of what run.report_to=tensorboard writes; an HTTP client

#: upper-case placeholders of the docs -> what the test puts there (RUN_DIR: a run the test makes)
PLACEHOLDERS = {
    "MODEL_DIR": str(DEMO / "sdar-countdown"),
    "MODEL": str(DEMO / "sdar-countdown"),
    "CHECKPOINT": str(DEMO / "sdar-countdown"),
    "TEXT": "nums 6 2 1 target 14",
    "N": "2",
}
#: CONFIG.yaml stands for the demo config of each trainer, with the demo's files (its YAML names them relative
#: to the demo folder, which only `dllm-rl demo` resolves)
CONFIGS = {
    "rl": (str(DEMO / "rl-block.yaml"), [f"model.path={DEMO / 'sdar-countdown'}",
                                          f"data.train_file={DEMO / 'countdown_train.jsonl'}",
                                          f"eval.data={DEMO / 'countdown_heldout.jsonl'}"]),
    "sft": (str(ROOT / "configs" / "demo-sft.yaml"), []),
}
#: the settings that make a run of each subcommand cost seconds; OUT is the run's scratch directory
CHEAP = {
    "rl": ["train.max_steps=1", "eval.limit=2", "train.prompts_per_step=2", "rollout.num_generations=2",
           "run.output_dir=OUT"],
    "demo": ["train.max_steps=1", "eval.limit=2", "train.prompts_per_step=2", "rollout.num_generations=2"],
    "sft": ["train.max_steps=1", "train.micro_batch_size=4", "run.output_dir=OUT"],
}
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@\S+)?$")


@dataclass
class Command:
    where: str  # file:line
    line: str
    words: list[str] = field(default_factory=list)


def doc_commands() -> list[Command]:
    """Every command line of the fenced shell blocks of the README and docs/."""
    out = []
    for md in DOCS:
        text = md.read_text()
        for block in FENCE.finditer(text):
            first = text.count("\n", 0, block.start(1)) + 1
            for i, line in _joined_lines(block.group(1)):
                shell = re.sub(r"\$\(\([^)]*\)\)|\$\w+", "2", line)  # $NNODES, $((8 * NNODES)): any number
                words = shlex.split(re.sub(r"\s\[[A-Z_ .]+\]", "", shell), comments=True)  # [RUN_DIR ...]: optional
                if words:
                    out.append(Command(f"{md.relative_to(ROOT)}:{first + i}", line, words))
    return out


def _joined_lines(block: str) -> list[tuple[int, str]]:
    lines, start, acc = [], 0, ""
    for i, line in enumerate(block.splitlines()):
        if not acc:
            start = i
        acc += line.rstrip()
        if acc.endswith("\\"):
            acc = acc[:-1] + " "
            continue
        lines.append((start, acc))
        acc = ""
    return lines


def _without_env(words: list[str]) -> list[str]:
    i = 0
    while i < len(words) and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[i]):
        i += 1
    return words[i:]


def dllm_rl_argv(words: list[str]) -> list[str] | None:
    """The dllm-rl arguments of a command line (None: not a dllm-rl command)."""
    if words[:1] == ["dllm-rl"]:
        return words[1:]
    if words[:3] == ["python", "-m", "dllm_rl"]:
        return words[3:]
    return None


def substituted(argv: list[str], run_dir: Path | None) -> tuple[list[str], list[str]]:
    """argv with its placeholders filled in, and the overrides the config placeholder brings."""
    out, extra = [], []
    for word in argv:
        if word == "CONFIG.yaml":
            config, extra = CONFIGS["sft" if argv[0] == "sft" else "rl"]
            out.append(config)
        elif word == "RUN_DIR":
            out.append(str(run_dir))
        else:
            out.append(PLACEHOLDERS.get(word, word))
    return out, extra


def _local(path: str) -> Path | None:
    for p in (Path(path), ROOT / path):
        if p.exists():
            return p.resolve()
    return None


def checked_config(argv: list[str], extra: list[str]):
    """Load the config of a command on the one front end (``front_end_table.COMMANDS``) with its words, overrides
    and flags, its repository paths made absolute (None for other commands: a ``--help`` that printed)."""
    from dllm_rl.config.command import load_command
    from dllm_rl.rl.cli import demo_config

    args = _parse(argv)
    if not hasattr(args, "words"):
        return None
    args.words = [_absolute(word) for word in args.words] + extra
    if args.command == "demo":
        return demo_config(args)[1]
    command = command_name(args)
    return load_command(config_class(command), args, None, positional=FRONT_END[command][2])


def _parse(argv: list[str]):
    from dllm_rl.cli import build_parser, parse_words

    try:
        return parse_words(build_parser(), argv)
    except SystemExit as exc:  # argparse's way of saying no (0: a --help / --help-config that printed)
        if exc.code == 0:
            import argparse

            return argparse.Namespace(command=argv[0])
        raise AssertionError(f"dllm-rl {' '.join(argv)}: does not parse (exit {exc.code})") from None


def needs_more_than_the_repo(argv: list[str], cfg) -> str | None:
    """Why a command cannot run here (a hub id, a file or task data the repository does not hold), or None."""
    from dllm_rl.tasks import get_task

    if argv[0] == "serve":  # runs until stopped: parsed here, served by tests/serve on 127.0.0.1
        return "a server runs until it is stopped"
    for word in argv[1:]:
        if not word.startswith("-") and "=" not in word and HUB_ID.match(word) and _local(word) is None:
            return f"{word} is not in the repository"
    model = getattr(cfg, "model", None)
    trained = getattr(model, "path", None) or ""
    if trained.startswith("runs/") and _local(trained) is None:  # a model an earlier command of the docs trains
        return f"{trained} is not in the repository"
    task = getattr(cfg, "task", None)
    if model is not None and task and _local(task) is None:
        # a benchmark task a model decodes: its data may be on the hub or in the benchmark-data folder beside the
        # repository, and either way its prompts are longer than the demo models' context (128), so it needs a
        # real checkpoint (``data make TASK`` writes a task's data: no model)
        get_task(task)  # the name must exist
        return f"the {task} benchmark needs a real checkpoint"
    if trained and _local(trained) is None:  # an empty model.path: SFT's fresh model
        if HUB_ID.match(trained):
            return f"model {trained} is on the hub"
        return None  # neither a directory nor a hub id: it runs, and fails
    data = getattr(cfg, "train_data", None) or getattr(getattr(cfg, "data", None), "train_file", None)
    if isinstance(data, str) and _local(data) is None:
        return f"the training data {data} is the user's own"
    return None


def cheap(argv: list[str], out: Path) -> list[str]:
    """argv with tiny settings: one step, two items, outputs in ``out``."""
    argv = [_absolute(w) for w in argv]
    sub = argv[0]
    argv += [o.replace("OUT", str(out / sub)) for o in CHEAP.get(sub, [])]
    if sub == "demo":
        argv[1:1] = ["--output-dir", str(out / "demo")]
    if sub == "eval":
        argv = _set_flag(_set_flag(argv, "--limit", "2"), "-o", str(out / "eval"))
    if sub == "data":
        argv = _set_flag(argv, "--n", "20")
    return argv


def _absolute(word: str) -> str:
    """A repository path (alone or as an override's value) made absolute: the run happens elsewhere."""
    key, eq, value = word.rpartition("=") if "=" in word and not word.startswith("-") else ("", "", word)
    local = _local(value) if "/" in value else None
    return word if local is None else f"{key}{eq}{local}"


def _set_flag(argv: list[str], flag: str, value: str) -> list[str]:
    if flag in argv:
        i = argv.index(flag)
        return argv[: i + 1] + [value] + argv[i + 2:]
    return argv + [flag, value]


COMMANDS = doc_commands()
DISTINCT = list({c.line: c for c in reversed(COMMANDS)}.values())[::-1]  # a command shown twice runs once


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A finished one-step RL run of the demo config: what RUN_DIR stands for."""
    from dllm_rl.cli import main

    out = tmp_path_factory.mktemp("docs_run") / "rl"
    config, extra = CONFIGS["rl"]
    assert main(["rl", config, *extra, *CHEAP["rl"][:-1], f"run.output_dir={out}"]) == 0
    return out


def test_the_docs_show_commands():
    """The parser below sees the README's and docs' command blocks (a format change would hide them)."""
    readme = [c for c in COMMANDS if c.where.startswith("README.md")]
    assert len(readme) >= 20
    assert any(c.words[:2] == ["dllm-rl", "plot"] for c in readme)
    assert any(c.words[:2] == ["accelerate", "launch"] for c in readme)


def prepared(words: list[str], run_dir: Path | None) -> tuple[list[str], str | None]:
    """A dllm-rl command line of the docs, parsed and its config loaded: its arguments with the placeholders
    filled in, and why it cannot run here (None: it can)."""
    argv, extra = substituted(dllm_rl_argv(_without_env(words)), run_dir)
    cfg = checked_config(argv, extra)
    return argv + extra, needs_more_than_the_repo(argv, cfg)


def run_doc_command(words: list[str], run_dir: Path | None, scratch: Path) -> int | str:
    """Check a dllm-rl command line of the docs: its exit status when it ran, else why it could not run here."""
    from dllm_rl.cli import main

    argv, why = prepared(words, run_dir)
    if why:
        return why
    try:
        return main(cheap(argv, scratch))
    except SystemExit as exc:  # --help-config prints and exits, as --help does
        return exc.code


@pytest.mark.parametrize("command", [c for c in DISTINCT if dllm_rl_argv(c.words) is not None],
                         ids=lambda c: c.where)
def test_a_dllm_rl_command_of_the_docs_works(command, request, tmp_path, monkeypatch, capsys):
    run_dir = request.getfixturevalue("run_dir") if "RUN_DIR" in command.words else None
    monkeypatch.chdir(tmp_path)  # relative outputs (runs/..., out.jsonl) go to the scratch directory
    result = run_doc_command(command.words, run_dir, tmp_path)
    assert result == 0 or isinstance(result, str), (
        f"{command.where}: {command.line}\n{capsys.readouterr().err[-2000:]}")


def test_what_runs_and_what_is_only_parsed(tmp_path):
    """The lines that need the hub (or the user's own data) stop after the parse; every other line runs. Pinned,
    so that a change of the rules (or of the docs) cannot quietly turn commands into parse-only ones."""
    why = [prepared(c.words, tmp_path)[1] for c in DISTINCT if dllm_rl_argv(c.words) is not None]
    assert sorted(w for w in why if w) == [
        "Gen-Verse/TraDo-4B-Instruct is not in the repository",  # dllm-rl eval Gen-Verse/TraDo-4B-Instruct
        "a server runs until it is stopped",  # dllm-rl serve
        "model Gen-Verse/TraDo-4B-Instruct is on the hub",  # dllm-rl rl configs/trado-tracerl-math.yaml
        "runs/cf/llada-r2/model is not in the repository",  # dllm-rl eval of the second round's full model
        "runs/cf/llada-s2/model is not in the repository",  # its data: the first round's model decodes the puzzles
        "runs/cf/llada-s2/model is not in the repository",  # its sft starts from the first round's model
        "runs/cf/llada/model is not in the repository",  # dllm-rl eval of the certainty-forced full model
        "runs/cf/sdar/model is not in the repository",  # dllm-rl eval of the certainty-forced model (results.md)
        "runs/trado-tracerl-math is not in the repository",  # dllm-rl plot of that run
        "the gsm8k benchmark needs a real checkpoint",  # dllm-rl eval MODEL_DIR --task gsm8k
        "the training data runs/cf/data-full/items/default.jsonl is the user's own",  # the full model's sft
        "the training data runs/cf/data/items/default.jsonl is the user's own",  # its sft on the model's answers
        "the training data runs/cf/data/items/default.jsonl is the user's own",  # the plain-SFT baseline on them
    ]
    assert why.count(None) == 18  # every other command runs (a new one in the docs: count it here)


@pytest.mark.parametrize(("line", "why"), [
    ("dllm-rl generate runs/x/final --prompt hi", "runs/x/final is not in the repository"),
    ("dllm-rl info runs/x/final", "runs/x/final is not in the repository"),
    ("dllm-rl trace runs/x/final --prompt hi -o t.html", "runs/x/final is not in the repository"),
    ("dllm-rl pairs --model.path MODEL_DIR --task gsm8k --out p.jsonl", "the gsm8k benchmark needs a real checkpoint"),
    ("dllm-rl eval MODEL_DIR task=math", "the math benchmark needs a real checkpoint"),
    ("dllm-rl pairs model.path=Org/Model --task src/dllm_rl/assets/demo/countdown_train.jsonl --out p.jsonl",
     "model Org/Model is on the hub"),
    ("dllm-rl data make countdown --n 5 --out d.jsonl", None),
    ("dllm-rl demo --model gemma --train.max-steps 1 beta=0", None),
    ("dllm-rl demo model.path=Org/Model", "model Org/Model is on the hub"),
])
def test_the_rules_read_the_config_of_every_front_end_command(line, why, tmp_path):
    """Each command's config, as its loader reads it, says what it needs: a model an earlier command trains
    (runs/...), a benchmark task a model decodes, a hub model: the loader of every command, not its words."""
    assert prepared(shlex.split(line), tmp_path)[1] == why


@pytest.mark.parametrize(("line", "error"), [
    ("dllm-rl generate MODEL_DIR --prompt TEXT --thresh0ld 0.9", "does not parse"),
    ("dllm-rl sampl MODEL_DIR", "does not parse"),
    ("dllm-rl rl CONFIG.yaml optim.lrr=1e-4", "optim.lrr"),
])
def test_a_broken_doc_command_fails(line, error, tmp_path):
    with pytest.raises(Exception, match=error):
        run_doc_command(shlex.split(line), None, tmp_path)


def test_a_doc_command_that_fails_when_run_is_caught(tmp_path, monkeypatch, capsys):
    """The old README line: the demo YAML names its model relative to the demo folder, which only
    `dllm-rl demo` resolves, so from the repository root it ends with a one-line error."""
    monkeypatch.chdir(tmp_path)
    line = "dllm-rl rl src/dllm_rl/assets/demo/rl-block.yaml algorithm=espo optim.lr=1e-4"
    assert run_doc_command(shlex.split(line), None, tmp_path) == 2
    assert "sdar-countdown/config.json: no config.json" in capsys.readouterr().err


@pytest.mark.parametrize("command", [c for c in DISTINCT if c.words[:2] == ["accelerate", "launch"]],
                         ids=lambda c: c.where)
def test_an_accelerate_launch_of_the_docs_parses(command, tmp_path):
    from accelerate.commands.launch import launch_command_parser

    words = [PLACEHOLDERS.get(w, w) for w in _without_env(command.words)]
    args = launch_command_parser().parse_args(words[2:])
    if args.config_file:
        assert (ROOT / args.config_file).is_file(), f"{command.where}: no {args.config_file}"
    assert args.module and args.training_script == "dllm_rl", f"{command.where}: not a -m dllm_rl launch"
    argv, extra = substituted(args.training_script_args, tmp_path)
    checked_config(argv, extra)


def test_make_lines_of_the_docs_name_targets_and_variables():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w.-]+):", makefile, flags=re.M))
    variables = set(re.findall(r"^(\w+) \?=", makefile, flags=re.M))
    lines = [c for c in COMMANDS if c.words[0] == "make"]
    assert lines
    for c in lines:
        for word in c.words[1:]:
            name, eq, _ = word.partition("=")
            assert (name in variables) if eq else (word in targets), f"{c.where}: {word} is not in the Makefile"


def test_every_command_of_the_docs_is_checked():
    checked = {"dllm-rl", "python", "accelerate", "make"} | NOT_OURS
    unknown = [f"{c.where}: {c.line}" for c in COMMANDS if _without_env(c.words)[0] not in checked]
    pythons = [c for c in COMMANDS if c.words[0] == "python" and dllm_rl_argv(c.words) is None]
    assert unknown == [] and pythons == []


def _table_rows(text: str, header: str) -> list[str]:
    start = text.index(header)
    return re.findall(r"^\|.*\|$", text[start:].split("\n\n", 1)[0], flags=re.M)


def test_the_readme_results_table_is_the_one_in_docs_results():
    """The README shows one measured table; docs/results.md keeps it with its command: the two stay the same."""
    header = "| method | model | before | after (per seed) | gain (mean ± sd) | steps |"
    readme = _table_rows((ROOT / "README.md").read_text(), header)
    assert len(readme) == 8
    assert readme == _table_rows((ROOT / "docs" / "results.md").read_text(), header)


def test_the_readme_is_read_in_one_sitting():
    """Under 250 lines: the details live in docs/, linked from it."""
    assert len((ROOT / "README.md").read_text().splitlines()) < 250
