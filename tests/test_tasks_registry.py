"""The task registry and the prompts: every prompt text is byte-for-byte d1's, checked by
SHA-256 digests taken once from d1's own source (diffu-grpo/data_utils.py run on the
examples below, the *_SYSTEM_PROMPT constants of eval/*.py and SFT/sft_trainer.py)."""

import dataclasses
import hashlib

import pytest

from d1jax.tasks import EVAL_PREFILL, TASK_NAMES, Task, format_prompt, get_task, s1k


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


D1_DIGESTS = {
    "xml": "39e8b2254589acc4716a5b71aaae32e1292aebbddf365c3a6199bd62c6e63309",
    "gsm8k_eval": "f11d75a706090b9523845d4a5314e268dcc1bd4bb3c76fdac3377e1504c0f1c2",
    "math500_eval": "3e82f3bac66b3bc1c8c3e02b804c0ac8388513b60cf078a30e30c7e35e7297e8",
    "sudoku": "758dc4e1b10cba4dca68348f590e014545d57b5a36e7370c36e73ed5c25f58d7",
    "countdown_eval": "a303f737bca286cbdcc4b6e837caa783665115cc2fb96d3a25a4e68d7a1d4fd1",
    "sft": "29d62d8e1d52bdb3ed7dba9ebb148faea5425753003fbcde5cd0aca4c35910a6",
    # User turns d1's GRPO data functions build for these examples.
    "train_gsm8k": "c50297784e94c4711927c2ca6422ab6748916f9223769dbc17643114013cd5a9",
    "train_countdown": "bc134344e840aa8c1a4ab236077531165a26ba0e49b5525d3cba35b4c7110191",
    "train_math500": "c1fe237b7bcb52128d5e86ce1c5cb582fd746e50acdf23b564481a5f1df9cbee",
    "train_sudoku": "57e2cb83f8be1228fcaf1c37e29809d05ccbf01d88fc5bad4a7a2cf8e261456f",
}
EXAMPLES = {"gsm8k": {"question": "Q?", "answer": "72", "solution": "x #### 72"},
            "countdown": {"nums": [30, 100, 93], "target": 23},
            "math500": {"problem": "What is $1+1$?", "solution": "It is \\boxed{2}.", "answer": "2"},
            "sudoku": {"puzzle": "0034300020430020", "solution": "1234341221434321"}}


def test_prompts_are_d1s():
    tasks = {n: get_task(n) for n in TASK_NAMES}
    assert sha(tasks["gsm8k"].system_prompt) == D1_DIGESTS["xml"]
    assert tasks["math500"].system_prompt == tasks["countdown"].system_prompt == tasks["gsm8k"].system_prompt
    assert sha(tasks["sudoku"].system_prompt) == D1_DIGESTS["sudoku"]
    assert sha(tasks["sudoku"].eval_system_prompt) == D1_DIGESTS["sudoku"]
    for name in ("gsm8k", "math500", "countdown"):
        assert sha(tasks[name].eval_system_prompt) == D1_DIGESTS[f"{name}_eval"]
    assert sha(s1k.SFT_SYSTEM_PROMPT) == D1_DIGESTS["sft"]
    for name, task in tasks.items():
        (msg,) = task.build_messages(EXAMPLES[name])
        assert msg["role"] == "user" and sha(msg["content"]) == D1_DIGESTS[f"train_{name}"]


def test_eval_messages_follow_eval_py():
    gsm = get_task("gsm8k")
    (msg,) = gsm.build_eval_messages(EXAMPLES["gsm8k"])
    assert msg["content"] == gsm.eval_system_prompt + "\n\nQ?"
    (msg,) = get_task("countdown").build_eval_messages(EXAMPLES["countdown"])
    assert msg["content"].endswith("</answer>\n\nNumbers: [30, 100, 93]\nTarget: 23")


# LLaDA-8B-Instruct's chat template (tokenizer_config.json), written out here.
LLADA_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]")),
                                  bos_token="<|startoftext|>", eos_token="<|endoftext|>")
    tok.chat_template = LLADA_TEMPLATE
    return tok


def test_format_prompt_applies_the_chat_template(tokenizer):
    task = get_task("sudoku")
    messages = task.build_messages(EXAMPLES["sudoku"])
    expected = ("<|startoftext|><|start_header_id|>user<|end_header_id|>\n\n"
                + messages[0]["content"].strip()
                + "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert format_prompt(tokenizer, messages) == expected
    assert task.eval_prompt(tokenizer, EXAMPLES["sudoku"]) == expected + EVAL_PREFILL


def test_registry_shape():
    names = {"gsm8k": ["xmlcount_reward_func", "soft_format_reward_func",
                       "strict_format_reward_func", "int_reward_func", "correctness_reward_func"],
             "math500": ["correctness_reward_func_math", "boxed_and_answer_tags_format_reward"],
             "sudoku": ["sudoku_reward_func"], "countdown": ["countdown_reward_func"]}
    for name, funcs in names.items():
        task = get_task(name)
        assert isinstance(task, Task) and task.name == name
        assert [f.__name__ for f in task.reward_funcs] == funcs  # d1's logged metric names
        assert task.reward_weights == (1.0,) * len(funcs)       # TRL's default, as d1 runs
        with pytest.raises(dataclasses.FrozenInstanceError):
            task.name = "x"
    assert get_task("math").name == "math500"
    with pytest.raises(ValueError, match="unknown task 'mnist'"):
        get_task("mnist")
    with pytest.raises(ValueError, match="s1k.load_train"):
        get_task("s1k")


def test_reward_batch_shapes_and_total():
    task = get_task("gsm8k")
    good = "<reasoning>\nx\n</reasoning>\n<answer>\n72\n</answer>\n"
    assert task.total_reward([good, ""], [EXAMPLES["gsm8k"]] * 2) == [3.5, 0.0]
    with pytest.raises(ValueError, match="2 completions but 1 examples"):
        task.reward_funcs[0]([good, good], [EXAMPLES["gsm8k"]])


@pytest.mark.parametrize("name, text, expected", [
    ("gsm8k", "<answer>\\boxed{72}</answer>", True),
    ("math500", "<answer>\\boxed{2}</answer>", True),
    ("countdown", "<answer>\\boxed{100-93+30-14}</answer>", False),
    ("countdown", "<answer>\\boxed{30-(100-93)}</answer>", True),
    ("sudoku", "<answer>1234341221434321</answer>", 1.0),
    ("sudoku", "<answer>1234</answer>", pytest.approx(2 / 9)),  # 2 of 9 empty cells
])
def test_eval_protocol_on_examples(name, text, expected):
    task = get_task(name)
    v = task.verdict(task.record(EXAMPLES[name], text))  # what d1jax.eval.score reads
    assert (v.credit if name == "sudoku" else v.correct) == expected
    assert v.extracted is not None
