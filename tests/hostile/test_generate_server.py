"""Hostile generate requests to a served decoder: ids outside the vocabulary, wrong datatypes,
lengths that disagree, positions outside the model's table, a cache past the server's limit. Each
is answered 400 with a one-line JSON error, and the server keeps serving."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest
from conftest import run_cli
from decoder_bundles import decoder_bundle

from edgesplit.errors import RemoteError
from edgesplit.generate.offload import prefill_feeds
from edgesplit.model.zoo_decoder import SIZES
from edgesplit.runtime import oip
from edgesplit.runtime.client import OipClient
from edgesplit.serve.server import ServeOptions, ServerThread

pytestmark = pytest.mark.timeout(120)
CONFIG = SIZES["decoder_tiny"]
LIMIT = 48


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    bundle = decoder_bundle(tmp_path_factory.mktemp("genhostile"), "decoder_tiny")
    opts = ServeOptions(port=0, all_parts=True, max_cache_tokens=LIMIT)
    with ServerThread(bundle, opts) as server:
        client = OipClient(server.url, timeout_s=30, retries=0)
        yield {"client": client, "url": server.url, "bundle": bundle}
        client.close()


def _feeds(n: int = 8, **changes) -> dict[str, np.ndarray]:
    feeds = prefill_feeds(CONFIG, list(range(1, n + 1)))
    return {**feeds, **changes}


def _past(length: int) -> dict[str, np.ndarray]:
    shape = (1, CONFIG.kv_heads, length, CONFIG.head_dim)
    return {k: np.zeros(shape, np.float32) for k in _feeds() if k.startswith("past_key_values.")}


def _refused(client: OipClient, feeds, *words: str, outputs=("last_logits",)) -> None:
    with pytest.raises(RemoteError) as e:
        client.infer("p0", feeds, list(outputs))
    msg = str(e.value)
    assert "HTTP 400" in msg and "\n" not in msg and "Traceback" not in msg, msg
    for w in words:
        assert w in msg, (w, msg)
    assert client.live()


@pytest.mark.parametrize(
    "changes,words",
    [
        ({"input_ids": np.asarray([[1, 2, 3, 4, 5, 6, 7, 256]])}, ["must lie in [0, 256)"]),
        ({"input_ids": np.asarray([[1, -5, 3, 4, 5, 6, 7, 8]])}, ["must lie in [0, 256)"]),
        ({"input_ids": np.asarray([[1, 2, 3]], np.int32)}, ["datatype INT32, expected INT64"]),
        ({"input_ids": np.asarray([[1.0, 2.0]], np.float32)}, ["datatype FP32"]),
        ({"attention_mask": np.ones((1, 8), np.float32)}, ["'attention_mask': datatype FP32"]),
        ({"attention_mask": np.ones((1, 5), np.int64)}, ["attention_mask covers 5 positions"]),
        ({"position_ids": np.arange(4, dtype=np.int64)[None]}, ["position_ids is [1, 4]"]),
        ({"position_ids": np.arange(600, 608, dtype=np.int64)[None]}, ["[0, 512)"]),
        ({"input_ids": np.zeros((1, 0), np.int64)}, ["input_ids holds no token"]),
    ],
)
def test_bad_values_refused(served, changes, words):
    _refused(served["client"], _feeds(**changes), *words)


def test_batch_disagreement_refused(served):
    _refused(
        served["client"],
        _feeds(attention_mask=np.ones((2, 8), np.int64)),
        "disagree on the batch",
    )


def test_pasts_of_different_lengths_refused(served):
    past = _past(4)
    past["past_key_values.1.value"] = np.zeros((1, CONFIG.kv_heads, 3, CONFIG.head_dim), np.float32)
    feeds = _feeds(1, **past, attention_mask=np.ones((1, 5), np.int64))
    _refused(served["client"], feeds, "different lengths")


@pytest.mark.parametrize(
    "past,new,batch", [(0, LIMIT + 1, 1), (LIMIT - 2, 3, 1), (20, 10, 2), (0, 500, 1)]
)
def test_cache_past_the_limit_refused(served, past, new, batch):
    feeds = prefill_feeds(CONFIG, [1] * new)
    feeds = {k: np.repeat(v, batch, axis=0) for k, v in feeds.items()}
    feeds |= {k: np.repeat(v, batch, axis=0) for k, v in _past(past).items()}
    feeds["attention_mask"] = np.ones((batch, past + new), np.int64)
    total = batch * (past + new)
    _refused(
        served["client"],
        feeds,
        f"the cache would hold {total} positions",
        f"past this server's limit of {LIMIT}",
    )


def test_a_decode_step_within_the_limit_is_served(served):
    past = LIMIT - 1
    feeds = _feeds(1, **_past(past), attention_mask=np.ones((1, past + 1), np.int64))
    feeds["position_ids"] = np.asarray([[past]], np.int64)
    out, _ = served["client"].infer("p0", feeds, ["last_logits", "present.0.key"])
    assert out["last_logits"].shape == (1, CONFIG.vocab_size)
    assert out["present.0.key"].shape[2] == LIMIT


def test_unknown_output_refused(served):
    _refused(served["client"], _feeds(), "has no output nope", outputs=("nope",))


def test_limit_refused_from_the_header_before_the_body(served):
    """A declared cache past the limit is refused with the tensors' bytes never sent."""
    feeds = _feeds(4, **_past(LIMIT), attention_mask=np.ones((1, LIMIT + 4), np.int64))
    chunks, hlen = oip.encode_request(feeds, ["last_logits"])
    head = bytes(chunks[0])
    body_nbytes = sum(len(memoryview(c).cast("B")) for c in chunks[1:])
    req = urllib.request.Request(
        served["url"] + "/v2/models/p0/infer",
        data=head,  # the header only: the server must answer before waiting for the rest
        headers={oip.HEADER_LENGTH: str(hlen), "Content-Type": "application/octet-stream"},
        method="POST",
    )
    req.add_header("Content-Length", str(len(head) + body_nbytes))
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400
    assert "past this server's limit" in json.loads(e.value.read())["error"]


def test_serve_refuses_a_zero_limit(served):
    r = run_cli("serve", str(served["bundle"]), "--all-parts", "--max-cache-tokens", "0")
    assert r.returncode == 2 and "--max-cache-tokens" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow  # five runs of the real console script
def test_partition_generate_refuses_a_server_it_cannot_use_in_one_line(served, tmp_path):
    """`partition --generate --server-url`: a server that is not there, a model it does not serve,
    a prompt past its cache limit, and flags that do not go together: exit code 2, one line."""
    model = str(served["bundle"].parent / "decoder_tiny.onnx")
    base = ["partition", model, "-d", "host", "--generate", "-o", str(tmp_path / "p.json")]
    cases = [
        (["--server-url", "http://127.0.0.1:9"], ["could not prefill", "127.0.0.1:9"]),
        (["--server-url", served["url"], "--server-model", "nope"], ["no model 'nope'"]),
        (
            ["--server-url", served["url"], "--prompt-tokens", str(LIMIT + 1)],
            [f"past this server's limit of {LIMIT}"],
        ),
        (["--rtt-ms", "5"], ["need --server-url"]),
        (["--server-url", served["url"], "--server", "lab-server"], ["not --server"]),
    ]
    for extra, words in cases:
        r = run_cli(*base, *extra)
        err = r.stderr.strip()
        assert r.returncode == 2 and "\n" not in err and "Traceback" not in err, (extra, err)
        for w in words:
            assert w in err, (w, err)
    assert not (tmp_path / "p.json").exists()
    r = run_cli("partition", model, "-d", "host", "--server-url", served["url"])
    assert r.returncode == 2 and "--server-url is for --generate" in r.stderr
