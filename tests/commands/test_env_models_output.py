"""`env` states each fact once (provenance and the device's facts overlap: the device, the CPU, its cores,
torch's threads), a byte count with separators and its size in GiB; `models` gives a tiny preset's
parameters in thousands, not "0M", and names every architecture a checkpoint may have."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from sfibench.cli import app
from sfibench.commands.info import env_facts, parameters


def test_env_states_each_fact_once(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    result = CliRunner().invoke(app, ["env", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.output.splitlines()[1:] if line.strip()]
    rows = [re.split(r"\s{2,}", line, maxsplit=1) for line in lines]  # key, then value after 2+ spaces
    keys = [row[0] for row in rows]
    assert len(keys) == len(set(keys)), keys
    values = {row[0]: row[1].strip() for row in rows if len(row) == 2}
    assert "type" not in values and "cpu_model" not in values and "name" not in values  # said by device, cpu
    assert values["device"] == "cpu" and values["cpu"]
    memory = next(line for line in result.output.splitlines() if line.startswith("total memory"))
    assert re.search(r"\d+\.\d GiB \(\d{1,3}(,\d{3})+ bytes\)", memory), memory


def test_a_device_fact_that_differs_from_provenance_is_kept():
    provenance = {"device": "cpu", "cpu": "AMD EPYC", "cpu_count": 8}
    facts = env_facts(provenance, {"type": "cpu", "cpu_model": "AMD EPYC", "cpu_count": 8, "usable_cores": 2,
                                   "total_memory_bytes": 2**31})
    assert facts == {"device": "cpu", "cpu": "AMD EPYC", "cpu_count": "8", "usable_cores": "2",
                     "total memory": "2.0 GiB (2,147,483,648 bytes)"}


def test_models_gives_tiny_presets_in_thousands_and_names_gemma3(monkeypatch):
    assert parameters(95_296) == "95K" and parameters(134_515_008) == "135M" and parameters(999) == "1K"
    monkeypatch.setenv("COLUMNS", "200")
    result = CliRunner().invoke(app, ["models"])
    assert result.exit_code == 0, result.output
    tiny = next(line for line in result.output.splitlines() if line.startswith("tiny-llama"))
    assert " 0M " not in f"{tiny} " and re.search(r" \d+K ", tiny), tiny
    assert "Gemma-3" in " ".join(result.output.split()[-30:])
