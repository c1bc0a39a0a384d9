"""The profiler: per-stage times and memory on CPU, and the Problem it makes."""

import math

import pytest

from schedc.kinds import Kind
from schedc.runtime.gpt import gpt_blocks, lm_loss, stages, token_batches
from tests.ranks import run_local
from schedc.runtime.profile import MiB, StageProfile, make_problem, measure_comm, profile_stages
from schedc.runtime.wgrad import SplitLinear


@pytest.fixture(scope="module")
def profiled():
    parts = stages(gpt_blocks(d_model=32, n_layers=2, seq_len=16), 4)
    (x, y), = token_batches(1, 8, seq_len=16)
    lines = []
    prof = profile_stages(parts, x, y, lm_loss, microbatches=2, warmup=1, repeats=3, progress=lines.append)
    return parts, prof, lines


def test_times_memory_and_sizes(profiled):
    parts, prof, lines = profiled
    lines = [line for line in lines if not line.startswith("timings noisy")]  # a busy machine's re-measuring
    assert len(lines) == 5 and lines[0].startswith("stage 0: F ") and lines[4].startswith("host<->device copy: ")
    assert all(t > 0 for t in prof.F + prof.B + prof.W)
    assert all(0 <= k <= a and a > 0 for a, k in zip(prof.activation, prof.kept_for_w))
    assert prof.kept_for_w[0] == 0 and all(k > 0 for k in prof.kept_for_w[1:])  # stage 0: an Embedding, no Linear
    for s, part in enumerate(parts):
        n = sum(p.numel() for p in part.parameters())
        assert prof.static[s] == pytest.approx(n * 4 * (2 + 2.0) / MiB)
    # stages 0-2 send a (microbatch 4, seq 16, d_model 32) float32 activation; the last nothing
    assert prof.sends == [4 * 16 * 32 * 4 / MiB] * 3 + [0.0]
    assert prof.microbatch_size == 4
    # working memory: what an op needs while it runs (a backward's temporaries and its output
    # gradient), never negative; the backwards make some
    assert len(prof.working) == 4 and all(w >= 0 for w in prof.working) and max(prof.working) > 0
    # the user's modules are left as they were
    assert not any(isinstance(m, SplitLinear) for part in parts for m in part.modules())


def test_make_problem_places_stages_and_sums_static_memory(profiled):
    _, prof, _ = profiled
    prob = make_problem(prof, ranks=2, microbatches=8, chunks=2, placement="v", comm=0.1, memory_limit=1e3)
    assert prob.cost["F"] == tuple(prof.F) and prob.comm == 0.1
    assert prob.static_memory[0] == pytest.approx(prof.static[0] + prof.static[3])
    assert prob.mem["F"] == pytest.approx(tuple(prof.activation))
    assert [f + b + w for f, b, w in zip(*prob.mem_deltas)] == pytest.approx([0.0] * 4)
    # each stage's working memory plus the largest tensor it receives (all four stages send one size)
    boundary = prof.sends[0]
    assert prob.stage_working == pytest.approx(tuple(w + boundary for w in prof.working))
    assert prob.working_memory[0] == pytest.approx(max(prof.working[0], prof.working[3]) + boundary)
    assert min(prob.stage_working) >= 0
    with pytest.raises(ValueError, match="the profile has 4 stages but ranks x chunks is 3 x 1"):
        make_problem(prof, ranks=3, microbatches=4)
    assert isinstance(StageProfile(**prof.to_dict()), StageProfile)
    older = {k: v for k, v in prof.to_dict().items() if k != "working"}  # a profile without it
    assert make_problem(StageProfile(**older), ranks=4, microbatches=4).memory.working is None


def _comm(rank, world):
    return measure_comm(0.25, repeats=5)


def test_measure_comm_between_two_ranks():
    times = run_local(_comm, 2, timeout=120)
    assert all(math.isfinite(t) and t > 0 for t in times)


# ---- recompute and offload (issue 25) ----


@pytest.fixture(scope="module")
def profiled_dropout():
    parts = stages(gpt_blocks(d_model=32, n_layers=2, seq_len=32, dropout=0.1), 2)
    (x, y), = token_batches(1, 8, seq_len=32)
    return parts, profile_stages(parts, x, y, lm_loss, microbatches=2, warmup=1, repeats=3)


def test_recompute_selective_and_copy_are_measured(profiled_dropout):
    parts, prof = profiled_dropout
    assert all(t > 0 for t in prof.recompute + prof.selective + prof.offload) and prof.copy_bandwidth > 0
    # a recomputed microbatch keeps its input: stage 1's is stage 0's output; stage 0's is the
    # caller's token batch (not activation memory)
    assert prof.keep == [0.0, prof.sends[0]]
    # a selective forward drops the attention core (each stage holds a Block): it keeps less,
    # and more than a full recompute keeps
    assert all(k < s < a for k, s, a in zip(prof.keep, prof.selective_keep, prof.activation))
    # the copy time is the activation over the measured bandwidth
    assert prof.offload == pytest.approx([a / prof.copy_bandwidth for a in prof.activation])
    # the user's modules are left as they were (the profiler switches classes on its copies only)
    assert not any(type(m).__name__.startswith("Selective") for part in parts for m in part.modules())


def test_make_problem_writes_the_recompute_and_offload_sections(profiled_dropout):
    _, prof = profiled_dropout
    plain = make_problem(prof, ranks=2, microbatches=4)
    assert plain.recompute is None and plain.offload is None
    prob = make_problem(prof, ranks=2, microbatches=4, policies=True)
    assert prob.cost["R"] == pytest.approx(tuple(prof.recompute))
    assert prob.cost["S"] == pytest.approx(tuple(prof.selective))
    assert prob.cost["O"] == prob.cost["L"] == pytest.approx(tuple(prof.offload))
    assert prob.delta(Kind.F, 1, Kind.R) == pytest.approx(prof.keep[1])
    assert prob.delta(Kind.F, 0, Kind.S) == pytest.approx(prof.selective_keep[0])
    # a stage that marks no part to drop (stage 0 here: the embedding alone) has no selective
    # recompute to offer: the problem gets none
    alone = stages(gpt_blocks(d_model=32, n_layers=2, seq_len=32, dropout=0.1), 4)
    (x, y), = token_batches(1, 4, seq_len=32)
    four = profile_stages(alone, x, y, lm_loss, warmup=0, repeats=1)
    assert four.selective[0] == 0 and four.selective_keep[0] == pytest.approx(four.activation[0])
    prob = make_problem(four, ranks=4, microbatches=4, policies=True)
    assert prob.recompute is not None and prob.recompute.selective is None and prob.offload is not None
    older = {k: v for k, v in prof.to_dict().items() if k not in ("recompute", "keep", "selective", "selective_keep",
                                                                   "offload", "copy_bandwidth")}
    assert make_problem(StageProfile(**older), ranks=2, microbatches=4, policies=True).recompute is None


def test_schedc_profile_writes_the_sections_with_policies(tmp_path):
    from pathlib import Path

    import yaml
    from click.testing import CliRunner

    from schedc.app.cli import main

    example = Path(__file__).parent.parent / "examples" / "train_gpt.py"
    out = tmp_path / "gpt.yaml"
    result = CliRunner().invoke(main, ["profile", f"{example}:gpt", "-p", "2", "-m", "2", "--partition", "uniform",
                                       "--comm", "0.1", "--repeats", "1", "--policies", "--data-parallel", "4",
                                       "--replicas", "2", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "copy bandwidth" in result.output and "CPU: a memcpy" in result.output
    assert "gradient all-reduce over 4 replicas, ms per stage: " in result.output
    data = yaml.safe_load(out.read_text())
    assert data["data_parallel"]["degree"] == 4 and len(data["data_parallel"]["reduce"]) == 2
    assert min(data["data_parallel"]["reduce"]) > 0
    # two directions: the copies' sums, an all-reduce over two ranks (4 replicas move 1.5 x as much)
    assert "two directions: the sum of a stage's copies, ms per stage: " in result.output
    assert data["replicas"]["count"] == 2
    assert data["replicas"]["sync"] == pytest.approx([x / 1.5 for x in data["data_parallel"]["reduce"]])
    # stage 0 is the embedding and blocks, stage 1 blocks and the head: both mark attention cores
    assert set(data["recompute"]) == {"time", "keep", "selective"} and len(data["offload"]["time"]) == 2
    assert data["recompute"]["keep"][0] == 0 and data["recompute"]["keep"][1] > 0


# ---- data parallelism (issue 26) ----


def test_gradient_sizes_and_reduce_estimates(profiled):
    from schedc.runtime.profile import reduce_times

    parts, prof, _ = profiled
    for s, part in enumerate(parts):
        assert prof.grads[s] == pytest.approx(sum(p.numel() for p in part.parameters()) * 4 / MiB)
    # a ring all-reduce moves 2 (d - 1) / d of the buffer: twice the 2-rank time per MiB at d -> inf
    assert reduce_times([1.0, 2.0], 2, 4.0, 8.0) == [2.0, 4.0]
    assert reduce_times([1.0], 4, 4.0, 8.0) == [2.0 * 1.5]
    assert reduce_times([1.0, 2.0], 1, 4.0, 8.0) == [0.0, 0.0]
    prob = make_problem(prof, ranks=4, microbatches=4, data_parallel={"degree": 4, "reduce": reduce_times(prof.grads, 4, 1, 1)})
    assert prob.data_parallel.degree == 4 and prob.cost["AR"] == pytest.approx([g * 1.5 for g in prof.grads])


def test_the_weights_are_written_and_2bw_counts_a_second_copy(profiled):
    import schedc.solvers as solvers
    from schedc.simulate import simulate

    parts, prof, _ = profiled
    prob = make_problem(prof, ranks=4, microbatches=4)
    weights = [sum(p.numel() * p.element_size() for p in part.parameters() if p.requires_grad) / MiB for part in parts]
    assert prob.stage_weights == pytest.approx(weights)
    one, two = (simulate(prob, solvers.build(name, prob)) for name in ("1f1b", "2bw"))
    assert [b - a for a, b in zip(one.peak_memory, two.peak_memory)] == pytest.approx(weights)


def _all_reduce(rank, world):
    from schedc.runtime.profile import measure_all_reduce

    return measure_all_reduce(0.25, repeats=3)


def test_measure_all_reduce_between_two_ranks():
    assert all(math.isfinite(t) and t > 0 for t in run_local(_all_reduce, 2, timeout=120))


def test_make_problem_with_two_directions_counts_both_copies(profiled):
    """``replicas``: the profiled stages are each pipeline's; a rank holds a stage of each direction
    (stage r and p - 1 - r on the bidirectional placement), so its static memory is both copies',
    and the copies' sums (RS) are the section's."""
    from schedc.runtime.profile import reduce_times

    _, prof, _ = profiled
    sync = reduce_times(prof.grads, 2, 1.0, 2.0)
    prob = make_problem(prof, ranks=4, microbatches=4, replicas={"count": 2, "sync": sync}, stage_blocks=[1, 1, 1, 1])
    assert prob.pipelines == 2 and prob.pipeline_stages == 4
    assert prob.static_memory[0] == pytest.approx(prof.static[0] + prof.static[3])
    assert prob.cost["RS"][:4] == pytest.approx([2 * g for g in prof.grads])
    assert prob.cost["F"] == pytest.approx(tuple(prof.F) * 2)


def test_tied_weights_are_found_and_their_sum_estimated():
    """A tied GPT (the head's weight is the embedding's Parameter): the first and last stage share
    it, whatever the cut; the profiler writes the tied section with the sum's estimate, an
    all-reduce of the embedding over two ranks; an untied model has none."""
    from schedc.runtime.gpt import gpt_blocks, stages
    from schedc.runtime.profile import ModelSpec, profile_model, tied_groups

    blocks = gpt_blocks(d_model=16, n_layers=2, seq_len=8, tied=True)
    embedding = blocks[0].tok.weight
    for n in (2, 3):
        (group, mib), = tied_groups(stages(blocks, n))
        assert group == [0, n - 1] and mib == pytest.approx(embedding.numel() * 4 / MiB)
    assert tied_groups(stages(gpt_blocks(d_model=16, n_layers=2, seq_len=8), 3)) == []
    (x, y), = token_batches(1, 4, seq_len=8)
    prob, _ = profile_model(ModelSpec(blocks, (x, y), lm_loss), ranks=2, microbatches=2, partition="uniform",
                            comm=0.1, repeats=1, warmup=1)
    assert prob.tied.groups == [[0, 1]] and prob.cost["TS"][0] == prob.cost["TS"][1] > 0
