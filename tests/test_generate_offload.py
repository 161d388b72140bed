"""Prefill on a server, decode on the device: tokens over real sockets, and the planner's choice.

The server is ``edgesplit serve``'s application on a thread (real HTTP on 127.0.0.1), serving the
zoo decoder compiled by ``edgesplit compile`` as one part with dynamic lengths.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from decoder_bundles import decoder_bundle

from edgesplit.errors import RemoteError
from edgesplit.generate import Generator
from edgesplit.generate.offload import RemotePrefill, measure_server_prefill
from edgesplit.generate.phases import (
    PhaseProfile,
    ProcessorPhases,
    ServerPrefill,
    at_bandwidth,
    choose_per_band,
    price_offloaded,
)
from edgesplit.generate.reference import forward, greedy_plain, session
from edgesplit.runtime.client import OipClient
from edgesplit.serve.server import ServeOptions, ServerThread

pytestmark = pytest.mark.timeout(120)
LIMIT = 64


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("genoff")
    bundle = decoder_bundle(root, "decoder_tiny")
    model = onnx.load(root / "decoder_tiny.onnx")
    opts = ServeOptions(port=0, all_parts=True, max_cache_tokens=LIMIT)
    with ServerThread(bundle, opts) as server:
        client = OipClient(server.url, timeout_s=30)
        yield {"model": model, "client": client, "server": server, "bundle": bundle}
        client.close()


def _prompt(n: int, seed: int, vocab: int = 256) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, n)]


@pytest.mark.parametrize("n,seed", [(1, 0), (13, 1), (40, 2)])
def test_offloaded_prefill_gives_the_local_greedy_tokens(lab, n, seed):
    gen = Generator(lab["model"], chunk_tokens=16)
    prefill = RemotePrefill(lab["client"], "p0", gen.config)
    prompt = _prompt(n, seed)
    offloaded = list(gen.generate(prompt, 12, prefill=prefill))
    stats = gen.last_stats
    plain = greedy_plain(session(lab["model"]), gen.config, prompt, 12)
    assert offloaded == list(gen.generate(prompt, 12)) == list(plain)
    assert (stats.prefill_chunks, stats.chunk_tokens, stats.cache_copies) == (1, 0, 0)
    assert prefill.last_exchange.received_nbytes < stats.cache_nbytes  # the logits of one row


def test_last_logits_are_the_forward_pass_last_row(lab):
    gen = Generator(lab["model"])
    prompt = _prompt(20, 5)
    cache, logits = RemotePrefill(lab["client"], "p0", gen.config)(prompt)
    full = forward(session(lab["model"]), gen.config, np.asarray([prompt]))
    np.testing.assert_allclose(logits, full[0, -1], rtol=1e-4, atol=1e-4)
    assert cache.slots == 20


def test_server_figures(lab):
    gen = Generator(lab["model"])
    figs = measure_server_prefill(RemotePrefill(lab["client"], "p0", gen.config), _prompt(32, 0))
    per_token = 2 * gen.config.layers * gen.config.kv_heads * gen.config.head_dim * 4
    assert figs.cache_nbytes == 32 * per_token
    assert 0 < figs.compute_ms <= figs.server_ms
    assert figs.download_fixed_nbytes >= gen.config.vocab_size * 4  # the last row of logits
    assert figs.upload_nbytes >= 3 * 32 * 8  # ids, mask and positions


def test_a_prompt_past_the_servers_limit_is_refused_in_one_line(lab):
    gen = Generator(lab["model"])
    with pytest.raises(RemoteError) as e:
        RemotePrefill(lab["client"], "p0", gen.config)(_prompt(LIMIT + 1, 0))
    msg = str(e.value)
    assert "HTTP 400" in msg and "\n" not in msg
    assert f"the cache would hold {LIMIT + 1} positions" in msg
    assert f"past this server's limit of {LIMIT}" in msg
    assert lab["client"].live()  # and it keeps serving


# ---- pricing with given figures

LOCAL = ProcessorPhases("cpu", 2.0, {32: 400.0, 64: 750.0}, ((128, 10.0), (256, 12.0)))
PER_TOKEN = 24_576  # decoder_100m's cache per position (12 layers, 4 KV heads of 64, fp32)


def offload_profile() -> PhaseProfile:
    srv = ServerPrefill("edge", 60.0, 3_000, 130_000, 10.0, 10.0, 10.0, 1.0, 0.5)
    return PhaseProfile("toy", "dev", 128, 16, PER_TOKEN, 5.0, (LOCAL,), srv)


def test_offloaded_price_formula():
    c = price_offloaded(at_bandwidth(offload_profile(), 50.0), "cpu")
    up_ms = 3_000 * 8 / 50e3
    down_ms = (130_000 + 128 * PER_TOKEN) * 8 / 50e3
    assert c.offloaded and c.chunk_tokens == 0 and c.switch_ms == 0
    assert c.transfer_ms == pytest.approx(10.0 + up_ms + down_ms)
    assert c.ttft_ms == pytest.approx(60.0 + c.transfer_ms)
    assert c.decode_ms == pytest.approx(sum(10.0 + 2.0 * i / 128 for i in range(15)))
    assert c.energy_mj == pytest.approx(up_ms * 1.0 + down_ms * 0.5 + c.decode_ms * 2.0)
    assert c.switch_nbytes == 128 * PER_TOKEN


def test_planner_offloads_at_high_bandwidth_and_not_at_low():
    low, mid, high = choose_per_band(offload_profile(), [5.0, 50.0, 200.0])
    # 3.1 MB of cache: 5.2 s at 5 Mbit/s, 0.13 s at 200; the local prefill takes 1.5 s
    assert not low.chosen.offloaded
    assert low.chosen.label == "cpu (chunk 64)"
    assert high.chosen.offloaded and mid.chosen.offloaded
    assert high.chosen.label == "prefill on server edge -> decode cpu"
    for plan in (low, mid, high):  # the choice is the least total of all candidates
        assert plan.chosen.total_ms == min(c.total_ms for c in plan.candidates)
        assert {c.offloaded for c in plan.candidates} == {True, False}
    assert high.to_json()["profile"]["server"]["down_mbps"] == 200.0


def test_partition_generate_prices_a_running_servers_prefill(lab, tmp_path):
    """`partition --generate --server-url`: the server's prefill is measured from here (its own
    time, the request's and the answer's bytes) and priced on the link given; the plan then holds
    prefill on the server as a candidate, its time to first token the server's time plus the
    link's."""
    from click.testing import CliRunner

    from edgesplit.cli.main import cli

    model = tmp_path / "decoder_tiny.onnx"
    onnx.save(lab["model"], model)
    out = tmp_path / "phases.json"
    args = ["partition", str(model), "--device", "host", "--generate", "--prompt-tokens", "24"]
    args += ["--new-tokens", "4", "--server-url", lab["server"].url, "--bandwidth-mbps", "40"]
    args += ["--rtt-ms", "3", "-o", str(out)]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    srv = data["profile"]["server"]
    assert srv["server"] == "server" and srv["prefill_ms"] > 0
    assert (srv["up_mbps"], srv["down_mbps"], srv["rtt_ms"]) == (40.0, 40.0, 3.0)
    assert srv["tx_power_w"] > 0 and srv["rx_power_w"] > 0  # the radio's, from the wifi preset
    assert srv["upload_nbytes"] >= 3 * 24 * 8  # ids, mask and positions
    offloaded = [c for c in data["candidates"] if c["offloaded"]]
    assert [c["prefill_processor"] for c in offloaded] == ["server"]
    cache = 24 * data["profile"]["cache_nbytes_per_token"]
    wire_nbytes = srv["upload_nbytes"] + srv["download_fixed_nbytes"] + cache
    transfer_ms = 3.0 + wire_nbytes * 8 / 40e3
    assert offloaded[0]["switch_nbytes"] == cache
    assert offloaded[0]["transfer_ms"] == pytest.approx(transfer_ms, abs=1e-3)
    assert offloaded[0]["ttft_ms"] == pytest.approx(srv["prefill_ms"] + transfer_ms, abs=1e-3)
    assert "prefill on server" in r.output or "server" in r.output


def test_a_bundle_generates_after_a_servers_prefill(lab):
    """`Session.generate(prefill=RemotePrefill)` and `run --generate --server URL`: the same
    bundle's decoder prefills on the server, the tokens equal the local prefill's, and `run` says
    where the prompt went."""
    from conftest import run_cli

    from edgesplit.runtime.session import load

    prompt = _prompt(21, 4)
    with load(lab["bundle"]) as sess:
        local = list(sess.generate(prompt, 8))
        gen = sess.generator()
        remote = RemotePrefill(lab["client"], "p0", gen.config)
        offloaded = list(sess.generate(prompt, 8, prefill=remote))
        st = sess.last_generate_stats
    assert offloaded == local
    assert (st.prefill_chunks, st.chunk_tokens, st.cache_copies) == (1, 0, 0)
    ids = ",".join(map(str, prompt))
    url = lab["server"].url
    r = run_cli("run", str(lab["bundle"]), "--generate", "--prompt-ids", ids, "--new-tokens", "8",
                "--server", url)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert f"prefill: on the server {url}" in r.stdout
    assert r.stdout.split("tokens: ")[-1].split() == [str(t) for t in local]
    bad = run_cli("run", str(lab["bundle"]), "--generate", "--prompt-tokens", str(LIMIT + 1),
                  "--new-tokens", "2", "--server", url)  # fmt: skip
    err = bad.stderr.strip()
    assert bad.returncode == 2 and "\n" not in err and "could not prefill" in err, err
    assert f"past this server's limit of {LIMIT}" in err
