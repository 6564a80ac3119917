"""Settings: every field is a `--flag` and a `BERTDEMO_*` env var, generated from one place."""
import dataclasses

import pytest

import app
from bertdemo.config import Settings, env_var, flag, flag_parser


def test_every_field_is_a_flag_and_an_env_var_with_its_help(capsys):
    with pytest.raises(SystemExit):
        app.parse_args(["--help"])
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for f in dataclasses.fields(Settings):
        assert flag(f) in shown and env_var(f) in shown, f.name
        assert " ".join(f.metadata["help"].split()) in shown, f.name


def test_defaults_are_the_dataclass_defaults(monkeypatch):
    for f in dataclasses.fields(Settings):
        monkeypatch.delenv(env_var(f), raising=False)
    for name in ["SPACE_ID", "GRADIO_SERVER_NAME", "GRADIO_SERVER_PORT"]:
        monkeypatch.delenv(name, raising=False)
    assert app.parse_args([]) == Settings()


def test_flags_override_env_vars_which_override_defaults():
    environ = {"BERTDEMO_MAX_MASKS": "3", "BERTDEMO_QUEUE_SIZE": "7", "BERTDEMO_SHARE": "yes",
               "BERTDEMO_DEVICE": "cpu"}
    settings = Settings.from_flags(["--queue-size", "9", "--model", "x"], environ)
    assert (settings.max_masks, settings.queue_size, settings.share) == (3, 9, True)
    assert (settings.model, settings.device) == ("x", "cpu")
    assert Settings.from_flags(["--allow-pickle"], {}).allow_pickle


def test_a_bad_number_is_refused_with_the_flag_named(capsys):
    with pytest.raises(SystemExit):
        Settings.from_flags(["--max-masks", "many"], {})
    assert "--max-masks" in capsys.readouterr().err


def test_parser_takes_its_defaults_from_the_settings_given():
    parser = flag_parser(Settings(port=1234, auth="ann:pw"))
    assert parser.parse_args([]).port == 1234 and parser.parse_args([]).auth == "ann:pw"
