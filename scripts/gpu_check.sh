#!/usr/bin/env bash
# One short GPU check (about 5 minutes on one H200): the GPU tests, the model benchmark in bf16
# with compiled layers, and a 2-minute bf16 + compile training run stopped by SIGTERM (which
# also exercises the preemption path), then its throughput, MFU and peak memory.
#   bash scripts/gpu_check.sh            # from the repository root, on a machine with a CUDA GPU
set -uo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv && .venv/bin/pip install -q -r requirements-test.txt
fi
. .venv/bin/activate
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"

echo "== GPU tests"
python -m pytest -q -m gpu -n0 -p no:cacheprovider  # -n0: one process on the one GPU

echo "== bench: normlab vs torch.nn.Transformer, bf16, compiled layers"
python -m scripts.bench model --device cuda --compile --rows 256 --length 64 --rounds 20

echo "== 2-minute training run: model=base, bf16, compiled layers, SIGTERM after 120 s"
run_dir="outputs/gpu_check_$(date +%H%M%S)"
timeout -s TERM 120 python train.py model=base trainer.device=cuda trainer.compile=true trainer.max_tokens=16384 \
  trainer.max_steps=100000 trainer.log_every=50 trainer.eval_every=1000000 logger=none "hydra.run.dir=$run_dir"
echo "train.py exit code $? (143 = stopped by SIGTERM after checkpointing)"
python - "$run_dir" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(f"{sys.argv[1]}/metrics.jsonl")]
train = [r for r in rows if "perf/tokens_per_s" in r][1:]  # the first window includes compilation
print(f"steps {rows[-1]['step']}, median over {len(train)} logging windows:")
for key in ("perf/tokens_per_s", "perf/step_ms", "perf/mfu", "mem/peak_gib", "train/loss"):
    values = [r[key] for r in train if r.get(key) is not None]
    print(f"  {key:<18} {statistics.median(values):.4g}" if values else f"  {key:<18} -")
print("status:", json.load(open(f"{sys.argv[1]}/status.json"))["state"])
PY
