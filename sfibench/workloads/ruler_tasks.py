"""RULER's variable tracking (vt), common and frequent words extraction (cwe, fwe) and QA (qa_1, qa_2).

Each builder draws what RULER's script draws and returns a Draft whose prompt grows with its haystack
units: noise lines (vt), listed words (cwe), the word count the frequencies scale (fwe), documents (qa).
The few-shot parts follow RULER: vt puts one worked example (sized to 500 tokens, its variable names
redrawn per sample) before the question inside the user's turn; cwe answers one smaller worked list
first, which a chat model sees as an earlier turn of the conversation. A QA sample is RULER's question
of the same index, among its own documents, then its article's other paragraphs (SQuAD), then random
documents.
"""

from __future__ import annotations

import math
import random
import string

from sfibench.core.errors import UsageError
from sfibench.workloads import ruler_data as data
from sfibench.workloads.base import ContextSizeError
from sfibench.workloads.ruler_niah import Draft, fit, prompt, sorted_words

ICL_LENGTH = 500  # the max_seq_length RULER sizes the variable-tracking example to


def _chains(rng: random.Random, chains: int, hops: int, letters: int) -> tuple[list, list]:
    """(variable names, assignment statements) per chain: the first binds a 5-digit value, the others copy."""
    names = ["".join(rng.choices(string.ascii_uppercase, k=letters)) for _ in range((hops + 1) * chains)]
    while len(set(names)) < chains * (hops + 1):
        names.append("".join(rng.choices(string.ascii_uppercase, k=letters)))
    groups = [names[i:i + hops + 1] for i in range(0, (hops + 1) * chains, hops + 1)]
    statements = [[f"VAR {g[0]} = {rng.randint(10000, 99998)}"]
                  + [f"VAR {g[j + 1]} = VAR {g[j]} " for j in range(hops)] for g in groups]
    return groups, statements


def _vt_turn(kind: dict, statements: list[list[str]], hops: int, n: int, place_seed: int) -> tuple[str, str]:
    """RULER's vt (task text, answer prefix) with the statements among n noise lines."""
    lines = [data.source_string("variable_tracking", "noise")] * n
    if len(lines) <= len(statements[0]):  # too few lines: RULER cuts the noise into sentences
        lines = [p + "." if p.strip() else p for line in lines for p in line.split(".")]
        statements = [chain[:len(lines) - 1] for chain in statements]
    for c, chain in enumerate(statements):
        places = sorted(random.Random(place_seed + 1000 * n + c).sample(range(len(lines)), len(chain)))
        for j, (at, statement) in enumerate(zip(places, chain)):
            lines.insert(at + j, statement)
    value = statements[0][0].split("=")[-1].strip()
    fields = {"context": " ".join(lines).replace(". \n", ".\n"), "query": value, "num_v": hops + 1}
    return kind["template"].format(**fields), kind["answer_prefix"].format(**fields)


_EXAMPLES: dict[tuple, str] = {}  # the worked vt example per (tokenizer, seed, task arguments)


def _vt_example(fmt, args: dict, kind: dict, seed: int) -> str:
    """RULER's worked vt example: 3-letter names, noise in steps of 5 lines up to 500 tokens, answer appended.

    RULER sizes it on its text and answer alone (no chat template), as here."""
    key = (id(fmt.tokenizer), seed, tuple(sorted(args.items())))
    if key not in _EXAMPLES:
        rng = random.Random(f"{seed}/ruler_vt/example")
        hops = min(10, args["num_hops"])
        names, statements = _chains(rng, args["num_chains"], hops, letters=3)
        place_seed = rng.getrandbits(32)

        def text(m: int) -> str:
            return "".join(_vt_turn(kind, statements, hops, 5 * m, place_seed))

        try:
            m, _ = fit(lambda m: fmt.tokenizer.encode(text(m) + f" {names[0]}"),
                       ICL_LENGTH - kind["tokens_to_generate"], 10 * ICL_LENGTH, "ruler_vt's worked example")
        except ContextSizeError:  # a byte-level tokenizer: not even 5 noise lines fit in 500 tokens
            m = 1
        _EXAMPLES[key] = text(m) + " " + " ".join(names[0]) + "\n\n"
    return _EXAMPLES[key]


def vt(fmt, args, kind, target, rng, seed, index) -> Draft:
    example = _vt_example(fmt, args, kind, seed)
    tail = kind["answer_prefix"][-10:]  # RULER redraws the example's answer names, found after this
    for name in example[example.index(tail) + 10:].split():
        example = example.replace(name, "".join(rng.choices(string.ascii_uppercase, k=len(name))))
    names, statements = _chains(rng, args["num_chains"], args["num_hops"], letters=5)
    place_seed = rng.getrandbits(32)

    def render(n: int) -> list[int]:
        question, prefix = _vt_turn(kind, statements, args["num_hops"], n, place_seed)
        return prompt(fmt, " " + example + "\n\n" + question, prefix)

    return Draft(render, names[0], 4 * target)


def _word_list(chosen: list[str], common: int, repeats: tuple[int, int], seed: int) -> str:
    """RULER's numbered list: the first `common` words `repeats[0]` times each, the rest `repeats[1]` times,
    shuffled with the run seed."""
    words = chosen[:common] * repeats[0] + chosen[common:] * repeats[1]
    random.Random(seed).shuffle(words)
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))


def cwe(fmt, args, kind, target, rng, seed, index) -> Draft:
    vocabulary = list(sorted_words("nounlist.txt", "adjectivelist.txt", "verblist.txt"))
    random.Random(seed).shuffle(vocabulary)
    common = args["num_cw"]
    small = target < 4096  # RULER's smaller frequencies below a 4K context
    shown_words = rng.sample(vocabulary, 20 if small else 40)
    shown = _word_list(shown_words, common, (3, 1) if small else (10, 3), seed)
    order = rng.sample(vocabulary, len(vocabulary))  # the first n of them are the list's n distinct words
    repeats = (6, 1) if small else (args["freq_cw"], args["freq_ucw"])
    prefix = kind["answer_prefix"]
    worked = " ".join(f"{i + 1}. {w}" for i, w in enumerate(shown_words[:common]))

    def render(n: int) -> list[int]:
        listed = _word_list(order[:max(n, common)], common, repeats, seed)
        first, second = (kind["template"].format(context=c, query="") for c in (shown, listed))
        if not fmt.chat:
            return fmt.starting(fmt.tokenizer.encode(first + prefix + worked + "\n" + second + prefix))
        return fmt.first_turn(first, prefix) + fmt.tokenizer.encode(worked) + fmt.follow_up(second, prefix)

    return Draft(render, order[:common], len(vocabulary))


def _zeta(s: float) -> float:
    """Riemann zeta for s > 1 (Euler-Maclaurin after 1000 terms; error far below a double's precision)."""
    n = 1000
    head = math.fsum(k ** -s for k in range(1, n))
    tail = (n ** (1 - s) / (s - 1) + n ** -s / 2 + s * n ** (-s - 1) / 12
            - s * (s + 1) * (s + 2) * n ** (-s - 3) / 720)
    return head + tail


def fwe(fmt, args, kind, target, rng, seed, index) -> Draft:
    size = data.argument_default("freq_words_extraction", "vocab_size")
    size = target // 50 if size == -1 else size
    length = data.argument_default("freq_words_extraction", "coded_wordlen")
    vocabulary = ["".join(rng.choices(string.ascii_lowercase, k=length)) for _ in range(size)]
    while len(set(vocabulary)) < size:
        vocabulary.append("".join(rng.choices(string.ascii_lowercase, k=length)))
    vocabulary = sorted(set(vocabulary))
    random.Random(seed).shuffle(vocabulary)
    vocabulary[0] = "..."  # RULER makes the most frequent word noise
    alpha, scale = args["alpha"], _zeta(args["alpha"])

    def render(n: int) -> list[int]:
        words = [w for k, w in enumerate(vocabulary, start=1) for _ in range(int(n * (k ** -alpha) / scale))]
        random.Random(seed).shuffle(words)
        return prompt(fmt, kind["template"].format(context=" ".join(words), query=""), kind["answer_prefix"])

    return Draft(render, vocabulary[1:4], 8 * target)


def qa(fmt, args, kind, target, rng, seed, index) -> Draft:
    questions, docs = data.qa_data(args["dataset"])
    if index >= len(questions):
        raise UsageError(f"RULER's {args['dataset']} has {len(questions)} questions; ask for at most that "
                         "many --samples")
    item = questions[index]
    own = item["context"]
    pool = rng.sample(item["more_context"], len(item["more_context"]))
    taken = set(own) | set(pool)
    stream = random.Random(rng.getrandbits(64))
    document = data.source_string("qa", "DOCUMENT_PROMPT")

    def render(n: int) -> list[int]:
        if len(own) + n >= len(docs):
            chosen = list(docs)
        else:
            while len(pool) < n:  # further random documents, drawn once and kept in order
                pick = stream.randrange(len(docs))
                if pick not in taken:
                    taken.add(pick)
                    pool.append(pick)
            chosen = [docs[i] for i in own + pool[:n]]
        random.Random(seed).shuffle(chosen)
        context = "\n\n".join(document.format(i=i + 1, document=d) for i, d in enumerate(chosen))
        question = kind["template"].format(context=context, query=item["query"])
        return prompt(fmt, question, kind["answer_prefix"])

    return Draft(render, list(item["outputs"]), len(docs) - len(own))


BUILDERS = {"variable_tracking": vt, "common_words_extraction": cwe, "freq_words_extraction": fwe, "qa": qa}
