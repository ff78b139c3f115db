# SPDX-License-Identifier: LGPL-2.1-or-later
"""``python3 -m vmmrt``: which libvmmrt this package loads, and why, and
whether this python has PyTorch; exit status 1 with the loader's list of
places tried when no library loads."""
import sys

import vmmrt


def main():
    try:
        loaded = vmmrt.library_path()
    except vmmrt.LibraryNotFound as e:
        print(e, file=sys.stderr)
        return 1
    print("libvmmrt %s: %s" % (vmmrt.version_string(), loaded))
    try:
        import torch
    except ImportError as e:
        print("torch: not importable by %s (%s): vmmrt.torch needs it" % (sys.executable, e))
    else:
        print("torch %s (CUDA %s)" % (torch.__version__, "available" if torch.cuda.is_available() else "not available"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
