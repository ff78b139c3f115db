# SPDX-License-Identifier: LGPL-2.1-or-later
"""The benchmark of vmmrt.torch on real layers: ``python3 -m vmmrt.torch.bench``.

:mod:`llama` holds the layers (also used by the tests), :mod:`modes` how each
mode builds and runs, :mod:`report` the table, the targets and the JSON.
"""
