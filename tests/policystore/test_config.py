"""StoreConfig on its own (no Ray): every bad setting is a ConfigError naming the field."""

import pytest

from policystore import StoreConfig
from policystore.errors import ConfigError

BAD_CONFIGS = [dict(spill_dir=123), dict(spill_dir=""), dict(durable_uri=123), dict(hot_capacity_bytes=-1),
               dict(hot_capacity_bytes=True), dict(max_concurrency=1), dict(max_concurrency=2.5),
               dict(max_watchers=0), dict(max_staleness_s=float("nan")), dict(call_timeout_s=0),
               dict(call_timeout_s="30"), dict(compress="yes"), dict(league="a/b"), dict(league="")]


@pytest.mark.parametrize("fields", BAD_CONFIGS, ids=[repr(f)[:30] for f in BAD_CONFIGS])
def test_bad_store_config_is_a_config_error(fields):
    with pytest.raises(ConfigError, match=f"StoreConfig.{next(iter(fields))}|invalid league") as raised:
        StoreConfig(**fields)
    assert isinstance(raised.value, ValueError)  # older except-clauses still catch it


def test_push_settings_are_checked():
    for bad in (-1, "1", True, float("nan"), 1e9):
        with pytest.raises(ValueError, match="max_staleness_s"):
            StoreConfig(max_staleness_s=bad)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="max_watchers"):
            StoreConfig(max_watchers=bad)
