#!/bin/sh
# SPDX-License-Identifier: LGPL-2.1-or-later
# The API fuzzer's seed corpus (tests/fuzz/corpus) and regression inputs
# (tests/regression/fuzz), replayed through a plain build of the fuzz target
# (TAP, one line per input). `make fuzz` runs the libFuzzer build itself.
# Inputs in tests/fuzz/known/ reproduce reported library bugs not fixed yet
# (tests/fuzz/known/README): not replayed here.
replay=${FUZZ_REPLAY:-./tests/fuzz/fuzz-replay}
inputs=${FUZZ_INPUTS:-$(dirname "$0")}
regress=${FUZZ_REGRESS:-$(dirname "$0")/../regression/fuzz}
exec "$replay" "$inputs/corpus" "$regress"
