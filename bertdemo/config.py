"""Settings for the demo: one dataclass, every field overridable by a flag or an env var.

Each field says once what it means (`option(default, help)`); `--flags`, their `--help` and the
`BERTDEMO_*` env vars are all generated from that, so the three cannot drift apart.
"""
from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path
from dataclasses import MISSING, Field, dataclass, field, fields

DEFAULT_MODEL = "bert-base-uncased"
ENV_PREFIX = "BERTDEMO_"


def option(default, help: str, *, metavar: str | None = None, repr: bool = True) -> Field:
    """A settings field: its default and what it means (the `--flag`'s help, said once)."""
    return field(default=default, repr=repr, metadata={"help": help, "metavar": metavar})


@dataclass(frozen=True)
class Limits:
    """Caps on one run (a fine-tune, a classifier's training, an experiment that trains); each is
    checked before the run starts, except the time, at which the run stops cleanly. The defaults are
    written here once: `Settings`' run caps (--finetune-max-chars, ...) default to them."""

    max_chars: int = 20_000  # text (or labelled examples) per run
    max_steps: int = 300
    max_seconds: float = 120.0  # wall clock per training run
    max_batch_size: int = 64
    max_learning_rate: float = 1e-2
    max_examples: int = 2_000  # labelled examples per classifier run
    features_max_tokens: int = 2_000_000  # tokens a feature dictionary's training sees
    features_max_seconds: float = 120.0  # its training's wall clock (within max_seconds: the run's)


@dataclass
class Settings:
    """What the operator can set. Field `max_masks` is flag `--max-masks` and env var `BERTDEMO_MAX_MASKS`."""

    # One declaration per setting, each the same shape on purpose: a table the flags and docs are made from.

    model: str = option(DEFAULT_MODEL, "hub id or local folder of a masked LM (BERT, DistilBERT, "
                                       "RoBERTa-style), or `bundled` for the model shipped in assets/bundled")
    models: str | None = option(None, "more hub ids or folders visitors may pick, comma separated; "
                                      "nothing else can be loaded from the page", metavar="A,B,...")
    device: str | None = option(None, "cpu, cuda or cuda:N; default: CUDA when present, else CPU")
    dtype: str = option("float32", "weights' precision: float32, bfloat16 (half the memory traffic; "
                                   "speed and fidelity in docs/benchmarks.md), or auto (bfloat16 where "
                                   "timing both on this CPU finds it clearly faster, else float32)")
    host: str = option("127.0.0.1", "address to serve on")
    port: int = option(7860, "port")
    # Each cap is its own field (its own flag, env var and row of docs/configuration.md); a run's caps
    # default to `Limits`' (written once there, for the page and the Python API alike).
    max_masks: int = option(10, "most [MASK]s per sentence")
    max_top_k: int = option(50, "most predictions shown per mask")
    max_candidates: int = option(10, "most candidate words scored at once")
    max_batch: int = option(16, "fill-mask requests batched into one forward; 1 disables")
    finetune_max_chars: int = option(Limits.max_chars, "most characters of text per fine-tune")
    finetune_max_steps: int = option(Limits.max_steps, "most steps per fine-tune run")
    finetune_max_seconds: int = option(int(Limits.max_seconds), "wall-clock seconds per fine-tune run (stops "
                                                                "cleanly there)")
    finetune_max_models: int = option(8, "tuned models kept in memory (least recently used evicted)")
    finetune_concurrency: int = option(1, "fine-tunes running at once (the rest wait in the queue)")
    embedding_max_lines: int = option(50, "most sentences per embedding map")
    embedding_max_tokens: int = option(2000, "most tokens of all the sentences of one embedding map")
    search_max_lines: int = option(2000, "most lines of a visitor's own corpus to search (the default "
                                         "corpus is not held to it)")
    search_max_chars: int = option(100_000, "most characters of a visitor's own corpus to search")
    classify_max_examples: int = option(Limits.max_examples, "most labelled examples per classifier run (its "
                                                             "other caps are the fine-tune's)")
    features_max_tokens: int = option(Limits.features_max_tokens, "most tokens a feature dictionary trained "
                                                                  "from the page sees (Features tab, 'Train "
                                                                  "features for layer N')")
    features_max_seconds: int = option(int(Limits.features_max_seconds), "wall-clock seconds of a feature "
                                       "dictionary's training from the page, at most --finetune-max-seconds "
                                       "(every run's limit); its statistics and quality are measured after")
    circuit_max_tokens: int = option(64, "most tokens (special tokens included) of a sentence drawn as a "
                                         "circuit (Circuits tab): a graph's time grows faster than its length")
    cache_dir: str | None = option(None, "folder of every cache the server writes: search indexes, ONNX "
                                         "exports, feature dictionaries, examples' results (default "
                                         "~/.cache/bertdemo)", metavar="FOLDER")
    cache_mb: int = option(2_000, "megabytes of disk all those caches may use together (least recently "
                                  "used deleted first; the default corpus' index and the served models' "
                                  "exports are kept)")
    index_at_start: bool = option(True, "build the served model's index of the corpus search's default "
                                        "corpus in the background at start (the first search answers at once)")
    queue_size: int = option(64, "most requests waiting in the queue")
    max_sessions: int = option(1000, "sessions whose page state is kept in memory, tens of KB each "
                                     "(the oldest are forgotten)")
    download_max_mb: int = option(2048, "megabytes of downloads kept on disk (least recent "
                                        "sessions' deleted first)")
    download_max_age: int = option(3600, "seconds a download stays available before it is deleted")
    onnx: bool | None = option(None, "fill-mask through ONNX Runtime where installed (each served model "
                               "exported once, kept in the disk cache). "
                               "Neither flag: each batch runs on whichever of ONNX Runtime and torch was "
                               "measured faster for its shape when the model was served (logged); on: "
                               "ONNX Runtime for batches under 80 token slots, unmeasured; off: torch only")
    allow_pickle: bool = option(False, "accept checkpoints without safetensors (pickle can run code)")
    share: bool = option(False, "also serve on a public *.gradio.live link: anyone with it can use the demo")
    mcp: bool = option(False, "also serve the quick tools (fill-mask, scores, mask sampling, layer "
                              "predictions, saliency) to MCP clients at /gradio_api/mcp/; on in a "
                              "Space unless BERTDEMO_MCP=0")
    replica: bool = option(False, "one of several processes behind a load balancer (deploy/): with no "
                                  "model loaded, answer the page with 503 and why, so the balancer "
                                  "sends visitors to the others")
    auth: str | None = option(None, "require this login (kept out of logs)", metavar="USER:PASSWORD",
                              repr=False)

    @property
    def limits(self) -> "Limits":
        """The caps on each run a visitor starts (fine-tunes, classifiers, experiments)."""
        return Limits(max_chars=self.finetune_max_chars, max_steps=self.finetune_max_steps,
                      max_seconds=float(self.finetune_max_seconds), max_examples=self.classify_max_examples,
                      features_max_tokens=self.features_max_tokens,
                      features_max_seconds=float(min(self.features_max_seconds, self.finetune_max_seconds)))

    @property
    def allowed_models(self) -> list[str]:
        """What a visitor may pick in the page: `model` first, then each of `models`, once."""
        names = [self.model, *(self.models or "").split(",")]
        return list(dict.fromkeys(name.strip() for name in names if name and name.strip()))

    @classmethod
    def from_env(cls, environ: dict | None = None) -> "Settings":
        """Settings with each `BERTDEMO_<FIELD>` env var applied (e.g. BERTDEMO_MODEL)."""
        environ = os.environ if environ is None else environ
        values = _hosting_defaults(environ)
        for f in fields(cls):
            raw = environ.get(env_var(f))
            if raw is not None:
                values[f.name] = _parse(raw, f.type)
        return cls(**values)

    @classmethod
    def from_flags(cls, argv: list[str] | None = None, environ: dict | None = None) -> "Settings":
        """Flags override env vars, which override the defaults. Exits with a usage message on a
        bad flag or env var, as argparse does."""
        args = flag_parser(cls.from_env(environ)).parse_args(argv)
        return cls(**vars(args))


# What else the app reads from its environment (not settings: where files go, the allocator, the
# hosting platform's conventions). `config_doc` lists them beside the settings.
OTHER_ENV = {
    "BERTDEMO_ONNX_CACHE": "folder where each served model's ONNX export is kept (default "
                           "`<cache dir>/onnx`); counted in the cache budget all the same",
    "BERTDEMO_SEARCH_CACHE": "folder where the corpus search keeps its indexes, one per model and corpus "
                             "(default `<cache dir>/search`); counted in the cache budget all the same",
    "BERTDEMO_FEATURES_CACHE": "folder where feature dictionaries trained here are kept, one folder per "
                               "model's weights and layer (default `<cache dir>/features`); counted in the "
                               "cache budget all the same",
    "BERTDEMO_WARM_DIR": "folder of exports made ahead by `python -m bertdemo warm` (default `<cache dir>/warm`): "
                         "read at start, never evicted (docs/operations.md)",
    "SPARSIFY_DISABLE_TRITON": "sparsify's decoder without Triton; bertdemo sets `1` where there is no CUDA "
                               "device, unless set (bertdemo/features/dictionary.py)",
    "BERTDEMO_MALLOC": "`glibc` keeps glibc's malloc; by default `python app.py` re-executes itself under "
                       "jemalloc where it is installed (docs/operations.md)",
    "BERTDEMO_REEXECED": "set by `python app.py` itself when it re-executes under jemalloc: never set it",
    "MALLOC_ARENA_MAX": "glibc's malloc arenas when jemalloc is not there; the app caps them at 2 unless set",
    "GOMP_SPINCOUNT": "how long torch's OpenMP workers spin after an operation before they sleep; "
                      "`python app.py` sets 30000 (~0.3 ms; libgomp's default ~3 ms) unless set: a shorter "
                      "spin after a forward leaves the core to the web server and ONNX Runtime "
                      "(bertdemo/serving/compute.py)",
    "GRADIO_SERVER_NAME": "the address to serve on when `BERTDEMO_HOST` is not set (the Docker image "
                          "sets `0.0.0.0`)",
    "GRADIO_SERVER_PORT": "the port when `BERTDEMO_PORT` is not set",
    "SPACE_ID": "set by a Hugging Face Space: serve on `0.0.0.0`, `--mcp` on, no share link",
    "GRADIO_TEMP_DIR": "Gradio's folder for the files it serves (downloads); default: one of the app's "
                       "own, removed at exit",
    "GRADIO_HEARTBEAT_INTERVAL": "seconds between a page's heartbeats (default 5 here; Gradio's is 15)",
    "GRADIO_RUN_HISTORY": "`true`: Gradio's run history (every event's inputs and outputs kept in the visitor's "
                          "browser, the page's \"Runs\" link); off here unless set, as it re-reads and re-writes "
                          "all of it on every event (bertdemo/ui/serving/lifecycle.py)",
    "HF_HUB_OFFLINE": "`1`: never ask the Hugging Face Hub; models come from its local cache or a folder",
    "HF_HOME": "where the Hugging Face cache lives (downloaded models)",
}


def config_doc() -> str:
    """docs/configuration.md, generated from `Settings` and `OTHER_ENV` so it cannot drift:
    `python -m bertdemo config-doc > docs/configuration.md` (a test compares the two)."""
    rows = ["| flag | environment variable | default | meaning |", "| --- | --- | --- | --- |"]
    for f in fields(Settings):
        name = f"`{flag(f)}` / `--no-{flag(f)[2:]}`" if "bool" in f.type else f"`{flag(f)}`"
        default = "neither" if "bool" in f.type and f.default is None else _shown_default(f.default)
        rows.append(f"| {name} | `{env_var(f)}` | {default} | "
                    f"{' '.join(f.metadata['help'].split())} |")
    others = ["| variable | meaning |", "| --- | --- |"]
    others += [f"| `{name}` | {meaning} |" for name, meaning in OTHER_ENV.items()]
    return "\n".join([
        "# Configuration", "",
        "<!-- Generated from bertdemo.config (Settings, OTHER_ENV) by `python -m bertdemo config-doc "
        "> docs/configuration.md`: edit those, not this file (tests/test_docs.py compares them). -->", "",
        "Every setting is a flag of `python app.py` and an environment variable: a flag wins over its "
        "variable, which wins over the default. `python app.py --help` prints the same list. On/off "
        "settings take `1`, `true`, `yes` or `on` in their variable (anything else is off).", "",
        *rows, "",
        "Host and port also follow the hosting platform's conventions (`GRADIO_SERVER_NAME`, "
        "`GRADIO_SERVER_PORT`, `SPACE_ID`, below); a `BERTDEMO_*` variable or a flag still wins.", "",
        "## Other environment variables", "",
        *others, ""])


def _shown_default(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"`{value}`"


def cpu_model() -> str:
    """The processor's name (e.g. "AMD EPYC"), for reports of measured figures: speed and quality
    differ by CPU."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def env_var(f: Field) -> str:
    return ENV_PREFIX + f.name.upper()


def flag(f: Field) -> str:
    return "--" + f.name.replace("_", "-")


def flag_parser(defaults: Settings) -> argparse.ArgumentParser:
    """`--field-name` for every field of `Settings`, defaulting to `defaults` (the env's)."""
    parser = argparse.ArgumentParser(description="BERT masked-language-modelling demo")
    for f in fields(Settings):
        shown = "" if f.default in (None, False, MISSING) else "; default %(default)s"
        kind = ({"action": argparse.BooleanOptionalAction} if "bool" in f.type else
                {"type": _auth_value if f.name == "auth" else _TYPES.get(f.type, str), "metavar": f.metadata["metavar"]})
        parser.add_argument(flag(f), default=getattr(defaults, f.name), dest=f.name,
                            help=f"{f.metadata['help']} (env {env_var(f)}{shown})", **kind)
    return parser


def parse_auth(value: str | None) -> tuple[str, str] | None:
    """`"user:password"` -> `("user", "password")` (the password may contain ':'); else None."""
    user, sep, password = (value or "").partition(":")
    return (user, password) if sep and user and password else None


def _auth_value(value: str) -> str:
    """argparse type for --auth (also applied to BERTDEMO_AUTH): must be `user:password`."""
    if value and parse_auth(value) is None:
        raise argparse.ArgumentTypeError("expected USER:PASSWORD, e.g. --auth alice:s3cret")
    return value


_TYPES = {"int": int, "float": float}  # by annotation; anything else is text


def _parse(raw: str, type_name: str):
    """Turn an env-var string into the field's type (`bool`, `int`, `float` or `str`)."""
    if "bool" in type_name:
        return raw.strip().lower() in {"1", "true", "yes", "on"}
    if type_name in _TYPES:
        return _TYPES[type_name](raw)
    return raw or None


def _hosting_defaults(environ) -> dict:
    """Host, port and MCP from the hosting platform's conventions; BERTDEMO_* env vars still win.

    Gradio reads GRADIO_SERVER_NAME/GRADIO_SERVER_PORT (our Docker image sets them), and a Hugging
    Face Space sets SPACE_ID and serves whatever listens on 0.0.0.0:7860.
    """
    values = {}
    if environ.get("GRADIO_SERVER_NAME"):
        values["host"] = environ["GRADIO_SERVER_NAME"]
    elif environ.get("SPACE_ID"):
        values["host"] = "0.0.0.0"
    if environ.get("SPACE_ID"):
        values["mcp"] = True  # a 2026 Space is expected to offer its tools to agents
    if environ.get("GRADIO_SERVER_PORT"):
        values["port"] = int(environ["GRADIO_SERVER_PORT"])
    return values
