"""Reasoning tasks (vt_reason, niah_reason), per-step fidelity along long answers, and the report's refresh section
and plot."""

from __future__ import annotations

import json
import random
from itertools import pairwise

import pytest

from sfibench.engine.session import Session
from sfibench.metrics import quality
from sfibench.models.tokenizer import ByteTokenizer, Tokenizer
from sfibench.reporting.quality_long_fidelity import mean_per_step, plot_long_fidelity, rolling_mean
from sfibench.reporting.quality_refresh import refresh_section
from sfibench.runners.quality_batch import LONG_FIDELITY_STEPS, evaluate_batch, make_condition
from sfibench.workloads.base import PromptFormat
from sfibench.workloads.needle_list import needle_list
from sfibench.workloads.reasoning import NIAH_REASON_TOKENS, REASON_TOKENS, RETRIEVAL_KEYS
from sfibench.workloads.tasks import make_samples


@pytest.fixture(scope="module")
def tiny():
    return Session.open("tiny-llama", "cpu")


def _seeded_first_sample(task: str, chat: bool, target: int):
    """The first of two byte-tokenizer samples of `task` after checking that the same seed gives the same
    prompts and another seed or index another one; with its decoded text."""
    fmt = PromptFormat(Tokenizer(ByteTokenizer()), chat=chat)
    a, b, c = (make_samples(task, fmt, target, 2, seed=s) for s in (7, 7, 8))
    assert [s.prompt for s in a] == [s.prompt for s in b] and a[0].prompt != c[0].prompt != a[1].prompt
    return a[0], fmt.tokenizer.decode(a[0].prompt)


@pytest.mark.parametrize("chat", [True, False])
def test_vt_reason_is_seeded_and_asks_for_the_end_of_one_chain(chat):
    sample, text = _seeded_first_sample("vt_reason", chat, 4000)
    chain, value = sample.meta["chain"], sample.answers[0][0]
    assert f"VAR {chain[0]} = {value}." in text and all(f"VAR {y} = VAR {x}." in text
                                                         for x, y in pairwise(chain))
    assert all(f" = {v}." in text for v in sample.meta["distractor_values"]) and value not in sample.meta[
        "distractor_values"]
    assert f"What is the numeric value of VAR {chain[-1]}" in text and '"Answer: <number>"' in text
    assert sample.scorer == "final_answer" and sample.max_answer_tokens == REASON_TOKENS >= 256
    assert 0.97 * 4000 <= len(sample.prompt) <= 4000


@pytest.mark.parametrize("chat", [True, False])
def test_niah_reason_is_seeded_holds_every_needle_and_asks_for_one(chat):
    sample, text = _seeded_first_sample("niah_reason", chat, 5000)
    needles = sample.meta["needles"]
    values = [n["value"] for n in needles]
    assert len(needles) == RETRIEVAL_KEYS and len(set(values)) == RETRIEVAL_KEYS
    assert all(text.count(f"One of the special magic numbers for {n['key']} is: {n['value']}.") == 1
               for n in needles)
    asked = sample.meta["asked"]
    assert asked == needles[0]["key"] and sample.answers == [[needles[0]["value"]]]
    assert sample.meta["distractor_values"] == values[1:]
    assert f"What is the special magic number for {asked} mentioned" in text and '"Answer: <number>"' in text
    assert "one sentence for each special magic number" in text
    assert sample.scorer == "final_answer" and sample.max_answer_tokens == NIAH_REASON_TOKENS > REASON_TOKENS
    assert 0.97 * 5000 <= len(sample.prompt) <= 5000


def test_final_answer_scorer_on_hand_made_answers():
    reasoning = ("VAR QDFVN = VAR KWZHO. VAR KWZHO = VAR BJQTK. VAR BJQTK = VAR UFLVI. VAR UFLVI = VAR CGIOU. "
                 "VAR CGIOU = 53827, and 92336 belongs to another chain.\n")
    assert quality.score_answer("final_answer", reasoning + "Answer: 53827", ["53827"]) == 1.0
    assert quality.score_answer("final_answer", reasoning + "answer:53827.", ["53827"]) == 1.0
    # only the text after the last "Answer:" counts: a right value in the reasoning does not
    assert quality.score_answer("final_answer", reasoning + "Answer: 92336", ["53827"]) == 0.0
    assert quality.score_answer("final_answer", "Answer: 53827\nWait, Answer: 92336", ["53827"]) == 0.0
    assert quality.score_answer("final_answer", reasoning, ["53827"]) == 0.0  # no "Answer:" line
    assert quality.score_answer("final_answer", reasoning + "Answer: 538270", ["53827"]) == 0.0  # whole numbers
    assert quality.final_answer_text("no line here") is None
    # the final answer is the line of the last "Answer:" (or the next line when that one ends there): an echo of the
    # instruction followed by a list of every value, capped before the final line, has not answered
    echo = 'I will end with a final line of the form "Answer: <number>".\n\n1. 92336\n2. 53827\n'
    assert quality.score_answer("final_answer", echo, ["53827"]) == 0.0
    assert quality.score_answer("final_answer", echo + "So the number asked for is the second.\nAnswer: 53827",
                                ["53827"]) == 1.0
    assert quality.score_answer("final_answer", reasoning + "**Answer:**\n\n53827\n", ["53827"]) == 1.0
    assert quality.score_answer("final_answer", reasoning + "Answer:\n\n92336\n53827", ["53827"]) == 0.0


def test_long_answers_keep_fidelity_per_decode_step(tiny):
    """An answer of >= 256 steps keeps one KL and one top-1 entry per decode step of the teacher-forced run (whose
    means are the record's kl and top1_agreement) and the slow steps among them; Full-KV and short answers keep
    none."""
    fmt = PromptFormat(tiny.loaded.tokenizer, chat=False)
    samples = [needle_list(fmt, 800, random.Random(5), 0, 3, "niah_list")]
    context = len(samples[0].prompt)
    conds = [make_condition("full_kv", None, context), make_condition("sfi", 0.3, context)]
    full, sfi = evaluate_batch(tiny, samples, conds)
    assert "kl_steps" not in full
    steps = full["answer_tokens"] - 1  # the first answer token comes from the prefill, not a decode step
    assert len(sfi["kl_steps"]) == len(sfi["top1_steps"]) == steps >= LONG_FIDELITY_STEPS
    assert sum(sfi["top1_steps"]) / steps == pytest.approx(sfi["top1_agreement"])
    assert sum(sfi["kl_steps"]) / steps == pytest.approx(sfi["kl"], rel=1e-2)
    slow = sfi["taught_slow_steps"]
    assert len(slow) >= 2 and all(0 <= s < steps for s in slow) and slow == sorted(slow)
    short = [needle_list(fmt, 800, random.Random(9), 0, 1, "niah_list")]
    short[0].max_answer_tokens = 40
    assert all("kl_steps" not in r for r in evaluate_batch(tiny, short, conds))


def _record(task, method, retention, slow, index=0, **extra):
    kinds = {"dense": 30} if method == "full_kv" else (
        {"slow": slow, "fast": 30 - slow} if method == "sfi" else {"sparse": 30})
    return {"task": task, "context": 2048, "method": method, "retention": retention, "index": index,
            "steps_by_kind": kinds, **extra}


def test_refresh_section_says_where_a_refresh_never_fired():
    new = [_record("niah_single", "sfi", 0.15, 0, i, slow_steps=0, slow_interval=None, answer_tokens=9,
                   answer_capped=False) for i in range(2)]
    new += [_record("niah_list", "sfi", 0.15, s, i, slow_steps=s, slow_interval=iv, answer_tokens=300,
                    answer_capped=c, exact_match=1.0) for i, (s, iv, c) in enumerate([(5, 20.0, False),
                                                                                         (3, 30.0, True)])]
    new += [_record("niah_list", "snapkv", 0.15, 0, 0, slow_steps=0, slow_interval=None, answer_tokens=310,
                    answer_capped=False)]
    text = "\n".join(refresh_section(new))
    assert "sfi's refresh never fired on niah_single" in text and "never fired on niah_list" not in text
    assert "snapkv" not in text.split("| task |")[0]  # a method without slow steps gets no sentence
    # 8 slow steps over 2 answers; pooled interval: (4 gaps of 20 + 2 of 30) / 6
    assert "| niah_list | 2048 | sfi | 0.15 | 4.00 | 2/2 | 23.3 | 300.0 | 0.50 |" in text
    assert "niah_list @ 2048 sfi@0.15 1.00" in text
    # records from before the fields: slow steps from the step kinds, the rest a dash
    old = [_record("niah_single", "sfi", 0.15, 0, i) for i in range(3)]
    text = "\n".join(refresh_section(old))
    assert "sfi's refresh never fired on niah_single" in text and "| 0.00 | 0/3 | – | – | – |" in text
    assert refresh_section([]) == []


def test_long_fidelity_plot_and_its_curves(tmp_path):
    assert rolling_mean([1.0, 3.0, 5.0, 7.0], 2).tolist() == [1.0, 2.0, 4.0, 6.0]
    assert mean_per_step([[1.0, 2.0, 3.0], [3.0]]).tolist() == [2.0, 2.0, 3.0]
    records = [_record("niah_list_64", m, 0.15, 2, i, kl_steps=[0.01 * (i + 1)] * 300, top1_steps=[1] * 150 + [0] * 150,
                       taught_slow_steps=[17, 40] if m == "sfi" else [])
               for m in ("sfi", "snapkv") for i in range(2)]
    made = plot_long_fidelity(records, tmp_path / "long_fidelity.png", {"sfi": "tab:red", "snapkv": "tab:blue"})
    assert made is not None and made.stat().st_size > 10_000
    assert plot_long_fidelity([_record("niah_single", "sfi", 0.15, 0)], tmp_path / "none.png", {}) is None
    json.dumps(records)  # the arrays are plain JSON numbers
    for r in records:
        r["kl_steps"] = [0.1] * 75 + [0.0] * 150 + [0.3] * 75  # first quarter 0.1, last 0.3
    table = "\n".join(refresh_section(records))
    assert "## Fidelity along long answers" in table
    assert "| niah_list_64 | 2048 | 0.15 | sfi | 2 | 300 | 0.100 | 0.300 | 1.00 | 0.00 | 2.0 |" in table
    assert "| niah_list_64 | 2048 | 0.15 | snapkv | 2 | 300 | 0.100 | 0.300 | 1.00 | 0.00 | 0.0 |" in table


def test_vt_reason_with_a_method_that_reads_everything_scores_as_full_kv(tiny):
    fmt = PromptFormat(tiny.loaded.tokenizer, chat=True)
    samples = make_samples("vt_reason", fmt, 1200, 2, seed=3)
    for sample in samples:
        sample.max_answer_tokens = 48  # the scoring path, not the reasoning length, is under test here
    context = max(len(s.prompt) for s in samples)
    whole = 4 * (context + 48)
    records = evaluate_batch(tiny, samples, [make_condition("full_kv", None, context),
                                             make_condition("sfi", whole / context, context)])
    full, reader = records[:2], records[2:]  # one condition after the other, each over the batch
    assert [r["method"] for r in full] == ["full_kv"] * 2 and [r["method"] for r in reader] == ["sfi"] * 2
    assert [(r["prediction"], r["score"]) for r in reader] == [(r["prediction"], r["score"]) for r in full]


@pytest.mark.parametrize("task", ["niah_list", "niah_list_64", "vt_reason"])
def test_lengths_hit_the_target_in_smollm2_tokens(task):
    from transformers import AutoTokenizer

    from sfibench.models.loading import MissingWeightsError, find_smollm2_gguf

    try:
        path = find_smollm2_gguf()
    except MissingWeightsError:
        pytest.skip("smollm2-135m weights are not installed")
    fmt = PromptFormat(Tokenizer(AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)), chat=True)
    for sample in make_samples(task, fmt, 4096, 2, seed=1):
        assert 0.97 * 4096 <= len(sample.prompt) <= 4096
    if task == "niah_list_64":  # the long-fidelity workload: a right answer takes more than 1,024 tokens
        asked, values = sample.meta["asked"], sample.answers[0]
        right = " ".join(f"The special magic number for {k} is {v}." for k, v in zip(asked, values))
        assert 1024 < fmt.count(right) < sample.max_answer_tokens
