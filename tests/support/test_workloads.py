"""Quality workloads: lengths hit their token targets, answers are where the prompts say, bad input fails clearly."""

from __future__ import annotations

import itertools
import json
import random
import re
from collections import Counter

import pytest

from sfibench.core.errors import UsageError
from sfibench.models.tokenizer import ByteTokenizer, Tokenizer
from sfibench.workloads.base import (
    LENGTH_TOLERANCE,
    ContextSizeError,
    PromptFormat,
    UnknownTaskError,
    fit_to_tokens,
)
from sfibench.workloads.haystack import DEFAULT_DEPTHS, essay_sentences, insert_at_depths
from sfibench.workloads.longbench import LongBenchError, longbench_files, longbench_samples
from sfibench.workloads.tasks import get_task, make_samples

TASKS = ["passkey", "niah_single", "niah_single_word", "niah_multikey", "niah_multivalue", "niah_multiquery", "niah_multiturn",
         "vt", "cwe", "fwe", "ppl"]


def _text(fmt: PromptFormat, ids: list[int]) -> str:
    return fmt.tokenizer.decode(ids)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("target", [1500, 3000])
def test_lengths_hit_the_byte_target(byte_fmt, task, target):
    for sample in make_samples(task, byte_fmt, target, 3, seed=0):
        assert (1 - LENGTH_TOLERANCE) * target <= len(sample.prompt) <= target


@pytest.mark.parametrize("task", TASKS)
def test_lengths_hit_the_target_in_smollm2_tokens(smollm2_fmt, task):
    for target in (2048, 4096):
        for sample in make_samples(task, smollm2_fmt, target, 2, seed=1):
            assert (1 - LENGTH_TOLERANCE) * target <= len(sample.prompt) <= target


def test_samples_are_seeded(byte_fmt):
    a = make_samples("niah_multikey", byte_fmt, 1200, 2, seed=3)
    b = make_samples("niah_multikey", byte_fmt, 1200, 2, seed=3)
    c = make_samples("niah_multikey", byte_fmt, 1200, 2, seed=4)
    assert [s.prompt for s in a] == [s.prompt for s in b]
    assert a[0].prompt != a[1].prompt and a[0].prompt != c[0].prompt


@pytest.mark.parametrize("task", ["niah_single", "niah_list", "vt_reason"])
def test_samples_built_together_equal_samples_built_one_by_one(smollm2_fmt, task):
    """make_samples builds on threads; each sample must still be the one its own seed gives."""
    together = make_samples(task, smollm2_fmt, 2048, 5, seed=7)
    spec = get_task(task)  # one by one, each from its documented seed (seed, task, target, index)
    alone = [spec.generate(smollm2_fmt, 2048, random.Random(f"7/{task}/2048/{i}"), i) for i in range(5)]
    assert [s.prompt for s in together] == [s.prompt for s in alone]
    assert [s.answers for s in together] == [s.answers for s in alone]
    assert len({tuple(s.prompt) for s in together}) == 5


def _haystack_fraction(text: str, needle: str, others: list[str]) -> float:
    """Where `needle` starts as a fraction of its line (the haystack is one line of prose), other needles removed."""
    line = next(ln for ln in text.split("\n") if needle in ln)
    for other in others:
        line = line.replace(other, "") if other != needle else line
    return line.index(needle) / len(line)


@pytest.mark.parametrize("task", ["niah_single", "niah_single_word", "niah_multikey", "niah_multivalue",
                                  "niah_multiquery", "niah_multiturn"])
def test_needles_hold_the_answers_at_their_depths(byte_fmt, task):
    for sample in make_samples(task, byte_fmt, 6000, len(DEFAULT_DEPTHS), seed=0):
        text = _text(byte_fmt, sample.prompt)
        assert sample.meta["depth"] == DEFAULT_DEPTHS[sample.index]
        kind = "word" if task.endswith("_word") else "number"
        sentences = [f"One of the special magic {kind}s for {n['key']} is: {n['value']}." for n in sample.meta["needles"]]
        for needle, sentence in zip(sample.meta["needles"], sentences):
            assert text.count(sentence) == 1
            assert _haystack_fraction(text, sentence, sentences) == pytest.approx(needle["depth"], abs=0.03)
        by_key = {}
        for needle in sample.meta["needles"]:
            by_key.setdefault(needle["key"], []).append(needle["value"])
        asked = sample.meta.get("asked", [sample.meta["needles"][0]["key"]])
        assert all(key in text[-200:] for key in asked)  # the question (answer prefix) names the asked keys
        assert sample.answers[0] == [v for key in asked for v in by_key[key]]


def test_multiturn_asks_each_needle_in_turn(byte_fmt):
    sample = make_samples("niah_multiturn", byte_fmt, 2000, 1, seed=0)[0]
    keys = [n["key"] for n in sample.meta["needles"]]
    assert [a[0] for a in sample.answers] == [n["value"] for n in sample.meta["needles"]]
    assert keys[0] in _text(byte_fmt, sample.prompt)[-250:]
    for key, follow_up in zip(keys[1:], sample.follow_ups):
        assert f"special magic number for {key}" in _text(byte_fmt, follow_up)
    depths = [n["depth"] for n in sample.meta["needles"]]
    assert min(abs(a - b) for i, a in enumerate(depths) for b in depths[i + 1:]) >= 0.2 - 1e-9


def test_passkey_and_variable_chain_are_in_the_prompt(byte_fmt):
    sample = make_samples("passkey", byte_fmt, 2000, 2, seed=0)[1]
    key = sample.answers[0][0]
    text = _text(byte_fmt, sample.prompt)
    assert f"The pass key is {key}. Remember it. {key} is the pass key." in text and len(key) == 5
    vt = make_samples("vt", byte_fmt, 2500, 1, seed=0)[0]
    text = _text(byte_fmt, vt.prompt)
    names = vt.answers[0]
    assert f"VAR {names[0]} = {vt.meta['value']}." in text
    positions = [text.index(f"VAR {b} = VAR {a}.") for a, b in itertools.pairwise(names)]
    assert positions == sorted(positions) and text.index(f"VAR {names[0]} =") < positions[0]


def test_word_tasks_answers_are_the_most_frequent(byte_fmt):
    cwe = make_samples("cwe", byte_fmt, 3000, 1, seed=0)[0]
    listing = next(ln for ln in _text(byte_fmt, cwe.prompt).split("\n") if ln.startswith("1. "))
    counts = Counter(re.findall(r"\d+\. ([a-z]+)", listing))
    top = {w for w, _ in counts.most_common(10)}
    assert top == set(cwe.answers[0])
    assert min(counts[w] for w in top) > max(c for w, c in counts.items() if w not in top)
    fwe = make_samples("fwe", byte_fmt, 3000, 1, seed=0)[0]
    coded = _text(byte_fmt, fwe.prompt).split("coded words. ")[1].split("\n")[0].split()
    ranked = [w for w, _ in Counter(coded).most_common(3)]
    assert ranked == fwe.answers[0]


def test_perplexity_task_continues_the_prompt(byte_fmt):
    sample = make_samples("ppl", byte_fmt, 1500, 1, seed=0)[0]
    text = _text(byte_fmt, sample.prompt + sample.teacher)
    assert text in " ".join(essay_sentences() * 2) and len(sample.teacher) == 64


def test_insert_at_depths_places_needles_at_boundaries():
    filler = ["A a.", "B b.", "C c.", "D d."]
    assert insert_at_depths(filler, [(0.0, "N.")]).startswith("N. A a.")
    assert insert_at_depths(filler, [(1.0, "N.")]).endswith("D d. N.")
    assert insert_at_depths(filler, [(0.5, "N.")]) == "A a. B b. N. C c. D d."
    with pytest.raises(ValueError, match="depth"):
        insert_at_depths(filler, [(1.5, "N.")])


def test_fit_to_tokens_bounds():
    n, ids = fit_to_tokens(lambda n: [0] * (10 * n + 5), 1000, most=1000, what="t")
    assert n == 99 and len(ids) == 995
    with pytest.raises(ContextSizeError, match="larger --ctx"):
        fit_to_tokens(lambda n: [0] * (100 * n), 50, most=10, what="t")
    with pytest.raises(ContextSizeError, match="smaller --ctx"):
        fit_to_tokens(lambda n: [0] * n, 1000, most=10, what="t")


def test_unknown_task_and_too_small_context(byte_fmt):
    with pytest.raises(UnknownTaskError, match="valid tasks: .*niah_single"):
        make_samples("niah_triple", byte_fmt, 1000, 1, seed=0)
    with pytest.raises(ContextSizeError):
        make_samples("niah_single", byte_fmt, 100, 1, seed=0)


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_longbench_loader_truncates_the_middle(tmp_path, byte_fmt):
    rng = random.Random(0)
    context = " ".join(rng.choice(["alpha", "beta", "gamma"]) for _ in range(2000))
    records = [{"input": "Who?", "context": "HEAD " + context + " TAIL", "answers": ["Ada"], "_id": str(i)}
               for i in range(3)]
    file = _write_jsonl(tmp_path / "hotpotqa.jsonl", records)
    samples = longbench_samples(byte_fmt, file, 2000, 2, seed=0)
    assert len(samples) == 2 and samples[0].task == "lb_hotpotqa" and samples[0].scorer == "longbench:hotpotqa"
    text = _text(byte_fmt, samples[0].prompt)
    assert (1 - LENGTH_TOLERANCE) * 2000 <= len(samples[0].prompt) <= 2000
    assert "HEAD" in text and "TAIL" in text and "Who?" in text
    assert samples[0].answers == [["Ada"]] and samples[0].max_answer_tokens == 32


def test_longbench_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        longbench_files(tmp_path / "missing")
    with pytest.raises(LongBenchError, match="no .jsonl"):
        longbench_files(tmp_path)
    with pytest.raises(UnknownTaskError, match="not a LongBench dataset"):
        longbench_files(_write_jsonl(tmp_path / "mystery.jsonl", [{"input": "", "context": "", "answers": ["x"]}]))
    (tmp_path / "sub").mkdir()
    bad = _write_jsonl(tmp_path / "sub" / "qasper.jsonl", [{"question": "q", "context": "c"}])
    with pytest.raises(LongBenchError, match="lacks the field.*input.*answers"):
        longbench_samples(PromptFormat(Tokenizer(ByteTokenizer())), bad, 500, 1, seed=0)


class BosAddingBackend:
    """A Hugging Face-like tokenizer over bytes that puts a BOS first by default, as Gemma's does."""

    bos_token_id, eos_token_id, chat_template = 300, None, None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [self.bos_token_id] * add_special_tokens + list(text.encode("utf-8"))}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


@pytest.mark.parametrize("task", ["niah_single", "niah_multiturn", "ppl"])
def test_prompts_start_with_the_bos_the_tokenizer_adds_by_default(task):
    fmt = PromptFormat(Tokenizer(BosAddingBackend()), chat=False)
    for sample in make_samples(task, fmt, 1500, 2, seed=0):
        assert sample.prompt[0] == BosAddingBackend.bos_token_id
        assert BosAddingBackend.bos_token_id not in sample.prompt[1:] + list(itertools.chain(*sample.follow_ups))
        assert (1 - LENGTH_TOLERANCE) * 1500 <= len(sample.prompt) <= 1500


def test_chat_prompts_are_refused_in_one_line_where_the_tokenizer_has_no_template():
    tokenizer = Tokenizer(BosAddingBackend())  # as gemma3-270m's GGUF: no chat template
    assert not tokenizer.has_chat_template and Tokenizer(ByteTokenizer()).has_chat_template
    with pytest.raises(UsageError, match="no chat template.*rerun with --no-chat"):
        PromptFormat(tokenizer, chat=True)  # refused before any prompt is built
    with pytest.raises(UsageError, match="--no-chat"):
        tokenizer.encode("question", chat=True)
    plain = PromptFormat(tokenizer, chat=False).first_turn("question", "Answer:")
    assert plain[0] == BosAddingBackend.bos_token_id


def test_no_bos_is_added_where_the_tokenizer_adds_none(byte_fmt, smollm2_fmt):
    assert byte_fmt.bos == [] and smollm2_fmt.bos == []  # smollm2's prompts are as before
    assert make_samples("niah_single", byte_fmt, 1500, 1, seed=0)[0].prompt[0] != ByteTokenizer.bos_token_id
