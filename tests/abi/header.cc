/* SPDX-License-Identifier: LGPL-2.1-or-later */
// include/vmmrt.h as C++ (tests/abi/header.sh: -std=c++11 and -std=c++17,
// -Wall -Wextra -pedantic -Werror): a CUdeviceptr * passes for a
// vmmrt_devptr * without a cast, and a CUstream converts as documented.
#include <type_traits>

#include <vmmrt.h>

#ifdef HAVE_CUDA_H
#include <cuda.h>
static_assert(std::is_same<vmmrt_devptr, CUdeviceptr>::value, "vmmrt_devptr is CUdeviceptr");
#else
static_assert(std::is_same<vmmrt_devptr, unsigned long long>::value, "vmmrt_devptr is unsigned long long");
#endif

int header_cxx(vmmrt_group *g, const vmmrt_tensor_desc *d);
int header_cxx(vmmrt_group *g, const vmmrt_tensor_desc *d)
{
#ifdef HAVE_CUDA_H
	CUdeviceptr addr = 0;
	CUstream s = nullptr;
	return vmmrt_group_save(g, d, 0, reinterpret_cast<vmmrt_stream>(s), &addr);
#else
	unsigned long long addr = 0;
	return vmmrt_group_save(g, d, 0, VMMRT_STREAM_PER_THREAD, &addr);
#endif
}
