"""A tokens-read budget, written one way per meaning: whole tokens (300) or a share of the context (15%).

Every option that is a budget (`--budget`, `--k-head`) parses into a `Budget` once, when the options are
checked, and resolves it against a context where the context is known. Where a command's budget is a
retention (quality's `--budget`), a fraction of the context (0.15) is a third spelling of the share.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sfibench.core.errors import UsageError


class BudgetError(UsageError):
    """A budget written in a way that has no single meaning, or one that does not fit the context."""


_WHOLE_TOKENS = re.compile(r"[0-9]+")
_PERCENTAGE = re.compile(r"([0-9]+(?:\.[0-9]+)?)%")
_FRACTION = re.compile(r"[01]?\.[0-9]+|1\.")
BUDGET_SYNTAX = "a whole number of tokens (300) or a percentage of the context (15%)"


@dataclass(frozen=True)
class Budget:
    """A tokens-read budget as the user wrote it: whole tokens, or a percentage of the context.

    One spelling per meaning, so `1` and `1.0` cannot mean different things: a fraction such as
    0.15 or 300.9 is refused with the spelling to use instead, unless `fractions` (a retention) allows a
    number with a decimal point in (0, 1] as the share it is (0.15 = 15%; `1` stays one token).
    """

    tokens: int | None = None
    percent: float | None = None

    @classmethod
    def parse(cls, text: str, what: str = "--budget", fractions: bool = False) -> Budget:
        spelled = str(text).strip()
        if fractions and _FRACTION.fullmatch(spelled) and 0 < float(spelled) <= 1:
            return cls(percent=round(float(spelled) * 100, 9))  # 0.15 -> 15, not 15.000000000000002
        if _WHOLE_TOKENS.fullmatch(spelled):
            if int(spelled) == 0:
                raise BudgetError(f"{what} must be at least 1 token, got {spelled}")
            return cls(tokens=int(spelled))
        match = _PERCENTAGE.fullmatch(spelled)
        if match:
            percent = float(match[1])
            if not 0 < percent <= 100:
                raise BudgetError(f"{what} {spelled} is not a percentage in (0%, 100%]")
            return cls(percent=percent)
        if fractions:
            positive = "; a budget must be positive" if _spelling_hint(spelled).endswith("positive") else ""
            raise BudgetError(f"{what} {spelled!r} is not {BUDGET_SYNTAX}, or a fraction of the context in (0, 1] "
                              f"(0.15){positive}")
        raise BudgetError(f"{what} {spelled!r} is not {BUDGET_SYNTAX}" + _spelling_hint(spelled))

    def resolve(self, context_len: int, what: str = "--budget", at_most_context: bool = True) -> int:
        """Tokens for a context of `context_len` tokens.

        A budget above the context is an error (it would silently mean Full-KV); SFI's k_head is a cap
        (K = min(k_head, |C|)), so it passes `at_most_context=False`.
        """
        if self.tokens is not None:
            tokens = self.tokens
        else:
            tokens = round(self.percent / 100 * context_len)
            if tokens < 1:
                raise BudgetError(f"{what} {self.percent:g}% of a {context_len}-token context is less than one "
                                  "token; give a larger percentage or a token count")
        if at_most_context and tokens > context_len:
            raise BudgetError(f"{what} of {tokens} tokens is larger than the {context_len}-token context; "
                              "give a smaller budget or a percentage such as 15%")
        return tokens


def _spelling_hint(spelled: str) -> str:
    """Why a number was refused, in the user's own terms: the spelling that says what they meant."""
    try:
        value = float(spelled)
    except ValueError:
        return ""
    if value <= 0:
        return "; a budget must be positive"
    if value <= 1:
        return f"; as a share of the context, {spelled} is written {value * 100:g}%"
    return f"; tokens are whole numbers, e.g. {int(value)}"


def budget_record(budget: Budget) -> int | str:
    """How results.json records a budget: whole tokens as a number (300), a percentage as written ("15%")."""
    return budget.tokens if budget.tokens is not None else f"{budget.percent:g}%"
