# SPDX-License-Identifier: LGPL-2.1-or-later
"""The benchmark of vmmrt.torch on real layers: ``python3 -m vmmrt.torch.bench``.

:mod:`llama` and :mod:`encoder` hold the layers (llama's are also used by the
tests), :mod:`loops` the two training loops a step runs in, :mod:`modes` how
each mode builds and is measured, :mod:`report` the tables, the targets and
the JSON.
"""
