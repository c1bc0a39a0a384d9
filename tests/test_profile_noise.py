"""A profiler that knows when it is wrong (issue 38): the spread of each stage's repeats, stages of
the same blocks compared, re-measuring, the one-line warning, ``--strict``, and torch profiler's
chatter kept out of ``schedc profile``'s output. Timings are injected (a scripted
``_StageRunner.sample``), never read from the machine's clock or load."""

import inspect
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from schedc.app.cli import main
from schedc.runtime import noise
from schedc.runtime import profile as profile_mod
from schedc.runtime.memory import native_chatter_hidden
from schedc.runtime.profile import block_keys, profile_stages

ROOT = Path(__file__).parent.parent


# ---- a model unlike the example GPT: convolutions, batch-norm buffers ----


def conv_block(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4 * 6 * 6, 3)

    def forward(self, x):
        return self.fc(x.flatten(1))


def conv_stages(first: int = 3, second: int = 2) -> list[nn.Module]:
    """[first conv blocks], [second conv blocks], [the head]: the first two comparable."""
    blocks = iter(itertools.count())
    return [nn.Sequential(*(conv_block(next(blocks)) for _ in range(first))),
            nn.Sequential(*(conv_block(next(blocks)) for _ in range(second))),
            nn.Sequential(Head())]


def batch():
    torch.manual_seed(0)
    return torch.randn(4, 4, 6, 6), torch.randn(4, 3)


class Script:
    """A scripted ``_StageRunner.sample``: the profiler's rounds call stages 0..n-1 in turn, so call
    k is stage k mod n's; ``times(stage, call)`` gives (F, B, W, BW) in ms."""

    def __init__(self, n, times):
        self.n, self.times, self.calls = n, times, []

    def __call__(self, runner):
        k = len(self.calls)
        self.calls.append(k % self.n)
        return self.times(k % self.n, k)


def scripted(monkeypatch, n, times) -> Script:
    script = Script(n, times)
    monkeypatch.setattr(profile_mod._StageRunner, "sample", lambda runner: script(runner))
    return script


def quiet(per_stage):
    return lambda s, k: tuple(per_stage[s] * f for f in (1.0, 2.0, 1.0, 2.5))


def noisy_on(stage, per_stage, attempts_noisy=10 ** 9, rounds=10):
    """Stage ``stage`` takes 3 times its time in the even rounds (an interquartile range of 200 %)
    in the first ``attempts_noisy`` measurements of ``rounds`` rounds each, quiet after."""

    def times(s, k):
        base = quiet(per_stage)(s, k)
        attempt = k // (rounds * len(per_stage))
        if s == stage and attempt < attempts_noisy and (k // len(per_stage)) % 2 == 0:
            return tuple(3 * t for t in base)
        return base

    return times


# ---- measure(): interleaved rounds, re-measuring, the quietest kept ----


def test_rounds_interleave_the_stages():
    calls = []
    noise.measure(lambda s: calls.append(s) or {"F": 1.0, "B": 1.0, "W": 1.0}, 3, warmup=2, repeats=4)
    assert calls == [0, 1, 2] * 6  # round by round, not stage 0's whole series first


def test_quiet_samples_measured_once_without_warning():
    calls = []
    got = noise.measure(lambda s: calls.append(s) or {"F": 1.0 + s, "B": 2.0, "W": 0.5}, 2, warmup=1, repeats=7)
    assert got.ok and got.warning() == "" and got.measurements == 1 and len(calls) == 2 * 8
    assert got.median["F"] == [1.0, 2.0] and got.spread["F"] == [0.0, 0.0]


def test_noise_that_passes_is_measured_again_and_not_reported():
    per = [1.0, 1.0]
    times = noisy_on(1, per, attempts_noisy=1, rounds=8)
    calls = []

    def sample(s):
        calls.append(s)
        return dict(zip("FBW", times(s, len(calls) - 1)))

    lines = []
    got = noise.measure(sample, 2, warmup=1, repeats=7, progress=lines.append)
    assert got.ok and got.measurements == 2 and len(calls) == 2 * 2 * 8
    assert lines == [lines[0]] and "measuring again (2 of 3)" in lines[0] and "stage 1 spread F" in lines[0]


def test_lasting_noise_is_measured_at_most_remeasure_more_times_then_warned():
    per = [1.0, 1.0, 1.0]
    times = noisy_on(2, per, rounds=8)
    calls = []

    def sample(s):
        calls.append(s)
        return dict(zip("FBW", times(s, len(calls) - 1)))

    got = noise.measure(sample, 3, warmup=1, repeats=7)
    assert got.measurements == 1 + noise.REMEASURE and len(calls) == 3 * 8 * (1 + noise.REMEASURE)
    assert got.stages == [2] and not got.ok
    warning = got.warning()
    assert warning.startswith("timings noisy after 3 measurements: stage 2 spread F ") and "stage 0" not in warning
    assert "\n" not in warning
    assert got.spread["F"][2] > noise.SPREAD_LIMIT and got.spread["F"][0] == 0.0


def test_the_quietest_measurement_is_kept():
    spreads = iter([[1.0, 5.0] * 4, [1.0, 1.5] * 4, [1.0, 9.0] * 4])  # per measurement, stage 0's F

    def sampler():
        current = []
        calls = itertools.count()

        def sample(s):
            k = next(calls)
            if k % 16 == 0:
                current[:] = next(spreads)
            return {"F": current[(k % 16) // 2] if s == 0 else 1.0, "B": 1.0, "W": 1.0}

        return sample

    got = noise.measure(sampler(), 2, warmup=0, repeats=8)
    assert got.measurements == 3 and got.median["F"][0] == pytest.approx(1.25)  # the second, 1.0 / 1.5 alternating


def test_a_busy_machine_spreading_every_stage_is_said_in_one_phrase():
    samples = [{"F": [1.0, 3.0, 1.0, 3.0, 1.0 + s], "B": [1.0] * 5, "W": [1.0] * 5} for s in range(6)]
    got = noise.assess(samples)
    assert got.stages == [0, 1, 2, 3, 4, 5]
    assert got.summary() == "stages 0, 1, 2, 3, 4, 5 spread up to 200% (stage 0 F)"
    few = noise.assess(samples[:2])
    assert few.summary() == "stage 0 spread F 200%; stage 1 spread F 100%"  # [1, 1, 2, 3, 3]: 2 / 2


def test_tiny_ops_and_smoke_runs_are_not_judged():
    # a 10 us op spreading by 100 % is the timer's, not the machine's
    tiny = noise.assess([{"F": [0.01, 0.02, 0.01, 0.02, 0.01], "B": [1.0] * 5, "W": [1.0] * 5}])
    assert tiny.ok and tiny.spread["F"][0] > noise.SPREAD_LIMIT
    smoke = noise.assess([{"F": [1.0, 9.0], "B": [1.0, 1.0], "W": [1.0, 1.0]}])  # fewer than MIN_REPEATS
    assert smoke.ok


# ---- stages of the same blocks compared ----


def samples_of(times, repeats=3):
    return [{k: [t] * repeats for k, t in zip("FBW", stage)} for stage in times]


def test_issue_example_three_blocks_at_148_next_to_two_at_48_is_named():
    blk, emb, head = ("Block", ((4, 4),)), ("Embedding", ((9, 4),)), ("Head", ((4, 9),))
    blocks = [[emb, blk], [blk, blk, blk], [blk, blk], [blk, head]]
    got = noise.assess(samples_of([(20, 40, 20), (148, 300, 150), (48, 100, 50), (40, 80, 40)]), blocks)
    assert [(g, k) for g, k, _ in got.disagreeing] == [((1, 2), "F"), ((1, 2), "B"), ((1, 2), "W")]
    assert got.disagreeing[0][2] == pytest.approx((148 / 3) / (48 / 2))
    assert got.disagreement["F"][0] == 0.0 and got.disagreement["F"][3] == 0.0  # not comparable / the loss's
    assert "stages 1, 2 (same blocks) differ per block by F 2.06x" in got.warning()
    fine = noise.assess(samples_of([(20, 40, 20), (148, 300, 150), (100, 200, 100), (40, 80, 40)]), blocks)
    assert fine.ok and fine.disagreement["F"][1] == pytest.approx((148 / 3) / ((148 / 3 + 50) / 2) - 1)


def test_block_keys_tell_shapes_apart():
    a, b = conv_block(0), nn.Sequential(nn.Conv2d(4, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
    conv = ("Sequential", ((4, 4, 3, 3), (4,), (4,), (4,)))  # class and parameter shapes, not values
    assert block_keys(nn.Sequential(a, conv_block(1))) == [conv, conv]
    assert block_keys(nn.Sequential(a, b)) == [conv, ("Sequential", ((8, 4, 3, 3), (8,), (8,), (8,)))]
    assert [key[0] for key in block_keys(a)] == ["Conv2d", "BatchNorm2d", "ReLU"]  # a Sequential: its children
    assert block_keys(Head()) == [("Head", ((3, 144), (3,)))]  # any other module: itself


@settings(max_examples=60, deadline=None)
@given(per_block=st.floats(0.2, 100), counts=st.lists(st.integers(1, 6), min_size=2, max_size=6),
       jitter=st.lists(st.floats(0.97, 1.03), min_size=6, max_size=6),
       slowed=st.integers(0, 5), factor=st.floats(1.5, 4))
def test_proportional_stages_agree_and_a_slowed_one_is_named(per_block, counts, jitter, slowed, factor):
    blocks = [[("Block", ())] * c for c in counts] + [[("Head", ())]]
    times = [(per_block * c * j,) * 3 for c, j in zip(counts, jitter)] + [(1.0, 1.0, 1.0)]
    agree = noise.assess(samples_of(times), blocks)
    assert not agree.disagreeing
    slowed %= len(counts)
    times[slowed] = tuple(t * factor for t in times[slowed])
    if per_block * (factor * 0.97 - 1.03) < noise.FLOOR_MS:
        return  # under the timer's floor
    got = noise.assess(samples_of(times), blocks)
    assert got.disagreeing and all(slowed in group for group, _, _ in got.disagreeing)


# ---- profile_stages on a real model, the times scripted ----


def test_profile_stages_reports_spread_remeasures_and_names_the_noisy_stage(monkeypatch):
    x, y = batch()
    script = scripted(monkeypatch, 3, noisy_on(1, [3.0, 2.0, 0.5], rounds=6))
    lines = []
    prof = profile_stages(conv_stages(), x, y, nn.functional.mse_loss, warmup=1, repeats=5, progress=lines.append)
    assert len(script.calls) == 3 * 6 * 3 and script.calls[:6] == [0, 1, 2, 0, 1, 2]
    assert prof.measurements == 3 and prof.spread["F"][1] > noise.SPREAD_LIMIT and prof.spread["F"][0] == 0.0
    assert prof.warning.startswith("timings noisy after 3 measurements: stage 1 spread F ")
    assert "stage 0" not in prof.warning and "stage 2" not in prof.warning
    assert sum(line.startswith("timings noisy") for line in lines) == 2
    assert prof.F == [3.0, 2.0, 0.5] and prof.B == [6.0, 4.0, 1.0]  # medians of the kept (first) measurement
    assert set(prof.spread) == {"F", "B", "W", "BW"} and len(prof.disagreement["F"]) == 3


def test_profile_stages_names_stages_of_equal_blocks_that_disagree(monkeypatch):
    x, y = batch()
    scripted(monkeypatch, 3, quiet([3.0, 2.0 * 2.4, 0.5]))  # 1 ms per block, then 2.4
    prof = profile_stages(conv_stages(3, 2), x, y, nn.functional.mse_loss, warmup=1, repeats=3)
    assert prof.measurements == 3 and "stages 0, 1 (same blocks) differ per block by F 2.40x" in prof.warning
    assert prof.disagreement["F"][0] == pytest.approx(1 / 1.7 - 1)
    scripted(monkeypatch, 3, quiet([3.0, 2.0, 0.5]))
    agreed = profile_stages(conv_stages(3, 2), x, y, nn.functional.mse_loss, warmup=1, repeats=3)
    assert agreed.warning == "" and agreed.measurements == 1 and agreed.disagreement["F"][:2] == [0.0, 0.0]


# ---- the CLI: the warning, --strict, --json, the problem file ----

# The same conv-net as a model file of its own (the CLI imports it): the definitions above, written out.
MODEL = "\n\n".join([
    "import torch\nfrom torch import nn\nfrom schedc.runtime.profile import ModelSpec",
    inspect.getsource(conv_block), inspect.getsource(Head),
    """def spec():
    torch.manual_seed(0)
    blocks = [conv_block(i) for i in range(3)] + [Head()]
    return ModelSpec(blocks=blocks, batch=(torch.randn(4, 4, 6, 6), torch.randn(4, 3)),
                     loss_fn=nn.functional.mse_loss, optimizer_state=1.0)
""",
])


@pytest.fixture()
def model_file(tmp_path):
    path = tmp_path / "convnet.py"
    path.write_text(MODEL)
    return path


def profile_cli(model_file, out, *extra):
    return CliRunner().invoke(main, ["profile", f"{model_file}:spec", "-p", "2", "-m", "2", "--partition",
                                     "uniform", "--comm", "0.1", "--repeats", "5", "-o", str(out), *extra])


def test_cli_warns_in_one_line_naming_the_stage(monkeypatch, model_file, tmp_path):
    scripted(monkeypatch, 2, noisy_on(0, [2.0, 1.5], rounds=7))
    out = tmp_path / "p.yaml"
    result = profile_cli(model_file, out)
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "stage 0 spread F" in warnings[0] and "stage 1" not in warnings[0]
    assert "is the machine busy? profile again when it is quiet" in warnings[0]
    header = [line for line in out.read_text().splitlines() if line.startswith("#")]
    assert any(line.startswith("# spread of the repeats, (p75 - p25) / median, per stage: F ") for line in header)
    assert any(line.startswith("# warning: timings noisy after 3 measurements: stage 0") for line in header)


def test_cli_strict_fails_in_one_line_and_writes_nothing(monkeypatch, model_file, tmp_path):
    scripted(monkeypatch, 2, noisy_on(1, [2.0, 1.5], rounds=7))
    out = tmp_path / "p.yaml"
    result = profile_cli(model_file, out, "--strict")
    assert result.exit_code == 2
    error = result.output.strip().splitlines()[-1]
    assert error.startswith("error: --strict: timings noisy after 3 measurements: stage 1 spread F "), error
    assert "nothing written" in error and not out.exists()


def test_cli_quiet_no_warning_and_spread_in_json(monkeypatch, model_file, tmp_path):
    scripted(monkeypatch, 2, quiet([2.0, 1.5]))
    out = tmp_path / "p.yaml"
    result = profile_cli(model_file, out, "--strict", "--json")
    assert result.exit_code == 0, result.output
    assert not any(line.startswith("warning:") for line in result.output.splitlines())
    data = json.loads(result.output[result.output.index("{"):])
    assert data["profile"]["spread"]["F"] == [0.0, 0.0] and data["profile"]["measurements"] == 1
    assert data["profile"]["warning"] == ""


# ---- torch profiler's chatter ----


def test_native_chatter_hidden_drops_only_the_profiler_lines(capfd):
    with native_chatter_hidden():
        os.write(2, b"USDT:2026-11-28 06:00:31 12420:12420 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"a real error from C++\n")
        print("schedc's own line", file=sys.stderr)
        os.write(2, b"USDT:2026-11-28 06:00:31 12420:12420 SyncActivityProfilerHandler.cpp:59] profiler_stop\n")
    err = capfd.readouterr().err
    assert "USDT" not in err and "profiler_st" not in err
    assert "a real error from C++" in err and "schedc's own line" in err


def test_schedc_profile_prints_no_torch_profiler_chatter(model_file, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "schedc.app.cli", "profile", f"{model_file}:spec", "-p", "2", "-m",
                           "2", "--comm", "0.1", "--repeats", "3", "-o", str(tmp_path / "p.yaml")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "profiling 4 blocks one by one" in proc.stderr and "wrote" in proc.stdout  # schedc's own lines
    assert "USDT" not in proc.stderr + proc.stdout and "profiler_start" not in proc.stderr + proc.stdout


def test_ablate_says_a_noisy_profile_and_goes_on(monkeypatch):
    from types import SimpleNamespace

    from schedc.app.ablate import _Profiler

    made = object()
    monkeypatch.setattr(profile_mod, "load_model_spec", lambda ref: ref)
    monkeypatch.setattr(profile_mod, "profile_model", lambda spec, **kw: (made, SimpleNamespace(
        warning="timings noisy after 3 measurements: stage 1 spread F 34%")))
    lines = []
    entry = SimpleNamespace(profile="model.py:spec", label="gpt")
    assert _Profiler(lines.append)(entry, {"ranks": 2, "microbatches": 8}) is made
    assert lines[-1].startswith("warning: gpt: timings noisy after 3 measurements: stage 1 spread F 34% (limits:")
