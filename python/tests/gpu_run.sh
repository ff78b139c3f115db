#!/bin/bash
# SPDX-License-Identifier: LGPL-2.1-or-later
# The GPU half of vmmrt.torch's checks for the H200: the pytest suite (its GPU
# tests run there, the CPU ones too) and the benchmark's tables, both
# training loops each (set_to_none and persistent, AdamW). Every log and JSON
# goes to $OUT (./gpu-out without it); the last lines printed are a summary.
# Run from the built release tree or a checkout, one group per command (the
# machine stops a command at 10 minutes):
#
#   bash .gpu/on-device.sh 'bash python/tests/gpu_run.sh'                     # A: pytest smoke s4096, ~4.5 min
#   bash .gpu/on-device.sh 'bash python/tests/gpu_run.sh s8192 encoder hf'    # B: ~6 min
#   bash .gpu/on-device.sh 'bash python/tests/gpu_run.sh math quarter'        # C (issue #12's extras): ~2 min
#
# A and B are issue #20's shapes. Parts (arguments; none: group A; "all":
# every part, for a machine without the limit):
#   pytest   the test suite                                          ~5 min
#   pytest:K/N  the K-th of N runs of consecutive test files (the suite
#            with its GPU tests outlasts one device call: pytest:1/2 and
#            pytest:2/2 in two calls)
#   smoke    --smoke: every default mode, both loops, tiny shape     ~0.6 min
#   s4096    8 Llama-3-8B layers (torch ops), seq 4096, 7 modes      ~2.5 min
#   hf       8 transformers LlamaDecoderLayers, seq 4096, 4 modes    ~1 min
#   s8192    8 Llama-3-8B layers, seq 8192, 7 modes                  ~3.5 min
#   encoder  --preset encoder: 6 torch.nn.TransformerEncoderLayers
#            (d 4096, ffn 16384, 32 heads, seq 4096), 7 modes        ~1.5 min
#   math     3 layers, math attention (bitwise gradients), 6 modes   ~1 min
#   quarter  --fraction 0.25, set_to_none loop only, 4 modes         ~0.7 min
#   megatron examples/megatron_gpt.py: megatron-core's GPTModel, 4 layers,
#            seq 2048, 8 modes x 2 loops                             ~1.5 min
#            (needs megatron-core there: GPU_WHEELS="megatron-core==0.19.2"
#            bash ../shared/gpu/prepare.sh brings its wheel; without it the
#            example says so and test_megatron.py skips)
#   budget   --budget-sweep: 8 Llama-3-8B layers, seq 4096, 5 budgets
#            from graph-only's peak down to the smallest plan        ~5 min
#   budget6  --budget-sweep on the default stack (6 layers)          ~4 min
#   budget32 --budget-sweep on 32 Llama-3-8B layers, seq 4096, 4 budgets (issue
#            #21's stack; alone, with GPU_RUN_BUDGET_S=550)          ~8 min
#   front-smoke    --front --smoke of every shape: tiny, every option, on
#                  the GPU (a first check that each builds)           ~1.5 min
#   front-llama    --front (PyTorch's options against vmmrt's, two fronts and
#                  a verdict): 8 Llama-3-8B layers (torch ops), seq 4096,
#                  22 points                                         ~4 min
#   front-launch   --front: 16 layers, hidden 1024, ffn 4096, seq 1024
#                  (launch-bound), 22 points                         ~2 min
#   front-encoder  --front: 6 torch.nn.TransformerEncoderLayers, d 4096,
#                  ffn 16384, 32 heads, seq 4096; alone              ~5 min
#   front-hf       --front: 4 transformers LlamaDecoderLayers, seq 4096 ~2.5 min
#   front-megatron --front: 4 megatron-core TransformerLayers (local spec),
#                  seq 2048 (megatron-core as for "megatron" above)  ~2.5 min
#   front-fused    --front of launch with AdamW fused                ~2 min
#   front-persistent  --front of launch in the persistent loop       ~2 min
#   front-math     --front of launch with math attention, both loops, graphs
#                  and vmmrt's modes: the gradients bitwise as torch
#                  graphs' in every mode ([hot-path])                 ~2 min
#   front-launch-both  --front of launch, both loops, AdamW fused: eager,
#                  ckpt 16, graphs, graphs+ckpt 16, vmmrt none, auto and
#                  recompute all (mode none against graphs and eager
#                  [hot-path] [memory-plan]; recompute all at checkpointing's
#                  peak [planner])                                   ~4 min
#   front-llama-both  --front of llama, both loops, AdamW fused: eager,
#                  graphs, vmmrt none and auto (each point's peak_where
#                  and auto's predicted-against-measured line)        ~4 min
#   copy-bound     full offload of the launch-bound layers (graph,
#                  pingpong, remap), AdamW fused: each against its copy
#                  bound ([hot-path])                                ~1 min
#   front-megatron-both  --front of megatron, both loops, AdamW fused: torch's
#                  graphs alone in a fresh process, eager the reference ~3 min
#   check-launch   --front of launch, PyTorch's options only (3 values of k),
#                  then each again alone in a fresh process, within 3 % ~4 min
#   check-llama    the same on the llama shape                       ~5 min
#   chain-ab       vmmrt none, auto and recompute all (encoder, long),
#                  set_to_none, AdamW fused, with each backward's output
#                  gradients on the pages of the argument gradients handed
#                  them (memplan.CHAIN_GOUTS) and apart  ~8 min (an estimate)
#   defer-ab       vmmrt none and recompute all (launch) and none (llama),
#                  set_to_none, AdamW fused, each alone in a one-point front,
#                  with the mapped backward pair instantiated at its first
#                  replay and at its capture (graphed.DEFER_MAPPED_BACKWARDS):
#                  the executable graphs' device memory      ~3 min (an estimate)
#   alone-launch   --front of launch, both loops, AdamW fused: eager, ckpt
#                  16, graphs, vmmrt none and recompute all, then each again
#                  alone in a fresh process (--check-alone): vmmrt's points
#                  without what the graphed points before them left  ~5 min (an estimate)
#   at-launch      --front of launch, both loops, AdamW fused: eager, ckpt 16,
#                  graphs, graphs+ckpt 16, vmmrt none and auto (their whole
#                  step predicted against measured), recompute all, and the
#                  planner's memory_budget= at ckpt 16's and graphs+ckpt 16's
#                  measured peaks ([planner]: at eager checkpointing's peak,
#                  <= 1.25x graphs' time)                ~6 min (an estimate)
#   at-launch-1    at-launch in the set_to_none loop alone (device time
#                  short)                                 ~3 min (an estimate)
#   foreach-launch, foreach-llama, foreach-encoder  --front of that shape,
#                  both loops, AdamW foreach (the fronts above are fused):
#                  eager, checkpointing every layer, graphs, vmmrt none and
#                  auto (and on launch graphs+ckpt 16 and recompute all, on
#                  llama and encoder full offload, vmmrt pingpong)
#                  ([memory-plan]'s foreach targets)        ~4 min each (an estimate)
#   fresh-launch   alone-launch's points with --fresh-loops (the persistent
#                  loop's front in a process of its own), to set beside
#                  alone-launch's figures              ~2 min (an estimate)
#   at-llama, at-long  at-launch's points (and full offload, vmmrt
#                  pingpong) on 8 Llama-3-8B layers, seq 4096, and on the
#                  long-context shape (4 layers, seq 32768, 3 iterations),
#                  budgets at checkpointing every layer's and graphs of
#                  checkpointed layers' peaks      ~5 min / ~7 min (estimates)
#   smallest       checkpointing every layer against the smallest plan
#                  (vmmrt recompute all), both loops, AdamW fused, on launch,
#                  llama and long, a two-point front each and the planner's
#                  budget at ckpt's peak: where [planner]'s
#                  smallest plan stands, each shape in a process of its
#                  own (only the eager checkpointing before it, no graphed
#                  point's memory beside it)             ~2.5 min on the H200
#   smallest-reuse the same with PYTORCH_CUDA_ALLOC_CONF=
#                  graph_capture_record_stream_reuse:True (PyTorch's reuse
#                  inside a capture of blocks recorded on another stream:
#                  what it does to the graphs' pool, end to end)
#   launch-ab      --launch-ab 40 on launch and llama: torch's graphed
#                  callables and vmmrt none alternated, the launch
#                  thread's excess pair by pair ([hot-path])          ~2 min (an estimate)
#   one-time       --one-time on launch and llama: the device memory a fresh
#                  process keeps of each kind of step, stage by stage
#                  ([memory-plan]: the set_to_none loop's base)        ~2 min (an estimate)
#   poolcheck      bench.poolcheck on 2 Llama layers and 1 long-context one:
#                  eager checkpointing's backward against the recompute-all
#                  plan's graphs' pool, block by block, and how each
#                  capture's frees went; Llama again with PyTorch's
#                  graph_capture_record_stream_reuse, and mode none's pool
#                  on 16 launch-bound layers ([planner]: the
#                  smallest plan's excess over ckpt's peak) ~1 min
#   probes         tests/gpu_probe_graph_memory.py (what an executable graph
#                  and the process's first capture hold on the device) and
#                  tests/gpu_probe_external_events.py (a captured graph that
#                  waits on and records events outside it: per-tensor copies
#                  inside a layer's graphs, sub-layer banks)  ~1 min (an estimate)
#   The fronts, one group per command, each with GPU_RUN_NO_PYTEST=1:
#     bash .gpu/on-device.sh 'GPU_RUN_NO_PYTEST=1 bash python/tests/gpu_run.sh front-launch front-llama'
#   (~6 min; front-smoke first where the time allows), then front-encoder;
#   front-hf front-megatron; check-launch; check-llama; front-fused
#   front-persistent. Every front writes front-NAME.json (every point, written
#   after each one: a part stopped by its limit keeps what it measured) and
#   front-NAME.png (both fronts); python3 -m vmmrt.torch.bench.front
#   front-NAME.json prints its tables again.
# The times are estimates, not readings: the former 6-layer, 4-mode table
# took about 100 s with one loop; by our reading of it much of that was
# comparing billions of gradient elements on the host, which the benchmark
# now does on the device. A table here is 7 modes x 2 loops, each mode built
# again per loop (capture, pinned buffers) and its 14 steps taking seconds
# (0.1 s graph-only to 0.5 s save_on_cpu at seq 4096, twice that at 8192).
# So that a slow table cannot take the summary with it, each part gets at
# most what is left of GPU_RUN_BUDGET_S (480 s, leaving on-device.sh's build
# its share of the 10 minutes), and a part with under 30 s left is skipped
# and says so.
#
# The library: $VMMRT_LIBRARY, else <tree>/.libs/libvmmrt.so.1, else the one
# on-device.sh built under /tmp/build/libvmmrt-*/. Its dependencies (liburcu,
# ck) are in /opt/deps there. GPU_RUN_NO_PYTEST=1 leaves out pytest (make
# check's tests/python.sh runs the same tests).
set -u
here=$(cd "$(dirname "$0")" && pwd)
tree=$(cd "$here/../.." && pwd)
out=${OUT:-$tree/gpu-out}
mkdir -p "$out"
# GPU_RUN_PACK=1: every part's files in one archive, $out/gpu-run.tar.gz,
# written again after each part (so a command stopped at its limit keeps
# the parts before), beside summary.txt: the device machine sends back at
# most 8 files of $OUT, fewer than three parts write.
packed=
if [ -n "${GPU_RUN_PACK:-}" ]; then
	packed=$out
	out=$(mktemp -d "${TMPDIR:-/tmp}/gpu-run.XXXXXX")
fi
pack() {
	[ -n "$packed" ] || return 0
	tar -czf "$packed/gpu-run.tar.gz.part" -C "$out" . && mv -f "$packed/gpu-run.tar.gz.part" "$packed/gpu-run.tar.gz"
	cp -f "$summary" "$packed/summary.txt"
}
py=${PYTHON:-python3}
t_start=$(date +%s)
budget=${GPU_RUN_BUDGET_S:-480}

. "$here/gpu_env.sh"

parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(pytest smoke s4096)
[ "${parts[*]}" = all ] && parts=(pytest smoke s4096 hf s8192 encoder math quarter megatron)

summary=$out/summary.txt
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

note "gpu_run: ${parts[*]}; library ${VMMRT_LIBRARY:-<not found>}, tree $tree, out $out"
{ nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv 2>&1
  "$py" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
    torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")' 2>&1
  "$py" -c 'import transformers; print("transformers", transformers.__version__)' 2>&1; } | tee "$out/env.txt"

step() { # step NAME LIMIT COMMAND...: log to $out/NAME.log, note the status
	name=$1 limit=$2
	shift 2
	left=$((budget - ($(date +%s) - t_start)))
	if [ "$left" -lt 30 ]; then
		note "$name: skipped: ${left} s left of GPU_RUN_BUDGET_S=$budget"
		return 1
	fi
	[ "$limit" -gt "$left" ] && limit=$left
	t0=$(date +%s)
	timeout "$limit" "$@" >"$out/$name.log" 2>&1
	rc=$?
	note "$name: rc $rc ($(($(date +%s) - t0)) s of at most $limit) -> $out/$name.log"
	return $rc
}

bench() { # bench NAME LIMIT ARGS...
	name=$1 limit=$2
	shift 2
	step "$name" "$limit" "$py" -m vmmrt.torch.bench --json "$out/$name.json" "$@" || true
	[ -f "$out/$name.log" ] &&
		grep -E "^\s+\[(met|MISSED)\]|FAILED" "$out/$name.log" | sed "s/^/$name: /" | tee -a "$summary"
}

front() { # front NAME LIMIT ARGS...: a --front run, its verdict lines in the summary
	name=$1 limit=$2
	shift 2
	step "$name" "$limit" "$py" -m vmmrt.torch.bench --front --json "$out/$name.json" "$@" || true
	[ -f "$out/$name.log" ] &&
		grep -E "^verdict|FAILED|^alone check|DIFFERS|^plot" "$out/$name.log" | sed "s/^/$name: /" | tee -a "$summary"
}

flag_front() { # flag_front NAME LIMIT STATEMENT ARGS...: a one-loop --front run in a
	# process that runs the Python STATEMENT first (a module switch's A/B),
	# its points' build lines in the summary
	name=$1 limit=$2 stmt=$3
	shift 3
	step "$name" "$limit" "$py" -c "import sys; $stmt
from vmmrt.torch.bench.__main__ import main; sys.exit(main(sys.argv[1:]))" --front --front-ks 3 \
		--front-budgets 0 --optimizer fused --loop set_to_none --json "$out/$name.json" "$@" || true
	[ -f "$out/$name.log" ] && grep -E "^\[[0-9]+/[0-9]+\] .*build" "$out/$name.log" | cut -c1-160 |
		sed "s/^/$name: /" | tee -a "$summary"
}

# Every table runs both loops (--loop both, the default) at one microbatch.
for part in "${parts[@]}"; do
	case $part in
	pytest)
		[ -n "${GPU_RUN_NO_PYTEST:-}" ] && continue
		step pytest 420 "$py" -m pytest -p no:cacheprovider -rs -v "$tree/python/tests" --junitxml="$out/pytest.xml"
		grep -E "passed|failed|error" "$out/pytest.log" | tail -1 | tee -a "$summary"
		grep -E "^(FAILED|ERROR)" "$out/pytest.log" | tee -a "$summary" ;;
	pytest:*)
		# one of N runs of the suite's files, in their order, cut into N
		# runs of consecutive files: the whole suite with its GPU tests
		# outlasts one device call (two sessions' make check was stopped
		# at 10 minutes inside tests/python.sh)
		[ -n "${GPU_RUN_NO_PYTEST:-}" ] && continue
		k=${part#pytest:}
		case $k in */*) ;; *) k=/ ;; esac
		n=${k#*/}
		k=${k%%/*}
		case "$k/$n" in
		*[!0-9/]* | /* | */ ) note "gpu_run: $part: give pytest:K/N, 1 <= K <= N"; continue ;;
		esac
		if [ "$k" -lt 1 ] || [ "$k" -gt "$n" ]; then
			note "gpu_run: $part: give pytest:K/N, 1 <= K <= N"
			continue
		fi
		files=("$tree"/python/tests/test_*.py)
		total=${#files[@]}
		first=$(((k - 1) * total / n))
		last=$((k * total / n))
		name=pytest-$k-of-$n
		step "$name" 540 "$py" -m pytest -p no:cacheprovider -rs -v --durations=15 \
			"${files[@]:first:last-first}" --junitxml="$out/$name.xml"
		note "$name: ${files[first]##*/} .. ${files[last-1]##*/} ($((last - first)) of $total files)"
		grep -E "passed|failed|error" "$out/$name.log" | tail -1 | tee -a "$summary"
		grep -E "^(FAILED|ERROR)" "$out/$name.log" | tee -a "$summary" ;;
	smoke) bench bench-smoke 90 --smoke ;;
	s4096) bench bench-s4096 300 --layer torch --layers 8 ;;
	hf) bench bench-hf 150 --layer hf --layers 8 ;;
	s8192) bench bench-s8192 360 --layer torch --layers 8 --seq 8192 ;;
	encoder) bench bench-encoder 180 --preset encoder ;;
	math) bench bench-math 120 --layer torch --attention math --layers 3 --lookahead 2 \
		--modes eager,graph,none,pingpong,remap,planner ;;
	quarter) bench bench-quarter 90 --layer torch --fraction 0.25 --loop set_to_none \
		--modes graph,none,pingpong,remap ;;
	megatron)
		step megatron 300 "$py" "$tree/examples/megatron_gpt.py" --json "$out/megatron.json" || true
		[ -f "$out/megatron.log" ] && grep -A12 "^loop " "$out/megatron.log" | tee -a "$summary" ;;
	budget) bench bench-budget 470 --layer torch --layers 8 --budget-sweep --iterations 5 ;;
	budget6) bench bench-budget6 470 --layer torch --budget-sweep --iterations 5 ;;
	budget32) bench bench-budget32 540 --layer torch --layers 32 --budget-sweep --sweep-points 4 --iterations 4 ;;
	front-smoke) front front-smoke 150 --smoke --shape all ;;
	front-llama) front front-llama 420 --shape llama ;;
	front-launch) front front-launch 240 --shape launch ;;
	front-encoder) front front-encoder 480 --shape encoder ;;
	front-hf) front front-hf 300 --shape hf ;;
	front-megatron) front front-megatron 300 --shape megatron ;;
	front-fused) front front-fused 240 --shape launch --optimizer fused ;;
	front-persistent) front front-persistent 240 --shape launch --loop persistent ;;
	front-math) front front-math 240 --shape launch --attention math --loop both --optimizer fused \
		--front-budgets 0 --front-only "graphs,vmmrt none,vmmrt auto,vmmrt pingpong,vmmrt remap" ;;
	front-launch-both) front front-launch-both 300 --shape launch --loop both --optimizer fused \
		--front-ks 3 --front-budgets 0 --iterations 5 \
		--front-only "eager,ckpt 16,graphs,graphs+ckpt 16,vmmrt none,vmmrt auto,vmmrt recompute all" ;;
	front-llama-both) front front-llama-both 300 --shape llama --loop both --optimizer fused \
		--front-ks 3 --front-budgets 0 --iterations 5 --front-only "eager,graphs,vmmrt none,vmmrt auto" ;;
	copy-bound) bench bench-copy-bound 120 --layers 16 --hidden 1024 --ffn 4096 --seq 1024 --layer torch \
		--modes graph,pingpong,remap --optimizer fused ;;
	front-megatron-both) front front-megatron-both 300 --shape megatron --loop both --optimizer fused \
		--front-ks 3 --front-budgets 0 --iterations 5 \
		--front-only "eager,ckpt 4,graphs,vmmrt none,vmmrt auto" ;;
	check-launch) front check-launch 420 --shape launch --front-families torch --front-ks 3 --check-alone ;;
	launch-ab) step launch-ab 240 "$py" -m vmmrt.torch.bench --launch-ab 40 --shape launch,llama \
		--json "$out/launch-ab.json" || true
		[ -f "$out/launch-ab.log" ] && grep -E "over torch graphs|least" "$out/launch-ab.log" | tee -a "$summary" ;;
	one-time) step one-time 240 "$py" -m vmmrt.torch.bench --one-time --shape launch,llama --optimizer fused \
		--json "$out/one-time.json" || true
		[ -f "$out/one-time.log" ] && grep -E "^  (torch|vmmrt|libvmmrt|one eager)" "$out/one-time.log" | tee -a "$summary" ;;
	poolcheck)
		# (llama-reuse: PyTorch's reuse inside a capture of blocks recorded on another stream)
		# (launch-none: mode none's pool on the launch-bound layers)
		for sl in llama:2 long:1 llama-reuse:2 launch-none:16; do
			name=poolcheck-${sl%%:*} shape=${sl%%:*} conf=() plan=recompute
			[ "$shape" = llama-reuse ] && shape=llama conf=(PYTORCH_CUDA_ALLOC_CONF=graph_capture_record_stream_reuse:True)
			[ "$shape" = launch-none ] && shape=launch plan=none
			step "$name" 150 env "${conf[@]}" "$py" -m vmmrt.torch.bench.poolcheck --shape "$shape" --plan "$plan" \
				--layers "${sl#*:}" --json "$out/$name.json" --trace "$out/$name-trace.json.gz" || true
			[ -f "$out/$name.log" ] && grep -E "^(eager|vmmrt)|frees|(forward|backward): [0-9]+ [a-z]" "$out/$name.log" |
				cut -c1-400 | sed "s/^/$name: /" | tee -a "$summary"
		done ;;
	probes)
		for pr in graph_memory external_events; do
			step "probe-$pr" 60 "$py" "$tree/python/tests/gpu_probe_$pr.py" || true
			[ -f "$out/probe-$pr.log" ] && tee -a "$summary" < "$out/probe-$pr.log"
		done ;;
	defer-ab)
		for sl in "launch:vmmrt none" "launch:vmmrt recompute all" "llama:vmmrt none"; do
			for d in True False; do
				shape=${sl%%:*} opt=${sl#*:}
				flag_front "defer-$shape-$(echo "$opt" | tr ' ' '-' | sed 's/^vmmrt-//')-$d" 150 \
					"import vmmrt.torch.graphed as g; g.DEFER_MAPPED_BACKWARDS = $d" --iterations 5 \
					--shape "$shape" --front-only "$opt"
			done
		done ;;
	chain-ab)
		# the output gradients chained on the argument gradients handed them
		# (vmmrt.torch.memplan.CHAIN_GOUTS) and apart, one process each
		for shape in encoder long; do
			for c in True False; do
				flag_front "chain-$shape-$c" 240 "import vmmrt.torch.memplan as m; m.CHAIN_GOUTS = $c" \
					--iterations 3 --shape "$shape" --front-only "vmmrt none,vmmrt auto,vmmrt recompute all"
			done
		done ;;
	alone-launch) front alone-launch 480 --shape launch --loop both --optimizer fused --front-ks 3 \
		--front-budgets 0 --iterations 5 --check-alone --check-repeats 0 \
		--front-only "eager,ckpt 16,graphs,vmmrt none,vmmrt recompute all" ;;
	at-launch) front at-launch 450 --shape launch --loop both --optimizer fused --front-ks 3 --iterations 5 \
		--front-only "eager,ckpt 16,graphs,graphs+ckpt 16,vmmrt none,vmmrt auto,vmmrt recompute all" \
		--front-budgets-at "ckpt 16,graphs+ckpt 16" ;;
	at-launch-1) front at-launch-1 300 --shape launch --loop set_to_none --optimizer fused --front-ks 3 --iterations 5 \
		--front-only "eager,ckpt 16,graphs,graphs+ckpt 16,vmmrt none,vmmrt auto,vmmrt recompute all" \
		--front-budgets-at "ckpt 16,graphs+ckpt 16" ;;
	foreach-launch) front foreach-launch 300 --shape launch --loop both --optimizer foreach \
		--front-ks 3 --front-budgets-at "ckpt 16,graphs+ckpt 16" --iterations 5 \
		--front-only "eager,ckpt 16,graphs,graphs+ckpt 16,vmmrt none,vmmrt auto,vmmrt recompute all" ;;
	foreach-llama) front foreach-llama 300 --shape llama --loop both --optimizer foreach \
		--front-ks 3 --front-budgets 0 --iterations 5 --front-only "eager,ckpt 8,graphs,vmmrt none,vmmrt auto,vmmrt pingpong" ;;
	foreach-encoder) front foreach-encoder 300 --shape encoder --loop both --optimizer foreach \
		--front-ks 3 --front-budgets 0 --iterations 5 --front-only "eager,ckpt 6,graphs,vmmrt none,vmmrt auto,vmmrt pingpong" ;;
	fresh-launch) front fresh-launch 300 --shape launch --loop both --optimizer fused --front-ks 3 \
		--front-budgets 0 --iterations 5 --fresh-loops \
		--front-only "eager,ckpt 16,graphs,vmmrt none,vmmrt recompute all" ;;
	at-llama) front at-llama 300 --shape llama --loop both --optimizer fused --front-ks 3 --iterations 5 \
		--front-only "eager,ckpt 8,graphs,graphs+ckpt 8,vmmrt none,vmmrt auto,vmmrt pingpong,vmmrt recompute all" \
		--front-budgets-at "ckpt 8,graphs+ckpt 8" ;;
	at-long) front at-long 420 --shape long --loop both --optimizer fused --front-ks 2 --iterations 3 \
		--front-only "eager,ckpt 4,graphs,graphs+ckpt 4,vmmrt none,vmmrt auto,vmmrt pingpong,vmmrt recompute all" \
		--front-budgets-at "ckpt 4,graphs+ckpt 4" ;;
	smallest|smallest-reuse)
		# (smallest-reuse: the same with PyTorch's reuse inside a capture of
		# blocks recorded on another stream, for the graphs' pool)
		(
		[ "$part" = smallest-reuse ] && export PYTORCH_CUDA_ALLOC_CONF=graph_capture_record_stream_reuse:True
		for sk in launch:16:5 llama:8:5 long:4:3; do
			IFS=: read -r shape k iters <<<"$sk"
			front "$part-$shape" 300 --shape "$shape" --loop both --optimizer fused --front-ks 2 \
				--front-budgets-at "ckpt $k" --iterations "$iters" --front-only "ckpt $k,vmmrt recompute all"
		done
		) ;;
	check-llama) front check-llama 480 --shape llama --front-families torch --front-ks 3 --check-alone ;;
	*) note "gpu_run: unknown part '$part' (pytest pytest:K/N smoke s4096 hf s8192 encoder math quarter megatron budget budget6 budget32 front-smoke front-llama front-launch front-encoder front-hf front-megatron front-fused front-persistent front-math front-launch-both front-llama-both copy-bound front-megatron-both check-launch check-llama defer-ab chain-ab alone-launch at-launch at-launch-1 foreach-launch foreach-llama foreach-encoder at-llama at-long fresh-launch smallest smallest-reuse launch-ab one-time poolcheck probes, or all)" ;;
	esac
	pack
done
note "gpu_run: done in $(($(date +%s) - t_start)) s; tables in $out/bench*.log, numbers in $out/bench*.json${packed:+ (all in $packed/gpu-run.tar.gz)}"
pack
