#!/usr/bin/env bash
# One bounded check of the project on a CUDA machine, run from the repo root:
#
#   bash benchmarks/gpu_check.sh
#
#   w. install the carried service wheels (.whl/*.whl) into /tmp/site; PYTHONPATH=/tmp/site:$PWD
#   a. nvidia-smi, python/torch/transformers versions, torch.cuda.is_available()
#   b. the core's CUDA test: pytest -m gpu tests/grpo_core
#   c. `grpo train examples/tiny.yaml` on CUDA (bf16 autocast, as the core does): steps/s, peak memory
#   d. the same job through the real service: `python3 -m api.cli.main dev --submit examples/tiny.yaml`
#      (SQLite, a private redis-server unpacked from the carried .devkit/debs), then the job and
#      its per-step metrics read back through the API (GET /v1/jobs/ID, GET /v1/jobs/ID/metrics)
#   e. a bf16 core-step timing on a larger random-init model (hidden 512, 8 layers), fp32 weights
#      under bf16 autocast and bf16 weights
#   f. the same tiny job through the data-parallel launcher (elastic launch, NCCL) on one rank
#   g. benchmarks/multi_gpu.py: 1 process vs one launched rank under ddp and under fsdp (FSDP2 on
#      a 1-device mesh: its code paths and cost on CUDA; the memory saving needs k >= 2 GPUs)
#   h. evaluation during training on CUDA (issue 25): examples/tiny.yaml with an eval_dataset,
#      eval on start and every 20 steps, k=4 sampled eval completions, in fp32 and bf16 weights;
#      the eval points, eval_reward and pass@k per point, timing/eval against the step time, and
#      the same bf16 run twice giving the same eval metrics (keyed randomness on CUDA)
#
# Each stage is bounded by `timeout` and by an overall deadline (GPU_CHECK_BUDGET seconds); a stage
# that fails does not stop the later ones. Everything is teed to $OUT/gpu_check.log; the summary
# table ends the log and is also $OUT/summary.txt. At most 8 files are written under $OUT.
#
# Knobs (environment): PY (python, default python3), OUT (default /tmp/gpu_check_out),
# SKIP_WHEELS=1 (the service packages are already importable), GPU_CHECK_SITE (where the wheels
# go, default /tmp/site), GPU_CHECK_BUDGET (default 420 s),
# GPU_CHECK_CPU=1 (no CUDA here: run stages c and e on the CPU with few steps, to test the script),
# GPU_CHECK_CAP_SCALE (default 1: multiplies each stage's time cap, for slow CPU runs),
# GPU_CHECK_STAGES (default "abcdefgh": the stages to run), GPU_CHECK_G_REPEATS (default 1: runs of
# each side in stage g, ABBA order), REDIS_FROM_PATH=1 (use a redis-server
# already on PATH instead of the carried one).
#
# What it carries is not in git (.whl/ and .devkit/ are ignored through .git/info/exclude). To
# make them again on the development machine (Python 3.12 wheels: the GPU image's python):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     --platform manylinux1_x86_64 -d .whl fastapi starlette pydantic pydantic-core pydantic-settings \
#     python-dotenv annotated-types typing-inspection typing-extensions sqlalchemy alembic mako \
#     celery kombu billiard vine amqp click click-didyoumean click-repl click-plugins prompt-toolkit \
#     wcwidth redis uvicorn websockets opentelemetry-api tzlocal anyio python-dateutil==2.9.0.post0
#   (pin each to the version in .venv: `pip freeze`); and for Redis, in .devkit/debs:
#   apt-get download redis-server redis-tools libjemalloc2 liblzf1 libssl3 libsystemd0 libatomic1 \
#     libc6 libstdc++6 libgcc-s1 libcap2 libgcrypt20 libgpg-error0 liblzma5 libzstd1 liblz4-1
set -u -o pipefail

cd "$(dirname "$0")/.." || exit 2
REPO=$PWD
PY=${PY:-python3}
OUT=${OUT:-/tmp/gpu_check_out}
BUDGET=${GPU_CHECK_BUDGET:-420}
STAGES=${GPU_CHECK_STAGES:-abcdefgh}
CPU_MODE=${GPU_CHECK_CPU:-0}
SITE=${GPU_CHECK_SITE:-/tmp/site}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/gpu_check.XXXXXX)
START=$(date +%s)
SUMMARY=()

export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false TQDM_DISABLE=1

hr() { printf '\n===== %s  [%s, +%ss]\n' "$1" "$(date -u +%H:%M:%S)" "$(( $(date +%s) - START ))"; }

# Seconds a stage may run: its own cap (times GPU_CHECK_CAP_SCALE: a CPU is far slower), or what
# is left before the deadline (at least 5).
CAP_SCALE=${GPU_CHECK_CAP_SCALE:-1}
stage_limit() {
    local cap=$(( $1 * CAP_SCALE )) left=$(( BUDGET - ($(date +%s) - START) ))
    (( left < 5 )) && left=5
    (( cap < left )) && echo "$cap" || echo "$left"
}

# bounded SECONDS CMD...: the command under `timeout`, SIGKILL 45 s after SIGTERM.
bounded() {
    local limit=$1; shift
    timeout -k 45 "$limit" "$@"
    local rc=$?
    (( rc == 124 || rc == 137 )) && echo "!! timed out after ${limit}s: $*"
    return $rc
}

# Seconds since T0 (a `date +%s.%N` reading), one decimal.
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

record() { SUMMARY+=("$(printf '%-2s %-34s %-7s %5ss  %s' "$1" "$2" "$3" "$4" "${5:-}")"); }

# The last "FIGURES: ..." line a helper printed into FILE.
figures() { grep -a '^FIGURES: ' "$1" 2>/dev/null | tail -n 1 | sed 's/^FIGURES: //'; }

wants() { [[ $STAGES == *"$1"* ]]; }

# --- helper programs ------------------------------------------------------------------------

cat > "$WORK/env_report.py" <<'EOF'
import importlib.metadata as md
import platform
import sys

import torch
import transformers

print("python", platform.python_version(), sys.executable)
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
print("transformers", transformers.__version__)
for name in ("peft", "tokenizers", "safetensors", "pydantic", "fastapi", "sqlalchemy", "celery", "redis",
             "uvicorn", "anyio", "click", "h11", "httpx", "typing_extensions", "python-dateutil"):
    try:
        print(f"  {name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"  {name} -")
available = torch.cuda.is_available()
print("torch.cuda.is_available()", available)
if available:
    props = torch.cuda.get_device_properties(0)
    print(f"device {props.name}, capability {props.major}.{props.minor}, {props.multi_processor_count} SMs, "
          f"{props.total_memory / 2**30:.1f} GiB, bf16 {torch.cuda.is_bf16_supported()}, "
          f"devices {torch.cuda.device_count()}")
    print(f"FIGURES: torch {torch.__version__}, transformers {transformers.__version__}, {props.name}")
else:
    print(f"FIGURES: torch {torch.__version__}, transformers {transformers.__version__}, no CUDA")
print("CUDA=" + ("1" if available else "0"))
EOF

cat > "$WORK/service_imports.py" <<'EOF'
# Everything the web process, the scheduler and the worker import at start, without torch.
import importlib
import sys

for name in ("fastapi", "starlette", "pydantic", "pydantic_settings", "sqlalchemy", "alembic", "celery",
             "kombu", "kombu.transport.redis", "redis", "uvicorn", "websockets", "api.main", "api.cli.main", "api.cli.dev",
             "api.store.migrate", "api.scheduling.scheduler", "worker.celery_app", "worker.tasks"):
    module = importlib.import_module(name)
    print(f"  import {name}: ok ({getattr(module, '__version__', '')})")
from api.main import create_app

create_app()
print("  api.main.create_app(): ok; torch imported by the web side:", "torch" in sys.modules)
EOF

cat > "$WORK/metrics_summary.py" <<'EOF'
# metrics_summary.py METRICS.jsonl LABEL [WALL_SECONDS]: per-step figures of one run.
import json
import statistics
import sys

path, label = sys.argv[1], sys.argv[2]
wall = float(sys.argv[3]) if len(sys.argv) > 3 else None
records = [json.loads(line) for line in open(path) if line.strip()]
if not records:
    print(f"FIGURES: {label}: no steps recorded")
    sys.exit(1)


def values(key, rows):
    return [r[key] for r in rows if isinstance(r.get(key), (int, float))]


times = values("step_time", records)
steady = values("step_time", records[1:]) or times  # step 1 pays for warm-up (kernels, allocator)
peak = max(values("peak_memory_mb", records) or [float("nan")])
rewards = values("reward", records)
k = max(1, min(8, len(rewards) // 2))
for key in ("timing/generation", "timing/reward", "timing/ref", "timing/update", "tokens_per_second"):
    got = values(key, records[1:]) or values(key, records)
    if got:
        print(f"  {label} mean {key}: {statistics.fmean(got):.4f}")
print(f"  {label}: {len(records)} steps, step_time mean {statistics.fmean(times):.4f}s "
      f"(median {statistics.median(times):.4f}s, first {times[0]:.4f}s, steady mean {statistics.fmean(steady):.4f}s)")
line = (f"{label}: {len(records)} steps, {1 / statistics.fmean(steady):.2f} steps/s "
        f"({1000 * statistics.fmean(steady):.1f} ms/step after step 1), peak {peak:.0f} MB")
if wall:
    line += f", wall {wall:.1f}s ({len(records) / wall:.2f} steps/s incl. start-up)"
if rewards:
    line += f", reward {statistics.fmean(rewards[:k]):.3f}->{statistics.fmean(rewards[-k:]):.3f}"
print("FIGURES: " + line)
EOF

cat > "$WORK/service_readback.py" <<'EOF'
# service_readback.py JOB_ID OUT.json: the job and its per-step metrics through the API's own
# routes (in-process, against the same SQLite database the stack used), else straight from SQL.
import json
import os
import statistics
import sys

job_id, out = int(sys.argv[1]), sys.argv[2]
try:
    from fastapi.testclient import TestClient

    from api.main import create_app

    with TestClient(create_app()) as client:
        job = client.get(f"/v1/jobs/{job_id}").raise_for_status().json()
        page = client.get(f"/v1/jobs/{job_id}/metrics", params={"limit": 1000}).raise_for_status().json()
    metrics = [dict(item["values"], step=item["step"], ts=item["ts"]) for item in page["items"]]
    source = "api"
except Exception as exc:  # the API's routes could not answer: read the same rows from SQL
    import sqlite3

    print(f"  API read-back failed ({exc!r}); reading SQL directly")
    db = os.environ["GRPO_DATABASE_URL"].removeprefix("sqlite:///")
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    job = dict(con.execute("select * from jobs where id=?", (job_id,)).fetchone())
    job.pop("spec", None)
    metrics = [dict(json.loads(r["payload"]), step=r["step"], ts=r["ts"])
               for r in con.execute("select step, ts, payload from job_metrics where job_id=? order by step",
                                    (job_id,))]
    source = "sql"
job.pop("spec", None)
json.dump({"source": source, "job": job, "metrics": metrics}, open(out, "w"), indent=1, default=str)
print(f"  job {job_id} (via {source}): status {job.get('status')}, last_step {job.get('last_step')}, "
      f"attempt {job.get('attempt')}, worker {job.get('worker_id')}, error {job.get('error') or job.get('error_code')}")
for key in ("created_at", "dispatched_at", "started_at", "finished_at"):
    print(f"  {key}: {job.get(key)}")
times = [m["step_time"] for m in metrics if isinstance(m.get("step_time"), (int, float))]
steady = times[1:] or times
peak = max([m["peak_memory_mb"] for m in metrics if isinstance(m.get("peak_memory_mb"), (int, float))] or [0])
line = f"job {job_id} {job.get('status')} at step {job.get('last_step')}, {len(metrics)} metric rows"
if times:
    line += (f", {1 / statistics.fmean(steady):.2f} steps/s ({1000 * statistics.fmean(steady):.1f} ms/step "
             f"after step 1), peak {peak:.0f} MB")
print("FIGURES: " + line + f" (via {source})")
sys.exit(0 if job.get("status") == "succeeded" else 1)
EOF

cat > "$WORK/larger_model.py" <<'EOF'
# larger_model.py WORK DEVICE STEPS OUT [PROMPTS GENERATIONS COMPLETION_TOKENS]: core steps on a
# random-init hidden-512, 8-layer model, fp32 weights under bf16 autocast and bf16 weights, in one
# process (one torch start-up).
import gc
import json
import math
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

from grpo_core.run.local_run import run_local
from grpo_core.spec.spec_file import load_spec_file
from grpo_core.io.tiny_models import build_tiny_model

work, device, steps, out = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
prompts, generations, completion = (int(a) for a in (sys.argv[5:8] if len(sys.argv) > 7 else (8, 8, 64)))
t0 = time.perf_counter()
build_tiny_model(work / "big-model", family="llama", hidden_size=512, num_layers=8, num_heads=8)
config = json.loads((work / "big-model" / "config.json").read_text())
params = sum(t.numel() for t in load_file(str(work / "big-model" / "model.safetensors")).values())
print(f"  model: hidden {config['hidden_size']}, layers {config['num_hidden_layers']}, "
      f"vocab {config['vocab_size']}, {params / 1e6:.1f}M parameters (built in {time.perf_counter() - t0:.1f}s)")
base = yaml.safe_load(Path("examples/tiny.yaml").read_text())
variants = [("fp32+autocast", "float32"), ("bf16", "bfloat16")]
figures = []
for label, dtype in variants:
    spec = dict(base, name=f"gpu-check-{dtype}", checkpoint_every=1_000_000, log_completions_every=1_000_000)
    spec["model"] = {"source": "path:big-model", "dtype": dtype}
    spec["grpo"] = dict(base["grpo"], prompts_per_step=prompts, num_generations=generations,
                        max_prompt_length=64, max_completion_length=completion, max_steps=steps,
                        learning_rate=1e-5)
    spec_path = work / f"big-{dtype}.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    run_dir = work / f"run-{dtype}"
    start = time.perf_counter()
    run_local(load_spec_file(spec_path), work, run_dir, device=device, progress=False)
    wall = time.perf_counter() - start
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    shutil.copy(run_dir / "metrics.jsonl", out / f"e_metrics_{dtype}.jsonl")
    steady = [r["step_time"] for r in records[1:]] or [r["step_time"] for r in records]
    peak = max(r["peak_memory_mb"] for r in records)
    lengths = statistics.fmean(r.get("completions/mean_length") or 0 for r in records)
    for key in ("timing/generation", "timing/ref", "timing/update", "tokens_per_second"):
        got = [r[key] for r in records[1:] if isinstance(r.get(key), (int, float))]
        if got:
            print(f"  {label} mean {key}: {statistics.fmean(got):.4f}")
    figure = (f"{label} {1 / statistics.fmean(steady):.2f} steps/s "
              f"({1000 * statistics.fmean(steady):.0f} ms/step), peak {peak:.0f} MB")
    print(f"  {label}: {len(records)} steps in {wall:.1f}s, {figure}, mean completion {lengths:.1f} tokens, "
          f"losses finite: {all(isinstance(r.get('loss'), float) and math.isfinite(r['loss']) for r in records)}")
    figures.append(figure)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    gc.collect()
print(f"FIGURES: {params / 1e6:.0f}M params, {prompts}x{generations} completions of <={completion} tokens "
      "a step: " + "; ".join(figures))
EOF

cat > "$WORK/unpack_deb.py" <<'EOF'
# unpack_deb.py DEB DEST: `dpkg -x` for a machine without dpkg (ar archive, data.tar.{xz,gz}).
import io
import sys
import tarfile

deb, dest = sys.argv[1], sys.argv[2]
data = open(deb, "rb").read()
assert data[:8] == b"!<arch>\n", "not an ar archive"
pos = 8
while pos < len(data):
    header = data[pos : pos + 60]
    name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58].decode().strip())
    body = data[pos + 60 : pos + 60 + size]
    if name.startswith("data.tar"):
        with tarfile.open(fileobj=io.BytesIO(body)) as archive:
            archive.extractall(dest, filter="fully_trusted")
        break
    pos += 60 + size + (size % 2)
else:
    sys.exit(f"{deb}: no data.tar member")
EOF

cat > "$WORK/ranks_cuda.py" <<'EOF'
# ranks_cuda.py WORK DEVICE [MAX_STEPS]: examples/tiny.yaml through the data-parallel launcher (torch's elastic
# launcher, one rank per process, NCCL on CUDA / gloo on CPU) with one rank, since this machine
# may have one GPU: the path a k-GPU job takes, from rendezvous to process-group teardown.
import json
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

from grpo_core.run.launch import run_data_parallel
from grpo_core.spec.spec_file import load_spec_file

def main() -> None:
    work, device = Path(sys.argv[1]), sys.argv[2]
    spec = load_spec_file(Path("examples/tiny.yaml"))
    if len(sys.argv) > 3:
        spec = spec.model_copy(update={"grpo": spec.grpo.model_copy(update={"max_steps": int(sys.argv[3])})})
    started = time.perf_counter()
    result = run_data_parallel(spec, Path("examples"), work / "ranks", 1, device=device, progress=False,
                               hang_timeout=timedelta(seconds=120))
    wall = time.perf_counter() - started
    records = [json.loads(line) for line in (work / "ranks" / "metrics.jsonl").read_text().splitlines()]
    steady = [r["step_time"] for r in records[1:]] or [r["step_time"] for r in records]
    print(f"FIGURES: 1 rank via elastic launch on {device}: {result.step} steps, "
          f"{1 / statistics.fmean(steady):.2f} steps/s after step 1, wall {wall:.1f}s incl. launch, "
          f"peak {max(r['peak_memory_mb'] for r in records):.0f} MB")


if __name__ == "__main__":  # the launcher's rank processes are spawned: they re-import this file
    main()
EOF

cat > "$WORK/eval_cuda.py" <<'EOF'
# eval_cuda.py WORK DEVICE STEPS: examples/tiny.yaml with evaluation on (eval_on_start, every
# STEPS/3 steps, k=4 sampled completions a prompt) in fp32 and bf16 weights, the bf16 run twice.
import json
import statistics
import sys
from pathlib import Path

import yaml

from grpo_core.run.local_run import run_local
from grpo_core.spec.spec_file import load_spec_file

work, device, steps = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
base = yaml.safe_load(Path("examples/tiny.yaml").read_text())
held_out = ["Is water wet?", "Answer the question briefly.", "What is 4+4?", "Is it raining?",
            "good morning", "Think about the number nine.", "five six seven", "Is the sun hot?"]


def eval_values(record: dict) -> str:
    return json.dumps({k: v for k, v in record.items() if k.startswith("eval_")}, sort_keys=True)


def run(dtype: str, label: str) -> dict[int, dict]:
    spec = dict(base, name=f"gpu-eval-{label}", checkpoint_every=1_000_000, log_completions_every=1_000_000)
    spec["model"] = dict(base["model"], source="path:" + str(Path("examples/tiny-model").resolve()), dtype=dtype)
    spec["eval_dataset"] = {"prompts": [{"prompt": p} for p in held_out]}
    spec["grpo"] = dict(base["grpo"], max_steps=steps, eval_strategy="steps", eval_steps=max(1, steps // 3),
                        eval_on_start=True, eval_num_generations=4, eval_temperature=1.0)
    path = work / f"eval-{label}.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = work / f"eval-run-{label}"
    run_local(load_spec_file(path), work, out, device=device, progress=False)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = {r["step"]: r for r in records if "eval_reward" in r}
    train = [r["step_time"] for r in records[1:] if isinstance(r.get("step_time"), (int, float))]
    timing = [r["timing/eval"] for r in evals.values() if isinstance(r.get("timing/eval"), (int, float))]
    points = ", ".join(f"{s}: {r['eval_reward']:.3f}/{r['eval_pass@k']:.2f}" for s, r in sorted(evals.items()))
    print(f"  {label}: eval points (step: eval_reward/pass@k) {points}")
    print(f"  {label}: mean step {1000 * statistics.fmean(train or [0.0]):.1f} ms, mean timing/eval "
          f"{1000 * statistics.fmean(timing or [0.0]):.1f} ms ({len(timing)} evals)")
    return evals


figures, first = [], {}
for dtype, label in (("float32", "fp32"), ("bfloat16", "bf16"), ("bfloat16", "bf16-again")):
    evals = run(dtype, label)
    if label == "bf16-again":
        same = first.keys() == evals.keys() and all(eval_values(first[s]) == eval_values(evals[s]) for s in first)
        figures.append(f"bf16 rerun identical eval metrics: {same}")
        if not same:
            print("FIGURES: " + "; ".join(figures))
            sys.exit("!! the same bf16 run gave different eval metrics")
    else:
        first = evals
        seen = sorted(evals)
        figures.append(f"{label} eval at steps {seen}, eval_reward {evals[seen[0]]['eval_reward']:.3f}"
                       f"->{evals[seen[-1]]['eval_reward']:.3f}")
print("FIGURES: " + "; ".join(figures))
EOF

# --- the redis-server the service's `dev` starts ------------------------------------------

# Unpacks .devkit/debs (redis-server, redis-tools and every library they link, glibc and its
# loader included) under $WORK/redis-root and puts wrappers on PATH that run the binaries through
# the carried loader, so nothing of the host's libraries is used and nothing is written to /.
prepare_redis() {
    if [[ ${REDIS_FROM_PATH:-0} == 1 ]] && command -v redis-server >/dev/null; then
        echo "using the redis-server on PATH: $(command -v redis-server)"
        return 0
    fi
    local debs=("$REPO"/.devkit/debs/*.deb)
    if [[ ! -f ${debs[0]} ]]; then
        echo "no .devkit/debs/*.deb (carry .devkit);" \
             "redis-server on PATH: $(command -v redis-server || echo none)"
        command -v redis-server >/dev/null
        return
    fi
    local root=$WORK/redis-root bin=$WORK/redis-bin
    mkdir -p "$root" "$bin"
    for deb in "${debs[@]}"; do
        if [[ ${REDIS_UNPACK:-} != python ]] && command -v dpkg >/dev/null; then
            dpkg -x "$deb" "$root" || return 1
        else
            "$PY" "$WORK/unpack_deb.py" "$deb" "$root" || return 1
        fi
    done
    local loader=$root/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
    local libs=$root/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu
    # /usr/bin/redis-server is a link to redis-check-rdb, which picks its role from argv[0].
    printf '#!/bin/sh\nexec "%s" --library-path "%s" --argv0 redis-server "%s" "$@"\n' \
        "$loader" "$libs" "$root/usr/bin/redis-check-rdb" > "$bin/redis-server"
    printf '#!/bin/sh\nexec "%s" --library-path "%s" --argv0 redis-cli "%s" "$@"\n' \
        "$loader" "$libs" "$root/usr/bin/redis-cli" > "$bin/redis-cli"
    chmod +x "$bin/redis-server" "$bin/redis-cli"
    export PATH=$bin:$PATH
    echo "libraries of redis-server, as the carried loader resolves them:"
    "$loader" --library-path "$libs" --list "$root/usr/bin/redis-check-rdb" | sed 's/^/  /'
    if "$loader" --library-path "$libs" --list "$root/usr/bin/redis-check-rdb" | grep -q "not found"; then
        echo "!! a library of redis-server is missing"
        return 1
    fi
    redis-server --version && redis-cli --version
}

# children_of PID [WORD]: the live (not zombie) child processes of PID, whose command line holds
# WORD if given; read from /proc, so no procps is needed.
children_of() {
    local d stat
    for d in /proc/[0-9]*; do
        read -r stat < "$d/stat" 2>/dev/null || continue
        stat=${stat##*) }   # after the command name: "STATE PPID ..."
        [[ ${stat#* } == "$1 "* && ${stat%% *} != Z ]] || continue
        [[ -z ${2:-} ]] || tr '\0' ' ' < "$d/cmdline" 2>/dev/null | grep -q -- "$2" || continue
        echo "${d#/proc/}"
    done
}

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

ensure_tiny_model() {
    [[ -f examples/tiny-model/config.json ]] && return 0
    echo "building examples/tiny-model"
    bounded 120 "$PY" -m grpo_core.cli tiny-model examples/tiny-model
}

# --- the stages ---------------------------------------------------------------------------

main() {
    echo "gpu_check: repo $REPO, commit $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')," \
         "work dir $WORK, out $OUT, budget ${BUDGET}s, stages $STAGES"
    local t rc log

    hr "w. service wheels"
    t=$(date +%s)
    if [[ ${SKIP_WHEELS:-0} == 1 ]]; then
        export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
        echo "SKIP_WHEELS=1: using $PY's own packages"
        rc=0
    else
        local wheels=("$REPO"/.whl/*.whl)
        echo "${#wheels[@]} wheels in .whl"
        bounded "$(stage_limit 90)" "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --upgrade --target "$SITE" "${wheels[@]}"
        rc=$?
        export PYTHONPATH=$SITE:$REPO
    fi
    echo "PYTHONPATH=$PYTHONPATH"
    log=$WORK/w.txt
    bounded "$(stage_limit 60)" "$PY" "$WORK/service_imports.py" 2>&1 | tee "$log"
    local imports=${PIPESTATUS[0]}
    if [[ ${SKIP_WHEELS:-0} != 1 ]]; then
        echo "pip check, lines about the carried packages or their needs:"
        bounded "$(stage_limit 60)" "$PY" -m pip check 2>&1 | grep -iE "fastapi|starlette|pydantic|sqlalchemy|alembic|celery|kombu|billiard|vine|amqp|click|prompt|wcwidth|redis|uvicorn|websockets|anyio|typing|opentelemetry|tzlocal|dateutil|mako|markupsafe|dotenv|annotated|h11|idna|six" \
            || echo "  (none)"
    fi
    if (( rc == 0 && imports == 0 )); then
        record w "service wheels + imports" ok $(( $(date +%s) - t )) "the service imports without torch"
    else
        record w "service wheels + imports" failed $(( $(date +%s) - t )) "pip rc $rc, imports rc $imports"
    fi

    local cuda=0
    hr "a. machine and versions"
    t=$(date +%s)
    if command -v nvidia-smi >/dev/null; then
        bounded "$(stage_limit 30)" nvidia-smi
        bounded 30 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    else
        echo "no nvidia-smi"
    fi
    log=$WORK/a.txt
    bounded "$(stage_limit 60)" "$PY" "$WORK/env_report.py" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    grep -q '^CUDA=1' "$log" && cuda=1
    record a "versions, torch.cuda" "$( ((rc == 0)) && echo ok || echo failed)" $(( $(date +%s) - t )) "$(figures "$log")"

    local device=cuda steps_c="" shape_e=(10 8 8 64)
    if (( cuda == 0 )) && [[ $CPU_MODE == 1 ]]; then
        device=cpu steps_c="--max-steps 4" shape_e=(2 2 4 16)
        echo "GPU_CHECK_CPU=1 and no CUDA: stages c and e run on the CPU with few steps"
    fi

    if wants b; then
        hr "b. core CUDA test (pytest -m gpu tests/grpo_core)"
        t=$(date +%s)
        local ignore=()
        # TRL and datasets are test-only references, absent on the GPU image: that module then
        # cannot even be collected, and its tests are not CUDA tests.
        "$PY" -c "import trl, datasets" 2>/dev/null || ignore=(--ignore=tests/grpo_core/test_trl_parity.py)
        # rapidfuzz (text_similarity's optional library) is not on the GPU image either.
        "$PY" -c "import rapidfuzz" 2>/dev/null || ignore+=(--ignore=tests/grpo_core/test_text_similarity_reward.py)
        echo "${ignore[*]:-(trl and datasets importable: nothing ignored)}"
        log=$WORK/b.txt
        # The core's tests use neither database nor Redis: name placeholders so the suite's conftest
        # starts no throwaway Postgres (there is no postgres user on the GPU image) nor Redis.
        GRPO_TEST_DATABASE_URL=sqlite:///$WORK/unused.db GRPO_TEST_REDIS_URL=redis://127.0.0.1:1 \
        bounded "$(stage_limit 150)" "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/grpo_core "${ignore[@]}" \
            -rs 2>&1 | tee "$log"
        rc=${PIPESTATUS[0]}
        local tally
        tally=$(grep -aE '(passed|failed|skipped|deselected|error).* in [0-9.]+s' "$log" | tail -n 1)
        if (( cuda == 0 )); then
            record b "core CUDA test" "skipped" $(( $(date +%s) - t )) "no CUDA (pytest rc $rc: $tally)"
        else
            record b "core CUDA test" "$( ((rc == 0)) && echo ok || echo failed)" $(( $(date +%s) - t )) "$tally"
        fi
    fi

    if wants c; then
        hr "c. grpo train examples/tiny.yaml on $device"
        t=$(date +%s)
        if (( cuda == 0 )) && [[ $device == cuda ]]; then
            record c "grpo train tiny.yaml" skipped 0 "no CUDA"
        else
            ensure_tiny_model
            log=$WORK/c.txt
            local t0 wall
            t0=$(date +%s.%N)
            # shellcheck disable=SC2086
            bounded "$(stage_limit 150)" "$PY" -m grpo_core.cli train examples/tiny.yaml \
                --output-dir "$WORK/c-tiny" --device "$device" --quiet $steps_c 2>&1 | tee "$log"
            rc=${PIPESTATUS[0]}
            wall=$(since "$t0")
            if [[ -f $WORK/c-tiny/metrics.jsonl ]]; then
                cp "$WORK/c-tiny/metrics.jsonl" "$OUT/c_tiny_metrics.jsonl"
                "$PY" "$WORK/metrics_summary.py" "$WORK/c-tiny/metrics.jsonl" "tiny.yaml/$device" \
                    "$wall" 2>&1 | tee -a "$log"
            fi
            record c "grpo train tiny.yaml ($device)" "$( ((rc == 0)) && echo ok || echo failed)" \
                $(( $(date +%s) - t )) "$(figures "$log")$( ((rc != 0)) && echo " (rc $rc)")"
        fi
    fi

    if wants d; then
        hr "d. the service: api.cli.main dev --submit examples/tiny.yaml"
        t=$(date +%s)
        log=$WORK/d.txt
        (
            set -o pipefail
            prepare_redis || { echo "FIGURES: no usable redis-server"; exit 3; }
            ensure_tiny_model
            svc=$WORK/svc
            mkdir -p "$svc"
            # A URL nothing answers at: `dev` then starts the private redis-server from PATH.
            export GRPO_REDIS_URL=redis://127.0.0.1:$(free_port)/0
            export GRPO_DATABASE_URL=sqlite:///$svc/grpo.db GRPO_ARTIFACTS_ROOT=$svc/artifacts GRPO_AUTH=none
            port=$(free_port)
            echo "GRPO_REDIS_URL=$GRPO_REDIS_URL (nothing there), GRPO_DATABASE_URL=$GRPO_DATABASE_URL, API port $port"
            t0=$(date +%s.%N)
            limit=$(stage_limit 240)
            timeout -k 45 "$limit" "$PY" -m api.cli.main dev --port "$port" --submit examples/tiny.yaml \
                > "$svc/dev.txt" 2>&1 &
            dev=$!
            tail -n +1 -f --pid="$dev" "$svc/dev.txt" &
            # `dev --submit` waits for the job and does not notice a role that died (a worker
            # missing a package, say): stop it then rather than at the time limit. Once the job's
            # final line is out, dev is stopping the roles itself.
            seen=0
            while kill -0 "$dev" 2>/dev/null; do
                roles=$(for py in $(children_of "$dev"); do children_of "$py" "api.cli.main"; done | wc -l)
                if (( roles >= 3 )); then
                    seen=1
                elif (( seen )) && ! grep -qaE '^job [0-9]+ [a-z]+ at step' "$svc/dev.txt"; then
                    echo "!! a role of the stack (api, scheduler, worker) exited; stopping dev"
                    kill -TERM "$dev"
                    break
                fi
                sleep 2
            done
            wait "$dev"
            rc=$?
            (( rc == 124 || rc == 137 )) && echo "!! timed out after ${limit}s: dev --submit"
            sleep 1
            wall=$(since "$t0")
            echo "dev exited $rc after ${wall}s"
            for role in api scheduler worker; do
                [[ -f $svc/artifacts/logs/$role.log ]] || continue
                { echo "===== $role.log (last 60 lines)"; tail -n 60 "$svc/artifacts/logs/$role.log"; } \
                    >> "$OUT/d_service_logs.txt"
            done
            if (( rc != 0 )); then
                echo "last lines of the worker's log:"
                tail -n 30 "$svc/artifacts/logs/worker.log" 2>/dev/null
            fi
            job=$(grep -aoE 'submitted job [0-9]+' "$svc/dev.txt" | head -n 1 | grep -oE '[0-9]+$')
            if [[ -z $job ]]; then
                echo "FIGURES: no job was submitted (dev rc $rc)"
                exit 1
            fi
            bounded "$(stage_limit 60)" "$PY" "$WORK/service_readback.py" "$job" "$OUT/d_service_job.json"
            readback=$?
            echo "FIGURES: dev rc $rc, wall ${wall}s (start-up, job and shut-down)"
            (( rc == 0 && readback == 0 ))
        ) 2>&1 | tee "$log"
        rc=${PIPESTATUS[0]}
        local figs
        figs=$(grep -a '^FIGURES: ' "$log" | sed 's/^FIGURES: //' | tr '\n' ';' | sed 's/;$//; s/;/; /g')
        record d "service dev --submit tiny.yaml" "$( ((rc == 0)) && echo ok || echo failed)" \
            $(( $(date +%s) - t )) "$figs"
    fi

    if wants e; then
        hr "e. core steps on a larger random-init model ($device)"
        t=$(date +%s)
        if (( cuda == 0 )) && [[ $device == cuda ]]; then
            record e "larger model bf16 steps" skipped 0 "no CUDA"
        else
            log=$WORK/e.txt
            mkdir -p "$WORK/e"
            bounded "$(stage_limit 75)" "$PY" "$WORK/larger_model.py" "$WORK/e" "$device" "${shape_e[0]}" "$OUT" \
                "${shape_e[@]:1}" 2>&1 | tee "$log"
            rc=${PIPESTATUS[0]}
            record e "larger model bf16 steps ($device)" "$( ((rc == 0)) && echo ok || echo failed)" \
                $(( $(date +%s) - t )) "$(figures "$log" || true)$( ((rc != 0)) && echo " (rc $rc)")"
        fi
    fi

    if wants f; then
        hr "f. the data-parallel launcher on $device (one rank per process)"
        t=$(date +%s)
        if (( cuda == 0 )) && [[ $device == cuda ]]; then
            record f "launcher, 1 rank" skipped 0 "no CUDA"
        else
            ensure_tiny_model
            log=$WORK/f.txt
            bounded "$(stage_limit 120)" "$PY" "$WORK/ranks_cuda.py" "$WORK" "$device" ${steps_c#--max-steps } 2>&1 | tee "$log"
            rc=${PIPESTATUS[0]}
            record f "launcher, 1 rank ($device)" "$( ((rc == 0)) && echo ok || echo failed)" \
                $(( $(date +%s) - t )) "$(figures "$log" || true)$( ((rc != 0)) && echo " (rc $rc)")"
        fi
    fi

    if wants g; then
        hr "g. benchmarks/multi_gpu.py on $device: 1 process vs the launcher under ddp and fsdp"
        t=$(date +%s)
        if (( cuda == 0 )) && [[ $device == cuda ]]; then
            record g "multi_gpu.py ddp,fsdp" skipped 0 "no CUDA"
        else
            log=$WORK/g.txt
            local shape_g=(--hidden-size 512 --num-layers 8 --steps 10 --warmup 2)
            [[ $device == cpu ]] && shape_g=(--steps 3 --warmup 1)
            bounded "$(stage_limit 200)" "$PY" benchmarks/multi_gpu.py --device "$device" --nproc 1 \
                --sharding ddp,fsdp "${shape_g[@]}" --repeats "${GPU_CHECK_G_REPEATS:-1}" --budget "$(( $(stage_limit 200) - 15 ))" \
                --json-out "$OUT/g_multi_gpu.json" 2>&1 | tee "$log"
            rc=${PIPESTATUS[0]}
            record g "multi_gpu.py ddp,fsdp ($device)" "$( ((rc == 0)) && echo ok || echo failed)" \
                $(( $(date +%s) - t )) "$(figures "$log" || true)$( ((rc != 0)) && echo " (rc $rc)")"
        fi
    fi

    if wants h; then
        hr "h. evaluation during training on $device (fp32, bf16, bf16 again)"
        t=$(date +%s)
        if (( cuda == 0 )) && [[ $device == cuda ]]; then
            record h "eval during training" skipped 0 "no CUDA"
        else
            ensure_tiny_model
            log=$WORK/h.txt
            local steps_h=60
            [[ $device == cpu ]] && steps_h=3
            bounded "$(stage_limit 150)" "$PY" "$WORK/eval_cuda.py" "$WORK" "$device" "$steps_h" 2>&1 | tee "$log"
            rc=${PIPESTATUS[0]}
            record h "eval during training ($device)" "$( ((rc == 0)) && echo ok || echo failed)" \
                $(( $(date +%s) - t )) "$(figures "$log" || true)$( ((rc != 0)) && echo " (rc $rc)")"
        fi
    fi

    hr "summary (total $(( $(date +%s) - START ))s)"
    printf '%s\n' "${SUMMARY[@]}" | tee "$OUT/summary.txt"
    ! printf '%s\n' "${SUMMARY[@]}" | grep -q ' failed '
}

main 2>&1 | tee "$OUT/gpu_check.log"
status=${PIPESTATUS[0]}
rm -rf "$WORK"
exit "$status"
