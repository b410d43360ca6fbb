"""The test suite's own shape: test files sit in the folders named like the package's parts, their basenames
are unique (test modules import each other by basename), and every rule conftest.py keys by
`module::test` names a test that exists, so renaming a test or its file cannot silently drop the rule
(a dropped DEFAULT_CASES rule would run every case of a matrix by default, a dropped FULL_TESTS entry a
minutes-long rerun)."""

from __future__ import annotations

import ast

import conftest

FOLDERS = {"kernels", "methods", "engine", "commands", "reporting", "support"}


def suite_files():
    return sorted(conftest.TESTS.rglob("test_*.py"))


def defined_tests(path) -> set[str]:
    """Names of the test functions a module defines, at module level or in a test class."""
    tree = ast.parse(path.read_text(), filename=str(path))
    bodies = [tree.body] + [node.body for node in tree.body if isinstance(node, ast.ClassDef)]
    return {node.name for body in bodies for node in body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")}


def test_every_test_file_sits_in_one_of_the_package_folders():
    misplaced = [str(p.relative_to(conftest.TESTS)) for p in suite_files() if p.parent.name not in FOLDERS
                 or p.parent.parent != conftest.TESTS]
    assert misplaced == []
    assert {p.name for p in conftest.TEST_FOLDERS} == FOLDERS


def test_test_basenames_are_unique():
    names = [p.name for p in suite_files()]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_every_keyed_rule_names_an_existing_test():
    modules = {p.name: defined_tests(p) for p in suite_files()}
    keys = [*conftest.DEFAULT_CASES, *conftest.FULL_TESTS]
    missing = [key for key in keys if key.split("::")[1] not in modules.get(key.split("::")[0], set())]
    assert missing == []


def test_a_renamed_test_is_caught(tmp_path):
    """The check above can fail: a module defining only other names does not hold the key's test."""
    module = tmp_path / "test_x.py"
    module.write_text("def test_renamed():\n    pass\n\nclass TestGroup:\n    def test_in_class(self):\n"
                      "        pass\n")
    assert defined_tests(module) == {"test_renamed", "test_in_class"}
    assert "test_original" not in defined_tests(module)
