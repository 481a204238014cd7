# Shared by the ci/ scripts: timed stages and a summary of how long each took.
# shellcheck shell=bash

CI_STAGES=()
CI_START=$(date +%s)

# stage NAME COMMAND...: runs COMMAND, prints its duration, stops the script on failure.
stage() {
  local name=$1
  shift
  local start end
  start=$(date +%s)
  echo
  echo "=== ${name} ==="
  if "$@"; then
    end=$(date +%s)
    CI_STAGES+=("$(printf '%-44s %5ss  ok' "$name" "$((end - start))")")
  else
    local rc=$?
    end=$(date +%s)
    CI_STAGES+=("$(printf '%-44s %5ss  FAILED (exit %s)' "$name" "$((end - start))" "$rc")")
    summary
    exit "$rc"
  fi
}

summary() {
  echo
  echo "=== stage durations ==="
  printf '%s\n' "${CI_STAGES[@]}"
  printf '%-44s %5ss\n' "total" "$(($(date +%s) - CI_START))"
}
