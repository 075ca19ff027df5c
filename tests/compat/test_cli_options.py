"""Command-line options are validated with the config and worded by the one formatter."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rollgym.cli.run import _collect_config
from rollgym.config import CollectConfig, format_validation_error
from rollgym.errors import ConfigError
from tests.compat.stack import stack_config


def test_a_bad_option_is_named_by_its_flag_in_the_formatters_words() -> None:
    cfg = stack_config()
    with pytest.raises(ConfigError) as err:
        _collect_config(cfg, repeats=0, concurrency=None, max_failure_rate=2.0)
    lines = err.value.message.splitlines()
    assert lines[0] == "compat-config.yaml: invalid config"
    assert lines[1:] == [
        "  --repeats: Input should be greater than or equal to 1",
        "  --max-failure-rate: Input should be less than or equal to 1",
    ]


def test_a_bad_value_from_the_config_is_named_by_its_key() -> None:
    cfg = stack_config()
    bad = cfg.model_copy(update={"collect": cfg.collect.model_copy(update={"repeats": 0})})
    with pytest.raises(ConfigError, match=r"\n  collect\.repeats: Input should be greater"):
        _collect_config(bad, concurrency=3)


def test_the_formatter_words_given_names_and_keeps_nested_keys() -> None:
    with pytest.raises(ValidationError) as exc:
        CollectConfig.model_validate({"agent_aliases": {"x": 3}, "limit": 0})
    text = format_validation_error("src", exc.value, prefix="collect", names={"limit": "--limit"})
    assert text.splitlines()[1:] == [
        "  collect.agent_aliases.x: Input should be a valid string",
        "  --limit: Input should be greater than or equal to 1",
    ]
