"""The strict schema of the Serve application's arguments (what a YAML ``args:`` block holds).

Unknown keys are errors (``extra="forbid"``), so a typo in a config fails at build time rather
than serving with a default. The policy and verifier names are the core catalogs' (``POLICIES``,
``VERIFIERS``), never listed here, and ``Speculative`` (the serve YAML's ``speculative:`` and the
HTTP body's ``speculative`` field) is derived from the algorithms' configs
(``specdec.engine.settings``: ``FLAT``, ``SECTIONS``), never declares a knob itself; the core's
``SpecSettings`` checks what spans knobs (a verifier against the temperature, ...).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    create_model,
    field_validator,
    model_validator,
)

from actors.scheduler import BatchingConfig
from specdec.algorithms.policies import POLICIES
from specdec.algorithms.verify import VERIFIERS
from specdec.engine.settings import flat_fields, section_models
from specdec.models.drafters import runs_no_model
from specdec.planning import SERVE_SLOTS, SERVE_THREADS
from specdec.runtime.plan import (
    ATTENTIONS,
    BACKENDS,
    DTYPE_NAMES,
    ISAS,
    KV_CACHE_DTYPES,
    LINEARS,
    SWITCHES,
    WAIT_POLICIES,
)

BATCHING = BatchingConfig()
# Literal[("a", "b")] is Literal["a", "b"]: the names, read from the catalogs.
PolicyName = Literal[POLICIES.names()]  # type: ignore[valid-type]
VerifierName = Literal[VERIFIERS.names()]  # type: ignore[valid-type]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Resources(Strict):
    """Ray resources of one actor, and the torch threads it runs on."""

    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0)
    # torch.set_num_threads in the actor (Ray sets OMP to 1 otherwise); the plan shows it
    threads: PositiveInt = SERVE_THREADS
    # Ray custom resources the actor needs (a node offers them: `ray start --resources`), e.g.
    # {"node_a": 1}: they pin an actor, and with it its replica's placement group, to such nodes
    resources: dict[str, Annotated[float, Field(ge=0)]] = {}
    # Ray's accelerator type of the node's GPUs (e.g. "H100", "A100", "L4"); None: any
    accelerator_type: str | None = None

    @field_validator("resources")
    @classmethod
    def _custom_only(cls, value: dict[str, float]) -> dict[str, float]:
        built_in = sorted({"CPU", "GPU", "memory", "object_store_memory"} & set(value))
        if built_in:
            raise ValueError(f"resources holds Ray custom resources only, not {built_in} "
                             "(set num_cpus / num_gpus)")
        return value


# Speculative settings: the policy and verifier names, every flat key (``FLAT``:
# gamma, max_draft, asd_budget, ...) and, for the nested form, every section (pacer: {...}, asd:
# {...}, ...), each knob with its config's type, default, bounds and help. The serve config's
# values are a server's defaults; a request's ``speculative`` body field is laid over them.
Speculative = create_model(
    "Speculative", __base__=Strict, __doc__="Speculative settings (specdec.engine.settings).",
    policy=(PolicyName, "fixed"), verify=(VerifierName | None, None),
    # use the server's acceptance model (``ServeArgs.acceptance``) where it loads one
    acceptance=(bool, True),
    **flat_fields(), **section_models())


class Suffix(Strict):
    """The suffix drafter's global tree (drafter suffix or hybrid); see specdec.models.suffix."""

    index: str | None = None  # a suffix-index directory or models:/NAME@ALIAS; None: none
    max_depth: PositiveInt = 64
    max_cached_requests: int = Field(100_000, ge=-1)  # responses kept, oldest out first (-1: all)
    online: bool = True  # served outputs join the global tree


class Limits(Strict):
    max_tokens: PositiveInt = 512  # cap on a request's max_tokens
    # max_tokens of a request that sets none; None: the context left after the prompt (OpenAI's
    # default), in both cases at most max_tokens
    default_max_tokens: PositiveInt | None = None
    max_concurrent_requests: PositiveInt = 16  # beyond this, 503
    idle_ttl_s: float = Field(600.0, ge=0)  # free state of requests idle this long (0 = never)
    reap_every_s: float = Field(30.0, ge=0)  # free orphaned request state this often (0 = never)
    max_body_bytes: PositiveInt = 1 << 20  # larger request bodies are refused with 413
    # KV cache slots the target's runtime preallocates (one per open request; a full pool is a
    # 503). Twice the concurrency: cancelled requests hold theirs until they are reaped.
    kv_slots: PositiveInt = SERVE_SLOTS


class Batching(Strict):
    """Continuous batching in the actors (``actors.scheduler``, whose ``BatchingConfig`` holds
    the defaults); ``max_batch: 1`` turns it off."""

    max_batch: PositiveInt = BATCHING.max_batch  # requests per step
    # target tokens per step; longer prompts are prefilled in chunks
    token_budget: PositiveInt = BATCHING.token_budget
    # how long a step waits for running requests' work: gather_share of the last step's
    # duration, and at least gather_ms
    gather_ms: float = Field(BATCHING.gather_s * 1000, ge=0)
    gather_share: float = Field(BATCHING.gather_share, ge=0)
    # load-aware speculation: {batch size from: longest draft}; the largest size <= the running
    # requests applies (none: the request's own limit)
    draft_caps: dict[PositiveInt, PositiveInt] = {}
    # the target shortens the drafts it makes itself (n-gram, suffix) to what a step's goodput
    # buys: a token's expected gain against its row's measured cost (actors.goodput)
    fit_drafts: bool = BATCHING.fit_drafts

    def actor_config(self) -> dict:
        """The ``actors.scheduler.BatchingConfig`` fields."""
        return {"max_batch": self.max_batch, "token_budget": self.token_budget,
                "gather_s": self.gather_ms / 1000, "gather_share": self.gather_share,
                "draft_caps": dict(self.draft_caps), "fit_drafts": self.fit_drafts}


class ServeArgs(Strict):
    target: str  # model reference: a named source, a directory, a hub id, or tiny:DIR/target
    drafter: str = "ngram"  # a DRAFTERS name (none, ngram, ...), a block-drafter dir or an AR LM
    preverifier: str | None = None
    block_drafter: str | None = None  # drafter hybrid: its block drafter (with preverifier)
    # the drafter's acceptance model (specdec.models.acceptance): models:/NAME@ALIAS, a
    # directory or untrained; PACER cuts drafts by it and the goodput prices them by it (a
    # request's speculative.acceptance turns it off); only a drafter run on the target
    # (ngram, suffix). None: off, and the target taps nothing for it
    acceptance: str | None = None
    suffix: Suffix = Suffix()
    model_id: str | None = None  # the name clients pass as "model"; default: the target's name
    # The target's runtime: each field is a knob of its plan (specdec.runtime.plan, which
    # decides every auto once and prints the result at start; `specdec plan --config FILE`
    # shows it without loading the model). A knob that does not apply to the plan's backend is
    # an error at start, naming it.
    dtype: Literal[DTYPE_NAMES] = "float32"  # auto: float32 for int8 rows, bfloat16 on AMX, ...
    backend: Literal[BACKENDS] = "auto"  # auto: x86 on an x86-64 CPU, torch elsewhere (GPUs)
    linears: Literal[LINEARS] = "auto"  # x86: int8 | quantized | panels | onednn | torch
    attention: Literal[ATTENTIONS] = "auto"  # x86: kernel | grouped | per_query | sdpa
    kv_cache_dtype: Literal[KV_CACHE_DTYPES] = "auto"  # float16: x86's attention kernel only
    # x86: the instruction set of specdec's kernels; avx2 runs as on a CPU without AVX-512
    isa: Literal[ISAS] = "auto"
    # positions a request's KV slot holds (prompt and output); None: as many as the device's
    # memory allows for limits.kv_slots slots, at most the model's context
    max_model_len: PositiveInt | None = None
    # how OpenMP's threads wait between parallel regions, in every process of the app (the
    # actors' and the replica's runtime_env: OMP_WAIT_POLICY); auto: libgomp's default, or what
    # the environment's OMP_WAIT_POLICY says
    omp_wait_policy: Literal[WAIT_POLICIES] = "auto"
    # each pass on 1 thread or on target_resources.threads, whichever runs faster now (beside a
    # busy process, one); auto: on where a pass's bits do not depend on its threads
    threads_by_load: Literal[SWITCHES] = "auto"
    speculative: Speculative = Speculative()
    target_resources: Resources = Resources()
    drafter_resources: Resources = Resources(num_cpus=0.5)
    # Where the drafter runs: "actor" (its own actor, drafter_resources), "target" (on the target
    # actor's model thread: only a drafter without a model, n-gram or suffix), "auto" (target
    # for those, actor for the others).
    drafter_placement: Literal["auto", "actor", "target"] = "auto"
    server_num_cpus: float = Field(0.5, ge=0)  # the ingress/orchestrator replica
    # How a replica's placement group (its own bundle, its target's, its drafter's: see
    # cluster.placement) lies on the nodes: STRICT_PACK all on one node (no network hop per
    # round), PACK one node if it can, SPREAD over nodes if it can.
    placement_strategy: Literal["STRICT_PACK", "PACK", "SPREAD"] = "STRICT_PACK"
    # Refuse at build time a placement group that no node alive can hold (naming the bundle);
    # false on a cluster whose autoscaler starts the nodes it needs on demand.
    check_placement: bool = True
    limits: Limits = Limits()
    batching: Batching = Batching()
    # Serve replicas of the app; each runs its own target and drafter actors. A number, or
    # autoscaling_config (Serve's: min_replicas, max_replicas, target_ongoing_requests, ...).
    num_replicas: PositiveInt = 1
    autoscaling_config: dict | None = None
    # Local model directories must lie under one of these (empty: any existing directory).
    model_roots: tuple[str, ...] = ()
    # The MLflow store that models:/NAME@ALIAS references resolve in (every actor and the
    # server see it as $MLFLOW_TRACKING_URI); None: the process's own default.
    mlflow_tracking_uri: str | None = None
    # Bearer key every route but /health requires; None: $SPECDEC_API_KEY, unset: no key.
    api_key: str | None = Field(None, repr=False)
    metrics_public: bool = False  # True: GET /metrics answers without the key (for scrapers)

    @model_validator(mode="after")
    def _replicas(self):
        if self.autoscaling_config is not None and "num_replicas" in self.model_fields_set:
            raise ValueError("set num_replicas or autoscaling_config, not both")
        return self

    @model_validator(mode="after")
    def _hybrid_parts(self):
        if self.drafter == "hybrid" and not (self.block_drafter and self.preverifier):
            raise ValueError("drafter hybrid needs block_drafter and preverifier")
        if self.block_drafter and self.drafter != "hybrid":
            raise ValueError("block_drafter is only read with drafter hybrid")
        return self

    @model_validator(mode="after")
    def _acceptance(self):
        if self.acceptance and not self.drafter_on_target:
            raise ValueError(f"acceptance needs a drafter run on the target (ngram, suffix), not "
                             f"{self.drafter!r} with drafter_placement {self.drafter_placement}")
        return self

    @model_validator(mode="after")
    def _placement(self):
        if self.drafter_placement == "target" and not runs_no_model(self.drafter):
            raise ValueError(f"drafter_placement target needs a drafter without a model (ngram, "
                             f"suffix), not {self.drafter!r}: set drafter_placement actor")
        return self

    @property
    def drafter_on_target(self) -> bool:
        """Whether the target actor runs the drafter itself (see ``drafter_placement``)."""
        return self.drafter_placement != "actor" and runs_no_model(self.drafter)

    @property
    def drafter_actor(self) -> bool:
        """Whether the drafter runs in an actor of its own."""
        return self.drafter != "none" and not self.drafter_on_target

    @property
    def served_model_id(self) -> str:
        return self.model_id or Path(self.target.removeprefix("tiny:")).name or self.target
