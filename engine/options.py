"""The search options a call may change, described once: their names are the :class:`EngineSettings` fields they
override, and from this one description come the Python keywords (:data:`~twostage.engine.knobs.KNOBS`), the HTTP
request's fields (:mod:`twostage.app.server`) and the ``twostage search`` flags (:mod:`twostage.app.cli_engine`).

Each option is None ("the engine's") unless given. A blend (``rerank_blend``, ``maxsim_blend``) is a number in
[0, 1] or ``"none"``, the stage's own score alone; a switch (``rerank``, ``maxsim``) is given on the command line as
``--no-NAME`` (it is on by default).
"""

from __future__ import annotations

from dataclasses import dataclass

from twostage.engine.settings import FUSION_NAMES

MAX_DEPTH = 10_000  # the deepest a depth option reaches (and the most hits one query may ask for)


@dataclass(frozen=True)
class SearchOption:
    """One search option. ``kind``: ``int``, ``float``, ``bool`` (a switch), ``choice`` (one of ``choices``) or
    ``blend`` (a number in [0, 1] or "none"); ``low``/``high``: the range of a number; ``help``: what it does, for
    the flag's help and the HTTP schema's description."""

    name: str
    kind: str
    help: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        """The command line's flag: ``--rerank-depth``, or ``--no-rerank`` for a switch."""
        dashed = self.name.replace("_", "-")
        return f"--no-{dashed}" if self.kind == "bool" else f"--{dashed}"


SEARCH_OPTIONS: tuple[SearchOption, ...] = (
    SearchOption("first_stage", "choice", "the first stage (default: the engine's)", choices=("hybrid", "dense", "bm25")),
    SearchOption("rerank_depth", "int", "candidates the reranker reads (default: the engine's)", 1, MAX_DEPTH),
    SearchOption("rerank", "bool", "false: the first stage only (no reranker)"),
    SearchOption("rerank_blend", "blend", "the reranker's weight against the first stage: none (the reranker alone) "
                 "or a number in [0, 1] (default: the engine's)"),
    SearchOption("fusion", "choice", "hybrid fusion (default: the engine's; blend: the old name of wsum)",
                 choices=FUSION_NAMES),
    SearchOption("dense_weight", "float", "wsum fusion: dense's weight in [0, 1]", 0, 1),
    SearchOption("k_rrf", "float", "rrf fusion: the k of 1 / (k + rank)", 0, MAX_DEPTH),
    SearchOption("first_stage_depth", "int", "candidates each first stage gives the fusion (default: the engine's)",
                 1, MAX_DEPTH),
    SearchOption("min_relevance", "float", "drop hits whose calibrated probability of relevance is below this (needs "
                 "`twostage calibrate` or a reranker trained with dev queries); a query may then get no hit", 0, 1),
    SearchOption("maxsim", "bool", "false: skip the MaxSim stage (an engine with token vectors)"),
    SearchOption("maxsim_depth", "int", "candidates MaxSim reads (default: the engine's)", 1, MAX_DEPTH),
    SearchOption("maxsim_blend", "blend", "MaxSim's weight against the first stage: none (MaxSim alone) or a number "
                 "in [0, 1] (default: the engine's)"),
)
