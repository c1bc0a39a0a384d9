#!/usr/bin/env bash
# The checks that need a GPU. CI has none, so the CUDA cases of the test suite skip there; run this
# by hand on a machine with one (and schedc installed):
#
#   bash tests/gpu.sh [OUT_DIR]        # default out/gpu; PYTHON=... picks the interpreter
#
# - the CUDA cases of the tests (``-k cuda``): the activation meter, recompute and offload giving
#   the plain schedule's gradients (dropout replayed from the CUDA generator; offload through
#   pinned host buffers on a side stream) and measured device memory against the simulator's
#   peak, two gloo ranks on the one GPU (NCCL refuses two ranks on one device); the two-direction
#   schedules (chimera, bidir-zb, dualpipe, bitpipe) and a pipeline x tensor-parallel mesh training
#   exactly like one process, 2 and 4 gloo ranks over CUDA tensors on the one GPU; 2bw's weight
#   versions (fused and split backward) against the delayed-update rule, and seq1f1b / seq1f1b-zb
#   over sequence chunks against unchunked training, 2 gloo ranks on the GPU; marked parts with
#   parameters and buffers recomputed selectively against ordinary autograd, in one process;
# - `schedc profile --device cuda --policies` on the example GPT: the problem it writes, with the
#   recompute and offload sections measured on the GPU, lands in OUT_DIR.
set -u
PY=${PYTHON:-python3}
out=${1:-out/gpu}
mkdir -p "$out"
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__, torch.cuda.get_device_name())" || exit 2
status=0
"$PY" -m pytest -q -p no:cacheprovider -rA -s -k cuda tests/test_memory_measure.py tests/test_runtime_recompute.py \
    tests/test_runtime_bidirectional.py tests/test_runtime_tp.py tests/test_runtime_async.py \
    tests/test_runtime_seq.py || status=1
"$PY" -m pytest -q -p no:cacheprovider -rA -s -k cuda tests/test_runtime_selective.py || status=1
"$PY" -m schedc.app.cli profile examples/train_gpt.py:gpt -p 2 -m 4 --device cuda --policies -o "$out/gpt-cuda.yaml" || status=1
exit $status
