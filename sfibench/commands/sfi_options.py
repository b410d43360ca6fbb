"""SFI's settings as command-line options, declared once for every command that runs SFI.

Each setting is one `Setting` below: its flag, bounds and help, and the field of SFIConfig, its
SelectorConfig or its TriggerConfig it sets (sfi/config.py). A command takes the settings it applies with
`@sfi_options(*names)`: the decorator adds them to the command's options and hands the command one
`SFISettings` holding what the user gave, so a flag means the same in every command and its help states
SFI's own default. Every setting defaults to "not given"; a run records only what was given where it records
a variant (quality, stability).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass

import typer

from sfibench.core.budget import Budget
from sfibench.core.errors import UsageError
from sfibench.sfi.config import PUBLISH_POLICIES, TRIGGER_POLICIES, VARIANT_FIELDS, SFIConfig, TriggerConfig
from sfibench.sfi.selector_config import EVIDENCE_NORMS, SelectorConfig

_OWNERS = {"sfi": SFIConfig, "selector": SelectorConfig, "trigger": TriggerConfig}


@dataclass(frozen=True)
class Setting:
    """One SFI setting as an option: `name` is the command's parameter, `field` what it sets in `where`."""

    name: str
    kind: type
    where: str  # "sfi", "selector" or "trigger"
    field: str
    help: str
    flag: str | None = None  # the option's spelling where it is not --name (a --no-... switch, --lambda)
    bounds: tuple = (None, None)  # typer's min and max

    @property
    def default(self):
        return getattr(_OWNERS[self.where](), self.field)

    def option(self, default_text: str | None = None):
        stated = default_text if default_text is not None else _stated(self.default)
        help_text = self.help if self.kind is bool else f"{self.help} (default {stated})"
        if self.kind is bool:
            return typer.Option(False, self.flag, help=help_text)
        decls = (self.flag,) if self.flag else ()
        return typer.Option(None, *decls, min=self.bounds[0], max=self.bounds[1], help=help_text)


def _stated(value) -> str:
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


_SETTINGS = (
    Setting("k_head", str, "sfi", "k_head",
            "SFI: selected tokens per KV head (k_head): whole tokens, or a percentage of the context "
            "such as 10%"),
    Setting("n_sink", int, "sfi", "n_sink", "SFI: attention-sink tokens always read", bounds=(0, None)),
    Setting("n_recent", int, "sfi", "n_recent", "SFI: recent-window tokens always read", bounds=(0, None)),
    Setting("page", int, "sfi", "page", "SFI: the recent window moves in pages of this many tokens",
            bounds=(1, None)),
    Setting("w_prefill", int, "sfi", "w_prefill",
            "SFI: prompt queries used as the bootstrap refresh's evidence", bounds=(1, None)),
    Setting("layer_groups", int, "sfi", "layer_groups",
            "SFI: 2 refreshes even and odd layers on alternate slow steps", bounds=(1, 2)),
    Setting("bridge_steps", int, "sfi", "bridge_steps",
            "SFI: decode steps after the prompt that read densely before the first selection is used",
            bounds=(0, None)),
    Setting("publish", str, "sfi", "publish",
            "SFI: next_step (each refresh is used from the next step) or when_ready (optimized path on a "
            "GPU: the Selector runs on a side stream and rows read densely until their first selection is "
            "published, the authors' bridge)"),
    Setting("trigger", str, "trigger", "policy", f"SFI's slow-step trigger: {', '.join(TRIGGER_POLICIES)}"),
    Setting("t_max", int, "trigger", "t_max", "SFI: a slow step at the latest this many steps after the last",
            bounds=(1, None)),
    Setting("min_gap", int, "trigger", "min_gap",
            "SFI: fewest steps between two slow steps, whatever triggers them", bounds=(0, None)),
    Setting("interval", int, "trigger", "interval",
            "SFI: N for the fixed (every N steps) and random (1 in N) trigger policies", bounds=(1, None)),
    Setting("no_prior", bool, "selector", "use_prior",
            "SFI ablation: Selector without the key-norm and position prior", flag="--no-prior"),
    Setting("no_nms", bool, "selector", "use_nms", "SFI ablation: Selector without Soft-NMS",
            flag="--no-nms"),
    Setting("no_cross_head", bool, "selector", "use_cross_head", "SFI ablation: no cross-head exclusivity",
            flag="--no-cross-head"),
    Setting("lambda_", float, "selector", "lambda_fixed",
            "SFI: a fixed fusion weight in [0, 1] instead of the closed form", flag="--lambda",
            bounds=(0.0, 1.0)),
    Setting("nms_radius", int, "selector", "nms_radius",
            "SFI: Soft-NMS compares each position with the best score this many positions either side",
            bounds=(0, None)),
    Setting("nms_alpha", float, "selector", "nms_alpha", "SFI: Soft-NMS strength (0 = no suppression)",
            bounds=(0.0, None)),
    Setting("evidence_norm", str, "selector", "evidence_norm",
            "SFI ablation: softmax each evidence row over the candidates (SPEC, the authors' Triton path) "
            "or over every visible key, then restricted to the candidates (their CUDA path)"),
    Setting("keep_neighbours", int, "selector", "keep_neighbours",
            "SFI ablation beyond the paper: max-pool the Selector's score over this odd number of positions "
            "before the top-K (after Soft-NMS, or in its place with --no-nms), so a kept peak keeps its "
            "neighbours; 1 = off", bounds=(1, None)),
)
SETTINGS = {setting.name: setting for setting in _SETTINGS}


@dataclass(frozen=True)
class SFISettings:
    """The SFI settings a user gave (parameter name -> value); none given is SFI as SPEC specifies it."""

    given: tuple[tuple[str, object], ...] = ()

    def __getitem__(self, name: str):
        return dict(self.given).get(name)

    def part(self, names, inside: bool = True) -> SFISettings:
        """The given settings among `names` (`inside` False: those not among them)."""
        return SFISettings(tuple((name, value) for name, value in self.given if (name in names) == inside))

    def k_head(self, default: str = str(SFIConfig.k_head)) -> Budget:
        """SFI's k_head as a Budget (a percentage resolved where the context is known)."""
        return Budget.parse(self["k_head"] or default, "--k-head")

    def config(self, base: SFIConfig | None = None, seed: int | None = None) -> SFIConfig:
        """`base` (SPEC's settings) with every given setting but k_head, which is a Budget (`k_head`)."""
        base = base or SFIConfig()
        changes = {"sfi": {}, "selector": {}, "trigger": {} if seed is None else {"seed": seed}}
        for name, value in self.given:
            setting = SETTINGS[name]
            if name != "k_head":
                changes[setting.where][setting.field] = not value if setting.kind is bool else value
        return dataclasses.replace(base, **changes["sfi"],
                                   selector=dataclasses.replace(base.selector, **changes["selector"]),
                                   trigger=dataclasses.replace(base.trigger, **changes["trigger"]))

    def variant(self) -> dict:
        """The given settings as an ablation (sfi/config.with_variant), keyed by the fields they set."""
        variant = {}
        for name, value in self.given:
            setting = SETTINGS[name]
            if setting.field not in VARIANT_FIELDS:
                raise ValueError(f"{name} is not a setting an SFI variant changes")
            variant[setting.field] = not value if setting.kind is bool else value
        return variant

    def check(self, path: str | None) -> None:
        """What typer's bounds cannot say: the choices, an odd pooling kernel, a publish mode SFI's path has
        (`path` None: the command runs another method, so SFI's path rules do not apply)."""
        for name, choices in (("trigger", TRIGGER_POLICIES), ("evidence_norm", EVIDENCE_NORMS),
                              ("publish", PUBLISH_POLICIES)):
            value = self[name]
            if value is not None and value not in choices:
                raise UsageError(f"--{name.replace('_', '-')} {value!r} is not one of: {', '.join(choices)}")
        if self["publish"] == "when_ready" and path not in ("optimized", None):
            raise UsageError("--publish when_ready runs the Selector on a side stream, which only the "
                             "optimized path has; add --path optimized or leave --publish out")
        keep = self["keep_neighbours"]
        if keep is not None and keep % 2 == 0:
            raise UsageError(f"--keep-neighbours {keep} is even; the pool is centred on each position, so "
                             "give an odd kernel such as 3, 5 or 7 (1 = off)")
        if self["k_head"] is not None:
            self.k_head()


def sfi_options(*names: str, defaults: dict | None = None):
    """Add the SFI settings `names` to a command's options; the command takes them as one `sfi: SFISettings`.
    `defaults` states a command's own default of a setting in its help (stability's k_head is 10%)."""
    unknown = [name for name in names if name not in SETTINGS]
    if unknown:
        raise ValueError(f"unknown SFI settings {unknown}; declared: {', '.join(SETTINGS)}")
    defaults = defaults or {}

    def decorate(command):
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != "sfi"]
        added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=SETTINGS[name].kind,
                                   default=SETTINGS[name].option(defaults.get(name))) for name in names]

        @functools.wraps(command)
        def with_settings(**values):
            chosen = {name: values.pop(name) for name in names}
            given = tuple((name, value) for name, value in chosen.items()
                          if value is not None and value is not False)
            return command(**values, sfi=SFISettings(given))

        with_settings.__signature__ = signature.replace(parameters=[*own, *added])
        with_settings.__annotations__ = {p.name: p.annotation for p in (*own, *added)}
        return with_settings

    return decorate


# The groups commands take: every setting, and those a quality or stability variant may change
ALL = tuple(SETTINGS)
VARIANT = tuple(name for name, setting in SETTINGS.items() if setting.field in VARIANT_FIELDS)
