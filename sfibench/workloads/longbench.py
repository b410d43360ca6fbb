"""LongBench from local JSONL files (never downloaded), loaded through `datasets`.

`--longbench PATH` is one `<dataset>.jsonl` file or a directory of them, named as LongBench names its
files (`hotpotqa.jsonl`, `gov_report_e.jsonl` for LongBench-E, ...). Each record needs `input`,
`context` and `answers`; classification tasks also use `all_classes`. A context too long for the
target is cut in the middle (LongBench keeps the head and the tail), in tokens of the model's own
tokenizer. The prompt wording is sfibench's own, one template per task family; the metric of each
dataset is LongBench's (metrics/longbench.py).
"""

from __future__ import annotations

import random
from pathlib import Path

from sfibench.metrics.longbench import DATASETS
from sfibench.workloads.base import PromptFormat, Sample, UnknownTaskError, fit_to_tokens

REQUIRED_FIELDS = ("input", "context", "answers")
PREFIX = "lb_"  # task names of LongBench files in reports: lb_hotpotqa, ...

_QA = "Read the text below and answer the question as briefly as possible.\n\n{context}\n\nQuestion: {input}\nAnswer:"
_QA_ZH = "阅读以下文字并用中文简短回答问题。\n\n{context}\n\n问题：{input}\n回答："
_SUMMARY = "Read the text below and write the summary it asks for.\n\n{context}\n\n{input}\nSummary:"
_SUMMARY_ZH = "阅读以下文字并写出摘要。\n\n{context}\n\n{input}\n摘要："
TEMPLATES = {
    "qa_f1": _QA, "qa_f1_zh": _QA_ZH, "rouge": _SUMMARY, "rouge_zh": _SUMMARY_ZH,
    "classification": "Classify the last example in the same way as the examples.\n\n{context}\n{input}",
    "retrieval": "Below are numbered paragraphs and then an abstract.\n\n{context}\n\nAbstract: {input}\n\n"
                 "Which paragraph is the abstract from? Answer like \"Paragraph 1\".\nAnswer:",
    "retrieval_zh": "以下是若干段落和一个摘要。\n\n{context}\n\n摘要：{input}\n\n这个摘要来自哪一段？请回答“段落1”的形式。\n答案：",
    "count": "Below are paragraphs, some of them repeated.\n\n{context}\n\nHow many different paragraphs are "
             "there? Answer with one number.\nAnswer:",
    "code_sim": "Complete the next line of code.\n\n{context}{input}",
}
FEW_SHOT = {"trec", "triviaqa", "samsum", "lsht"}  # the context holds worked examples; continue them


class LongBenchError(ValueError):
    pass


def dataset_name(file: Path) -> str:
    """`hotpotqa_e.jsonl` -> `hotpotqa` (LongBench-E files share their dataset's metric)."""
    stem = file.stem
    name = stem[:-2] if stem.endswith("_e") and stem[:-2] in DATASETS else stem
    if name not in DATASETS:
        raise UnknownTaskError(f"{file.name}: {stem!r} is not a LongBench dataset; name the file after one "
                               f"of: {', '.join(sorted(DATASETS))}")
    return name


def longbench_files(path: Path | str) -> list[Path]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"LongBench path {path} does not exist; pass a <dataset>.jsonl file or a "
                                "directory of them")
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    if not files:
        raise LongBenchError(f"no .jsonl files in {path}; LongBench files are named like hotpotqa.jsonl")
    for file in files:
        dataset_name(file)
    return files


def load_records(file: Path) -> list[dict]:
    """Every record of one file, checked for the fields the prompt and the metric need."""
    import datasets

    try:
        table = datasets.load_dataset("json", data_files=str(file), split="train")
    except Exception as error:  # noqa: BLE001 - datasets wraps JSON errors in several types of its own
        raise LongBenchError(f"{file} could not be read as JSON lines ({error.__class__.__name__}: "
                             f"{str(error).splitlines()[0] if str(error) else ''})") from None
    missing = [f for f in REQUIRED_FIELDS if f not in table.column_names]
    if missing:
        raise LongBenchError(f"{file} lacks the field(s) {', '.join(missing)}; LongBench records have "
                             f"{', '.join(REQUIRED_FIELDS)} (and all_classes for classification)")
    records = table.to_list()
    for number, record in enumerate(records, start=1):
        if not isinstance(record["answers"], list) or not record["answers"]:
            raise LongBenchError(f"{file} record {number}: 'answers' must be a non-empty list of strings")
    return records


def prompt_text(dataset: str, record: dict, context: str) -> str:
    if dataset in FEW_SHOT:
        return f"{context}\n{record['input']}"
    return TEMPLATES[DATASETS[dataset][0]].format(context=context, input=record["input"])


def longbench_samples(fmt: PromptFormat, file: Path, target: int, count: int, seed: int) -> list[Sample]:
    """Up to `count` seeded records of one file as samples of at most `target` prompt tokens."""
    dataset = dataset_name(file)
    records = load_records(file)
    random.Random(f"{seed}/{file.stem}").shuffle(records)
    samples = []
    for index, record in enumerate(records[:count]):
        context = fmt.tokenizer.encode(record["context"])

        def render(keep: int, record=record, context=context) -> list[int]:
            # keep = context tokens kept from each end; the middle is dropped
            text = record["context"] if 2 * keep >= len(context) else (
                fmt.tokenizer.decode(context[:keep]) + fmt.tokenizer.decode(context[-keep:]))
            return fmt.first_turn(prompt_text(dataset, record, text), "")

        ids = render(len(context))
        if len(ids) > target:
            _, ids = fit_to_tokens(render, target, most=len(context) // 2, what=f"{PREFIX}{file.stem}")
        samples.append(Sample(f"{PREFIX}{file.stem}", index, ids, [list(map(str, record["answers"]))],
                              max_answer_tokens=DATASETS[dataset][1], scorer=f"longbench:{dataset}",
                              meta={"all_classes": record.get("all_classes"), "id": record.get("_id"),
                                    "context_tokens": len(context)}))
    return samples
