"""A server the tests start (benchmarks/lib/loopback.py): one that does not come up fails the test that needed it,
naming its log, and stop() kills it as a crash would (no graceful drain)."""

import pytest

from benchmarks.lib.loopback import LoopbackServer, ServerNotReady


class TestServer(LoopbackServer):
    __test__ = False  # a helper, not a test class

    def start(self) -> None:
        try:
            super().start()
        except ServerNotReady as exc:
            pytest.fail(str(exc))

    def stop(self, graceful: bool = False) -> None:
        super().stop(graceful)
