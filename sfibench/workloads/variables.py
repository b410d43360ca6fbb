"""vt: RULER's variable tracking, one chain of assignments hidden in essay prose.

`VAR QXKRB = 52817` is followed (at later depths) by `VAR HDMZA = VAR QXKRB` and so on; the model
must name every variable that ends up holding the value. The first assignment sits at the
controlled depth; the hops go to seeded random depths after it.
"""

from __future__ import annotations

import itertools
import string

from sfibench.workloads.base import Sample, register_task
from sfibench.workloads.haystack import DEFAULT_DEPTHS, Haystack, depth_for, magic_number
from sfibench.workloads.needles import haystack_prompt

HOPS = 4  # assignments after the first, so 5 variables hold the value
INTRO = "Memorize and track the chain(s) of variable assignment hidden in the following text."


@register_task("vt", f"variable tracking: {HOPS + 1} chained variables holding one value")
def variable_tracking(fmt, target, rng, index):
    names: list[str] = []
    while len(names) < HOPS + 1:
        name = "".join(rng.choice(string.ascii_uppercase) for _ in range(5))
        if name not in names:
            names.append(name)
    value = magic_number(rng, digits=5)
    first = depth_for(index, DEFAULT_DEPTHS)
    hops = sorted(round(rng.uniform(first, 1.0), 3) for _ in range(HOPS))
    statements = [f"VAR {names[0]} = {value}."] + [f"VAR {b} = VAR {a}." for a, b in itertools.pairwise(names)]
    needles = list(zip([first] + hops, statements))
    question = f"Question: Find all variables that are assigned the value {value} in the text above."
    prefix = (f"Answer: According to the chain(s) of variable assignment in the text above, {HOPS + 1} variables "
              f"are assigned the value {value}, they are:")
    ids, _ = haystack_prompt(fmt, target, Haystack(rng), needles, question, prefix, "vt", intro=INTRO)
    return Sample("vt", index, ids, [names], max_answer_tokens=6 * len(names),
                  meta={"depth": first, "hop_depths": hops, "value": value})
