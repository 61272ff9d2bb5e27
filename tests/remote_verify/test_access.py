"""Who may connect: bearer tokens at the upgrade, the rule for non-loopback addresses, and TLS."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import trustme
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from remote_verify.access import bearer_problem, exposure_problem, is_loopback
from wire.protocol import SUBPROTOCOL, Welcome, decode_server_message, encode
from tests.conftest import RunningService, hello_for

SPECWIRE = str(Path(sys.executable).parent / "specwire")


def test_a_bare_websocket_client_without_the_token_gets_401(own_llamacpp_target, close_draft):
    """No header, a non-bearer header and a wrong token each get 401 saying which; the token works."""
    guarded = RunningService(own_llamacpp_target, token="s3cret")
    try:
        for headers, words in ((None, b"missing bearer token"), ({"Authorization": "Basic czNjcmV0"},
                               b"not a bearer token"), ({"Authorization": "Bearer s3cre"}, b"wrong bearer token")):
            with pytest.raises(InvalidStatus) as refused:
                connect(guarded.url, subprotocols=[SUBPROTOCOL], additional_headers=headers)
            assert refused.value.response.status_code == 401 and words in refused.value.response.body
            assert refused.value.response.headers["WWW-Authenticate"].startswith("Bearer")
        with connect(guarded.url, subprotocols=[SUBPROTOCOL],
                     additional_headers={"Authorization": "Bearer s3cret"}) as ws:
            ws.send(encode(hello_for(close_draft)))
            assert isinstance(decode_server_message(ws.recv()), Welcome)
    finally:
        guarded.close()


def test_the_token_comparison_and_the_address_rule():
    """bearer_problem accepts only the exact token; non-loopback hosts need a token or the override."""
    assert bearer_problem("Bearer abc", "abc") is None
    assert bearer_problem("Bearer abd", "abc") == "wrong bearer token"
    assert bearer_problem("Bearer abcd", "abc") == "wrong bearer token"
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("") and not is_loopback("192.0.2.7")
    assert exposure_problem("127.0.0.1", None, False) is None
    assert "--token-file" in exposure_problem("0.0.0.0", None, False)
    assert exposure_problem("0.0.0.0", "t", False) is None and exposure_problem("0.0.0.0", None, True) is None


def test_serve_refuses_a_public_address_without_a_token(tiny):
    """`specwire serve --host 0.0.0.0` with no token exits with a message naming both ways out."""
    result = subprocess.run([SPECWIRE, "serve", "--target", str(tiny.target_gguf), "--host", "0.0.0.0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert "--token-file" in result.stderr and "--insecure-no-auth" in result.stderr


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory) -> dict[str, Path]:
    """A throwaway CA and a certificate it signed for 127.0.0.1 and localhost."""
    folder = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    files = {"ca": folder / "ca.pem", "cert": folder / "cert.pem", "key": folder / "key.pem"}
    ca.cert_pem.write_to_path(files["ca"])
    cert.private_key_pem.write_to_path(files["key"])
    for i, pem in enumerate(cert.cert_chain_pems):
        pem.write_to_path(files["cert"], append=i > 0)
    return files


def test_generate_verifies_over_wss_with_the_ca_file(tiny, tls_files):
    """serve --tls-cert/--tls-key announces wss://; generate --ca-file is verified over it, and
    without the CA file it stops with a message naming --ca-file."""
    service = subprocess.Popen([SPECWIRE, "serve", "--target", str(tiny.target_gguf), "--port", "0",
                                "--tls-cert", str(tls_files["cert"]), "--tls-key", str(tls_files["key"])],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = service.stdout.readline()
        assert line.startswith("listening on wss://127.0.0.1:"), line
        url = line.split()[-1]
        generate = [SPECWIRE, "generate", "--draft", str(tiny.draft), "--server", url, "--prompt", "def f(x):",
                    "--max-tokens", "16", "--temperature", "0", "--json"]
        trusted = subprocess.run(generate + ["--ca-file", str(tls_files["ca"])], capture_output=True, text=True,
                                 timeout=120)
        assert trusted.returncode == 0, trusted.stderr
        stats = json.loads(trusted.stdout)["stats"]
        assert stats["rounds"] >= 1 and stats["offline"] == 0 and stats["bytes_received"] > 0, (stats, trusted.stderr)
        untrusted = subprocess.run(generate, capture_output=True, text=True, timeout=120)
        assert untrusted.returncode == 2
        assert "not trusted" in untrusted.stderr and "--ca-file" in untrusted.stderr
    finally:
        service.kill()
        service.wait()
