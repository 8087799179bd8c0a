"""PACER's pre-verifier M_B: per-token acceptance probabilities for a draft (arXiv 2602.01274).

A lightweight trainable module that reads the drafter's hidden state of each drafted token plus
a learned embedding of the token's position in the draft, mixes the draft's tokens with one
causal self-attention layer (a token may look at the tokens drafted before it, never after),
and outputs one acceptance logit per token. Training packs many decoding steps into one sequence;
``step_ids`` keeps the steps apart in attention (block-diagonal causal mask).

An input may be made of *parts* of different scales (the acceptance model's target hidden
state, token embedding and drafter signals, ``specdec.models.acceptance``): each part is then
layer-normed on its own before the one projection.

An untrained pre-verifier runs (its scores are near 0.5); the paper reports about 2.1% of
inference time for it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn import functional as F

CONFIG_FILE = "preverifier.json"
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class PreVerifierConfig:
    input_size: int  # the drafter's hidden size D
    width: int = 64
    heads: int = 4
    max_positions: int = 64  # longest draft it can score
    use_position: bool = True  # ablation: PACER without the positional embedding
    # widths of the input's parts, each normalised on its own (sum = input_size); () one part
    parts: tuple[int, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "parts", tuple(self.parts))  # a JSON list, read back
        if self.parts and sum(self.parts) != self.input_size:
            raise ValueError(f"pre-verifier parts {self.parts} do not add up to input_size "
                             f"{self.input_size}")


class PartNorm(nn.Module):
    """LayerNorm over each part of the last dimension on its own: [..., sum(parts)]."""

    def __init__(self, parts: tuple[int, ...]):
        super().__init__()
        self.parts = parts
        self.norms = nn.ModuleList(nn.LayerNorm(n) for n in parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pieces = x.split(self.parts, dim=-1)
        return torch.cat([norm(p) for norm, p in zip(self.norms, pieces, strict=True)], dim=-1)


class PreVerifier(nn.Module):
    def __init__(self, c: PreVerifierConfig):
        super().__init__()
        self.c = c
        self.norm = PartNorm(c.parts) if c.parts else nn.LayerNorm(c.input_size)
        self.proj = nn.Linear(c.input_size, c.width)
        self.position = nn.Embedding(c.max_positions, c.width)
        self.attn = nn.MultiheadAttention(c.width, c.heads, batch_first=True)
        self.mlp = nn.Sequential(nn.LayerNorm(c.width), nn.Linear(c.width, c.width), nn.GELU())
        self.head = nn.Linear(c.width, 1)
        # [P, P] -inf above the diagonal: one draft's causal attention (``score_projected``)
        causal = torch.full((c.max_positions, c.max_positions), float("-inf")).triu(1)
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor,
                step_ids: torch.Tensor | None = None) -> torch.Tensor:
        """hidden: [S, T, D], positions: [S, T] position in its draft, step_ids: [S, T] (packed
        steps; None = one step per row) -> acceptance logits [S, T]."""
        if positions.numel() and int(positions.max()) >= self.c.max_positions:
            raise ValueError(f"draft position {int(positions.max())} >= max_positions "
                             f"{self.c.max_positions}")
        x = self.proj(self.norm(hidden.to(self.proj.weight.dtype)))
        if self.c.use_position:
            x = x + self.position(positions)
        t = x.shape[1]
        # blocked[s, i, j] is True where token i may NOT attend to token j
        blocked = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1).expand(x.shape[0], t, t)
        if step_ids is not None:
            blocked = blocked | (step_ids[:, :, None] != step_ids[:, None, :])
        mask = blocked.repeat_interleave(self.c.heads, dim=0)
        mixed, _ = self.attn(x, x, x, attn_mask=mask, need_weights=False)
        x = x + mixed
        x = x + self.mlp(x)
        return self.head(x).squeeze(-1)

    @torch.inference_mode()
    def score_reference(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [n, D] one draft so far -> acceptance probabilities [n], through ``forward``
        (the slow reference of ``score``)."""
        positions = torch.arange(hidden.shape[0], device=hidden.device)[None]
        return torch.sigmoid(self(hidden[None], positions))[0]

    @torch.inference_mode()
    def score(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [n, D] one draft so far -> acceptance probabilities [n]: ``forward`` for one
        step, its attention written out with a mask made once (one draft's attention is plainly
        causal) and its modules called as functions. It runs every round next to the target,
        where ``forward``'s mask and module overheads cost several times its arithmetic."""
        return self.score_projected(self.proj(self.norm(hidden.to(self.proj.weight.dtype))))

    @torch.inference_mode()
    def score_projected(self, x: torch.Tensor) -> torch.Tensor:
        """``score`` from its input layer's output x [n, W] = proj(norm(hidden)) on (a caller
        that computes it in parts: ``specdec.models.acceptance``); x [R, n, W]: R drafts at
        once, each padded at its end (attention is causal: padding moves no earlier token's
        score) -> [R, n]."""
        one = x.dim() == 2
        x = x[None] if one else x
        (r, n, _), c = x.shape, self.c
        if n > c.max_positions:
            raise ValueError(f"draft position {n - 1} >= max_positions {c.max_positions}")
        if n == 0:
            out = x.new_zeros(r, 0)
            return out[0] if one else out
        if c.use_position:
            x = x + self.position.weight[:n]
        a, (norm, linear, _), d = self.attn, self.mlp, c.width // c.heads
        qkv = F.linear(x, a.in_proj_weight, a.in_proj_bias)  # [R, n, 3W]
        # q, k, v: [R * heads, n, W / heads] each
        q, k, v = qkv.view(r, n, 3, c.heads, d).permute(2, 0, 3, 1, 4).reshape(3, r * c.heads, n, d)
        # softmax(q k^T / sqrt(d) + causal) v: -inf above the diagonal
        weights = torch.softmax(torch.baddbmm(self.causal[:n, :n], q, k.transpose(1, 2),
                                              alpha=d ** -0.5), -1)  # [R * heads, n, n]
        mixed = torch.bmm(weights, v).view(r, c.heads, n, d).transpose(1, 2).reshape(r, n, c.width)
        x = x + F.linear(mixed, a.out_proj.weight, a.out_proj.bias)
        x = x + F.gelu(F.linear(F.layer_norm(x, (c.width,), norm.weight, norm.bias, norm.eps),
                                linear.weight, linear.bias))
        out = torch.sigmoid(F.linear(x, self.head.weight, self.head.bias)).squeeze(-1)  # [R, n]
        return out[0] if one else out

    def save(self, out: str | Path, dtype: torch.dtype | None = None) -> Path:
        """Config and weights under ``out``; ``dtype``: store the weights in it (bfloat16 halves
        the files; ``load`` casts them back into the module's float32)."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / CONFIG_FILE).write_text(json.dumps(asdict(self.c), indent=2))
        save_file({k: v.to(dtype or v.dtype).contiguous() for k, v in self.state_dict().items()},
                  out / WEIGHTS_FILE)
        return out

    @classmethod
    def load(cls, path: str | Path) -> PreVerifier:
        path = Path(path)
        if not (path / CONFIG_FILE).is_file():
            raise FileNotFoundError(f"{path} is not a pre-verifier checkpoint (no {CONFIG_FILE})")
        net = cls(PreVerifierConfig(**json.loads((path / CONFIG_FILE).read_text())))
        net.load_state_dict(load_file(path / WEIGHTS_FILE))
        return net.eval()


UNTRAINED = "untrained"  # the pre-verifier reference with no files: random weights


def untrained_preverifier(drafter, seed: int = 0) -> PreVerifier:
    """A randomly initialised pre-verifier for a drafter: it runs, it just knows nothing yet."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return PreVerifier(PreVerifierConfig(input_size=drafter.hidden_size)).eval()


def load_preverifier(ref: str | None, drafter) -> PreVerifier | None:
    """The pre-verifier ``ref`` (a checkpoint directory, or ``untrained``) for ``drafter``, whose
    hidden states it reads; None without a reference or when the drafter holds its own (the
    hybrid)."""
    if not ref or getattr(drafter, "pacer_inside", False):
        return None
    if ref == UNTRAINED:
        return untrained_preverifier(drafter) if drafter is not None else None
    preverifier = PreVerifier.load(ref)
    if drafter is not None and preverifier.c.input_size != drafter.hidden_size:
        raise ValueError(f"pre-verifier {ref} reads {preverifier.c.input_size}-wide "
                         f"states; the drafter's are {drafter.hidden_size}-wide")
    return preverifier
