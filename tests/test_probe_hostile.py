"""benchmarks/probe_hostile.py starts ``python -m serving`` with its stand-in model: a change to
the server's entry point (it once broke on a new ``_load`` parameter) must break here, not on
the next person who runs the probe. One request, not the probe's scenarios."""

import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import probe_hostile  # noqa: E402


def test_the_probe_server_starts_and_answers_with_its_stand_in_model():
    with probe_hostile.Server(cost=0.0) as server:
        response = httpx.post(
            server.url + probe_hostile.INFER, json=probe_hostile.body(["abc", "xy"]), timeout=30
        )
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    assert output["data"] == ["cba", "yx"]  # ReverseRuntime reverses its sources


def test_the_closing_scenarios_pieces_read_what_the_server_answers():
    with probe_hostile.Server(cost=0.0) as server:
        assert probe_hostile.post_big_body(server, 4 << 20) == "413"
        rate, cpu_ms = probe_hostile.closing_requests(server, 5)
        assert rate > 0 and cpu_ms >= 0  # (/proc counts CPU in 10 ms ticks: 5 cost less)
    flags = ("--max-connections", "1", "--health-connections", "0")
    with probe_hostile.Server(*flags, cost=0.0) as server:
        answers, sockets = probe_hostile.refused_over_capacity(server, 2)
    assert answers == "2 503" and sockets >= 2  # the held one, the lingering one


def test_the_malformed_scenario_reads_each_answer_in_order():
    with probe_hostile.Server(cost=0.0) as server:
        for request in probe_hostile.MALFORMED.values():
            assert probe_hostile.pipelined_with_malformed(server, request) == "200+200+400"
