"""The seams: a new transport is one file plus one registry line, and so is a new solver backend
(tests/toy_backend.py: a neighbour-swap search behind the same protocol as CBC and CP-SAT).

The toy transport (tests/toy_transport.py) sends tensors through the process group's key-value
store instead of torch.distributed's point-to-point operations; registered under a name, the
runtime trains with it exactly as with its own."""

from __future__ import annotations

import json

import torch
from click.testing import CliRunner

import schedc
from schedc.app.cli import main
from schedc.runtime import PipelineRuntime
from schedc.runtime.comm import TRANSPORTS
from schedc.runtime.gpt import gpt_blocks, lm_loss, stages, token_batches
from tests.ranks import run_local


def train(rank, world, path, transport):
    from tests.toy_transport import StoreTransport

    TRANSPORTS["store"] = StoreTransport  # the one registry line
    compiled = schedc.load(path)
    head = compiled.program.header
    torch.manual_seed(0)
    parts = stages(gpt_blocks(vocab=64, d_model=16, n_layers=2, n_heads=2, seq_len=16), head.n_stages)
    mine = {s: parts[s] for s in head.rank_stages[rank]}
    opt = torch.optim.SGD([p for m in mine.values() for p in m.parameters()], lr=0.1)
    rt = PipelineRuntime(compiled, mine, lm_loss, optimizer=opt, transport=transport)
    losses = [rt.step(x, y) for x, y in token_batches(3, 8, seed=1)]
    sends = getattr(rt.comm, "sends", None)
    return {"losses": [None if loss is None else float(loss) for loss in losses], "sends": sends,
            "transport": type(rt.comm).__name__}


def test_a_toy_transport_trains_exactly_as_the_torch_one(tmp_path):
    problem = schedc.Problem.parse({"ranks": 2, "microbatches": 4, "costs": {"F": 1, "B": 1, "W": 1}})
    schedc.compile(problem, "zb-h1").save(tmp_path / "s.json")
    torch_run = run_local(train, 2, str(tmp_path / "s.json"), "torch", timeout=300)
    toy_run = run_local(train, 2, str(tmp_path / "s.json"), "store", timeout=300)
    assert [r["transport"] for r in toy_run] == ["StoreTransport", "StoreTransport"]
    assert toy_run[0]["sends"] > 0 and toy_run[1]["sends"] > 0
    assert toy_run[1]["losses"] == torch_run[1]["losses"]  # the last stage's losses, bit for bit
    assert all(loss is not None for loss in toy_run[1]["losses"])


def test_a_toy_solver_backend_is_one_file_and_one_registry_line(tmp_path):
    from schedc.solvers.search.common import BACKENDS
    from schedc.solvers import solve
    from tests import toy_backend

    BACKENDS["toy"] = toy_backend.search  # the one registry line
    try:
        # A tight memory limit: the bound stays loose, so the local search cannot end the solve and
        # the backend is called.
        data = {"name": "toy", "ranks": 4, "microbatches": 8, "comm": 0.3,
                "costs": {"F": [1, 2, 1, 3], "B": [2, 1, 3, 2], "W": [1, 1, 2, 1]},
                "memory": {"F": 1, "B": -0.5, "limit": 3}}
        problem = schedc.Problem.parse(data)
        result = solve(problem, solver="toy", time_limit=20)
        # The CLI offers and accepts it too: its --solver choices are the registry's when read.
        path = tmp_path / "toy.json"
        path.write_text(json.dumps(data))
        run = CliRunner().invoke(main, ["solve", str(path), "-o", str(tmp_path / "solved.json"), "--solver", "toy",
                                        "--time-limit", "20", "-q", "--json"])
        assert run.exit_code == 0, run.output
        assert json.loads(run.stdout)["solver"] == "toy"
        assert "toy" in CliRunner().invoke(main, ["solve", "--help"]).output
    finally:
        del BACKENDS["toy"]
    assert toy_backend.CALLS == ["toy", "toy"]
    assert result.solver == "toy"
    assert result.objective <= result.warm_objective
    assert result.timeline.makespan == schedc.simulate(problem, result.schedule).makespan
