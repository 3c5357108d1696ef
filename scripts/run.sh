#!/usr/bin/env bash
# Runs a job with the launcher; with no --config, the default job: the linear
# regression, on this machine's accelerators or on 8 emulated CPU devices.
#   scripts/run.sh
#   scripts/run.sh --config=configs/mlp.py --local_processes=2
# The project alone: the test tools (Ray, the GCS emulator...) are test.sh's.
PODRUN_EXTRAS="${PODRUN_EXTRAS-}"
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
args=("$@")
case " ${args[*]-} " in
  *" --config="*) ;;
  *) args=(--config=configs/linear_regression.py "${args[@]}") ;;
esac
# The run's ledger starts here, not at the install above (exec keeps the
# script's process, and with it the kernel's start time).
export PODRUN_EXEC="$$:$(date +%s.%N)"
exec "$venv/bin/python" -m launcher "${args[@]}"
