"""The http adapter over TLS, against the simulator served with a certificate of the test's: the
registry's answer is only read from a peer whose certificate a trusted authority signed for the
registry's own name (httpx's trust store, or SSL_CERT_FILE's as httpx reads it). A bearer token
and passports go to the registry: a peer in the middle must get neither."""

import ssl
import threading
import types
import uuid

import pytest

from registry import adapters
from registry.simulator import make_server
from tests.certificates import self_signed

UPI = "https://id.example.eu/01/1/21/TLS"


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    folder = tmp_path_factory.mktemp("registry-tls")
    return {name: self_signed(folder, name) for name in ("localhost", "elsewhere.test")}


@pytest.fixture
def tls_registry(certificates):
    """The simulator on https://localhost:<port>, presenting the certificate of the name given."""
    servers = []

    def serving(name: str = "localhost"):
        server = make_server(port=0, token="tls-token")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*certificates[name])
        server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        return server

    yield serving
    for server in servers:
        server.shutdown()
        server.server_close()


def adapter_for(server) -> adapters.HttpRegistry:
    return adapters.HttpRegistry(f"https://localhost:{server.server_address[1]}", "tls-token", timeout=5)


def registration():
    passport = types.SimpleNamespace(
        upi=UPI, operator_id="OP", facility_id="", commodity_code="", pk=uuid.uuid4()
    )
    return types.SimpleNamespace(passport=passport, pk=uuid.uuid4())


def test_a_registry_whose_certificate_is_trusted_for_its_name_is_spoken_to(
    tls_registry, certificates, monkeypatch
):
    monkeypatch.setenv("SSL_CERT_FILE", str(certificates["localhost"][0]))
    adapter = adapter_for(tls_registry())
    try:
        accepted = adapter.register(registration())
        assert isinstance(accepted, adapters.Accepted)
        assert adapter.find_submission(UPI) == adapters.Found(accepted.request_id)
    finally:
        adapter.close()


@pytest.mark.parametrize(
    "presented, trusted",
    [
        pytest.param("localhost", None, id="signed-by-no-authority-trusted"),
        pytest.param("elsewhere.test", "elsewhere.test", id="trusted-but-for-another-name"),
    ],
)
def test_a_registry_not_proven_to_be_the_registry_gets_nothing(
    tls_registry, certificates, monkeypatch, presented, trusted
):
    """A certificate no trusted authority signed, or one trusted but for another name than the
    registry URL's: the handshake fails, the register is retryable (the row stays owed), and the
    peer never sees a request, so neither the token nor the passport."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    if trusted is not None:
        monkeypatch.setenv("SSL_CERT_FILE", str(certificates[trusted][0]))
    server = tls_registry(presented)
    adapter = adapter_for(server)
    try:
        with pytest.raises(adapters.Retryable, match="CERTIFICATE_VERIFY_FAILED"):
            adapter.register(registration())
        with pytest.raises(adapters.RegistryUnreadable, match="CERTIFICATE_VERIFY_FAILED"):
            adapter.find_submission(UPI)
    finally:
        adapter.close()
    assert server.state.calls == [] and server.state.requests == {}
