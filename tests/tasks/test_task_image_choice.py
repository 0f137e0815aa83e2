"""Multiple choice over an image (letter extraction, option columns, rewards) and math over an image (the math
verifier on the boxed answer)."""

from __future__ import annotations

import pytest
from PIL import Image

from dllm_rl.tasks import DataError, get_task
from dllm_rl.tasks.image_choice import extract_choice

IMG = Image.new("RGB", (8, 8), (0, 128, 255))


@pytest.mark.parametrize("text, letter", [
    ("B", "B"), ("(B)", "B"), ("B.", "B"), ("B) a book", "B"), ("C: the cup", "C"),
    ("The answer is B", "B"), ("the answer is (D).", "D"), ("Answer: C", "C"), ("The answer is option A.", "A"),
    ("<answer>B</answer>", "B"), ("<answer> (c) </answer>", "C"),
    ("think <answer>A</answer> then <answer>D</answer>", "D"),
    ("\\boxed{b}", "B"), ("Looking at the image, the cup is blue.\nB", "B"), ("Reasoning...\n(A) red", "A"),
    ("The answer is B, not C. So the answer is C", "C"),  # the last statement wins
    ("A cup stands on the table.", None), ("The answer is a cup", None), ("b", None), ("answer is Bob", None),
    ("<answer>a book</answer>", None), ("", None),
])
def test_letter_extraction(text, letter):
    assert extract_choice(text) == letter


def test_options_from_lists_seed_bench_and_mmbench_columns():
    rows = [{"question": "Colour?", "options": ["red", "green", "blue"], "answer": "(c)", "image": IMG},
            {"question": "Colour?", "choice_a": "red", "choice_b": "blue", "choice_c": "green", "choice_d": "black",
             "answer": "B", "image": IMG},
            {"question": "Colour?", "A": "red", "B": "blue", "C": None, "D": None, "answer": 1, "image": IMG},
            {"question": "Colour?", "options": "['red', 'blue']", "answer": "A", "image": IMG}]
    task = get_task("image_choice", data=rows)
    assert [ex["options"] for ex in task.examples] == [
        ["red", "green", "blue"], ["red", "blue", "green", "black"], ["red", "blue"], ["red", "blue"]]
    assert [ex["answer_letter"] for ex in task.examples] == ["C", "B", "B", "A"]
    assert task.examples[1]["prompt"] == ("<image>\nColour?\nA. red\nB. blue\nC. green\nD. black\n"
                                          "Answer with the option's letter from the given choices directly.")
    assert [task.reference_completion(ex) for ex in task.examples] == ["C", "B", "B", "A"]
    with pytest.raises(DataError, match=r"^rows\[0\]: field 'answer' must be an option letter A-C or a 0-based "
                                        r"index, got 'D'$"):
        get_task("image_choice", data=[{**rows[0], "answer": "D"}]).load()
    with pytest.raises(DataError, match=r"^rows\[0\]: need 2 to 8 options \('options' list, 'choice_a'.. or 'A'.. "
                                        r"columns\), found 1$"):
        get_task("image_choice", data=[{"question": "?", "choice_a": "x", "answer": "A", "image": IMG}]).load()


def test_choice_rewards():
    task = get_task("image_choice", data=[{"question": "Colour?", "choices": ["red", "blue", "green"],
                                           "answer": "B", "image": IMG}])
    ex = task.examples[0]
    got = [(float(s), s.reason) for s in task.score_examples(
        ["The answer is B", "<answer>(A)</answer>", "D", "I am not sure."], [ex] * 4)]
    assert got == [(1.0, "correct: B"), (0.0, "wrong: got A, expected B"), (0.0, "no option D (3 options)"),
                   (0.0, "no option letter (e.g. 'B', '(B)', 'The answer is B', <answer>B</answer>)")]
    reward = task.reward_fn
    assert reward.__name__ == "image_choice_reward"
    assert [float(x) for x in reward(None, ["(B)", "C."], options=[ex["options"]] * 2,
                                     answer_letter=["B", "B"])] == [1.0, 0.0]


def test_image_math_uses_the_math_verifier_on_the_boxed_answer():
    rows = [{"question": "The figure shows a square of side 1. What is half its area?", "answer": "\\frac{1}{2}",
             "image": IMG},
            {"problem": "What is the angle at <image> vertex A?", "solution": "so \\boxed{90^\\circ}", "image": IMG}]
    task = get_task("image_math", data=rows)
    try:
        first, second = task.examples
        assert first["prompt"] == ("<image>\nThe figure shows a square of side 1. What is half its area?\n"
                                   "Please reason step by step, and put your final answer within \\boxed{}.")
        assert second["prompt"].startswith("What is the angle at <image> vertex A?") and second["answer"] == "90^\\circ"
        scores = task.score_examples(["so \\boxed{0.5}", "\\boxed{\\dfrac{1}{2}}", "\\boxed{1/3}", "no box"],
                                     [first] * 4)
        assert [float(s) for s in scores] == [1.0, 1.0, 0.0, 0.0]
        assert scores[0].reason == "correct: equivalent (math-verify)"
        assert scores[1].reason == "correct (exact match)"
        assert scores[3].reason == "no \\boxed{} answer"
        assert task.images(first)[0].getpixel((0, 0)) == (0, 128, 255)
    finally:
        task.close()


def test_default_data_of_the_image_tasks():
    assert get_task("image_choice").default_data() == "hf:lmms-lab/SEED-Bench@test"
    assert get_task("image_math", split="train").default_data() == "hf:FanqingM/MMK12@train"
    with pytest.raises(FileNotFoundError, match=r"^task 'shapes' has no default data; pass data=<file>$"):
        get_task("shapes").default_data()
