#!/bin/bash
# The many-core check of issue 27, as one script for a lent machine (run from the checkout's root):
# generates the issue's job (TP 8 x PP 4 x DP, 2,000 entries per rank, a hang, our generator) at each
# size, runs a P-process bare unpickle beside `frtrace DIR --format json --workers P` for each P
# (SCALE, the scale_cores.py that prints the issue's table), the same for an OLD checkout where one
# is given (the A/B on the same machine), then benchmarks/phases.py --workers of the largest P with
# --waits (where the main process waits for forked children after the last file).
#
#   SCALE=path/to/scale_cores.py [OLD=path/to/old/checkout] [SIZES="4096 16384"] [PS="16 8 4 2"] \
#       [OLDPS="16"] [ROUNDS=1] [OUT=dir] benchmarks/many_cores.sh
#
# With OLD, ROUNDS runs of the pair at each of OLDPS alternate old and new (one run of each
# says little: the lent machine's own spread is about 10 %), and phases.py runs for both.
# The lent machine gets the working tree only: put the old checkout and scale_cores.py in
# a folder .git/info/exclude ignores and name it in the call's `carry`, e.g.
#   mkdir -p .bench/old && git archive REV frtrace | tar -x -C .bench/old
#   cp ../shared/tools/scale_cores.py .bench/ && git show REV:benchmarks/phases.py > .bench/phases_old.py
# then OLD=$PWD/.bench/old SCALE=$PWD/.bench/scale_cores.py.
#
# Each run is started from /tmp with `python -P`, so PYTHONPATH alone says which checkout runs
# (plain `python -m` from inside a checkout runs that checkout whatever PYTHONPATH says).
# Budget: at 4,096 ranks the generation takes about 20 s on 16 cores and each pair of runs
# 3 to 45 s; at 16,384 the generation about 80 s and a pair at 16 processes about 45 s.
set -u
export PYTHONUNBUFFERED=1
unset PYTHONDONTWRITEBYTECODE  # compile once, as an installed frtrace would be
: "${SCALE:?SCALE=path to scale_cores.py}"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PY=${PY:-python3}; SIZES=${SIZES:-"4096 16384"}; PS=${PS:-"16 8 4 2"}; OLDPS=${OLDPS:-16}; ROUNDS=${ROUNDS:-1}
GENW=${GENW:-$(nproc)}; TOP=${PS%% *}
SRC=$PWD; OLD=${OLD:-}
nproc
for checkout in $SRC $OLD; do
  (cd /tmp && PYTHONPATH=$checkout $PY -P -c "import frtrace.cli.main, frtrace.testing.synth") || exit 1
done
cd /tmp || exit 1
for n in $SIZES; do
  steps=$(PYTHONPATH=$SRC $PY -P -c "from frtrace.testing.synth import steps_for_entries as s; print(s($n, 8, 4, 2000))")
  started=$SECONDS
  PYTHONPATH=$SRC $PY -P -m frtrace.testing.synth /tmp/job$n --world-size "$n" --tp 8 --pp 4 --steps "$steps" \
    --fault hang --fault-rank 5 --fault-step $((steps - 1)) --workers "$GENW" --truth /tmp/job$n.truth.json | tail -1
  echo "generated $n ranks in $((SECONDS - started)) s"
  $PY "$SCALE" "$SRC" /tmp/job$n $PS --out "$OUT/new_$n.jsonl"
  if [ -n "$OLD" ]; then
    for round in $(seq "$ROUNDS"); do
      $PY "$SCALE" "$OLD" /tmp/job$n $OLDPS --out "$OUT/old_$n.jsonl" | sed 's/^/old /'
      [ "$ROUNDS" -gt 1 ] && $PY "$SCALE" "$SRC" /tmp/job$n $OLDPS --out "$OUT/new_$n.jsonl" | sed 's/^/new /'
    done
    OLDPHASES=$OLD/benchmarks/phases.py; [ -f "$OLDPHASES" ] || OLDPHASES=$(dirname "$OLD")/phases_old.py
    [ -f "$OLDPHASES" ] && PYTHONPATH=$OLD $PY -P "$OLDPHASES" /tmp/job$n --workers "$TOP" --waits > "$OUT/phases_old_$n.json"
  fi
  PYTHONPATH=$SRC $PY -P "$SRC/benchmarks/phases.py" /tmp/job$n --workers "$TOP" --waits > "$OUT/phases_$n.json"
  cat "$OUT/phases_$n.json"; echo
  rm -rf /tmp/job$n
done
echo "done in $SECONDS s"
