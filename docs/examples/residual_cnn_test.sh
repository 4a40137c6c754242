#!/usr/bin/env bash
# Runs the model API example; it exits non-zero if the loss does not fall.
set -euo pipefail
"$1"
