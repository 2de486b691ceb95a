#!/usr/bin/env bash
# Hook overhead of a training step in instructions (valgrind --tool=callgrind):
# stable on a noisy machine where a timed A/B of two ~300 us steps is not.
# Runs the plain and the hooked loop for N1 and N2 steps; the difference per
# step cancels torch's import and start-up. A fixed PYTHONHASHSEED keeps the
# start-up identical between runs (random hashing moves it by millions of
# instructions). Takes several minutes.
set -euo pipefail
export PYTHONHASHSEED=0
N1=${N1:-50}
N2=${N2:-1050}
count() {
    valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        python -m hookwrap.bench_step "$1" "$2" 2>&1 | awk '/Collected/ {print $4}'
}
plain1=$(count plain "$N1"); plain2=$(count plain "$N2")
hooked1=$(count hooked "$N1"); hooked2=$(count hooked "$N2")
hand1=$(count hand "$N1"); hand2=$(count hand "$N2")
python - "$N1" "$N2" "$plain1" "$plain2" "$hooked1" "$hooked2" "$hand1" "$hand2" <<'PY'
import sys
n1, n2, p1, p2, h1, h2, m1, m2 = map(int, sys.argv[1:])
per = lambda a, b: (b - a) / (n2 - n1)
step, hooked, hand = per(p1, p2), per(h1, h2), per(m1, m2)
print(f"instructions per step: plain {step:,.0f}, hooked {hooked:,.0f}, callbacks by hand {hand:,.0f}")
print(f"hook overhead: {hooked - step:,.0f} instructions per step = {(hooked - step) / step:.2%} of the step")
print(f"of it hookwrap's own: {hooked - hand:,.0f} = {(hooked - hand) / step:.2%}")
PY
