"""A model whose outputs are not finite numbers (a checkpoint with NaN weights) is reported as such, never as
text of NUL bytes or a crash: generate refuses in one line, quality saves records that name the non-finite
figures and draws its report and table, and the gate fails such a run. The Python API (sfibench.hf.apply)
checks its arguments and raises sfibench's own error types with one-line messages."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from refusals import one_line_error
from typer.testing import CliRunner

from sfibench.cli import app
from sfibench.core.errors import UsageError


@pytest.fixture(scope="module")
def nan_checkpoint(tmp_path_factory) -> Path:
    """A tiny Llama checkpoint written by transformers, one MLP projection's weights all NaN."""
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = tmp_path_factory.mktemp("nan") / "tiny"
    config = LlamaConfig(vocab_size=260, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight.fill_(float("nan"))
    model.save_pretrained(directory)
    return directory


def test_generate_refuses_text_chosen_from_non_finite_logits(nan_checkpoint):
    result = CliRunner().invoke(app, ["generate", "--model", str(nan_checkpoint), "--device", "cpu", "--prompt", "hello",
                                      "--max-new-tokens", "4"])
    one_line_error(result, "output after the prompt is not finite", "NaN", "check the checkpoint's weights")
    assert "\x00" not in result.output


QUALITY = ["quality", "--methods", "sfi", "--tasks", "niah_single", "--ctx", "600", "--retention", "0.5",
           "--samples", "1", "--no-chat", "--batch", "1", "--device", "cpu"]


def test_quality_with_non_finite_outputs_records_them_and_reports(nan_checkpoint, tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [*QUALITY, "--model", str(nan_checkpoint), "--out", str(out), "--wide"])
    assert result.exit_code == 0, result.output
    document = json.loads((out / "results.json").read_text())
    assert document["samples"] and all(r["non_finite"] == ["kl"] and r["kl"] is None for r in document["samples"])
    assert (out / "report.md").is_file() and "n/a" in result.output

    redrawn = CliRunner().invoke(app, ["report", str(out)])
    assert redrawn.exit_code == 0, redrawn.output


def test_the_gate_fails_a_run_whose_figure_became_non_finite(nan_checkpoint, tmp_path):
    """The same run with one record's KL finite (the baseline) and the NaN run as current: the cell's KL has a
    value on one side and not the other, so the gate fails it by name."""
    current = tmp_path / "current"
    assert CliRunner().invoke(app, [*QUALITY, "--model", str(nan_checkpoint), "--out", str(current)]).exit_code == 0
    baseline = tmp_path / "baseline"
    shutil.copytree(current, baseline / "quality")
    document = json.loads((baseline / "quality" / "results.json").read_text())
    for record in document["samples"]:
        record["kl"] = 0.5
        del record["non_finite"]
    (baseline / "quality" / "results.json").write_text(json.dumps(document))
    (baseline / "baseline.json").write_text(json.dumps({"format": 1, "runs": {"quality": {"argv": QUALITY}},
                                                        "tolerances": [{"match": "quality/*/kl", "abs": 0.1}]}))
    result = CliRunner().invoke(app, ["check", "--baseline", str(baseline), "--current", str(current)])
    text = " ".join(result.output.split())
    assert result.exit_code == 1 and "FAIL" in text, text
    assert "non-finite: quality/niah_single sfi@0.5@600/kl" in text


# ------------------------------------------------------------------------------------------- the Python API

class ByteTokenizer:
    def encode(self, text):
        return list(text.encode())

    def decode(self, ids):
        return bytes(i for i in ids if i < 256).decode(errors="replace")


@pytest.fixture(scope="module")
def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=260, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2))


@pytest.mark.parametrize("arguments, message", [
    ({"tokenizer": None}, "tokenizer is a NoneType without encode or decode; give the model's tokenizer"),
    ({"tokenizer": "gpt2"}, "tokenizer is a str without decode"),
    ({"evidence_rows": 0}, "evidence_rows 0 is not a whole number >= 1"),
    ({"evidence_rows": -3}, "evidence_rows -3 is not a whole number >= 1"),
    ({"evidence_rows": 2.5}, "evidence_rows 2.5 is not a whole number >= 1"),
    ({"budget": 0}, "budget must be at least 1 token"),
    ({"budget": "-5"}, "budget '-5' is not a whole number of tokens"),
    ({"budget": float("nan")}, "budget nan is not a token count or a percentage"),
    ({"method": "nope"}, "unknown method 'nope'"),
    ({"method": None}, "method is a NoneType; give a method's name"),
    ({"model": None}, "model is None; give a transformers causal LM"),
])
def test_apply_checks_its_arguments_with_sfibench_errors(model, arguments, message):
    import sfibench.hf

    given = {"model": model, "tokenizer": ByteTokenizer(), "method": "sfi", **arguments}
    with pytest.raises(UsageError) as raised:
        sfibench.hf.apply(**given)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_apply_with_good_arguments_generates(model):
    import sfibench.hf

    inputs = torch.tensor([list(b"the cat sat on the mat. " * 4)])
    with sfibench.hf.apply(model, ByteTokenizer(), method="sfi", budget=32, evidence_rows=8) as applied:
        output = model.generate(inputs, max_new_tokens=3, do_sample=False)
    assert output.shape[1] == inputs.shape[1] + 3 and applied.last_cache is not None


@pytest.mark.parametrize("tokens", [0, -1, 2.5, None, "8"])
def test_a_cache_for_no_new_tokens_is_refused(model, tokens):
    import sfibench.hf

    with sfibench.hf.apply(model, ByteTokenizer(), method="sfi") as applied, pytest.raises(UsageError) as raised:
        applied.cache(tokens)
    assert f"max_new_tokens {tokens!r} is not a whole number >= 1" in str(raised.value)
