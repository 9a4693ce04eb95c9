#!/usr/bin/env bash
# Every GPU measurement in one call, written under one folder. With the defaults the whole
# check should take about 8.5 minutes on one H100 or H200 (the sum of its steps, each timed
# on an H200 on 2026-11-27 or an H100 the day before), so it fits a 10-minute call:
#
#   bash bench/gpu_check.sh [--out DIR] [--data DIR] [--wheels DIR] [--only LIST] [--dry-run]
#                           [--presets LIST] [--recipe-minutes N] [--serve-seconds N]
#                           [--deadline SECONDS]
#
#   env.json        versions, devices, nvidia-smi
#   tests.log       the tests that matter on a GPU (cuDNN attention, bfloat16, packed rows)
#   train.jsonl     bench.train (base by default), bfloat16, ~25k target tokens per step,
#                   against transformers under autocast (when the peer runs there)
#   decode.jsonl    bench.decode greedy and beam 4, bfloat16, against transformers' generate
#   recipe.log      configs/multi30k_gpu.yaml trained, then scored on test2016
#   recipe.json     the test2016 report (BLEU, chrF, signatures) and the run's time summary
#   recipe_host.json  the training process on the host: user and system CPU seconds, page
#                   faults, peak RSS (bench/host_usage.py): whether the host stalls on memory
#   exported.jsonl  the recipe's model translating test2016, beam 4 and greedy, against its
#                   CTranslate2 export in float16 and int8_float16 on the same GPU, BLEU beside
#                   each, and translate.py --evaluate end to end (bench/exported.py)
#   serve.json      that model behind python -m nmt.serving: 1, 8 and 32 clients for 5 s each,
#                   against the batch ceiling (bench/serve.py)
#   frontier.jsonl  with --only ...,students (not in the default: about 4 more minutes): that
#                   model distilled into a 6+2 student (python -m nmt.distillation, then
#                   configs/multi30k_student.yaml for --recipe-minutes), each with its
#                   vocabulary shortlist, then BLEU against sentences/s on test2016 for both,
#                   ours in float32 and bfloat16 with and without the shortlist, CTranslate2 in
#                   float16 and int8_float16 (bench/frontier.py; frontier.png the plot)
#   summary.jsonl   one line per step: its name, exit status and seconds
#   gpu_check.tgz   all of the above in one file (not the model, checkpoints or caches), for
#                   machines that hand back a few files
#
# --data DIR        Multi30k's folder (train.en/.de, valid.*, test2016.*); default: the first
#                   that holds it of $MULTI30K (the recipes' variable) and, in the repository,
#                   data/multi30k, ../shared/data/multi30k and shared/data/multi30k
# --wheels DIR      install missing Python packages from the wheels in DIR (no network)
# --peers DIR       the peer benchmark scripts (default ../shared/tools/peers); the peers run
#                   when torch and transformers import and DIR holds the scripts
# --only LIST       comma-separated steps: env,tests,train,decode,recipe,exported,serve,students
#                   (default: all but students; exported, serve and students use the recipe
#                   step's model: bash bench/gpu_check.sh --only recipe,students)
# --presets LIST    the train step's model presets, comma-separated (default: base; base,big
#                   adds about a minute)
# --recipe-minutes N  the recipe's (and the student's) training budget in minutes (default 3;
#                   7, the recipe's own, runs all of its 8,000 steps in about 5 minutes: use it
#                   with --only recipe)
# --serve-seconds N how long each client count of the serve step sends (default: 5)
# --deadline SECONDS  no step runs past this many seconds after the start (default 570): one
#                   that would is stopped, and the steps after it are skipped, each recorded
#                   with status 124, so the records of a call cut short still come back
# --dry-run         the same steps at toy sizes, on whatever device JAX has (the CPU in CI)
#
# Missing packages, a missing GPU (without --dry-run) or missing data stop it at once with one
# line saying what to do. A failing step is recorded and the next one runs.
set -uo pipefail

PROG="gpu_check.sh"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT_DIR="${OUT:-$REPO/runs/gpu_check}"
DATA=""
WHEELS=""
PEERS_DIR="${NMT_PEERS_DIR:-$REPO/../shared/tools/peers}"
ONLY="env,tests,train,decode,recipe,exported,serve"
DRY_RUN=0
PRESET_LIST=""
RECIPE_MINUTES=""
SERVE_SECONDS=5
DEADLINE=570

die() { echo "$PROG: error: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT_DIR="${2:?--out needs a folder}"; shift 2 ;;
        --data) DATA="${2:?--data needs a folder}"; shift 2 ;;
        --wheels) WHEELS="${2:?--wheels needs a folder}"; shift 2 ;;
        --peers) PEERS_DIR="${2:?--peers needs a folder}"; shift 2 ;;
        --only) ONLY="${2:?--only needs a list}"; shift 2 ;;
        --presets) PRESET_LIST="${2:?--presets needs a list}"; shift 2 ;;
        --recipe-minutes) RECIPE_MINUTES="${2:?--recipe-minutes needs a number}"; shift 2 ;;
        --serve-seconds) SERVE_SECONDS="${2:?--serve-seconds needs a number}"; shift 2 ;;
        --deadline) DEADLINE="${2:?--deadline needs a number of seconds}"; shift 2 ;;
        --dry-run) DRY_RUN=1; shift ;;
        -h|--help) sed -n '2,55p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument '$1'; see $PROG --help" ;;
    esac
done
for step in ${ONLY//,/ }; do
    case "$step" in env|tests|train|decode|recipe|exported|serve|students) ;;
        *) die "--only: unknown step '$step'; the steps are env, tests, train, decode, recipe, \
exported, serve, students" ;;
    esac
done
wants() { [[ ",$ONLY," == *",$1,"* ]]; }
positive() { [[ "$2" =~ ^[0-9]+([.][0-9]+)?$ ]] && [[ ! "$2" =~ ^0*([.]0*)?$ ]] \
    || die "$1 '$2': give a positive number"; }
[ -z "$RECIPE_MINUTES" ] || positive --recipe-minutes "$RECIPE_MINUTES"
[[ "$SERVE_SECONDS" =~ ^0*[1-9][0-9]*$ ]] \
    || die "--serve-seconds '$SERVE_SECONDS': give a whole number of seconds, 1 or more"
[[ "$DEADLINE" =~ ^0*[1-9][0-9]*$ ]] \
    || die "--deadline '$DEADLINE': give a whole number of seconds, 1 or more"

cd "$REPO" || exit 2
mkdir -p "$OUT_DIR" || die "--out $OUT_DIR: cannot create it; choose a writable folder"
: > "$OUT_DIR/summary.jsonl"
bundle() {  # every record in one file: the .json, .jsonl and .log files, not models or caches
    (cd "$OUT_DIR" && find . -maxdepth 2 -type f \( -name '*.json' -o -name '*.jsonl' \
        -o -name '*.log' \) -size -4M | sort | tar czf gpu_check.tgz -T -) 2>/dev/null
}
trap bundle EXIT
export PYTHONUNBUFFERED=1 FLAX_NMT_CACHE="${FLAX_NMT_CACHE:-$OUT_DIR/jax_cache}"
PYTHON="${PYTHON:-python3}"

# ---------------------------------------------------------------- packages
if [ -n "$WHEELS" ]; then
    [ -d "$WHEELS" ] || die "--wheels $WHEELS: no such folder"
    if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$OUT_DIR/site" "$WHEELS"/*.whl \
            || die "installing the wheels of $WHEELS failed (see pip's message above)"
        export PYTHONPATH="$OUT_DIR/site${PYTHONPATH:+:$PYTHONPATH}"
    fi
fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
missing=$(NMT_CHECK_SERVE="$(wants serve && echo 1)" "$PYTHON" - <<'EOF'
import importlib.util, os
need = ["jax", "flax", "optax", "orbax", "sentencepiece", "sacrebleu", "datasets", "yaml", "tqdm",
        "tensorboardX", "pytest", "xdist"]
if os.environ.get("NMT_CHECK_SERVE"):  # the serve step: pip install -e '.[serve]'
    need += ["uvicorn", "starlette", "multipart", "prometheus_client", "sentencex"]
print(" ".join(n for n in need if importlib.util.find_spec(n) is None))
EOF
)
[ -z "$missing" ] || die "missing Python packages: $missing; pass --wheels DIR with their wheels \
(pip download --no-deps --only-binary=:all: -d DIR NAME on a machine with network)"

# ---------------------------------------------------------------- device
backend=$("$PYTHON" -c "import jax; print(jax.default_backend())" 2>/dev/null) \
    || die "JAX does not start here: run $PYTHON -c 'import jax; jax.devices()' to see why"
if [ "$DRY_RUN" = 0 ] && [ "$backend" != "gpu" ]; then
    die "JAX sees no GPU (backend '$backend'); install jax[cuda13] (pip install -e '.[cuda]'), \
or use --dry-run for a toy run on the $backend"
fi

if [ -z "$DATA" ]; then
    for candidate in "${MULTI30K:-}" "$REPO/data/multi30k" "$REPO/../shared/data/multi30k" \
            "$REPO/shared/data/multi30k"; do
        [ -f "$candidate/train.en" ] && DATA="$candidate" && break
    done
fi
if wants recipe || wants exported || wants serve || wants students; then
    for f in train.en train.de valid.en valid.de test2016.en test2016.de; do
        [ -f "$DATA/$f" ] || die "--data '${DATA:-unset}': $f is missing; give Multi30k's folder \
(see docs/training.md for where to get it) or leave out the recipe step with --only"
    done
fi

# ---------------------------------------------------------------- steps
record() {  # record NAME STATUS SECONDS
    printf '{"step": "%s", "status": %d, "seconds": %d}\n' "$1" "$2" "$3" \
        >> "$OUT_DIR/summary.jsonl"
    echo "== $1: exit $2 in $3 s"
}
step() {  # step NAME LOG COMMAND...: COMMAND stopped at the deadline (status 124)
    local name="$1" log="$2" start=$SECONDS status left=$((DEADLINE - SECONDS))
    shift 2
    if [ "$left" -lt 5 ]; then
        echo "== $name: skipped, the --deadline of $DEADLINE s has passed"
        record "$name" 124 0
        return
    fi
    echo "== $name"
    timeout -k 10 "$left" "$@" > >(tee "$log") 2>&1
    status=$?
    [ "$status" != 124 ] || echo "== $name: stopped at the --deadline of $DEADLINE s"
    record "$name" "$status" $((SECONDS - start))
}

if [ "$DRY_RUN" = 1 ]; then
    PRESETS=(tiny); BATCH=8; LEN=8; STEPS=2; DECODE=(--preset tiny --batch 4 --src-len 6
        --out-len 6 --repeats 1)
    # the recipe's model and the student trained alike, with one layer each side: each layer
    # more only adds compiling to what the toy run checks
    TOY_RUN=(--encoder-layers 1 --decoder-layers 1 --max-steps 20 --max-minutes 5
        --eval-every 10 --eval-sentences 8 --batch-tokens 512 --vocab-size 320 --save-every 10)
    RECIPE_FLAGS=(--preset tiny "${TOY_RUN[@]}")
    TESTS=(tests/test_packing.py -k "padded_row or cudnn")
    EXPORTED=(--device cpu --limit 6 --inter-threads 1 --threads 1)
    SERVE=(--clients 2 --seconds 2 --modes batched,ceiling,calls --ceiling-batch-tokens 256
        --server-args "--buckets 16 --batch-tokens 64")
    STUDENT_FLAGS=("${TOY_RUN[@]}")
    FRONTIER=(--limit 6 --passes 1 --dtypes float32 --shortlist 64 --compute-types int8
        --threads 1 --inter-threads 1)
    # torch and CTranslate2 on one thread: on a shared CPU a pool of two spins for each of
    # the toy model's tiny products
    PEER_FLAGS=(--threads 1)
else
    # ~25k target tokens per step: 800 pairs x 32 tokens.
    PRESETS=(base); BATCH=800; LEN=32; STEPS=20; DECODE=(--preset base --batch 64)
    RECIPE_FLAGS=()
    RECIPE_MINUTES="${RECIPE_MINUTES:-3}"
    TESTS=(tests/test_packing.py tests/test_model.py -k "cudnn or bfloat16 or padded_row")
    EXPORTED=(--device cuda --end-to-end)
    SERVE=(--clients 1,8,32 --seconds "$SERVE_SECONDS" --modes batched,ceiling)
    STUDENT_FLAGS=()
    FRONTIER=(--device cuda --inter-threads 1 --passes 2 --shortlist 1024)
    PEER_FLAGS=()
fi
[ -z "$PRESET_LIST" ] || PRESETS=(${PRESET_LIST//,/ })
known=$("$PYTHON" -c "from transformer.config import PRESETS; print(' '.join(PRESETS))")
for preset in "${PRESETS[@]}"; do
    [[ " $known " == *" $preset "* ]] \
        || die "--presets: unknown preset '$preset'; the presets are ${known// /, }"
done
[ -z "$RECIPE_MINUTES" ] || RECIPE_FLAGS+=(--max-minutes "$RECIPE_MINUTES")
[ -z "$RECIPE_MINUTES" ] || STUDENT_FLAGS+=(--max-minutes "$RECIPE_MINUTES")
PEER=()
if [ -f "$PEERS_DIR/hf_train_step.py" ] && "$PYTHON" -c "import torch, transformers" 2>/dev/null
then
    PEER=(--compare "${PEER_FLAGS[@]}")
    export NMT_PEERS_DIR="$PEERS_DIR" NMT_PEER_PYTHON="${NMT_PEER_PYTHON:-$(command -v "$PYTHON")}"
fi

if wants env; then
    step env "$OUT_DIR/env.log" bash -c "\"$PYTHON\" - > \"$OUT_DIR/env.json\" <<'EOF'
import json, platform, subprocess
import jax, flax, optax
info = {'python': platform.python_version(), 'jax': jax.__version__, 'flax': flax.__version__,
        'optax': optax.__version__, 'backend': jax.default_backend(),
        'devices': [str(d) for d in jax.devices()]}
try:
    info['nvidia_smi'] = subprocess.run(['nvidia-smi', '--query-gpu=name,memory.total,driver_version',
                                         '--format=csv,noheader'], capture_output=True, text=True,
                                        timeout=30).stdout.strip()
except (OSError, subprocess.SubprocessError):
    info['nvidia_smi'] = None
print(json.dumps(info))
EOF
cat \"$OUT_DIR/env.json\""
fi
if wants tests; then
    step tests "$OUT_DIR/tests.log" "$PYTHON" -m pytest -q -n 0 -p no:cacheprovider "${TESTS[@]}"
fi
if wants train; then
    : > "$OUT_DIR/train.jsonl"
    for preset in "${PRESETS[@]}"; do
        compare=("${PEER[@]}")
        # the peer builds the paper's model only: big's dropout 0.3 or a student's pre-norm
        # has no peer to compare with (bench.train refuses --compare there)
        [ ${#compare[@]} = 0 ] || "$PYTHON" -c "import sys; from bench.train import \
peer_differences; from transformer.config import PRESETS; \
sys.exit(bool(peer_differences(PRESETS['$preset'])))" || compare=()
        step "train-$preset" "$OUT_DIR/train-$preset.log" bash -c "set -o pipefail; \"$PYTHON\" -m bench.train \
--preset $preset --dtype bfloat16 --batch $BATCH --src-len $LEN --tgt-len $LEN --steps $STEPS \
${compare[*]} | tee -a \"$OUT_DIR/train.jsonl\""
    done
fi
if wants decode; then
    step decode "$OUT_DIR/decode.log" bash -c "set -o pipefail; \"$PYTHON\" -m bench.decode ${DECODE[*]} \
--dtype bfloat16 --beams 1 4 ${PEER[*]} | tee \"$OUT_DIR/decode.jsonl\""
fi
if wants recipe; then
    run_dir="$OUT_DIR/multi30k_gpu"
    step recipe "$OUT_DIR/recipe.log" bash -c "set -o pipefail; \"$PYTHON\" -m bench.host_usage \
\"$OUT_DIR/recipe_host.json\" -- \"$PYTHON\" train.py --config configs/multi30k_gpu.yaml \
--train-prefix \"$DATA/train\" --valid-prefix \"$DATA/valid\" --test-prefix \"$DATA/test2016\" \
--output-dir \"$run_dir\" --no-progress ${RECIPE_FLAGS[*]} && \"$PYTHON\" translate.py \
--model \"$run_dir/averaged\" --evaluate --test-prefix \"$DATA/test2016\" --src en --tgt de -q \
--report \"$OUT_DIR/recipe.json\""
fi
if wants exported; then
    step exported "$OUT_DIR/exported.log" bash -c "set -o pipefail; \"$PYTHON\" -m bench.exported --model \
\"$OUT_DIR/multi30k_gpu/averaged\" --test-prefix \"$DATA/test2016\" --src en --tgt de \
${EXPORTED[*]} | tee \"$OUT_DIR/exported.jsonl\""
fi
if wants serve; then
    step serve "$OUT_DIR/serve.log" "$PYTHON" -m bench.serve --model \
"$OUT_DIR/multi30k_gpu/averaged" --test-prefix "$DATA/test2016" --src en --tgt de \
"${SERVE[@]}" --json "$OUT_DIR/serve.json"
fi
if wants students; then
    teacher="$OUT_DIR/multi30k_gpu/averaged" distilled="$OUT_DIR/distilled"
    student="$OUT_DIR/student" plot=""
    "$PYTHON" -c "import matplotlib" 2>/dev/null && plot="--plot \"$OUT_DIR/frontier.png\""
    step students "$OUT_DIR/students.log" bash -c "set -o pipefail; \"$PYTHON\" -m nmt.distillation \
--teacher \"$teacher\" --train-prefix \"$DATA/train\" --out \"$distilled\" -q \
&& \"$PYTHON\" -m nmt.distillation.shortlist --model \"$teacher\" --train-prefix \"$DATA/train\" \
&& \"$PYTHON\" train.py --config configs/multi30k_student.yaml --train-prefix \"$distilled/train\" \
--valid-prefix \"$DATA/valid\" --test-prefix \"$DATA/test2016\" --output-dir \"$student\" \
--no-progress ${STUDENT_FLAGS[*]} \
&& \"$PYTHON\" -m nmt.distillation.shortlist --model \"$student/averaged\" \
--train-prefix \"$distilled/train\" \
&& \"$PYTHON\" -m bench.frontier --model teacher=\"$teacher\" --model student-6-2=\"$student/averaged\" \
--test-prefix \"$DATA/test2016\" --src en --tgt de ${FRONTIER[*]} $plot \
| tee \"$OUT_DIR/frontier.jsonl\""
fi
echo "== done: $OUT_DIR/summary.jsonl"
! grep -q '"status": [1-9]' "$OUT_DIR/summary.jsonl"
