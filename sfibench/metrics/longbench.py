"""LongBench's official per-task metrics, reimplemented without their third-party dependencies.

Each function scores one prediction against one ground truth in [0, 1]; a sample's score is the
maximum over its ground truths (as LongBench's eval.py does) and a task's score is the mean.
Differences from the reference code, none of which changes an English score:
- Rouge-L is the LCS F-measure over whitespace tokens (what the `rouge` package computes for rouge-l f).
- code similarity uses difflib's ratio, the fallback fuzzywuzzy itself uses without python-Levenshtein.
- Chinese F1 / Rouge tokenize into characters instead of jieba words (jieba is not a dependency).
"""

from __future__ import annotations

import difflib
import re
import string
from collections import Counter

_ZH_PUNCTUATION = "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿–—‘’‛“”„‟…‧﹏."


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and articles, collapse whitespace (SQuAD normalisation)."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def normalize_zh_answer(text: str) -> str:
    punctuation = set(string.punctuation + _ZH_PUNCTUATION)
    return "".join(ch for ch in text.lower() if ch not in punctuation and not ch.isspace())


def _f1(prediction_tokens: list[str], truth_tokens: list[str]) -> float:
    common = Counter(prediction_tokens) & Counter(truth_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(prediction_tokens), same / len(truth_tokens)
    return 2 * precision * recall / (precision + recall)


def qa_f1(prediction: str, truth: str, **_) -> float:
    return _f1(normalize_answer(prediction).split(), normalize_answer(truth).split())


def qa_f1_zh(prediction: str, truth: str, **_) -> float:
    return _f1(list(normalize_zh_answer(prediction)), list(normalize_zh_answer(truth)))


def _lcs(a: list[str], b: list[str]) -> int:
    row = [0] * (len(b) + 1)
    for x in a:
        previous_diagonal = 0
        for j, y in enumerate(b, start=1):
            previous_diagonal, row[j] = row[j], previous_diagonal + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


def _rouge_l(prediction_tokens: list[str], truth_tokens: list[str]) -> float:
    if not prediction_tokens or not truth_tokens:
        return 0.0
    lcs = _lcs(prediction_tokens, truth_tokens)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(prediction_tokens), lcs / len(truth_tokens)
    return 2 * precision * recall / (precision + recall)


def rouge(prediction: str, truth: str, **_) -> float:
    return _rouge_l(prediction.split(), truth.split())


def rouge_zh(prediction: str, truth: str, **_) -> float:
    return _rouge_l(list(normalize_zh_answer(prediction)), list(normalize_zh_answer(truth)))


def classification(prediction: str, truth: str, all_classes: list[str] | None = None, **_) -> float:
    """1/k when the truth is among the k class names mentioned (names inside the truth don't count)."""
    mentioned = [c for c in all_classes or [] if c in prediction]
    mentioned = [c for c in mentioned if not (c in truth and c != truth)]
    return 1.0 / len(mentioned) if truth in mentioned else 0.0


def _retrieval(prediction: str, truth: str, pattern: str) -> float:
    found = re.findall(pattern, truth)
    if not found:
        return 0.0
    numbers = re.findall(r"\d+", prediction)
    return sum(n == found[0] for n in numbers) / len(numbers) if numbers else 0.0


def retrieval(prediction: str, truth: str, **_) -> float:
    return _retrieval(prediction, truth, r"Paragraph (\d+)")


def retrieval_zh(prediction: str, truth: str, **_) -> float:
    return _retrieval(prediction, truth, r"段落(\d+)")


def count(prediction: str, truth: str, **_) -> float:
    numbers = re.findall(r"\d+", prediction)
    return sum(n == str(truth) for n in numbers) / len(numbers) if numbers else 0.0


def code_sim(prediction: str, truth: str, **_) -> float:
    """Similarity of the first line that is code (not a comment or a fence) to the truth."""
    lines = [ln for ln in prediction.lstrip("\n").split("\n") if "`" not in ln and "#" not in ln and "//" not in ln]
    first = lines[0] if lines else ""
    return difflib.SequenceMatcher(None, first, truth).ratio()


METRICS = {"qa_f1": qa_f1, "qa_f1_zh": qa_f1_zh, "rouge": rouge, "rouge_zh": rouge_zh,
           "classification": classification, "retrieval": retrieval, "retrieval_zh": retrieval_zh,
           "count": count, "code_sim": code_sim}

# Dataset -> (metric, max new tokens), as in LongBench's eval.py and its dataset2maxlen table.
DATASETS = {
    "narrativeqa": ("qa_f1", 128), "qasper": ("qa_f1", 128), "multifieldqa_en": ("qa_f1", 64),
    "multifieldqa_zh": ("qa_f1_zh", 64), "hotpotqa": ("qa_f1", 32), "2wikimqa": ("qa_f1", 32),
    "musique": ("qa_f1", 32), "dureader": ("rouge_zh", 128), "gov_report": ("rouge", 512),
    "qmsum": ("rouge", 512), "multi_news": ("rouge", 512), "vcsum": ("rouge_zh", 512),
    "trec": ("classification", 64), "triviaqa": ("qa_f1", 32), "samsum": ("rouge", 128),
    "lsht": ("classification", 64), "passage_count": ("count", 32), "passage_retrieval_en": ("retrieval", 32),
    "passage_retrieval_zh": ("retrieval_zh", 32), "lcc": ("code_sim", 64), "repobench-p": ("code_sim", 64),
}
FIRST_LINE_ONLY = {"trec", "triviaqa", "samsum", "lsht"}  # few-shot tasks: the answer is the first line


def score(dataset: str, prediction: str, answers: list[str], all_classes: list[str] | None = None) -> float:
    """A sample's official score: the best over its ground truths, after LongBench's post-processing."""
    metric = METRICS[DATASETS[dataset][0]]
    if dataset in FIRST_LINE_ONLY:
        prediction = prediction.lstrip("\n").split("\n")[0]
    return max((metric(prediction, truth, all_classes=all_classes) for truth in answers), default=0.0)
