"""The SFI Selector's settings (SPEC section 5), apart from the Selector (sfi/selector.py) so that SFI's
settings and the command line's help read them without importing torch."""

from __future__ import annotations

import math
from dataclasses import dataclass

EVIDENCE_NORMS = ("candidates", "visible")  # what each evidence row's softmax is taken over (SelectorConfig)


@dataclass(frozen=True)
class SelectorConfig:
    """The SFI Selector (SPEC section 5); each stage can be switched off for ablations."""

    alpha: float = 0.5  # power-mean exponent pooling the evidence rows
    use_prior: bool = True
    gamma: float = 0.5  # key-norm exponent of the prior
    w_norm: float = 1.0
    w_pos: float = 0.7
    pos_p: float = 1.8
    eta: float = 0.4
    beta: float = -math.log(0.6) / 0.9
    lambda_fixed: float | None = None  # --lambda: use this fusion weight instead of the closed form
    lambda_clip_multi: float = 0.25  # clip when the evidence has R > 1 rows
    lambda_clip_single: float = 0.35  # clip when R == 1
    use_nms: bool = True
    nms_radius: int = 16  # window of 32 positions: +-16
    nms_alpha: float = 1.0
    use_cross_head: bool = True
    cross_temperature: float = 2.0
    cross_alpha: float = 0.85
    eps: float = 1e-12
    # Ablations beyond SPEC's Selector; the defaults leave it exactly as specified.
    evidence_norm: str = "candidates"  # candidates: each evidence row softmaxed over C (SPEC; the authors'
    #                                    Triton path) | visible: over every key the row sees, then restricted
    #                                    to C (the authors' CUDA path)
    keep_neighbours: int = 1  # odd max-pool kernel over the final score before top-K, so a kept peak keeps
    #                           its neighbours (SnapKV's pooling); 1 = off. An extension beyond the paper.
