#!/usr/bin/env bash
# Hook overhead of a training step in instructions (valgrind --tool=callgrind):
# stable on a noisy machine where a timed A/B of two ~300 us steps is not.
# The overhead is counted as `hookwrap bench --step` times it: on the same loop
# with no-op bodies (hooked - plain, and hooked - the callbacks called by hand),
# which runs the same instructions every time; the real step's own count moves
# by a few thousand instructions from process to process (torch's work is not
# deterministic to the instruction), as much as the overhead itself, so it only
# gives the share. Each loop runs for N1 and N2 steps; the difference per step
# cancels torch's import and start-up. A fixed PYTHONHASHSEED keeps the start-up
# identical between runs. Takes several minutes.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export PYTHONHASHSEED=0
N1=${N1:-50}
N2=${N2:-1050}
count() {
    valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        python "$HERE/bench_step.py" "$1" "$2" 2>&1 | awk '/Collected/ {print $4}'
}
per_step() {  # instructions per step of loop $1, from N1 and N2 steps
    local a b
    a=$(count "$1" "$N1"); b=$(count "$1" "$N2")
    [ -n "$a" ] && [ -n "$b" ] || { echo "callgrind_step: no count for $1" >&2; exit 1; }
    echo $(( (b - a) / (N2 - N1) ))
}
step=$(per_step plain)
plain=$(per_step plain-noop)
hooked=$(per_step hooked-noop)
hand=$(per_step hand-noop)
python - "$step" "$plain" "$hooked" "$hand" <<'PY'
import sys
step, plain, hooked, hand = map(int, sys.argv[1:])
print(f"instructions per real step (plain loop): {step:,}")
print(f"hook overhead (no-op bodies, hooked - plain): {hooked - plain:,} instructions per step "
      f"= {(hooked - plain) / step:.2%} of the real step")
print(f"of it hookwrap's own (hooked - callbacks called by hand): {hooked - hand:,} "
      f"= {(hooked - hand) / step:.2%}")
PY
