"""For tests of what a command must check before it loads a model: loading raises ModelLoaded instead."""

from __future__ import annotations

from sfibench.engine.session import Session


class ModelLoaded(Exception):
    """Raised where the model would load: a refused command must never get here."""


def _refuse(cls, *args, **kwargs):
    raise ModelLoaded(args)


def forbid_model_loading(monkeypatch) -> None:
    monkeypatch.setattr(Session, "open", classmethod(_refuse))
