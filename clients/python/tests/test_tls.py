"""TLS: a client with the cluster's CA holds locks over ``lockd dev --nodes 3 --tls`` (client
ports over TLS, mutual TLS between the nodes); without the CA, or in plain text, it reaches
nothing."""
from __future__ import annotations

from typing import Iterator

import pytest

from lockd_client import Client, RetryPolicy, errors

from conftest import Cluster


@pytest.fixture(scope="module")
def tls_cluster() -> Iterator[Cluster]:
    c = Cluster(18090, 18190, 18290, nodes=3, tls=True)
    try:
        yield c.start()
    finally:
        c.stop()


# scenario: tls
def test_a_client_with_the_ca_holds_a_lock_over_tls(tls_cluster: Cluster, name: str) -> None:
    with Client(tls_cluster.endpoints, ca_file=str(tls_cluster.ca_file()), ttl=6) as c:
        with c.lock(name, wait=5) as lk:
            assert lk.token >= 1
            assert not lk.lost
        assert not c.inspect(name).holders


# scenario: tls
def test_without_the_ca_or_in_plain_text_nothing_answers(tls_cluster: Cluster, name: str) -> None:
    # TLS trusting only the system's roots, which do not know the throwaway CA.
    https = [f"https://{e}" for e in tls_cluster.endpoints]
    once = RetryPolicy(max_attempts=1)
    with Client(https, ttl=6, request_timeout=0.5, retry=once) as c:
        with pytest.raises(errors.LockdError) as unknown_ca:
            c.lock(name, wait=0).__enter__()
    # Each error says what to do (issue 44 item 7).
    assert "give its CA (ca_file=)" in str(unknown_ca.value), unknown_ca.value
    with Client(tls_cluster.endpoints, ttl=6, request_timeout=0.5, retry=once) as c:
        with pytest.raises(errors.LockdError) as plain:
            c.lock(name, wait=0).__enter__()
    assert "use an https:// endpoint" in str(plain.value), plain.value
