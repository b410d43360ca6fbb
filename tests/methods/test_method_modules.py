"""The layout of methods: each is one module, the registry lists it, and nothing else names it."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

import pytest

from sfibench import registry
from sfibench.engine.method import AttentionMethod, MethodConfig

ROOT = Path(__file__).resolve().parents[2]
# Where a method's name may be written: its own module (SFI: its three packages), the registry, and the
# command line's defaults and help. Config keys of saved results ("sfi" settings of a run) are subscripts.
ALLOWED = re.compile(r"^sfibench/(registry\.py|cli\.py|commands/|sfi/|reference/|optimized/)")
LITERAL = re.compile(r"(?<![\[\w])[\"'](?P<name>{names})(?:[\"'/@,])")


def method_name_literals() -> list[str]:
    pattern = LITERAL.pattern.replace("{names}", "|".join(map(re.escape, registry.names())))
    files = subprocess.run(["git", "ls-files", "sfibench"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    found = []
    for name in files:
        if not name.endswith(".py") or ALLOWED.match(name) or not (ROOT / name).exists():
            continue
        for number, line in enumerate((ROOT / name).read_text().splitlines(), 1):
            for match in re.finditer(pattern, line):
                own = name == f"sfibench/baselines/{match['name']}.py"
                if not own:
                    found.append(f"{name}:{number}: {line.strip()}")
    return found


def test_no_module_outside_a_methods_own_names_it():
    assert method_name_literals() == []


def test_the_literal_check_catches_a_method_name():
    pattern = LITERAL.pattern.replace("{names}", "|".join(registry.names()))
    assert re.search(pattern, 'if row["method"] == "snapkv":')
    assert not re.search(pattern, "cfg['sfi']['k_head']")  # a results key, not a method


def test_every_method_is_one_module_with_its_config_and_paths():
    assert len(set(registry.names())) == len(registry.METHODS)
    assert [m.name for m in registry.METHODS] == registry.names()  # each name is its module's METHOD's
    for method in registry.METHODS:
        assert issubclass(method.config, MethodConfig) and dataclasses.is_dataclass(method.config)
        assert set(method.paths) <= set(registry.PATHS) and method.paths
        for path in method.paths:
            assert issubclass(method.path_class(path), AttentionMethod)
    assert [m.name for m in registry.METHODS if m.dense] == [registry.dense().name]


def test_method_settings_are_frozen():
    for method in registry.METHODS:
        config = method.config()
        fields = dataclasses.fields(config)
        if fields:
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(config, fields[0].name, None)


@pytest.mark.parametrize("name", registry.names())
def test_budget_rule_reads_the_budget(name):
    """Equal budgets mean equal tokens read: a page-aligned window may add less than a page (SPEC 2)."""
    config = registry.default_config(name)
    if registry.get(name).dense:
        assert config.with_budget(500).tokens_read(8192) == 8192
        return
    # a page-aligned window (SFI) or set of pages and a partial current page (Quest) is off by less than two
    page = getattr(config, "page", 1)
    for budget in (400, 1000, 2308):
        assert abs(config.with_budget(budget).tokens_read(8192 + 5) - budget) < 2 * page


def test_unknown_method_and_path_are_named():
    with pytest.raises(registry.UnknownMethodError, match="valid methods"):
        registry.get("h2o")
    with pytest.raises(registry.UnknownMethodError, match="no 'gpu' path"):
        registry.check_method(registry.dense().name, "gpu")
