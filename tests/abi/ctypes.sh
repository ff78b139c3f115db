#!/bin/sh
# SPDX-License-Identifier: LGPL-2.1-or-later
# libvmmrt from Python's ctypes (TAP): loaded, a runtime on the host backend,
# a slot round trip through the C API; once more with torch imported first
# when a python3 with torch is found (frameworks load libvmmrt that way).
# Environment: LIBVMMRT_SO, PYTHON (default: the first of python3 and
# /usr/bin/python3 that runs).
set -u
so=${LIBVMMRT_SO:-./.libs/libvmmrt.so.1}
if [ ! -f "$so" ]; then
	echo "1..0 # SKIP no shared library at $so"
	exit 0
fi
if [ -n "${SANITIZED_BUILD:-}" ]; then
	# an uninstrumented python3 cannot load a library built with ASan or TSan
	echo "1..0 # SKIP sanitizer build ($SANITIZED_BUILD)"
	exit 0
fi
pythons=${PYTHON:-"python3 /usr/bin/python3"}
py=
for p in $pythons; do
	if "$p" -c 'import ctypes' >/dev/null 2>&1; then py=$p; break; fi
done
if [ -z "$py" ]; then
	echo "1..0 # SKIP no python3"
	exit 0
fi
torch_py=
for p in $pythons; do
	if "$p" -c 'import torch' >/dev/null 2>&1; then torch_py=$p; break; fi
done

script='
import ctypes, sys
if sys.argv[2] == "torch":
    import torch  # loaded first, as in a training script
lib = ctypes.CDLL(sys.argv[1])
lib.vmmrt_version_string.restype = ctypes.c_char_p
lib.vmmrt_last_error.restype = ctypes.c_char_p
lib.vmmrt_slot_address.restype = ctypes.c_ulonglong
lib.vmmrt_slot_address.argtypes = [ctypes.c_void_p]
def ok(st):
    if st != 0:
        raise SystemExit("status %d: %s" % (st, lib.vmmrt_last_error().decode()))
o = ctypes.c_void_p(); rt = ctypes.c_void_p(); s = ctypes.c_void_p()
ok(lib.vmmrt_options_create(ctypes.byref(o)))
ok(lib.vmmrt_options_set(o, b"backend", b"host"))
ok(lib.vmmrt_runtime_create(o, ctypes.byref(rt)))
lib.vmmrt_options_destroy(o)
n = 1 << 20
ok(lib.vmmrt_slot_create(rt, ctypes.c_size_t(n), ctypes.byref(s)))
ok(lib.vmmrt_slot_map(s))
at = lib.vmmrt_slot_address(s)
src = (ctypes.c_ubyte * n)(*([7, 1, 9, 3] * (n // 4)))
back = (ctypes.c_ubyte * n)()
ok(lib.vmmrt_copy_to_device(rt, ctypes.c_ulonglong(at), src, ctypes.c_size_t(n)))
ok(lib.vmmrt_slot_unmap(s)); ok(lib.vmmrt_slot_map(s))
assert lib.vmmrt_slot_address(s) == at, "the address moved"
ok(lib.vmmrt_copy_to_device(rt, ctypes.c_ulonglong(at), src, ctypes.c_size_t(n)))
ok(lib.vmmrt_copy_to_host(rt, back, ctypes.c_ulonglong(at), ctypes.c_size_t(n)))
assert bytes(back) == bytes(src), "bytes differ"
ok(lib.vmmrt_slot_destroy(s)); ok(lib.vmmrt_runtime_destroy(rt))
print("libvmmrt", lib.vmmrt_version_string().decode(), "slot round trip at 0x%x" % at)
'
echo "1..2"
run() { # number, description, python3, mode
	if out=$("$3" -c "$script" "$so" "$4" 2>&1); then
		echo "ok $1 - $2 ($3: $out)"
	else
		echo "not ok $1 - $2 ($3)"
		printf '%s\n' "$out" | sed 's/^/# /'
	fi
}
run 1 "ctypes load and slot round trip" "$py" plain
if [ -z "$torch_py" ]; then
	echo "ok 2 # SKIP no python3 with torch"
else
	run 2 "ctypes load with torch imported first" "$torch_py" torch
fi
