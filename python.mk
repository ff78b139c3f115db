# SPDX-License-Identifier: LGPL-2.1-or-later
# The Python package (python/vmmrt: the ctypes binding of the C API, and
# vmmrt.torch, the PyTorch integration): installed under $(pythondir) by
# `make install` for the python3 configure chose (--with-python=PATH or
# PYTHON=PATH picks it; configure's summary says which, and whether
# $(pythondir) is on its sys.path), with vmmrt/_config.py recording $(libdir)
# for the loader; tested by tests/python.sh under `make check` (tests.mk;
# skipped without a python3 that has torch). `pip install ./python` builds a
# wheel of the same package with the library inside (python/setup.py).

vmmrt_py_core = \
	python/vmmrt/__init__.py \
	python/vmmrt/__main__.py \
	python/vmmrt/_capi.py \
	python/vmmrt/_loader.py
vmmrt_py_torch = \
	python/vmmrt/torch/__init__.py \
	python/vmmrt/torch/_address.py \
	python/vmmrt/torch/_arena.py \
	python/vmmrt/torch/_call.py \
	python/vmmrt/torch/_launch.py \
	python/vmmrt/torch/backing.py \
	python/vmmrt/torch/budget.py \
	python/vmmrt/torch/_callables.py \
	python/vmmrt/torch/_compiled.py \
	python/vmmrt/torch/_compat.py \
	python/vmmrt/torch/_contracts.py \
	python/vmmrt/torch/_dlpack.py \
	python/vmmrt/torch/_te.py \
	python/vmmrt/torch/eager.py \
	python/vmmrt/torch/grads.py \
	python/vmmrt/torch/gradshare.py \
	python/vmmrt/torch/graphpool.py \
	python/vmmrt/torch/graphed.py \
	python/vmmrt/torch/layer.py \
	python/vmmrt/torch/memory.py \
	python/vmmrt/torch/memplan.py \
	python/vmmrt/torch/optmem.py \
	python/vmmrt/torch/outputs.py \
	python/vmmrt/torch/offload.py \
	python/vmmrt/torch/pipeline.py \
	python/vmmrt/torch/place.py \
	python/vmmrt/torch/plancheck.py \
	python/vmmrt/torch/poolplan.py \
	python/vmmrt/torch/planner.py \
	python/vmmrt/torch/recompute.py \
	python/vmmrt/torch/replay_times.py \
	python/vmmrt/torch/reuse.py \
	python/vmmrt/torch/saved.py \
	python/vmmrt/torch/select.py \
	python/vmmrt/torch/static_grads.py \
	python/vmmrt/torch/static_inputs.py
vmmrt_py_bench = \
	python/vmmrt/torch/bench/__init__.py \
	python/vmmrt/torch/bench/__main__.py \
	python/vmmrt/torch/bench/alone.py \
	python/vmmrt/torch/bench/encoder.py \
	python/vmmrt/torch/bench/front.py \
	python/vmmrt/torch/bench/frontrun.py \
	python/vmmrt/torch/bench/launch_ab.py \
	python/vmmrt/torch/bench/llama.py \
	python/vmmrt/torch/bench/loops.py \
	python/vmmrt/torch/bench/modes.py \
	python/vmmrt/torch/bench/onetime.py \
	python/vmmrt/torch/bench/poolcheck.py \
	python/vmmrt/torch/bench/progress.py \
	python/vmmrt/torch/bench/report.py \
	python/vmmrt/torch/bench/shapes.py \
	python/vmmrt/torch/bench/sweep.py
vmmrt_py_tests = \
	python/tests/conftest.py \
	python/tests/vmmrt_tap.py \
	python/tests/test_bench.py \
	python/tests/test_call_path.py \
	python/tests/test_raw_launch.py \
	python/tests/test_driver_calls.py \
	python/tests/test_memplan.py \
	python/tests/test_io_slots.py \
	python/tests/test_static_inputs.py \
	python/tests/test_recompute_graphs.py \
	python/tests/test_recompute_gpu.py \
	python/tests/test_outputs_slots.py \
	python/tests/test_optmem.py \
	python/tests/test_memplan_gpu.py \
	python/tests/test_optmem_gpu.py \
	python/tests/test_compiled.py \
	python/tests/test_binding.py \
	python/tests/test_saved.py \
	python/tests/test_place.py \
	python/tests/test_grads.py \
	python/tests/test_graphpool.py \
	python/tests/test_poolplan.py \
	python/tests/test_abandoned_capture.py \
	python/tests/test_abandoned_pool.py \
	python/tests/test_replay_times.py \
	python/tests/test_reuse.py \
	python/tests/test_gradshare.py \
	python/tests/test_launch_ab.py \
	python/tests/test_lifetime.py \
	python/tests/test_select.py \
	python/tests/test_stream_maps.py \
	python/tests/test_pages.py \
	python/tests/test_arena.py \
	python/tests/test_budget.py \
	python/tests/test_eager.py \
	python/tests/test_errors.py \
	python/tests/test_gpu.py \
	python/tests/test_readme.py \
	python/tests/test_packaging.py \
	python/tests/test_runner_api.py \
	python/tests/test_ddp.py \
	python/tests/test_pipeline.py \
	python/tests/test_te_args.py \
	python/tests/test_contracts.py \
	python/tests/test_megatron.py \
	python/tests/test_one_validator.py \
	python/tests/test_install.py \
	python/tests/gpu_probe_compile.py \
	python/tests/gpu_probe_graph_memory.py \
	python/tests/gpu_probe_external_events.py \
	python/tests/gpu_run.sh \
	python/tests/gpu_env.sh \
	python/tests/ddp_run.sh

EXTRA_DIST += python/pyproject.toml python/setup.py python/README.md pytest.ini $(vmmrt_py_tests) \
	examples/torch_offload.py examples/torch_ddp.py examples/torch_1f1b.py \
	examples/megatron_gpt.py

if HAVE_PYTHON
# The tests that run python3 (tests/python.sh, tests/abi/ctypes.sh) use the one
# configure chose, first.
AM_TESTS_ENVIRONMENT += PYTHON='$(PYTHON)'; export PYTHON;

vmmrtdir = $(pythondir)/vmmrt
vmmrt_PYTHON = $(vmmrt_py_core)
vmmrttorchdir = $(vmmrtdir)/torch
vmmrttorch_PYTHON = $(vmmrt_py_torch)
vmmrtbenchdir = $(vmmrttorchdir)/bench
vmmrtbench_PYTHON = $(vmmrt_py_bench)

# Where the library went, for vmmrt._loader (before the dynamic loader's path,
# which a prefix like /usr/local or $HOME/.local may not be on).
install-data-local:
	$(MKDIR_P) '$(DESTDIR)$(vmmrtdir)'
	printf '"""Written by make install: where libvmmrt was installed."""\nLIBDIR = %s\n' \
		"'$(libdir)'" >'$(DESTDIR)$(vmmrtdir)/_config.py'

uninstall-local:
	rm -f '$(DESTDIR)$(vmmrtdir)/_config.py'
endif
