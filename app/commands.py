"""The command line's commands: each one's module and one-line help, read without importing any module.

``twostage --help`` lists these; a command's module (its flags, and what they import) is imported only when that
command is parsed: :func:`twostage.app.cli.build_parser`.
"""

from __future__ import annotations

TRAINING_NOTE = " (flags default to the measured recipe, `twostage.app.train_models.TrainSettings`)"

# command -> (the module of twostage.app that adds it, its one-line help); in the order --help lists them
COMMANDS: dict[str, tuple[str, str]] = {
    "download": ("cli", "download a public BEIR dataset zip and unpack it"),
    "bench": ("cli_eval", "evaluate systems on a BEIR directory against BM25"),
    "eval": ("cli_eval", "score TREC run files against a BEIR directory's qrels (as trec_eval does)"),
    "rerank": ("cli_eval", "rerank the candidates of a TREC run with a cross-encoder"),
    "build": ("cli_engine", "build a search engine directory from a corpus"),
    "search": ("cli_engine", "search an engine: the whole two-stage pipeline"),
    "add": ("cli_engine", "add documents from a corpus file"),
    "upsert": ("cli_engine", "upsert documents from a corpus file (replacing same ids)"),
    "delete": ("cli_engine", "delete documents by id"),
    "compact": ("cli_engine", "rewrite the dense index without deleted documents"),
    "late": ("cli_engine", ("store every passage's token vectors by a late-interaction model (a ColBERT checkpoint, "
                            "or a bi-encoder token by token): MaxSim then reorders the first stage's candidates")),
    "swap": ("cli_engine", ("rebuild an engine with new model(s) and promote it only if it is not worse (exit 0 "
                            "promoted, 1 refused, 2 bad input or the engine changed meanwhile)")),
    "calibrate": ("cli_engine", ("fit the reranker's score to a probability of relevance on judged queries (not "
                                 "test) and write it into the engine; then search with --min-relevance")),
    "info": ("cli_engine", "what an engine holds (settings, models, counts)"),
    "serve": ("cli_engine", "serve an engine over HTTP (search page, JSON API; needs the serve extra)"),
    "train-retriever": ("cli_train", "fine-tune a bi-encoder with contrastive loss on a BEIR split" + TRAINING_NOTE),
    "train-reranker": ("cli_train", "train a cross-encoder reranker on a BEIR split" + TRAINING_NOTE),
    "adapt": ("cli_train", ("train the bi-encoder and the reranker on a corpus alone (no labels): pseudo-queries "
                            "made from the documents")),
    "demo": ("cli", "run the demo on the bundled sample collection"),
}


def help_of(command: str) -> str:
    return COMMANDS[command][1]


def command_in(argv: list[str]) -> str | None:
    """The command ``argv`` runs: its first word that is not an option (the global options take no value)."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None
