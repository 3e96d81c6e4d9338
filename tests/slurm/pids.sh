# Sourced by tests/slurm/start.sh and stop.sh.
# runs FILE PROGRAM: the PID recorded in FILE is alive and runs PROGRAM (/proc/PID/comm). A
# state dir carried from another machine or left by a reboot holds PIDs that unrelated processes
# may now have: those never count as our daemon, and are never signalled.
runs() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null && [[ "$(cat "/proc/$(cat "$1")/comm" 2>/dev/null)" == "$2" ]]; }
