"""`python -m bertdemo download MODEL [--dir DIR]`: fetch a model once, to run the demo offline;
`python -m bertdemo train-bundled`: make the bundled model (see `bertdemo/build/bundled_training.py`);
`python -m bertdemo train-features`: make the bundled model's feature dictionaries (`bertdemo/features/making.py`);
`python -m bertdemo train-transcoders`: make the bundled model's transcoders (`bertdemo/circuits/transcoders.py`);
`python -m bertdemo warm MODEL [--into DIR]`: make a model's ONNX Runtime export ahead, so a server
started on it serves its first request through it with no export (docs/operations.md);
`python -m bertdemo config-doc`: print docs/configuration.md, every flag and environment variable.

Only what `bertdemo.load` reads is fetched (config, safetensors weights, tokenizer files), and the
result is loaded once as a check, so a Docker build fails at build time rather than at the first
visitor. Without `--dir` the files go to the Hugging Face cache, where `python app.py --model MODEL`
finds them with `HF_HUB_OFFLINE=1`; with `--dir` pass that folder to `--model`.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

# What `bertdemo.load` needs; the rest of a hub repo (TF/Flax/ONNX/CoreML copies) is skipped.
MODEL_FILES = [
    "config.json", "*.safetensors", "model.safetensors.index.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.txt", "vocab.json", "merges.txt", "*.model",  # WordPiece / BPE / SentencePiece vocabularies
]
PICKLE_FILES = ["pytorch_model*.bin", "pytorch_model.bin.index.json"]  # only with --allow-pickle


def download(model: str, target: str | Path | None = None, revision: str | None = None,
             allow_pickle: bool = False) -> Path:
    """Fetch `model` (hub id, or local folder to copy from) into `target`; return the folder.

    `target=None` means the Hugging Face cache for a hub id, and the folder itself for a folder.
    Raises OSError/ValueError (from huggingface_hub) when the hub can't be reached or has no such model.
    """
    patterns = MODEL_FILES + (PICKLE_FILES if allow_pickle else [])
    source = Path(model).expanduser()
    if source.is_dir():
        files = [p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file()]
        refuse_pickle_only(model, files, allow_pickle)
        return _copy_model_files(source, Path(target) if target else None, patterns)
    from huggingface_hub import HfApi, snapshot_download

    # Listed first, so a pickle-only repo is refused before anything is downloaded.
    refuse_pickle_only(model, HfApi().list_repo_files(model, revision=revision), allow_pickle)
    return Path(snapshot_download(model, revision=revision, local_dir=target, allow_patterns=patterns))


def refuse_pickle_only(model: str, files: list[str], allow_pickle: bool) -> None:
    """ValueError when the weights exist only as pickle (`*.bin`), which can run code when loaded."""
    names = [name.rsplit("/", 1)[-1] for name in files]
    if allow_pickle or any(name.endswith(".safetensors") for name in names):
        return
    if any(name.endswith(".bin") for name in names):
        raise ValueError(f"{model!r} has only pickle weights (pytorch_model*.bin), which can run code "
                         "when loaded: choose a model with model.safetensors, or pass --allow-pickle "
                         "if you trust its author.")
    raise ValueError(f"{model!r} has no weights file (model.safetensors): is it a model repo?")


def _copy_model_files(source: Path, target: Path | None, patterns: list[str]) -> Path:
    """The local-folder case: copy just the files the hub download would have kept."""
    from huggingface_hub.utils import filter_repo_objects

    if target is None or target.resolve() == source.resolve():
        return source
    files = [p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file()]
    for name in filter_repo_objects(files, allow_patterns=patterns):
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / name, target / name)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bertdemo", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser("download", help="fetch a model's config, safetensors weights and "
                                "tokenizer, then check that it loads as a masked LM")
    fetch.add_argument("model", help="hub id such as bert-base-uncased (or a local folder to copy)")
    fetch.add_argument("--dir", help="folder to save into (default: the Hugging Face cache)")
    fetch.add_argument("--revision", help="hub branch, tag or commit (default: main)")
    fetch.add_argument("--allow-pickle", action="store_true",
                       help="also fetch pytorch_model.bin (pickle can run code: trusted models only)")
    bundled = commands.add_parser("train-bundled", help="build the corpus from packages, train the "
                                  "bundled masked LM and save it (default: assets/bundled)")
    bundled.add_argument("--steps", type=int, help="optimizer steps (default: the shipped recipe's)")
    bundled.add_argument("--device", help="cpu, cuda or cuda:N (default: CUDA when present)")
    bundled.add_argument("--out", help="folder to save the model in (default: assets/bundled)")
    bundled.add_argument("--corpus", help="where the corpus is (or is built; default ~/.cache/bertdemo-bundled)")
    bundled.add_argument("--no-fetch", action="store_true", help="use only packages already installed")
    features = commands.add_parser("train-features", help="train the bundled model's feature dictionaries "
                                   "(sparse autoencoders, every layer) and save them (default: assets/bundled/features)")
    features.add_argument("--tokens", type=int, default=1_500_000, help="tokens each dictionary trains on")
    features.add_argument("--minutes", type=float, default=60, help="stop training after this long")
    features.add_argument("--latents", type=int, help="features per layer (default: 8 x the hidden size)")
    features.add_argument("--out", help="folder to save in (default: assets/bundled/features)")
    features.add_argument("--corpus", help="the bundled corpus (built if missing; default ~/.cache/bertdemo-bundled/corpus)")
    features.add_argument("--statistics-only", action="store_true", help="keep the coders in --out, make their "
                          "statistics and quality figures again")
    features.add_argument("--quality-only", action="store_true", help="keep the coders and statistics in --out, "
                          "measure their quality again on the same held-out lines")
    features.add_argument("--labels-only", action="store_true", help="keep the coders and quality figures in --out, "
                          "make their statistics again (labels by lift scored on held-out lines, activation bands, "
                          "random firings, [MASK] words, promoted words checked against noise)")
    features.add_argument("--cls", action="store_true", help="make the [CLS] dictionary instead (the sentence's own "
                          "features, what the Classify tab's head reads), default --out assets/bundled/cls_features")
    transcoders = commands.add_parser("train-transcoders", help="train the bundled model's transcoders (every "
                                      "layer's feed-forward block) and save them (default: assets/bundled/transcoders)")
    transcoders.add_argument("--tokens", type=int, default=1_000_000, help="tokens each transcoder trains on")
    transcoders.add_argument("--minutes", type=float, default=30, help="stop training after this long")
    transcoders.add_argument("--latents", type=int, help="features per layer (default: 8 x the hidden size)")
    transcoders.add_argument("--k", type=int, help="features kept per token (default: 32)")
    transcoders.add_argument("--skip", action=argparse.BooleanOptionalAction, help="a linear skip path (W_skip; "
                             "default: bertdemo.circuits.transcoders.SETTINGS)")
    transcoders.add_argument("--out", help="folder to save in (default: assets/bundled/transcoders)")
    transcoders.add_argument("--corpus", help="the bundled corpus (built if missing; default "
                             "~/.cache/bertdemo-bundled/corpus)")
    transcoders.add_argument("--statistics-only", action="store_true", help="keep the coders in --out, make their "
                             "statistics and quality figures again")
    transcoders.add_argument("--statistics-lines", type=int, default=6000, help="held-out lines the statistics "
                             "are computed over")
    transcoders.add_argument("--quality-lines", type=int, default=2000, help="the next held-out lines, the quality "
                             "figures are measured on")
    transcoders.add_argument("--layers", type=int, nargs="+", help="train only these layers again, into the set "
                             "in --out (its other layers kept as they are), each with its shipped settings "
                             "(bertdemo.circuits.transcoders.LAYER_SETTINGS) unless --latents, --k or --skip say")
    transcoders.add_argument("--resume", type=int, nargs="*", help="with --layers: these of them (none named: "
                             "all) go on from their coders in --out")
    transcoders.add_argument("--prune", action="store_true", help="with --layers: no training; these layers' "
                             "coders in --out lose the latents that never fire over the first 20,000 lines of "
                             "the text they trained on, and their statistics and quality are made again")
    warm = commands.add_parser("warm", help="make a model's ONNX Runtime export ahead, into a folder the server "
                               "reads and its disk budget never evicts")
    warm.add_argument("model", help="hub id, local folder, or `bundled`")
    warm.add_argument("--into", help="the warm folder (default: $BERTDEMO_WARM_DIR, else <cache dir>/warm; "
                                     "start the server with BERTDEMO_WARM_DIR set to it)")
    commands.add_parser("config-doc", help="print docs/configuration.md: every flag and environment "
                        "variable, from bertdemo.config.Settings")
    args = parser.parse_args(argv)
    if args.command == "train-bundled":
        return train_bundled(args)
    if args.command == "train-features":
        return train_features(args)
    if args.command == "train-transcoders":
        return train_transcoders(args)
    if args.command == "warm":
        return warm_model(args, parser)
    if args.command == "config-doc":
        from .config import config_doc

        sys.stdout.write(config_doc())
        return 0

    import bertdemo

    try:
        folder = download(args.model, args.dir, args.revision, args.allow_pickle)
        lm = bertdemo.load(str(folder), device="cpu", allow_pickle=args.allow_pickle)
    except (OSError, ValueError) as err:
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        hint = ("" if "pickle" in first_line else " Check the model id and the internet connection "
                "(HF_HUB_OFFLINE=1 forbids downloads).")
        parser.exit(1, f"Could not download {args.model!r}: {first_line}{hint}\n")
    size_mb = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e6
    print(f"{args.model}: {lm.card.summary()}, mask token {lm.mask_token}, {size_mb:.0f} MB in {folder}")
    if lm.card.warning:
        print(f"Warning: {lm.card.warning}.")
    print(f"Run: python app.py --model {args.dir or args.model}")
    return 0


def warm_model(args, parser) -> int:
    import time

    from .serving.engine import Engine

    started = time.perf_counter()
    engine = Engine(onnx=False)
    try:
        lm = engine.load(args.model, device="cpu")
        path = engine.warm(lm, args.into)
    except (OSError, ValueError) as err:
        parser.exit(1, f"Could not warm {args.model!r}: {err}\n")
    print(f"{args.model}: ONNX Runtime export in {path} ({path.stat().st_size / 1e6:.0f} MB, "
          f"{time.perf_counter() - started:.0f} s). Start the server with BERTDEMO_WARM_DIR={path.parent.parent}.")
    return 0


def train_bundled(args) -> int:
    from .build.bundled_training import Recipe, train_bundled as train

    recipe = Recipe() if args.steps is None else Recipe(steps=args.steps)
    train(recipe, corpus_dir=args.corpus and Path(args.corpus), out=args.out and Path(args.out),
          device=args.device, fetch=not args.no_fetch)
    return 0


def bundled_corpus(args) -> Path:
    """The bundled model's corpus (--corpus, default ~/.cache/bertdemo-bundled/corpus), built when missing."""
    from .build.bundled_corpus import build
    from .model.bundled import FOLDER

    corpus = Path(args.corpus) if args.corpus else Path.home() / ".cache" / "bertdemo-bundled" / "corpus"
    if not (corpus / "train.txt").is_file():
        build(corpus, corpus.parent / "packages", tokenizer_file=FOLDER / "tokenizer.json")
    return corpus


def train_features(args) -> int:
    from .features.making import finish_shipped, make_shipped, measure_shipped
    from .features.store import SHIPPED
    from .features.training import FeatureSettings
    from .model.bundled import load_bundled

    corpus = bundled_corpus(args)
    if args.cls:
        from .features import cls_features

        cls_features.make_shipped_cls(load_bundled(device="cpu"), corpus, Path(args.out or cls_features.SHIPPED))
        return 0
    out = Path(args.out) if args.out else SHIPPED
    if args.quality_only:
        measure_shipped(load_bundled(device="cpu"), corpus, out)
        return 0
    if args.statistics_only or args.labels_only:
        finish_shipped(load_bundled(device="cpu"), corpus, out, quality=not args.labels_only)
        return 0
    settings = FeatureSettings(latents=args.latents, max_tokens=args.tokens, max_seconds=args.minutes * 60, pause=0.0)
    make_shipped(load_bundled(device="cpu"), corpus, out, settings)
    return 0


def train_transcoders(args) -> int:
    from dataclasses import replace

    from .circuits.transcoders import (LAYER_SETTINGS, SETTINGS, SHIPPED, finish_all_layers, make_shipped,
                                       prune_shipped, retrain_shipped)
    from .features.making import finish_shipped
    from .model.bundled import load_bundled

    corpus = bundled_corpus(args)
    out = Path(args.out) if args.out else SHIPPED
    lm = load_bundled(device="cpu")
    lines = dict(statistics_lines=args.statistics_lines, held_out_lines=args.quality_lines)
    if args.statistics_only:
        finish_shipped(lm, corpus, out, **lines)
        finish_all_layers(lm, corpus, out, **lines)
        return 0
    if args.prune:
        if not args.layers:
            raise SystemExit("--prune needs --layers: which layers' coders to prune")
        prune_shipped(lm, corpus, out, args.layers, **lines)
        return 0
    run = dict(max_tokens=args.tokens, max_seconds=args.minutes * 60, pause=0.0)
    given = {name: value for name, value in (("latents", args.latents), ("k", args.k), ("skip_connection", args.skip))
             if value is not None}
    if args.layers:
        plan = {layer: replace(LAYER_SETTINGS.get(layer, SETTINGS), **given, **run) for layer in args.layers}
        resume = () if args.resume is None else tuple(args.resume or args.layers)
        retrain_shipped(lm, corpus, out, plan, resume=resume, **lines)
        return 0
    make_shipped(lm, corpus, out, replace(SETTINGS, **given, **run), **lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
