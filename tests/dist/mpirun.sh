#!/bin/sh
# mpirun.sh NP COMMAND [ARGS...] — runs COMMAND on NP local ranks with Open MPI's mpirun, as the
# distributed tests need it on a CI machine: more ranks than cores allowed (--oversubscribe), as
# root in containers (--allow-run-as-root), no core binding. Exits 77 (CTest's skip code) when
# mpirun is not installed (scripts/bootstrap installs openmpi-bin).
if ! command -v mpirun >/dev/null 2>&1; then
  echo "mpirun not found (install openmpi-bin): skipped"
  exit 77
fi
np="$1"
shift
exec mpirun -np "$np" --oversubscribe --allow-run-as-root --bind-to none "$@"
