"""The acceptance model: per draft token, the probability that the target accepts it given that
every token before it in the draft was accepted. PACER's pre-verifier (arXiv 2602.01274,
``specdec.models.preverifier``) generalised to every drafter, model-free ones included (the role
DSpark's BCE-trained confidence head plays for its block drafter).

Terms. A draft's *root* is the verified position whose logits gave the pending token (the last
verified token, which the next verify feeds first). Per drafted token x_i its *features*
[2H + D] are, concatenated:

- root [H]: the target's last-layer output at the root, after the final norm (the lm_head's
  input): the last row of the taps a drafter's ``commit`` receives (at ``start``, of the
  prompt's taps; zeros for a one-token prompt). A drafter that reads taps of its own (the block
  drafter) shares them: the root is then the deepest tapped layer's output.
- embedding [H]: the target's input embedding of x_i;
- signals [D]: the drafter's own ``DraftBlock.hidden`` (suffix: path probability, match length,
  position, ...; n-gram: matched length, count, ...; block drafter: its hidden states).

The position i enters through the pre-verifier's positional embedding, and its causal attention
lets x_i read its predecessors' features. The three parts are layer-normed apart
(``PreVerifierConfig.parts``): a residual-stream state and a probability differ in scale.

Served, the input layer proj(norm(features)) is computed in its parts, since it is a sum of one
linear map of each normed part (``inputs``): the root's term once a round (``root``), the
embedding's term read from a table of every vocabulary token's (made once, [V, W]), the signals'
term per token. ``features`` -> ``PreVerifier.score`` is the reference it equals.
The *survival* of x_i is the product of the probabilities of x_0..x_i: the chance that the
draft is accepted up to it (what load-aware speculation prices, ``actors.goodput``).

A checkpoint is a pre-verifier's (``preverifier.json`` + ``model.safetensors``, bfloat16
allowed) plus ``acceptance.json``: the drafter kind it was trained for and its parts' widths.
The target's embedding table is not in it: the model is bound to the running target's.

What it is not: no policy (PACER's rule reads its scores, ``specdec.algorithms.policies``), no
training (``pipelines.train_preverifier``), no target forward (its caller hands it the taps).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.nn import functional as F

from specdec.models.preverifier import PreVerifier, PreVerifierConfig

ACCEPTANCE_FILE = "acceptance.json"
UNTRAINED = "untrained"  # the reference with no files: random weights


@dataclass(frozen=True)
class AcceptanceConfig:
    drafter: str  # the drafter kind whose signals it reads (suffix, ngram, block, ...)
    root_size: int  # H, the target's hidden size
    signal_size: int  # D, the drafter's DraftBlock.hidden width
    width: int = 64
    heads: int = 4
    max_positions: int = 64  # longest draft it can score

    def __post_init__(self):
        if self.root_size < 1 or self.signal_size < 1:
            raise ValueError(f"acceptance root_size and signal_size must be >= 1, got "
                             f"{self.root_size}, {self.signal_size}")

    @classmethod
    def read(cls, path: str | Path) -> AcceptanceConfig:
        """The config a checkpoint directory holds (its ``ACCEPTANCE_FILE``)."""
        path = Path(path)
        if not (path / ACCEPTANCE_FILE).is_file():
            raise FileNotFoundError(f"{path} is not an acceptance-model checkpoint "
                                    f"(no {ACCEPTANCE_FILE})")
        return cls(**json.loads((path / ACCEPTANCE_FILE).read_text()))

    @property
    def parts(self) -> tuple[int, int, int]:
        return self.root_size, self.root_size, self.signal_size

    def net_config(self) -> PreVerifierConfig:
        return PreVerifierConfig(sum(self.parts), self.width, self.heads, self.max_positions,
                                 parts=self.parts)


def root_of(taps: torch.Tensor | None, size: int) -> torch.Tensor:
    """The root state [size] from a drafter's taps [k, F] (their last row, its deepest layer's
    ``size`` columns); zeros when there are none (a one-token prompt)."""
    if taps is None or taps.shape[0] == 0:
        return torch.zeros(size)
    if taps.shape[-1] < size:
        raise ValueError(f"taps of width {taps.shape[-1]} hold no {size}-wide root state")
    return taps[-1, -size:].float().cpu()


def acceptance_features(root: torch.Tensor, embedding: torch.Tensor, tokens: torch.Tensor,
                        signals: torch.Tensor) -> torch.Tensor:
    """root [H], embedding [V, H] (the target's), tokens [n], signals [n, D] -> [n, 2H + D]."""
    n = tokens.shape[0]
    embedded = embedding[tokens.to(embedding.device)].float().cpu()  # [n, H]
    return torch.cat([root.float().expand(n, -1), embedded, signals.float()], -1)


def survival(probs: torch.Tensor) -> tuple[float, ...]:
    """probs [n] (each token given its predecessors) -> the draft's survival at each token."""
    return tuple(float(p) for p in torch.cumprod(probs.double(), 0))


class AcceptanceModel:
    """A trained (or untrained) acceptance net bound to the target's embedding table [V, H]."""

    def __init__(self, config: AcceptanceConfig, net: PreVerifier, embedding: torch.Tensor):
        if net.c.parts != config.parts:
            raise ValueError(f"acceptance net reads parts {net.c.parts}, its config {config.parts}")
        if embedding.shape[-1] != config.root_size:
            raise ValueError(f"acceptance model of {config.root_size}-wide states bound to a "
                             f"{embedding.shape[-1]}-wide embedding")
        self.config, self.net, self.embedding = config, net.eval(), embedding
        self._table: torch.Tensor | None = None  # [V, W] the embedding's term, made on first use

    @property
    def max_positions(self) -> int:
        return self.net.c.max_positions

    def features(self, root: torch.Tensor, tokens: torch.Tensor,
                 signals: torch.Tensor) -> torch.Tensor:
        """One block's features [n, 2H + D] (module docstring): the training rows."""
        return acceptance_features(root, self.embedding, tokens, signals)

    # ---- served: the input layer in its parts ------------------------------------------------
    def _term(self, part: int, x: torch.Tensor) -> torch.Tensor:
        """Part ``part``'s term of the input layer: its norm, then its columns of proj."""
        lo = sum(self.config.parts[:part])
        weight = self.net.proj.weight[:, lo:lo + self.config.parts[part]]  # [W, part]
        return F.linear(self.net.norm.norms[part](x.to(weight.dtype)), weight)

    @torch.inference_mode()
    def root(self, taps: torch.Tensor | None) -> torch.Tensor:
        """The root's term of the input layer, with its bias [W], from a drafter's taps
        (``root_of``): once a round."""
        return self._term(0, root_of(taps, self.config.root_size)) + self.net.proj.bias

    @torch.inference_mode()
    def inputs(self, root: torch.Tensor, tokens: torch.Tensor,
               signals: torch.Tensor) -> torch.Tensor:
        """The input layer's output [n, W] for one block: ``root`` (its term, ``root``), the
        table's rows of ``tokens`` [n] and the signals' [n, D] term."""
        if self._table is None:
            self._table = self._term(1, self.embedding.cpu())  # [V, W]
        return root + self._table[tokens] + self._term(2, signals)

    def score(self, inputs: torch.Tensor) -> torch.Tensor:
        """inputs [n, W] of one draft so far (``inputs`` of its blocks) -> acceptance
        probabilities [n]."""
        return self.net.score_projected(inputs)

    # ---- served, many requests at once: one call each for a step's drafts -----------------
    @torch.inference_mode()
    def roots(self, taps: list[torch.Tensor | None]) -> list[torch.Tensor]:
        """``root`` of each request's taps, in one call."""
        size = self.config.root_size
        rows = torch.stack([root_of(t, size) for t in taps])  # [R, H]
        return list(self._term(0, rows) + self.net.proj.bias)

    @torch.inference_mode()
    def inputs_many(self, drafts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
                    ) -> list[torch.Tensor]:
        """``inputs`` of each (root, tokens, signals), in one call."""
        sizes = [int(tokens.shape[0]) for _, tokens, _ in drafts]
        roots = torch.cat([root.expand(n, -1) for (root, _, _), n in zip(drafts, sizes,
                                                                         strict=True)])
        tokens = torch.cat([t for _, t, _ in drafts])
        signals = torch.cat([s for _, _, s in drafts])
        return list(self.inputs(roots, tokens, signals).split(sizes))

    def score_many(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """``score`` of each draft's inputs [n_i, W], in one call (padded to the longest)."""
        sizes = [int(x.shape[0]) for x in inputs]
        padded = torch.nn.utils.rnn.pad_sequence(inputs, batch_first=True)  # [R, n, W]
        scores = self.net.score_projected(padded)
        return [row[:n] for row, n in zip(scores, sizes, strict=True)]

    def check(self, target, drafter) -> None:
        """Raise unless it fits ``target`` (hidden size, taps on) and ``drafter`` (signals)."""
        c = self.config
        if c.root_size != target.hidden_size:
            raise ValueError(f"acceptance model for {c.root_size}-wide targets; the target's "
                             f"hidden size is {target.hidden_size}")
        if not target.tap_layers:
            raise ValueError("the acceptance model reads the target's last layer: load the "
                             "target with it tapped (specdec.engine.loading.load_target)")
        if drafter is None or drafter.hidden_size != c.signal_size:
            width = None if drafter is None else drafter.hidden_size
            raise ValueError(f"acceptance model for {c.drafter} reads {c.signal_size} drafter "
                             f"signals; the drafter gives {width}")

    def save(self, out: str | Path, dtype: torch.dtype | None = None) -> Path:
        out = self.net.save(out, dtype)
        (out / ACCEPTANCE_FILE).write_text(json.dumps(asdict(self.config), indent=2))
        return out

    @staticmethod
    def is_checkpoint(path: str | Path) -> bool:
        return (Path(path) / ACCEPTANCE_FILE).is_file()

    @classmethod
    def load(cls, path: str | Path, embedding: torch.Tensor) -> AcceptanceModel:
        return cls(AcceptanceConfig.read(path), PreVerifier.load(path), embedding)


def untrained_acceptance(kind: str, drafter, embedding: torch.Tensor,
                         seed: int = 0) -> AcceptanceModel:
    """A randomly initialised acceptance model for ``drafter`` (of kind ``kind``): it runs, it
    knows nothing yet."""
    config = AcceptanceConfig(kind, embedding.shape[-1], drafter.hidden_size)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return AcceptanceModel(config, PreVerifier(config.net_config()), embedding)


def load_acceptance(ref: str | None, kind: str, drafter, target) -> AcceptanceModel | None:
    """The acceptance model ``ref`` (a checkpoint directory, or ``untrained``) for ``drafter``
    of kind ``kind`` beside ``target`` (whose embedding it binds); None without a reference."""
    if not ref or drafter is None:
        return None
    if ref == UNTRAINED:
        return untrained_acceptance(kind, drafter, target.embedding_weight())
    model = AcceptanceModel.load(ref, target.embedding_weight())
    if model.config.drafter != kind:
        raise ValueError(f"acceptance model {ref} was trained for the {model.config.drafter} "
                         f"drafter, not {kind}")
    return model


def acceptance_taps(num_layers: int, drafter_taps: tuple[int, ...]) -> tuple[int, ...]:
    """The target layers to tap with the acceptance model on: the drafter's own (their deepest
    gives the root), else the last layer."""
    return drafter_taps or (num_layers - 1,)
