"""The embedded Redis of DATA_DIR (SPEC S2, S7): one server per DATA_DIR, which scripts find and share."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.errors import ConfigError
from broker.store import embedded
from broker.store.embedded import ADDRESS_FILE, EmbeddedRedis
from broker.store.opener import running_url, store_url


def test_a_brokers_server_is_found_and_shared_and_left_running(tmp_path: Path) -> None:
    # Given the embedded Redis a broker runs (it announces its address)
    with EmbeddedRedis(str(tmp_path), announce=True) as url:
        # When a script opens the store of the same DATA_DIR
        with store_url(None, str(tmp_path)) as opened:
            # Then it works on that very server
            assert opened == url == running_url(str(tmp_path))
        # And leaves it running
        assert running_url(str(tmp_path)) == url
    # Once the broker's server stops, its address is gone and nothing runs there
    assert not (tmp_path / ADDRESS_FILE).exists()
    assert running_url(str(tmp_path)) is None


def test_without_a_server_a_script_starts_one_and_stops_it(tmp_path: Path) -> None:
    with store_url(None, str(tmp_path)) as url:
        assert url.startswith("redis://127.0.0.1:")
        assert embedded.pid_in(tmp_path) is not None
        assert not (tmp_path / ADDRESS_FILE).exists()  # a script's server is its own: nobody else joins it
    assert embedded.pid_in(tmp_path) is None


def test_a_stale_address_is_no_server(tmp_path: Path) -> None:
    # Given the address of a server that is gone (its port free, or another server's now)
    with EmbeddedRedis(str(tmp_path / "other"), announce=True) as other:
        (tmp_path / ADDRESS_FILE).write_text(other.removeprefix("redis://").removesuffix("/0"))
        # Then it does not count: that server keeps its files elsewhere
        assert running_url(str(tmp_path)) is None


def test_a_server_without_an_address_is_never_started_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a server on DATA_DIR that recorded no address (a script's own)
    monkeypatch.setattr(embedded, "START_TIMEOUT_S", 0.2)
    with EmbeddedRedis(str(tmp_path)):
        # Then a script is told what to do rather than start a second server on the same files
        with pytest.raises(ConfigError, match="records no address"):
            running_url(str(tmp_path))
        # And so is a broker, once that server has not ended in time
        with pytest.raises(ConfigError, match="still works in DATA_DIR"):
            EmbeddedRedis(str(tmp_path), announce=True).start()
